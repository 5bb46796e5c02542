//! The load generator against small in-process servers: every mode, replies split across
//! reads, the depth kept, errors and misses counted, and bounded waits on a server that
//! closes mid-reply or stops answering.

use super::*;
use crate::floor::{self, Shape};
use crate::mcwire::write_reply;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

fn spec(port: u16, mode: Mode, depth: usize, measure_ms: u64) -> LoadSpec {
    LoadSpec {
        port,
        mode,
        depth,
        conns: 2,
        keyspace: 16,
        warmup: Duration::from_millis(20),
        measure: Duration::from_millis(measure_ms),
        slices: 1,
        server_pid: std::process::id(),
    }
}

fn get(value_len: usize) -> Mode {
    Mode::Memcache {
        op: Op::Get,
        value_len,
    }
}

fn one(specs: &[LoadSpec]) -> LoadResult {
    let mut results = run(specs).expect("the run succeeds");
    assert_eq!(results.len(), 1);
    results.remove(0)
}

const PATIENCE: Duration = Duration::from_secs(5);

/// A counted pass of `requests` at `depth` in `mode` on a session of `conns` connections:
/// exact counts, whatever the machine's load.
fn counted(
    port: u16,
    mode: Mode,
    conns: usize,
    depth: usize,
    requests: usize,
) -> Result<LoadResult> {
    let mut session = Session::open(&LoadSpec {
        conns,
        ..spec(port, mode.clone(), depth, 0)
    })?;
    session.pass(&mode, depth, requests, PATIENCE)
}

/// What the scripted server does with the `n`-th request of a connection (0-based).
#[derive(Clone, Copy)]
enum Script {
    /// Hits, written a few bytes at a time so replies split across the client's reads.
    Trickle,
    /// Hit, miss, error, in turn.
    Mixed,
    /// Hits for 40 requests, then half a reply and close.
    CloseMidReply,
    /// Silence (the connection stays open).
    Silent,
}

/// A TCP server that answers text GETs of `value_len` bytes as `script` says; it answers
/// whatever whole requests it has once no more arrive for 1 ms, and records in `most` the
/// most requests it ever held unanswered.
fn scripted(script: Script, value_len: usize, most: Arc<AtomicUsize>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let most = most.clone();
            std::thread::spawn(move || serve_one(stream, script, value_len, &most));
        }
    });
    port
}

fn serve_one(mut s: TcpStream, script: Script, value_len: usize, most: &AtomicUsize) {
    let request_len = Shape::new(Op::Get, value_len).request_len;
    let value = vec![b'v'; value_len];
    s.set_nodelay(true).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(1))).unwrap();
    let (mut held, mut answered, mut partial) = (0usize, 0usize, 0usize);
    let mut buf = [0u8; 64 << 10];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => {
                held += (partial + n) / request_len;
                partial = (partial + n) % request_len;
                most.fetch_max(held, Ordering::Relaxed);
                continue;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => return,
        }
        let mut out = Vec::new();
        for n in answered..answered + held {
            match script {
                Script::Mixed if n % 3 == 1 => out.extend_from_slice(b"END\r\n"),
                Script::Mixed if n % 3 == 2 => out.extend_from_slice(b"ERROR\r\n"),
                Script::CloseMidReply if n >= 40 => {
                    write_reply(&mut out, Op::Get, &value, 0);
                    out.truncate(out.len() / 2);
                    let _ = s.write_all(&out);
                    return;
                }
                Script::Silent => return std::thread::sleep(Duration::from_secs(60)),
                _ => write_reply(&mut out, Op::Get, &value, 0),
            }
        }
        (answered, held) = (answered + held, 0);
        let chunk = if matches!(script, Script::Trickle) {
            7
        } else {
            out.len().max(1)
        };
        for piece in out.chunks(chunk) {
            if s.write_all(piece).is_err() {
                return;
            }
            if chunk == 7 {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    }
}

