//! One pinned worker: an io_uring event loop serving its connections end to end.
//!
//! Each loop iteration submits every queued operation and reaps every completion with a
//! single `io_uring_enter`, so one system call serves many connections. Receives use the
//! worker's provided-buffer ring (buffers go back to the kernel as soon as the session has
//! consumed them); a connection's output buffer is reused across requests. Reading and
//! writing alternate per connection: while replies are in flight the connection does not
//! read, which is the backpressure `Flow::Drain` asks for and keeps output bounded.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::SyncSender;
use std::sync::Arc;

use io_uring::{cqueue, opcode, squeue, types, IoUring};
use ringstore_service::{Flow, Now, Protocol};

use crate::bufring::BufRing;
use crate::clock::Clock;
use crate::conn::{Conn, Slab, GEN_MASK};
use crate::durable::{
    DiskWorker, OP_DISK_COMPACT_READ, OP_DISK_ERASE, OP_DISK_ERASE_FLUSH, OP_DISK_FLUSH,
    OP_DISK_WRITE, OP_WAKE,
};
use crate::handler::Handler;
use crate::inbox::Inbox;
use crate::linger::{Linger, Next};
use crate::ring::Features;

const OP_RECV: u64 = 1;
const OP_SEND: u64 = 2;
const OP_TICK: u64 = 3;
const OP_INBOX: u64 = 4;
const OP_ACCEPT: u64 = 5;
const OP_CANCEL: u64 = 6;

/// Provided receive buffers per worker and their size.
const BUF_COUNT: u16 = 256;
/// IORING_RECVSEND_POLL_FIRST (recv/send ioprio flag, Linux 5.19).
const RECVSEND_POLL_FIRST: u16 = 1;
const BUF_SIZE: usize = 16 << 10;

fn user_data(slot: u32, generation: u32, op: u64) -> u64 {
    ((slot as u64) << 32) | (((generation & GEN_MASK) as u64) << 8) | op
}

/// Limits every worker enforces.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub max_conns: usize,
    /// 0 = never.
    pub idle_timeout_ms: u64,
    pub request_timeout_ms: u64,
    /// A connection whose pending output grows past this is closed.
    pub out_hard_cap: usize,
    /// How long a stopping worker lets in-flight requests finish.
    pub drain_deadline_ms: u64,
    pub tick_ms: u64,
    /// Use provided-buffer rings when the kernel has them (tests turn it off to cover the fallback).
    pub allow_buf_ring: bool,
}

/// Everything a worker thread is started with.
pub(crate) struct WorkerSetup<H: Handler> {
    pub index: usize,
    pub cpu: Option<usize>,
    pub handler: Arc<H>,
    pub inbox: Arc<Inbox>,
    pub stop: Arc<AtomicBool>,
    /// Open connections across all workers (for `--max-conns`).
    pub open: Arc<AtomicUsize>,
    pub limits: Limits,
    pub clock: Clock,
    /// Reuseport placement: this worker's own listeners.
    pub listeners: Vec<(OwnedFd, Protocol)>,
    /// This worker runs the expiry reaper.
    pub reaper: bool,
    /// The data device, when `--data` is on: this worker drives region `index`.
    pub data: Option<Arc<ringstore_durable::Serving<ringstore_durable::FileDevice>>>,
}

struct Worker<H: Handler> {
    // Field order matters: the ring is dropped (and its buffer registration released) before the pool.
    ring: IoUring,
    bufs: Option<BufRing>,
    conns: Slab<H::Session>,
    pending: Vec<squeue::Entry>,
    completions: Vec<(u64, i32, u32)>,
    new_conns: Vec<(OwnedFd, Protocol)>,
    setup: WorkerSetup<H>,
    /// The 8-byte target of the eventfd read; leaked so a read cancelled at teardown can never write freed memory.
    inbox_word: *mut u64,
    tick: Box<types::Timespec>,
    now: Now,
    stopping_deadline: Option<u64>,
    /// Per reuseport listener: an accept is in flight.
    accept_armed: Vec<bool>,
    accept_backoff_until: u64,
    last_reclaim_ms: u64,
    /// Link each connection's next receive behind its send (off: RINGSTORE_NO_LINK, for measurement).
    link_recv: bool,
    /// Most connections open at once on this worker (logged at stop: placement balance).
    peak_conns: usize,
    /// Receives queued behind sends poll first (off: RINGSTORE_NO_POLL_FIRST, for measurement).
    poll_first: bool,
    /// This worker's region log, when a data device is on (None: RAM only, no extra work).
    disk: Option<DiskWorker>,
}

