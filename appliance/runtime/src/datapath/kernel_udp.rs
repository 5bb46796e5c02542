//! The kernel-UDP backend: a UDP socket per worker (one SO_REUSEPORT group on the memcache
//! UDP address, so the kernel spreads datagrams by flow hash) driven through the worker's
//! io_uring ring: one multishot `recvmsg` into its own provided-buffer group
//! ([`BufRing::UDP_GROUP`]), reply datagrams from a fixed pool of send slots: consecutive
//! same-size datagrams to one peer (one burst of GETs from a client) go as the `UDP_SEGMENT`
//! (GSO) segments of one `sendmsg`, any other as a `sendmsg` of its own. The worker glue is `engine/uring/udp.rs`; this file holds the state and its bounds.
//!
//! Bounds: [`RX_BUFS`] receive buffers of [`RX_BUF`] bytes (a datagram longer than
//! [`REQUEST_MAX`] arrives truncated and is dropped); [`SEND_SLOTS`] reply datagrams in
//! flight (at most [`GSO_SEGMENTS`] in one `sendmsg`) (a reply that does not fit whole in the free slots is dropped, counted); with a data
//! device, [`HELD_MAX`] requests waiting for their group commit (past it a request is dropped
//! unanswered, as memcached drops under pressure; counted as `udp_held_full`).

use std::os::fd::{AsRawFd, OwnedFd};

use io_uring::{opcode, squeue, types};
use ringstore_proto::wire::frame;

use crate::bufring::BufRing;
use crate::datapath::{DropReason, Peer, ReplySink, Served};
use crate::handler::{Handler, Hooks, UdpEvent};
use crate::op::Op;
use crate::sys::{u32_of, zeroed_msghdr};

/// Largest request datagram served (memcached's UDP read buffer is 64 KiB too).
pub(crate) const REQUEST_MAX: usize = 64 << 10;
/// Room for a peer address in a received buffer (a `sockaddr_in6`).
pub(crate) const NAME_LEN: usize = 28;
/// `io_uring_recvmsg_out` in front of each received datagram.
const RECVMSG_OUT_LEN: usize = 16;
/// Bytes of one receive buffer: header, peer address, payload.
pub(crate) const RX_BUF: usize = RECVMSG_OUT_LEN + NAME_LEN + REQUEST_MAX;
/// Receive buffers per worker (multishot receives stop when all are in use and are re-armed
/// once the worker gave them back; datagrams wait in the socket meanwhile).
pub(crate) const RX_BUFS: u16 = 32;
/// Reply datagrams in flight per worker (one reply is at most 47).
pub(crate) const SEND_SLOTS: usize = 256;
/// Requests per worker whose reply waits for the data device.
pub(crate) const HELD_MAX: usize = 1024;
/// The pseudo connection slot that names the UDP held table in data-device records (real
/// connection slots are below `--max-conns`).
pub(crate) const HELD_SLOT: u32 = u32::MAX;

/// Reply datagrams one `sendmsg` carries at most as `UDP_SEGMENT` (GSO) segments (the
/// kernel's `UDP_MAX_SEGMENTS` is 64 before 6.11, 128 after).
pub(crate) const GSO_SEGMENTS: usize = 64;
/// Payload bytes one GSO `sendmsg` carries at most (below the 65 507 of one IPv4 UDP write).
const GSO_BYTES: usize = 60_000;
/// `UDP_SEGMENT` (linux/udp.h): the `SOL_UDP` control message carrying the segment size.
const UDP_SEGMENT: i32 = 103;
/// `CMSG_LEN(2)`: a `cmsghdr` and the `u16` segment size.
const GSO_CMSG_LEN: usize = std::mem::size_of::<libc::cmsghdr>() + 2;

/// The `UDP_SEGMENT` control message, laid out as `CMSG_SPACE(2)` bytes: `cmsg_len` (a
/// native-endian word: on musl a `u32` and its padding, the same bytes on little-endian),
/// `cmsg_level`, `cmsg_type`, then the segment size.
#[repr(C, align(8))]
struct GsoControl([u8; GSO_CMSG_LEN.next_multiple_of(8)]);

impl GsoControl {
    fn new() -> GsoControl {
        let mut bytes = [0u8; GSO_CMSG_LEN.next_multiple_of(8)];
        let word = std::mem::size_of::<usize>();
        bytes[..word].copy_from_slice(&GSO_CMSG_LEN.to_ne_bytes());
        bytes[word..word + 4].copy_from_slice(&libc::SOL_UDP.to_ne_bytes());
        bytes[word + 4..word + 8].copy_from_slice(&UDP_SEGMENT.to_ne_bytes());
        GsoControl(bytes)
    }

