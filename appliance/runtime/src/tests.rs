//! Tests of the whole plane over real loopback sockets, with the echo handler standing in
//! for the service: batching, short sends and Drain, refusals, timeouts, stop, both
//! placements and both receive-buffer modes.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ringstore_service::Protocol;

use crate::clock::Clock;
use crate::handler::echo::Echo;
use crate::plane::{Plane, PlaneSetup, Runtime};
use crate::setup::Limits;

thread_local! {
    /// The runtime [`start`] gives the plane in this test's thread (io_uring unless a test
    /// of [`also_on_epoll`] set it).
    static RUNTIME: std::cell::Cell<Runtime> = const { std::cell::Cell::new(Runtime::IoUring) };
}

/// The runtime the plane under test runs.
pub(crate) fn test_runtime() -> Runtime {
    RUNTIME.with(std::cell::Cell::get)
}

/// Runs `test` with the readiness (epoll) runtime.
pub(crate) fn on_epoll(test: fn()) {
    RUNTIME.with(|r| r.set(Runtime::Epoll));
    test();
}

/// The listed plane tests again, on the epoll runtime (module `on_epoll`).
macro_rules! also_on_epoll {
    ($($name:ident),* $(,)?) => {
        mod on_epoll {
            $(
                #[test]
                fn $name() {
                    crate::tests::on_epoll(super::$name)
                }
            )*
        }
    };
}
pub(crate) use also_on_epoll;

also_on_epoll!(
    acceptor_placement_with_buffer_ring,
    reuseport_placement,
    many_connections_on_few_workers,
    beyond_max_conns_is_refused_cleanly,
    idle_connections_are_closed,
    trickling_clients_hit_the_request_timeout,
    client_vanishing_mid_request_is_harmless,
    stop_finishes_inflight_and_closes_idle,
    stop_deadline_bounds_a_stuck_request,
    reaper_runs_about_once_a_second,
    values_are_received_into_the_session_however_they_are_split,
    a_client_vanishing_mid_value_is_harmless,
);

struct Running {
    plane: Plane,
    echo: Arc<Echo>,
    memcache: SocketAddr,
    http: SocketAddr,
}

fn limits() -> Limits {
    Limits {
        max_conns: 100,
        idle_timeout_ms: 0,
        request_timeout_ms: 10_000,
        out_hard_cap: 8 << 20,
        drain_deadline_ms: 2000,
        tick_ms: 20,
        tuning: ringstore_config::Tuning::default(),
    }
}

fn start(limits: Limits, workers: usize, reuseport: bool) -> Running {
    let copies = if reuseport { workers } else { 1 };
    let mut tcp = Vec::new();
    let mut addrs = Vec::new();
    for protocol in [Protocol::Memcache, Protocol::Http] {
        let first =
            crate::sys::bind_socket("127.0.0.1:0".parse().unwrap(), true, reuseport, !reuseport)
                .unwrap();
        let addr = crate::sys::local_addr(first.as_raw_fd()).unwrap();
        let mut fds = vec![first];
        for _ in 1..copies {
            fds.push(crate::sys::bind_socket(addr, true, true, false).unwrap());
        }
        addrs.push(addr);
        tcp.push((crate::placement::listeners::Endpoint::plain(protocol), fds));
    }
    let echo = Arc::new(Echo::default());
    let plane = Plane::start(PlaneSetup {
        handler: echo.clone(),
        cpus: vec![None; workers],
        limits,
        clock: Clock::start(),
        tcp,
        data: None,
        udp: Vec::new(),
        udp_allow: Vec::new(),
        xdp: Vec::new(),
        runtime: test_runtime(),
    })
    .unwrap();
    Running {
        plane,
        echo,
        memcache: addrs[0],
        http: addrs[1],
    }
}

fn connect(addr: SocketAddr) -> TcpStream {
    let stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    stream
}

fn roundtrip(stream: &mut TcpStream, line: &str) -> String {
    stream.write_all(line.as_bytes()).unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut reply = String::new();
    reader.read_line(&mut reply).unwrap();
    reply
}

/// `call` until it is not interrupted: a socket with a read timeout reports an interruption as
/// EINTR rather than restarting, and io_uring's task-work notification (TIF_NOTIFY_SIGNAL)
/// can land on a test thread, which shares the process with the server's rings.
fn retry_eintr<T>(mut call: impl FnMut() -> std::io::Result<T>) -> T {
    loop {
        match call() {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            other => return other.unwrap(),
        }
    }
}

