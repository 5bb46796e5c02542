//! The readiness runtime (ADR 0033): one pinned worker waiting in `epoll_wait` instead of an
//! io_uring ring, for where io_uring is not permitted (a container's seccomp profile,
//! `kernel.io_uring_disabled`) or not there.
//!
//! It drives the same [`Handler`] as the io_uring worker and shares what both do: the
//! acceptor → least-loaded-worker placement and its inbox ([`crate::placement::inbox`]), the
//! connection table ([`crate::connection::Slab`]), the output buffer's bounds and the timeouts
//! ([`crate::connection::Conn::closed_by_tick`]), the lingering close ([`crate::connection::linger`]), the
//! limits ([`Limits`]) and the output stream with values sent from the item
//! ([`crate::connection::output`]). What differs is only how bytes move: a
//! connection is registered once, edge-triggered for input and output, and read or written
//! with nonblocking calls until the kernel says EAGAIN; reads go into one buffer per worker
//! (a session keeps what it needs), so an idle connection holds no receive buffer.
//!
//! Each connection gets at most [`TURNS`] reads per loop iteration before the others have
//! their turn; one that still has input waits in the run list, not for a new edge.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::mpsc::SyncSender;

use std::sync::Arc;

use ringstore_service::Now;

use crate::placement::listeners::Endpoint;

use crate::connection::machine::At;
use crate::connection::Slab;
use crate::handler::{Handler, Hooks};
use crate::ring::Features;
use crate::setup::WorkerSetup;
use crate::sys::{Epoll, Readiness, Watch};

mod conn_io;
mod device;
mod udp;

/// The receive buffer every connection of a worker reads into, in turn.
const READ_BUF: usize = 16 << 10;
/// Reads one connection gets per loop iteration before the others have their turn.
const TURNS: usize = 16;
/// Events one `epoll_wait` reports at most.
const EVENTS: usize = 256;

/// What an event's key names: a connection (slot and generation), the inbox, a listener.
const KEY_INBOX: u64 = 1 << 62;
const KEY_DEVICE: u64 = 1 << 61;
const KEY_UDP: u64 = 1 << 60;
const KEY_LISTENER: u64 = 1 << 63;

fn conn_key(slot: u32, generation: u32) -> u64 {
    (u64::from(generation & crate::op::GEN_MASK) << 32) | u64::from(slot)
}

/// What the readiness engine keeps per connection to move its bytes (ADR 0040: the
/// connection machine keeps the rest).
pub(crate) struct EpollIo {
    /// The socket may hold input: an edge was reported and no read has found it empty since
    /// (ADR 0033).
    ready_in: bool,
}

struct Worker<H: Handler> {
    epoll: Epoll,
    conns: Slab<H::Session, EpollIo>,
    events: Vec<Readiness>,
    /// Connections with input left after their turns: served next iteration without waiting.
    runnable: Vec<(u32, u32)>,
    read_buf: Box<[u8]>,
    new_conns: Vec<(OwnedFd, Endpoint)>,
    setup: WorkerSetup<H>,
    now: Now,
    stopping_deadline: Option<u64>,
    next_tick_ms: u64,
    last_reclaim_ms: u64,
    /// Out of descriptors: accepts pause until then.
    accept_backoff_until: u64,
    peak_conns: usize,
    /// The data device (`--data`): this worker's region log and its sync thread.
    device: Option<device::DeviceThreads>,
    /// Background compaction has more to do: the next wait does not sleep.
    device_busy: bool,
    /// memcache UDP (`--udp`): this worker's socket of the reuseport group.
    udp: Option<udp::Udp>,
}

/// Runs a readiness worker on the current thread until it has stopped; reports through
/// `ready` first (no io_uring features: all off). Returns its most connections at once.
pub(crate) fn run<H: Handler>(
    setup: WorkerSetup<H>,
    ready: SyncSender<Result<Features, String>>,
) -> usize {
    let index = setup.index;
    match Worker::start(setup) {
        Ok(mut worker) => {
            let _ = ready.send(Ok(Features::default()));
            worker.serve();
            worker.peak_conns
        }
        Err(why) => {
            let _ = ready.send(Err(format!("worker {index}: {why}")));
            0
        }
    }
}

