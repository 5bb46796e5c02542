//! The datapath interface: how memcache-over-UDP requests reach a worker and how its
//! replies leave, whatever carries them (kernel UDP sockets, AF_XDP, an ExaNIC).
//!
//! # Shape
//!
//! Every backend is owned by one worker and driven from that worker's loop, on its core; no
//! request or reply crosses cores. Backends come in two kinds:
//!
//! - **Completion-driven** (`Mode::KernelUdp`, `datapath/kernel_udp.rs`): the worker's
//!   io_uring ring carries a multishot `recvmsg` into a provided-buffer group and `sendmsg`
//!   for replies; each completion yields one datagram payload and its peer's socket address.
//! - **Polled frame backends** (AF_XDP, ExaNIC): they implement [`FrameBackend`]. The worker
//!   polls them between ring submissions with a budget per iteration: [`FrameBackend::rx_burst`]
//!   hands over up to `budget` whole Ethernet frames, [`FrameBackend::tx_burst`] queues reply
//!   frames built in TX buffers, and [`FrameBackend::recycle`] gives RX buffers back (to the
//!   fill ring, or nothing to do for a ring the NIC overwrites).
//!
//! Both kinds meet in one sans-IO function, [`serve_datagram`]: "request datagram (memcache
//! frame header + one request) + a way to answer it + a [`ReplySink`]" in, reply datagrams
//! out (memcached's 8-byte header on each, `ringstore_proto::wire::frame`, at most
//! `frame::DATAGRAM_MAX` bytes each, at most [`REPLY_MAX`] bytes of reply per
//! request). The kernel backend's sink queues `sendmsg`s; a frame backend's sink
//! ([`FrameSink`]) writes each datagram into a TX buffer behind Ethernet/IPv4/UDP headers
//! from `ringstore_proto::wire::udp4::write_reply_headers` (addresses swapped, lengths and
//! checksums new), so replies are built in place in the backend's memory.
//!
//! # Invariants
//!
//! - A request must fit in one datagram (memcached's rule): short frames, multi-datagram
//!   requests, sources outside `--udp-allow` and frames that are not IPv4 UDP to the port are
//!   dropped, never answered, and counted (`udp_dropped`).
//! - Everything is bounded: RX bursts by the caller's budget, TX by the backend's ring (a
//!   full ring drops the reply and counts it), reply bytes per request by `REPLY_MAX`
//!   (amplification bound; a longer reply is replaced by the protocol's "too large" reply).
//! - A backend never panics on what arrives: a lapped ExaNIC reader, a bad checksum or a
//!   truncated frame is a counted drop.
//!
//! # How a polled backend plugs in (AF_XDP, ExaNIC)
//!
//! The worker owns a `Vec<Box<dyn FrameBackend>>`-like list (one entry per XSK socket of a
//! queue pinned to its CPU, or per ExaNIC port). In each loop iteration, after reaping its
//! io_uring completions and before the next `io_uring_enter`, it calls
//! [`poll_frames`] on each backend with a budget (e.g. 64 frames): that receives a burst,
//! parses each frame with `wire::udp4::parse`, runs the memcache payload through
//! [`serve_datagram`] with a [`FrameSink`], recycles every RX buffer and flushes the TX
//! burst. While a polled backend is attached the worker must not block in `io_uring_enter`
//! indefinitely: it waits with a short timeout (or, for AF_XDP, the XSK fd's readiness
//! through a poll SQE on the ring) so frames are picked up promptly.

use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;
use ringstore_proto::wire::{frame, udp4};
pub use ringstore_service::memcache::ResponseMark;

pub(crate) mod kernel_udp;
// libexanic's FFI is its `ffi` module, the only one of it allowed `unsafe`.
#[cfg(feature = "exanic")]
pub mod exanic;
pub mod xdp;

// The reply type and its bound belong to the seam every backend answers through
// (`handler.rs`): the datapath uses the handler, never the other way round.
pub use crate::handler::{Reply, REPLY_MAX};

/// Whether datagrams from `peer` are answered (`allow` empty: every source).
pub(crate) fn allowed(allow: &[IpNet], peer: Option<IpAddr>) -> bool {
    allow.is_empty() || peer.is_some_and(|ip| allow.iter().any(|net| net.contains(&ip)))
}

/// How a worker's memcache-UDP traffic is carried (shown in logs, `stats` and the console).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// A UDP socket per worker on its io_uring ring.
    KernelUdp,
    /// AF_XDP with the driver's zero-copy support (UMEM is the NIC's DMA memory).
    XdpZeroCopy,
    /// AF_XDP in copy mode (the kernel copies frames into UMEM).
    XdpCopy,
    /// AF_XDP over generic (skb) XDP: the last resort when the driver has no native XDP.
    XdpGeneric,
    /// An ExaNIC through libexanic (feature `exanic`).
    Exanic,
}