/// Reads until EOF; returns what arrived (errors such as a reset end the read too).
fn read_to_close(stream: &mut TcpStream) -> Vec<u8> {
    let mut all = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            // EINTR from io_uring's task-work notification on this thread: not the end.
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Ok(0) | Err(_) => return all,
            Ok(n) => all.extend_from_slice(&buf[..n]),
        }
    }
}

fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn exercise(running: &Running) {
    let mut a = connect(running.memcache);
    let mut b = connect(running.http);
    assert_eq!(roundtrip(&mut a, "hello\n"), "hello\n");
    assert_eq!(roundtrip(&mut b, "world\n"), "world\n");
    // Pipelined lines arriving in one segment come back in order.
    a.write_all(b"1\n2\n3\n").unwrap();
    let mut got = [0u8; 6];
    a.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"1\n2\n3\n");
    // A line split over several segments.
    a.write_all(b"spl").unwrap();
    std::thread::sleep(Duration::from_millis(30));
    assert_eq!(roundtrip(&mut a, "it\n"), "split\n");
    // A reply far above the echo's high-water mark (Drain) and a socket buffer (short sends).
    a.write_all(b"big 3000000\n").unwrap();
    let mut big = vec![0u8; 3_000_002];
    a.read_exact(&mut big).unwrap();
    assert!(big[..3_000_000].iter().all(|&c| c == b'x') && big.ends_with(b"\r\n"));
    assert_eq!(roundtrip(&mut a, "after\n"), "after\n");
    // quit: the session asks to close.
    a.write_all(b"quit\n").unwrap();
    assert!(read_to_close(&mut a).is_empty());
    wait_until("close accounting", || {
        running.echo.closed.load(Ordering::Relaxed) >= 1
    });
}

#[test]
fn acceptor_placement_with_buffer_ring() {
    let running = start(limits(), 2, false);
    exercise(&running);
}

#[test]
fn eventfd_wait_serves_like_waiting_in_io_uring_enter() {
    // Hidden key `eventfd-wait` (for valgrind): the worker blocks in poll(2) on an eventfd the
    // ring signals (1 ms at most); every request must still be answered promptly, and the
    // worker must stop when asked (a worker that slept in a plain read(2) hung the stop). The
    // tick is 5 s, so a worker woken only by its tick shows as a slow round trip.
    let running = start(
        Limits {
            tick_ms: 5000,
            tuning: ringstore_config::Tuning {
                eventfd_wait: true,
                ..Default::default()
            },
            ..limits()
        },
        1,
        false,
    );
    let mut a = connect(running.memcache);
    let started = std::time::Instant::now();
    for i in 0..50 {
        let line = format!("{i}\n");
        assert_eq!(roundtrip(&mut a, &line), line);
    }
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "50 round trips took {:?}: a wakeup was lost",
        started.elapsed()
    );
    drop(a);
    exercise(&running);
}

#[test]
fn acceptor_placement_with_own_buffers() {
    let running = start(
        Limits {
            tuning: ringstore_config::Tuning {
                buf_ring: false,
                ..Default::default()
            },
            ..limits()
        },
        1,
        false,
    );
    exercise(&running);
}

#[test]
fn reuseport_placement() {
    let running = start(limits(), 2, true);
    exercise(&running);
}

#[test]
fn many_connections_on_few_workers() {
    let running = start(limits(), 2, false);
    let mut conns: Vec<TcpStream> = (0..50).map(|_| connect(running.memcache)).collect();
    for round in 0..3 {
        for (i, c) in conns.iter_mut().enumerate() {
            c.write_all(format!("{round}-{i}\n").as_bytes()).unwrap();
        }
        for (i, c) in conns.iter_mut().enumerate() {
            let mut reader = BufReader::new(c.try_clone().unwrap());
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            assert_eq!(line, format!("{round}-{i}\n"));
        }
    }
    assert_eq!(running.echo.opened.load(Ordering::Relaxed), 50);
}

#[test]
fn more_connections_receiving_at_once_than_the_ring_has_buffers() {
    // Three times BUF_COUNT connections each send a 40 KiB line before any reply is read, so
    // one ring pass finds more sockets with data than free buffers: the rest get ENOBUFS and
    // must re-arm until buffers come back, and every line must still come back whole.
    let conns_wanted = 3 * usize::from(crate::engine::uring::BUF_COUNT);
    let running = start(
        Limits {
            max_conns: conns_wanted + 8,
            ..limits()
        },
        1,
        false,
    );
    let mut conns: Vec<TcpStream> = (0..conns_wanted)
        .map(|_| connect(running.memcache))
        .collect();
    let line = |i: usize| format!("{i:06}{}\n", "x".repeat(40 << 10));
    for (i, c) in conns.iter_mut().enumerate() {
        c.write_all(line(i).as_bytes()).unwrap();
    }
    for (i, c) in conns.iter_mut().enumerate() {
        let mut reader = BufReader::new(c.try_clone().unwrap());
        let mut got = String::new();
        reader.read_line(&mut got).unwrap();
        assert_eq!(got.len(), line(i).len(), "connection {i}");
        assert!(got.starts_with(&format!("{i:06}x")), "connection {i}");
    }
}

