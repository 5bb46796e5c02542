//! memcache over UDP (off by default): each datagram carries memcached's 8-byte frame header
//! (request id, sequence, datagram count, reserved) and one whole request; replies are split
//! into datagrams of at most 1400 bytes, each with its header (the format is
//! `ringstore_proto::wire::frame`). This module holds what every datapath backend shares per
//! request: the allow-list check and [`answer`], one request datagram through a fresh
//! memcache session with its reply bounded by [`REPLY_MAX`]. The backends are in
//! `datapath/` (ADR 0021).

use std::net::IpAddr;

use ringstore_service::{Device, Flow, Now, Protocol, Session, Shared};

use ipnet::IpNet;

/// Reply bytes one request datagram may produce (47 datagrams). memcache over UDP is an
/// amplification vector (a 54-byte `get` naming a large value thousands of times), so a
/// longer reply is replaced by [`REPLY_TOO_LARGE`]; TCP serves such requests.
pub(crate) const REPLY_MAX: usize = 64 << 10;
/// What a request whose reply would pass [`REPLY_MAX`] gets instead.
const REPLY_TOO_LARGE: &[u8] = b"SERVER_ERROR reply too large for UDP\r\n";

/// Whether datagrams from `peer` are answered (`allow` empty: every source).
pub(crate) fn allowed(allow: &[IpNet], peer: Option<IpAddr>) -> bool {
    allow.is_empty() || peer.is_some_and(|ip| allow.iter().any(|net| net.contains(&ip)))
}

/// Runs `input` (one request datagram) through a fresh memcache session counted on
/// `worker`'s slot; the reply, at most [`REPLY_MAX`] bytes, is left in `out`.
///
/// With a data device (`device`), a write is journaled and its reply held until its records
/// are settled: the session is returned (`Some`) and the caller keeps it until
/// [`Session::awaits_durable`] is false after [`Session::on_durable`], then sends what that
/// wrote to its output (through [`bound_reply`]).
pub(crate) fn answer(
    shared: &Shared,
    worker: usize,
    input: &[u8],
    now: Now,
    device: Option<&dyn Device>,
    reply: &mut crate::datapath::Reply,
) -> Option<Session> {
    reply.clear();
    let out = &mut reply.bytes;
    // Each datagram picks its protocol by its first byte (text, or binary after 0x80), as
    // memcached's UDP does: nothing of an earlier datagram's carries over.
    let mut session = Session::new(Protocol::Memcache, worker);
    session.mark_responses();
    let mut next = input;
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
        bound_reply(input, out);
    } else {
        reply.marks = session.take_response_marks();
    }
    session.on_output_flushed();
    session.on_close(shared, device);
    None
}

/// Replaces a reply longer than [`REPLY_MAX`] by the protocol's "too large" reply to
/// `request`.
pub(crate) fn bound_reply(request: &[u8], out: &mut Vec<u8>) {
    if out.len() > REPLY_MAX {
        out.clear();
        ringstore_service::memcache::reply_too_large(request, REPLY_TOO_LARGE, out);
    }
}
