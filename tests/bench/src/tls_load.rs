//! The TLS benchmark's load generator: one thread pinned to the client CPU, one epoll, C
//! connections (rustls' buffered `ClientConnection`, or plain TCP for the plaintext column)
//! that each keep a batch of `depth` pipelined requests in flight.
//!
//! Connections are opened and their handshakes finished before anything is measured. Targets
//! are measured in alternating slices (A B C C B A ...) with every target's connections open,
//! as loadgen.rs does, so background load on a shared machine hits all of them alike.

use super::hist::{nanos, Histogram};
use super::procs;
use super::tls_wire::Wire;
use anyhow::{bail, Context, Result};
use rustix::event::epoll;
use rustls::{ClientConfig, ClientConnection};
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One server endpoint of a cell.
#[derive(Clone)]
pub(super) struct Target {
    pub port: u16,
    /// `None`: plain TCP.
    pub tls: Option<Arc<ClientConfig>>,
    pub server_pid: u32,
}

/// The load of one cell (the same against every target).
#[derive(Clone)]
pub(super) struct Load {
    pub wire: Wire,
    pub depth: usize,
    pub conns: usize,
    pub warmup: Duration,
    pub measure: Duration,
    pub slices: u32,
}

/// What one target measured over its measured slices.
#[derive(Clone, Default)]
pub(super) struct Measured {
    pub requests: u64,
    pub errors: u64,
    pub seconds: f64,
    pub server_cpu_seconds: f64,
    pub client_cpu_seconds: f64,
    pub hist: Histogram,
}

impl Measured {
    pub(super) fn per_cpu_second(&self) -> f64 {
        if self.server_cpu_seconds > 0.0 {
            self.requests as f64 / self.server_cpu_seconds
        } else {
            f64::NAN
        }
    }

    pub(super) fn throughput(&self) -> f64 {
        self.requests as f64 / self.seconds.max(1e-9)
    }

    pub(super) fn merge(&mut self, other: &Measured) {
        self.requests += other.requests;
        self.errors += other.errors;
        self.seconds += other.seconds;
        self.server_cpu_seconds += other.server_cpu_seconds;
        self.client_cpu_seconds += other.client_cpu_seconds;
        self.hist.merge(&other.hist);
    }
}

/// Largest plaintext a connection holds unparsed (a 1 MiB HTTP body and its head, pipelined).
const RX_MAX: usize = 64 << 20;
/// Plaintext a TLS session holds unsent at most (one batch, whole).
const TLS_UNSENT_MAX: usize = 1 << 20;
/// Bytes read from a plain socket per read call.
const READ_CHUNK: usize = 64 * 1024;
/// A batch unanswered this long after a slice means a stuck server.
const DRAIN_LIMIT: Duration = Duration::from_secs(3);
/// Ramp-up before every slice after the first.
const SLICE_WARMUP: Duration = Duration::from_millis(100);

