//! Thin safe wrappers over the Linux calls the runtime needs (affinity, mempolicy, eventfd,
//! sockets, signals). Every `unsafe` block of the runtime's syscalls lives here.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

fn cvt(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// Pins the calling thread to `cpus`.
pub fn set_affinity(cpus: &[usize]) -> io::Result<()> {
    // SAFETY: cpu_set_t is plain data; all-zero is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &cpu in cpus {
        if cpu >= libc::CPU_SETSIZE as usize {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("CPU {cpu} beyond CPU_SETSIZE"),
            ));
        }
        // SAFETY: cpu < CPU_SETSIZE was checked, so the bit is inside `set`.
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    // SAFETY: `set` is a valid cpu_set_t of the size passed; pid 0 = the calling thread.
    cvt(unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) })
        .map(drop)
}

/// CPUs the calling thread may run on (empty if unknown).
pub fn affinity() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain data; all-zero is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: `set` is a valid, writable cpu_set_t of the size passed.
    let ret = unsafe { libc::sched_getaffinity(0, size, &mut set) };
    if ret != 0 {
        return Vec::new();
    }
    (0..libc::CPU_SETSIZE as usize)
        .filter(|&cpu| {
            // SAFETY: every index is < CPU_SETSIZE, inside `set`.
            unsafe { libc::CPU_ISSET(cpu, &set) }
        })
        .collect()
}

/// `set_mempolicy(MPOL_BIND, {node})` for the calling thread.
pub fn set_mempolicy_bind(node: u32) -> io::Result<()> {
    const MPOL_BIND: libc::c_long = 2;
    const WORDS: usize = 16; // 1024 nodes
    if node as usize >= WORDS * 64 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "node number too large",
        ));
    }
    let mut mask = [0u64; WORDS];
    mask[node as usize / 64] |= 1 << (node % 64);
    // SAFETY: `mask` holds WORDS*64 bits and outlives the call; maxnode is its bit count + 1, as the kernel expects.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_set_mempolicy,
            MPOL_BIND,
            mask.as_ptr(),
            (WORDS * 64 + 1) as libc::c_ulong,
        )
    };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// (interface name, IP) pairs from getifaddrs; empty on failure.
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
        let family = unsafe { (*ifa.ifa_addr).sa_family } as libc::c_int;
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

/// A close-on-exec eventfd. Blocking: io_uring reads on it wait (poll-armed) instead of
/// failing with EAGAIN, and writes block only if the counter would overflow 2^64-2.
pub fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: plain syscall; the returned fd is owned by the OwnedFd.
    let fd = cvt(unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) })?;
    // SAFETY: `fd` is a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Adds 1 to an eventfd (wakes whoever has a read armed on it).
pub fn eventfd_signal(fd: RawFd) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a valid u64; an error (counter overflow) still leaves it readable.
    unsafe { libc::write(fd, (&one as *const u64).cast(), 8) };
}

fn sockaddr(addr: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain data; zero is valid.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(v4) => {
            // SAFETY: sockaddr_storage is large and aligned enough for sockaddr_in.
            let sin = unsafe { &mut *(&mut storage as *mut _ as *mut libc::sockaddr_in) };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_port = v4.port().to_be();
            sin.sin_addr.s_addr = u32::from_ne_bytes(v4.ip().octets());
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(v6) => {
            // SAFETY: sockaddr_storage is large and aligned enough for sockaddr_in6.
            let sin6 = unsafe { &mut *(&mut storage as *mut _ as *mut libc::sockaddr_in6) };
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_port = v6.port().to_be();
            sin6.sin6_addr.s6_addr = v6.ip().octets();
            sin6.sin6_flowinfo = v6.flowinfo();
            sin6.sin6_scope_id = v6.scope_id();
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (storage, len as libc::socklen_t)
}

fn set_int_opt(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    // SAFETY: passes a pointer to a live c_int and its size.
    cvt(unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    })
    .map(drop)
}

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
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    let kind = if tcp {
        libc::SOCK_STREAM
    } else {
        libc::SOCK_DGRAM
    };
    let flags = if nonblocking {
        libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK
    } else {
        libc::SOCK_CLOEXEC
    };
    // SAFETY: plain syscall; the fd is owned right away.
    let fd = cvt(unsafe { libc::socket(family, kind | flags, 0) })?;
    // SAFETY: fresh descriptor owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    set_int_opt(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_REUSEADDR, 1)?;
    if reuseport {
        set_int_opt(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_REUSEPORT, 1)?;
    }
    let (storage, len) = sockaddr(&addr);
    // SAFETY: `storage` holds a valid sockaddr of `len` bytes.
    cvt(unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&storage as *const libc::sockaddr_storage).cast(),
            len,
        )
    })?;
    if tcp {
        // SAFETY: plain syscall on an owned socket.
        cvt(unsafe { libc::listen(fd.as_raw_fd(), 1024) })?;
    }
    Ok(fd)
}

