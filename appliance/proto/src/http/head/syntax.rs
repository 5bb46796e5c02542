//! Byte-level syntax shared by the head parser (and by the Range and ETag code beside it):
//! lines, tokens, optional whitespace, comma-separated lists, decimal numbers.

/// Lines of a head without their CRLF or LF; a CR elsewhere stays and fails validation.
pub(super) struct Lines<'a> {
    pub(super) rest: &'a [u8],
}

impl<'a> Iterator for Lines<'a> {
    type Item = &'a [u8];
    fn next(&mut self) -> Option<&'a [u8]> {
        let lf = memchr::memchr(b'\n', self.rest)?;
        let line = &self.rest[..lf];
        self.rest = &self.rest[lf + 1..];
        Some(strip_cr(line))
    }
}

pub(super) fn find_lf(buf: &[u8], from: usize) -> Option<usize> {
    memchr::memchr(b'\n', buf.get(from..)?).map(|i| i + from)
}

pub(super) fn strip_cr(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// RFC 9110 token characters.
pub fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

pub(crate) fn trim_ows(mut v: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = v {
        v = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = v {
        v = rest;
    }
    v
}

/// The non-empty, trimmed elements of a comma-separated field value.
pub(crate) fn list_items(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value
        .split(|&b| b == b',')
        .map(trim_ows)
        .filter(|item| !item.is_empty())
}

pub(super) fn strip_prefix_ignore_case<'v>(v: &'v [u8], prefix: &[u8]) -> Option<&'v [u8]> {
    let head = v.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &v[prefix.len()..])
}

/// Decimal digits only, at least one; values past `u64::MAX` saturate (callers treat them as too large).
pub(crate) fn parse_u64_saturating(v: &[u8]) -> Option<u64> {
    if v.is_empty() {
        return None;
    }
    let mut n: u64 = 0;
    for &b in v {
        if !b.is_ascii_digit() {
            return None;
        }
        n = n.saturating_mul(10).saturating_add(u64::from(b - b'0'));
    }
    Some(n)
}

/// An optional `-` and decimal digits, saturating at the i64 range.
pub(super) fn parse_i64_saturating(v: &[u8]) -> Option<i64> {
    match v.strip_prefix(b"-") {
        Some(digits) => {
            parse_u64_saturating(digits).map(|n| i64::try_from(n).map_or(i64::MIN, |n| -n))
        }
        None => parse_u64_saturating(v).map(|n| i64::try_from(n).unwrap_or(i64::MAX)),
    }
}