    fn set_segment(&mut self, size: u16) {
        let at = GSO_CMSG_LEN - 2;
        self.0[at..at + 2].copy_from_slice(&size.to_ne_bytes());
    }
}

/// One reply datagram's send slot, in a slice that is never resized: the kernel reads `msg`,
/// `iovs`, `name`, `control` and the bytes of every segment's `buf` until the completion, so
/// none of them may move while it is in flight. A slot that leads a `sendmsg` carries its
/// own datagram and those of `followers` (same peer, same size: GSO segments).
pub(crate) struct SendSlot {
    msg: libc::msghdr,
    iovs: [libc::iovec; GSO_SEGMENTS],
    name: [u8; NAME_LEN],
    name_len: usize,
    control: GsoControl,
    buf: Box<[u8; frame::DATAGRAM_MAX]>,
    /// Slots whose datagrams ride in this one's `sendmsg` (at most `GSO_SEGMENTS - 1`).
    followers: Vec<u32>,
    /// Bytes of the first segment (every segment but the last has exactly this many).
    segment_len: usize,
    /// Bytes of all segments.
    total_len: usize,
    /// A shorter segment went last: nothing more may follow.
    closed: bool,
}

impl SendSlot {
    fn new() -> SendSlot {
        let empty = libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        };
        SendSlot {
            msg: zeroed_msghdr(),
            iovs: [empty; GSO_SEGMENTS],
            name: [0; NAME_LEN],
            name_len: 0,
            control: GsoControl::new(),
            buf: Box::new([0; frame::DATAGRAM_MAX]),
            followers: Vec::with_capacity(GSO_SEGMENTS - 1),
            segment_len: 0,
            total_len: 0,
            closed: false,
        }
    }

    /// Datagrams this slot's `sendmsg` carries.
    pub(crate) fn datagrams(&self) -> usize {
        1 + self.followers.len()
    }

    /// Whether a `len`-byte datagram to `name` may ride as one more GSO segment.
    fn takes(&self, name: &[u8], len: usize) -> bool {
        !self.closed
            && len <= self.segment_len
            && self.datagrams() < GSO_SEGMENTS
            && self.total_len + len <= GSO_BYTES
            && self.name[..self.name_len] == *name
    }

    /// The `sendmsg` of this slot and its followers: one segmented write (`UDP_SEGMENT`) when
    /// it has followers, else its own datagram alone.
    fn entry(&mut self, fd: std::os::fd::RawFd, index: u32) -> squeue::Entry {
        self.msg.msg_name = self.name.as_mut_ptr().cast();
        self.msg.msg_namelen = u32_of(self.name_len);
        self.msg.msg_iov = self.iovs.as_mut_ptr();
        if !self.followers.is_empty() {
            // `as _`: glibc's msghdr lengths are size_t, musl's int and socklen_t; both
            // values are small (at most GSO_SEGMENTS iovecs, a 24-byte control message).
            self.msg.msg_iovlen = self.datagrams() as _;
            self.control
                .set_segment(u16::try_from(self.segment_len).unwrap_or(u16::MAX));
            self.msg.msg_control = self.control.0.as_mut_ptr().cast();
            self.msg.msg_controllen = self.control.0.len() as _;
        } else {
            self.msg.msg_iovlen = 1;
            self.msg.msg_control = std::ptr::null_mut();
            self.msg.msg_controllen = 0;
        }
        opcode::SendMsg::new(types::Fd(fd), &self.msg)
            .flags((libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) as u32)
            .build()
            .user_data(Op::UdpSend { slot: index }.encode())
    }
}

/// A request whose reply waits for the data device.
pub(crate) struct Held<S> {
    pub session: S,
    pub head: frame::Frame,
    pub name: [u8; NAME_LEN],
    pub name_len: u32,
    /// The request's first bytes (the binary header, for a "too large" reply).
    pub request_head: Vec<u8>,
    /// Its reply, written once the device released it (one response: no marks).
    pub out: crate::datapath::Reply,
}

/// A worker's kernel-UDP socket and everything in flight on it.
pub(crate) struct KernelUdp<S> {
    pub fd: OwnedFd,
    pub allow: Vec<ipnet::IpNet>,
    pub bufs: BufRing,
    /// The multishot receive's template: only `msg_namelen`/`msg_controllen` matter.
    pub recv_msg: Box<libc::msghdr>,
    pub recv_armed: bool,
    /// The reply datagrams' send slots.
    pub sends: Sends,
    /// The held table; `held_free` lists its free indices.
    pub held: Vec<Option<Held<S>>>,
    pub held_free: Vec<u32>,
    /// Per held index, its generation (22 bits): a settled record names index and generation.
    pub held_gen: Vec<u32>,
    /// Held indices whose replies were released and wait for send slots, oldest first
    /// (at most [`HELD_MAX`]: each is still in the table).
    pub ready: std::collections::VecDeque<u32>,
    /// Reply scratch (reused).
    pub out: crate::datapath::Reply,
}

