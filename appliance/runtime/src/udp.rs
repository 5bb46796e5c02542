//! memcache over UDP (off by default): each datagram carries memcached's 8-byte frame header
//! (request id, sequence, datagram count, reserved) and one whole request; replies are split
//! into datagrams of at most 1400 bytes, each with its header (the format is
//! `ringstore_proto::wire::frame`).

use std::net::IpAddr;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::thread::JoinHandle;

use ringstore_proto::wire::frame;
use ringstore_service::{Protocol, Session, Shared};

use ipnet::IpNet;

use crate::clock::Clock;
use crate::RuntimeError;

/// Largest request datagram accepted.
const REQUEST_MAX: usize = 64 << 10;
/// Reply bytes one request datagram may produce (47 datagrams). memcache over UDP is an
/// amplification vector (a 54-byte `get` naming a large value thousands of times), so a
/// longer reply is replaced by [`REPLY_TOO_LARGE`]; TCP serves such requests.
pub(crate) const REPLY_MAX: usize = 64 << 10;
/// What a request whose reply would pass [`REPLY_MAX`] gets instead.
const REPLY_TOO_LARGE: &[u8] = b"SERVER_ERROR reply too large for UDP\r\n";

/// Starts the UDP thread; it ends once `stop_fd` is readable.
pub(crate) fn spawn(
    socket: OwnedFd,
    shared: Arc<Shared>,
    clock: Clock,
    stop_fd: RawFd,
    allow: Vec<IpNet>,
) -> Result<JoinHandle<()>, RuntimeError> {
    std::thread::Builder::new()
        .name("ringstore-udp".into())
        .spawn(move || serve(socket, shared, clock, stop_fd, &allow))
        .map_err(|e| RuntimeError::io("spawning the UDP thread", e))
}

/// Whether datagrams from `peer` are answered (`allow` empty: every source).
pub(crate) fn allowed(allow: &[IpNet], peer: Option<IpAddr>) -> bool {
    allow.is_empty() || peer.is_some_and(|ip| allow.iter().any(|net| net.contains(&ip)))
}

/// Runs `input` (one request datagram) through `session`; the reply, at most
/// [`REPLY_MAX`] bytes, is left in `out`.
pub(crate) fn answer(
    session: &mut Session,
    input: &[u8],
    clock: &Clock,
    shared: &Shared,
    out: &mut Vec<u8>,
) {
    out.clear();
    // Each datagram picks its protocol by its first byte (text, or binary after 0x80), as
    // memcached's UDP does: nothing of an earlier datagram's carries over.
    *session = Session::new(Protocol::Memcache, shared.aux_slot());
    let mut next = input;
    let mut flow;
    loop {
        flow = session.on_bytes(next, clock.now(), shared, None, out);
        next = &[];
        if flow != ringstore_service::Flow::Drain || out.len() > REPLY_MAX {
            break;
        }
    }
    if out.len() > REPLY_MAX {
        out.clear();
        ringstore_service::memcache::reply_too_large(input, REPLY_TOO_LARGE, out);
    }
    session.on_output_flushed();
}

fn serve(socket: OwnedFd, shared: Arc<Shared>, clock: Clock, stop_fd: RawFd, allow: &[IpNet]) {
    let fd = socket.as_raw_fd();
    let mut buf = vec![0u8; REQUEST_MAX];
    let mut out = Vec::new();
    let mut datagram = Vec::with_capacity(frame::DATAGRAM_MAX);
    // The spare counter slot: worker 0's slot is written only by worker 0's thread.
    let mut session = Session::new(Protocol::Memcache, shared.aux_slot());
    loop {
        let ready = crate::sys::poll_readable(&[fd, stop_fd], 1000);
        if ready[1] {
            return;
        }
        if !ready[0] {
            continue;
        }
        while let Some((len, peer)) = crate::sys::recv_from(fd, &mut buf) {
            // Short and multi-datagram requests are dropped, as memcached does.
            let Ok((frame, request)) = frame::parse_request(&buf[..len]) else {
                continue;
            };
            if !allowed(allow, crate::sys::peer_ip(&peer)) {
                continue;
            }
            answer(&mut session, request, &clock, &shared, &mut out);
            if out.is_empty() {
                continue; // noreply
            }
            let Some(frames) = frame::ReplyFrames::new(frame, out.len(), frame::DATAGRAM_MAX)
            else {
                continue;
            };
            for seq in 0..frames.count() {
                let (header, part) = frames.datagram(seq);
                datagram.clear();
                datagram.extend_from_slice(&header);
                datagram.extend_from_slice(&out[part]);
                crate::sys::send_to(fd, &datagram, &peer);
            }
        }
    }
}
