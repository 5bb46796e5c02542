//! The readiness runtime's syscalls (ADR 0033): an epoll instance, nonblocking sockets, and
//! the vectored send that carries values straight from the item, `sendmmsg`/`recvmmsg` for
//! UDP. Through rustix, except `recvmmsg` (raw syscall: rustix has none).

use std::io;
use std::io::IoSlice;
use std::os::fd::{AsFd, OwnedFd, RawFd};

use rustix::event::epoll;
use rustix::io::Errno;
use rustix::net::{RecvFlags, SendAncillaryBuffer, SendFlags};

use crate::net::{with_fd, zeroed_msghdr};

/// What a descriptor was ready for, as one epoll event reported it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Readiness {
    /// The key the descriptor was registered with.
    pub key: u64,
    pub readable: bool,
    pub writable: bool,
    /// The peer hung up or the socket has an error: the next read or write says which.
    pub hangup: bool,
}

/// An epoll instance (close-on-exec) and its event buffer.
pub struct Epoll {
    fd: OwnedFd,
    events: Vec<epoll::Event>,
}

/// How a descriptor is watched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Watch {
    /// Edge-triggered input and output (a connection: registered once, never modified).
    EdgeReadWrite,
    /// Level-triggered input (listeners, eventfds: read until empty each time).
    LevelRead,
}

impl Epoll {
    /// A new instance whose [`Epoll::wait`] reports at most `batch` events per call.
    pub fn new(batch: usize) -> io::Result<Epoll> {
        Ok(Epoll {
            fd: epoll::create(epoll::CreateFlags::CLOEXEC)?,
            events: Vec::with_capacity(batch.max(1)),
        })
    }

    /// Watches `fd` under `key`. The caller keeps `fd` open until it is removed or closed
    /// (closing removes it).
    pub fn add(&self, fd: RawFd, key: u64, watch: Watch) -> io::Result<()> {
        let flags = match watch {
            Watch::EdgeReadWrite => {
                epoll::EventFlags::IN
                    | epoll::EventFlags::OUT
                    | epoll::EventFlags::RDHUP
                    | epoll::EventFlags::ET
            }
            Watch::LevelRead => epoll::EventFlags::IN,
        };
        with_fd(fd, |fd| {
            epoll::add(&self.fd, fd, epoll::EventData::new_u64(key), flags)
        })?;
        Ok(())
    }

    /// Stops watching `fd` (before it is handed elsewhere; a close does this by itself).
    pub fn remove(&self, fd: RawFd) {
        let _ = with_fd(fd, |fd| epoll::delete(&self.fd, fd));
    }

    /// Waits at most `timeout_ms` (0 = just look) and appends what became ready to `ready`.
    /// An interrupted wait reports nothing.
    pub fn wait(&mut self, timeout_ms: u64, ready: &mut Vec<Readiness>) -> io::Result<()> {
        let timeout = rustix::time::Timespec {
            tv_sec: i64::try_from(timeout_ms / 1000).unwrap_or(i64::MAX),
            tv_nsec: i64::try_from(timeout_ms % 1000).unwrap_or(0) * 1_000_000,
        };
        self.events.clear();
        match epoll::wait(
            self.fd.as_fd(),
            rustix::buffer::spare_capacity(&mut self.events),
            Some(&timeout),
        ) {
            Ok(_) => {}
            Err(Errno::INTR) => return Ok(()),
            Err(err) => return Err(err.into()),
        }
        ready.extend(self.events.iter().map(|event| {
            let flags = event.flags;
            Readiness {
                key: event.data.u64(),
                readable: flags.intersects(epoll::EventFlags::IN | epoll::EventFlags::RDHUP),
                writable: flags.contains(epoll::EventFlags::OUT),
                hangup: flags.intersects(epoll::EventFlags::HUP | epoll::EventFlags::ERR),
            }
        }));
        Ok(())
    }
}

