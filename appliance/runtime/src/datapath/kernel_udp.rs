//! The kernel-UDP backend: a UDP socket per worker (one SO_REUSEPORT group on the memcache
//! UDP address, so the kernel spreads datagrams by flow hash) driven through the worker's
//! io_uring ring: one multishot `recvmsg` into its own provided-buffer group
//! ([`BufRing::UDP_GROUP`]), one `sendmsg` per reply datagram from a fixed pool of send
//! slots. The worker glue is `worker/udp.rs`; this file holds the state and its bounds.
//!
//! Bounds: [`RX_BUFS`] receive buffers of [`RX_BUF`] bytes (a datagram longer than
//! [`REQUEST_MAX`] arrives truncated and is dropped); [`SEND_SLOTS`] reply datagrams in
//! flight (a reply that does not fit whole in the free slots is dropped, counted); with a data
//! device, [`HELD_MAX`] requests waiting for their group commit (past it a request is dropped
//! unanswered, as memcached drops under pressure; counted as `udp_held_full`).

use std::os::fd::{AsRawFd, OwnedFd};

use io_uring::{opcode, squeue, types};
use ringstore_proto::wire::frame;

use crate::bufring::BufRing;
use crate::datapath::{DropReason, Peer, ReplySink, Served};
use crate::handler::{Handler, UdpEvent};
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

/// One reply datagram's `sendmsg` state, in a slice that is never resized: the kernel reads `msg`, `iov`, `name` and
/// `buf` until the completion, so none of them may move while it is in flight.
pub(crate) struct SendSlot {
    msg: libc::msghdr,
    iov: libc::iovec,
    name: [u8; NAME_LEN],
    buf: Box<[u8; frame::DATAGRAM_MAX]>,
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
    /// Never resized: a slot's address is stable while its send is in flight.
    pub slots: Box<[SendSlot]>,
    /// Indices of the send slots not in flight.
    pub free: Vec<u32>,
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
        let slots = (0..SEND_SLOTS)
            .map(|_| SendSlot {
                msg: zeroed_msghdr(),
                iov: libc::iovec {
                    iov_base: std::ptr::null_mut(),
                    iov_len: 0,
                },
                name: [0; NAME_LEN],
                buf: Box::new([0; frame::DATAGRAM_MAX]),
            })
            .collect();
        Ok(KernelUdp {
            fd,
            allow,
            bufs,
            recv_msg,
            recv_armed: false,
            slots,
            free: (0..u32_of(SEND_SLOTS)).rev().collect(),
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
        SEND_SLOTS - self.free.len()
    }

    /// Nothing in flight and nothing held: the worker may stop.
    pub(crate) fn is_idle(&self) -> bool {
        !self.recv_armed && self.sends_in_flight() == 0 && self.held_free.len() == HELD_MAX
    }

    /// A send completed: its slot is free again.
    pub(crate) fn send_done(&mut self, slot: u32) {
        if (slot as usize) < SEND_SLOTS && !self.free.contains(&slot) {
            self.free.push(slot);
        }
    }
}

/// A [`ReplySink`] over a worker's free send slots.
pub(crate) struct SendSink<'a> {
    slots: &'a mut [SendSlot],
    free: &'a mut Vec<u32>,
    fd: std::os::fd::RawFd,
    name: &'a [u8],
    pending: &'a mut Vec<squeue::Entry>,
    /// Datagrams queued through this sink.
    pub queued: usize,
}

impl<'a> SendSink<'a> {
    /// A sink that queues `sendmsg`s to the peer `name` (a raw sockaddr) on `fd` into `pending`.
    pub(crate) fn new(
        slots: &'a mut [SendSlot],
        free: &'a mut Vec<u32>,
        fd: &OwnedFd,
        name: &'a [u8],
        pending: &'a mut Vec<squeue::Entry>,
    ) -> SendSink<'a> {
        SendSink {
            slots,
            free,
            fd: fd.as_raw_fd(),
            name,
            pending,
            queued: 0,
        }
    }
}

impl ReplySink for SendSink<'_> {
    fn has_room(&mut self, count: usize) -> bool {
        self.free.len() >= count
    }

    fn datagram(&mut self, header: &[u8; frame::HEADER_LEN], body: &[u8]) {
        let Some(index) = self.free.pop() else {
            return;
        };
        let slot = &mut self.slots[index as usize];
        let len = frame::HEADER_LEN + body.len();
        slot.buf[..frame::HEADER_LEN].copy_from_slice(header);
        slot.buf[frame::HEADER_LEN..len].copy_from_slice(body);
        let name_len = self.name.len().min(NAME_LEN);
        slot.name[..name_len].copy_from_slice(&self.name[..name_len]);
        slot.iov.iov_base = slot.buf.as_mut_ptr().cast();
        slot.iov.iov_len = len;
        slot.msg.msg_name = slot.name.as_mut_ptr().cast();
        slot.msg.msg_namelen = u32_of(name_len);
        slot.msg.msg_iov = &mut slot.iov;
        slot.msg.msg_iovlen = 1;
        self.pending.push(
            opcode::SendMsg::new(types::Fd(self.fd), &slot.msg)
                .flags((libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) as u32)
                .build()
                .user_data(Op::UdpSend { slot: index }.encode()),
        );
        self.queued += 1;
    }
}

/// The peer a received `sockaddr` names (`None`: not IPv4/IPv6).
pub(crate) fn peer_of(name: &[u8]) -> Option<Peer> {
    crate::sys::socket_addr_of(name).map(Peer::Socket)
}

/// Counts what became of one request datagram (`udp_dropped`, `udp_held_full`); both runtimes.
pub(crate) fn count_served<H: Handler>(handler: &H, worker: usize, served: Served) {
    match served {
        Served::Dropped(DropReason::HeldFull) => handler.udp_count(worker, UdpEvent::HeldFull, 1),
        Served::Dropped(_) => handler.udp_count(worker, UdpEvent::Dropped, 1),
        Served::Replied(_) | Served::NoReply | Served::Held => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
