//! The readiness runtime (ADR 0033): one pinned worker waiting in `epoll_wait` instead of an
//! io_uring ring, for where io_uring is not permitted (a container's seccomp profile,
//! `kernel.io_uring_disabled`) or not there.
//!
//! It drives the same [`Handler`] as the io_uring worker and shares what both do: the
//! acceptor → least-loaded-worker placement and its inbox ([`crate::placement::inbox`]), the
//! connection table ([`crate::connection::Slab`]), the output buffer's bounds and the timeouts
//! ([`crate::connection::Conn::closed_by_tick`]), the lingering close ([`crate::connection::linger`]), the
//! lifecycle steps ([`super::worker::Engine`]) and the output stream with values sent from the item
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

use crate::durable::DeviceWorker;
use crate::handler::{Handler, Hooks};
use crate::ring::Features;
use crate::setup::WorkerSetup;

use super::worker::{Core, Engine};
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
    core: Core<H, EpollIo>,
    events: Vec<Readiness>,
    /// Connections with input left after their turns: served next iteration without waiting.
    runnable: Vec<(u32, u32)>,
    read_buf: Box<[u8]>,
    /// When the tick is due (the `epoll_wait` timeout).
    next_tick_ms: u64,
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
            worker.core.peak_conns
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
        let core = Core::new(setup);
        Ok(Worker {
            epoll,
            events: Vec::with_capacity(EVENTS),
            runnable: Vec::new(),
            read_buf: vec![0u8; READ_BUF].into_boxed_slice(),
            next_tick_ms: core.now.mono_ms + core.setup.limits.tick_ms,
            device,
            device_busy: false,
            udp,
            core,
        })
    }

    fn serve(&mut self) {
        loop {
            // Work left from the last iteration: just look; otherwise sleep until the tick.
            let timeout = if self.runnable.is_empty() && !self.device_busy {
                self.next_tick_ms.saturating_sub(self.core.now.mono_ms)
            } else {
                0
            };
            let mut events = std::mem::take(&mut self.events);
            events.clear();
            if let Err(err) = self.epoll.wait(timeout, &mut events) {
                eprintln!(
                    "ringstore: worker {}: epoll_wait failed: {err}; closing its connections",
                    self.core.setup.index
                );
                break;
            }
            self.core.now = self.core.setup.clock.now();
            for event in &events {
                self.on_event(*event);
            }
            self.events = events;
            for (slot, generation) in std::mem::take(&mut self.runnable) {
                self.drive(slot, generation);
            }
            // Group commit: what this iteration staged goes to the device thread at once.
            self.device_busy = self.pump_device();
            if self.core.now.mono_ms >= self.next_tick_ms {
                self.on_tick();
            }
            if self.core.stopping_deadline.is_none() && self.core.setup.stop.load(Ordering::Acquire)
            {
                self.begin_stop();
            }
            if self.core.stopping_deadline.is_some()
                && self.core.conns.live() == 0
                && self.device_idle()
            {
                break;
            }
        }
        for slot in 0..crate::sys::u32_of(self.core.conns.capacity_slots()) {
            self.finish_close(slot);
        }
        if let Some(device) = self.device.take() {
            device.stop();
        }
    }

    fn on_event(&mut self, event: Readiness) {
        if event.key == KEY_INBOX {
            self.core.setup.inbox.clear_wakeups();
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
        let Some(conn) = self.core.conns.get_mut(slot, generation) else {
            return; // an event for a connection closed earlier in this batch
        };
        conn.io.ready_in |= event.readable || event.hangup;
        self.drive(slot, generation);
    }

    /// Accepts everything pending on reuseport listener `index` (placement `reuseport`).
    fn accept_all(&mut self, index: usize) {
        if self.core.stopping_deadline.is_some()
            || self.core.now.mono_ms < self.core.accept_backoff_until
        {
            return;
        }
        let Some((listener, protocol)) = self.core.setup.listeners.get(index) else {
            return;
        };
        let (listener, protocol) = (listener.as_raw_fd(), *protocol);
        loop {
            match crate::sys::accept(listener) {
                Ok(Some(fd)) => {
                    if let Some(fd) = self.core.setup.admit_own(fd, protocol) {
                        self.open_connection(fd, protocol);
                    }
                }
                Ok(None) => return,
                Err(_) => {
                    // Out of descriptors (or worse): level-triggered, so pause, don't spin.
                    self.core.accept_backoff_until = self.core.now.mono_ms + 100;
                    return;
                }
            }
        }
    }
}

/// The readiness worker's I/O under the shared lifecycle steps ([`Engine`]).
impl<H: Handler> Engine<H> for Worker<H> {
    type Io = EpollIo;

    fn core(&self) -> &Core<H, EpollIo> {
        &self.core
    }

    fn core_mut(&mut self) -> &mut Core<H, EpollIo> {
        &mut self.core
    }

    fn socket_io(&mut self, fd: &OwnedFd) -> Option<EpollIo> {
        if let Err(err) = crate::sys::set_nonblocking(fd.as_raw_fd()) {
            eprintln!("ringstore: a connection could not be made nonblocking: {err}");
            return None;
        }
        Some(EpollIo { ready_in: false })
    }

    /// Registers the socket once, edge-triggered both ways: input that arrived before the
    /// registration is reported by it (the first edge).
    fn start_io(&mut self, slot: u32, generation: u32) -> bool {
        let Some(conn) = self.core.conns.get_mut(slot, generation) else {
            return false;
        };
        let key = conn_key(slot, generation);
        if let Err(err) = self
            .epoll
            .add(conn.fd.as_raw_fd(), key, Watch::EdgeReadWrite)
        {
            eprintln!("ringstore: epoll_ctl failed for a connection: {err}");
            return false;
        }
        true
    }

    fn device_log(&self) -> Option<&DeviceWorker> {
        self.device.as_ref().map(|d| &d.log)
    }

    /// The connection runs at the end of this iteration (its output is written then).
    fn send_polled(&mut self, slot: u32, generation: u32) {
        self.runnable.push((slot, generation));
    }

    /// Level-triggered: what waits on the listeners is reported again, so take it now.
    fn resume_accepts(&mut self) {
        for index in 0..self.core.setup.listeners.len() {
            self.accept_all(index);
        }
    }

    /// Takes the listeners out of the epoll set (and closes them).
    fn stop_intake(&mut self) {
        for (fd, _) in self.core.setup.listeners.drain(..) {
            self.epoll.remove(fd.as_raw_fd());
        }
    }

    fn tick_done(&mut self) {
        self.next_tick_ms = self.core.now.mono_ms + self.core.setup.limits.tick_ms;
    }
}