/// Runs a worker on the current thread until it has stopped; reports its features (or why it
/// could not start) through `ready` first.
/// Returns the most connections the worker had open at once.
pub(crate) fn run<H: Handler>(
    setup: WorkerSetup<H>,
    ready: SyncSender<Result<Features, String>>,
) -> usize {
    if let Some(cpu) = setup.cpu {
        if let Err(err) = crate::sys::set_affinity(&[cpu]) {
            let _ = ready.send(Err(format!(
                "worker {}: cannot pin to CPU {cpu}: {err}",
                setup.index
            )));
            return 0;
        }
    }
    let (ring, mut features) = match crate::ring::build() {
        Ok(built) => built,
        Err(err) => {
            let _ = ready.send(Err(format!(
                "worker {}: io_uring_setup failed: {err}",
                setup.index
            )));
            return 0;
        }
    };
    if !crate::ring::supports_needed_ops(&ring) {
        let _ = ready.send(Err(format!(
            "worker {}: this kernel's io_uring lacks recv/send/accept/timeout",
            setup.index
        )));
        return 0;
    }
    let bufs = if setup.limits.allow_buf_ring {
        BufRing::register(&ring, BUF_COUNT, BUF_SIZE).ok()
    } else {
        None
    };
    features.buf_ring = bufs.is_some();
    let now = setup.clock.now();
    let disk = match &setup.data {
        Some(serving) => match DiskWorker::install(serving.clone(), setup.index) {
            Some(disk) => Some(disk),
            None => {
                let _ = ready.send(Err(format!(
                    "worker {}: the data device has no free region for it",
                    setup.index
                )));
                return 0;
            }
        },
        None => None,
    };
    let mut worker = Worker {
        ring,
        bufs,
        conns: Slab::new(),
        pending: Vec::with_capacity(256),
        completions: Vec::with_capacity(256),
        new_conns: Vec::new(),
        inbox_word: Box::leak(Box::new(0u64)),
        tick: Box::new(
            types::Timespec::new()
                .sec(setup.limits.tick_ms / 1000)
                .nsec(((setup.limits.tick_ms % 1000) * 1_000_000) as u32),
        ),
        setup,
        now,
        stopping_deadline: None,
        accept_armed: Vec::new(),
        accept_backoff_until: 0,
        last_reclaim_ms: now.mono_ms,
        link_recv: std::env::var_os("RINGSTORE_NO_LINK").is_none(),
        peak_conns: 0,
        poll_first: std::env::var_os("RINGSTORE_NO_POLL_FIRST").is_none(),
        disk,
    };
    let _ = ready.send(Ok(features));
    worker.serve();
    if let Some(disk) = &worker.disk {
        disk.uninstall();
    }
    worker.peak_conns
}

impl<H: Handler> Worker<H> {
    fn serve(&mut self) {
        self.arm_inbox();
        self.arm_tick();
        self.accept_armed = vec![false; self.setup.listeners.len()];
        for i in 0..self.setup.listeners.len() {
            self.arm_accept(i);
        }
        loop {
            if let Err(err) = self.submit_and_wait() {
                eprintln!(
                    "ringstore: worker {}: io_uring_enter failed: {err}; closing its connections",
                    self.setup.index
                );
                break;
            }
            self.now = self.setup.clock.now();
            self.reap();
            if self.stopping_deadline.is_none() && self.setup.stop.load(Ordering::Acquire) {
                self.begin_stop();
            }
            if let Some(disk) = &mut self.disk {
                // Background compaction, one bounded step; its copies join this iteration's batch.
                let may_start = self.stopping_deadline.is_none();
                if disk.compact_step(
                    &mut self.pending,
                    self.now.unix,
                    self.now.mono_ms,
                    may_start,
                ) {
                    self.pending
                        .push(opcode::Nop::new().build().user_data(OP_WAKE));
                }
                // Group commit: everything staged this iteration goes out as one write + one flush.
                disk.pump(&mut self.pending);
            }
            if self.stopping_deadline.is_some()
                && self.conns.live() == 0
                && !self.accept_armed.contains(&true)
                && self.disk.as_ref().is_none_or(DiskWorker::is_idle)
            {
                break;
            }
        }
        // Whatever is left (only after a ring failure) is closed without ceremony.
        for slot in 0..self.conns.capacity_slots() as u32 {
            if self.conns.remove(slot).is_some() {
                self.forget_connection();
            }
        }
        let _ = self.ring.submitter().unregister_buf_ring(BufRing::GROUP);
    }

