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
//!
//! Closed loop (`run`) starts a connection's next batch the moment its last reply is in, so it
//! finds a server's peak. Paced (`run_paced`, open loop, as wrk2) gives every connection a fixed
//! schedule instead: batch k is due at k·interval (connections phase-shifted evenly), a batch
//! that is due while the previous one is still out goes the moment that one is answered, and
//! every latency runs from the batch's *due* time, so a stall counts against every request it
//! delayed (no coordinated omission).

use super::hist::Histogram;
use super::mcwire::{split_reply_for, write_request, Op, Reply};
use super::procs;
use anyhow::{bail, Context, Result};
use io_uring::{opcode, squeue, types, IoUring};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
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
    /// Each slice's throughput, in order (one per slice, so bounded by the slice count).
    pub slice_throughputs: Vec<f64>,
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

    /// The median slice's throughput: neither a slice starved by other work on a shared
    /// machine nor one that ran while the machine was quiet sets it.
    pub fn median_slice_throughput(&self) -> f64 {
        let mut sorted = self.slice_throughputs.clone();
        sorted.sort_by(f64::total_cmp);
        match sorted.len() {
            0 => 0.0,
            n if n % 2 == 1 => sorted[n / 2],
            n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
        }
    }

    pub fn p999_us(&self) -> f64 {
        self.hist.quantile(0.999) as f64 / 1e3
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
            slice_throughputs: Vec::new(),
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
        self.slice_throughputs
            .extend_from_slice(&other.slice_throughputs);
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
    let paced: Vec<(LoadSpec, Option<f64>)> = specs.iter().map(|s| (s.clone(), None)).collect();
    run_on_client_cpu(paced)
}

/// Like `run`, open loop: server `i` gets `rates[i]` requests per second in all, spread evenly
/// over its connections on a fixed schedule (see the module text).
pub fn run_paced(specs: &[LoadSpec], rates: &[f64]) -> Result<Vec<LoadResult>> {
    if specs.len() != rates.len() || rates.iter().any(|r| !r.is_finite() || *r <= 0.0) {
        bail!("one positive rate per paced server");
    }
    let paced = specs
        .iter()
        .zip(rates)
        .map(|(s, r)| (s.clone(), Some(*r)))
        .collect();
    run_on_client_cpu(paced)
}