impl<H: Handler> Worker<H> {
    fn start(mut setup: WorkerSetup<H>) -> Result<Worker<H>, String> {
        if let Some(cpu) = setup.cpu {
            crate::sys::set_affinity(&[cpu])
                .map_err(|err| format!("cannot pin to CPU {cpu}: {err}"))?;
        }
        let epoll = Epoll::new(EVENTS).map_err(|err| format!("epoll_create failed: {err}"))?;
        epoll
            .add(setup.inbox.eventfd(), KEY_INBOX, Watch::LevelRead)
            .map_err(|err| format!("epoll_ctl (inbox) failed: {err}"))?;
        for (index, (fd, _)) in setup.listeners.iter().enumerate() {
            let key = KEY_LISTENER | index as u64;
            crate::sys::set_nonblocking(fd.as_raw_fd())
                .and_then(|()| epoll.add(fd.as_raw_fd(), key, Watch::LevelRead))
                .map_err(|err| format!("cannot watch its listener: {err}"))?;
        }
        let device = match &setup.data {
            Some(serving) => {
                let device = device::DeviceThreads::start(serving, setup.index)?;
                epoll
                    .add(device.thread.eventfd(), KEY_DEVICE, Watch::LevelRead)
                    .map_err(|err| format!("epoll_ctl (data device) failed: {err}"))?;
                Some(device)
            }
            None => None,
        };
        let udp = match setup.udp.take() {
            Some((fd, allow)) => {
                let udp = udp::Udp::new(fd, allow)
                    .map_err(|err| format!("cannot make its UDP socket nonblocking: {err}"))?;
                epoll
                    .add(udp.fd(), KEY_UDP, Watch::LevelRead)
                    .map_err(|err| format!("epoll_ctl (UDP) failed: {err}"))?;
                Some(udp)
            }
            None => None,
        };
        let now = setup.clock.now();
        Ok(Worker {
            epoll,
            conns: Slab::new(),
            events: Vec::with_capacity(EVENTS),
            runnable: Vec::new(),
            read_buf: vec![0u8; READ_BUF].into_boxed_slice(),
            new_conns: Vec::new(),
            now,
            stopping_deadline: None,
            next_tick_ms: now.mono_ms + setup.limits.tick_ms,
            last_reclaim_ms: now.mono_ms,
            accept_backoff_until: 0,
            peak_conns: 0,
            device,
            device_busy: false,
            udp,
            setup,
        })
    }

    fn serve(&mut self) {
        loop {
            // Work left from the last iteration: just look; otherwise sleep until the tick.
            let timeout = if self.runnable.is_empty() && !self.device_busy {
                self.next_tick_ms.saturating_sub(self.now.mono_ms)
            } else {
                0
            };
            let mut events = std::mem::take(&mut self.events);
            events.clear();
            if let Err(err) = self.epoll.wait(timeout, &mut events) {
                eprintln!(
                    "ringstore: worker {}: epoll_wait failed: {err}; closing its connections",
                    self.setup.index
                );
                break;
            }
            self.now = self.setup.clock.now();
            for event in &events {
                self.on_event(*event);
            }
            self.events = events;
            for (slot, generation) in std::mem::take(&mut self.runnable) {
                self.drive(slot, generation);
            }
            // Group commit: what this iteration staged goes to the device thread at once.
            self.device_busy = self.pump_device();
            if self.now.mono_ms >= self.next_tick_ms {
                self.on_tick();
            }
            if self.stopping_deadline.is_none() && self.setup.stop.load(Ordering::Acquire) {
                self.begin_stop();
            }
            if self.stopping_deadline.is_some() && self.conns.live() == 0 && self.device_idle() {
                break;
            }
        }
        for slot in 0..crate::sys::u32_of(self.conns.capacity_slots()) {
            self.finish_close(slot);
        }
        if let Some(device) = self.device.take() {
            device.stop();
        }
    }

