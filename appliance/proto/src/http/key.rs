//! Object keys from request targets: the URL path without its leading '/', percent-decoded,
//! held to memcache's key rules so both protocols name the same items.

/// Longest key, in bytes after decoding (memcache's limit).
pub const KEY_LEN_MAX: usize = 250;

/// Why a target does not name a key (all answered with 400).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("request target is not a path")]
    NotAPath,
    #[error("malformed percent-encoding")]
    BadEscape,
    #[error("empty key")]
    Empty,
    #[error("key longer than 250 bytes")]
    TooLong,
    #[error("key holds a space or control character")]
    BadByte,
}

/// A decoded key in a fixed buffer (no allocation per request).
#[derive(Clone)]
pub struct KeyBuf {
    bytes: [u8; KEY_LEN_MAX],
    len: usize,
}

impl Default for KeyBuf {
    fn default() -> Self {
        KeyBuf {
            bytes: [0; KEY_LEN_MAX],
            len: 0,
        }
    }
}

impl std::fmt::Debug for KeyBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KeyBuf({:?})", String::from_utf8_lossy(self.as_bytes()))
    }
}

impl KeyBuf {
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

/// Decodes the key named by `target` into `key`.
///
/// Accepts origin-form (`/path?query`) and absolute-form (`http://host/path`); the query is
/// ignored, so a key holding `?` or `#` must percent-encode it. `%2F` decodes to '/', which is
/// an ordinary key byte, as is every byte above 0x7F.
pub fn decode_key(target: &[u8], key: &mut KeyBuf) -> Result<(), KeyError> {
    let path = path_of(target).ok_or(KeyError::NotAPath)?;
    let mut len = 0;
    let mut i = 0;
    while i < path.len() {
        let byte = match path[i] {
            b'%' => {
                let hi = path
                    .get(i + 1)
                    .and_then(|&h| hex(h))
                    .ok_or(KeyError::BadEscape)?;
                let lo = path
                    .get(i + 2)
                    .and_then(|&l| hex(l))
                    .ok_or(KeyError::BadEscape)?;
                i += 3;
                hi << 4 | lo
            }
            b => {
                i += 1;
                b
            }
        };
        if byte <= b' ' || byte == 0x7f {
            return Err(KeyError::BadByte);
        }
        if len == KEY_LEN_MAX {
            return Err(KeyError::TooLong);
        }
        key.bytes[len] = byte;
        len += 1;
    }
    if len == 0 {
        return Err(KeyError::Empty);
    }
    key.len = len;
    Ok(())
}

/// The path of a target without its leading '/', query and fragment.
fn path_of(target: &[u8]) -> Option<&[u8]> {
    let after_scheme = strip_scheme(target);
    let path = match after_scheme {
        Some(authority_and_path) => {
            let slash = authority_and_path.iter().position(|&b| b == b'/')?;
            &authority_and_path[slash..]
        }
        None => target,
    };
    let path = path.strip_prefix(b"/")?;
    let end = path
        .iter()
        .position(|&b| b == b'?' || b == b'#')
        .unwrap_or(path.len());
    Some(&path[..end])
}

fn strip_scheme(target: &[u8]) -> Option<&[u8]> {
    for scheme in [&b"http://"[..], &b"https://"[..]] {
        if let Some(head) = target.get(..scheme.len()) {
            if head.eq_ignore_ascii_case(scheme) {
                return Some(&target[scheme.len()..]);
            }
        }
    }
    None
}

/// The value of one hex digit (either case), shared with the chunked-size parser.
pub(crate) fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(target: &str) -> Result<Vec<u8>, KeyError> {
        let mut buf = KeyBuf::default();
        decode_key(target.as_bytes(), &mut buf).map(|()| buf.as_bytes().to_vec())
    }

    #[test]
    fn plain_and_encoded_paths() {
        assert_eq!(key("/foo").unwrap(), b"foo");
        assert_eq!(key("/a/b").unwrap(), b"a/b");
        assert_eq!(key("/a%2Fb%3f%c3%A9").unwrap(), b"a/b?\xc3\xa9");
        assert_eq!(key("/foo?x=1#f").unwrap(), b"foo");
        assert_eq!(key("http://host:8080/k1").unwrap(), b"k1");
        assert_eq!(key("HTTPS://h/k%21").unwrap(), b"k!");
    }

    #[test]
    fn refusals() {
        assert_eq!(key("/"), Err(KeyError::Empty));
        assert_eq!(key("/?q"), Err(KeyError::Empty));
        assert_eq!(key("*"), Err(KeyError::NotAPath));
        assert_eq!(key("foo"), Err(KeyError::NotAPath));
        assert_eq!(key("http://host"), Err(KeyError::NotAPath));
        assert_eq!(key("/a%2"), Err(KeyError::BadEscape));
        assert_eq!(key("/a%zz"), Err(KeyError::BadEscape));
        assert_eq!(key("/a%20b"), Err(KeyError::BadByte));
        assert_eq!(key("/a%0Ab"), Err(KeyError::BadByte));
        assert_eq!(key("/a%7F"), Err(KeyError::BadByte));
        assert_eq!(key("/a%00"), Err(KeyError::BadByte));
    }

    #[test]
    fn length_limit_counts_decoded_bytes() {
        let max = format!("/{}", "k".repeat(KEY_LEN_MAX));
        assert_eq!(key(&max).unwrap().len(), KEY_LEN_MAX);
        assert_eq!(
            key(&format!("/{}", "k".repeat(KEY_LEN_MAX + 1))),
            Err(KeyError::TooLong)
        );
        let encoded = format!("/{}", "%41".repeat(KEY_LEN_MAX));
        assert_eq!(key(&encoded).unwrap(), vec![b'A'; KEY_LEN_MAX]);
    }
}
