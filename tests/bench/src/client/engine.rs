//! The load generator's core: one io_uring driving a server's C connections, each keeping a
//! batch of `depth` pipelined requests in flight (sent together, answered before the next).
//!
//! Sends and receives of all connections go in with one `io_uring_enter` that also waits for
//! the next completions, so the client spends few syscalls per request and does not become the
//! bottleneck of a one-core server. Every mode shares this loop; the mode (codec.rs) only
//! encodes requests and decodes replies. TLS is rustls' buffered session between the sockets'
//! bytes and the mode; UDP sends each request as a datagram of its own and gives up on a batch
//! not answered within `LOST_AFTER` (its missing replies count as lost).
//!
//! Each request's latency is its reply's arrival minus its batch's start (closed loop: the
//! send; paced: the batch's due time, see pace.rs).

use super::codec::{Codec, Decoded, Tally};
use super::conn::{open, Conn, Link};
use super::pace::{plan, Plan, Schedule};
use super::{LoadResult, LoadSpec, Mode};
use crate::hist::{nanos, Histogram};
use crate::procs;
use anyhow::{bail, Context, Result};
use io_uring::{opcode, squeue, types, IoUring};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io::Write;
use std::time::{Duration, Instant};

/// A server that leaves a batch unanswered this long after a slice is stuck.
const DRAIN_LIMIT: Duration = Duration::from_secs(3);
/// The longest one wait for completions blocks.
const WAIT_MAX: Duration = Duration::from_millis(50);
/// UDP: a batch with replies missing this long after its send is given up (they count lost).
const LOST_AFTER: Duration = Duration::from_millis(200);

const SEND: u64 = 0;
const RECV: u64 = 1;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    Warmup,
    Measure,
    Drain,
}

/// The counters of the segment's measured window.
#[derive(Default)]
struct Counts {
    requests: u64,
    misses: u64,
    errors: u64,
    lost: u64,
}

/// One server's connections and the ring that drives them.
pub(super) struct Generator {
    spec: LoadSpec,
    codec: Codec,
    ring: IoUring,
    conns: Vec<Conn>,
    scratch: Vec<u8>,
    phase: Phase,
    queued_ops: usize,
    active: usize,
    hist: Histogram,
    counts: Counts,
    /// Paced mode: connections between batches, by due time (earliest first).
    waiting: BinaryHeap<Reverse<(Instant, usize)>>,
    /// The current segment's start, the origin of every schedule.
    segment_start: Instant,
    /// Completions reaped from the ring, reused (at most one per queued operation).
    completions: Vec<(u64, i32)>,
}

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
    /// Opens `spec.conns` connections (TLS handshakes finished); `rate`: paced at that many
    /// requests per second in all, else closed loop.
    pub(super) fn new(spec: &LoadSpec, rate: Option<f64>) -> Result<Self> {
        if spec.depth == 0 || spec.conns == 0 || spec.keyspace == 0 {
            bail!("depth, conns and keyspace must be positive");
        }
        let batches_per_second = rate.map(|r| r / spec.depth as f64);
        let rx_len = 64 * 1024 + 2 * spec.depth * (spec.mode.value_len() + 64);
        let codec = Codec::new(&spec.mode);
        let mut conns = Vec::with_capacity(spec.conns);
        for index in 0..spec.conns {
            conns.push(Conn {
                link: open(spec)?,
                tx: Vec::with_capacity(spec.depth * (spec.mode.value_len() + 64)),
                tx_sent: 0,
                marks: Vec::with_capacity(if codec.datagrams() { spec.depth } else { 0 }),
                sends_queued: 0,
                rx: vec![0; rx_len],
                rx_start: 0,
                rx_end: 0,
                recv_queued: false,
                replies: 0,
                since: Instant::now(),
                sent_wall: Instant::now(),
                out: false,
                active: true,
                sent_count: 0,
                schedule: batches_per_second.map(|b| Schedule::new(index, spec.conns, b)),
                budget: None,
            });
        }
        // Each connection queues one receive and one send, or a datagram per request.
        let per_conn = if codec.datagrams() { spec.depth + 1 } else { 2 };
        let entries = u32::try_from(spec.conns.saturating_mul(per_conn))
            .context("connection count")?
            .saturating_add(8)
            .next_power_of_two()
            .clamp(64, 32768);
        Ok(Generator {
            spec: spec.clone(),
            codec,
            ring: build_ring(entries)?,
            conns,
            scratch: Vec::new(),
            phase: Phase::Warmup,
            queued_ops: 0,
            active: 0,
            hist: Histogram::default(),
            counts: Counts::default(),
            waiting: BinaryHeap::with_capacity(spec.conns),
            segment_start: Instant::now(),
            completions: Vec::with_capacity(spec.conns * per_conn),
        })
    }

    fn key(&self, index: usize, n: usize) -> usize {
        let tls = matches!(self.spec.mode, Mode::Tls { .. });
        key_of(tls, self.spec.keyspace, self.spec.conns, index, n)
    }
}

