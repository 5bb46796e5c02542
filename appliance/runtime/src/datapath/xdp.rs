//! The AF_XDP backend: the steering program attached to each `--xdp` interface, one XSK
//! socket per receive queue, each owned by the worker its queue is pinned to.
//!
//! [`attach`] runs before the workers start (and, under PID 1, before privileges drop): it
//! loads the program, attaches it (native, else generic), opens a socket per queue
//! (zero-copy, else copy) and puts it in the queue's XSKMAP slot. [`XdpWorker::poll`] is
//! called from the worker's loop: a bounded burst per socket through
//! [`super::poll_frames`], which parses with `proto::wire` and answers through the worker's
//! handler (`Handler::udp_request`), as every datapath backend does. The program stays attached while [`XdpAttachment`] (its BPF link) lives:
//! dropping it, or the process ending, leaves the interface clean.

use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};

use ringstore_sys::{u32_of, usize_of, Frame, Xsk, XskConfig, XskMode};

use super::{poll_frames, Answer, Counters, FrameBackend, Mode, PollScratch, RxDesc, TxDesc};
use crate::clock::Clock;
use crate::handler::{Handler, Hooks, UdpEvent};
use crate::RuntimeError;

/// Frames one socket takes per loop iteration.
pub(crate) const RX_BUDGET: usize = 64;
/// Most receive queues served per interface (XSKMAP slots).
const QUEUES_MAX: u32 = 256;

/// One socket (one receive queue) behind the [`FrameBackend`] interface. Frames handed out
/// as descriptors are kept here by slot, so the socket's ownership tokens never leave it.
pub(crate) struct XdpQueue {
    xsk: Xsk,
    mode: Mode,
    rx_slots: Vec<Option<Frame>>,
    tx_slots: Vec<Option<Frame>>,
    sending: Vec<Frame>,
    /// Frames of the current receive burst (reused: no allocation per burst).
    receiving: Vec<Frame>,
    counters: Counters,
}

fn park(slots: &mut Vec<Option<Frame>>, frame: Frame) -> u64 {
    match slots.iter().position(Option::is_none) {
        Some(i) => {
            slots[i] = Some(frame);
            i as u64
        }
        None => {
            slots.push(Some(frame));
            slots.len() as u64 - 1
        }
    }
}

impl XdpQueue {
    /// Frames still pending in the rx ring, or transmit work not complete.
    fn busy(&mut self) -> bool {
        let tx = self.xsk.pump_tx();
        tx || self.xsk.rx_pending() > 0
    }

    /// TX buffers one burst may use: the ring's room and the free frames.
    fn tx_max(&self) -> usize {
        (self.xsk.tx_room() as usize).min(self.xsk.free_frames())
    }

    /// Gives back TX buffers allocated and never queued (a reply that did not fit).
    fn reclaim_tx(&mut self) {
        for slot in &mut self.tx_slots {
            if let Some(frame) = slot.take() {
                self.xsk.recycle(frame);
            }
        }
    }
}

impl FrameBackend for XdpQueue {
    fn mode(&self) -> Mode {
        self.mode
    }

    fn rx_burst(&mut self, burst: &mut Vec<RxDesc>, budget: usize) -> usize {
        self.reclaim_tx();
        let mut frames = std::mem::take(&mut self.receiving);
        self.xsk.rx_burst(u32_of(budget), &mut frames);
        let n = frames.len();
        for frame in frames.drain(..) {
            if frame.is_empty() {
                // A descriptor outside its frame: count it, give the frame back.
                self.counters.dropped += 1;
                self.xsk.recycle(frame);
                continue;
            }
            let len = u32_of(frame.len());
            let id = park(&mut self.rx_slots, frame);
            burst.push(RxDesc { id, len });
        }
        self.receiving = frames;
        self.counters.rx += n as u64;
        burst.len()
    }

    fn rx_frame(&self, rx: RxDesc) -> &[u8] {
        match self.rx_slots.get(usize_of(rx.id)) {
            Some(Some(frame)) => self.xsk.data(frame),
            _ => &[],
        }
    }