    /// Pushes queued entries (submitting early if the SQ is full), then one enter that also waits.
    fn submit_and_wait(&mut self) -> std::io::Result<()> {
        let mut next = 0;
        while next < self.pending.len() {
            {
                let mut sq = self.ring.submission();
                while next < self.pending.len() {
                    // Output buffers and own receive buffers are not touched or freed while their op
                    // is in flight, the pool lives as long as the ring, the inbox word is leaked, the
                    // timespec is copied by the kernel at submission, data-device batch buffers
                    // stay in `DiskWorker::inflight` until their completion (the device fd with them),
                    // and the compactor's erase block and read buffer stay put until theirs.
                    // SAFETY: every entry points only at memory that outlives its completion (above).
                    if unsafe { sq.push(&self.pending[next]) }.is_err() {
                        break;
                    }
                    next += 1;
                }
            }
            if next < self.pending.len() {
                self.enter(0)?;
            }
        }
        self.pending.clear();
        self.enter(1)
    }

    fn enter(&self, want: usize) -> std::io::Result<()> {
        match self.ring.submit_and_wait(want) {
            Ok(_) => Ok(()),
            Err(err)
                if matches!(
                    err.raw_os_error(),
                    Some(libc::EINTR) | Some(libc::EBUSY) | Some(libc::EAGAIN)
                ) =>
            {
                Ok(())
            }
            Err(err) => Err(err),
        }
    }

    fn reap(&mut self) {
        let mut completions = std::mem::take(&mut self.completions);
        completions.extend(
            self.ring
                .completion()
                .map(|c| (c.user_data(), c.result(), c.flags())),
        );
        for &(data, res, flags) in &completions {
            let slot = (data >> 32) as u32;
            let generation = ((data >> 8) as u32) & GEN_MASK;
            match data & 0xFF {
                OP_RECV => self.on_recv(slot, generation, res, flags),
                OP_SEND => self.on_send(slot, generation, res),
                OP_TICK => self.on_tick(),
                OP_INBOX => self.on_inbox(),
                OP_ACCEPT => self.on_accept(slot as usize, res),
                op @ (OP_DISK_WRITE | OP_DISK_FLUSH) => self.on_disk(op, data >> 8, res),
                op @ (OP_DISK_ERASE | OP_DISK_ERASE_FLUSH) => {
                    if let Some(disk) = &mut self.disk {
                        disk.erase_complete(op, res, self.now.mono_ms);
                    }
                }
                OP_DISK_COMPACT_READ => {
                    if let Some(disk) = &mut self.disk {
                        disk.read_complete(data >> 8, res, self.now.mono_ms);
                    }
                }
                OP_WAKE => {}
                _ => {}
            }
        }
        completions.clear();
        self.completions = completions;
    }

    // ---- arming operations ----

    fn arm_tick(&mut self) {
        let entry = opcode::Timeout::new(&*self.tick as *const types::Timespec)
            .build()
            .user_data(OP_TICK);
        self.pending.push(entry);
    }

    fn arm_inbox(&mut self) {
        let entry = opcode::Read::new(
            types::Fd(self.setup.inbox.eventfd()),
            self.inbox_word.cast(),
            8,
        )
        .build()
        .user_data(OP_INBOX);
        self.pending.push(entry);
    }

    fn arm_accept(&mut self, index: usize) {
        let fd = self.setup.listeners[index].0.as_raw_fd();
        let entry = opcode::Accept::new(types::Fd(fd), std::ptr::null_mut(), std::ptr::null_mut())
            .flags(libc::SOCK_CLOEXEC)
            .build()
            .user_data(user_data(index as u32, 0, OP_ACCEPT));
        self.pending.push(entry);
        self.accept_armed[index] = true;
    }

    fn arm_recv(&mut self, slot: u32) {
        self.arm_recv_with(slot, 0);
    }