/// The key of connection `index`'s `n`-th request: the memcache cells walk the keyspace one
/// by one from an even share of it apart per connection, the TLS part in strides of a prime
/// from `131·index`.
fn key_of(tls: bool, keyspace: usize, conns: usize, index: usize, n: usize) -> usize {
    if tls {
        index
            .wrapping_mul(131)
            .wrapping_add(n.wrapping_mul(7919))
            .checked_rem(keyspace)
            .unwrap_or(0)
    } else {
        (index * keyspace / conns.max(1) + n) % keyspace.max(1)
    }
}

/// One segment's time marks and the readings taken at its measured window's edges.
struct Window {
    measure_from: Instant,
    measure_until: Instant,
    start: Instant,
    end: Instant,
    server_cpu: f64,
    client_cpu: f64,
    cores: [(procs::CoreTicks, procs::CoreTicks); 2],
    drain_until: Option<Instant>,
}

impl Generator {
    /// Runs every connection for `warmup`, then measures for `measure`, then lets every batch
    /// in flight finish so the next segment (or close) starts from idle connections.
    pub(super) fn segment(&mut self, warmup: Duration, measure: Duration) -> Result<LoadResult> {
        let start = Instant::now();
        let mut w = Window {
            measure_from: start + warmup,
            measure_until: start + warmup + measure,
            start: start + warmup,
            end: start + warmup + measure,
            server_cpu: 0.0,
            client_cpu: 0.0,
            cores: Default::default(),
            drain_until: None,
        };
        self.phase = Phase::Warmup;
        self.segment_start = start;
        self.waiting.clear();
        for index in 0..self.conns.len() {
            self.conns[index].active = true;
            self.conns[index].budget = None;
            if let Some(schedule) = self.conns[index].schedule.as_mut() {
                schedule.restart();
            }
            self.next_batch(index, start)?;
        }
        self.active = self.conns.len();
        loop {
            self.submit_and_wait()?;
            let now = Instant::now();
            self.advance_phase(&mut w, now)?;
            if self.phase == Phase::Drain && self.active == 0 {
                break;
            }
            self.check_stuck(&w, now)?;
            self.reap(now)?;
            self.give_up_lost(now)?;
            self.start_due_batches()?;
        }
        Ok(self.result(&w))
    }

    /// Handles every completion the ring holds; returns how many there were.
    fn reap(&mut self, now: Instant) -> Result<usize> {
        let mut completions = std::mem::take(&mut self.completions);
        completions.clear();
        completions.extend(self.ring.completion().map(|c| (c.user_data(), c.result())));
        self.queued_ops -= completions.len();
        let mut outcome = Ok(completions.len());
        for &(user_data, result) in &completions {
            let index = (user_data >> 1) as usize;
            let handled = if user_data & 1 == SEND {
                self.on_send(index, result, now)
            } else {
                self.on_recv(index, result, now)
            };
            if let Err(e) = handled {
                outcome = Err(e);
                break;
            }
        }
        self.completions = completions;
        outcome
    }

