//! One pinned worker: an io_uring event loop serving its connections end to end.
//!
//! Each loop iteration submits every queued operation and reaps every completion with a
//! single `io_uring_enter`, so one system call serves many connections. Receives use the
//! worker's provided-buffer ring (buffers go back to the kernel as soon as the session has
//! consumed them); a connection's output buffer is reused across requests. Reading and
//! writing alternate per connection: while replies are in flight the connection does not
//! read, which is the backpressure `Flow::Drain` asks for and keeps output bounded.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::mpsc::SyncSender;

use io_uring::{cqueue, opcode, squeue, types, IoUring};
use ringstore_service::{Device, Flow, Now};

use crate::bufring::BufRing;
use crate::connection::machine::{Completed, Io, Step};
use crate::connection::Conn;
use crate::datapath::kernel_udp::KernelUdp;
use crate::durable::DeviceWorker;
use crate::handler::{Handler, Hooks};
use crate::op::Op;
use crate::ring::Features;
use crate::setup::WorkerSetup;

use super::worker::{Core, Engine};

/// Provided receive buffers per worker and their size: 4 MiB a worker either way, in 64 KiB
/// buffers rather than 256 of 16 KiB, so a depth-16 batch of 4 KiB SETs (66 KiB) arrives in one
/// or two receives instead of five, each a completion, a re-arm and a request split across
/// buffers that the session has to reassemble (SET 4 KiB at depth 16: 0.68–0.70× the server
/// CPU per request of 16 KiB buffers, docs/BENCHMARKS.md). Buffers go back to the ring as soon
/// as the session has consumed them, so 64 cover 64 connections receiving in one ring pass;
/// the 65th gets ENOBUFS and re-arms.
pub(crate) const BUF_COUNT: u16 = 64;
/// IORING_RECVSEND_POLL_FIRST (recv/send ioprio flag, Linux 5.19).
const RECVSEND_POLL_FIRST: u16 = 1;
const BUF_SIZE: usize = 64 << 10;
/// A connection's own receive buffer where there is no buffer ring (`--buf-ring off`): it is
/// held for the connection's life, so it stays at 16 KiB (ADR 0009's per-connection allowance).
const OWN_BUF_SIZE: usize = 16 << 10;
/// `eventfd-wait`: the longest a worker sleeps in poll(2) before it looks at its ring again.
const EVENTFD_WAIT_MS: u16 = 1;

/// What the io_uring worker keeps per connection to move its bytes (ADR 0040: the
/// connection machine keeps the rest).
pub(crate) struct UringIo {
    /// Receive buffer when the kernel has no provided-buffer rings.
    own_buf: Option<Box<[u8]>>,
    /// `sendmsg` state for output with spliced values (made on first use): the iovecs and
    /// msghdr the kernel reads until the SENDMSG completes, so it lives with the connection.
    vec_send: Option<Box<send_vec::VecSend>>,
}

struct Worker<H: Handler> {
    // Field order matters: the ring is dropped (and its buffer registration released) before the pool.
    ring: IoUring,
    bufs: Option<BufRing>,
    /// The kernel-UDP backend (`--udp`), its buffer group registered with `ring`.
    udp: Option<KernelUdp<H::Session>>,
    /// UDP receive errors logged so far (a few, then quiet).
    udp_errors_logged: u32,
    core: Core<H, UringIo>,
    pending: Vec<squeue::Entry>,
    /// Pairs that must reach the kernel in one submission: a data-device batch write and the
    /// flush chained behind it (`DeviceWorker::pump`).
    pending_chains: Vec<[squeue::Entry; 2]>,
    completions: Vec<(u64, i32, u32)>,
    /// The 8-byte target of the eventfd read; leaked so a read cancelled at teardown can never write freed memory.
    inbox_word: *mut u64,
    tick: Box<types::Timespec>,
    /// Per reuseport listener: an accept is in flight.
    accept_armed: Vec<bool>,
    /// Link each connection's next receive behind its send (hidden key `link-recv`, for measurement).
    link_recv: bool,
    /// Receives queued behind sends poll first (hidden key `poll-first`, for measurement).
    poll_first: bool,
    /// This worker's region log, when a data device is on (None: RAM only, no extra work).
    device: Option<DeviceWorker>,
    /// Hidden key `eventfd-wait` (measurement under valgrind): an eventfd registered with the
    /// ring; the worker blocks in a read of it instead of inside `io_uring_enter`.
    wait_fd: Option<OwnedFd>,
}