    /// `ioprio` may carry IORING_RECVSEND_POLL_FIRST: for a receive queued behind a send the
    /// request has just been answered, so the peer's next one is not there yet; polling first
    /// skips a receive attempt that would only find the socket empty.
    fn arm_recv_with(&mut self, slot: u32, ioprio: u16) {
        let generation = self.conns.generation(slot);
        let pooled = self.bufs.is_some();
        let Some(conn) = self.conns.get_mut(slot, generation) else {
            return;
        };
        let fd = types::Fd(conn.fd.as_raw_fd());
        let entry = if pooled {
            opcode::Recv::new(fd, std::ptr::null_mut(), BUF_SIZE as u32)
                .buf_group(BufRing::GROUP)
                .ioprio(ioprio)
                .build()
                .flags(squeue::Flags::BUFFER_SELECT)
        } else {
            let buf = conn.own_buf.as_mut().expect("own buffer without a pool");
            opcode::Recv::new(fd, buf.as_mut_ptr(), buf.len() as u32)
                .ioprio(ioprio)
                .build()
        };
        conn.recv_armed = true;
        self.pending
            .push(entry.user_data(user_data(slot, generation, OP_RECV)));
    }

    /// Sends the rest of `out`. When the connection will read next (`Flow::Continue`), the
    /// receive is linked behind the send and goes in the same submission: one enter per
    /// request instead of two. A short send breaks the link (the receive completes with
    /// ECANCELED) and the remainder is sent first.
    fn arm_send(&mut self, slot: u32) {
        let generation = self.conns.generation(slot);
        let Some(conn) = self.conns.get_mut(slot, generation) else {
            return;
        };
        let rest = &conn.out[conn.sent..];
        let len = rest.len().min(u32::MAX as usize) as u32;
        let link_recv = self.link_recv
            && conn.after_send == Flow::Continue
            && !conn.recv_armed
            && self.stopping_deadline.is_none();
        let mut entry = opcode::Send::new(types::Fd(conn.fd.as_raw_fd()), rest.as_ptr(), len)
            .flags(libc::MSG_NOSIGNAL)
            .build()
            .user_data(user_data(slot, generation, OP_SEND));
        if link_recv {
            entry = entry.flags(squeue::Flags::IO_LINK);
        }
        conn.send_armed = true;
        self.pending.push(entry);
        if link_recv {
            // POLL_FIRST exists from 5.19, like provided-buffer rings: use it only with them.
            let ioprio = if self.bufs.is_some() && self.poll_first {
                RECVSEND_POLL_FIRST
            } else {
                0
            };
            self.arm_recv_with(slot, ioprio);
        }
    }

    // ---- connection lifecycle ----

    fn open_connection(&mut self, fd: OwnedFd, protocol: Protocol) {
        if self.stopping_deadline.is_some() {
            drop(fd);
            self.forget_connection();
            return;
        }
        crate::sys::set_nodelay(fd.as_raw_fd());
        let own_buf = if self.bufs.is_none() {
            Some(vec![0u8; BUF_SIZE].into_boxed_slice())
        } else {
            None
        };
        let session = self.setup.handler.open(protocol, self.setup.index);
        let (slot, _) =
            self.conns
                .insert(Conn::new(fd, protocol, session, self.now.mono_ms, own_buf));
        self.setup.handler.conn_opened(self.setup.index);
        self.peak_conns = self.peak_conns.max(self.conns.live());
        self.arm_recv(slot);
    }

    /// Accounting for a connection that is gone (closed or dropped before it was served).
    fn forget_connection(&mut self) {
        self.setup.inbox.connection_closed();
        self.setup.open.fetch_sub(1, Ordering::AcqRel);
    }

    /// Closes now if nothing is in flight; otherwise shuts the socket down so in-flight
    /// operations complete promptly and closes when the last one has.
    fn close(&mut self, slot: u32) {
        let Some(conn) = self.conns.at_mut(slot) else {
            return;
        };
        conn.closing = true;
        if conn.in_flight() {
            crate::sys::shutdown(conn.fd.as_raw_fd(), libc::SHUT_RDWR);
        } else {
            self.finish_close(slot);
        }
    }