/// A worker's reply send slots and the `sendmsg` being filled.
pub(crate) struct Sends {
    /// Never resized: a slot's address is stable while its send is in flight.
    slots: Box<[SendSlot]>,
    /// Indices of the send slots not in flight.
    pub free: Vec<u32>,
    /// The send slot whose `sendmsg` is still being filled (more segments may join it); it is
    /// queued by [`Sends::queue_open`] before the worker submits.
    open: Option<u32>,
    /// Same-size replies to one peer go out as GSO segments of one `sendmsg`; off for good
    /// after the kernel refused one (EIO/EINVAL: no checksum offload, a smaller path MTU).
    gso: bool,
    /// The socket (owned by the [`KernelUdp`] these belong to).
    fd: std::os::fd::RawFd,
}

impl<S> KernelUdp<S> {
    /// The backend over `fd` with its buffers registered with `ring`.
    pub(crate) fn new(
        ring: &io_uring::IoUring,
        fd: OwnedFd,
        allow: Vec<ipnet::IpNet>,
    ) -> std::io::Result<KernelUdp<S>> {
        let bufs = BufRing::register_group(ring, BufRing::UDP_GROUP, RX_BUFS, RX_BUF)?;
        let mut recv_msg = Box::new(zeroed_msghdr());
        recv_msg.msg_namelen = u32_of(NAME_LEN);
        let slots = (0..SEND_SLOTS).map(|_| SendSlot::new()).collect();
        Ok(KernelUdp {
            sends: Sends {
                slots,
                free: (0..u32_of(SEND_SLOTS)).rev().collect(),
                open: None,
                gso: true,
                fd: fd.as_raw_fd(),
            },
            fd,
            allow,
            bufs,
            recv_msg,
            recv_armed: false,
            held: (0..HELD_MAX).map(|_| None).collect(),
            held_free: (0..u32_of(HELD_MAX)).rev().collect(),
            held_gen: vec![0; HELD_MAX],
            ready: std::collections::VecDeque::with_capacity(HELD_MAX),
            out: crate::datapath::Reply::default(),
        })
    }

    /// The multishot receive's SQE.
    pub(crate) fn recv_entry(&mut self) -> squeue::Entry {
        self.recv_armed = true;
        opcode::RecvMsgMulti::new(
            types::Fd(self.fd.as_raw_fd()),
            &*self.recv_msg as *const libc::msghdr,
            BufRing::UDP_GROUP,
        )
        .build()
        .user_data(Op::UdpRecv.encode())
    }

    /// Send slots in flight.
    pub(crate) fn sends_in_flight(&self) -> usize {
        SEND_SLOTS - self.sends.free.len()
    }

    /// Nothing in flight and nothing held: the worker may stop.
    pub(crate) fn is_idle(&self) -> bool {
        !self.recv_armed && self.sends_in_flight() == 0 && self.held_free.len() == HELD_MAX
    }
}

impl Sends {
    /// The send led by `slot` completed with `res`: how many datagrams it carried. Its slot
    /// and its followers' are free again, unless the kernel refused GSO: then GSO is off and
    /// each of its datagrams is queued again on its own (nothing is lost; returns 0).
    pub(crate) fn send_done(
        &mut self,
        slot: u32,
        res: i32,
        pending: &mut Vec<squeue::Entry>,
    ) -> usize {
        let index = slot as usize;
        if index >= SEND_SLOTS || self.free.contains(&slot) {
            return 0;
        }
        let lead = &mut self.slots[index];
        let followers = std::mem::take(&mut lead.followers);
        let count = 1 + followers.len();
        if count > 1 && (res == -libc::EIO || res == -libc::EINVAL) {
            if self.gso {
                eprintln!(
                    "ringstore: UDP_SEGMENT refused ({}): replies go one sendmsg each",
                    std::io::Error::from_raw_os_error(-res)
                );
            }
            self.gso = false;
            let fd = self.fd;
            for one in std::iter::once(slot).chain(followers) {
                let alone = &mut self.slots[one as usize];
                alone.iovs[0] = libc::iovec {
                    iov_base: alone.buf.as_mut_ptr().cast(),
                    iov_len: alone.segment_len,
                };
                pending.push(alone.entry(fd, one));
            }
            return 0;
        }
        self.free.push(slot);
        self.free.extend_from_slice(&followers);
        // The follower list keeps its capacity (bounded by GSO_SEGMENTS).
        let mut followers = followers;
        followers.clear();
        self.slots[index].followers = followers;
        count
    }

