//! What the TLS benchmark's client says and how it finds whole replies: memcache GET/SET
//! (mcwire's splitter), memcache `version`, and HTTP/1.1 GET with a `Content-Length` body; and
//! the rustls client configuration every TLS cell uses (one suite, one group, the bench's own
//! certificate pinned).

use super::mcwire::{split_reply, write_request, Op, Reply};

/// The one cipher suite and key exchange group every TLS cell offers (both servers speak them).
pub(super) const SUITE: &str = "TLS 1.3, TLS_AES_128_GCM_SHA256, X25519, ECDSA P-256 certificate";

/// The requests of a cell.
#[derive(Clone, Debug)]
pub(super) enum Wire {
    /// Memcache text GET or SET of `value_len`-byte values over keys `0..keyspace`.
    Memcache {
        op: Op,
        value_len: usize,
        keyspace: usize,
    },
    /// Memcache `version` (the handshake cells' one request).
    Version,
    /// HTTP/1.1 GET of `path` on a kept-alive connection.
    HttpGet { path: String },
}

/// One whole reply: whether it is the expected one (a hit, `STORED`, `VERSION`, a 200).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Whole {
    pub ok: bool,
    pub len: usize,
}

impl Wire {
    /// Appends the request for key `index` to `out`; `value` is the SET value.
    pub(super) fn request(&self, out: &mut Vec<u8>, value: &[u8], index: usize) {
        match self {
            Wire::Memcache { op, keyspace, .. } => {
                write_request(out, *op, value, index % (*keyspace).max(1));
            }
            Wire::Version => out.extend_from_slice(b"version\r\n"),
            Wire::HttpGet { path } => {
                out.extend_from_slice(b"GET ");
                out.extend_from_slice(path.as_bytes());
                out.extend_from_slice(b" HTTP/1.1\r\nHost: bench\r\n\r\n");
            }
        }
    }

    /// The value length of this cell's memcache replies (0 for the others).
    pub(super) fn value_len(&self) -> usize {
        match self {
            Wire::Memcache { value_len, .. } => *value_len,
            _ => 0,
        }
    }

    /// The keys this cell's requests walk (1 for the others).
    pub(super) fn keyspace(&self) -> usize {
        match self {
            Wire::Memcache { keyspace, .. } => (*keyspace).max(1),
            _ => 1,
        }
    }

    /// The SET value of this cell (empty for the others).
    pub(super) fn value(&self) -> Vec<u8> {
        match self {
            Wire::Memcache {
                op: Op::Set,
                value_len,
                ..
            } => vec![b'v'; *value_len],
            Wire::Memcache { value_len, .. } => vec![0; *value_len],
            _ => Vec::new(),
        }
    }

    /// The first whole reply in `buf`; `None` while it is incomplete.
    pub(super) fn split(&self, buf: &[u8]) -> Option<Whole> {
        match self {
            Wire::Memcache { op, .. } => split_reply(buf).map(|(reply, len)| Whole {
                ok: matches!(
                    (op, reply),
                    (Op::Get, Reply::Hit) | (Op::Set, Reply::Stored)
                ),
                len,
            }),
            Wire::Version => {
                let eol = buf.windows(2).position(|w| w == b"\r\n")?;
                Some(Whole {
                    ok: buf.starts_with(b"VERSION "),
                    len: eol + 2,
                })
            }
            Wire::HttpGet { .. } => split_http(buf),
        }
    }
}

/// One HTTP/1.1 response: its head up to the blank line, then `Content-Length` bytes of body.
pub(super) fn split_http(buf: &[u8]) -> Option<Whole> {
    let head_end = buf.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let head = std::str::from_utf8(&buf[..head_end]).ok();
    let length = head.and_then(|h| {
        h.lines().find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse::<usize>().ok())
                .flatten()
        })
    });
    let ok = head.is_some_and(|h| h.starts_with("HTTP/1.1 200 ")) && length.is_some();
    let len = head_end + length.unwrap_or(0);
    (buf.len() >= len).then_some(Whole { ok, len })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_responses_split_at_their_body_end() {
        let one = b"HTTP/1.1 200 OK\r\nServer: x\r\ncontent-length: 3\r\n\r\nabcHTTP/1.1 404";
        assert_eq!(split_http(one), Some(Whole { ok: true, len: 52 }));
        assert_eq!(split_http(&one[..51]), None);
        assert_eq!(split_http(b"HTTP/1.1 200 OK\r\nContent-Le"), None);
        let missing = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n";
        assert_eq!(
            split_http(missing),
            Some(Whole {
                ok: false,
                len: missing.len()
            })
        );
        let no_length = b"HTTP/1.1 200 OK\r\n\r\n";
        assert!(!split_http(no_length).is_some_and(|w| w.ok));
    }

    #[test]
    fn memcache_and_version_replies() {
        let get = Wire::Memcache {
            op: Op::Get,
            value_len: 3,
            keyspace: 10,
        };
        let mut out = Vec::new();
        get.request(&mut out, &get.value(), 12);
        assert_eq!(out, b"get b3:00000002\r\n");
        assert_eq!(
            get.split(b"VALUE k 0 3\r\nabc\r\nEND\r\n"),
            Some(Whole { ok: true, len: 23 })
        );
        assert!(!get.split(b"END\r\n").is_some_and(|w| w.ok));
        assert_eq!(
            Wire::Version.split(b"VERSION 1.6.18\r\nVER"),
            Some(Whole { ok: true, len: 16 })
        );
        assert_eq!(Wire::Version.split(b"VERSION 1"), None);
    }
}
