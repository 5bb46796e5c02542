//! The keys of a pipelined batch, found before any of its requests is parsed, so the store
//! can start loading their index buckets and items at once (ADR 0038).
//!
//! A hint, not a parse: [`batch_keys`] reads only the plain text forms a pipelining client
//! sends (`get`/`gets`, the storage commands, `mg` and `ms`), splits their lines as
//! [`super::parse`] does (runs of spaces, the `get` keys as [`super::GetKeys`] does), skips a storage
//! command's data block by its declared length, and stops at the first line it does not
//! recognise or that is not whole. A wrong key costs a cache line, never an answer: the
//! parser still checks every request. On well-formed batches it finds the parser's keys, in
//! order (the property tests check it against [`super::parse`]).

/// Up to `keys.len()` keys of the requests at the start of `buf` whose lines are whole (a
/// storage command's data need not have arrived), in order, written to the front of `keys`;
/// returns how many. Reads each byte of `buf` at most once.
pub fn batch_keys<'a>(buf: &'a [u8], keys: &mut [&'a [u8]]) -> usize {
    let mut n = 0;
    let mut at = 0;
    while n < keys.len() && at < buf.len() {
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
        if command.starts_with(b"get") {
            // The keys as the parser's `GetKeys` splits them: every word after the command.
            // (The words iterator already at hand, rather than a `GetKeys` over the rest: its
            // memchr per key cost a GET at depth 16 about 30 instructions more, callgrind.)
            for key in words.by_ref() {
                if n == keys.len() {
                    break;
                }
                keys[n] = key;
                n += 1;
            }
            continue;
        }
        let Some(key) = words.next() else {
            break;
        };
        keys[n] = key;
        n += 1;
        if let Some(i) = data_word {
            let Some(len) = words.nth(i).and_then(data_len) else {
                break;
            };
            at = at.saturating_add(len).saturating_add(2);
        }
    }
    n
}

/// True when `buf` holds at most one text request (one line, or a storage command's line
/// and its data block): a batch of one has nothing to prefetch, and [`batch_keys`] would parse
/// its line once more for nothing (at depth 1 that cost a GET 195 instructions and a SET 398,
/// under callgrind). Two lines are one request unless the first is a `get`/`gets`/`mg` (then
/// two gets, prefetched); so `delete a` and `get b` go without prefetch, where [`batch_keys`]
/// would have stopped at `delete` anyway.
pub fn single_request(buf: &[u8]) -> bool {
    // Each search starts past the `\n` before it, and none runs over nothing: the usual
    // batch of one (a get line; a set line and its data block) ends at its last `\n`.
    let newline_after = |from: usize| match buf.get(from..) {
        Some(rest) if !rest.is_empty() => memchr::memchr(b'\n', rest).map(|at| from + at + 1),
        _ => None,
    };
    let Some(second_line) = newline_after(0) else {
        return true;
    };
    let Some(third_line) = newline_after(second_line) else {
        return true;
    };
    if newline_after(third_line).is_some() {
        return false;
    }
    // set, add, replace, append, prepend, cas, ms: the line and its data block.
    !(buf.starts_with(b"g") || buf.starts_with(b"mg"))
}

