//! Reply formatting: memcached's reply lines written straight into the output buffer,
//! numbers formatted without allocation.

/// Appends the decimal text of `v`.
pub fn push_u64(out: &mut Vec<u8>, mut v: u64) {
    if let Ok(digit @ 0..=9) = u8::try_from(v) {
        // One digit (a GET's flags, mostly): no digit buffer to set up and copy, which cost
        // a `VALUE` line about 40 instructions (callgrind).
        out.push(b'0' + digit);
        return;
    }
    if let Ok(small @ 10..=9999) = u16::try_from(v) {
        // Two to four digits (a value's length, mostly): copies of a fixed length, where
        // the general loop's copy of a variable one called memcpy (~30 instructions).
        push_small(out, small);
        return;
    }
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    out.extend_from_slice(&buf[i..]);
}

/// Appends the decimal text of `v` (10 to 9999).
fn push_small(out: &mut Vec<u8>, v: u16) {
    let (digits, n) = small_digits(v);
    // A fixed-size copy, then cut: a variable-length one called memcpy (~30 instructions).
    let end = out.len() + n;
    out.extend_from_slice(&digits.to_le_bytes());
    out.truncate(end);
}

/// The decimal digits of `v` (at most 9999) from the low byte of a little-endian word up,
/// and how many there are: two digits per lookup in [`DIGIT_PAIRS`], leading zeros shifted
/// out.
#[inline]
fn small_digits(v: u16) -> (u64, usize) {
    debug_assert!(v <= 9999);
    let pair = |v: u16| {
        let at = usize::from(v % 100) * 2;
        (DIGIT_PAIRS[at], DIGIT_PAIRS[at + 1])
    };
    let ((a, b), (c, d)) = (pair(v / 100), pair(v));
    let zeros = usize::from(v < 1000) + usize::from(v < 100) + usize::from(v < 10);
    (
        u64::from_le_bytes([a, b, c, d, 0, 0, 0, 0]) >> (8 * zeros),
        4 - zeros,
    )
}

/// Appends the decimal text of a signed `v`.
pub fn push_i64(out: &mut Vec<u8>, v: i64) {
    if v < 0 {
        out.push(b'-');
    }
    push_u64(out, v.unsigned_abs());
}

