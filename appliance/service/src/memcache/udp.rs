//! memcache over UDP, as memcached serves it: each request datagram (its frame header taken
//! off by the runtime) runs through a session of its own, so nothing of one datagram carries
//! over to the next, and each datagram picks its protocol by its first byte (text, or binary
//! after 0x80); every response is marked where it ends, so the runtime frames each in its
//! own datagrams as memcached does; and the reply is capped ([`REPLY_MAX`]), because a
//! 54-byte `get` naming a large value thousands of times makes UDP an amplification vector:
//! a longer reply is replaced by the protocol's "too large" reply (TCP serves such requests).

use super::ResponseMark;
use crate::{Device, Flow, Now, Protocol, Session, Shared};

/// Reply bytes one request datagram may produce (47 datagrams).
pub const REPLY_MAX: usize = 64 << 10;

/// What a request whose reply would pass [`REPLY_MAX`] gets instead (a text request; a
/// binary one gets the binary "Too large." frame).
const REPLY_TOO_LARGE: &[u8] = b"SERVER_ERROR reply too large for UDP\r\n";

/// A request's reply: its bytes and where each of its responses ends (memcached frames
/// every response separately: one per command, one per key of a multi-key get). No marks:
/// the whole reply is one response.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Reply {
    pub bytes: Vec<u8>,
    pub marks: Vec<ResponseMark>,
}

impl Reply {
    pub fn clear(&mut self) {
        self.bytes.clear();
        self.marks.clear();
    }
}

/// Runs `request` (one request datagram) through a fresh memcache session counted on
/// `worker`'s slot; the reply, at most [`REPLY_MAX`] bytes, is left in `reply`.
///
/// With a data device (`device`), a write is journaled and its reply held until its records
/// are settled: the session is returned (`Some`) and the caller keeps it until
/// [`Session::awaits_durable`] is false after [`Session::on_durable`], then sends what that
/// wrote to its output, bounded by [`bound_reply`].
pub fn serve(
    shared: &Shared,
    worker: usize,
    request: &[u8],
    now: Now,
    device: Option<&dyn Device>,
    reply: &mut Reply,
) -> Option<Session> {
    reply.clear();
    let out = &mut reply.bytes;
    let mut session = Session::new(Protocol::Memcache, worker);
    session.mark_responses();
    let mut next = request;
    loop {
        let flow = session.on_bytes(next, now, shared, device, out);
        next = &[];
        if flow != Flow::Drain || out.len() > REPLY_MAX {
            break;
        }
    }
    if device.is_some() && session.awaits_durable() {
        // The reply waits in the session; bounded when it is released.
        return Some(session);
    }
    if out.len() > REPLY_MAX {
        bound_reply(request, out);
    } else {
        reply.marks = session.take_response_marks();
    }
    session.on_output_flushed();
    session.on_close(shared, device);
    None
}

/// Replaces a reply longer than [`REPLY_MAX`] by the protocol's "too large" reply to
/// `request`.
pub fn bound_reply(request: &[u8], out: &mut Vec<u8>) {
    if out.len() > REPLY_MAX {
        out.clear();
        super::reply_too_large(request, REPLY_TOO_LARGE, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memcache::tests::{shared, NOW};

    #[test]
    fn each_response_is_marked_and_nothing_carries_over() {
        let shared = shared();
        let mut reply = Reply::default();
        assert!(serve(&shared, 0, b"set a 0 0 1\r\nx\r\n", NOW, None, &mut reply).is_none());
        assert_eq!(reply.bytes, b"STORED\r\n");
        assert!(serve(&shared, 0, b"get a b\r\nget a", NOW, None, &mut reply).is_none());
        // The partial `get a` of the datagram is dropped with its session.
        assert_eq!(reply.bytes, b"VALUE a 0 1\r\nx\r\nEND\r\n");
        let ends: Vec<usize> = reply.marks.iter().map(|m| m.end).collect();
        assert_eq!(
            ends,
            [16, 21],
            "the value of `a`; the miss of `b` with `END`"
        );
    }

    #[test]
    fn a_reply_past_the_cap_is_the_too_large_reply() {
        let shared = shared();
        let mut reply = Reply::default();
        let value = vec![b'v'; 1000];
        let set = [&b"set big 0 0 1000\r\n"[..], &value, b"\r\n"].concat();
        serve(&shared, 0, &set, NOW, None, &mut reply);
        let get = format!("get {}\r\n", vec!["big"; 100].join(" "));
        assert!(serve(&shared, 0, get.as_bytes(), NOW, None, &mut reply).is_none());
        assert_eq!(reply.bytes, REPLY_TOO_LARGE);
        assert!(reply.marks.is_empty());
        let mut binary = vec![0x80, 0x0c, 0, 3, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 7];
        binary.extend_from_slice(b"big");
        let mut out = vec![0; REPLY_MAX + 1];
        bound_reply(&binary, &mut out);
        assert_eq!(
            &out[..2],
            &[0x81, 0x0c],
            "a binary request gets a binary frame"
        );
        assert_eq!(u32::from_be_bytes([out[12], out[13], out[14], out[15]]), 7);
    }
}