#[test]
fn replies_split_across_reads_are_parsed_whole_and_depth_is_kept() {
    let most = Arc::new(AtomicUsize::new(0));
    let port = scripted(Script::Trickle, 100, most.clone());
    let r = counted(port, get(100), 2, 4, 40).unwrap();
    assert_eq!(
        (r.requests, r.misses, r.errors),
        (80, 0, 0),
        "every trickled reply a hit"
    );
    assert_eq!(
        most.load(Ordering::Relaxed),
        4,
        "a connection never has more than depth requests out, and sends them together"
    );
}

#[test]
fn misses_and_errors_are_counted_apart() {
    let port = scripted(Script::Mixed, 10, Arc::default());
    // Each connection answers hit, miss, error in turn.
    let r = counted(port, get(10), 2, 3, 30).unwrap();
    assert_eq!((r.requests, r.misses, r.errors), (60, 20, 20));
}

#[test]
fn a_server_closing_mid_reply_fails_the_pass_at_once() {
    let port = scripted(Script::CloseMidReply, 100, Arc::default());
    let started = Instant::now();
    let error = counted(port, get(100), 1, 4, 400)
        .err()
        .expect("the pass fails");
    assert!(format!("{error:#}").contains("closed"), "{error:#}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn a_silent_server_fails_a_timed_run_within_the_drain_limit() {
    let port = scripted(Script::Silent, 100, Arc::default());
    let started = Instant::now();
    let error = run(&[spec(port, get(100), 4, 300)])
        .err()
        .expect("the run fails");
    assert!(format!("{error:#}").contains("unanswered"), "{error:#}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn a_silent_server_fails_a_counted_pass_after_its_patience() {
    let port = scripted(Script::Silent, 100, Arc::default());
    let mut session = Session::open(&LoadSpec {
        conns: 1,
        ..spec(port, get(100), 4, 0)
    })
    .unwrap();
    let started = Instant::now();
    let error = session
        .pass(&get(100), 4, 100, Duration::from_millis(300))
        .err()
        .expect("the pass fails");
    assert!(format!("{error:#}").contains("no reply"), "{error:#}");
    assert!(started.elapsed() < Duration::from_secs(3));
}

fn floor_port(op: Op, value_len: usize) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || floor::serve(listener, Shape::new(op, value_len)));
    port
}

#[test]
fn text_meta_and_binary_modes_count_every_hit() {
    for (op, value_len, depth) in [
        (Op::Get, 100, 1),
        (Op::Set, 4096, 16),
        (Op::MetaGet, 100, 16),
        (Op::BinGet, 100, 1),
        (Op::BinGetK, 4096, 16),
        (Op::Get, 524_288, 1),
    ] {
        let port = floor_port(op, value_len);
        let r = counted(port, Mode::Memcache { op, value_len }, 2, depth, 32).unwrap();
        assert_eq!(
            (r.requests, r.misses, r.errors),
            (64, 0, 0),
            "{op:?} {value_len} at depth {depth}"
        );
    }
}

#[test]
fn a_timed_run_measures_only_its_window() {
    let port = floor_port(Op::Get, 100);
    let r = one(&[spec(port, get(100), 4, 300)]);
    assert_eq!((r.misses, r.errors, r.lost), (0, 0, 0));
    assert_eq!(r.slice_throughputs.len(), 1);
    // The window runs from the first wake-up at or after its start to the first at or after
    // its end (wake-ups come at least every 50 ms).
    assert!(r.seconds > 0.25, "{} s", r.seconds);
    assert!((r.slice_throughputs[0] - r.throughput()).abs() < 1e-6);
}

