//! `ringstore serve` as a user runs it: the ready line, memcache and HTTP traffic, refusals,
//! timeouts, signals and exit codes.

#![forbid(unsafe_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Serving {
    child: Child,
    memcache: SocketAddr,
    http: SocketAddr,
}

impl Drop for Serving {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve(extra: &[&str]) -> Serving {
    serve_with_fd_limit(extra, None)
}

/// Starts `ringstore serve`, optionally under a hard open-file limit (via the shell's ulimit).
#[expect(
    clippy::expect_used,
    clippy::unwrap_used,
    reason = "test helper: a failure fails the test"
)]
fn serve_with_fd_limit(extra: &[&str], nofile: Option<u32>) -> Serving {
    let mut command = match nofile {
        Some(limit) => {
            let mut c = Command::new("sh");
            c.arg("-c")
                .arg(format!("ulimit -n {limit} && exec \"$0\" \"$@\""))
                .arg(env!("CARGO_BIN_EXE_ringstore"));
            c
        }
        None => Command::new(env!("CARGO_BIN_EXE_ringstore")),
    };
    let mut child = command
        .args([
            "serve",
            "--memcache",
            "127.0.0.1:0",
            "--http",
            "127.0.0.1:0",
            "--memory",
            "16MiB",
            "--cores",
            "1",
        ])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("ready line within 10 s");
    let line = line.trim_end();
    let parts: Vec<&str> = line.split(' ').collect();
    assert_eq!(parts.len(), 3, "{line:?}");
    assert_eq!(parts[0], "ready");
    let memcache = parts[1]
        .strip_prefix("memcache=")
        .expect("memcache=")
        .parse()
        .unwrap();
    let http = parts[2]
        .strip_prefix("http=")
        .expect("http=")
        .parse()
        .unwrap();
    Serving {
        child,
        memcache,
        http,
    }
}

#[expect(clippy::unwrap_used, reason = "test helper: a failure fails the test")]
fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s
}

#[expect(clippy::expect_used, reason = "test helper: a failure fails the test")]
fn read_until(stream: &mut TcpStream, end: &[u8]) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !got.ends_with(end) {
        let n = stream.read(&mut buf).expect("reply");
        assert!(
            n > 0,
            "closed early after {:?}",
            String::from_utf8_lossy(&got)
        );
        got.extend_from_slice(&buf[..n]);
    }
    got
}

fn read_to_close(stream: &mut TcpStream) -> Vec<u8> {
    let mut all = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => return all,
            Ok(n) => all.extend_from_slice(&buf[..n]),
        }
    }
}

fn signal(child: &Child, sig: i32) {
    let _ = ringstore_sys::kill(child.id(), sig);
}

