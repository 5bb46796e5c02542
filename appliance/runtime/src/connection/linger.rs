//! Lingering close: after a connection's last reply, half-close and drain before closing.
//!
//! Closing a socket whose receive queue holds unread bytes makes the kernel send a TCP
//! reset instead of a FIN, and a reset that reaches the peer before it has read the reply
//! destroys the reply in the peer's kernel (RFC 9112 §9.6). A client that is still sending
//! when it is refused — 22 KB of headers and a 431, a body and a 413 — lost its error reply
//! that way most of the time. So, like nginx's `lingering_close`, a connection the session
//! ends (`Flow::Close`: a protocol error, an HTTP close, memcache `quit`) is closed in three
//! steps: once its output is sent, `shutdown(SHUT_WR)` (the FIN follows the reply), then
//! whatever the peer still sends is read and thrown away, and the socket is closed when the
//! peer closes its side or a bound is reached, whichever comes first:
//!
//! - [`LINGER_MS`] (2 s) after the half-close: time for the peer to read the reply. nginx
//!   waits up to `lingering_time` 30 s in total and `lingering_timeout` 5 s between reads;
//!   a cache appliance keeps it shorter, since each lingering connection still counts
//!   against `--max-conns`. Checked on the worker's tick, so it ends within a tick of 2 s.
//! - [`LINGER_BYTES`] (16 MiB) discarded: larger than the bodies that typically get a 413
//!   (anything over the default 1 MiB `--item-size-max`), so a client that writes its whole
//!   body before reading still sees the status; past it the reset is the client's doing.
//!
//! Nothing is buffered while lingering (receive buffers go straight back to the pool), and
//! the session is never called again. Connections closed by the server for other reasons
//! (timeouts, output over its cap, the peer's own close or reset, a stop past its drain
//! deadline) close at once: they have no reply waiting to be read.

/// Longest a connection lingers after its half-close.
pub(crate) const LINGER_MS: u64 = 2_000;

/// Most bytes read and discarded while lingering.
pub(crate) const LINGER_BYTES: usize = 16 << 20;

/// What a lingering connection does after a receive completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Next {
    /// Read (and discard) again.
    Read,
    /// Close the socket now.
    Close,
}

/// The state of a connection that is lingering.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Linger {
    deadline_ms: u64,
    budget: usize,
}

impl Linger {
    /// Starts lingering at `now_ms` with the default bounds.
    pub(crate) fn start(now_ms: u64) -> Linger {
        Linger::with_bounds(now_ms, LINGER_MS, LINGER_BYTES)
    }

    pub(crate) fn with_bounds(now_ms: u64, time_ms: u64, bytes: usize) -> Linger {
        Linger {
            deadline_ms: now_ms.saturating_add(time_ms),
            budget: bytes,
        }
    }

    /// True once the time bound has passed.
    pub(crate) fn expired(&self, now_ms: u64) -> bool {
        now_ms >= self.deadline_ms
    }