/// Runs a worker on the current thread until it has stopped; reports its features (or why it
/// could not start) through `ready` first.
/// Returns the most connections the worker had open at once.
pub(crate) fn run<H: Handler>(
    setup: WorkerSetup<H>,
    ready: SyncSender<Result<Features, String>>,
) -> usize {
    let index = setup.index;
    let mut worker = match Worker::start(setup) {
        Ok((worker, features)) => {
            let _ = ready.send(Ok(features));
            worker
        }
        Err(why) => {
            let _ = ready.send(Err(format!("worker {index}: {why}")));
            return 0;
        }
    };
    worker.serve();
    if let Some(device) = worker.device.take() {
        device.uninstall();
    }
    worker.core.peak_conns
}

/// The ring of a worker with what is registered with it, before the loop starts.
struct Registered<S> {
    ring: IoUring,
    features: Features,
    bufs: Option<BufRing>,
    udp: Option<KernelUdp<S>>,
    wait_fd: Option<OwnedFd>,
}

/// Pins the thread to `setup.cpu`, builds the ring and registers the receive buffers, the
/// kernel-UDP backend's buffer group and (`eventfd-wait`) the eventfd. Err: why not.
fn register<H: Handler>(setup: &mut WorkerSetup<H>) -> Result<Registered<H::Session>, String> {
    if let Some(cpu) = setup.cpu {
        crate::sys::set_affinity(&[cpu])
            .map_err(|err| format!("cannot pin to CPU {cpu}: {err}"))?;
    }
    let tuning = setup.limits.tuning;
    let (ring, mut features) = crate::ring::build(tuning.io_uring_setup)
        .map_err(|err| format!("io_uring_setup failed: {err}"))?;
    if !crate::ring::supports_needed_ops(&ring) {
        return Err("this kernel's io_uring lacks recv/send/accept/timeout".to_string());
    }
    let bufs = if tuning.buf_ring {
        BufRing::register(&ring, BUF_COUNT, BUF_SIZE).ok()
    } else {
        None
    };
    features.buf_ring = bufs.is_some();
    let udp = match setup.udp.take() {
        Some((fd, allow)) => Some(
            KernelUdp::new(&ring, fd, allow)
                .map_err(|err| format!("cannot register the UDP receive buffers: {err}"))?,
        ),
        None => None,
    };
    let wait_fd = if tuning.eventfd_wait {
        let fd = crate::sys::eventfd()
            .and_then(|fd| {
                ring.submitter().register_eventfd(fd.as_raw_fd())?;
                Ok(fd)
            })
            .map_err(|err| format!("eventfd-wait: cannot register an eventfd: {err}"))?;
        Some(fd)
    } else {
        None
    };
    Ok(Registered {
        ring,
        features,
        bufs,
        udp,
        wait_fd,
    })
}

impl<H: Handler> Worker<H> {
    /// The worker of `setup`, ready to serve, and the ring features it got. Err: why it
    /// cannot start (its index is added by the caller).
    fn start(mut setup: WorkerSetup<H>) -> Result<(Worker<H>, Features), String> {
        let registered = register(&mut setup)?;
        let device = match &setup.data {
            Some(serving) => Some(DeviceWorker::install(serving.clone(), setup.index)?),
            None => None,
        };
        let tuning = setup.limits.tuning;
        let tick = std::time::Duration::from_millis(setup.limits.tick_ms);
        let worker = Worker {
            ring: registered.ring,
            bufs: registered.bufs,
            udp: registered.udp,
            udp_errors_logged: 0,
            core: Core::new(setup),
            pending: Vec::with_capacity(256),
            pending_chains: Vec::new(),
            completions: Vec::with_capacity(256),
            inbox_word: Box::leak(Box::new(0u64)),
            tick: Box::new(types::Timespec::from(tick)),
            accept_armed: Vec::new(),
            link_recv: tuning.link_recv,
            poll_first: tuning.poll_first,
            device,
            wait_fd: registered.wait_fd,
        };
        Ok((worker, registered.features))
    }
}