impl Mode {
    /// The name used in logs and `stats` (`kernel-udp`, `xdp-zerocopy`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::KernelUdp => "kernel-udp",
            Mode::XdpZeroCopy => "xdp-zerocopy",
            Mode::XdpCopy => "xdp-copy",
            Mode::XdpGeneric => "xdp-generic",
            Mode::Exanic => "exanic",
        }
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a request came from: what its reply is addressed to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    /// A kernel socket's peer.
    Socket(SocketAddr),
    /// A frame backend's request headers (MACs, IPs, ports), mirrored in the reply.
    Frame(udp4::Udp4Addrs),
}

impl Peer {
    /// The peer's IP address (for `--udp-allow`).
    pub fn ip(&self) -> std::net::IpAddr {
        match self {
            Peer::Socket(addr) => crate::sys::peer_ip(addr).unwrap_or(addr.ip()),
            Peer::Frame(a) => std::net::IpAddr::from(a.src_ip),
        }
    }
}

/// Receives the reply datagrams of one request, in order.
pub trait ReplySink {
    /// Room for `count` more datagrams? Asked once before a reply is emitted: a reply is sent
    /// whole or not at all (a partial multi-datagram reply is useless to the client).
    fn has_room(&mut self, count: usize) -> bool;
    /// One datagram: memcached's frame `header`, then `body` (together at most
    /// `frame::DATAGRAM_MAX` bytes).
    fn datagram(&mut self, header: &[u8; frame::HEADER_LEN], body: &[u8]);
}

/// What [`serve_datagram`] did with one request datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served {
    /// Answered with this many datagrams.
    Replied(usize),
    /// A `noreply` request: nothing to send.
    NoReply,
    /// The reply waits for the data device (see [`Answer::Held`]); [`emit`] sends it later.
    Held,
    /// Dropped unanswered.
    Dropped(DropReason),
}

/// Why a datagram got no answer (each is counted as `udp_dropped`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// Shorter than memcached's 8-byte frame header.
    Short,
    /// Part of a multi-datagram request (memcached accepts none).
    MultiDatagram,
    /// Its source is outside `--udp-allow`.
    NotAllowed,
    /// The sink had no room (TX ring or in-flight sends full).
    NoRoom,
    /// The table of requests waiting for the data device is full.
    HeldFull,
    /// Not an IPv4 UDP frame for this port (frame backends), or a bad checksum.
    NotOurs,
    /// The backend lost it (a lapped ExaNIC reader, a truncated receive).
    Lost,
}

/// The result of running a request through the service.
#[derive(Debug, PartialEq, Eq)]
pub enum Answer {
    /// The reply is in the output buffer (empty: `noreply`).
    Now,
    /// The request staged records on the data device: its reply is held until they are
    /// settled; the caller keeps the state and calls [`emit`] when released.
    Held,
    /// No room to hold it: dropped.
    HeldFull,
}

/// The one per-request function of every backend: checks the frame header and the source,
/// runs the request through `answer` (which leaves the reply in `reply`), and emits the reply
/// datagrams into `sink`. `reply` is scratch owned by the caller (reused, bounded by
/// `REPLY_MAX` plus one reply line).
pub fn serve_datagram(
    datagram: &[u8],
    peer: &Peer,
    allow: &[ipnet::IpNet],
    reply: &mut Reply,
    answer: impl FnOnce(frame::Frame, &[u8], &mut Reply) -> Answer,
    sink: &mut impl ReplySink,
) -> Served {
    let (head, request) = match frame::parse_request(datagram) {
        Ok(parsed) => parsed,
        Err(frame::FrameError::Short) => return Served::Dropped(DropReason::Short),
        Err(frame::FrameError::MultiDatagram { .. }) => {
            return Served::Dropped(DropReason::MultiDatagram)
        }
    };
    if !allowed(allow, Some(peer.ip())) {
        return Served::Dropped(DropReason::NotAllowed);
    }
    reply.clear();
    match answer(head, request, reply) {
        Answer::Now => emit(head, reply, sink),
        Answer::Held => Served::Held,
        Answer::HeldFull => Served::Dropped(DropReason::HeldFull),
    }
}

