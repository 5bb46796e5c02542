//! The memcache load generator: one thread pinned to the client CPU, one io_uring, C
//! connections that each keep a batch of `depth` pipelined requests in flight.
//!
//! A batch goes out in one send; the connection then reads until `depth` complete replies
//! are parsed, and each request's latency is its reply time minus its batch's send time. All
//! sends and receives of all connections are submitted together with one `io_uring_enter`
//! that also waits for the next completions, so the client spends few syscalls per request
//! and does not become the bottleneck of a one-core server.
//!
//! Two servers are measured in alternating slices (A B B A ...) from one thread with both
//! sets of connections open, so background load on a shared machine hits both alike.

use super::hist::Histogram;
use super::mcwire::{split_reply, write_request, Op, Reply};
use super::procs;
use anyhow::{bail, Context, Result};
use io_uring::{opcode, squeue, types, IoUring};
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// One benchmark cell against one server.
#[derive(Clone, Debug)]
pub struct LoadSpec {
    pub port: u16,
    pub op: Op,
    pub value_len: usize,
    pub depth: usize,
    pub conns: usize,
    /// Keys `0..keyspace` (preloaded for gets, so every get hits).
    pub keyspace: usize,
    /// Before the first slice.
    pub warmup: Duration,
    /// Measured time in all, split into `slices` slices.
    pub measure: Duration,
    pub slices: u32,
    /// The server process whose CPU time is read at each slice's edges.
    pub server_pid: u32,
}

/// Ramp-up before every slice after the first (connections restart their batches).
const SLICE_WARMUP: Duration = Duration::from_millis(100);
/// A server that leaves a batch unanswered this long after a slice is stuck.
const DRAIN_LIMIT: Duration = Duration::from_secs(2);

/// What one cell measured, over the measurement window only.
#[derive(Clone)]
pub struct LoadResult {
    pub requests: u64,
    pub seconds: f64,
    pub hist: Histogram,
    pub server_cpu_seconds: f64,
    pub client_cpu_seconds: f64,
    pub misses: u64,
    pub errors: u64,
    /// The server's and the client's CPU as a whole (every task, softirq included).
    pub server_core: procs::CoreUse,
    pub client_core: procs::CoreUse,
}

impl LoadResult {
    pub fn throughput(&self) -> f64 {
        self.requests as f64 / self.seconds
    }

    /// Server CPU seconds spent per million requests.
    pub fn server_cpu_per_million(&self) -> f64 {
        self.server_cpu_seconds / (self.requests as f64 / 1e6)
    }

    pub fn server_cpu_percent(&self) -> f64 {
        100.0 * self.server_cpu_seconds / self.seconds
    }

    pub fn client_cpu_percent(&self) -> f64 {
        100.0 * self.client_cpu_seconds / self.seconds
    }

    pub fn p50_us(&self) -> f64 {
        self.hist.quantile(0.50) as f64 / 1e3
    }

    pub fn p99_us(&self) -> f64 {
        self.hist.quantile(0.99) as f64 / 1e3
    }
}

impl LoadResult {
    fn empty() -> Self {
        LoadResult {
            requests: 0,
            seconds: 0.0,
            hist: Histogram::default(),
            server_cpu_seconds: 0.0,
            client_cpu_seconds: 0.0,
            misses: 0,
            errors: 0,
            server_core: procs::CoreUse::default(),
            client_core: procs::CoreUse::default(),
        }
    }

    /// Adds another slice of the same cell.
    fn merge(&mut self, other: &LoadResult) {
        let total = self.seconds + other.seconds;
        let weigh = |a: f64, b: f64| {
            if total > 0.0 {
                (a * self.seconds + b * other.seconds) / total
            } else {
                0.0
            }
        };
        let weigh_core = |a: procs::CoreUse, b: procs::CoreUse| procs::CoreUse {
            busy_percent: weigh(a.busy_percent, b.busy_percent),
            softirq_percent: weigh(a.softirq_percent, b.softirq_percent),
        };
        self.server_core = weigh_core(self.server_core, other.server_core);
        self.client_core = weigh_core(self.client_core, other.client_core);
        self.requests += other.requests;
        self.seconds = total;
        self.hist.merge(&other.hist);
        self.server_cpu_seconds += other.server_cpu_seconds;
        self.client_cpu_seconds += other.client_cpu_seconds;
        self.misses += other.misses;
        self.errors += other.errors;
    }
}