    /// The session is done and its last reply sent: half-close and discard what the peer
    /// still sends, within bounds, so the reply is not lost to a reset (see `linger.rs`).
    fn linger(&mut self, slot: u32) {
        let now = self.now.mono_ms;
        let Some(conn) = self.conns.at_mut(slot) else {
            return;
        };
        crate::sys::shutdown(conn.fd.as_raw_fd(), libc::SHUT_WR);
        conn.linger = Some(Linger::start(now));
        conn.partial_since_ms = None;
        // The session is over: let it give back what it holds now, not when the socket closes.
        self.setup.handler.session_closed(&mut conn.session);
        if !conn.recv_armed {
            self.arm_recv(slot);
        }
    }

    fn finish_close(&mut self, slot: u32) {
        if let Some(mut conn) = self.conns.remove(slot) {
            if conn.linger.is_none() {
                self.setup.handler.session_closed(&mut conn.session);
            }
            self.setup.handler.conn_closed(self.setup.index);
            self.forget_connection();
        }
    }

    /// Reads again, unless the worker is stopping and no request is half received.
    fn continue_reading(&mut self, slot: u32) {
        let stopping = self.stopping_deadline.is_some();
        let Some(conn) = self.conns.at_mut(slot) else {
            return;
        };
        if stopping && conn.partial_since_ms.is_none() {
            self.close(slot);
        } else {
            self.arm_recv(slot);
        }
    }

    // ---- completions ----

    fn on_recv(&mut self, slot: u32, generation: u32, res: i32, flags: u32) {
        let bid = cqueue::buffer_select(flags);
        let Some(conn) = self.conns.get_mut(slot, generation) else {
            if let (Some(bid), Some(bufs)) = (bid, self.bufs.as_mut()) {
                bufs.recycle(bid);
            }
            return;
        };
        conn.recv_armed = false;
        if conn.closing {
            if let (Some(bid), Some(bufs)) = (bid, self.bufs.as_mut()) {
                bufs.recycle(bid);
            }
            if !conn.in_flight() {
                self.finish_close(slot);
            }
            return;
        }
        if let Some(linger) = &mut conn.linger {
            if let (Some(bid), Some(bufs)) = (bid, self.bufs.as_mut()) {
                bufs.recycle(bid);
            }
            return match linger.on_recv(res, self.now.mono_ms) {
                Next::Read => self.arm_recv(slot),
                Next::Close => self.close(slot),
            };
        }
        if res > 0 {
            let len = res as usize;
            let input: &[u8] = match (bid, &self.bufs) {
                (Some(bid), Some(bufs)) => bufs.filled(bid, len),
                _ => &conn.own_buf.as_deref().expect("own buffer")[..len],
            };
            if self.disk.is_some() {
                DiskWorker::begin_call((slot, generation, conn.protocol));
            }
            let flow =
                self.setup
                    .handler
                    .on_bytes(&mut conn.session, input, self.now, &mut conn.out);
            if let Some(disk) = &mut self.disk {
                hold(disk, conn, slot, generation);
            }
            if let (Some(bid), Some(bufs)) = (bid, self.bufs.as_mut()) {
                bufs.recycle(bid);
            }
            conn.last_active_ms = self.now.mono_ms;
            self.note_partial(slot);
            self.after_input(slot, flow);
            return;
        }
        if let (Some(bid), Some(bufs)) = (bid, self.bufs.as_mut()) {
            bufs.recycle(bid);
        }
        match -res {
            libc::ENOBUFS | libc::EINTR | libc::EAGAIN => self.arm_recv(slot),
            // The send it was linked behind came up short; reading resumes once it is done.
            libc::ECANCELED if conn.send_armed => {}
            libc::ECANCELED => self.continue_reading(slot),
            // 0 = the peer closed (possibly mid-value), or ECONNRESET and friends.
            _ => self.close(slot),
        }
    }

    fn note_partial(&mut self, slot: u32) {
        let now = self.now.mono_ms;
        let handler = &self.setup.handler;
        if let Some(conn) = self.conns.at_mut(slot) {
            if handler.has_partial_request(&conn.session) {
                conn.partial_since_ms.get_or_insert(now);
            } else {
                conn.partial_since_ms = None;
            }
        }
    }