#[test]
fn beyond_max_conns_is_refused_cleanly() {
    let running = start(
        Limits {
            max_conns: 2,
            ..limits()
        },
        2,
        false,
    );
    let mut a = connect(running.memcache);
    let mut b = connect(running.http);
    assert_eq!(roundtrip(&mut a, "a\n"), "a\n");
    assert_eq!(roundtrip(&mut b, "b\n"), "b\n");
    let mut refused = connect(running.memcache);
    assert_eq!(
        read_to_close(&mut refused),
        crate::placement::acceptor::MEMCACHE_REFUSAL
    );
    let mut refused = connect(running.http);
    refused.write_all(b"GET /x HTTP/1.1\r\n\r\n").unwrap();
    let reply = String::from_utf8(read_to_close(&mut refused)).unwrap();
    assert!(
        reply.starts_with("HTTP/1.1 503 Service Unavailable\r\n")
            && reply.contains("Connection: close"),
        "{reply}"
    );
    assert_eq!(running.echo.refused.load(Ordering::Relaxed), 2);
    // Closing one makes room again.
    drop(a);
    wait_until("slot freed", || {
        running.echo.closed.load(Ordering::Relaxed) == 1
    });
    let mut c = connect(running.memcache);
    assert_eq!(roundtrip(&mut c, "c\n"), "c\n");
}

#[test]
fn idle_connections_are_closed() {
    let running = start(
        Limits {
            idle_timeout_ms: 200,
            ..limits()
        },
        1,
        false,
    );
    let mut idle = connect(running.memcache);
    assert_eq!(roundtrip(&mut idle, "x\n"), "x\n");
    let started = Instant::now();
    assert!(read_to_close(&mut idle).is_empty());
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(150) && waited < Duration::from_secs(3),
        "{waited:?}"
    );
}

#[test]
fn trickling_clients_hit_the_request_timeout() {
    let running = start(
        Limits {
            idle_timeout_ms: 0,
            request_timeout_ms: 300,
            ..limits()
        },
        1,
        false,
    );
    let mut slow = connect(running.memcache);
    let started = Instant::now();
    let mut closed = false;
    for _ in 0..40 {
        if slow.write_all(b"z").is_err() {
            closed = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
        let mut probe = [0u8; 1];
        slow.set_nonblocking(true).unwrap();
        let r = slow.read(&mut probe);
        slow.set_nonblocking(false).unwrap();
        if matches!(r, Ok(0)) || matches!(&r, Err(e) if e.kind() != std::io::ErrorKind::WouldBlock)
        {
            closed = true;
            break;
        }
    }
    assert!(closed, "a client trickling bytes is closed");
    assert!(started.elapsed() < Duration::from_secs(2));
}

#[test]
fn client_vanishing_mid_request_is_harmless() {
    let running = start(limits(), 1, false);
    for _ in 0..20 {
        let mut c = connect(running.memcache);
        c.write_all(b"half a line without end").unwrap();
        drop(c);
    }
    // A client that resets while a large reply is being sent.
    let mut c = connect(running.memcache);
    c.write_all(b"big 5000000\n").unwrap();
    let mut some = [0u8; 1000];
    c.read_exact(&mut some).unwrap();
    drop(c);
    wait_until("all closed", || {
        running.echo.closed.load(Ordering::Relaxed) == 21
    });
    let mut ok = connect(running.memcache);
    assert_eq!(roundtrip(&mut ok, "still fine\n"), "still fine\n");
}

#[test]
fn stop_finishes_inflight_and_closes_idle() {
    let mut running = start(limits(), 2, false);
    let mut idle = connect(running.memcache);
    assert_eq!(roundtrip(&mut idle, "i\n"), "i\n");
    let mut partial = connect(running.memcache);
    partial.write_all(b"unfinished").unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let addr = running.memcache;
    let finisher = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        partial.write_all(b" request\n").unwrap();
        read_to_close(&mut partial)
    });
    let started = Instant::now();
    running.plane.stop().unwrap();
    assert!(started.elapsed() < Duration::from_secs(3));
    assert!(
        read_to_close(&mut idle).is_empty(),
        "idle connection closed at stop"
    );
    assert_eq!(
        finisher.join().unwrap(),
        b"unfinished request\n",
        "in-flight request answered before close"
    );
    assert!(
        TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_err(),
        "no longer listening"
    );
}