    /// A receive completed with `res` (bytes, 0 for the peer's FIN, or `-errno`).
    pub(crate) fn on_recv(&mut self, res: i32, now_ms: u64) -> Next {
        if res > 0 {
            self.budget = self.budget.saturating_sub(res as usize);
            if self.budget == 0 || self.expired(now_ms) {
                return Next::Close;
            }
            return Next::Read;
        }
        match -res {
            libc::ENOBUFS | libc::EINTR | libc::EAGAIN if !self.expired(now_ms) => Next::Read,
            // 0: the peer closed its side, so nothing more is coming; or a reset, or the
            // receive was cancelled because the socket is being shut down.
            _ => Next::Close,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_until_the_peer_closes() {
        let mut l = Linger::start(1000);
        assert_eq!(l.on_recv(4096, 1001), Next::Read);
        assert_eq!(l.on_recv(-libc::ENOBUFS, 1002), Next::Read);
        assert_eq!(l.on_recv(-libc::EINTR, 1002), Next::Read);
        assert_eq!(l.on_recv(0, 1003), Next::Close, "FIN");
        let mut l = Linger::start(1000);
        assert_eq!(l.on_recv(-libc::ECONNRESET, 1001), Next::Close);
        assert_eq!(l.on_recv(-libc::ECANCELED, 1001), Next::Close);
    }

    #[test]
    fn the_time_bound_ends_it() {
        let mut l = Linger::start(1000);
        assert!(!l.expired(1000 + LINGER_MS - 1));
        assert!(l.expired(1000 + LINGER_MS));
        assert_eq!(l.on_recv(1, 1000 + LINGER_MS - 1), Next::Read);
        assert_eq!(l.on_recv(1, 1000 + LINGER_MS), Next::Close);
        assert_eq!(l.on_recv(-libc::EAGAIN, 1000 + LINGER_MS), Next::Close);
        assert!(Linger::start(u64::MAX - 1).expired(u64::MAX), "no overflow");
    }

    #[test]
    fn the_byte_bound_ends_it() {
        let mut l = Linger::with_bounds(0, 60_000, 10_000);
        for _ in 0..9 {
            assert_eq!(l.on_recv(1000, 1), Next::Read);
        }
        assert_eq!(l.on_recv(999, 1), Next::Read);
        assert_eq!(l.on_recv(1, 1), Next::Close);
        let mut l = Linger::start(0);
        let mut reads = 0usize;
        while l.on_recv(16 << 10, 1) == Next::Read {
            reads += 1;
        }
        assert_eq!(reads + 1, LINGER_BYTES / (16 << 10));
    }
}

/// The lingering close through a real worker and loopback sockets, with the echo handler
/// (`quit` ends the session; lines are echoed).
#[cfg(test)]
mod plane_tests {
    use std::io::{Read, Write};
    use std::net::{SocketAddr, TcpStream};
    use std::os::fd::AsRawFd;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use ringstore_service::Protocol;

    use super::LINGER_BYTES;
    use crate::clock::Clock;
    use crate::handler::echo::Echo;
    use crate::plane::{Plane, PlaneSetup};
    use crate::setup::Limits;

    fn start() -> (Plane, SocketAddr) {
        let fd =
            crate::sys::bind_socket("127.0.0.1:0".parse().unwrap(), true, false, true).unwrap();
        let addr = crate::sys::local_addr(fd.as_raw_fd()).unwrap();
        let plane = Plane::start(PlaneSetup {
            handler: Arc::new(Echo::default()),
            cpus: vec![None],
            limits: Limits {
                max_conns: 16,
                idle_timeout_ms: 0,
                request_timeout_ms: 10_000,
                out_hard_cap: 8 << 20,
                drain_deadline_ms: 5000,
                tick_ms: 20,
                tuning: ringstore_config::Tuning::default(),
            },
            clock: Clock::start(),
            tcp: vec![(
                crate::placement::listeners::Endpoint::plain(Protocol::Memcache),
                vec![fd],
            )],
            data: None,
            udp: Vec::new(),
            udp_allow: Vec::new(),
            xdp: Vec::new(),
            runtime: crate::tests::test_runtime(),
        })
        .unwrap();
        (plane, addr)
    }

    fn read_to_end(stream: &mut TcpStream) -> std::io::Result<Vec<u8>> {
        let mut got = Vec::new();
        stream.read_to_end(&mut got)?;
        Ok(got)
    }

    crate::tests::also_on_epoll!(
        a_reply_before_the_close_survives_a_client_still_writing,
        a_client_that_never_stops_is_cut_at_the_byte_bound,
    );

    #[test]
    fn a_reply_before_the_close_survives_a_client_still_writing() {
        let (mut plane, addr) = start();
        for _ in 0..10 {
            let mut c = TcpStream::connect(addr).unwrap();
            c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            c.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
            // The session ends at `quit` while 4 MiB more are on their way: every write
            // completes (the worker reads and drops them) and the reply is read, then EOF.
            c.write_all(b"hello\nquit\n").unwrap();
            for _ in 0..64 {
                c.write_all(&[b'z'; 64 << 10])
                    .expect("no reset while lingering");
            }
            assert_eq!(read_to_end(&mut c).unwrap(), b"hello\n");
        }
        plane.stop().unwrap();
    }

    #[test]
    fn a_client_that_never_stops_is_cut_at_the_byte_bound() {
        let (mut plane, addr) = start();
        let mut c = TcpStream::connect(addr).unwrap();
        c.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
        c.write_all(b"quit\n").unwrap();
        let started = Instant::now();
        let mut written = 0usize;
        let chunk = [b'z'; 64 << 10];
        let cut = loop {
            match c.write(&chunk) {
                Ok(n) => written += n,
                Err(err) => break err,
            }
            assert!(
                written < 4 * LINGER_BYTES,
                "still accepted after {written} bytes"
            );
        };
        assert!(
            matches!(
                cut.kind(),
                std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
            ),
            "{cut}"
        );
        assert!(written >= LINGER_BYTES, "cut early, at {written} bytes");
        assert!(started.elapsed() < Duration::from_secs(5));
        plane.stop().unwrap();
    }
}