    /// After the session consumed input: send what it produced, or go on per `flow`.
    fn after_input(&mut self, slot: u32, mut flow: Flow) {
        loop {
            let cap = self.setup.limits.out_hard_cap;
            let Some(conn) = self.conns.at_mut(slot) else {
                return;
            };
            if conn.out.len() > cap {
                eprintln!(
                    "ringstore: closing a connection whose pending output passed {cap} bytes"
                );
                self.close(slot);
                return;
            }
            conn.after_send = flow;
            if conn.gate != 0 {
                return; // released by the flush that covers its records (on_disk)
            }
            if !conn.out.is_empty() {
                self.arm_send(slot);
                return;
            }
            match flow {
                Flow::Continue => return self.continue_reading(slot),
                Flow::Close => return self.linger(slot),
                Flow::Drain => {
                    let generation = self.conns.generation(slot);
                    let Some(conn) = self.conns.get_mut(slot, generation) else {
                        return;
                    };
                    if self.disk.is_some() {
                        DiskWorker::begin_call((slot, generation, conn.protocol));
                    }
                    flow = self.setup.handler.on_bytes(
                        &mut conn.session,
                        &[],
                        self.now,
                        &mut conn.out,
                    );
                    if let Some(disk) = &mut self.disk {
                        hold(disk, conn, slot, generation);
                    }
                    if flow == Flow::Drain && conn.out.is_empty() && conn.gate == 0 {
                        flow = Flow::Continue; // nothing to drain: a session bug must not spin the worker
                    }
                    self.note_partial(slot);
                }
            }
        }
    }

    fn on_send(&mut self, slot: u32, generation: u32, res: i32) {
        let now = self.now.mono_ms;
        let Some(conn) = self.conns.get_mut(slot, generation) else {
            return;
        };
        conn.send_armed = false;
        if conn.closing {
            if !conn.in_flight() {
                self.finish_close(slot);
            }
            return;
        }
        if res > 0 {
            conn.sent += res as usize;
            conn.last_active_ms = now;
            if conn.sent < conn.out.len() {
                return self.arm_send(slot); // short send: the rest goes next
            }
            conn.output_flushed();
            self.setup.handler.output_flushed(&mut conn.session);
            match conn.after_send {
                // The linked receive is already armed unless a short send cancelled it.
                Flow::Continue if conn.recv_armed => {
                    if self.stopping_deadline.is_some() && conn.partial_since_ms.is_none() {
                        self.close(slot);
                    }
                }
                Flow::Continue => self.continue_reading(slot),
                Flow::Close => self.linger(slot),
                Flow::Drain => {
                    if self.disk.is_some() {
                        DiskWorker::begin_call((slot, generation, conn.protocol));
                    }
                    let flow = self.setup.handler.on_bytes(
                        &mut conn.session,
                        &[],
                        self.now,
                        &mut conn.out,
                    );
                    if let Some(disk) = &mut self.disk {
                        hold(disk, conn, slot, generation);
                    }
                    self.note_partial(slot);
                    self.after_input(slot, flow);
                }
            }
            return;
        }
        match -res {
            libc::EINTR | libc::EAGAIN => self.arm_send(slot),
            // EPIPE, ECONNRESET, 0: the peer is gone.
            _ => self.close(slot),
        }
    }

    /// A data-device write or flush completed: settle it, fail or release held connections.
    fn on_disk(&mut self, op: u64, id: u64, res: i32) {
        let Some(disk) = &mut self.disk else { return };
        let outcome = disk.complete(op, id, res);
        for (key, cas) in &outcome.forget {
            self.setup.handler.forget_if_cas(key, *cas, self.now);
        }
        let mut failed: HashMap<(u32, u32), crate::durable::FailedSpans> = HashMap::new();
        for (slot, generation, protocol, start, end) in outcome.failed_replies {
            failed
                .entry((slot, generation))
                .or_insert_with(|| (protocol, Vec::new()))
                .1
                .push((start, end));
        }
        for ((slot, generation), (protocol, spans)) in failed {
            if let Some(conn) = self.conns.get_mut(slot, generation) {
                crate::durable::rewrite_failed(&mut conn.out, spans, protocol);
            }
        }
        let mut release = Vec::new();
        while let Some(&(slot, generation, gate)) = disk.waiting.front() {
            if gate > outcome.settled_through {
                break;
            }
            disk.waiting.pop_front();
            release.push((slot, generation));
        }
        for (slot, generation) in release {
            let Some(conn) = self.conns.get_mut(slot, generation) else {
                continue;
            };
            conn.gate = 0;
            if conn.closing {
                if !conn.in_flight() {
                    self.finish_close(slot);
                }
                continue;
            }
            let flow = conn.after_send;
            self.after_input(slot, flow);
        }
    }