    /// Counted passes (no clock: icount's servers run under valgrind): switches the cell to
    /// `mode` at `depth` (the connections stay open and their key walks go on), sends `batches`
    /// batches on every connection, closed loop, and returns once all are answered. Fails
    /// when no completion comes for `patience`.
    pub(super) fn exact(
        &mut self,
        mode: &Mode,
        depth: usize,
        batches: usize,
        patience: Duration,
    ) -> Result<LoadResult> {
        if depth == 0 {
            bail!("depth must be positive");
        }
        (self.spec.mode, self.spec.depth) = (mode.clone(), depth);
        self.codec = Codec::new(mode);
        self.phase = Phase::Measure;
        self.hist.clear();
        self.counts = Counts::default();
        let now = Instant::now();
        for index in 0..self.conns.len() {
            self.conns[index].active = true;
            self.conns[index].budget = Some(batches);
        }
        self.active = self.conns.len();
        for index in 0..self.conns.len() {
            self.next_batch(index, now)?;
        }
        let mut heard = Instant::now();
        while self.active > 0 {
            self.submit_and_wait()?;
            let now = Instant::now();
            if self.reap(now)? > 0 {
                heard = now;
            } else if now - heard > patience {
                bail!("no reply for {} s", patience.as_secs_f64());
            }
            self.give_up_lost(now)?;
        }
        Ok(LoadResult {
            requests: self.counts.requests,
            misses: self.counts.misses,
            errors: self.counts.errors,
            lost: self.counts.lost,
            hist: self.hist.clone(),
            ..LoadResult::empty()
        })
    }

    fn advance_phase(&mut self, w: &mut Window, now: Instant) -> Result<()> {
        if self.phase == Phase::Warmup && now >= w.measure_from {
            self.phase = Phase::Measure;
            self.hist.clear();
            self.counts = Counts::default();
            w.start = now;
            w.server_cpu = procs::process_cpu_seconds(self.spec.server_pid)?;
            w.client_cpu = procs::thread_cpu_seconds()?;
            w.cores[0] = procs::core_ticks()?;
        } else if self.phase == Phase::Measure && now >= w.measure_until {
            self.phase = Phase::Drain;
            w.end = now;
            w.server_cpu = procs::process_cpu_seconds(self.spec.server_pid)? - w.server_cpu;
            w.client_cpu = procs::thread_cpu_seconds()? - w.client_cpu;
            w.cores[1] = procs::core_ticks()?;
            w.drain_until = Some(now + DRAIN_LIMIT);
            // Connections waiting for their next due time have nothing out: done.
            for Reverse((_, index)) in self.waiting.drain() {
                self.conns[index].active = false;
                self.conns[index].out = false;
                self.active -= 1;
            }
        }
        Ok(())
    }

    /// Fails a segment whose batches stay unanswered past the drain limit (bounded waits).
    fn check_stuck(&self, w: &Window, now: Instant) -> Result<()> {
        if w.drain_until.is_some_and(|d| now >= d) || now > w.measure_until + DRAIN_LIMIT * 2 {
            bail!(
                "{} batches still unanswered {} s after the slice ({} {} B, depth {}, port {})",
                self.active,
                DRAIN_LIMIT.as_secs(),
                self.spec.mode.name(),
                self.spec.mode.value_len(),
                self.spec.depth,
                self.spec.port
            );
        }
        Ok(())
    }

    fn result(&self, w: &Window) -> LoadResult {
        let seconds = (w.end - w.start).as_secs_f64();
        LoadResult {
            slice_throughputs: vec![self.counts.requests as f64 / seconds],
            requests: self.counts.requests,
            seconds,
            hist: self.hist.clone(),
            server_cpu_seconds: w.server_cpu,
            client_cpu_seconds: w.client_cpu,
            misses: self.counts.misses,
            errors: self.counts.errors,
            lost: self.counts.lost,
            server_core: procs::CoreUse::between(&w.cores[0].0, &w.cores[1].0),
            client_core: procs::CoreUse::between(&w.cores[0].1, &w.cores[1].1),
        }
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
            // Every entry points into a connection's tx, rx or cipher buffer; those are never
            // reallocated while an operation into them is queued, and close() reaps every
            // queued operation before the connections are dropped.
            // SAFETY: the buffers each entry points into outlive the operation (above).
            if unsafe { self.ring.submission().push(&entry) }.is_ok() {
                self.queued_ops += 1;
                return Ok(());
            }
            self.ring.submit().context("io_uring_enter")?;
        }
    }
}

