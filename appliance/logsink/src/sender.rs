//! The sender thread: the one connection to the receiver, its reconnects and backoff, and
//! the "N lines dropped" report in front of the next line that gets through.

use std::io::Write;
use std::net::{TcpStream, ToSocketAddrs, UdpSocket};
use std::sync::atomic::Ordering;
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::Duration;

use rustls::{ClientConfig, ClientConnection, StreamOwned};
use rustls_pki_types::ServerName;

use crate::{Facility, LogSink, LogTransport, Record, Severity, Shipper};

/// First wait after a failed connect or send; doubled per failure up to [`BACKOFF_MAX_MS`].
pub const BACKOFF_MIN_MS: u64 = 100;
/// Longest wait between two tries.
pub const BACKOFF_MAX_MS: u64 = 5_000;
/// Connect, handshake and write limit: a receiver that takes no more for this long is
/// dropped (and retried after the backoff) while new lines are dropped at the queue.
pub const IO_TIMEOUT_MS: u64 = 2_000;
/// The socket's send buffer (SO_SNDBUF; the kernel doubles it): bounds what a receiver that
/// does not read holds of ours in the kernel, which would otherwise autotune to megabytes.
pub const SEND_BUFFER_BYTES: usize = 32 << 10;

enum Conn {
    Udp(UdpSocket),
    Tcp(TcpStream),
    Tls(Box<StreamOwned<ClientConnection, TcpStream>>),
}

impl Conn {
    fn send(&mut self, line: &str) -> std::io::Result<()> {
        match self {
            Conn::Udp(socket) => socket.send(line.as_bytes()).map(|_| ()),
            Conn::Tcp(stream) => stream.write_all(&crate::octet_frame(line)),
            Conn::Tls(stream) => {
                stream.write_all(&crate::octet_frame(line))?;
                stream.flush()
            }
        }
    }
}

pub(crate) fn spawn(
    sink: LogSink,
    tls: Option<Arc<ClientConfig>>,
    lines: Receiver<String>,
    shipper: Shipper,
) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("log-sink".into())
        .spawn(move || run(&sink, tls.as_ref(), &lines, &shipper))
        .map(|_| ())
}

/// Sends lines in queue order until every handle is gone. A line that could not be sent is
/// kept and tried again after the backoff, so the queue keeps the oldest lines (the boot's)
/// and what arrives while it is full is dropped and counted.
fn run(
    sink: &LogSink,
    tls: Option<&Arc<ClientConfig>>,
    lines: &Receiver<String>,
    shipper: &Shipper,
) {
    let mut conn: Option<Conn> = None;
    let mut backoff = BACKOFF_MIN_MS;
    let mut pending: Option<String> = None;
    loop {
        let line = match pending.take() {
            Some(line) => line,
            None => match lines.recv() {
                Ok(line) => line,
                Err(_) => return,
            },
        };
        let sent = conn
            .take()
            .map_or_else(|| connect(sink, tls), Ok)
            .and_then(|mut c| send_with_report(&mut c, &line, shipper).map(|()| c));
        match sent {
            Ok(c) => {
                conn = Some(c);
                backoff = BACKOFF_MIN_MS;
            }
            Err(_) => {
                pending = Some(line);
                std::thread::sleep(Duration::from_millis(backoff));
                backoff = (backoff * 2).min(BACKOFF_MAX_MS);
            }
        }
    }
}