    fn on_inbox(&mut self) {
        self.take_inbox();
        self.arm_inbox();
    }

    fn take_inbox(&mut self) {
        let mut fresh = std::mem::take(&mut self.new_conns);
        self.setup.inbox.drain_into(&mut fresh);
        for (fd, protocol) in fresh.drain(..) {
            self.open_connection(fd, protocol);
        }
        self.new_conns = fresh;
    }

    fn on_accept(&mut self, index: usize, res: i32) {
        self.accept_armed[index] = false;
        if res >= 0 {
            // SAFETY: a successful accept returns a fresh descriptor that nobody else owns.
            let fd = unsafe { OwnedFd::from_raw_fd(res) };
            let protocol = self.setup.listeners[index].1;
            if self.stopping_deadline.is_some() {
                return;
            }
            if self.setup.open.fetch_add(1, Ordering::AcqRel) >= self.setup.limits.max_conns {
                self.setup.open.fetch_sub(1, Ordering::AcqRel);
                self.setup.handler.conn_refused();
                crate::acceptor::refuse_now(&fd, protocol);
            } else {
                self.setup.inbox.add_load();
                self.open_connection(fd, protocol);
            }
            self.arm_accept(index);
            return;
        }
        match -res {
            libc::ECANCELED | libc::EINVAL | libc::EBADF => {} // stopping
            libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM => {
                // Out of descriptors: retry from the tick instead of spinning.
                self.accept_backoff_until = self.now.mono_ms + 100;
            }
            _ if self.stopping_deadline.is_none() => self.arm_accept(index),
            _ => {}
        }
    }

    fn on_tick(&mut self) {
        let now = self.now.mono_ms;
        if self.setup.reaper && now >= self.last_reclaim_ms + 1000 {
            self.last_reclaim_ms = now;
            self.setup.handler.reclaim(self.now);
        }
        if self.stopping_deadline.is_none() && now >= self.accept_backoff_until {
            // Re-arm accepts that backed off (EMFILE).
            for i in 0..self.accept_armed.len() {
                if !self.accept_armed[i] {
                    self.arm_accept(i);
                }
            }
        }
        self.check_timeouts();
        self.arm_tick();
    }

    fn check_timeouts(&mut self) {
        let now = self.now.mono_ms;
        let limits = self.setup.limits;
        let past_deadline = self.stopping_deadline.is_some_and(|d| now >= d);
        for slot in 0..self.conns.capacity_slots() as u32 {
            let Some(conn) = self.conns.at_mut(slot) else {
                continue;
            };
            if conn.closing {
                continue;
            }
            if let Some(linger) = &conn.linger {
                if linger.expired(now) || past_deadline {
                    self.close(slot);
                }
                continue;
            }
            let slow = conn
                .partial_since_ms
                .is_some_and(|since| now.saturating_sub(since) >= limits.request_timeout_ms);
            let idle = limits.idle_timeout_ms > 0
                && conn.partial_since_ms.is_none()
                && now.saturating_sub(conn.last_active_ms) >= limits.idle_timeout_ms;
            if slow || idle || past_deadline {
                self.close(slot);
            }
        }
    }

    fn begin_stop(&mut self) {
        self.stopping_deadline = Some(self.now.mono_ms + self.setup.limits.drain_deadline_ms);
        for i in 0..self.setup.listeners.len() {
            let target = user_data(i as u32, 0, OP_ACCEPT);
            self.pending.push(
                opcode::AsyncCancel::new(target)
                    .build()
                    .user_data(OP_CANCEL),
            );
        }
        for slot in 0..self.conns.capacity_slots() as u32 {
            let Some(conn) = self.conns.at_mut(slot) else {
                continue;
            };
            // A lingering connection ends by itself well within the drain deadline.
            if !conn.send_armed
                && conn.partial_since_ms.is_none()
                && conn.gate == 0
                && conn.linger.is_none()
            {
                self.close(slot);
            }
        }
        // Connections queued after the stop are dropped unserved.
        self.take_inbox();
    }
}

/// After a session call: if it staged records, hold the connection's output until they are durable.
fn hold<S>(disk: &mut DiskWorker, conn: &mut Conn<S>, slot: u32, generation: u32) {
    let token = DiskWorker::end_call();
    if token != 0 {
        conn.gate = token;
        disk.waiting.push_back((slot, generation, token));
    }
}