/// Makes `fd` nonblocking (a readiness loop must never block in a read or write).
pub fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    with_fd(fd, |fd| {
        let flags = rustix::fs::fcntl_getfl(fd)?;
        rustix::fs::fcntl_setfl(fd, flags | rustix::fs::OFlags::NONBLOCK)
    })?;
    Ok(())
}

/// What a nonblocking read or write did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transfer {
    /// This many bytes (0 from a read: the peer closed).
    Done(usize),
    /// Nothing now: wait for readiness.
    WouldBlock,
    /// The socket failed (reset, broken pipe): close it.
    Failed,
}

fn transfer(result: Result<usize, Errno>) -> Transfer {
    match result {
        Ok(n) => Transfer::Done(n),
        Err(Errno::AGAIN | Errno::INTR) => Transfer::WouldBlock,
        Err(_) => Transfer::Failed,
    }
}

/// One nonblocking `recv` into `buf`.
pub fn recv_nowait(fd: RawFd, buf: &mut [u8]) -> Transfer {
    transfer(with_fd(fd, |fd| {
        rustix::net::recv(fd, buf, RecvFlags::DONTWAIT).map(|(n, _)| n)
    }))
}

/// One nonblocking `send` without SIGPIPE.
pub fn send_nowait(fd: RawFd, bytes: &[u8]) -> Transfer {
    let flags = SendFlags::NOSIGNAL | SendFlags::DONTWAIT;
    transfer(with_fd(fd, |fd| rustix::net::send(fd, bytes, flags)))
}

/// One nonblocking `sendmsg` without SIGPIPE over raw iovecs: a connection's output with
/// values sent from the item, whose pieces are addresses into pinned arena memory rather than
/// Rust borrows (ADR 0027). No Rust reference is made from them: the kernel reads the
/// addresses itself and fails the call with EFAULT where one is not readable, as it does for
/// the io_uring worker's SENDMSG over the same iovecs. What the bytes are is the caller's
/// care: the kernel copies them before the call returns, so they only need to stay put for
/// the call (a pinned value does).
pub fn sendmsg_iovecs_nowait(fd: RawFd, iov: &[libc::iovec]) -> Transfer {
    let mut msg = zeroed_msghdr();
    msg.msg_iov = iov.as_ptr().cast_mut();
    msg.msg_iovlen = iov.len() as _;
    // SAFETY: `msg` is a valid msghdr with no name and no control data whose iovec array is
    // `iov`, alive and unchanged for the call; the kernel only reads through it (a send) and
    // checks every address it reads, so a stale piece cannot corrupt this process's memory.
    // The caller keeps `fd` open across the call (module doc of net); a stale one fails EBADF.
    let rc = unsafe { libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) };
    transfer(
        usize::try_from(rc)
            .map_err(|_| Errno::from_io_error(&io::Error::last_os_error()).unwrap_or(Errno::IO)),
    )
}

/// One nonblocking `recv` into the `len` bytes at `at`: a storage value received straight
/// into its reserved item (issue 38), an address into pinned arena memory rather than a Rust
/// borrow. The kernel writes the range itself and fails the call with EFAULT where it is not
/// writable, as it does for the io_uring worker's receive into the same range.
///
/// # Safety
/// The kernel writes up to `len` bytes at `at`: the range must stay mapped for the call and
/// nothing may read or write it, or hold a Rust reference into it, until the call returns (a
/// reservation's value: its segment is pinned, and only the receive writes it until the
/// session is called again).
pub unsafe fn recv_into_nowait(fd: RawFd, at: *mut u8, len: usize) -> Transfer {
    // SAFETY: the range is the caller's to hand out (the contract above); the kernel checks
    // every address it writes. The caller keeps `fd` open across the call (module doc of
    // net); a stale one fails EBADF.
    let rc = unsafe { libc::recv(fd, at.cast(), len, libc::MSG_DONTWAIT) };
    transfer(
        usize::try_from(rc)
            .map_err(|_| Errno::from_io_error(&io::Error::last_os_error()).unwrap_or(Errno::IO)),
    )
}