#[test]
fn tls_mode_speaks_through_a_rustls_session() {
    let dir = std::env::temp_dir().join(format!("rs-bench-client-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let status = ringstore_testkit::tls::self_signed_command(&cert, &key, "localhost", 1)
        .status()
        .expect("openssl runs");
    assert!(status.success());
    let port = tls_version_server(&cert, &key);
    let config = ringstore_testkit::tls::client_config(&cert, None, true).unwrap();
    let mode = Mode::Tls {
        wire: Wire::Version,
        config: Some(config),
    };
    let r = counted(port, mode, 2, 8, 64).unwrap();
    assert_eq!((r.requests, r.errors), (128, 0));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A TLS 1.3 server answering every `version\r\n` with `VERSION 1\r\n`.
fn tls_version_server(cert: &std::path::Path, key: &std::path::Path) -> u16 {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![CertificateDer::from_pem_file(cert).unwrap()],
            PrivateKeyDer::from_pem_file(key).unwrap(),
        )
        .unwrap();
    let config = Arc::new(config);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let session = rustls::ServerConnection::new(config.clone()).unwrap();
            std::thread::spawn(move || {
                let mut tls = rustls::StreamOwned::new(session, stream);
                let mut buf = [0u8; 4096];
                let mut line = 0;
                while let Ok(n @ 1..) = tls.read(&mut buf) {
                    let mut out = Vec::new();
                    for &b in &buf[..n] {
                        line += 1;
                        if b == b'\n' {
                            assert_eq!(line, b"version\r\n".len());
                            out.extend_from_slice(b"VERSION 1\r\n");
                            line = 0;
                        }
                    }
                    if tls.write_all(&out).is_err() {
                        return;
                    }
                }
            });
        }
    });
    port
}

#[test]
fn udp_mode_counts_replies_and_gives_up_on_lost_ones() {
    let server = UdpSocket::bind("127.0.0.1:0").unwrap();
    let to = server.local_addr().unwrap();
    std::thread::spawn(move || {
        let mut buf = [0u8; 2048];
        for n in 0u64.. {
            let Ok((len, from)) = server.recv_from(&mut buf) else {
                return;
            };
            assert_eq!(&buf[8..len], codec::UDP_GET);
            if n % 100 == 99 {
                continue; // lost
            }
            let reply = [&buf[..8], b"VALUE bench 0 1\r\nv\r\nEND\r\n"].concat();
            let _ = server.send_to(&reply, from);
        }
    });
    let mode = Mode::Udp {
        from: std::net::Ipv4Addr::LOCALHOST.into(),
        to,
    };
    // 2 sockets × 400 requests; the server drops one in a hundred. Every request is either
    // answered or counted lost, once (a reply slower than the loss timeout counts lost).
    let r = counted(to.port(), mode, 2, 8, 400).unwrap();
    assert_eq!((r.requests + r.lost, r.errors), (800, 0));
    assert!(r.lost >= 8, "{} lost", r.lost);
}

/// An HTTP/1.1 server answering every GET with a 200 of `body` bytes.
fn http_server(body: usize) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut s in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut reply =
                    format!("HTTP/1.1 200 OK\r\nContent-Length: {body}\r\n\r\n").into_bytes();
                reply.resize(reply.len() + body, b'x');
                let (mut buf, mut have) = (vec![0u8; 4096], Vec::new());
                while let Ok(n @ 1..) = s.read(&mut buf) {
                    have.extend_from_slice(&buf[..n]);
                    while let Some(end) = have.windows(4).position(|w| w == b"\r\n\r\n") {
                        have.drain(..end + 4);
                        if s.write_all(&reply).is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    port
}

#[test]
fn replies_larger_than_the_receive_buffer_grow_it() {
    let port = http_server(300_000);
    let mode = Mode::Tls {
        wire: Wire::HttpGet { path: "/b".into() },
        config: None,
    };
    let r = counted(port, mode, 1, 2, 6).unwrap();
    assert_eq!((r.requests, r.errors), (6, 0));
}

#[test]
fn counted_passes_change_depth_and_keep_the_connection() {
    let mut session = Session::open(&LoadSpec {
        conns: 1,
        ..spec(floor_port(Op::Get, 100), get(100), 16, 0)
    })
    .unwrap();
    let r = session.pass(&get(100), 16, 64, PATIENCE).unwrap();
    assert_eq!((r.requests, r.misses, r.errors), (64, 0, 0));
    let r = session.pass(&get(100), 1, 5, PATIENCE).unwrap();
    assert_eq!(r.requests, 5, "the depth changes between passes");
}

#[test]
fn paced_rates_are_checked() {
    assert!(run_paced(&[], &[1.0]).is_err());
}
