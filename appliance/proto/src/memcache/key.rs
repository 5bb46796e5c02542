//! Key rules (length, control characters) and the base64 keys of meta commands (`b` flag).

use super::KEY_LEN_MAX;

/// A text-protocol key is 1..=250 bytes with no control characters (spaces cannot occur:
/// they separate tokens). memcached itself accepts control bytes; ringstore refuses them
/// because the same keys are served over HTTP and shown on the console.
pub fn valid_text_key(key: &[u8]) -> bool {
    !key.is_empty() && key.len() <= KEY_LEN_MAX && key.iter().all(|&b| key_byte(b))
}

/// Whether `b` may be in a text key: no control byte (a space separates keys, checked apart).
#[inline]
pub(crate) fn key_byte(b: u8) -> bool {
    b >= 0x20 && b != 0x7f
}

/// Largest decoded length of a base64 key of at most 250 characters.
pub const BINARY_KEY_MAX: usize = KEY_LEN_MAX / 4 * 3;

/// Scratch space for a decoded binary key; lives on the caller's stack.
#[derive(Debug, Clone, Copy)]
pub struct KeyBuf([u8; BINARY_KEY_MAX]);

impl Default for KeyBuf {
    fn default() -> KeyBuf {
        KeyBuf([0; BINARY_KEY_MAX])
    }
}

/// A meta-command key as written; base64-encoded when the `b` flag was given (checked
/// at parse time, decoded again by [`MetaKey::bytes`] so requests stay small).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetaKey<'a> {
    raw: &'a [u8],
    binary: bool,
}

impl<'a> MetaKey<'a> {
    /// A plain key.
    pub fn text(raw: &'a [u8]) -> MetaKey<'a> {
        MetaKey { raw, binary: false }
    }

    /// A base64 key; `None` when it is not valid base64 or decodes to nothing.
    pub fn base64(raw: &'a [u8]) -> Option<MetaKey<'a>> {
        let mut buf = KeyBuf::default();
        match base64_decode(raw, &mut buf.0) {
            Some(n) if n > 0 => Some(MetaKey { raw, binary: true }),
            _ => None,
        }
    }

    /// The key bytes the store sees (decoded into `buf` for binary keys).
    pub fn bytes<'b>(&self, buf: &'b mut KeyBuf) -> &'b [u8]
    where
        'a: 'b,
    {
        if self.binary {
            // Validated at parse time; a failure here would mean an empty key.
            let n = base64_decode(self.raw, &mut buf.0).unwrap_or(0);
            &buf.0[..n]
        } else {
            self.raw
        }
    }

    /// The key as the client wrote it.
    pub fn raw(&self) -> &'a [u8] {
        self.raw
    }

    /// Whether the key came base64-encoded (`k` echoes it encoded, followed by ` b`).
    pub fn is_binary(&self) -> bool {
        self.binary
    }
}

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

fn sextet(c: u8) -> Option<u32> {
    match c {
        b'A'..=b'Z' => Some(u32::from(c - b'A')),
        b'a'..=b'z' => Some(u32::from(c - b'a') + 26),
        b'0'..=b'9' => Some(u32::from(c - b'0') + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    }
}

/// Standard base64 with padding into `out`; `None` on bad input or when `out` is short.
pub fn base64_decode(input: &[u8], out: &mut [u8]) -> Option<usize> {
    if input.len() & 3 != 0 {
        return None;
    }
    let mut n = 0;
    let groups = input.len() / 4;
    for (gi, g) in input.chunks_exact(4).enumerate() {
        let last = gi + 1 == groups;
        let pad = if last {
            g.iter().rev().take_while(|&&c| c == b'=').count()
        } else {
            0
        };
        if pad > 2 {
            return None;
        }
        let mut v: u32 = 0;
        for &c in &g[..4 - pad] {
            v = (v << 6) | sextet(c)?;
        }
        v <<= [0, 6, 12][pad]; // the missing sextets (pad <= 2, checked above)
        let [_, b0, b1, b2] = v.to_be_bytes();
        let bytes = [b0, b1, b2];
        let take = 3 - pad;
        if n + take > out.len() {
            return None;
        }
        out[n..n + take].copy_from_slice(&bytes[..take]);
        n += take;
    }
    Some(n)
}

/// Appends the standard base64 encoding (with padding) of `input` to `out`.
pub fn base64_encode(input: &[u8], out: &mut Vec<u8>) {
    for chunk in input.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let v = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        let chars = [
            ALPHABET[(v >> 18) as usize & 63],
            ALPHABET[(v >> 12) as usize & 63],
            if chunk.len() > 1 {
                ALPHABET[(v >> 6) as usize & 63]
            } else {
                b'='
            },
            if chunk.len() > 2 {
                ALPHABET[v as usize & 63]
            } else {
                b'='
            },
        ];
        out.extend_from_slice(&chars);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_key_rules() {
        assert!(valid_text_key(b"foo"));
        assert!(valid_text_key(&[b'k'; 250]));
        assert!(!valid_text_key(&[b'k'; 251]));
        assert!(!valid_text_key(b"a\x01b"));
        assert!(!valid_text_key(b"a\tb"));
        assert!(!valid_text_key(b"a\x7fb"));
        assert!(!valid_text_key(b""));
    }

    #[test]
    fn base64_round_trip_and_errors() {
        let mut buf = KeyBuf::default();
        let k = MetaKey::base64(b"Zm9v").expect("valid");
        assert_eq!(k.bytes(&mut buf), b"foo");
        assert_eq!(
            MetaKey::base64(b"YQ==").expect("valid").bytes(&mut buf),
            b"a"
        );
        assert!(MetaKey::base64(b"a").is_none());
        assert!(MetaKey::base64(b"$$$$").is_none());
        assert!(MetaKey::base64(b"").is_none());
        assert!(MetaKey::base64(b"Y===").is_none());
        let mut out = Vec::new();
        base64_encode(b"foo", &mut out);
        base64_encode(b"a", &mut out);
        base64_encode(b"ab", &mut out);
        assert_eq!(out, b"Zm9vYQ==YWI=");
        let long = [b'A'; 248];
        assert_eq!(
            MetaKey::base64(&long).expect("fits").bytes(&mut buf).len(),
            186
        );
    }
}