/// Datagrams one [`recvmmsg_nowait`] receives at most.
pub const RECVMMSG_MAX: usize = 64;

/// Room for a sender's address: a `sockaddr_in6` (a `sockaddr_in` is shorter).
const NAME_LEN: usize = std::mem::size_of::<libc::sockaddr_in6>();

/// One datagram a [`recvmmsg_nowait`] got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Received {
    /// Bytes of it in its slot.
    pub len: usize,
    /// It was longer than its slot (`MSG_TRUNC` in its `msg_flags`): the rest is lost.
    pub truncated: bool,
    /// Its source (`None`: not IPv4/IPv6).
    pub from: Option<std::net::SocketAddr>,
}

/// Receive buffers for [`recvmmsg_nowait`], allocated once by their owner: one buffer cut
/// into fixed slots (one datagram each), a sender address per slot, and what the last call
/// got.
pub struct RecvBatch {
    buf: Box<[u8]>,
    slot_len: usize,
    names: Box<[[u8; NAME_LEN]]>,
    got: Vec<Received>,
}

impl RecvBatch {
    /// `slots` slots (at most [`RECVMMSG_MAX`], at least 1) of `slot_len` bytes (at least 1).
    pub fn new(slots: usize, slot_len: usize) -> RecvBatch {
        let slots = slots.clamp(1, RECVMMSG_MAX);
        let slot_len = slot_len.max(1);
        RecvBatch {
            buf: vec![0u8; slots * slot_len].into_boxed_slice(),
            slot_len,
            names: vec![[0u8; NAME_LEN]; slots].into_boxed_slice(),
            got: Vec::with_capacity(slots),
        }
    }

    /// The datagrams the last [`recvmmsg_nowait`] got, in arrival order, with their bytes.
    pub fn datagrams(&self) -> impl Iterator<Item = (Received, &[u8])> + '_ {
        self.got
            .iter()
            .zip(self.buf.chunks_exact(self.slot_len))
            .map(|(got, slot)| (*got, &slot[..got.len]))
    }
}

/// One nonblocking `recvmmsg` into `batch`'s slots: `Done(n)`, n ≥ 1 datagrams (read them
/// with [`RecvBatch::datagrams`]); `WouldBlock` when none is waiting. A datagram longer than
/// a slot comes truncated and marked so.
pub fn recvmmsg_nowait(fd: RawFd, batch: &mut RecvBatch) -> Transfer {
    batch.got.clear();
    let slots = batch.names.len();
    let empty = libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    };
    let mut iovs = [empty; RECVMMSG_MAX];
    let mut msgs: [libc::mmsghdr; RECVMMSG_MAX] = std::array::from_fn(|_| libc::mmsghdr {
        msg_hdr: crate::net::zeroed_msghdr(),
        msg_len: 0,
    });
    let slot_bufs = batch.buf.chunks_exact_mut(batch.slot_len);
    let places = iovs.iter_mut().zip(msgs.iter_mut());
    for ((iov, msg), (slot, name)) in places.zip(slot_bufs.zip(batch.names.iter_mut())) {
        iov.iov_base = slot.as_mut_ptr().cast();
        iov.iov_len = slot.len();
        msg.msg_hdr.msg_name = name.as_mut_ptr().cast();
        msg.msg_hdr.msg_namelen = crate::u32_of(NAME_LEN);
        msg.msg_hdr.msg_iov = std::ptr::from_mut(iov);
        msg.msg_hdr.msg_iovlen = 1;
    }
    // Through syscall(2): glibc and musl declare recvmmsg's flags with different types.
    // SAFETY: the first `slots` entries of `msgs` each point at one live iovec of `iovs`
    // covering one slot of `batch.buf` (exactly its length) and at one `NAME_LEN`-byte
    // name of `batch.names`; all of them outlive the call and nothing else touches them
    // during it. `slots` ≤ RECVMMSG_MAX = msgs.len(). A null timeout is allowed. The
    // caller keeps `fd` open across the call (module doc of net); a stale one fails EBADF.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_recvmmsg,
            fd,
            msgs.as_mut_ptr(),
            crate::u32_of(slots),
            libc::MSG_DONTWAIT,
            std::ptr::null_mut::<libc::timespec>(),
        )
    };
    let Ok(count) = usize::try_from(rc) else {
        return match io::Error::last_os_error().raw_os_error() {
            Some(libc::EAGAIN | libc::EINTR) => Transfer::WouldBlock,
            _ => Transfer::Failed,
        };
    };
    for (msg, name) in msgs.iter().zip(batch.names.iter()).take(count.min(slots)) {
        let full = usize::try_from(msg.msg_len).unwrap_or(usize::MAX);
        let name_len = usize::try_from(msg.msg_hdr.msg_namelen).unwrap_or(0);
        batch.got.push(Received {
            len: full.min(batch.slot_len),
            truncated: msg.msg_hdr.msg_flags & libc::MSG_TRUNC != 0,
            from: crate::net::socket_addr_of(&name[..name_len.min(NAME_LEN)]),
        });
    }
    match batch.got.len() {
        0 => Transfer::WouldBlock,
        n => Transfer::Done(n),
    }
}