/// Sends the report of lines dropped since the last one (if any), then `line`.
fn send_with_report(conn: &mut Conn, line: &str, shipper: &Shipper) -> std::io::Result<()> {
    let counters = &shipper.counters;
    let unreported = counters.unreported.swap(0, Ordering::Relaxed);
    if unreported > 0 {
        let record = Record {
            facility: Facility::Daemon,
            severity: Severity::Warning,
            component: "log-sink",
            text: &format!("{unreported} lines dropped (the log sink's queue was full)"),
            unix_micros: crate::now_micros(),
        };
        if let Err(err) = conn.send(&crate::format_line(&shipper.ident, &record)) {
            counters.unreported.fetch_add(unreported, Ordering::Relaxed);
            return Err(err);
        }
    }
    conn.send(line)?;
    counters.sent.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

fn connect(sink: &LogSink, tls: Option<&Arc<ClientConfig>>) -> std::io::Result<Conn> {
    let timeout = Duration::from_millis(IO_TIMEOUT_MS);
    let addr = sink
        .authority()
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| std::io::Error::other("the host name has no address"))?;
    if sink.transport == LogTransport::Udp {
        let local = if addr.is_ipv4() {
            "0.0.0.0:0"
        } else {
            "[::]:0"
        };
        let socket = UdpSocket::bind(local)?;
        socket.connect(addr)?;
        socket.set_write_timeout(Some(timeout))?;
        ringstore_sys::set_send_buffer(&socket, SEND_BUFFER_BYTES)?;
        return Ok(Conn::Udp(socket));
    }
    let stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_write_timeout(Some(timeout))?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_nodelay(true)?;
    ringstore_sys::set_send_buffer(&stream, SEND_BUFFER_BYTES)?;
    match tls {
        None => Ok(Conn::Tcp(stream)),
        Some(config) => {
            let name = ServerName::try_from(sink.host.clone())
                .map_err(|e| std::io::Error::other(e.to_string()))?;
            let session =
                ClientConnection::new(config.clone(), name).map_err(std::io::Error::other)?;
            Ok(Conn::Tls(Box::new(StreamOwned::new(session, stream))))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead, BufReader};
    use std::net::TcpListener;

    use super::*;
    use crate::Ident;

    /// Reads one octet-counted frame.
    fn frame(reader: &mut impl BufRead) -> String {
        let mut len = Vec::new();
        reader.read_until(b' ', &mut len).unwrap();
        let len: usize = std::str::from_utf8(&len).unwrap().trim().parse().unwrap();
        let mut line = vec![0; len];
        reader.read_exact(&mut line).unwrap();
        String::from_utf8(line).unwrap()
    }

    #[test]
    fn a_full_queue_drops_counts_and_reports_once_the_receiver_is_back() {
        // A port nobody listens on yet: every connect is refused until the listener binds.
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let sink = crate::parse_sink(&format!("tcp://127.0.0.1:{port}"));
        let ident = Ident {
            hostname: "h".into(),
            boot_id: "b".into(),
            procid: 1,
        };
        let shipper = Shipper::start(&sink, None, ident).unwrap();
        let total = crate::QUEUE_LINES + 500;
        for i in 0..total {
            shipper.log(
                Facility::Daemon,
                Severity::Info,
                "test",
                &format!("line {i}"),
            );
        }
        let dropped = shipper.counters().dropped();
        // The queue keeps QUEUE_LINES lines and the sender holds at most one more.
        assert!((499..=500).contains(&dropped), "{dropped}");
        let listener = TcpListener::bind(("127.0.0.1", port)).unwrap();
        let (stream, _) = listener.accept().unwrap();
        let mut reader = BufReader::new(stream);
        let report = frame(&mut reader);
        assert!(
            report.ends_with(&format!(
                "] {dropped} lines dropped (the log sink's queue was full)"
            )),
            "{report}"
        );
        assert!(report.starts_with("<28>1 "), "{report}");
        let kept = total - usize::try_from(dropped).unwrap();
        let numbers: Vec<usize> = (0..kept)
            .map(|_| {
                let line = frame(&mut reader);
                let n = line.rsplit_once("] line ").map(|(_, n)| n.parse());
                n.and_then(Result::ok).unwrap_or_else(|| panic!("{line}"))
            })
            .collect();
        // The oldest lines are kept, in order. The one line the sender holds (taken out of
        // the queue) made room for one more: line QUEUE_LINES when it took line 0 before
        // the queue filled, a later one when its thread started late (seen under CI load).
        let oldest: Vec<usize> = (0..crate::QUEUE_LINES).collect();
        assert_eq!(
            numbers[..crate::QUEUE_LINES],
            oldest[..],
            "the oldest lines are kept"
        );
        if let Some(&extra) = numbers.get(crate::QUEUE_LINES) {
            assert!((crate::QUEUE_LINES..total).contains(&extra), "{extra}");
        }
        assert_eq!(shipper.counters().dropped(), dropped);
    }
}
