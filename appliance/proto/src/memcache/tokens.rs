//! Command-line tokens and number parsing with memcached's exact rules.
//!
//! memcached splits a line on single spaces (runs of spaces collapse), keeps at most 23
//! tokens plus a terminal, and parses numbers with `strtol`/`strtoul`/`strtoull` wrapped
//! in `safe_strto*`. Clients depend on the corner cases (`+5` is a number, `-1` is not a
//! flags value, `4294967296` wraps to 0 as flags), so they are reproduced here.

/// memcached's `TOKENS_MAX`: 23 real tokens and the terminal.
pub const TOKENS_MAX: usize = 24;

/// The tokens of one command line, borrowed from it.
#[derive(Debug, Clone, Copy)]
pub struct Tokens<'a> {
    toks: [&'a [u8]; TOKENS_MAX - 1],
    len: usize,
}

impl<'a> Tokens<'a> {
    /// Splits `line` like memcached's `tokenize_command` (at most 23 tokens are kept).
    pub fn new(line: &'a [u8]) -> Tokens<'a> {
        let mut toks: [&'a [u8]; TOKENS_MAX - 1] = [&[]; TOKENS_MAX - 1];
        let mut len = 0;
        for tok in line.split(|&b| b == b' ').filter(|t| !t.is_empty()) {
            if len == TOKENS_MAX - 1 {
                break;
            }
            toks[len] = tok;
            len += 1;
        }
        Tokens { toks, len }
    }

    /// memcached's `ntokens`: real tokens plus the terminal.
    pub fn ntokens(&self) -> usize {
        self.len + 1
    }

    /// Number of real tokens.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the line had no tokens.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Token `i`, if present.
    pub fn get(&self, i: usize) -> Option<&'a [u8]> {
        if i < self.len {
            Some(self.toks[i])
        } else {
            None
        }
    }

    /// Token `i`, or empty when absent (memcached reads the terminal's empty string).
    pub fn at(&self, i: usize) -> &'a [u8] {
        self.get(i).unwrap_or(&[])
    }

    /// The real tokens from `start` on.
    pub fn from(&self, start: usize) -> &[&'a [u8]] {
        &self.toks[start.min(self.len)..self.len]
    }

    /// memcached's `set_noreply_maybe`: the last real token is exactly `noreply`.
    pub fn noreply(&self) -> bool {
        self.len > 0 && self.toks[self.len - 1] == b"noreply"
    }
}

/// C `isspace` in the "C" locale.
pub fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

/// Parses like C `strtoull`/`strtol` without range handling: returns (negative, magnitude
/// or `None` on overflow of u64, index after the digits), or `None` when there is no digit.
fn scan(s: &[u8]) -> Option<(bool, Option<u64>, usize)> {
    let mut i = 0;
    while i < s.len() && is_c_space(s[i]) {
        i += 1;
    }
    let mut neg = false;
    if i < s.len() && (s[i] == b'+' || s[i] == b'-') {
        neg = s[i] == b'-';
        i += 1;
    }
    let start = i;
    let mut value: Option<u64> = Some(0);
    while i < s.len() && s[i].is_ascii_digit() {
        let d = u64::from(s[i] - b'0');
        value = value
            .and_then(|v| v.checked_mul(10))
            .and_then(|v| v.checked_add(d));
        i += 1;
    }
    if i == start {
        return None;
    }
    Some((neg, value, i))
}

/// After the digits memcached requires the end of the token or a space character.
fn ends_ok(s: &[u8], end: usize) -> bool {
    end == s.len() || is_c_space(s[end])
}

/// memcached `safe_strtoull`: unsigned 64-bit; a negative result is refused when a `-`
/// was written (so `-0` is 0, `-1` fails).
pub fn strtoull(s: &[u8]) -> Option<u64> {
    let (neg, mag, end) = scan(s)?;
    let mag = mag?; // ERANGE
    if !ends_ok(s, end) {
        return None;
    }
    let v = if neg { mag.wrapping_neg() } else { mag };
    if (v as i64) < 0 && s[..end].contains(&b'-') {
        return None;
    }
    Some(v)
}