impl<H: Handler> Worker<H> {
    fn serve(&mut self) {
        self.arm_inbox();
        self.arm_tick();
        self.accept_armed = vec![false; self.core.setup.listeners.len()];
        for i in 0..self.core.setup.listeners.len() {
            self.arm_accept(i);
        }
        self.arm_udp();
        let xdp_fds = self
            .core
            .setup
            .xdp
            .as_ref()
            .map(|x| x.fds())
            .unwrap_or_default();
        for index in 0..xdp_fds.len() {
            self.arm_xdp(index);
        }
        loop {
            self.queue_udp_sends();
            if let Err(err) = self.submit_and_wait() {
                eprintln!(
                    "ringstore: worker {}: io_uring_enter failed: {err}; closing its connections",
                    self.core.setup.index
                );
                break;
            }
            self.core.now = self.core.setup.clock.now();
            self.reap();
            // AF_XDP: one bounded burst per socket; work left over means no blocking wait.
            let setup = &mut self.core.setup;
            if setup.xdp.as_mut().is_some_and(|x| x.poll(&*setup.handler)) {
                self.pending
                    .push(opcode::Nop::new().build().user_data(Op::Wake.encode()));
            }
            if self.core.stopping_deadline.is_none() && self.core.setup.stop.load(Ordering::Acquire)
            {
                self.begin_stop();
            }
            if let Some(device) = &mut self.device {
                let mut sink = device::UringSink {
                    fds: device.fds(),
                    sqes: &mut self.pending,
                    chains: &mut self.pending_chains,
                    chained_write: None,
                };
                // Background compaction, one bounded step; its copies join this iteration's batch.
                let may_start = self.core.stopping_deadline.is_none();
                if device.compact_step(
                    &mut sink,
                    self.core.now.unix,
                    self.core.now.mono_ms,
                    may_start,
                ) {
                    sink.sqes
                        .push(opcode::Nop::new().build().user_data(Op::Wake.encode()));
                }
                // Group commit: everything staged this iteration goes out as one write + one flush.
                device.pump(&mut sink);
            }
            if self.core.stopping_deadline.is_some()
                && self.core.conns.live() == 0
                && !self.accept_armed.contains(&true)
                && self.device.as_ref().is_none_or(DeviceWorker::is_idle)
                && self.udp.as_ref().is_none_or(KernelUdp::is_idle)
            {
                break;
            }
        }
        // Whatever is left (only after a ring failure) is closed without ceremony.
        for slot in 0..crate::sys::u32_of(self.core.conns.capacity_slots()) {
            if self.core.conns.remove(slot).is_some() {
                self.core.setup.forget_connection();
            }
        }
        let _ = self.ring.submitter().unregister_buf_ring(BufRing::GROUP);
        if self.udp.is_some() {
            let _ = self
                .ring
                .submitter()
                .unregister_buf_ring(BufRing::UDP_GROUP);
        }
    }