/// Runs one cell against every server in `specs` (one or two), alternating slices between
/// them, on a thread pinned to the client CPU. Results come back in the order of `specs`.
pub fn run(specs: &[LoadSpec]) -> Result<Vec<LoadResult>> {
    let specs = specs.to_vec();
    std::thread::spawn(move || {
        procs::pin_current_thread(procs::CLIENT_CPU)?;
        procs::raise_own_priority();
        let mut generators = specs
            .iter()
            .map(Generator::new)
            .collect::<Result<Vec<_>>>()?;
        let outcome = alternate(&mut generators, &specs);
        for generator in &mut generators {
            generator.close();
        }
        outcome
    })
    .join()
    .map_err(|_| anyhow::anyhow!("load generator thread panicked"))?
}

fn alternate(generators: &mut [Generator], specs: &[LoadSpec]) -> Result<Vec<LoadResult>> {
    let mut totals: Vec<LoadResult> = generators.iter().map(|_| LoadResult::empty()).collect();
    let slices = specs.iter().map(|s| s.slices).max().unwrap_or(1).max(1);
    for slice in 0..slices {
        let mut order: Vec<usize> = (0..generators.len()).collect();
        if slice % 2 == 1 {
            order.reverse();
        }
        for index in order {
            let spec = &specs[index];
            let warmup = if slice == 0 {
                spec.warmup
            } else {
                SLICE_WARMUP
            };
            let part = generators[index].segment(warmup, spec.measure / slices)?;
            totals[index].merge(&part);
        }
    }
    Ok(totals)
}

/// One connection's batch in flight. Its buffers are allocated once and never grown while an
/// operation that points into them is queued.
struct Conn {
    stream: TcpStream,
    tx: Vec<u8>,
    tx_sent: usize,
    rx: Vec<u8>,
    rx_start: usize,
    rx_end: usize,
    replies: usize,
    sent_at: Instant,
    send_queued: bool,
    recv_queued: bool,
    active: bool,
    next_key: usize,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    Warmup,
    Measure,
    Drain,
}

struct Generator {
    spec: LoadSpec,
    ring: IoUring,
    conns: Vec<Conn>,
    value: Vec<u8>,
    phase: Phase,
    queued_ops: usize,
    active: usize,
    hist: Histogram,
    requests: u64,
    misses: u64,
    errors: u64,
}

const SEND: u64 = 0;
const RECV: u64 = 1;

fn build_ring(entries: u32) -> Result<IoUring> {
    // Deferred task running keeps completions off the interrupt path; older kernels lack it.
    IoUring::builder()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .setup_coop_taskrun()
        .build(entries)
        .or_else(|_| IoUring::new(entries))
        .context("creating an io_uring")
}

impl Generator {
    fn new(spec: &LoadSpec) -> Result<Self> {
        if spec.depth == 0 || spec.conns == 0 || spec.keyspace == 0 {
            bail!("depth, conns and keyspace must be positive");
        }
        let rx_len = 64 * 1024 + 2 * spec.depth * (spec.value_len + 64);
        let mut conns = Vec::with_capacity(spec.conns);
        for index in 0..spec.conns {
            let stream = TcpStream::connect(("127.0.0.1", spec.port))
                .with_context(|| format!("connecting to 127.0.0.1:{}", spec.port))?;
            stream.set_nodelay(true)?;
            conns.push(Conn {
                stream,
                tx: Vec::with_capacity(spec.depth * (spec.value_len + 64)),
                tx_sent: 0,
                rx: vec![0; rx_len],
                rx_start: 0,
                rx_end: 0,
                replies: 0,
                sent_at: Instant::now(),
                send_queued: false,
                recv_queued: false,
                active: true,
                next_key: index * spec.keyspace / spec.conns,
            });
        }
        let entries = u32::try_from(spec.conns)
            .context("connection count")?
            .saturating_mul(2)
            .saturating_add(8)
            .next_power_of_two()
            .max(64);
        Ok(Generator {
            spec: spec.clone(),
            ring: build_ring(entries)?,
            active: 0,
            conns,
            value: vec![b'v'; spec.value_len],
            phase: Phase::Warmup,
            queued_ops: 0,
            hist: Histogram::default(),
            requests: 0,
            misses: 0,
            errors: 0,
        })
    }