#[expect(clippy::unwrap_used, reason = "test helper: a failure fails the test")]
fn wait_exit(child: &mut Child) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status.code().unwrap_or(-1);
        }
        assert!(Instant::now() < deadline, "did not exit within 10 s");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn memcache_and_http_then_sigterm_exits_zero() {
    let mut s = serve(&[]);
    let mut mc = connect(s.memcache);
    mc.write_all(b"set greeting 7 0 5\r\nhello\r\n").unwrap();
    assert_eq!(read_until(&mut mc, b"\r\n"), b"STORED\r\n");
    mc.write_all(b"get greeting\r\n").unwrap();
    assert_eq!(
        read_until(&mut mc, b"END\r\n"),
        b"VALUE greeting 7 5\r\nhello\r\nEND\r\n"
    );

    let mut http = connect(s.http);
    http.write_all(b"PUT /object HTTP/1.1\r\nHost: t\r\nContent-Length: 6\r\n\r\nbody!\n")
        .unwrap();
    let put = String::from_utf8(read_until(&mut http, b"\r\n\r\n")).unwrap();
    assert!(put.starts_with("HTTP/1.1 2"), "{put}");
    http.write_all(b"GET /object HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    let get = String::from_utf8(read_until(&mut http, b"body!\n")).unwrap();
    assert!(get.starts_with("HTTP/1.1 200"), "{get}");
    http.write_all(b"GET /greeting HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    let shared = String::from_utf8(read_until(&mut http, b"hello")).unwrap();
    assert!(
        shared.starts_with("HTTP/1.1 200"),
        "one keyspace behind both protocols: {shared}"
    );

    signal(&s.child, libc::SIGTERM);
    assert_eq!(wait_exit(&mut s.child), 0);
    assert!(
        read_to_close(&mut mc).is_empty(),
        "idle connections are closed at stop"
    );
}

#[test]
fn sigint_exits_zero() {
    let mut s = serve(&[]);
    signal(&s.child, libc::SIGINT);
    assert_eq!(wait_exit(&mut s.child), 0);
}

#[test]
fn max_conns_refuses_cleanly() {
    let s = serve(&["--max-conns", "2"]);
    let mut a = connect(s.memcache);
    let mut b = connect(s.memcache);
    a.write_all(b"version\r\n").unwrap();
    assert!(read_until(&mut a, b"\r\n").starts_with(b"VERSION "));
    b.write_all(b"version\r\n").unwrap();
    assert!(read_until(&mut b, b"\r\n").starts_with(b"VERSION "));
    let mut refused = connect(s.memcache);
    assert_eq!(
        read_to_close(&mut refused),
        b"ERROR Too many open connections\r\n"
    );
    let mut refused = connect(s.http);
    refused
        .write_all(b"GET /x HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    let reply = String::from_utf8(read_to_close(&mut refused)).unwrap();
    assert!(
        reply.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
        "{reply}"
    );
    a.write_all(b"stats\r\n").unwrap();
    let stats = String::from_utf8(read_until(&mut a, b"END\r\n")).unwrap();
    assert!(stats.contains("STAT rejected_connections 2\r\n"), "{stats}");
    assert!(stats.contains("STAT curr_connections 2\r\n"), "{stats}");
}

#[test]
fn idle_and_slow_clients_are_closed() {
    let s = serve(&["--idle-timeout", "1", "--request-timeout", "1"]);
    let mut idle = connect(s.memcache);
    idle.write_all(b"version\r\n").unwrap();
    read_until(&mut idle, b"\r\n");
    let started = Instant::now();
    assert!(read_to_close(&mut idle).is_empty());
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "idle close took {:?}",
        started.elapsed()
    );

    let mut slow = connect(s.memcache);
    let started = Instant::now();
    let mut closed = false;
    for byte in b"set slow 0 0 100\r\n".iter().cycle().take(60) {
        if slow.write_all(&[*byte]).is_err() {
            closed = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
        slow.set_nonblocking(true).unwrap();
        let r = slow.read(&mut [0u8; 64]);
        slow.set_nonblocking(false).unwrap();
        if matches!(r, Ok(0)) || matches!(&r, Err(e) if e.kind() != std::io::ErrorKind::WouldBlock)
        {
            closed = true;
            break;
        }
    }
    assert!(closed, "a client trickling a request is closed");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "slow close took {:?}",
        started.elapsed()
    );
}

#[test]
fn bad_flag_is_one_line_and_exit_two() {
    for args in [
        &["serve", "--memory", "abc"][..],
        &["serve", "--bogus", "1"],
        &["serve", "--cores", "999"],
        &["frobnicate"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_ringstore"))
            .args(args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(out.stdout.is_empty());
    }
    let out = Command::new(env!("CARGO_BIN_EXE_ringstore"))
        .args(["serve", "--memory", "abc"])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8(out.stderr).unwrap(),
        "ringstore: invalid value \"abc\" for memory: expected a size like 64MiB or 4GiB (at least 1MiB)\n"
    );
}

/// Runs `ringstore serve ARGS` to its exit (within 20 s); returns (code, stderr, stdout).
#[expect(clippy::unwrap_used, reason = "test helper: a failure fails the test")]
fn serve_exit(args: &[&str]) -> (Option<i32>, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ringstore"))
        .arg("serve")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("{args:?} still running after 20 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn values_refused_at_start_exit_two_with_one_line() {
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let in_use = held.local_addr().unwrap().to_string();
    let dir = std::env::temp_dir().join(format!("ringstore-serve-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let big = dir.join("big.toml");
    std::fs::write(&big, vec![b'#'; (1 << 20) + 1]).unwrap();
    let big = big.to_str().unwrap();
    let cases: [(&[&str], &str); 7] = [
        (&["--memcache", &in_use, "--http", "off"], "--memcache"),
        (&["--http", &in_use, "--memcache", "off"], "--http"),
        (
            &["--udp", &in_use, "--memcache", "off", "--http", "off"],
            "--udp",
        ),
        // TEST-NET-1 (RFC 5737): never an address of this host.
        (
            &["--memcache", "192.0.2.1:0", "--http", "off"],
            "--memcache",
        ),
        (
            &[
                "--memory",
                "99999TiB",
                "--memcache",
                "127.0.0.1:0",
                "--http",
                "off",
            ],
            "--memory",
        ),
        (&["--config", "/dev/zero"], "/dev/zero"),
        (&["--config", big], "larger than 1048576 bytes"),
    ];
    // The UDP case needs the port taken for UDP too.
    let _held_udp = std::net::UdpSocket::bind(&in_use).unwrap();
    for (args, names) in cases {
        let started = Instant::now();
        let (code, stderr, stdout) = serve_exit(args);
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(
            stderr.starts_with("ringstore: ") && stderr.contains(names),
            "{args:?}: {stderr}"
        );
        assert!(stdout.is_empty(), "{args:?}: no ready line: {stdout}");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{args:?} took {:?}",
            started.elapsed()
        );
    }
    drop(held);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn version_and_help() {
    let out = Command::new(env!("CARGO_BIN_EXE_ringstore"))
        .arg("--version")
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8(out.stdout)
        .unwrap()
        .starts_with("ringstore "));
    let out = Command::new(env!("CARGO_BIN_EXE_ringstore"))
        .arg("help")
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8(out.stdout)
        .unwrap()
        .contains("--max-conns"));
}

/// CPU time (user + system, clock ticks) the process has used.
#[expect(clippy::unwrap_used, reason = "test helper: a failure fails the test")]
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = after.split(' ').collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

#[test]
fn running_out_of_descriptors_backs_off_and_recovers() {
    let s = serve_with_fd_limit(&[], Some(48));
    let mut conns: Vec<TcpStream> = (0..60)
        .map(|_| TcpStream::connect(s.memcache).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let before = cpu_ticks(s.child.id());
    std::thread::sleep(Duration::from_secs(1));
    let spent = cpu_ticks(s.child.id()) - before;
    assert!(
        spent < 30,
        "the server must not spin on EMFILE ({spent} ticks in 1 s)"
    );
    // The first connections were accepted and are served.
    conns[0]
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    conns[0].write_all(b"version\r\n").unwrap();
    assert!(read_until(&mut conns[0], b"\r\n").starts_with(b"VERSION "));
    // Once descriptors are free again, the connections waiting in the backlog are served.
    let mut last = conns.pop().unwrap();
    conns.clear();
    last.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    last.write_all(b"version\r\n").unwrap();
    assert!(read_until(&mut last, b"\r\n").starts_with(b"VERSION "));
}