    fn recycle(&mut self, rx: RxDesc) {
        if let Some(frame) = self
            .rx_slots
            .get_mut(usize_of(rx.id))
            .and_then(Option::take)
        {
            self.xsk.recycle(frame);
        }
    }

    fn tx_alloc(&mut self) -> Option<TxDesc> {
        let frame = self.xsk.alloc()?;
        let id = park(&mut self.tx_slots, frame);
        Some(TxDesc { id, len: 0 })
    }

    fn tx_buf(&mut self, tx: TxDesc) -> &mut [u8] {
        match self.tx_slots.get(usize_of(tx.id)) {
            Some(Some(frame)) => self.xsk.bytes(frame),
            _ => &mut [],
        }
    }

    fn tx_burst(&mut self, burst: &[TxDesc]) {
        self.sending.clear();
        for tx in burst {
            let Some(mut frame) = self
                .tx_slots
                .get_mut(usize_of(tx.id))
                .and_then(Option::take)
            else {
                continue;
            };
            if tx.len == 0 {
                // A frame whose build failed: only freed (the interface's rule).
                self.xsk.recycle(frame);
            } else if self.xsk.resize(&mut frame, tx.len as usize) {
                self.sending.push(frame);
            } else {
                self.xsk.recycle(frame);
                self.counters.dropped += 1;
            }
        }
        let queued = self.sending.len() as u64;
        let dropped = u64::from(self.xsk.transmit(&mut self.sending));
        self.counters.tx += queued - dropped;
        self.counters.dropped += dropped;
        self.reclaim_tx();
        self.xsk.pump_tx();
    }

    fn counters(&self) -> Counters {
        self.counters
    }
}

/// One interface's program: attached while this lives.
pub struct XdpAttachment {
    pub interface: String,
    pub mode: Mode,
    pub queues: u32,
    // Field order: the link (the attachment) goes first, then the program and its map.
    _link: OwnedFd,
    _prog: OwnedFd,
    _map: OwnedFd,
}

impl std::fmt::Debug for XdpAttachment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XdpAttachment")
            .field("interface", &self.interface)
            .field("mode", &self.mode)
            .field("queues", &self.queues)
            .finish()
    }
}

/// The sockets of one worker and what answering needs.
pub(crate) struct XdpWorker {
    queues: Vec<XdpQueue>,
    scratch: PollScratch,
    clock: Clock,
    allow: Vec<ipnet::IpNet>,
    port: u16,
    worker: usize,
    /// Counters already added to the worker's `stats` slot.
    reported: Counters,
}

impl XdpWorker {
    /// The socket descriptors to arm readiness polls on (index = queue index here).
    pub(crate) fn fds(&self) -> Vec<RawFd> {
        self.queues
            .iter()
            .map(|q| q.xsk.as_fd().as_raw_fd())
            .collect()
    }

    /// One bounded burst on every socket, each request answered through `handler`. Returns
    /// true when work is left (frames still in an rx ring, or transmits not complete): the
    /// worker must not block in its next wait.
    pub(crate) fn poll<H: Handler>(&mut self, handler: &H) -> bool {
        let mut busy = false;
        for q in &mut self.queues {
            q.xsk.wake_rx();
            let tx_max = q.tx_max();
            let (clock, worker) = (&self.clock, self.worker);
            let polled = poll_frames(
                q,
                self.port,
                &self.allow,
                RX_BUDGET,
                tx_max,
                &mut self.scratch,
                |_, request, reply| {
                    // No data device here: frame backends answer at once (ADR 0021).
                    let held = handler.udp_request(worker, request, clock.now(), None, reply);
                    debug_assert!(held.is_none(), "nothing is held without a device");
                    Answer::Now
                },
            );
            q.counters.dropped += polled.dropped as u64;
            // The datagram counters every memcache UDP backend keeps, beside the frame ones.
            let received = polled.frames.saturating_sub(polled.dropped);
            handler
                .hooks()
                .udp_count(worker, UdpEvent::Rx, received as u64);
            handler
                .hooks()
                .udp_count(worker, UdpEvent::Tx, polled.datagrams as u64);
            handler
                .hooks()
                .udp_count(worker, UdpEvent::Dropped, polled.dropped as u64);
            busy |= q.busy();
        }
        self.report(handler);
        busy
    }