/// Appends `text` and `\r\n`.
pub fn line(out: &mut Vec<u8>, text: &str) {
    out.extend_from_slice(text.as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// Appends `VALUE <key> <flags> <bytes>[ <cas>]\r\n` (the data and `\r\n` follow).
#[inline]
pub fn value_header(out: &mut Vec<u8>, key: &[u8], flags: u32, len: usize, cas: Option<u64>) {
    out.extend_from_slice(b"VALUE ");
    out.extend_from_slice(key);
    if let (None, Ok(flags @ 0..=9), Ok(len @ 0..=9999)) =
        (cas, u8::try_from(flags), u16::try_from(len))
    {
        push_short_tail(out, flags, len);
        return;
    }
    push_tail(out, flags, len, cas);
}

/// ` <flags> <len>\r\n` for a one-digit `flags` and a `len` under 10,000 (the usual `VALUE`
/// line): built in one fixed-size array and appended whole, then cut to its length. A push
/// per piece cost a GET about 60 instructions more (callgrind).
#[inline]
fn push_short_tail(out: &mut Vec<u8>, flags: u8, len: u16) {
    debug_assert!(flags <= 9 && len <= 9999);
    let (digits, n) = small_digits(len);
    let line_end = digits | (u64::from(u16::from_le_bytes(*b"\r\n")) << (8 * n));
    let mut tail = [0u8; 16];
    tail[..3].copy_from_slice(&[b' ', b'0' + flags, b' ']);
    tail[3..11].copy_from_slice(&line_end.to_le_bytes());
    let end = out.len() + 3 + n + 2;
    out.extend_from_slice(&tail);
    out.truncate(end);
}

/// `00`, `01`, ... `99`: two digits per lookup (a division by 10 per digit cost more).
const DIGIT_PAIRS: [u8; 200] = {
    let mut pairs = [0u8; 200];
    let mut i = 0u8;
    while i < 100 {
        pairs[2 * i as usize] = b'0' + i / 10;
        pairs[2 * i as usize + 1] = b'0' + i % 10;
        i += 1;
    }
    pairs
};

/// ` <flags> <len>[ <cas>]\r\n`, any numbers.
fn push_tail(out: &mut Vec<u8>, flags: u32, len: usize, cas: Option<u64>) {
    out.push(b' ');
    push_u64(out, u64::from(flags));
    out.push(b' ');
    push_u64(out, len as u64);
    if let Some(cas) = cas {
        out.push(b' ');
        push_u64(out, cas);
    }
    out.extend_from_slice(b"\r\n");
}

/// Appends a full `VALUE` block: header, data, `\r\n`.
#[inline]
pub fn value(out: &mut Vec<u8>, key: &[u8], flags: u32, data: &[u8], cas: Option<u64>) {
    out.reserve(data.len() + key.len() + 48);
    value_header(out, key, flags, data.len(), cas);
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
}

/// Appends `STAT <name> <value>\r\n`.
pub fn stat(out: &mut Vec<u8>, name: &str, value: u64) {
    out.extend_from_slice(b"STAT ");
    out.extend_from_slice(name.as_bytes());
    out.push(b' ');
    push_u64(out, value);
    out.extend_from_slice(b"\r\n");
}

/// Appends `STAT <name> <text>\r\n`.
pub fn stat_str(out: &mut Vec<u8>, name: &str, value: &str) {
    out.extend_from_slice(b"STAT ");
    out.extend_from_slice(name.as_bytes());
    out.push(b' ');
    out.extend_from_slice(value.as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// Appends a meta flag with a number: ` <letter><n>`.
pub fn meta_num(out: &mut Vec<u8>, letter: u8, v: u64) {
    out.push(b' ');
    out.push(letter);
    push_u64(out, v);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers() {
        let mut out = Vec::new();
        push_u64(&mut out, 0);
        out.push(b' ');
        push_u64(&mut out, u64::MAX);
        out.push(b' ');
        push_i64(&mut out, -29);
        assert_eq!(out, b"0 18446744073709551615 -29");
        for v in (0..=100_000u64).chain([u64::from(u32::MAX), u64::MAX - 1]) {
            out.clear();
            push_u64(&mut out, v);
            assert_eq!(out, v.to_string().as_bytes());
        }
    }

    /// The short `VALUE` tail says what the general one says, at every digit count.
    #[test]
    fn short_value_tails_are_the_general_ones() {
        for flags in 0..=9u8 {
            for len in (0..=1200u16).chain([1999, 2000, 9998, 9999]) {
                let (mut short, mut general) = (b"VALUE k".to_vec(), b"VALUE k".to_vec());
                push_short_tail(&mut short, flags, len);
                push_tail(&mut general, u32::from(flags), usize::from(len), None);
                assert_eq!(short, general, "{flags} {len}");
                assert_eq!(general, format!("VALUE k {flags} {len}\r\n").as_bytes());
            }
        }
        let mut out = Vec::new();
        value_header(&mut out, b"k", 10, 10_000, None);
        value_header(&mut out, b"k", 0, 5, Some(0));
        assert_eq!(out, b"VALUE k 10 10000\r\nVALUE k 0 5 0\r\n");
    }

    #[test]
    fn value_lines() {
        let mut out = Vec::new();
        value(&mut out, b"a", 0, b"x", None);
        value(&mut out, b"a", 5, b"xy", Some(52));
        line(&mut out, "END");
        assert_eq!(out, b"VALUE a 0 1\r\nx\r\nVALUE a 5 2 52\r\nxy\r\nEND\r\n");
        let mut out = Vec::new();
        stat(&mut out, "pid", 42);
        stat_str(&mut out, "version", "1.6.18");
        meta_num(&mut out, b'c', 7);
        assert_eq!(out, b"STAT pid 42\r\nSTAT version 1.6.18\r\n c7");
    }
}