    /// Runs every connection for `warmup`, then measures for `measure`, then lets every batch
    /// in flight finish so the next segment (or close) starts from idle connections.
    fn segment(&mut self, warmup: Duration, measure: Duration) -> Result<LoadResult> {
        let start = Instant::now();
        let measure_from = start + warmup;
        let measure_until = measure_from + measure;
        let mut window_start = measure_from;
        let mut window_end = measure_until;
        let (mut server_cpu0, mut client_cpu0) = (0.0, 0.0);
        let (mut server_cpu, mut client_cpu) = (0.0, 0.0);
        let (mut cores0, mut cores1) = Default::default();
        self.phase = Phase::Warmup;
        for index in 0..self.conns.len() {
            self.conns[index].active = true;
            self.start_batch(index, start)?;
        }
        self.active = self.conns.len();
        let mut completions: Vec<(u64, i32)> = Vec::with_capacity(self.conns.len() * 2);
        let mut drain_until = None;
        loop {
            self.submit_and_wait()?;
            let now = Instant::now();
            if self.phase == Phase::Warmup && now >= measure_from {
                self.phase = Phase::Measure;
                self.hist.clear();
                (self.requests, self.misses, self.errors) = (0, 0, 0);
                window_start = now;
                server_cpu0 = procs::process_cpu_seconds(self.spec.server_pid)?;
                client_cpu0 = procs::thread_cpu_seconds()?;
                cores0 = procs::core_ticks()?;
            } else if self.phase == Phase::Measure && now >= measure_until {
                self.phase = Phase::Drain;
                window_end = now;
                server_cpu = procs::process_cpu_seconds(self.spec.server_pid)? - server_cpu0;
                client_cpu = procs::thread_cpu_seconds()? - client_cpu0;
                cores1 = procs::core_ticks()?;
                drain_until = Some(now + DRAIN_LIMIT);
            }
            if self.phase == Phase::Drain && self.active == 0 {
                break;
            }
            if drain_until.is_some_and(|d| now >= d) || now > measure_until + DRAIN_LIMIT * 2 {
                bail!(
                    "{} batches still unanswered {} s after the slice ({} {} B, depth {}, port {})",
                    self.active,
                    DRAIN_LIMIT.as_secs(),
                    self.spec.op.name(),
                    self.spec.value_len,
                    self.spec.depth,
                    self.spec.port
                );
            }
            completions.clear();
            completions.extend(self.ring.completion().map(|c| (c.user_data(), c.result())));
            self.queued_ops -= completions.len();
            for &(user_data, result) in &completions {
                let index = (user_data >> 1) as usize;
                if user_data & 1 == SEND {
                    self.on_send(index, result, now)?;
                } else {
                    self.on_recv(index, result, now)?;
                }
            }
        }
        Ok(LoadResult {
            requests: self.requests,
            seconds: (window_end - window_start).as_secs_f64(),
            hist: self.hist.clone(),
            server_cpu_seconds: server_cpu,
            client_cpu_seconds: client_cpu,
            misses: self.misses,
            errors: self.errors,
            server_core: procs::CoreUse::between(&cores0.0, &cores1.0),
            client_core: procs::CoreUse::between(&cores0.1, &cores1.1),
        })
    }

