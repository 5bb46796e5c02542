//! One connection of the load generator: its socket (TCP, TLS over TCP, or UDP), the batch's
//! bytes out and the replies' bytes in, with explicit limits.

use super::pace::Schedule;
use super::{LoadSpec, Mode};
use anyhow::{bail, Context, Result};
use rustls::ClientConnection;
use std::io::{ErrorKind, Read};
use std::net::{Shutdown, TcpStream, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

/// Unparsed reply bytes a connection holds at most (a 1 MiB HTTP body pipelined, and more).
const RX_MAX: usize = 64 << 20;
/// Free space a receive asks for at least; less and the buffer is compacted or grown.
const RX_SPARE_MIN: usize = 16 << 10;
/// Ciphertext one TLS receive takes at most (a few records).
const TLS_RX: usize = 64 << 10;
/// Plaintext a TLS session holds unsent at most (one batch, whole: 16 × 4 KiB SETs and more).
const TLS_UNSENT_MAX: usize = 1 << 20;

/// A connection's socket, and for TLS its session and ciphertext receive buffer.
pub(super) enum Link {
    Tcp(TcpStream),
    Tls {
        stream: TcpStream,
        session: Box<ClientConnection>,
        cipher: Vec<u8>,
    },
    Udp(UdpSocket),
}

impl Link {
    pub(super) fn fd(&self) -> RawFd {
        match self {
            Link::Tcp(stream) | Link::Tls { stream, .. } => stream.as_raw_fd(),
            Link::Udp(socket) => socket.as_raw_fd(),
        }
    }

    pub(super) fn shutdown(&self) {
        let _ = match self {
            Link::Tcp(stream) | Link::Tls { stream, .. } => stream.shutdown(Shutdown::Both),
            Link::Udp(socket) => rustix::net::shutdown(socket, rustix::net::Shutdown::Both)
                .map_err(std::io::Error::from),
        };
    }
}

/// A blocking TCP connection to `port` on loopback (TCP_NODELAY on), with its TLS session
/// (handshake finished) when `tls` is given.
pub(crate) fn connect(
    port: u16,
    tls: Option<&std::sync::Arc<rustls::ClientConfig>>,
) -> Result<(TcpStream, Option<ClientConnection>)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))
        .with_context(|| format!("connecting to 127.0.0.1:{port}"))?;
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let session = match tls {
        Some(config) => {
            let name = rustls::pki_types::ServerName::try_from("localhost")?;
            let mut session = ClientConnection::new(config.clone(), name)?;
            session.set_buffer_limit(Some(TLS_UNSENT_MAX));
            while session.is_handshaking() {
                session.complete_io(&mut stream).context("TLS handshake")?;
            }
            Some(session)
        }
        None => None,
    };
    Ok((stream, session))
}

pub(super) fn open(spec: &LoadSpec) -> Result<Link> {
    match &spec.mode {
        Mode::Memcache { .. } => Ok(Link::Tcp(connect(spec.port, None)?.0)),
        Mode::Tls { config, .. } => {
            let (stream, session) = connect(spec.port, config.as_ref())?;
            // The ring waits for readiness itself; a timeout belongs to blocking reads only.
            stream.set_read_timeout(None)?;
            Ok(match session {
                Some(session) => Link::Tls {
                    stream,
                    session: Box::new(session),
                    cipher: vec![0; TLS_RX],
                },
                None => Link::Tcp(stream),
            })
        }
        Mode::Udp { from, to } => {
            let socket = UdpSocket::bind((*from, 0)).context("binding a UDP client socket")?;
            socket.connect(to).context("connecting the UDP socket")?;
            Ok(Link::Udp(socket))
        }
    }
}

/// One connection and its batch. The buffers an operation points into (`tx`, `rx`, a TLS
/// link's `cipher`) are never reallocated while that operation is queued.
pub(super) struct Conn {
    pub(super) link: Link,
    /// The batch's bytes as sent (ciphertext for TLS).
    pub(super) tx: Vec<u8>,
    /// Stream: bytes sent. UDP: datagrams sent.
    pub(super) tx_sent: usize,
    /// UDP: where each request datagram of `tx` ends (one per request of the batch).
    pub(super) marks: Vec<usize>,
    pub(super) sends_queued: usize,
    /// Reply bytes (plaintext) received and not yet parsed: `rx[rx_start..rx_end]`.
    pub(super) rx: Vec<u8>,
    pub(super) rx_start: usize,
    pub(super) rx_end: usize,
    pub(super) recv_queued: bool,
    pub(super) replies: usize,
    /// Where latencies of this batch count from.
    pub(super) since: Instant,
    /// When this batch was sent (for UDP's loss timeout).
    pub(super) sent_wall: Instant,
    /// A batch is out (sent or due to be) and not yet answered.
    pub(super) out: bool,
    /// Takes part in the segment (cleared when it has drained).
    pub(super) active: bool,
    /// Requests sent on this connection so far (the key walk's position).
    pub(super) sent_count: usize,
    pub(super) schedule: Option<Schedule>,
    /// Counted passes: batches this connection may still start (`None`: no limit).
    pub(super) budget: Option<usize>,
}

impl Conn {
    pub(super) fn all_sent(&self) -> bool {
        self.sends_queued == 0 && self.tx_sent == self.unit_count()
    }

    fn unit_count(&self) -> usize {
        match self.link {
            Link::Udp(_) => self.marks.len(),
            _ => self.tx.len(),
        }
    }

    /// Makes room for a receive into `rx` (no operation may point into it).
    pub(super) fn make_room(&mut self) -> Result<()> {
        make_room(&mut self.rx, &mut self.rx_start, &mut self.rx_end)
    }

    /// TLS: takes `n` bytes of ciphertext just received and appends their plaintext to `rx`.
    pub(super) fn decrypt(&mut self, n: usize) -> Result<()> {
        let Link::Tls {
            session, cipher, ..
        } = &mut self.link
        else {
            return Ok(());
        };
        let mut input = &cipher[..n];
        while !input.is_empty() {
            if session.read_tls(&mut input).context("TLS records")? == 0 {
                bail!("the TLS session took no more ciphertext");
            }
            session.process_new_packets().context("TLS records")?;
            loop {
                // No operation points into `rx` on a TLS link: it may move.
                make_room(&mut self.rx, &mut self.rx_start, &mut self.rx_end)?;
                match session.reader().read(&mut self.rx[self.rx_end..]) {
                    Ok(0) => bail!("the server sent close_notify"),
                    Ok(k) => self.rx_end += k,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(e) => return Err(e).context("TLS plaintext"),
                }
            }
        }
        Ok(())
    }
}

/// Leaves at least `RX_SPARE_MIN` free after `rx[start..end]`: compacts the unparsed bytes
/// to the front, and doubles the buffer (up to `RX_MAX`) where that is not enough.
fn make_room(rx: &mut Vec<u8>, start: &mut usize, end: &mut usize) -> Result<()> {
    if *start == *end {
        (*start, *end) = (0, 0);
    }
    if rx.len() - *end >= RX_SPARE_MIN {
        return Ok(());
    }
    rx.copy_within(*start..*end, 0);
    (*start, *end) = (0, *end - *start);
    if rx.len() - *end < RX_SPARE_MIN {
        if rx.len() >= RX_MAX {
            bail!("a reply larger than {RX_MAX} bytes");
        }
        let larger = (rx.len() * 2).clamp(RX_SPARE_MIN * 2, RX_MAX);
        rx.resize(larger, 0);
    }
    Ok(())
}