/// A blocking TCP connection to `port` on loopback (TCP_NODELAY on), its TLS session when
/// `tls` is given, with the handshake finished.
pub(super) fn connect(
    port: u16,
    tls: Option<&Arc<ClientConfig>>,
) -> Result<(TcpStream, Option<ClientConnection>)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))
        .with_context(|| format!("connecting to port {port}"))?;
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let session = match tls {
        Some(config) => {
            let name = rustls::pki_types::ServerName::try_from("localhost")?;
            let mut session = ClientConnection::new(config.clone(), name)?;
            // A SET batch (16 × 4 KiB) is more than rustls' default 64 KiB of unsent plaintext.
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

struct Conn {
    stream: TcpStream,
    tls: Option<ClientConnection>,
    /// Plain TCP: request bytes not yet written.
    tx: Vec<u8>,
    tx_sent: usize,
    rx: Vec<u8>,
    outstanding: usize,
    sent_at: Instant,
    next_key: usize,
    /// Registered for EPOLLOUT (a write would block).
    want_out: bool,
}

impl Conn {
    fn queue_batch(&mut self, load: &Load, value: &[u8], scratch: &mut Vec<u8>) -> Result<()> {
        scratch.clear();
        for _ in 0..load.depth {
            load.wire.request(scratch, value, self.next_key);
            self.next_key = self.next_key.wrapping_add(7919);
        }
        match &mut self.tls {
            Some(tls) => tls.writer().write_all(scratch)?,
            None => self.tx.extend_from_slice(scratch),
        }
        self.outstanding = load.depth;
        self.sent_at = Instant::now();
        Ok(())
    }

    /// Writes what is queued; `true` when some of it waits for the socket.
    fn flush(&mut self) -> Result<bool> {
        loop {
            let wrote = match &mut self.tls {
                Some(tls) if tls.wants_write() => tls.write_tls(&mut self.stream),
                Some(_) => return Ok(false),
                None if self.tx_sent < self.tx.len() => {
                    self.stream.write(&self.tx[self.tx_sent..]).inspect(|&n| {
                        self.tx_sent += n;
                    })
                }
                None => {
                    self.tx.clear();
                    self.tx_sent = 0;
                    return Ok(false);
                }
            };
            match wrote {
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(true),
                Err(e) => return Err(e).context("send"),
            }
        }
    }

    /// Reads what the socket has into `rx` (decrypted for TLS).
    fn receive(&mut self, chunk: &mut [u8]) -> Result<()> {
        loop {
            let read = match &mut self.tls {
                Some(tls) => tls.read_tls(&mut self.stream),
                None => self.stream.read(chunk),
            };
            match read {
                Ok(0) => bail!("the server closed the connection"),
                Ok(n) => match &mut self.tls {
                    Some(tls) => {
                        tls.process_new_packets().context("TLS records")?;
                        drain_plaintext(tls, &mut self.rx)?;
                    }
                    None => self.rx.extend_from_slice(&chunk[..n]),
                },
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(()),
                Err(e) => return Err(e).context("receive"),
            }
            if self.rx.len() > RX_MAX {
                bail!("more than {RX_MAX} bytes of unparsed replies");
            }
        }
    }
}

fn drain_plaintext(tls: &mut ClientConnection, rx: &mut Vec<u8>) -> Result<()> {
    let mut buf = [0u8; 16 * 1024];
    loop {
        match tls.reader().read(&mut buf) {
            Ok(0) => bail!("the server sent close_notify"),
            Ok(n) => rx.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(()),
            Err(e) => return Err(e).context("TLS plaintext"),
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    Warmup,
    Measure,
    Drain,
}

/// One target's connections and epoll.
struct Generator {
    target: Target,
    load: Load,
    epoll: rustix::fd::OwnedFd,
    conns: Vec<Conn>,
    value: Vec<u8>,
    scratch: Vec<u8>,
    chunk: Vec<u8>,
}

impl Generator {
    fn new(target: &Target, load: &Load) -> Result<Generator> {
        let epoll = epoll::create(epoll::CreateFlags::CLOEXEC)?;
        let mut conns = Vec::with_capacity(load.conns);
        for index in 0..load.conns {
            let (stream, tls) = connect(target.port, target.tls.as_ref())?;
            stream.set_nonblocking(true)?;
            let data = epoll::EventData::new_u64(index as u64);
            epoll::add(&epoll, &stream, data, epoll::EventFlags::IN)?;
            conns.push(Conn {
                stream,
                tls,
                tx: Vec::new(),
                tx_sent: 0,
                rx: Vec::new(),
                outstanding: 0,
                sent_at: Instant::now(),
                next_key: index * 131,
                want_out: false,
            });
        }
        Ok(Generator {
            target: target.clone(),
            load: load.clone(),
            epoll,
            conns,
            value: load.wire.value(),
            scratch: Vec::new(),
            chunk: vec![0; READ_CHUNK],
        })
    }

    /// Sends a batch on connection `index` and writes it out as far as the socket takes it.
    fn start_batch(&mut self, index: usize) -> Result<()> {
        let conn = &mut self.conns[index];
        conn.queue_batch(&self.load, &self.value, &mut self.scratch)?;
        self.flush(index)
    }

    fn flush(&mut self, index: usize) -> Result<()> {
        let conn = &mut self.conns[index];
        let blocked = conn.flush()?;
        if blocked != conn.want_out {
            let flags = if blocked {
                epoll::EventFlags::IN | epoll::EventFlags::OUT
            } else {
                epoll::EventFlags::IN
            };
            let data = epoll::EventData::new_u64(index as u64);
            epoll::modify(&self.epoll, &conn.stream, data, flags)?;
            conn.want_out = blocked;
        }
        Ok(())
    }

    /// Reads and parses connection `index`; counts (and times) replies in `out` while
    /// measuring; starts its next batch unless draining.
    fn on_ready(&mut self, index: usize, phase: Phase, out: &mut Measured) -> Result<()> {
        self.conns[index].receive(&mut self.chunk)?;
        let conn = &mut self.conns[index];
        let mut at = 0;
        while conn.outstanding > 0 {
            let Some(whole) = self.load.wire.split(&conn.rx[at..]) else {
                break;
            };
            at += whole.len;
            conn.outstanding -= 1;
            if phase == Phase::Measure {
                out.requests += 1;
                out.errors += u64::from(!whole.ok);
                out.hist.record(nanos(conn.sent_at.elapsed()));
            }
        }
        conn.rx.drain(..at);
        let idle = conn.outstanding == 0;
        if idle && phase != Phase::Drain {
            self.start_batch(index)?;
        } else {
            self.flush(index)?;
        }
        Ok(())
    }

    fn poll(
        &mut self,
        phase: Phase,
        out: &mut Measured,
        events: &mut Vec<epoll::Event>,
    ) -> Result<()> {
        events.clear();
        let timeout = rustix::time::Timespec {
            tv_sec: 0,
            tv_nsec: 50_000_000,
        };
        epoll::wait(
            &self.epoll,
            rustix::buffer::spare_capacity(events),
            Some(&timeout),
        )?;
        for event in events.iter() {
            let index = usize::try_from(event.data.u64())?;
            self.on_ready(index, phase, out)?;
        }
        Ok(())
    }

    /// `warmup` of load, then `measure` counted, then the batches in flight drained.
    fn segment(&mut self, warmup: Duration, measure: Duration) -> Result<Measured> {
        let mut events = Vec::with_capacity(self.conns.len());
        let mut out = Measured::default();
        for index in 0..self.conns.len() {
            self.start_batch(index)?;
        }
        let until = Instant::now() + warmup;
        while Instant::now() < until {
            self.poll(Phase::Warmup, &mut out, &mut events)?;
        }
        let cpu0 = procs::process_cpu_seconds(self.target.server_pid)?;
        let own0 = procs::thread_cpu_seconds()?;
        let started = Instant::now();
        while started.elapsed() < measure {
            self.poll(Phase::Measure, &mut out, &mut events)?;
        }
        out.seconds = started.elapsed().as_secs_f64();
        out.server_cpu_seconds = procs::process_cpu_seconds(self.target.server_pid)? - cpu0;
        out.client_cpu_seconds = procs::thread_cpu_seconds()? - own0;
        let deadline = Instant::now() + DRAIN_LIMIT;
        while self.conns.iter().any(|c| c.outstanding > 0) {
            if Instant::now() > deadline {
                bail!(
                    "port {}: batches unanswered after the slice",
                    self.target.port
                );
            }
            self.poll(Phase::Drain, &mut out, &mut events)?;
        }
        Ok(out)
    }
}

/// Runs `load` against every target in alternating slices on a thread pinned to the client
/// CPU; results in the order of `targets`.
pub(super) fn run(targets: &[Target], load: &Load) -> Result<Vec<Measured>> {
    let (targets, load) = (targets.to_vec(), load.clone());
    std::thread::spawn(move || {
        procs::pin_current_thread(procs::CLIENT_CPU)?;
        procs::raise_own_priority();
        let mut generators = targets
            .iter()
            .map(|t| Generator::new(t, &load))
            .collect::<Result<Vec<_>>>()?;
        let slices = load.slices.max(1);
        let mut totals = vec![Measured::default(); generators.len()];
        for slice in 0..slices {
            let mut order: Vec<usize> = (0..generators.len()).collect();
            if slice % 2 == 1 {
                order.reverse();
            }
            for index in order {
                let warmup = if slice == 0 {
                    load.warmup
                } else {
                    SLICE_WARMUP
                };
                let part = generators[index].segment(warmup, load.measure / slices)?;
                totals[index].merge(&part);
            }
        }
        Ok(totals)
    })
    .join()
    .map_err(|_| anyhow::anyhow!("TLS load generator thread panicked"))?
}