    /// Submits what is queued and waits (at most 50 ms) for at least one completion.
    fn submit_and_wait(&mut self) -> Result<()> {
        let timeout = types::Timespec::new().nsec(50_000_000);
        let args = types::SubmitArgs::new().timespec(&timeout);
        match self.ring.submitter().submit_with_args(1, &args) {
            Ok(_) => Ok(()),
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ETIME | libc::EINTR | libc::EBUSY)
                ) =>
            {
                Ok(())
            }
            Err(e) => Err(e).context("io_uring_enter"),
        }
    }

    fn push(&mut self, entry: squeue::Entry) -> Result<()> {
        loop {
            // Every entry points into a connection's tx or rx buffer; those buffers are allocated
            // before the first submission, never reallocated, and close() reaps every queued
            // operation before the connections are dropped.
            // SAFETY: the buffers each entry points into outlive the operation (above).
            if unsafe { self.ring.submission().push(&entry) }.is_ok() {
                self.queued_ops += 1;
                return Ok(());
            }
            self.ring.submit().context("io_uring_enter")?;
        }
    }

    fn start_batch(&mut self, index: usize, now: Instant) -> Result<()> {
        let (op, depth, keyspace) = (self.spec.op, self.spec.depth, self.spec.keyspace);
        let conn = &mut self.conns[index];
        conn.tx.clear();
        for _ in 0..depth {
            write_request(&mut conn.tx, op, &self.value, conn.next_key);
            conn.next_key = (conn.next_key + 1) % keyspace;
        }
        conn.tx_sent = 0;
        conn.replies = 0;
        conn.sent_at = now;
        self.queue_send(index)?;
        if !self.conns[index].recv_queued {
            self.queue_recv(index)?;
        }
        Ok(())
    }

    fn queue_send(&mut self, index: usize) -> Result<()> {
        let conn = &mut self.conns[index];
        let rest = &conn.tx[conn.tx_sent..];
        let entry = opcode::Send::new(
            types::Fd(conn.stream.as_raw_fd()),
            rest.as_ptr(),
            sqe_len(rest.len()),
        )
        .flags(libc::MSG_NOSIGNAL)
        .build()
        .user_data((index as u64) << 1 | SEND);
        conn.send_queued = true;
        self.push(entry)
    }

    fn queue_recv(&mut self, index: usize) -> Result<()> {
        let conn = &mut self.conns[index];
        if conn.rx_start == conn.rx_end {
            (conn.rx_start, conn.rx_end) = (0, 0);
        } else if conn.rx.len() - conn.rx_end < 16 * 1024 {
            conn.rx.copy_within(conn.rx_start..conn.rx_end, 0);
            (conn.rx_start, conn.rx_end) = (0, conn.rx_end - conn.rx_start);
        }
        let spare = &mut conn.rx[conn.rx_end..];
        let entry = opcode::Recv::new(
            types::Fd(conn.stream.as_raw_fd()),
            spare.as_mut_ptr(),
            sqe_len(spare.len()),
        )
        .build()
        .user_data((index as u64) << 1 | RECV);
        conn.recv_queued = true;
        self.push(entry)
    }

    fn on_send(&mut self, index: usize, result: i32, now: Instant) -> Result<()> {
        let conn = &mut self.conns[index];
        conn.send_queued = false;
        if result < 0 {
            bail!("send: {}", std::io::Error::from_raw_os_error(-result));
        }
        conn.tx_sent += result as usize;
        if conn.tx_sent < conn.tx.len() {
            return self.queue_send(index);
        }
        if conn.replies == self.spec.depth && !conn.recv_queued {
            return self.finish_batch(index, now);
        }
        Ok(())
    }

    fn on_recv(&mut self, index: usize, result: i32, now: Instant) -> Result<()> {
        let measuring = self.phase == Phase::Measure;
        let conn = &mut self.conns[index];
        conn.recv_queued = false;
        if result == 0 {
            if self.phase == Phase::Drain && !conn.active {
                return Ok(());
            }
            bail!("the server closed a connection mid-batch");
        }
        if result < 0 {
            bail!("recv: {}", std::io::Error::from_raw_os_error(-result));
        }
        conn.rx_end += result as usize;
        let latency = super::hist::nanos(now - conn.sent_at);
        while let Some((reply, used)) = split_reply(&conn.rx[conn.rx_start..conn.rx_end]) {
            conn.rx_start += used;
            conn.replies += 1;
            if measuring {
                self.requests += 1;
                self.hist.record(latency);
                match reply {
                    Reply::Miss => self.misses += 1,
                    Reply::Other => self.errors += 1,
                    Reply::Hit | Reply::Stored => {}
                }
            }
        }
        if conn.replies > self.spec.depth {
            bail!("more replies than requests: the server's replies are out of step");
        }
        if conn.rx_start == 0 && conn.rx_end == conn.rx.len() {
            bail!("a reply larger than the receive buffer");
        }
        if conn.replies == self.spec.depth && conn.tx_sent == conn.tx.len() && !conn.send_queued {
            return self.finish_batch(index, now);
        }
        self.queue_recv(index)
    }

    fn finish_batch(&mut self, index: usize, now: Instant) -> Result<()> {
        if self.phase == Phase::Drain {
            self.conns[index].active = false;
            self.active -= 1;
            return Ok(());
        }
        self.start_batch(index, now)
    }

    /// Shuts the sockets down so queued receives complete, and reaps every queued operation
    /// (bounded) before the buffers they point into are freed.
    fn close(&mut self) {
        for conn in &self.conns {
            let _ = conn.stream.shutdown(Shutdown::Both);
        }
        let deadline = Instant::now() + Duration::from_secs(2);
        while self.queued_ops > 0 && Instant::now() < deadline {
            if self.submit_and_wait().is_err() {
                break;
            }
            let reaped = self.ring.completion().count();
            self.queued_ops -= reaped;
        }
        if self.queued_ops > 0 {
            // The kernel may still write into these buffers: never free them.
            std::mem::forget(std::mem::take(&mut self.conns));
        }
    }
}

/// A buffer length for an SQE (a u32): a longer buffer is used only up to u32::MAX bytes,
/// which an operation may always transfer less than.
pub(super) fn sqe_len(len: usize) -> u32 {
    u32::try_from(len).unwrap_or(u32::MAX)
}
