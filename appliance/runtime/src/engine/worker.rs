//! What a worker does the same on either engine (ADR 0040): its connection table, clock and
//! stop state ([`Core`]), and the steps of a connection's lifecycle around the engine's own
//! I/O ([`Engine`]: open, close, the tick's timeouts and polled output, the orderly stop,
//! the inbox). Each step is defined here once; an engine supplies only how bytes move (its
//! [`Engine`] hooks), so the two cannot drift apart (the layering test rejects a second
//! definition under `engine/`).

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

use ringstore_service::{Device, Now};

use crate::connection::machine::At;
use crate::connection::{Conn, Slab};
use crate::durable::DeviceWorker;
use crate::handler::{Handler, Hooks};
use crate::placement::listeners::Endpoint;
use crate::setup::WorkerSetup;

/// The state of a worker that does not depend on how it moves bytes.
pub(crate) struct Core<H: Handler, X> {
    pub(super) conns: Slab<H::Session, X>,
    pub(super) setup: WorkerSetup<H>,
    /// The clock read once per loop iteration; every input of the iteration happens at it.
    pub(super) now: Now,
    /// Set when the worker begins to stop: the end of the drain, after which the tick
    /// closes whatever is still open.
    pub(super) stopping_deadline: Option<u64>,
    /// When this worker last ran the expiry reaper (once a second, when it is the reaper).
    pub(super) last_reclaim_ms: u64,
    /// Out of descriptors: accepts pause until then.
    pub(super) accept_backoff_until: u64,
    /// Most connections open at once on this worker (logged at stop: placement balance).
    pub(super) peak_conns: usize,
    /// The inbox's connections, taken in one go (reused, so taking allocates nothing).
    new_conns: Vec<(OwnedFd, Endpoint)>,
}

impl<H: Handler, X> Core<H, X> {
    pub(super) fn new(setup: WorkerSetup<H>) -> Core<H, X> {
        let now = setup.clock.now();
        Core {
            conns: Slab::new(),
            setup,
            now,
            stopping_deadline: None,
            last_reclaim_ms: now.mono_ms,
            accept_backoff_until: 0,
            peak_conns: 0,
            new_conns: Vec::new(),
        }
    }

    /// The time inputs to the connection machine happen at: now, and the stop's drain
    /// deadline that this worker keeps once for all its connections.
    pub(super) fn at(&self) -> At {
        At::new(self.now.mono_ms, self.stopping_deadline)
    }
}

/// An engine's worker: its I/O as hooks, and the lifecycle steps built on them (provided
/// here, never overridden).
pub(super) trait Engine<H: Handler>: Sized {
    /// What the engine keeps per connection to move its bytes.
    type Io;

    fn core(&self) -> &Core<H, Self::Io>;
    fn core_mut(&mut self) -> &mut Core<H, Self::Io>;

    /// The engine's state for a new connection's socket `fd`, or `None` when the socket
    /// cannot be served (the engine says why).
    fn socket_io(&mut self, fd: &OwnedFd) -> Option<Self::Io>;

    /// Bytes start to move on the connection just opened in `(slot, generation)`; false
    /// when they cannot (the engine says why), and the connection is closed.
    fn start_io(&mut self, slot: u32, generation: u32) -> bool;

    /// This worker's region log on the data device, when there is one.
    fn device_log(&self) -> Option<&DeviceWorker>;

    /// The connection in `(slot, generation)` has output the tick polled: send it.
    fn send_polled(&mut self, slot: u32, generation: u32);

    /// Accepts paused for want of descriptors may go on.
    fn resume_accepts(&mut self);

    /// The worker stops: no more accepts (nor datagrams).
    fn stop_intake(&mut self);

    /// The tick's work is done: what waits for the next one is armed again.
    fn tick_done(&mut self);