/// The address a socket is bound to.
pub fn local_addr(fd: RawFd) -> io::Result<SocketAddr> {
    // SAFETY: sockaddr_storage is plain data; zero is valid.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: storage/len describe a writable buffer of the given size.
    cvt(unsafe {
        libc::getsockname(
            fd,
            (&mut storage as *mut libc::sockaddr_storage).cast(),
            &mut len,
        )
    })?;
    match storage.ss_family as libc::c_int {
        libc::AF_INET => {
            // SAFETY: family AF_INET: the storage holds a sockaddr_in.
            let sin = unsafe { &*(&storage as *const _ as *const libc::sockaddr_in) };
            Ok(SocketAddr::from((
                u32::from_be(sin.sin_addr.s_addr).to_be_bytes(),
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: family AF_INET6: the storage holds a sockaddr_in6.
            let sin6 = unsafe { &*(&storage as *const _ as *const libc::sockaddr_in6) };
            Ok(SocketAddr::from((
                sin6.sin6_addr.s6_addr,
                u16::from_be(sin6.sin6_port),
            )))
        }
        _ => Err(io::Error::other("unknown address family")),
    }
}

/// `accept4(CLOEXEC)` on a nonblocking listener; `Ok(None)` when nothing is pending. The
/// accepted socket is blocking: workers use it only through io_uring (see [`bind_socket`]).
pub fn accept(listener: RawFd) -> io::Result<Option<OwnedFd>> {
    // SAFETY: null address pointers are allowed by accept4.
    let fd = unsafe {
        libc::accept4(
            listener,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            libc::SOCK_CLOEXEC,
        )
    };
    if fd >= 0 {
        // SAFETY: a fresh descriptor owned by nobody else.
        return Ok(Some(unsafe { OwnedFd::from_raw_fd(fd) }));
    }
    let err = io::Error::last_os_error();
    match err.raw_os_error() {
        Some(libc::EAGAIN) => Ok(None),
        Some(libc::EINTR) | Some(libc::ECONNABORTED) | Some(libc::EPROTO) => accept(listener),
        _ => Err(err),
    }
}

/// Sets TCP_NODELAY (replies are whole; Nagle would only add latency).
pub fn set_nodelay(fd: RawFd) {
    let _ = set_int_opt(fd, libc::IPPROTO_TCP, libc::TCP_NODELAY, 1);
}

/// Best-effort nonblocking send without SIGPIPE; returns bytes sent.
pub fn send_nosignal(fd: RawFd, bytes: &[u8]) -> io::Result<usize> {
    // SAFETY: `bytes` is a valid slice for the duration of the call.
    let n = unsafe {
        libc::send(
            fd,
            bytes.as_ptr().cast(),
            bytes.len(),
            libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
        )
    };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// Nonblocking recv whose bytes are thrown away; `Ok(0)` = the peer closed.
pub fn recv_discard(fd: RawFd, scratch: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `scratch` is a valid writable slice for the duration of the call.
    let n = unsafe {
        libc::recv(
            fd,
            scratch.as_mut_ptr().cast(),
            scratch.len(),
            libc::MSG_DONTWAIT,
        )
    };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// Nonblocking recvfrom: (length, peer address) or `None` when nothing is pending.
pub fn recv_from(fd: RawFd, buf: &mut [u8]) -> Option<(usize, libc::sockaddr_storage)> {
    // SAFETY: sockaddr_storage is plain data; zero is valid.
    let mut peer: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: `buf` and `peer`/`len` are valid writable buffers of the sizes passed.
    let n = unsafe {
        libc::recvfrom(
            fd,
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_DONTWAIT,
            (&mut peer as *mut libc::sockaddr_storage).cast(),
            &mut len,
        )
    };
    if n < 0 {
        None
    } else {
        Some((n as usize, peer))
    }
}

/// The IP address in a `sockaddr_storage` that `recvfrom` filled in (IPv4-mapped IPv6
/// addresses are given as IPv4, so one allow-list entry covers both socket families).
pub fn peer_ip(peer: &libc::sockaddr_storage) -> Option<std::net::IpAddr> {
    match peer.ss_family as libc::c_int {
        libc::AF_INET => {
            let ptr = (peer as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>();
            // sockaddr_storage is larger than and aligned for every sockaddr type.
            // SAFETY: ss_family says the storage holds a sockaddr_in (see above).
            let v4 = unsafe { &*ptr };
            Some(std::net::Ipv4Addr::from(u32::from_be(v4.sin_addr.s_addr)).into())
        }
        libc::AF_INET6 => {
            let ptr = (peer as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>();
            // SAFETY: as above, for sockaddr_in6.
            let v6 = unsafe { &*ptr };
            let ip = std::net::Ipv6Addr::from(v6.sin6_addr.s6_addr);
            Some(ip.to_ipv4_mapped().map_or(ip.into(), Into::into))
        }
        _ => None,
    }
}

/// Best-effort nonblocking sendto.
pub fn send_to(fd: RawFd, bytes: &[u8], peer: &libc::sockaddr_storage) {
    let len = if peer.ss_family as libc::c_int == libc::AF_INET6 {
        std::mem::size_of::<libc::sockaddr_in6>()
    } else {
        std::mem::size_of::<libc::sockaddr_in>()
    };
    // SAFETY: `bytes` is valid for its length; `peer` holds an address recvfrom filled in.
    unsafe {
        libc::sendto(
            fd,
            bytes.as_ptr().cast(),
            bytes.len(),
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            (peer as *const libc::sockaddr_storage).cast(),
            len as libc::socklen_t,
        )
    };
}

/// `shutdown(fd, how)`: completes any pending recv with 0 so the owner can close.
pub fn shutdown(fd: RawFd, how: libc::c_int) {
    // SAFETY: plain syscall; a stale fd only yields EBADF, which is ignored.
    unsafe { libc::shutdown(fd, how) };
}

/// `poll` on one or more fds for input; returns which are readable. Timeout in ms (-1 = forever).
pub fn poll_readable(fds: &[RawFd], timeout_ms: i32) -> Vec<bool> {
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    // SAFETY: `pfds` is a valid array of pollfd of the given length.
    let n = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, timeout_ms) };
    if n <= 0 {
        return vec![false; fds.len()];
    }
    pfds.iter().map(|p| p.revents != 0).collect()
}

/// Ignores SIGPIPE process-wide (sends also pass MSG_NOSIGNAL; this covers any other write).
pub fn ignore_sigpipe() {
    // SAFETY: installing SIG_IGN for SIGPIPE has no memory-safety preconditions.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
}

/// Allocations at least this large get their own mapping, returned to the kernel on free.
pub const MALLOC_MMAP_THRESHOLD: usize = 64 << 10;

/// Makes memory freed by finished requests go back to the kernel (ADR 0012).
///
/// glibc (the host build) otherwise raises its mmap threshold dynamically up to 32 MiB after
/// the first large free and keeps freed buffers in per-thread arenas: after 1000 stalled
/// 1 MiB uploads were cut, RSS stayed at ~700 MiB. With a fixed threshold every buffer of a
/// value-sized request is its own mapping and the arenas hold only small blocks. musl (the
/// appliance) already maps and unmaps large blocks on its own and has no `mallopt`.
pub fn return_freed_memory_promptly() {
    #[cfg(target_env = "gnu")]
    {
        // SAFETY: mallopt only changes allocator tunables; called before the workers start.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD as libc::c_int);
            libc::mallopt(
                libc::M_TRIM_THRESHOLD,
                (2 * MALLOC_MMAP_THRESHOLD) as libc::c_int,
            );
        }
    }
}

/// A signal set of SIGTERM and SIGINT.
pub fn termination_set() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data, initialised by sigemptyset before use.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid sigset_t.
    unsafe {
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
    }
    set
}

/// Blocks `set` in the calling thread, returning the previous mask.
pub fn block_signals(set: &libc::sigset_t) -> libc::sigset_t {
    // SAFETY: sigset_t is plain data.
    let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: both pointers are valid sigset_t.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, set, &mut old) };
    old
}

/// Restores a mask saved by [`block_signals`].
pub fn set_signal_mask(mask: &libc::sigset_t) {
    // SAFETY: `mask` is a valid sigset_t; a null old-mask pointer is allowed.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, mask, std::ptr::null_mut()) };
}

/// A signalfd for `set` (close-on-exec).
pub fn signalfd(set: &libc::sigset_t) -> io::Result<OwnedFd> {
    // SAFETY: -1 asks for a new fd; `set` is a valid sigset_t.
    let fd = cvt(unsafe { libc::signalfd(-1, set, libc::SFD_CLOEXEC) })?;
    // SAFETY: a fresh descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Reads one siginfo from a blocking signalfd; returns the signal number.
pub fn read_signal(fd: RawFd) -> io::Result<i32> {
    // SAFETY: signalfd_siginfo is plain data.
    let mut info: libc::signalfd_siginfo = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: reads at most size_of(info) bytes into `info`.
        let n = unsafe {
            libc::read(
                fd,
                (&mut info as *mut libc::signalfd_siginfo).cast(),
                std::mem::size_of::<libc::signalfd_siginfo>(),
            )
        };
        if n == std::mem::size_of::<libc::signalfd_siginfo>() as isize {
            return Ok(info.ssi_signo as i32);
        }
        let err = io::Error::last_os_error();
        if n < 0 && err.raw_os_error() == Some(libc::EINTR) {
            continue;
        }
        return Err(err);
    }
}

/// Raises the soft RLIMIT_NOFILE to the hard limit (more connections before EMFILE).
pub fn raise_nofile_limit() -> u64 {
    // SAFETY: rlimit is plain data.
    let mut lim: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: valid out-pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return 0;
    }
    if lim.rlim_cur < lim.rlim_max {
        lim.rlim_cur = lim.rlim_max;
        // SAFETY: valid pointer to an rlimit not above the hard limit.
        unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) };
    }
    lim.rlim_cur as u64
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
    fn affinity_round_trip() {
        let cpus = affinity();
        assert!(!cpus.is_empty());
        set_affinity(&cpus).unwrap();
        assert!(set_affinity(&[libc::CPU_SETSIZE as usize]).is_err());
    }

    #[test]
    fn loopback_has_an_address() {
        assert!(interface_addresses()
            .iter()
            .any(|(name, ip)| name == "lo" && ip.is_loopback()));
    }
}