/// Datagrams one [`sendmmsg_nowait`] sends at most.
pub const SENDMMSG_MAX: usize = 64;

/// Sends the first [`SENDMMSG_MAX`] of `datagrams` (destination, bytes) with one nonblocking
/// `sendmmsg`; `Done(n)`: the first `n` went.
pub fn sendmmsg_nowait(fd: RawFd, datagrams: &[(std::net::SocketAddr, &[u8])]) -> Transfer {
    let batch = &datagrams[..datagrams.len().min(SENDMMSG_MAX)];
    let addrs: Vec<rustix::net::SocketAddrAny> = batch
        .iter()
        .map(|(to, _)| rustix::net::SocketAddrAny::from(*to))
        .collect();
    let iovs: Vec<[IoSlice<'_>; 1]> = batch.iter().map(|(_, b)| [IoSlice::new(b)]).collect();
    let mut controls: Vec<SendAncillaryBuffer<'_, '_, '_>> = batch
        .iter()
        .map(|_| SendAncillaryBuffer::default())
        .collect();
    let mut msgs: Vec<rustix::net::MMsgHdr<'_>> = addrs
        .iter()
        .zip(&iovs)
        .zip(controls.iter_mut())
        .map(|((addr, iov), control)| rustix::net::MMsgHdr::new_with_addr(addr, iov, control))
        .collect();
    if msgs.is_empty() {
        return Transfer::Done(0);
    }
    let flags = SendFlags::NOSIGNAL | SendFlags::DONTWAIT;
    transfer(with_fd(fd, |fd| {
        rustix::net::sendmmsg(fd, &mut msgs, flags)
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsRawFd;

    #[test]
    fn an_edge_is_reported_once_and_a_level_until_drained() {
        let (mut a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        set_nonblocking(b.as_raw_fd()).unwrap();
        let mut ep = Epoll::new(8).unwrap();
        ep.add(b.as_raw_fd(), 7, Watch::EdgeReadWrite).unwrap();
        let mut ready = Vec::new();
        ep.wait(100, &mut ready).unwrap();
        assert_eq!(ready.len(), 1, "writable at first");
        assert!(ready[0].writable && !ready[0].readable && ready[0].key == 7);
        ready.clear();
        ep.wait(0, &mut ready).unwrap();
        assert!(ready.is_empty(), "an edge is not reported again");
        a.write_all(b"hello").unwrap();
        ep.wait(100, &mut ready).unwrap();
        assert!(ready.iter().any(|r| r.readable));
        let mut buf = [0u8; 16];
        assert_eq!(recv_nowait(b.as_raw_fd(), &mut buf), Transfer::Done(5));
        assert_eq!(recv_nowait(b.as_raw_fd(), &mut buf), Transfer::WouldBlock);
        let (ab, cd) = (b"ab", b"cd");
        let iov = [ab.as_slice(), cd.as_slice()].map(|piece| libc::iovec {
            iov_base: piece.as_ptr().cast_mut().cast(),
            iov_len: piece.len(),
        });
        assert_eq!(
            sendmsg_iovecs_nowait(b.as_raw_fd(), &iov),
            Transfer::Done(4)
        );
        let unreadable = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 4,
        }];
        assert_eq!(
            sendmsg_iovecs_nowait(b.as_raw_fd(), &unreadable),
            Transfer::Failed,
            "an address the kernel cannot read fails (EFAULT), it is not read by this process"
        );
        let ev = crate::eventfd().unwrap();
        ep.add(ev.as_raw_fd(), 9, Watch::LevelRead).unwrap();
        crate::eventfd_signal(ev.as_raw_fd());
        for _ in 0..2 {
            ready.clear();
            ep.wait(100, &mut ready).unwrap();
            assert!(ready.iter().any(|r| r.key == 9), "level: again until read");
        }
        let mut got = [0u8; 4];
        std::io::Read::read_exact(&mut a, &mut got).unwrap();
        assert_eq!(&got, b"abcd");
        drop(a);
        ready.clear();
        ep.wait(100, &mut ready).unwrap();
        assert!(
            ready.iter().any(|r| r.key == 7 && r.readable),
            "peer closed: {ready:?}"
        );
        assert_eq!(recv_nowait(b.as_raw_fd(), &mut buf), Transfer::Done(0));
    }

    #[test]
    fn datagrams_go_out_in_one_sendmmsg_and_come_in_with_their_source() {
        let a = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = b.local_addr().unwrap();
        let long = [7u8; 100];
        let sent = sendmmsg_nowait(
            a.as_raw_fd(),
            &[
                (to, b"one".as_slice()),
                (to, b"two".as_slice()),
                (to, &long),
            ],
        );
        assert_eq!(sent, Transfer::Done(3));
        let from = Some(a.local_addr().unwrap());
        let mut batch = RecvBatch::new(4, 16);
        assert_eq!(
            recvmmsg_nowait(b.as_raw_fd(), &mut batch),
            Transfer::Done(3)
        );
        let got: Vec<(Received, Vec<u8>)> = batch
            .datagrams()
            .map(|(got, bytes)| (got, bytes.to_vec()))
            .collect();
        let whole = |len| Received {
            len,
            truncated: false,
            from,
        };
        assert_eq!(got[0], (whole(3), b"one".to_vec()));
        assert_eq!(got[1], (whole(3), b"two".to_vec()));
        let cut = Received {
            len: 16,
            truncated: true,
            from,
        };
        assert_eq!(
            got[2],
            (cut, vec![7u8; 16]),
            "longer than its slot: truncated"
        );
        assert_eq!(
            recvmmsg_nowait(b.as_raw_fd(), &mut batch),
            Transfer::WouldBlock,
            "nothing to read, on a blocking socket too (MSG_DONTWAIT)"
        );
        assert_eq!(batch.datagrams().count(), 0);
    }

    #[test]
    fn a_burst_larger_than_the_slots_comes_in_over_several_calls() {
        let a = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = b.local_addr().unwrap();
        let bytes: Vec<[u8; 1]> = (0..5u8).map(|i| [i]).collect();
        let datagrams: Vec<_> = bytes.iter().map(|b| (to, b.as_slice())).collect();
        assert_eq!(
            sendmmsg_nowait(a.as_raw_fd(), &datagrams),
            Transfer::Done(5)
        );
        let mut batch = RecvBatch::new(2, 8);
        let mut seen = Vec::new();
        while let Transfer::Done(n) = recvmmsg_nowait(b.as_raw_fd(), &mut batch) {
            assert!(n <= 2, "at most one datagram per slot");
            for (got, bytes) in batch.datagrams() {
                assert_eq!(got.from, Some(a.local_addr().unwrap()));
                assert!(!got.truncated);
                seen.extend_from_slice(bytes);
            }
        }
        assert_eq!(seen, [0, 1, 2, 3, 4]);
    }
}
