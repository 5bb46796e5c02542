//! The outbound HTTP GET PID 1 uses for `update URL`: plain `http://IP[:PORT]/PATH` (the
//! appliance has no resolver), HTTP/1.0 with `Connection: close`, a bounded head and body and
//! an overall deadline. Integrity comes from the signature check, not the transport (ADR 0025).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// Longest response head accepted.
pub const HEAD_MAX: usize = 16 << 10;
/// Longest time without a byte.
const IDLE_LIMIT: Duration = Duration::from_secs(10);

/// Why a fetch failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FetchError {
    #[error("{0:?}: expected http://IP[:PORT]/PATH (no TLS, no names: the image's signature is what is trusted)")]
    Url(String),
    #[error("{url}: {why}")]
    Io { url: String, why: String },
    #[error("{url}: HTTP status {status}")]
    Status { url: String, status: String },
    #[error("{url}: more than {limit} bytes")]
    TooLarge { url: String, limit: usize },
    #[error("{url}: not finished within {secs} s")]
    Timeout { url: String, secs: u64 },
}

/// A parsed `http://IP[:PORT]/PATH`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Url {
    pub addr: SocketAddr,
    pub host: String,
    pub path: String,
}

pub fn parse_url(url: &str) -> Result<Url, FetchError> {
    let bad = || FetchError::Url(url.chars().take(200).collect());
    let rest = url.strip_prefix("http://").ok_or_else(bad)?;
    let (host, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    if path.bytes().any(|b| b <= b' ' || b >= 0x7f) {
        return Err(bad());
    }
    let addr: SocketAddr = match host.parse() {
        Ok(addr) => addr,
        Err(_) => SocketAddr::new(host.parse().map_err(|_| bad())?, 80),
    };
    Ok(Url {
        addr,
        host: host.to_string(),
        path: path.to_string(),
    })
}

/// GETs `url`: the body of a 200 answer, at most `limit` bytes, all within `deadline`.
pub fn get(url: &str, limit: usize, deadline: Duration) -> Result<Vec<u8>, FetchError> {
    let parsed = parse_url(url)?;
    let started = Instant::now();
    let io = |e: std::io::Error| {
        if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::TimedOut {
            FetchError::Timeout {
                url: url.to_string(),
                secs: deadline.as_secs(),
            }
        } else {
            FetchError::Io {
                url: url.to_string(),
                why: e.to_string(),
            }
        }
    };
    let mut stream =
        TcpStream::connect_timeout(&parsed.addr, IDLE_LIMIT.min(deadline)).map_err(io)?;
    stream.set_read_timeout(Some(IDLE_LIMIT)).map_err(io)?;
    stream.set_write_timeout(Some(IDLE_LIMIT)).map_err(io)?;
    let request = format!(
        "GET {} HTTP/1.0\r\nHost: {}\r\nConnection: close\r\nUser-Agent: ringstore/{}\r\n\r\n",
        parsed.path,
        parsed.host,
        env!("CARGO_PKG_VERSION")
    );
    stream.write_all(request.as_bytes()).map_err(io)?;
    let mut got = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    let mut body_at = None;
    loop {
        if started.elapsed() > deadline {
            return Err(FetchError::Timeout {
                url: url.to_string(),
                secs: deadline.as_secs(),
            });
        }
        let n = stream.read(&mut buf).map_err(io)?;
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
        if body_at.is_none() {
            body_at = got.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4);
            if body_at.is_none() && got.len() > HEAD_MAX {
                return Err(FetchError::TooLarge {
                    url: url.to_string(),
                    limit: HEAD_MAX,
                });
            }
        }
        if got.len() - body_at.unwrap_or(0) > limit {
            return Err(FetchError::TooLarge {
                url: url.to_string(),
                limit,
            });
        }
    }
    let body_at = body_at.ok_or_else(|| FetchError::Io {
        url: url.to_string(),
        why: "connection closed inside the response head".into(),
    })?;
    let head = String::from_utf8_lossy(&got[..body_at]);
    let status = head.split_whitespace().nth(1).unwrap_or("").to_string();
    if status != "200" {
        return Err(FetchError::Status {
            url: url.to_string(),
            status,
        });
    }
    let length = head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim()
            .eq_ignore_ascii_case("content-length")
            .then(|| v.trim().parse::<usize>().ok())
            .flatten()
    });
    let body = got.split_off(body_at);
    if let Some(length) = length {
        if body.len() != length {
            return Err(FetchError::Io {
                url: url.to_string(),
                why: format!(
                    "{} of {length} bytes before the connection closed",
                    body.len()
                ),
            });
        }
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn serve_once(answer: Vec<u8>) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            if let Ok((mut s, _)) = listener.accept() {
                let mut buf = [0u8; 1024];
                let _ = s.read(&mut buf);
                let _ = s.write_all(&answer);
            }
        });
        format!("http://127.0.0.1:{port}/ringstore.efi")
    }

    #[test]
    fn urls_must_be_plain_http_to_an_address() {
        let u = parse_url("http://10.0.2.2:8000/a/b.efi").unwrap();
        assert_eq!((u.addr.port(), u.path.as_str()), (8000, "/a/b.efi"));
        assert_eq!(parse_url("http://10.0.2.2").unwrap().addr.port(), 80);
        for bad in [
            "https://10.0.2.2/x",
            "http://example.com/x",
            "http://10.0.2.2/a b",
            "ftp://x",
        ] {
            assert!(matches!(parse_url(bad), Err(FetchError::Url(_))), "{bad}");
        }
    }

    #[test]
    fn a_200_body_is_returned_and_limits_hold() {
        let url = serve_once(b"HTTP/1.0 200 OK\r\nContent-Length: 5\r\n\r\nhello".to_vec());
        assert_eq!(get(&url, 5, Duration::from_secs(5)).unwrap(), b"hello");
        let url = serve_once(b"HTTP/1.0 200 OK\r\n\r\nhello!".to_vec());
        assert!(matches!(
            get(&url, 5, Duration::from_secs(5)),
            Err(FetchError::TooLarge { limit: 5, .. })
        ));
        let url = serve_once(b"HTTP/1.0 404 Not Found\r\n\r\n".to_vec());
        assert!(matches!(
            get(&url, 5, Duration::from_secs(5)),
            Err(FetchError::Status { .. })
        ));
        let url = serve_once(vec![b'x'; HEAD_MAX + 10]);
        assert!(matches!(
            get(&url, 5, Duration::from_secs(5)),
            Err(FetchError::TooLarge { .. })
        ));
        let url = serve_once(b"HTTP/1.0 200 OK\r\nContent-Length: 9\r\n\r\nhello".to_vec());
        assert!(matches!(
            get(&url, 50, Duration::from_secs(5)),
            Err(FetchError::Io { .. })
        ));
    }
}