/// memcached `safe_strtoul` into a `uint32_t`: parsed as 64-bit `unsigned long`, then
/// truncated (so `4294967296` becomes 0, as memcached stores it).
#[expect(
    clippy::cast_possible_truncation,
    reason = "memcached truncates to uint32_t here; so do we, on purpose"
)]
pub fn strtoul32(s: &[u8]) -> Option<u32> {
    strtoull(s).map(|v| v as u32)
}

/// memcached 1.6.18 `safe_strtol` into an `int32_t`: parsed as a 64-bit `long` (refused
/// only on `ERANGE`), then truncated to its low 32 bits unchecked. So an exptime of
/// `2147483648` becomes `-2147483648` (expired at once), `99999999999` becomes
/// `1215752191` (an absolute time in 2008: expired at once), `4294967301` becomes 5, and a
/// data length of `4294967296` becomes 0, all as memcached 1.6.18 reads them.
#[expect(
    clippy::cast_possible_truncation,
    reason = "memcached truncates the long to int32_t unchecked; so do we, on purpose"
)]
pub fn strtol32(s: &[u8]) -> Option<i32> {
    let (neg, mag, end) = scan(s)?;
    let mag = mag?;
    let l: i64 = if neg {
        if mag > (i64::MAX as u64) + 1 {
            return None; // ERANGE
        }
        (mag as i64).wrapping_neg()
    } else {
        if mag > i64::MAX as u64 {
            return None;
        }
        mag as i64
    };
    if !ends_ok(s, end) {
        return None;
    }
    Some(l as i32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokenizer_collapses_spaces_and_caps_at_23() {
        let t = Tokens::new(b"  set   a  0 0 1  ");
        assert_eq!(t.ntokens(), 6);
        assert_eq!(t.at(0), b"set");
        assert_eq!(t.at(4), b"1");
        assert_eq!(t.at(9), b"");
        let many = b"a b c d e f g h i j k l m n o p q r s t u v w x y z";
        let t = Tokens::new(many);
        assert_eq!(t.ntokens(), 24);
        assert_eq!(t.at(22), b"w");
        assert!(Tokens::new(b"").is_empty());
        assert!(Tokens::new(b"set a 0 0 1 noreply").noreply());
        assert!(!Tokens::new(b"set a 0 0 1 noreplyx").noreply());
    }

    #[test]
    fn strtoull_matches_memcached() {
        assert_eq!(strtoull(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(strtoull(b"18446744073709551616"), None);
        assert_eq!(strtoull(b"-1"), None);
        assert_eq!(strtoull(b"-0"), Some(0));
        assert_eq!(strtoull(b"+7"), Some(7));
        assert_eq!(strtoull(b" 12"), Some(12));
        assert_eq!(strtoull(b"12 "), Some(12));
        assert_eq!(strtoull(b"12x"), None);
        assert_eq!(strtoull(b""), None);
        assert_eq!(strtoull(b"-"), None);
        assert_eq!(strtoull(b"abc"), None);
    }

    #[test]
    fn strtoul32_truncates_like_memcached() {
        assert_eq!(strtoul32(b"4294967296"), Some(0));
        assert_eq!(strtoul32(b"4294967295"), Some(u32::MAX));
        assert_eq!(strtoul32(b"-1"), None);
        assert_eq!(strtoul32(b"5"), Some(5));
    }

    #[test]
    fn strtol32_matches_memcached() {
        assert_eq!(strtol32(b"-1"), Some(-1));
        assert_eq!(strtol32(b"2147483647"), Some(i32::MAX));
        assert_eq!(strtol32(b"2147483648"), Some(i32::MIN));
        assert_eq!(strtol32(b"99999999999"), Some(1_215_752_191));
        assert_eq!(strtol32(b"4294967301"), Some(5));
        assert_eq!(strtol32(b"4294967296"), Some(0));
        assert_eq!(strtol32(b"9223372036854775807"), Some(-1));
        assert_eq!(strtol32(b"9223372036854775808"), None);
        assert_eq!(strtol32(b"-9223372036854775808"), Some(0));
        assert_eq!(strtol32(b"abc"), None);
        assert_eq!(strtol32(b"10\t"), Some(10));
        assert_eq!(strtol32(b"99999999999999999999"), None);
    }
}
