//! Sockets (bind, listen, accept, options, send/recv), poll, eventfd and interface addresses.
//! Through rustix, except getifaddrs (libc: rustix has no wrapper) and SO_BINDTODEVICE
//! (rustix has no setter for it).
//!
//! The functions that take a `RawFd` keep the runtime's signatures (its io_uring code holds
//! descriptors as raw numbers); the caller keeps the descriptor open across the call, and the
//! borrow made from it here ends with the call.

use std::io;
use std::net::{IpAddr, SocketAddr, SocketAddrV4, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};

use rustix::event::{EventfdFlags, PollFd, PollFlags};
use rustix::io::Errno;
use rustix::net::{sockopt, AddressFamily, RecvFlags, SendFlags, SocketFlags, SocketType};

/// Runs `f` with `fd` borrowed for the duration of the call.
pub(crate) fn with_fd<R>(fd: RawFd, f: impl FnOnce(BorrowedFd<'_>) -> R) -> R {
    // The borrow cannot escape `f`; a stale number only makes the syscall fail (EBADF).
    // SAFETY: every caller passes a descriptor its owner keeps open for this call (module doc).
    let fd = unsafe { BorrowedFd::borrow_raw(fd) };
    f(fd)
}

/// An all-zero `msghdr` (null pointers, zero lengths) for the caller to fill in: musl's
/// `msghdr` has private padding fields, so it has no struct literal. The runtime's io_uring
/// `recvmsg`/`sendmsg` entries point at these.
pub fn zeroed_msghdr() -> libc::msghdr {
    // SAFETY: msghdr is a plain C struct of integers and raw pointers (no references, no
    // niches): all-zero is a valid value of it.
    unsafe { std::mem::zeroed() }
}

/// The IPv4/IPv6 address a raw `sockaddr` as the kernel wrote it names (`None`: another
/// family, or too short): the sender of a received datagram.
pub fn socket_addr_of(name: &[u8]) -> Option<SocketAddr> {
    let family = i32::from(u16::from_ne_bytes([*name.first()?, *name.get(1)?]));
    let port = u16::from_be_bytes([*name.get(2)?, *name.get(3)?]);
    let ip: IpAddr = if family == libc::AF_INET {
        let b: [u8; 4] = name.get(4..8)?.try_into().ok()?;
        b.into()
    } else if family == libc::AF_INET6 {
        let b: [u8; 16] = name.get(8..24)?.try_into().ok()?;
        b.into()
    } else {
        return None;
    };
    Some(SocketAddr::new(ip, port))
}

/// A close-on-exec eventfd. Blocking: io_uring reads on it wait (poll-armed) instead of
/// failing with EAGAIN, and writes block only if the counter would overflow 2^64-2.
pub fn eventfd() -> io::Result<OwnedFd> {
    Ok(rustix::event::eventfd(0, EventfdFlags::CLOEXEC)?)
}

/// Adds 1 to an eventfd (wakes whoever has a read armed on it).
pub fn eventfd_signal(fd: RawFd) {
    // An error (counter overflow) still leaves the eventfd readable.
    let _ = with_fd(fd, |fd| rustix::io::write(fd, &1u64.to_ne_bytes()));
}

/// Waits at most `timeout_ms` ms for `fd` to be readable, with one pollfd on the stack (no
/// allocation: a worker's `eventfd-wait` calls this per idle wait). False on a timeout, an
/// interruption or an error: the caller looks at its work again either way.
pub fn poll_one_readable(fd: BorrowedFd<'_>, timeout_ms: u16) -> bool {
    let timeout = rustix::time::Timespec {
        tv_sec: i64::from(timeout_ms / 1000),
        tv_nsec: i64::from(timeout_ms % 1000) * 1_000_000,
    };
    let mut pfd = [PollFd::from_borrowed_fd(fd, PollFlags::IN)];
    matches!(rustix::event::poll(&mut pfd, Some(&timeout)), Ok(n) if n > 0)
        && pfd[0].revents().contains(PollFlags::IN)
}

/// Reads (and so resets) the counter of eventfd `fd`; an interrupted read is `Ok(0)`.
pub fn eventfd_read(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let mut word = [0u8; 8];
    match rustix::io::read(fd, &mut word) {
        Ok(_) => Ok(u64::from_ne_bytes(word)),
        Err(Errno::INTR) => Ok(0),
        Err(err) => Err(err.into()),
    }
}

/// The listen backlog of every TCP listener (memcached's `-b` default; `stats settings`
/// reports it as `tcp_backlog`).
pub const LISTEN_BACKLOG: i32 = 1024;

/// A bound socket: TCP listening or UDP. `reuseport` adds SO_REUSEPORT; `nonblocking` is for
/// sockets used with plain syscalls (the acceptor's poll loop, UDP); sockets used only
/// through io_uring stay blocking so the kernel arms a poll instead of returning EAGAIN.
pub fn bind_socket(
    addr: SocketAddr,
    tcp: bool,
    reuseport: bool,
    nonblocking: bool,
) -> io::Result<OwnedFd> {
    let family = if addr.is_ipv4() {
        AddressFamily::INET
    } else {
        AddressFamily::INET6
    };
    let kind = if tcp {
        SocketType::STREAM
    } else {
        SocketType::DGRAM
    };
    let flags = if nonblocking {
        SocketFlags::CLOEXEC | SocketFlags::NONBLOCK
    } else {
        SocketFlags::CLOEXEC
    };
    let fd = rustix::net::socket_with(family, kind, flags, None)?;
    sockopt::set_socket_reuseaddr(&fd, true)?;
    if reuseport {
        sockopt::set_socket_reuseport(&fd, true)?;
    }
    rustix::net::bind(&fd, &addr)?;
    if tcp {
        rustix::net::listen(&fd, LISTEN_BACKLOG)?;
    }
    Ok(fd)
}

/// The address a socket is bound to.
pub fn local_addr(fd: RawFd) -> io::Result<SocketAddr> {
    let addr = with_fd(fd, |fd| rustix::net::getsockname(fd))?;
    match SocketAddr::try_from(addr) {
        // Address and port only, as the ready line shows them.
        Ok(SocketAddr::V6(v6)) => Ok(SocketAddr::from((*v6.ip(), v6.port()))),
        Ok(v4) => Ok(v4),
        Err(_) => Err(io::Error::other("unknown address family")),
    }
}

/// The address of a connected socket's peer (`None` when it has none or is gone), as
/// [`local_addr`] gives addresses.
pub fn peer_addr(fd: RawFd) -> Option<SocketAddr> {
    let addr = with_fd(fd, |fd| rustix::net::getpeername(fd)).ok()??;
    match SocketAddr::try_from(addr).ok()? {
        SocketAddr::V6(v6) => Some(SocketAddr::from((*v6.ip(), v6.port()))),
        v4 => Some(v4),
    }
}

/// `accept4(CLOEXEC)` on a nonblocking listener; `Ok(None)` when nothing is pending. The
/// accepted socket is blocking: workers use it only through io_uring (see [`bind_socket`]).
pub fn accept(listener: RawFd) -> io::Result<Option<OwnedFd>> {
    loop {
        match with_fd(listener, |fd| {
            rustix::net::accept_with(fd, SocketFlags::CLOEXEC)
        }) {
            Ok(fd) => return Ok(Some(fd)),
            Err(Errno::AGAIN) => return Ok(None),
            Err(Errno::INTR | Errno::CONNABORTED | Errno::PROTO) => continue,
            Err(err) => return Err(err.into()),
        }
    }
}

/// Sets TCP_NODELAY (replies are whole; Nagle would only add latency).
pub fn set_nodelay(fd: RawFd) {
    let _ = with_fd(fd, |fd| sockopt::set_tcp_nodelay(fd, true));
}

/// Sets SO_SNDBUF (the kernel doubles it and stops autotuning it): what a socket may hold
/// that its peer has not taken is bounded.
pub fn set_send_buffer(fd: impl std::os::fd::AsFd, bytes: usize) -> io::Result<()> {
    Ok(sockopt::set_socket_send_buffer_size(fd, bytes)?)
}

/// Best-effort nonblocking send without SIGPIPE; returns bytes sent.
pub fn send_nosignal(fd: RawFd, bytes: &[u8]) -> io::Result<usize> {
    let flags = SendFlags::NOSIGNAL | SendFlags::DONTWAIT;
    Ok(with_fd(fd, |fd| rustix::net::send(fd, bytes, flags))?)
}

/// Nonblocking recv whose bytes are thrown away; `Ok(0)` = the peer closed.
pub fn recv_discard(fd: RawFd, scratch: &mut [u8]) -> io::Result<usize> {
    let (n, _) = with_fd(fd, |fd| rustix::net::recv(fd, scratch, RecvFlags::DONTWAIT))?;
    Ok(n)
}

/// Nonblocking recvfrom: (length, peer address), or `None` when nothing is pending (or the
/// call fails). A datagram without an IP peer address is dropped.
pub fn recv_from(fd: RawFd, buf: &mut [u8]) -> Option<(usize, SocketAddr)> {
    loop {
        let (n, _, peer) = with_fd(fd, |fd| {
            rustix::net::recvfrom(fd, &mut *buf, RecvFlags::DONTWAIT)
        })
        .ok()?;
        if let Some(peer) = peer.and_then(|p| SocketAddr::try_from(p).ok()) {
            return Some((n, peer));
        }
    }
}

/// The IP address of a datagram's peer (IPv4-mapped IPv6 addresses are given as IPv4, so one
/// allow-list entry covers both socket families).
pub fn peer_ip(peer: &SocketAddr) -> Option<IpAddr> {
    Some(match peer.ip() {
        IpAddr::V6(ip) => ip.to_ipv4_mapped().map_or(IpAddr::V6(ip), IpAddr::V4),
        ip => ip,
    })
}

/// Best-effort nonblocking sendto.
pub fn send_to(fd: RawFd, bytes: &[u8], peer: &SocketAddr) {
    let flags = SendFlags::DONTWAIT | SendFlags::NOSIGNAL;
    let _ = with_fd(fd, |fd| rustix::net::sendto(fd, bytes, flags, peer));
}

/// `shutdown(fd, how)` with `how` one of `libc::SHUT_RD`, `SHUT_WR`, `SHUT_RDWR`: completes
/// any pending recv with 0 so the owner can close. Errors (a stale fd) are ignored.
pub fn shutdown(fd: RawFd, how: libc::c_int) {
    let how = match how {
        libc::SHUT_RD => rustix::net::Shutdown::Read,
        libc::SHUT_WR => rustix::net::Shutdown::Write,
        _ => rustix::net::Shutdown::Both,
    };
    let _ = with_fd(fd, |fd| rustix::net::shutdown(fd, how));
}

/// `poll` on one or more fds for input; returns which are readable. Timeout in ms (-1 = forever).
pub fn poll_readable(fds: &[RawFd], timeout_ms: i32) -> Vec<bool> {
    let timeout = (timeout_ms >= 0).then(|| rustix::time::Timespec {
        tv_sec: i64::from(timeout_ms / 1000),
        tv_nsec: i64::from(timeout_ms % 1000) * 1_000_000,
    });
    let borrowed: Vec<BorrowedFd<'_>> = fds
        .iter()
        // SAFETY: the caller keeps each fd open for this call; the borrows end with it.
        .map(|&fd| unsafe { BorrowedFd::borrow_raw(fd) })
        .collect();
    let mut pfds: Vec<PollFd<'_>> = borrowed
        .iter()
        .map(|fd| PollFd::from_borrowed_fd(fd.as_fd(), PollFlags::IN))
        .collect();
    match rustix::event::poll(&mut pfds, timeout.as_ref()) {
        Ok(n) if n > 0 => pfds.iter().map(|p| !p.revents().is_empty()).collect(),
        _ => vec![false; fds.len()],
    }
}

/// A UDP socket on `0.0.0.0:port` bound to `interface` (SO_BINDTODEVICE) with SO_BROADCAST:
/// what a DHCP client needs before the interface has an address.
pub fn bind_udp_to_device(interface: &str, port: u16) -> io::Result<UdpSocket> {
    let fd = rustix::net::socket_with(
        AddressFamily::INET,
        SocketType::DGRAM,
        SocketFlags::CLOEXEC,
        None,
    )?;
    sockopt::set_socket_reuseaddr(&fd, true)?;
    sockopt::set_socket_broadcast(&fd, true)?;
    // Raw: rustix has no SO_BINDTODEVICE setter.
    // SAFETY: `interface` is readable for `interface.len()` bytes for the duration of the call.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_BINDTODEVICE,
            interface.as_ptr().cast(),
            crate::num::u32_of(interface.len()),
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    rustix::net::bind(
        &fd,
        &SocketAddrV4::new(std::net::Ipv4Addr::UNSPECIFIED, port),
    )?;
    Ok(UdpSocket::from(fd))
}

/// (interface name, IP) pairs from getifaddrs, IPv4 and IPv6; empty on failure. Raw: rustix
/// has no getifaddrs (it is a libc function over netlink).
pub fn interface_addresses() -> Vec<(String, IpAddr)> {
    let mut out = Vec::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: `head` is a valid out-pointer; freed with freeifaddrs below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return out;
    }
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, valid until freeifaddrs.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: ifa_name is a NUL-terminated string owned by the list.
        let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: ifa_addr is non-null and points at a sockaddr of at least sa_family.
        let family = libc::c_int::from(unsafe { (*ifa.ifa_addr).sa_family });
        let ip = match family {
            libc::AF_INET => {
                // SAFETY: family AF_INET means the sockaddr is a sockaddr_in.
                let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                IpAddr::from(u32::from_be(sin.sin_addr.s_addr).to_be_bytes())
            }
            libc::AF_INET6 => {
                // SAFETY: family AF_INET6 means the sockaddr is a sockaddr_in6.
                let sin6 = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
                IpAddr::from(sin6.sin6_addr.s6_addr)
            }
            _ => continue,
        };
        out.push((name, ip));
    }
    // SAFETY: `head` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bind_port_zero_and_read_it_back() {
        let fd = bind_socket("127.0.0.1:0".parse().unwrap(), true, false, true).unwrap();
        let addr = local_addr(fd.as_raw_fd()).unwrap();
        assert_eq!(addr.ip(), IpAddr::from([127, 0, 0, 1]));
        assert_ne!(addr.port(), 0);
        assert!(accept(fd.as_raw_fd()).unwrap().is_none(), "nothing pending");
        let _client = std::net::TcpStream::connect(addr).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(accept(fd.as_raw_fd()).unwrap().is_some());
    }

    #[test]
    fn reuseport_shares_a_port() {
        let a = bind_socket("127.0.0.1:0".parse().unwrap(), true, true, false).unwrap();
        let port = local_addr(a.as_raw_fd()).unwrap().port();
        let b = bind_socket(SocketAddr::from(([127, 0, 0, 1], port)), true, true, false);
        assert!(b.is_ok());
        assert!(bind_socket(SocketAddr::from(([127, 0, 0, 1], port)), true, false, false).is_err());
    }

    #[test]
    fn udp_round_trip_and_peer() {
        let server = bind_socket("127.0.0.1:0".parse().unwrap(), false, false, true).unwrap();
        let addr = local_addr(server.as_raw_fd()).unwrap();
        let client = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let mut buf = [0u8; 16];
        assert!(
            recv_from(server.as_raw_fd(), &mut buf).is_none(),
            "nothing pending"
        );
        client.send_to(b"ping", addr).unwrap();
        assert_eq!(poll_readable(&[server.as_raw_fd()], 1000), vec![true]);
        let (n, peer) = recv_from(server.as_raw_fd(), &mut buf).unwrap();
        assert_eq!(
            (&buf[..n], peer),
            (&b"ping"[..], client.local_addr().unwrap())
        );
        send_to(server.as_raw_fd(), b"pong", &peer);
        let mut reply = [0u8; 16];
        assert_eq!(client.recv(&mut reply).unwrap(), 4);
        let mapped: SocketAddr = "[::ffff:10.0.0.1]:5".parse().unwrap();
        assert_eq!(peer_ip(&mapped), Some(IpAddr::from([10, 0, 0, 1])));
        let v6: SocketAddr = "[::1]:5".parse().unwrap();
        assert_eq!(peer_ip(&v6), Some(v6.ip()));
    }

    #[test]
    fn eventfd_wakes_poll() {
        let fd = eventfd().unwrap();
        assert_eq!(poll_readable(&[fd.as_raw_fd()], 0), vec![false]);
        eventfd_signal(fd.as_raw_fd());
        assert_eq!(poll_readable(&[fd.as_raw_fd()], 0), vec![true]);
    }

    #[test]
    fn loopback_has_an_address() {
        assert!(interface_addresses()
            .iter()
            .any(|(name, ip)| name == "lo" && ip.is_loopback()));
    }
}