    /// Adds what the sockets counted since the last report to the worker's stats slot.
    fn report<H: Handler>(&mut self, handler: &H) {
        let mut now = Counters::default();
        for q in &self.queues {
            let c = q.counters();
            now.rx += c.rx;
            now.tx += c.tx;
            now.dropped += c.dropped;
        }
        handler
            .hooks()
            .udp_count(self.worker, UdpEvent::XdpRx, now.rx - self.reported.rx);
        handler
            .hooks()
            .udp_count(self.worker, UdpEvent::XdpTx, now.tx - self.reported.tx);
        handler.hooks().udp_count(
            self.worker,
            UdpEvent::XdpDrop,
            now.dropped - self.reported.dropped,
        );
        self.reported = now;
    }
}

/// The modes name for `stats xdp_mode`: `IF:MODE` per interface, comma-separated.
pub fn modes_line(attachments: &[XdpAttachment]) -> String {
    attachments
        .iter()
        .map(|a| format!("{}:{}", a.interface, a.mode))
        .collect::<Vec<_>>()
        .join(",")
}

/// Programs attached and sockets opened, not yet given to workers: what needs
/// privileges (CAP_BPF, CAP_NET_ADMIN, CAP_NET_RAW), done before they are dropped.
pub struct XdpPrepared {
    attachments: Vec<XdpAttachment>,
    queues: Vec<(String, u32, XdpQueue)>,
    port: u16,
}

impl std::fmt::Debug for XdpPrepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XdpPrepared")
            .field("attachments", &self.attachments)
            .field("port", &self.port)
            .finish()
    }
}

impl XdpPrepared {
    /// The UDP port the program steers.
    pub fn port(&self) -> u16 {
        self.port
    }
}

/// What [`distribute`] made: the attachments (kept by the server) and each worker's sockets.
#[derive(Default)]
pub(crate) struct Attached {
    pub attachments: Vec<XdpAttachment>,
    pub workers: Vec<Option<XdpWorker>>,
    /// `IF queue N -> worker W (cpu C)` lines, for the log and the console.
    pub map: Vec<String>,
}

fn xdp_err(what: String) -> impl FnOnce(String) -> RuntimeError {
    move |detail| RuntimeError::io(what, std::io::Error::other(detail))
}

/// Loads and attaches the program steering UDP to `port` on every interface of
/// `interfaces` (native XDP, else generic) and opens one socket per receive queue
/// (zero-copy, else copy), each in its queue's XSKMAP slot. Logs the mode once per
/// interface.
pub fn prepare(interfaces: &[String], port: u16) -> Result<XdpPrepared, RuntimeError> {
    let mut prepared = XdpPrepared {
        attachments: Vec::new(),
        queues: Vec::new(),
        port,
    };
    for name in interfaces {
        let fail = |what: &str| xdp_err(format!("xdp {name}: {what}"));
        let ifindex =
            crate::sys::ifindex(name).map_err(|e| fail("no such interface")(e.to_string()))?;
        let queues = crate::sys::rx_queue_count(name)
            .map_err(|e| fail("reading its queues")(e.to_string()))?
            .clamp(1, QUEUES_MAX);
        let map = crate::sys::xskmap_create(queues).map_err(|e| fail("XSKMAP")(e.to_string()))?;
        let insns = crate::sys::steer_program(map.as_raw_fd(), port);
        let prog = crate::sys::prog_load_xdp(&insns, "ringstore_steer")
            .map_err(|e| fail("loading the XDP program")(e.to_string()))?;
        let (link, how) = crate::sys::xdp_link_attach(prog.as_fd(), ifindex, true)
            .map_err(|e| fail("attaching the XDP program")(e.to_string()))?;
        let mut mode = None;
        for queue in 0..queues {
            let cfg = XskConfig::default();
            let native = how == crate::sys::XdpAttach::Native;
            let xsk = native
                .then(|| Xsk::open(ifindex, queue, cfg, true).ok())
                .flatten()
                .map_or_else(|| Xsk::open(ifindex, queue, cfg, false), Ok)
                .map_err(|e| fail("opening an AF_XDP socket")(format!("queue {queue}: {e}")))?;
            crate::sys::xskmap_set(map.as_fd(), queue, xsk.as_fd())
                .map_err(|e| fail("XSKMAP slot")(e.to_string()))?;
            let queue_mode = match (how, xsk.mode()) {
                (crate::sys::XdpAttach::Generic, _) => Mode::XdpGeneric,
                (_, XskMode::ZeroCopy) => Mode::XdpZeroCopy,
                (_, XskMode::Copy) => Mode::XdpCopy,
            };
            mode.get_or_insert(queue_mode);
            prepared.queues.push((
                name.clone(),
                queue,
                XdpQueue {
                    xsk,
                    mode: queue_mode,
                    rx_slots: Vec::with_capacity(RX_BUDGET),
                    tx_slots: Vec::new(),
                    sending: Vec::new(),
                    receiving: Vec::with_capacity(RX_BUDGET),
                    counters: Counters::default(),
                },
            ));
        }
        let mode = mode.unwrap_or(Mode::XdpCopy);
        eprintln!(
            "ringstore: xdp {name}: program attached {}, {queues} queue(s), mode {mode}",
            how.name()
        );
        prepared.attachments.push(XdpAttachment {
            interface: name.clone(),
            mode,
            queues,
            _link: link,
            _prog: prog,
            _map: map,
        });
    }
    Ok(prepared)
}

