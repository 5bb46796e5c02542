//! The keys of a pipelined batch, found before any of its requests runs, so the store can
//! start loading their index buckets and items at once (ADR 0038).
//!
//! This is a hint, not a parse: it reads only the plain text forms a pipelining client sends
//! (`get`/`gets`/`gat`-less look-ups, the storage commands, `mg` and `ms`), stops at the first
//! line it does not recognise or that is not whole, and a wrong key costs a cache line, never
//! an answer. The parser proper still checks every request.

use ringstore_store::PREFETCH_MAX;

/// Up to [`PREFETCH_MAX`] keys of the whole requests at the start of `buf`, in order.
pub(super) fn batch_keys(buf: &[u8]) -> ([&[u8]; PREFETCH_MAX], usize) {
    let mut keys: [&[u8]; PREFETCH_MAX] = [&[]; PREFETCH_MAX];
    let mut n = 0;
    let mut at = 0;
    while n < PREFETCH_MAX && at < buf.len() {
        let Some(end) = memchr::memchr(b'\n', &buf[at..]) else {
            break;
        };
        let line = &buf[at..at + end];
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        at += end + 1;
        let mut words = line.split(|&b| b == b' ').filter(|w| !w.is_empty());
        let Some(command) = words.next() else {
            break;
        };
        // Bytes of data after the line, and which word (after the key) says how many.
        let data_word = match command {
            b"get" | b"gets" | b"mg" => None,
            b"set" | b"add" | b"replace" | b"append" | b"prepend" | b"cas" => Some(2),
            b"ms" => Some(0),
            _ => break,
        };
        let Some(key) = words.next() else {
            break;
        };
        keys[n] = key;
        n += 1;
        match data_word {
            Some(i) => {
                let Some(len) = words.nth(i).and_then(parse_len) else {
                    break;
                };
                at = at.saturating_add(len).saturating_add(2);
            }
            None if command.starts_with(b"get") => {
                for key in words.take(PREFETCH_MAX - n) {
                    keys[n] = key;
                    n += 1;
                }
            }
            None => {}
        }
    }
    (keys, n)
}

/// A data length as the storage commands write it (decimal digits, at most 10).
fn parse_len(word: &[u8]) -> Option<usize> {
    if word.is_empty() || word.len() > 10 || !word.iter().all(u8::is_ascii_digit) {
        return None;
    }
    word.iter().try_fold(0usize, |v, &d| {
        v.checked_mul(10)?.checked_add(usize::from(d - b'0'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(buf: &[u8]) -> Vec<&[u8]> {
        let (k, n) = batch_keys(buf);
        k[..n].to_vec()
    }

    #[test]
    fn finds_the_keys_of_a_pipelined_mix() {
        let buf = b"get a\r\nset b 0 0 5\r\nhello\r\ngets c d\r\nms e 2 T0\r\nhi\r\nmg f v\r\ncas g 0 0 1 9\r\nx\r\n";
        assert_eq!(keys(buf), [&b"a"[..], b"b", b"c", b"d", b"e", b"f", b"g"]);
    }

    #[test]
    fn stops_at_what_it_does_not_know_or_a_partial_line() {
        assert_eq!(keys(b"get a\r\nstats\r\nget b\r\n"), [&b"a"[..]]);
        assert_eq!(keys(b"get a\r\nget b"), [&b"a"[..]]);
        assert_eq!(keys(b"set a 0 0 x\r\nget b\r\n"), [&b"a"[..]]);
        assert!(keys(b"\r\nget a\r\n").is_empty());
    }

    #[test]
    fn a_data_length_past_the_buffer_or_past_usize_ends_the_scan() {
        assert_eq!(keys(b"set a 0 0 99999\r\nxy\r\nget b\r\n"), [&b"a"[..]]);
        assert_eq!(keys(b"set a 0 0 9999999999\r\nget b\r\n"), [&b"a"[..]]);
        assert_eq!(parse_len(b"18446744073709551616"), None);
    }

    #[test]
    fn never_more_than_the_limit() {
        let buf: Vec<u8> = (0..100)
            .flat_map(|i| format!("get k{i}\r\n").into_bytes())
            .collect();
        assert_eq!(keys(&buf).len(), PREFETCH_MAX);
        let many = format!("get {}\r\n", vec!["k"; 100].join(" "));
        assert_eq!(keys(many.as_bytes()).len(), PREFETCH_MAX);
    }
}
