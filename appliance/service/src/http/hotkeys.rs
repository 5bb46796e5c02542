//! `GET /_hotkeys[?n=N]`: the hot-key listing ([`crate::hotkeys`]) as JSON. The path is
//! reserved: `_hotkeys` is not an object over HTTP (other methods get 405).
//!
//! With `--http-tokens` a token is required, and any token may read it: a token limited to
//! a prefix sees only the hot keys under that prefix (the keys it could read anyway).

use ringstore_proto::http::HeadWriter;

use super::request::connection_field;
use super::*;
use crate::hotkeys::{TOP_DEFAULT, TOP_MAX};

/// The decoded key of the reserved path.
pub(super) const PATH_KEY: &[u8] = b"_hotkeys";

impl HttpSession {
    /// Answers a request for [`PATH_KEY`]. A request with a body is answered and the
    /// connection closed (the body is not read).
    pub(super) fn hot_keys<B: Backend>(
        &mut self,
        head: &RequestHead<'_>,
        pos: usize,
        now: Now,
        backend: &B,
        out: &mut Vec<u8>,
    ) -> Step {
        let prefix = match access::read_prefix(backend, head, self.client.as_deref(), now) {
            Ok(prefix) => prefix,
            Err(status) => return self.refuse_access(backend, head, pos, out, status),
        };
        let keep_alive = head.keep_alive && matches!(head.body, BodyFraming::None);
        let connection = connection_field(keep_alive, head.version);
        let body = match head.method {
            Method::Get | Method::Head => backend.hot_keys(top_n(head.target), &prefix),
            _ => None,
        };
        let status = match body {
            Some(json) => {
                HeadWriter::start(out, Status::Ok)
                    .content_type(b"application/json")
                    .content_length(json.len() as u64)
                    .finish(connection);
                if head.method == Method::Get {
                    out.extend_from_slice(&json);
                }
                Status::Ok
            }
            None if matches!(head.method, Method::Get | Method::Head) => Status::NotFound,
            None => Status::MethodNotAllowed,
        };
        if status != Status::Ok {
            write_empty(out, status, connection);
        }
        backend.record(self.worker, Event::Response(status));
        if keep_alive {
            Step::Next(pos)
        } else {
            Step::Close
        }
    }
}

/// `n` from the target's query (`?n=20`), 1 to [`TOP_MAX`]; [`TOP_DEFAULT`] without one.
fn top_n(target: &[u8]) -> usize {
    let query = match target.iter().position(|&b| b == b'?') {
        Some(at) => &target[at + 1..],
        None => return TOP_DEFAULT,
    };
    query
        .split(|&b| b == b'&')
        .find_map(|field| field.strip_prefix(b"n="))
        .and_then(|n| std::str::from_utf8(n).ok()?.parse::<usize>().ok())
        .map_or(TOP_DEFAULT, |n| n.clamp(1, TOP_MAX))
}

#[cfg(test)]
mod tests {
    use super::top_n;

    #[test]
    fn the_query_picks_how_many() {
        assert_eq!(top_n(b"/_hotkeys"), 10);
        assert_eq!(top_n(b"/_hotkeys?n=3"), 3);
        assert_eq!(top_n(b"/_hotkeys?x=1&n=100"), 100);
        assert_eq!(top_n(b"/_hotkeys?n=1000"), 100);
        assert_eq!(top_n(b"/_hotkeys?n=0"), 1);
        assert_eq!(top_n(b"/_hotkeys?n=x"), 10);
    }
}