fn run_on_client_cpu(paced: Vec<(LoadSpec, Option<f64>)>) -> Result<Vec<LoadResult>> {
    std::thread::spawn(move || {
        procs::pin_current_thread(procs::CLIENT_CPU)?;
        procs::raise_own_priority();
        let specs: Vec<LoadSpec> = paced.iter().map(|(s, _)| s.clone()).collect();
        let mut generators = paced
            .iter()
            .map(|(spec, rate)| Generator::new(spec, *rate))
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
    /// Paced mode only: when this connection's batches are due.
    schedule: Option<Schedule>,
}

/// One connection's send schedule in paced mode: batch k is due `phase + k·interval` after the
/// segment's start whatever happened to batch k-1, so a slow reply delays the sends after it
/// but never moves their due times (and their latencies count from those).
#[derive(Clone, Copy, Debug)]
struct Schedule {
    phase: Duration,
    interval: Duration,
    next: u32,
}

/// What a paced connection does with its next batch, due at `due`, when it is free at `now`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Plan {
    /// Already due: send at once, its latency counted from `since` (the due time, not now).
    SendNow { since: Instant },
    /// Not yet due: wait until then.
    WaitUntil(Instant),
}

fn plan(due: Instant, now: Instant) -> Plan {
    if due <= now {
        Plan::SendNow { since: due }
    } else {
        Plan::WaitUntil(due)
    }
}

impl Schedule {
    /// Connection `index` of `conns` that together send `batches_per_second`: one batch every
    /// `conns / batches_per_second` s each, connection i shifted by i/conns of that interval
    /// so the sends of all connections spread evenly instead of going out in bursts.
    fn new(index: usize, conns: usize, batches_per_second: f64) -> Self {
        let interval = Duration::from_secs_f64(conns as f64 / batches_per_second);
        Schedule {
            phase: interval.mul_f64(index as f64 / conns as f64),
            interval,
            next: 0,
        }
    }

    fn restart(&mut self) {
        self.next = 0;
    }

    /// The next batch's due time as an offset from the segment's start; moves on one batch.
    fn take_due(&mut self) -> Duration {
        let due = self.phase + self.interval.saturating_mul(self.next);
        self.next = self.next.saturating_add(1);
        due
    }
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
    /// Paced mode: connections between batches, by due time (earliest first).
    waiting: BinaryHeap<Reverse<(Instant, usize)>>,
    /// The current segment's start, the origin of every schedule.
    segment_start: Instant,
}

/// The longest one wait for completions blocks.
const WAIT_MAX: Duration = Duration::from_millis(50);

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
    fn new(spec: &LoadSpec, rate: Option<f64>) -> Result<Self> {
        if spec.depth == 0 || spec.conns == 0 || spec.keyspace == 0 {
            bail!("depth, conns and keyspace must be positive");
        }
        let batches_per_second = rate.map(|r| r / spec.depth as f64);
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
                schedule: batches_per_second.map(|b| Schedule::new(index, spec.conns, b)),
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
            waiting: BinaryHeap::with_capacity(spec.conns),
            segment_start: Instant::now(),
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
        self.segment_start = start;
        self.waiting.clear();
        for index in 0..self.conns.len() {
            self.conns[index].active = true;
            if let Some(schedule) = self.conns[index].schedule.as_mut() {
                schedule.restart();
            }
            self.next_batch(index, start)?;
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
                // Connections waiting for their next due time have nothing out: done.
                for Reverse((_, index)) in self.waiting.drain() {
                    self.conns[index].active = false;
                    self.active -= 1;
                }
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
            self.start_due_batches()?;
        }
        let seconds = (window_end - window_start).as_secs_f64();
        Ok(LoadResult {
            slice_throughputs: vec![self.requests as f64 / seconds],
            requests: self.requests,
            seconds,
            hist: self.hist.clone(),
            server_cpu_seconds: server_cpu,
            client_cpu_seconds: client_cpu,
            misses: self.misses,
            errors: self.errors,
            server_core: procs::CoreUse::between(&cores0.0, &cores1.0),
            client_core: procs::CoreUse::between(&cores0.1, &cores1.1),
        })
    }

    /// Submits what is queued and waits for at least one completion, at most until the next
    /// paced batch is due (not at all when one is due now) and never more than `WAIT_MAX`.
    fn submit_and_wait(&mut self) -> Result<()> {
        let wait = self.waiting.peek().map_or(WAIT_MAX, |Reverse((due, _))| {
            due.saturating_duration_since(Instant::now()).min(WAIT_MAX)
        });
        if wait.is_zero() {
            self.ring.submit().context("io_uring_enter")?;
            return Ok(());
        }
        let timeout = types::Timespec::new().nsec(wait.subsec_nanos());
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

    /// Closed loop: starts connection `index`'s next batch now. Paced: starts it now if it is
    /// already due (timed from its due time), else queues it for its due time.
    fn next_batch(&mut self, index: usize, now: Instant) -> Result<()> {
        let Some(schedule) = self.conns[index].schedule.as_mut() else {
            return self.start_batch(index, now);
        };
        match plan(self.segment_start + schedule.take_due(), now) {
            Plan::SendNow { since } => self.start_batch(index, since),
            Plan::WaitUntil(due) => {
                self.waiting.push(Reverse((due, index)));
                Ok(())
            }
        }
    }

    /// Starts every paced batch whose due time has come, each timed from its due time.
    fn start_due_batches(&mut self) -> Result<()> {
        let now = Instant::now();
        while let Some(&Reverse((due, index))) = self.waiting.peek() {
            if due > now {
                break;
            }
            self.waiting.pop();
            self.start_batch(index, due)?;
        }
        Ok(())
    }

    /// Sends connection `index`'s next batch; its latencies count from `since`.
    fn start_batch(&mut self, index: usize, since: Instant) -> Result<()> {
        let (op, depth, keyspace) = (self.spec.op, self.spec.depth, self.spec.keyspace);
        let conn = &mut self.conns[index];
        conn.tx.clear();
        for _ in 0..depth {
            write_request(&mut conn.tx, op, &self.value, conn.next_key);
            conn.next_key = (conn.next_key + 1) % keyspace;
        }
        conn.tx_sent = 0;
        conn.replies = 0;
        conn.sent_at = since;
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
        let (op, value_len) = (self.spec.op, self.spec.value_len);
        while let Some((reply, used)) =
            split_reply_for(op, value_len, &conn.rx[conn.rx_start..conn.rx_end])
        {
            if op.is_extra_get() && reply != Reply::Hit {
                bail!(
                    "{} {value_len} B: a wrong answer ({reply:?}, {used} bytes), not a hit of {value_len} bytes",
                    op.name()
                );
            }
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
        self.next_batch(index, now)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paced_batches_are_due_on_a_fixed_grid() {
        // 4 connections sending 1000 batches/s in all: each one every 4 ms.
        let mut first = Schedule::new(0, 4, 1000.0);
        let dues: Vec<Duration> = (0..3).map(|_| first.take_due()).collect();
        assert_eq!(
            dues,
            [0, 4, 8].map(Duration::from_millis),
            "connection 0 starts at once, then every conns/rate"
        );
        let mut third = Schedule::new(2, 4, 1000.0);
        assert_eq!(third.take_due(), Duration::from_millis(2));
        assert_eq!(third.take_due(), Duration::from_millis(6));
    }

    #[test]
    fn phases_spread_the_connections_over_one_interval() {
        let conns = 64;
        let mut phases: Vec<Duration> = (0..conns)
            .map(|i| Schedule::new(i, conns, 64_000.0).take_due())
            .collect();
        phases.sort();
        phases.dedup();
        assert_eq!(phases.len(), conns, "every connection has its own phase");
        let last = phases.last().copied().unwrap_or_default();
        assert!(
            last < Duration::from_millis(1),
            "all within one 1 ms interval"
        );
        assert!(
            last > Duration::from_micros(980),
            "and spread over all of it"
        );
    }

    /// One paced connection (1 ms interval) against a server that stalls 100 ms on the first
    /// request and then answers in 0.1 ms: the latencies the generator records.
    fn latencies_behind_a_stall() -> Vec<Duration> {
        let origin = Instant::now();
        let mut schedule = Schedule::new(0, 1, 1000.0);
        let mut free_at = origin;
        let mut latencies = Vec::new();
        for request in 0..200 {
            let service = if request == 0 {
                Duration::from_millis(100)
            } else {
                Duration::from_micros(100)
            };
            let (sent, since) = match plan(origin + schedule.take_due(), free_at) {
                Plan::SendNow { since } => (free_at, since),
                Plan::WaitUntil(due) => (due, due),
            };
            free_at = sent + service;
            latencies.push(free_at - since);
        }
        latencies
    }

    #[test]
    fn a_stall_counts_against_every_request_it_delayed() {
        let latencies = latencies_behind_a_stall();
        let delayed = latencies
            .iter()
            .filter(|l| **l > Duration::from_millis(1))
            .count();
        // Closed loop would record one slow request. Here request k (due at k ms) is answered
        // at 100 + 0.1·k ms until the backlog clears near k = 111: about 110 delayed.
        assert!((105..=112).contains(&delayed), "{delayed} delayed requests");
        assert_eq!(latencies[0], Duration::from_millis(100));
        assert_eq!(
            latencies[1],
            Duration::from_micros(99_100),
            "due at 1 ms, sent at 100 ms, answered at 100.1 ms"
        );
        // Once caught up, the schedule holds and the latency is the service time again.
        assert_eq!(latencies[199], Duration::from_micros(100));
    }

    #[test]
    fn due_times_do_not_slip_and_restart_per_segment() {
        let mut schedule = Schedule::new(1, 2, 100.0);
        let grid: Vec<Duration> = (0..5).map(|_| schedule.take_due()).collect();
        assert_eq!(grid[0], Duration::from_millis(10));
        assert_eq!(grid[4] - grid[3], Duration::from_millis(20));
        schedule.restart();
        assert_eq!(
            schedule.take_due(),
            grid[0],
            "a new segment starts the grid again"
        );
        let now = Instant::now();
        assert_eq!(plan(now, now), Plan::SendNow { since: now });
        let later = now + Duration::from_millis(1);
        assert_eq!(plan(later, now), Plan::WaitUntil(later));
    }

    #[test]
    fn merged_slices_keep_the_mean_and_each_slice() {
        let slice = |requests, seconds| LoadResult {
            requests,
            seconds,
            slice_throughputs: vec![requests as f64 / seconds],
            ..LoadResult::empty()
        };
        let mut total = LoadResult::empty();
        assert!(total.median_slice_throughput().abs() < 1e-9);
        for requests in [1000, 10, 900] {
            total.merge(&slice(requests, 1.0));
        }
        assert_eq!(total.requests, 1910);
        assert!((total.throughput() - 1910.0 / 3.0).abs() < 1e-9);
        assert!(
            (total.median_slice_throughput() - 900.0).abs() < 1e-9,
            "the starved slice does not pull it down"
        );
        total.merge(&slice(800, 1.0));
        assert!((total.median_slice_throughput() - 850.0).abs() < 1e-9);
    }

    #[test]
    fn paced_rates_are_checked() {
        assert!(run_paced(&[], &[1.0]).is_err());
    }
}