    /// Queues the `sendmsg` still being filled, if any (before each submission).
    pub(crate) fn queue_open(&mut self, pending: &mut Vec<squeue::Entry>) {
        if let Some(index) = self.open.take() {
            let fd = self.fd;
            pending.push(self.slots[index as usize].entry(fd, index));
        }
    }
}

/// A [`ReplySink`] over a worker's free send slots: a datagram to the same peer and of the
/// same size as the one before joins its `sendmsg` as one more GSO segment; any other
/// queues the one before and opens a new one.
pub(crate) struct SendSink<'a> {
    sends: &'a mut Sends,
    name: &'a [u8],
    pending: &'a mut Vec<squeue::Entry>,
    /// Datagrams queued through this sink.
    pub queued: usize,
}

impl<'a> SendSink<'a> {
    /// A sink that queues `sendmsg`s to the peer `name` (a raw sockaddr) through `sends`
    /// into `pending`.
    pub(crate) fn new(
        sends: &'a mut Sends,
        name: &'a [u8],
        pending: &'a mut Vec<squeue::Entry>,
    ) -> SendSink<'a> {
        SendSink {
            sends,
            name: &name[..name.len().min(NAME_LEN)],
            pending,
            queued: 0,
        }
    }
}

impl ReplySink for SendSink<'_> {
    fn has_room(&mut self, count: usize) -> bool {
        self.sends.free.len() >= count
    }

    fn datagram(&mut self, header: &[u8; frame::HEADER_LEN], body: &[u8]) {
        let sends = &mut *self.sends;
        let Some(index) = sends.free.pop() else {
            return;
        };
        let len = frame::HEADER_LEN + body.len();
        let slot = &mut sends.slots[index as usize];
        slot.buf[..frame::HEADER_LEN].copy_from_slice(header);
        slot.buf[frame::HEADER_LEN..len].copy_from_slice(body);
        slot.segment_len = len;
        let iov = libc::iovec {
            iov_base: slot.buf.as_mut_ptr().cast(),
            iov_len: len,
        };
        self.queued += 1;
        if let Some(lead) = sends.open {
            let lead_slot = &mut sends.slots[lead as usize];
            if sends.gso && lead_slot.takes(self.name, len) {
                lead_slot.iovs[lead_slot.datagrams()] = iov;
                lead_slot.followers.push(index);
                lead_slot.total_len += len;
                lead_slot.closed = len < lead_slot.segment_len;
                return;
            }
            self.pending.push(lead_slot.entry(sends.fd, lead));
        }
        let slot = &mut sends.slots[index as usize];
        slot.name[..self.name.len()].copy_from_slice(self.name);
        slot.name_len = self.name.len();
        slot.iovs[0] = iov;
        slot.total_len = len;
        slot.closed = false;
        sends.open = Some(index);
    }
}

/// The peer a received `sockaddr` names (`None`: not IPv4/IPv6).
pub(crate) fn peer_of(name: &[u8]) -> Option<Peer> {
    crate::sys::socket_addr_of(name).map(Peer::Socket)
}