#[test]
fn stop_deadline_bounds_a_stuck_request() {
    let mut running = start(
        Limits {
            drain_deadline_ms: 300,
            ..limits()
        },
        1,
        false,
    );
    let mut stuck = connect(running.memcache);
    stuck.write_all(b"never finished").unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let started = Instant::now();
    running.plane.stop().unwrap();
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(250) && took < Duration::from_secs(2),
        "{took:?}"
    );
    assert!(read_to_close(&mut stuck).is_empty());
}

#[test]
fn reaper_runs_about_once_a_second() {
    let running = start(limits(), 2, false);
    std::thread::sleep(Duration::from_millis(2300));
    let n = running.echo.reclaims.load(Ordering::Relaxed);
    assert!((1..=3).contains(&n), "{n}");
}

/// A plane whose workers serve only UDP (echo handler: the reply is the request).
fn start_udp(workers: usize) -> (Plane, SocketAddr) {
    let first =
        crate::sys::bind_socket("127.0.0.1:0".parse().unwrap(), false, true, false).unwrap();
    let addr = crate::sys::local_addr(first.as_raw_fd()).unwrap();
    let mut udp = vec![first];
    for _ in 1..workers {
        udp.push(crate::sys::bind_socket(addr, false, true, false).unwrap());
    }
    let plane = Plane::start(PlaneSetup {
        handler: Arc::new(Echo::default()),
        cpus: vec![None; workers],
        limits: limits(),
        clock: Clock::start(),
        tcp: Vec::new(),
        data: None,
        udp,
        udp_allow: Vec::new(),
        xdp: Vec::new(),
        runtime: crate::plane::Runtime::IoUring,
    })
    .unwrap();
    (plane, addr)
}

fn udp_datagram(id: u16, seq: u16, count: u16, body: &[u8]) -> Vec<u8> {
    let mut d = Vec::new();
    for f in [id, seq, count, 0] {
        d.extend_from_slice(&f.to_be_bytes());
    }
    d.extend_from_slice(body);
    d
}

#[test]
fn udp_on_the_worker_rings_answers_spreads_and_drops_garbage() {
    let (mut plane, addr) = start_udp(2);
    let client = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    client
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut buf = [0u8; 2048];
    // Garbage first: short, multi-datagram requests; none is answered.
    client.send_to(b"short", addr).unwrap();
    client.send_to(&[], addr).unwrap();
    client
        .send_to(&udp_datagram(1, 0, 2, b"part"), addr)
        .unwrap();
    client
        .send_to(&udp_datagram(1, 1, 2, b"part"), addr)
        .unwrap();
    // A request: echoed back in one datagram with its id.
    client
        .send_to(&udp_datagram(7, 0, 1, b"get k\r\n"), addr)
        .unwrap();
    let (n, from) = retry_eintr(|| client.recv_from(&mut buf));
    assert_eq!(from, addr);
    assert_eq!(&buf[..n], &udp_datagram(7, 0, 1, b"get k\r\n")[..]);
    // A 3000-byte reply: 3 datagrams, numbered, with the count, body intact in order.
    let body: Vec<u8> = (0..3000u32).map(|i| (i % 251) as u8).collect();
    client.send_to(&udp_datagram(9, 0, 1, &body), addr).unwrap();
    let mut parts = std::collections::BTreeMap::new();
    for _ in 0..3 {
        let n = retry_eintr(|| client.recv(&mut buf));
        assert!(n <= 1400);
        let seq = u16::from_be_bytes([buf[2], buf[3]]);
        assert_eq!(&buf[..2], &9u16.to_be_bytes());
        assert_eq!(&buf[4..6], &3u16.to_be_bytes());
        parts.insert(seq, buf[8..n].to_vec());
    }
    assert_eq!(parts.into_values().flatten().collect::<Vec<u8>>(), body);
    // Many clients (flows spread over both workers' sockets), each answered.
    let clients: Vec<_> = (0..16)
        .map(|_| {
            let c = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            c
        })
        .collect();
    for round in 0..20u16 {
        for (i, c) in clients.iter().enumerate() {
            let body = format!("r{round}c{i}");
            c.send_to(&udp_datagram(round, 0, 1, body.as_bytes()), addr)
                .unwrap();
            let n = retry_eintr(|| c.recv(&mut buf));
            assert_eq!(&buf[..n], &udp_datagram(round, 0, 1, body.as_bytes())[..]);
        }
    }
    plane.stop().unwrap();
}