    /// A connection handed to this worker (by the inbox or its own listener) is opened
    /// and starts to read; once stopping it is dropped unserved.
    fn open_connection(&mut self, fd: OwnedFd, endpoint: Endpoint) {
        if self.core().stopping_deadline.is_some() {
            drop(fd);
            return self.core().setup.forget_connection();
        }
        crate::sys::set_nodelay(fd.as_raw_fd());
        let Some(io) = self.socket_io(&fd) else {
            drop(fd);
            return self.core().setup.forget_connection();
        };
        let core = self.core_mut();
        let handler = &*core.setup.handler;
        let conn = Conn::open(
            handler,
            fd,
            endpoint,
            (core.setup.index, core.now.mono_ms),
            io,
        );
        let (slot, generation) = core.conns.insert(conn);
        handler.hooks().conn_opened(core.setup.index);
        if !self.start_io(slot, generation) {
            return self.finish_close(slot);
        }
        let core = self.core_mut();
        core.peak_conns = core.peak_conns.max(core.conns.live());
    }

    /// Opens every connection the inbox holds for this worker.
    fn take_inbox(&mut self) {
        let core = self.core_mut();
        let mut fresh = std::mem::take(&mut core.new_conns);
        core.setup.inbox.drain_into(&mut fresh);
        for (fd, endpoint) in fresh.drain(..) {
            self.open_connection(fd, endpoint);
        }
        self.core_mut().new_conns = fresh;
    }

    /// Closes now if nothing is in flight; otherwise shuts the socket down so the
    /// operations in flight complete promptly, and the last one's completion closes.
    fn close(&mut self, slot: u32) {
        let Some(conn) = self.core_mut().conns.at_mut(slot) else {
            return;
        };
        if conn.machine.close() {
            self.finish_close(slot);
        } else {
            crate::sys::shutdown(conn.fd.as_raw_fd(), libc::SHUT_RDWR);
        }
    }

    /// The connection is gone (nothing in flight): its session is told, with the data
    /// device on its behalf, and the worker's accounting forgets it.
    fn finish_close(&mut self, slot: u32) {
        let core = self.core_mut();
        let generation = core.conns.generation(slot);
        let Some(conn) = core.conns.remove(slot) else {
            return;
        };
        let device = self.device_log().map(|d| d.for_conn(slot, generation));
        let setup = &self.core().setup;
        conn.end(&*setup.handler, device.as_ref().map(|d| d as &dyn Device));
        setup.handler.hooks().conn_closed(setup.index);
        setup.forget_connection();
    }

    /// The tick: the reaper step, timeouts and the stop's drain deadline, output sessions
    /// produce without input (`watch`), accepts that backed off.
    fn on_tick(&mut self) {
        let core = self.core_mut();
        let now = core.now.mono_ms;
        if core.setup.reaper && now >= core.last_reclaim_ms + 1000 {
            core.last_reclaim_ms = now;
            core.setup.handler.hooks().reclaim(core.now);
        }
        self.check_timeouts();
        let core = self.core_mut();
        let handler = Arc::clone(&core.setup.handler);
        for (slot, generation) in core.conns.poll_output(&*handler) {
            self.send_polled(slot, generation);
        }
        let core = self.core();
        if core.stopping_deadline.is_none() && now >= core.accept_backoff_until {
            self.resume_accepts();
        }
        self.tick_done();
    }

    /// Closes each connection the tick closes: for time (the machine's timeouts, the
    /// drain deadline) or for its session's own reason.
    fn check_timeouts(&mut self) {
        let core = self.core_mut();
        let (at, timeouts) = (core.at(), core.setup.limits.timeouts());
        let handler = Arc::clone(&core.setup.handler);
        for slot in 0..crate::sys::u32_of(core.conns.capacity_slots()) {
            let due = self
                .core_mut()
                .conns
                .at_mut(slot)
                .is_some_and(|conn| conn.closed_by_tick(&*handler, at, timeouts));
            if due {
                self.close(slot);
            }
        }
    }

    /// Stops accepting and closes the idle connections; the others finish, bounded by the
    /// drain deadline. Connections the inbox still holds are dropped unserved.
    fn begin_stop(&mut self) {
        let core = self.core_mut();
        core.stopping_deadline = Some(core.now.mono_ms + core.setup.limits.drain_deadline_ms);
        self.stop_intake();
        let core = self.core();
        for slot in core.conns.stop(core.at()) {
            self.close(slot);
        }
        self.take_inbox();
    }
}