    fn on_event(&mut self, event: Readiness) {
        if event.key == KEY_INBOX {
            self.setup.inbox.clear_wakeups();
            return self.take_inbox();
        }
        if event.key == KEY_DEVICE {
            return self.on_device();
        }
        if event.key == KEY_UDP {
            return self.on_udp();
        }
        if event.key & KEY_LISTENER != 0 {
            let index = usize::try_from(event.key & !KEY_LISTENER).unwrap_or(usize::MAX);
            return self.accept_all(index);
        }
        let slot = crate::sys::u32_of(usize::try_from(event.key & 0xFFFF_FFFF).unwrap_or(0));
        let generation = crate::sys::u32_of(usize::try_from(event.key >> 32).unwrap_or(0));
        let Some(conn) = self.conns.get_mut(slot, generation) else {
            return; // an event for a connection closed earlier in this batch
        };
        conn.io.ready_in |= event.readable || event.hangup;
        self.drive(slot, generation);
    }

    fn take_inbox(&mut self) {
        let mut fresh = std::mem::take(&mut self.new_conns);
        self.setup.inbox.drain_into(&mut fresh);
        for (fd, endpoint) in fresh.drain(..) {
            self.open_connection(fd, endpoint);
        }
        self.new_conns = fresh;
    }

    /// Accepts everything pending on reuseport listener `index` (placement `reuseport`).
    fn accept_all(&mut self, index: usize) {
        if self.stopping_deadline.is_some() || self.now.mono_ms < self.accept_backoff_until {
            return;
        }
        let Some((listener, protocol)) = self.setup.listeners.get(index) else {
            return;
        };
        let (listener, protocol) = (listener.as_raw_fd(), *protocol);
        loop {
            match crate::sys::accept(listener) {
                Ok(Some(fd)) => {
                    if let Some(fd) = self.setup.admit_own(fd, protocol) {
                        self.open_connection(fd, protocol);
                    }
                }
                Ok(None) => return,
                Err(_) => {
                    // Out of descriptors (or worse): level-triggered, so pause, don't spin.
                    self.accept_backoff_until = self.now.mono_ms + 100;
                    return;
                }
            }
        }
    }

    /// The time inputs to the connection machine happen at: now, and the stop's drain
    /// deadline that this worker keeps once for all its connections.
    fn at(&self) -> At {
        At::new(self.now.mono_ms, self.stopping_deadline)
    }

    /// The tick: the reaper step, timeouts and the stop's drain deadline, output sessions
    /// produce without input (`watch`: a connection that produced some runs).
    fn on_tick(&mut self) {
        let now = self.now.mono_ms;
        self.next_tick_ms = now + self.setup.limits.tick_ms;
        if self.setup.reaper && now >= self.last_reclaim_ms + 1000 {
            self.last_reclaim_ms = now;
            self.setup.handler.hooks().reclaim(self.now);
        }
        let (at, timeouts) = (self.at(), self.setup.limits.timeouts());
        let handler = Arc::clone(&self.setup.handler);
        for slot in 0..crate::sys::u32_of(self.conns.capacity_slots()) {
            let due = self
                .conns
                .at_mut(slot)
                .is_some_and(|conn| conn.closed_by_tick(&*handler, at, timeouts));
            if due {
                self.finish_close(slot);
            }
        }
        let produced = self.conns.poll_output(&*handler);
        self.runnable.extend(produced);
        // Accepts that backed off resume (level-triggered: what waits is reported again).
        if now >= self.accept_backoff_until {
            for index in 0..self.setup.listeners.len() {
                self.accept_all(index);
            }
        }
    }

    /// Stops accepting, closes idle connections; the others finish (bounded by the deadline).
    fn begin_stop(&mut self) {
        let deadline = self.now.mono_ms + self.setup.limits.drain_deadline_ms;
        self.stopping_deadline = Some(deadline);
        for (fd, _) in self.setup.listeners.drain(..) {
            self.epoll.remove(fd.as_raw_fd());
        }
        for slot in self.conns.stop(self.at()) {
            self.finish_close(slot);
        }
        // Connections queued after the stop are dropped unserved (open_connection).
        self.take_inbox();
    }
}