#[test]
fn a_udp_flood_never_read_leaves_the_worker_serving() {
    let (mut plane, addr) = start_udp(1);
    // 20 000 datagrams as fast as possible from a socket that never reads its replies.
    let flood = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let big = udp_datagram(1, 0, 1, &[b'x'; 1300]);
    for _ in 0..20_000 {
        let _ = flood.send_to(&big, addr);
    }
    let client = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    client
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut buf = [0u8; 2048];
    // Datagrams may be lost to full socket buffers: retry until one is answered.
    let answered = (0..50).any(|_| {
        client
            .send_to(&udp_datagram(5, 0, 1, b"ping"), addr)
            .unwrap();
        matches!(client.recv(&mut buf), Ok(n) if buf[..n] == udp_datagram(5, 0, 1, b"ping")[..])
    });
    assert!(answered, "the worker still answers after the flood");
    plane.stop().unwrap();
}

/// `into N`: the N bytes of value (`seed`'s pattern) sent in `pieces`, then `done`; returns
/// the reply, checked against the value's sum.
fn send_into(c: &mut TcpStream, n: usize, seed: u8, pieces: &[usize]) {
    let value: Vec<u8> = (0..n)
        .map(|i| i.to_le_bytes()[0].wrapping_mul(7) ^ seed)
        .collect();
    let mut all = format!("into {n}\n").into_bytes();
    all.extend_from_slice(&value);
    all.extend_from_slice(b"done\n");
    let mut at = 0;
    for &cut in pieces.iter().chain(std::iter::once(&all.len())) {
        let cut = cut.min(all.len());
        if cut > at {
            c.write_all(&all[at..cut]).unwrap();
            std::thread::sleep(Duration::from_micros(300));
            at = cut;
        }
    }
    let sum: u64 = value.iter().map(|&b| u64::from(b)).sum();
    let want = format!("into {n} {sum}\ndone\n");
    let mut got = vec![0u8; want.len()];
    retry_eintr(|| c.read_exact(&mut got));
    assert_eq!(
        String::from_utf8_lossy(&got),
        want,
        "{n} bytes in pieces {pieces:?}"
    );
}

/// A value the session asks for is received into its own memory (`Handler::recv_target`),
/// however the client splits it against the line before it and the receive buffers: whole,
/// byte by byte, at every cut near the line, in pieces of odd sizes; with the buffer ring
/// and with connections' own buffers.
#[test]
fn values_are_received_into_the_session_however_they_are_split() {
    for buf_ring in [true, false] {
        let tuning = ringstore_config::Tuning {
            buf_ring,
            ..Default::default()
        };
        let running = start(Limits { tuning, ..limits() }, 1, false);
        let mut c = connect(running.memcache);
        c.set_nodelay(true).unwrap();
        send_into(&mut c, 100_000, 1, &[]);
        send_into(&mut c, 300, 2, &(1..330).collect::<Vec<_>>());
        for cut in 1usize..16 {
            send_into(&mut c, 5000, cut.to_le_bytes()[0], &[cut]);
            send_into(&mut c, 5000, cut.to_le_bytes()[0], &[cut, cut + 1, 5005]);
        }
        let odd: Vec<usize> = (1..40).map(|i| i * 7919).collect();
        send_into(&mut c, 300_000, 3, &odd);
        assert_eq!(roundtrip(&mut c, "after\n"), "after\n");
        assert!(
            running.echo.received_into.load(Ordering::Relaxed) > 300_000,
            "the values went through receive buffers, not into the session's memory"
        );
    }
}

/// A client gone mid-value (the receive into the value in flight or armed): the connection
/// is closed once nothing is in flight and the worker serves on.
#[test]
fn a_client_vanishing_mid_value_is_harmless() {
    let running = start(limits(), 1, false);
    for i in 0..20 {
        let mut c = connect(running.memcache);
        c.write_all(b"into 1000000\n").unwrap();
        c.write_all(&vec![b'v'; i * 3000]).unwrap();
        std::thread::sleep(Duration::from_millis(2));
        drop(c);
    }
    wait_until("all closed", || {
        running.echo.closed.load(Ordering::Relaxed) == 20
    });
    let mut ok = connect(running.memcache);
    send_into(&mut ok, 10_000, 9, &[]);
}