impl Generator {
    /// Closed loop: starts connection `index`'s next batch now. Paced: starts it now if it is
    /// already due (timed from its due time), else queues it for its due time.
    fn next_batch(&mut self, index: usize, now: Instant) -> Result<()> {
        if let Some(left) = self.conns[index].budget.as_mut() {
            if *left == 0 {
                self.conns[index].active = false;
                self.active -= 1;
                return Ok(());
            }
            *left -= 1;
        }
        self.conns[index].out = true;
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

    /// Encodes and sends connection `index`'s next batch; its latencies count from `since`.
    fn start_batch(&mut self, index: usize, since: Instant) -> Result<()> {
        let datagrams = self.codec.datagrams();
        self.scratch.clear();
        let first = self.conns[index].sent_count;
        let mut marks = std::mem::take(&mut self.conns[index].marks);
        marks.clear();
        for n in first..first + self.spec.depth {
            let key = self.key(index, n);
            self.codec.encode(index, &mut self.scratch, key);
            if datagrams {
                marks.push(self.scratch.len());
            }
        }
        let conn = &mut self.conns[index];
        conn.marks = marks;
        conn.sent_count = first + self.spec.depth;
        conn.tx.clear();
        match &mut conn.link {
            Link::Tls { session, .. } => {
                session.writer().write_all(&self.scratch)?;
                while session.wants_write() {
                    session.write_tls(&mut conn.tx).context("TLS records")?;
                }
            }
            _ => conn.tx.extend_from_slice(&self.scratch),
        }
        conn.tx_sent = 0;
        conn.replies = 0;
        conn.since = since;
        conn.sent_wall = Instant::now();
        self.queue_send(index)?;
        if !self.conns[index].recv_queued {
            self.queue_recv(index)?;
        }
        Ok(())
    }

    /// Queues the rest of the batch: one send of the stream's unsent bytes, or one per
    /// unsent datagram.
    fn queue_send(&mut self, index: usize) -> Result<()> {
        let conn = &self.conns[index];
        let fd = types::Fd(conn.link.fd());
        let user_data = (index as u64) << 1 | SEND;
        let mut entries = Vec::new();
        if matches!(conn.link, Link::Udp(_)) {
            let mut from = conn.marks[..conn.tx_sent].last().copied().unwrap_or(0);
            for &to in &conn.marks[conn.tx_sent..] {
                let datagram = &conn.tx[from..to];
                entries.push(opcode::Send::new(
                    fd,
                    datagram.as_ptr(),
                    sqe_len(datagram.len()),
                ));
                from = to;
            }
        } else {
            let rest = &conn.tx[conn.tx_sent..];
            entries.push(opcode::Send::new(fd, rest.as_ptr(), sqe_len(rest.len())));
        }
        for send in entries {
            let entry = send.flags(libc::MSG_NOSIGNAL).build().user_data(user_data);
            self.conns[index].sends_queued += 1;
            self.push(entry)?;
        }
        Ok(())
    }

    fn queue_recv(&mut self, index: usize) -> Result<()> {
        let conn = &mut self.conns[index];
        let (ptr, len) = match &mut conn.link {
            Link::Tls { cipher, .. } => (cipher.as_mut_ptr(), cipher.len()),
            Link::Udp(_) => {
                // A datagram is parsed alone, and whatever of it was not a reply dropped.
                (conn.rx_start, conn.rx_end) = (0, 0);
                (conn.rx.as_mut_ptr(), conn.rx.len())
            }
            Link::Tcp(_) => {
                conn.make_room()?;
                let spare = &mut conn.rx[conn.rx_end..];
                (spare.as_mut_ptr(), spare.len())
            }
        };
        let entry = opcode::Recv::new(types::Fd(conn.link.fd()), ptr, sqe_len(len))
            .build()
            .user_data((index as u64) << 1 | RECV);
        conn.recv_queued = true;
        self.push(entry)
    }
}

impl Generator {
    fn on_send(&mut self, index: usize, result: i32, now: Instant) -> Result<()> {
        let conn = &mut self.conns[index];
        conn.sends_queued -= 1;
        let udp = matches!(conn.link, Link::Udp(_));
        if result < 0 {
            let error = std::io::Error::from_raw_os_error(-result);
            // A full socket buffer drops the datagram: its reply never comes, and the batch
            // is given up after LOST_AFTER like any other loss.
            if !(udp && matches!(-result, libc::EAGAIN | libc::ENOBUFS)) {
                bail!("send: {error}");
            }
        }
        if udp {
            conn.tx_sent += 1;
        } else {
            conn.tx_sent += result as usize;
            if conn.tx_sent < conn.tx.len() {
                return self.queue_send(index);
            }
        }
        if conn.all_sent() && conn.replies == self.spec.depth {
            return self.finish_batch(index, now);
        }
        Ok(())
    }