/// Counts what became of one request datagram (`udp_dropped`, `udp_held_full`); both runtimes.
pub(crate) fn count_served<H: Handler>(handler: &H, worker: usize, served: Served) {
    match served {
        Served::Dropped(DropReason::HeldFull) => {
            handler.hooks().udp_count(worker, UdpEvent::HeldFull, 1)
        }
        Served::Dropped(_) => handler.hooks().udp_count(worker, UdpEvent::Dropped, 1),
        Served::Replied(_) | Served::NoReply | Served::Held => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sends() -> Sends {
        Sends {
            slots: (0..SEND_SLOTS).map(|_| SendSlot::new()).collect(),
            free: (0..u32_of(SEND_SLOTS)).rev().collect(),
            open: None,
            gso: true,
            fd: -1,
        }
    }

    fn send(sends: &mut Sends, name: &[u8], body: &[u8], pending: &mut Vec<squeue::Entry>) {
        let mut sink = SendSink::new(sends, name, pending);
        assert!(sink.has_room(1));
        sink.datagram(&[0; frame::HEADER_LEN], body);
    }

    #[test]
    fn gso_control_message_is_cmsg_space_of_a_u16() {
        assert_eq!(GSO_CMSG_LEN, std::mem::size_of::<libc::cmsghdr>() + 2);
        let control = GsoControl::new();
        assert_eq!(control.0.len() % std::mem::align_of::<libc::cmsghdr>(), 0);
        assert_eq!(
            std::mem::align_of::<GsoControl>() % std::mem::align_of::<usize>(),
            0
        );
    }

    #[test]
    fn same_size_replies_to_one_peer_share_a_sendmsg() {
        let mut s = sends();
        let mut pending = Vec::new();
        let (a, b) = ([1u8; 16], [2u8; 16]);
        for _ in 0..3 {
            send(&mut s, &a, b"VALUE", &mut pending);
        }
        assert!(pending.is_empty(), "still open for more segments");
        send(&mut s, &a, b"VAL", &mut pending); // shorter: the last segment
        send(&mut s, &a, b"VAL", &mut pending); // after a shorter one: a new sendmsg
        assert_eq!(pending.len(), 1);
        send(&mut s, &b, b"VAL", &mut pending); // another peer: a new sendmsg
        assert_eq!(pending.len(), 2);
        s.queue_open(&mut pending);
        assert_eq!(pending.len(), 3);
        assert_eq!(s.free.len(), SEND_SLOTS - 6);
        let lead = 0; // the first slot handed out
        assert_eq!(s.slots[lead as usize].datagrams(), 4);
        assert_eq!(s.slots[lead as usize].msg.msg_iovlen, 4);
        assert_eq!(s.slots[lead as usize].msg.msg_controllen, 24);
        assert_eq!(s.send_done(lead, 5 * 13 + 11, &mut pending), 4);
        assert_eq!(s.free.len(), SEND_SLOTS - 2);
        assert_eq!(s.send_done(lead, 0, &mut pending), 0, "a stale completion");
    }

    #[test]
    fn segments_stop_at_the_kernels_limit() {
        let mut s = sends();
        let mut pending = Vec::new();
        for _ in 0..GSO_SEGMENTS + 1 {
            send(&mut s, &[1u8; 16], b"x", &mut pending);
        }
        assert_eq!(pending.len(), 1);
        assert_eq!(s.slots[0].datagrams(), GSO_SEGMENTS);
    }

    #[test]
    fn a_refused_gso_send_goes_again_one_datagram_each() {
        let mut s = sends();
        let mut pending = Vec::new();
        for _ in 0..3 {
            send(&mut s, &[1u8; 16], b"VALUE", &mut pending);
        }
        s.queue_open(&mut pending);
        pending.clear();
        let lead = 0;
        assert_eq!(s.send_done(lead, -libc::EIO, &mut pending), 0);
        assert!(!s.gso);
        assert_eq!(pending.len(), 3, "each datagram on its own");
        assert_eq!(s.slots[lead as usize].msg.msg_iovlen, 1);
        assert_eq!(s.free.len(), SEND_SLOTS - 3, "still in flight");
        for slot in 0..3 {
            assert_eq!(s.send_done(slot, 13, &mut pending), 1);
        }
        assert_eq!(s.free.len(), SEND_SLOTS);
        // With GSO off, same-size replies no longer share a sendmsg.
        pending.clear();
        send(&mut s, &[1u8; 16], b"VALUE", &mut pending);
        send(&mut s, &[1u8; 16], b"VALUE", &mut pending);
        assert_eq!(pending.len(), 1);
    }

    #[test]
    fn peer_addresses_parse_from_raw_sockaddrs() {
        let mut v4 = [0u8; 16];
        v4[..2].copy_from_slice(&u16::try_from(libc::AF_INET).unwrap().to_ne_bytes());
        v4[2..4].copy_from_slice(&11211u16.to_be_bytes());
        v4[4..8].copy_from_slice(&[127, 0, 0, 1]);
        assert_eq!(
            peer_of(&v4),
            Some(Peer::Socket("127.0.0.1:11211".parse().unwrap()))
        );
        let mut v6 = [0u8; 28];
        v6[..2].copy_from_slice(&u16::try_from(libc::AF_INET6).unwrap().to_ne_bytes());
        v6[2..4].copy_from_slice(&5u16.to_be_bytes());
        v6[23] = 1;
        assert_eq!(peer_of(&v6), Some(Peer::Socket("[::1]:5".parse().unwrap())));
        assert_eq!(peer_of(&v6[..10]), None, "truncated");
        assert_eq!(peer_of(&[0u8; 16]), None, "AF_UNSPEC");
        assert_eq!(peer_of(&[]), None);
    }
}