/// The responses of `reply` as ranges of its bytes, in order, as memcached 1.6 frames them:
/// one per mark, then what follows the last mark. An empty response is skipped, except as
/// the very first one when its mark keeps it (memcached sends the request's first response
/// even when a missed key left it empty, and skips later empty ones). Marks out of order or
/// past the end are ignored.
pub fn responses(reply: &Reply) -> impl Iterator<Item = std::ops::Range<usize>> + '_ {
    let len = reply.bytes.len();
    let mut prev = 0;
    let mut marks = reply.marks.iter();
    let mut tail_done = false;
    let mut yielded = false;
    std::iter::from_fn(move || {
        for m in marks.by_ref() {
            let first = prev == 0 && !yielded;
            if m.end < prev || m.end > len || (m.end == prev && !(m.keep_empty && first)) {
                continue;
            }
            yielded = true;
            let range = prev..m.end;
            prev = m.end;
            return Some(range);
        }
        if !tail_done && prev < len {
            tail_done = true;
            return Some(prev..len);
        }
        None
    })
}

/// Datagrams [`emit`] would send for `reply` (`usize::MAX`: it cannot be framed).
pub fn datagrams_of(head: frame::Frame, reply: &Reply) -> usize {
    let mut count = 0usize;
    for r in responses(reply) {
        match frame::ReplyFrames::new(head, r.len(), frame::DATAGRAM_MAX) {
            Some(frames) => count += usize::from(frames.count()),
            None => return usize::MAX,
        }
    }
    count
}

/// Emits `reply` to the request with frame header `head` as datagrams into `sink`: each
/// response framed on its own (sequence from 0, its own datagram count; an empty response is
/// one header-only datagram with count 0, as memcached sends it). All or nothing.
pub fn emit(head: frame::Frame, reply: &Reply, sink: &mut impl ReplySink) -> Served {
    let count = datagrams_of(head, reply);
    if count == usize::MAX {
        return Served::Dropped(DropReason::NoRoom);
    }
    if count == 0 {
        return Served::NoReply;
    }
    if !sink.has_room(count) {
        return Served::Dropped(DropReason::NoRoom);
    }
    for r in responses(reply) {
        if r.is_empty() {
            let mut header = [0u8; frame::HEADER_LEN];
            header[0..2].copy_from_slice(&head.request_id.to_be_bytes());
            sink.datagram(&header, &[]);
            continue;
        }
        let part = &reply.bytes[r];
        let Some(frames) = frame::ReplyFrames::new(head, part.len(), frame::DATAGRAM_MAX) else {
            continue;
        };
        for seq in 0..frames.count() {
            let (header, range) = frames.datagram(seq);
            sink.datagram(&header, &part[range]);
        }
    }
    Served::Replied(count)
}

/// One received frame of a polled backend: an opaque handle to its buffer and its length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RxDesc {
    /// The backend's name for the buffer (UMEM address, ring slot, ...).
    pub id: u64,
    pub len: u32,
}

/// A TX buffer of a polled backend, and the length of the frame built in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxDesc {
    pub id: u64,
    pub len: u32,
}

/// Per-backend counters (summed into `stats` by the worker).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    pub rx: u64,
    pub tx: u64,
    pub dropped: u64,
}

/// A polled, frame-level backend (AF_XDP socket of one queue, an ExaNIC port). Owned by one
/// worker; every method is non-blocking.
pub trait FrameBackend {
    /// How frames are carried.
    fn mode(&self) -> Mode;
    /// Appends up to `budget` received frames to `burst`; returns how many. Frames the
    /// backend lost (a lapped reader, a truncated frame) are not returned but counted in
    /// [`FrameBackend::counters`] `dropped`.
    fn rx_burst(&mut self, burst: &mut Vec<RxDesc>, budget: usize) -> usize;
    /// The bytes of a frame [`FrameBackend::rx_burst`] returned, valid until recycled.
    fn rx_frame(&self, rx: RxDesc) -> &[u8];
    /// Gives an RX buffer back.
    fn recycle(&mut self, rx: RxDesc);
    /// A free TX buffer (`None`: the TX ring is full; the reply is dropped).
    fn tx_alloc(&mut self) -> Option<TxDesc>;
    /// The whole of TX buffer `tx` to build a frame in.
    fn tx_buf(&mut self, tx: TxDesc) -> &mut [u8];
    /// Queues built frames for transmission (their `len` set) and kicks the device; frames
    /// it could not queue are freed and counted as dropped. A frame of `len` 0 (one whose
    /// build failed) is only freed.
    fn tx_burst(&mut self, burst: &[TxDesc]);
    /// What this backend saw so far.
    fn counters(&self) -> Counters;
}

