//! The real server in-process: memcache and HTTP through the service and the store.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use ringstore_config::Config;
use ringstore_runtime::Server;

#[expect(
    clippy::expect_used,
    reason = "test helper: a failed read fails the test"
)]
fn read_until(stream: &mut TcpStream, end: &[u8]) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !got.ends_with(end) {
        let n = match stream.read(&mut buf) {
            // A socket with a read timeout reports an interruption as EINTR instead of
            // restarting: io_uring's task-work notification (TIF_NOTIFY_SIGNAL) can land on
            // this thread, which shares the process with the server's rings.
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            other => other.expect("reply"),
        };
        assert!(
            n > 0,
            "closed early after {:?}",
            String::from_utf8_lossy(&got)
        );
        got.extend_from_slice(&buf[..n]);
    }
    got
}

#[test]
fn memcache_and_http_share_one_keyspace() {
    let config = Config::from_args([
        "--memcache",
        "127.0.0.1:0",
        "--http",
        "127.0.0.1:0",
        "--memory",
        "16MiB",
        "--cores",
        "1",
    ])
    .unwrap();
    let server = Server::start(&config).unwrap();
    let line = server.ready_line();
    assert!(
        line.starts_with("ready memcache=127.0.0.1:") && line.contains(" http=127.0.0.1:"),
        "{line}"
    );
    let addrs = server.local_addrs();

    let mut mc = TcpStream::connect(addrs.memcache.unwrap()).unwrap();
    mc.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    mc.write_all(b"set k 5 0 3\r\nabc\r\n").unwrap();
    assert_eq!(read_until(&mut mc, b"\r\n"), b"STORED\r\n");
    mc.write_all(b"get k\r\n").unwrap();
    assert_eq!(
        read_until(&mut mc, b"END\r\n"),
        b"VALUE k 5 3\r\nabc\r\nEND\r\n"
    );

    let mut http = TcpStream::connect(addrs.http.unwrap()).unwrap();
    http.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    http.write_all(b"GET /k HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let reply = String::from_utf8(read_until(&mut http, b"abc")).unwrap();
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(server.shared().curr_connections() >= 2);
    server.shutdown().unwrap();
}

/// One datagram; retried on EINTR for the reason given in [`read_until`].
#[expect(
    clippy::unwrap_used,
    reason = "test helper: a failed receive fails the test"
)]
fn recv_retrying(socket: &std::net::UdpSocket, buf: &mut [u8]) -> usize {
    loop {
        match socket.recv(buf) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            other => return other.unwrap(),
        }
    }
}

#[test]
fn memcache_over_udp_frames_replies() {
    let config = Config::from_args([
        "--memcache",
        "off",
        "--http",
        "off",
        "--udp",
        "127.0.0.1:0",
        "--memory",
        "16MiB",
        "--cores",
        "1",
    ])
    .unwrap();
    let server = Server::start(&config).unwrap();
    let udp = server.local_addrs().udp.unwrap();
    assert_eq!(server.ready_line(), format!("ready udp={udp}"));
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut request = vec![0x12, 0x34, 0, 0, 0, 1, 0, 0];
    request.extend_from_slice(b"set u 0 0 2\r\nhi\r\n");
    socket.send_to(&request, udp).unwrap();
    let mut buf = [0u8; 2048];
    let n = recv_retrying(&socket, &mut buf);
    assert_eq!(&buf[..8], &[0x12, 0x34, 0, 0, 0, 1, 0, 0]);
    assert_eq!(&buf[8..n], b"STORED\r\n");
    let mut request = vec![0, 7, 0, 0, 0, 1, 0, 0];
    request.extend_from_slice(b"get u\r\n");
    socket.send_to(&request, udp).unwrap();
    let n = recv_retrying(&socket, &mut buf);
    assert_eq!(&buf[..2], &[0, 7]);
    assert_eq!(&buf[8..n], b"VALUE u 0 2\r\nhi\r\nEND\r\n");
    server.shutdown().unwrap();
}