/// The CPU the IRQ of receive queue `queue` of `interface` is pinned to, from
/// /proc/interrupts (action `IF-rx-Q`, `IF-TxRx-Q` or `virtioN-input.Q`) and
/// /proc/irq/N/smp_affinity_list (its first CPU).
fn queue_irq_cpu(interface: &str, queue: u32) -> Option<usize> {
    let interrupts = std::fs::read_to_string("/proc/interrupts").ok()?;
    let device = std::fs::read_link(format!("/sys/class/net/{interface}/device"))
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()));
    let mut names = vec![
        format!("{interface}-rx-{queue}"),
        format!("{interface}-TxRx-{queue}"),
    ];
    names.extend(device.map(|d| format!("{d}-input.{queue}")));
    interrupts.lines().find_map(|line| {
        let (irq, rest) = line.split_once(':')?;
        let irq: u32 = irq.trim().parse().ok()?;
        let action = rest.split_whitespace().last()?;
        if !names.iter().any(|n| n == action) {
            return None;
        }
        let list = std::fs::read_to_string(format!("/proc/irq/{irq}/smp_affinity_list")).ok()?;
        crate::sys::parse_cpulist(list.trim()).first().copied()
    })
}

/// Gives each socket to the worker on the CPU its queue's IRQ is pinned to (PID 1 pins
/// them, init/src/irq.rs); without such a pin, queue q goes to worker q mod n.
pub(crate) fn distribute(
    prepared: XdpPrepared,
    worker_cpus: &[usize],
    allow: &[ipnet::IpNet],
    clock: Clock,
) -> Attached {
    let workers = worker_cpus.len().max(1);
    let mut attached = Attached {
        attachments: prepared.attachments,
        workers: (0..workers).map(|_| None).collect(),
        map: Vec::new(),
    };
    for (name, queue, xdp_queue) in prepared.queues {
        let pinned = queue_irq_cpu(&name, queue).and_then(|cpu| {
            worker_cpus
                .iter()
                .position(|&c| c == cpu)
                .map(|w| (w, "irq"))
        });
        let (worker, why) = pinned.unwrap_or((queue as usize % workers, "round robin"));
        let cpu = worker_cpus
            .get(worker)
            .map_or_else(|| "-".to_string(), usize::to_string);
        let line = format!("{name} queue {queue} -> worker {worker} (cpu {cpu}, {why})");
        eprintln!("ringstore: xdp {line}");
        attached.map.push(line);
        let slot = attached.workers[worker].get_or_insert_with(|| XdpWorker {
            queues: Vec::new(),
            scratch: PollScratch::default(),
            clock,
            allow: allow.to_vec(),
            port: prepared.port,
            worker,
            reported: Counters::default(),
        });
        slot.queues.push(xdp_queue);
    }
    attached
}