    /// `eventfd-wait`: submits and reaps without blocking in `io_uring_enter` (a zero timeout);
    /// with no completion, blocks in poll(2) on the eventfd registered with the ring, then looks
    /// again. The poll gives up after `EVENTFD_WAIT_MS`: with DEFER_TASKRUN the kernel signals
    /// the eventfd when a completion is posted, which for deferred work happens only inside
    /// io_uring_enter, so a wakeup can be missing (a worker blocked in a plain read(2) was seen
    /// to sleep through a timeout completing); the bound turns that into a short delay.
    /// Never inlined, so the bench can leave it out of the instruction count by name.
    #[inline(never)]
    fn wait_in_eventfd(&mut self) -> std::io::Result<()> {
        let zero = types::Timespec::new();
        let args = types::SubmitArgs::new().timespec(&zero);
        loop {
            match self.ring.submitter().submit_with_args(1, &args) {
                Ok(_) => {}
                Err(err)
                    if matches!(
                        err.raw_os_error(),
                        Some(libc::ETIME | libc::EINTR | libc::EBUSY | libc::EAGAIN)
                    ) => {}
                Err(err) => return Err(err),
            }
            if !self.ring.completion().is_empty() {
                return Ok(());
            }
            let Some(fd) = &self.wait_fd else {
                return Ok(());
            };
            if !crate::sys::poll_one_readable(fd.as_fd(), EVENTFD_WAIT_MS) {
                continue; // timed out or interrupted: look at the ring again
            }
            crate::sys::eventfd_read(fd.as_fd())?;
        }
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
            let Some(op) = Op::decode(data) else { continue };
            match op {
                Op::Recv { slot, generation } => self.on_recv(slot, generation, res, flags),
                Op::Send { slot, generation } => self.on_send(slot, generation, res),
                Op::Tick => self.on_tick(),
                Op::Inbox => self.on_inbox(),
                Op::Accept { index } => self.on_accept(index as usize, res),
                Op::DiskWrite { id } => self.on_device(false, id, res),
                Op::DiskFlush { id } => self.on_device(true, id, res),
                Op::DiskErase { .. } | Op::DiskEraseFlush { .. } => {
                    if let Some(device) = &mut self.device {
                        let flush = matches!(op, Op::DiskEraseFlush { .. });
                        let evicted = device.erase_complete(flush, res, self.core.now.mono_ms);
                        // No session waits on an eviction: only its RAM copies go.
                        let handler = &*self.core.setup.handler;
                        crate::connection::forget_dropped(handler, &evicted, self.core.now);
                    }
                }
                Op::DiskCompactRead { id } => {
                    if let Some(device) = &mut self.device {
                        device.read_complete(id, res, self.core.now.mono_ms);
                    }
                }
                Op::UdpRecv => self.on_udp_recv(res, flags),
                Op::UdpSend { slot } => self.on_udp_send(slot, res),
                Op::XdpReady { index } => {
                    // A multishot poll that ended (no MORE flag) is armed again.
                    if !io_uring::cqueue::more(flags) {
                        self.arm_xdp(index as usize);
                    }
                }
                Op::Wake | Op::Cancel => {}
            }
        }
        completions.clear();
        self.completions = completions;
    }
}

/// The io_uring worker's I/O under the shared lifecycle steps ([`Engine`]).
impl<H: Handler> Engine<H> for Worker<H> {
    type Io = UringIo;

    fn core(&self) -> &Core<H, UringIo> {
        &self.core
    }

    fn core_mut(&mut self) -> &mut Core<H, UringIo> {
        &mut self.core
    }

    /// Without a buffer ring the connection gets its own receive buffer for its life.
    fn socket_io(&mut self, _fd: &OwnedFd) -> Option<UringIo> {
        let own_buf = self
            .bufs
            .is_none()
            .then(|| vec![0u8; OWN_BUF_SIZE].into_boxed_slice());
        Some(UringIo {
            own_buf,
            vec_send: None,
        })
    }

    fn start_io(&mut self, slot: u32, _generation: u32) -> bool {
        self.arm_recv(slot);
        true
    }

    fn device_log(&self) -> Option<&DeviceWorker> {
        self.device.as_ref()
    }

    fn send_polled(&mut self, slot: u32, _generation: u32) {
        self.carry_out(slot, Step::Send);
    }

    /// Re-arms the accepts that backed off (EMFILE).
    fn resume_accepts(&mut self) {
        for i in 0..self.accept_armed.len() {
            if !self.accept_armed[i] {
                self.arm_accept(i);
            }
        }
    }

    /// Cancels the accepts in flight and the UDP receive.
    fn stop_intake(&mut self) {
        for i in 0..self.core.setup.listeners.len() {
            let target = Op::Accept {
                index: crate::sys::u32_of(i),
            }
            .encode();
            self.pending.push(
                opcode::AsyncCancel::new(target)
                    .build()
                    .user_data(Op::Cancel.encode()),
            );
        }
        self.stop_udp();
    }

    /// Re-arms the tick's timeout, and a UDP receive that ran out of buffers.
    fn tick_done(&mut self) {
        self.arm_udp();
        self.arm_tick();
    }
}

mod accept;
mod arm;
mod conn_io;
mod device;
pub(crate) mod send_vec;
// The SQE pushes and accepted descriptors: the only `unsafe` of the worker.
#[allow(
    unsafe_code,
    reason = "SQE pointers must outlive their completions; see the module doc"
)]
mod sqe;
mod udp;