/// A data length as the storage commands write it (decimal digits, at most 10).
fn data_len(word: &[u8]) -> Option<usize> {
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
    use proptest::prelude::*;

    fn keys(buf: &[u8]) -> Vec<&[u8]> {
        let mut k = [&[][..]; 8];
        let n = batch_keys(buf, &mut k);
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
        assert_eq!(data_len(b"18446744073709551616"), None);
    }

    #[test]
    fn a_single_request_is_told_from_a_batch() {
        assert!(single_request(b""));
        assert!(single_request(b"get a\r\n"));
        assert!(single_request(b"get a b c\r\n"));
        assert!(single_request(b"set a 0 0 5\r\nhello\r\n"));
        assert!(single_request(b"ms a 2\r\nhi\r\n"));
        assert!(single_request(b"set a 0 0 5\r\nhel"));
        assert!(!single_request(b"get a\r\nget b\r\nget c\r\n"));
        assert!(!single_request(b"mg a v\r\nmg b v\r\n"));
        assert!(
            !single_request(b"get a\r\nget b\r\n"),
            "two gets are a batch"
        );
        assert!(!single_request(b"set a 0 0 1\r\nx\r\nget a\r\n"));
    }

    proptest! {
        /// One line, or two unless the first is a get: as counting every `\n` says.
        #[test]
        fn a_single_request_is_counted_by_its_newlines(
            buf in prop::collection::vec(prop::sample::select(b"\n\rgms a".to_vec()), 0..24),
        ) {
            let model = match buf.iter().filter(|&&b| b == b'\n').count() {
                0 | 1 => true,
                2 => !(buf.starts_with(b"g") || buf.starts_with(b"mg")),
                _ => false,
            };
            prop_assert_eq!(single_request(&buf), model);
        }
    }

    #[test]
    fn never_more_than_the_room_given() {
        let buf: Vec<u8> = (0..100)
            .flat_map(|i| format!("get k{i}\r\n").into_bytes())
            .collect();
        assert_eq!(keys(&buf).len(), 8);
        let many = format!("get {}\r\n", vec!["k"; 100].join(" "));
        assert_eq!(keys(many.as_bytes()).len(), 8);
        assert_eq!(batch_keys(b"get a\r\n", &mut []), 0);
    }

    /// The keys [`crate::memcache::parse`] finds in the requests at the start of `buf`, in
    /// order (a storage command awaiting its data included).
    fn parsed_keys(buf: &[u8]) -> Vec<&[u8]> {
        use crate::memcache::{parse, Limits, Parse, Request};
        let mut found = Vec::new();
        let mut rest = buf;
        loop {
            let (request, consumed) = match parse(rest, &Limits::default()) {
                Parse::Done { request, consumed } => (request, consumed),
                // A storage line whose data has not all arrived: its key is known.
                Parse::AwaitingValue { key, .. } => {
                    found.push(key);
                    break;
                }
                _ => break,
            };
            match request {
                Request::Get(g) => found.extend(g.keys),
                Request::Store(s) => found.push(s.key),
                Request::MetaGet(m) => found.push(m.key.raw()),
                Request::MetaSet(m) => found.push(m.key.raw()),
                other => panic!("not a request of the batch: {other:?}"),
            }
            rest = &rest[consumed..];
        }
        found
    }

    /// One well-formed request a pipelining client sends.
    fn request() -> impl Strategy<Value = Vec<u8>> {
        let key = "[a-zA-Z0-9_:.-]{1,12}";
        let spaces = prop::sample::select(vec![" ", "  "]);
        let value = prop::collection::vec(any::<u8>(), 0..20);
        prop_oneof![
            (
                prop::sample::select(vec!["get", "gets"]),
                prop::collection::vec(key, 1..6),
                spaces.clone()
            )
                .prop_map(|(c, k, sp)| format!("{c}{sp}{}\r\n", k.join(sp)).into_bytes()),
            (
                prop::sample::select(vec!["set", "add", "replace", "append", "prepend"]),
                key,
                value.clone(),
                spaces.clone()
            )
                .prop_map(|(c, k, v, sp)| [
                    format!("{c}{sp}{k} 5 0{sp}{}\r\n", v.len()).into_bytes(),
                    v,
                    b"\r\n".to_vec()
                ]
                .concat()),
            (key, value.clone()).prop_map(|(k, v)| [
                format!("cas {k} 0 0 {} 77 noreply\r\n", v.len()).into_bytes(),
                v,
                b"\r\n".to_vec()
            ]
            .concat()),
            (key, value).prop_map(|(k, v)| [
                format!("ms {k} {} T0 F1\r\n", v.len()).into_bytes(),
                v,
                b"\r\n".to_vec()
            ]
            .concat()),
            (key, prop::sample::select(vec!["", " v", " v c f t s k"]))
                .prop_map(|(k, f)| format!("mg {k}{f}\r\n").into_bytes()),
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config { cases: 512, ..Default::default() })]

        /// On a batch of well-formed requests (and a partial one after it) the scan finds
        /// exactly the parser's keys, up to the room it is given.
        #[test]
        fn finds_what_the_parser_finds(batch in prop::collection::vec(request(), 0..12), cut in 0usize..40, room in 0usize..40) {
            let mut buf = batch.concat();
            buf.extend_from_slice(&b"set tail 0 0 30\r\n0123456789"[..cut.min(27)]);
            let mut k = vec![&[][..]; room];
            let n = batch_keys(&buf, &mut k);
            let expected = parsed_keys(&buf);
            prop_assert_eq!(&k[..n], &expected[..expected.len().min(room)]);
        }

        /// Whatever the bytes: the keys are words of `buf`, never more than the room.
        #[test]
        fn any_bytes_give_words_of_the_input(buf in prop::collection::vec(prop::sample::select(b"getsmc 0123\r\n\x80ab".to_vec()), 0..200), room in 0usize..20) {
            let mut k = vec![&[][..]; room];
            let n = batch_keys(&buf, &mut k);
            prop_assert!(n <= room);
            let range = buf.as_ptr_range();
            for key in &k[..n] {
                prop_assert!(!key.is_empty() && !key.contains(&b' ') && !key.contains(&b'\n'));
                prop_assert!(range.start <= key.as_ptr() && key.as_ptr_range().end <= range.end);
            }
        }
    }

    #[test]
    fn runs_of_spaces_split_as_the_parser_splits_them() {
        assert_eq!(keys(b"get  a   b \r\n"), [&b"a"[..], b"b"]);
        assert_eq!(keys(b"set  c 0 0  1\r\nx\r\n"), [&b"c"[..]]);
    }
}