/// A [`ReplySink`] that builds each reply datagram as a whole Ethernet frame in a TX buffer
/// of a [`FrameBackend`], addressed back to `req`, and collects the descriptors in `burst`.
pub struct FrameSink<'a, B: FrameBackend + ?Sized> {
    pub backend: &'a mut B,
    pub req: udp4::Udp4Addrs,
    pub burst: &'a mut Vec<TxDesc>,
    /// TX buffers at most `burst` may hold (the backend's ring).
    pub burst_max: usize,
    /// IPv4 identification of the next reply frame (wraps).
    pub ip_id: &'a mut u16,
}

impl<B: FrameBackend + ?Sized> ReplySink for FrameSink<'_, B> {
    fn has_room(&mut self, count: usize) -> bool {
        self.burst.len() + count <= self.burst_max
    }

    fn datagram(&mut self, header: &[u8; frame::HEADER_LEN], body: &[u8]) {
        let Some(mut tx) = self.backend.tx_alloc() else {
            return;
        };
        let buf = self.backend.tx_buf(tx);
        let payload = frame::HEADER_LEN + body.len();
        tx.len = 0; // a buffer too small for the frame goes back unsent (len 0)
        if buf.len() >= udp4::HEADERS_LEN + payload {
            buf[udp4::HEADERS_LEN..udp4::HEADERS_LEN + frame::HEADER_LEN].copy_from_slice(header);
            buf[udp4::HEADERS_LEN + frame::HEADER_LEN..udp4::HEADERS_LEN + payload]
                .copy_from_slice(body);
            if let Ok(len) = udp4::write_reply_headers(buf, &self.req, payload, *self.ip_id) {
                *self.ip_id = self.ip_id.wrapping_add(1);
                tx.len = crate::sys::u32_of(len);
            }
        }
        self.burst.push(tx);
    }
}

/// What one [`poll_frames`] call did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Polled {
    /// Frames received.
    pub frames: usize,
    /// Requests answered (with at least one datagram).
    pub replied: usize,
    /// Reply datagrams queued.
    pub datagrams: usize,
    /// Frames dropped here (not ours, short, multi-datagram, not allowed, no room).
    pub dropped: usize,
}

/// Scratch a worker keeps per polled backend (reused; bounded by the budget and the TX ring).
#[derive(Debug, Default)]
pub struct PollScratch {
    pub rx: Vec<RxDesc>,
    pub tx: Vec<TxDesc>,
    pub reply: Reply,
    pub ip_id: u16,
}

/// One budgeted burst of a polled backend: receive up to `budget` frames, answer those that
/// are IPv4 UDP to `port` with [`serve_datagram`] (replies built in TX buffers by
/// [`FrameSink`]), recycle every RX buffer, transmit the burst. `tx_max` bounds the TX
/// buffers one burst may use. `answer` runs a request through the service (it may not
/// hold: frame backends serve with `Answer::Now`, see ADR 0021).
pub fn poll_frames<B: FrameBackend + ?Sized>(
    backend: &mut B,
    port: u16,
    allow: &[ipnet::IpNet],
    budget: usize,
    tx_max: usize,
    scratch: &mut PollScratch,
    mut answer: impl FnMut(frame::Frame, &[u8], &mut Reply) -> Answer,
) -> Polled {
    let mut polled = Polled::default();
    scratch.rx.clear();
    scratch.tx.clear();
    polled.frames = backend.rx_burst(&mut scratch.rx, budget);
    let mut payload = Vec::new();
    for i in 0..scratch.rx.len() {
        let rx = scratch.rx[i];
        // The payload is copied out (at most one datagram) so the TX buffers can be borrowed
        // mutably from the same backend while the request is served.
        let (req, ok) = match udp4::parse(backend.rx_frame(rx)) {
            Ok(u) if u.addrs.dst_port == port => {
                payload.clear();
                payload.extend_from_slice(u.payload);
                (Some(u.addrs), true)
            }
            _ => (None, false),
        };
        backend.recycle(rx);
        let Some(req) = req.filter(|_| ok) else {
            polled.dropped += 1;
            continue;
        };
        let mut sink = FrameSink {
            backend: &mut *backend,
            req,
            burst: &mut scratch.tx,
            burst_max: tx_max,
            ip_id: &mut scratch.ip_id,
        };
        match serve_datagram(
            &payload,
            &Peer::Frame(req),
            allow,
            &mut scratch.reply,
            &mut answer,
            &mut sink,
        ) {
            Served::Replied(n) => {
                polled.replied += 1;
                polled.datagrams += n;
            }
            Served::NoReply | Served::Held => {}
            Served::Dropped(_) => polled.dropped += 1,
        }
    }
    if !scratch.tx.is_empty() {
        backend.tx_burst(&scratch.tx);
    }
    polled
}

#[cfg(test)]
pub(crate) mod tests;