    fn on_recv(&mut self, index: usize, result: i32, now: Instant) -> Result<()> {
        let conn = &mut self.conns[index];
        conn.recv_queued = false;
        if result < 0 {
            bail!("recv: {}", std::io::Error::from_raw_os_error(-result));
        }
        let udp = matches!(conn.link, Link::Udp(_));
        if result == 0 && !udp {
            if self.phase == Phase::Drain && !conn.active {
                return Ok(());
            }
            bail!("the server closed a connection mid-batch");
        }
        let n = result as usize;
        if matches!(conn.link, Link::Tls { .. }) {
            conn.decrypt(n)?;
        } else {
            conn.rx_end += n;
        }
        self.parse(index, now)?;
        let conn = &self.conns[index];
        if conn.replies == self.spec.depth && conn.out {
            // Everything answered; the batch ends once its sends are reaped too.
            if conn.all_sent() {
                return self.finish_batch(index, now);
            }
            return Ok(());
        }
        if conn.active || conn.out {
            return self.queue_recv(index);
        }
        Ok(())
    }

    /// Counts every whole reply in connection `index`'s receive buffer.
    fn parse(&mut self, index: usize, now: Instant) -> Result<()> {
        let measuring = self.phase == Phase::Measure;
        let conn = &mut self.conns[index];
        let latency = nanos(now - conn.since);
        while conn.rx_start < conn.rx_end || self.codec.datagrams() {
            let Some((decoded, used)) = self.codec.decode(&conn.rx[conn.rx_start..conn.rx_end])?
            else {
                break;
            };
            conn.rx_start += used;
            let Decoded::Reply(tally) = decoded else {
                if self.codec.datagrams() {
                    break;
                }
                continue;
            };
            conn.replies += 1;
            if measuring {
                self.counts.requests += 1;
                self.hist.record(latency);
                match tally {
                    Tally::Miss => self.counts.misses += 1,
                    Tally::Error => self.counts.errors += 1,
                    Tally::Fine => {}
                }
            }
            if self.codec.datagrams() {
                break;
            }
        }
        if conn.replies > self.spec.depth {
            bail!("more replies than requests: the server's replies are out of step");
        }
        Ok(())
    }

    /// UDP: gives up every batch sent longer than `LOST_AFTER` ago with replies missing.
    fn give_up_lost(&mut self, now: Instant) -> Result<()> {
        if !self.codec.datagrams() {
            return Ok(());
        }
        for index in 0..self.conns.len() {
            let conn = &self.conns[index];
            let overdue = now.saturating_duration_since(conn.sent_wall) > LOST_AFTER;
            let waiting = self.waiting.iter().any(|Reverse((_, i))| *i == index);
            if !conn.out || !conn.all_sent() || !overdue || waiting {
                continue;
            }
            let lost = self.codec.forget(index);
            if self.phase == Phase::Measure {
                self.counts.lost += lost;
            }
            self.finish_batch(index, now)?;
        }
        Ok(())
    }

    fn finish_batch(&mut self, index: usize, now: Instant) -> Result<()> {
        self.conns[index].out = false;
        if self.phase == Phase::Drain {
            self.conns[index].active = false;
            self.active -= 1;
            return Ok(());
        }
        self.next_batch(index, now)
    }

    /// Shuts the sockets down so queued receives complete, and reaps every queued operation
    /// (bounded) before the buffers they point into are freed.
    pub(super) fn close(&mut self) {
        for conn in &self.conns {
            conn.link.shutdown();
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
pub(crate) fn sqe_len(len: usize) -> u32 {
    u32::try_from(len).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::key_of;

    #[test]
    fn key_walks_are_the_cells_own() {
        let walk = |tls, index| {
            (0..4)
                .map(|n| key_of(tls, 100, 4, index, n))
                .collect::<Vec<_>>()
        };
        assert_eq!(walk(false, 0), [0, 1, 2, 3]);
        assert_eq!(walk(false, 3), [75, 76, 77, 78]);
        assert_eq!(key_of(false, 100, 4, 3, 25), 0, "wraps at the keyspace");
        assert_eq!(walk(true, 2), [62, 81, 0, 19], "131·2 + 7919·n mod 100");
    }
}
