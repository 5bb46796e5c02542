//! One connection's I/O state on its worker, and the slab that owns every connection of a worker.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use ringstore_service::{Device, Flow, Now};

use crate::durable::Outcome;
use crate::handler::{Handler, Hooks};
use crate::op::GEN_MASK;
use crate::placement::listeners::Endpoint;

pub(crate) mod linger;
pub(crate) mod machine;
pub(crate) mod output;

use machine::{At, Io, Machine, Served, Step, Timeouts};

/// Bytes of output capacity kept after a flush; larger buffers are shrunk back so idle
/// connections hold little memory.
const OUT_KEEP: usize = 16 << 10;

/// Consecutive flushes that used at most a quarter of the buffer before it is shrunk.
///
/// Shrinking after every large flush made a connection that keeps sending ~66 KiB batches
/// (16 pipelined 4 KiB GETs) free and regrow its buffer each time: with musl's allocator that
/// is an mmap/munmap pair per batch (ADR-0012). The hysteresis keeps a buffer that is in use
/// and still returns memory once the connection's bursts get small.
const SMALL_FLUSHES_BEFORE_SHRINK: u8 = 8;

/// Output capacity a connection may keep between flushes at all: a buffer grown past this
/// (a large value, a drained multi-get) is released at once, so an idle connection never
/// holds more than this (the README's memory bound counts it per connection).
pub(crate) const OUT_RETAIN_MAX: usize = 128 << 10;

/// A connection served end to end by one worker.
pub(crate) struct Conn<S, X> {
    pub fd: OwnedFd,
    pub session: S,
    /// Replies not yet fully sent; never touched while a send is in flight (the kernel
    /// reads it until the completion): the session writes through [`Conn::session_and_out`].
    pub out: Vec<u8>,
    /// What the session wrote while a send of `out` was in flight (on io_uring, input served
    /// while a `watch` line goes out, a held reply settled meanwhile); the send's completion
    /// moves it behind `out` ([`Conn::send_completed`]).
    spill: Vec<u8>,
    /// How much of the output the kernel has taken: of `out`, with the session's spliced
    /// values counted where they go (`connection/output.rs`).
    pub sent: usize,
    /// Where the connection is in its life, what the engine has in flight and the clocks
    /// the tick judges: the one place both engines keep that state (ADR 0040).
    pub machine: Machine,
    /// Flushes in a row that used at most a quarter of `out`'s capacity.
    small_flushes: u8,
    /// What the engine keeps to move this connection's bytes (the io_uring worker's own
    /// receive buffer and `sendmsg` state, the epoll engine's readiness edge); the
    /// machine keeps the rest.
    pub io: X,
}

impl<S, X> Conn<S, X> {
    /// A connection opened with `machine` (its open time and whether its session has a
    /// request under way from the start) and the engine's I/O state `io`.
    pub(crate) fn new(fd: OwnedFd, session: S, machine: Machine, io: X) -> Conn<S, X> {
        Conn {
            fd,
            session,
            out: Vec::new(),
            spill: Vec::new(),
            sent: 0,
            machine,
            small_flushes: 0,
            io,
        }
    }

    /// The session, the socket, and where the session may write: `out`, or while a send of
    /// `out` is in flight the spill that the send's completion appends to `out`, so `out`
    /// never grows (and moves) under the kernel. Borrowed together for one handler call.
    pub(crate) fn session_and_out(&mut self) -> ((&mut S, &mut Vec<u8>), BorrowedFd<'_>) {
        let out = if self.machine.in_flight(Io::Send) {
            &mut self.spill
        } else {
            &mut self.out
        };
        ((&mut self.session, out), self.fd.as_fd())
    }

    /// Output bytes waiting: in `out` and in the spill behind it (the output cap counts both).
    pub(crate) fn out_len(&self) -> usize {
        self.out.len() + self.spill.len()
    }

    /// The kernel is done with `out` (a send completed, whatever its result): what the
    /// session wrote meanwhile goes behind it.
    pub(crate) fn send_completed(&mut self) {
        assert!(
            !self.machine.in_flight(Io::Send),
            "a send of `out` is still in flight"
        );
        if !self.spill.is_empty() {
            self.out.extend_from_slice(&self.spill);
            self.spill.clear();
        }
    }

    /// A connection accepted on `endpoint`, its session opened by `handler` for worker
    /// `worker` at `now_ms`: both engines open through here.
    pub(crate) fn open<H: Handler<Session = S>>(
        handler: &H,
        fd: OwnedFd,
        endpoint: Endpoint,
        (worker, now_ms): (usize, u64),
        io: X,
    ) -> Conn<S, X> {
        let mut session = if endpoint.tls {
            handler.open_tls(endpoint.protocol, worker, now_ms)
        } else {
            handler.open(endpoint.protocol, worker)
        };
        if let Some(peer) = crate::sys::peer_addr(fd.as_raw_fd()) {
            handler.peer_known(&mut session, peer);
        }
        // A session with a request under way from the start (a TLS handshake, a login the
        // auth file asks for) is timed from the open: the request timeout closes a client
        // that never sends.
        let machine = Machine::new(now_ms, handler.has_partial_request(&session));
        Conn::new(fd, session, machine, io)
    }

    /// The machine lingers: shut the write side (the FIN follows the last reply) and tell
    /// the session it is over now, so it gives back what it holds (`connection/linger.rs`).
    pub(crate) fn start_linger<H: Handler<Session = S>>(
        &mut self,
        handler: &H,
        device: Option<&dyn Device>,
    ) {
        assert!(
            self.machine.lingering(),
            "linger carried out in {:?}",
            self.machine.state()
        );
        crate::sys::shutdown(self.fd.as_raw_fd(), libc::SHUT_WR);
        handler.session_closed(&mut self.session, device);
    }

    /// The connection is gone (the engine removed it, nothing in flight): its session is
    /// told, unless it already was at the linger.
    pub(crate) fn end<H: Handler<Session = S>>(mut self, handler: &H, device: Option<&dyn Device>) {
        let over = self.machine.session_over();
        assert!(
            self.machine.close(),
            "a connection closed with an operation in flight"
        );
        if !over {
            handler.session_closed(&mut self.session, device);
        }
    }

    /// Whether the tick closes this connection `at`: for time ([`Machine::handle_timeout`])
    /// or for the session's own reason ([`Handler::expired`]). Both engines' ticks ask this;
    /// a connection already closing is left to finish.
    pub(crate) fn closed_by_tick<H: Handler<Session = S>>(
        &mut self,
        handler: &H,
        at: At,
        timeouts: Timeouts,
    ) -> bool {
        if self.machine.closing() {
            return false;
        }
        self.machine.handle_timeout(at, timeouts) || handler.expired(&mut self.session, at.now_ms)
    }

    /// The session was called (with input, with none to drain, or again once its held
    /// reply's records are settled) and answered `flow`: what it left is reported to the
    /// machine, the output cap (`out_cap`, `Limits::out_hard_cap`) enforced, and the machine's next step
    /// returned. `device`: a data device is attached (only then may a session hold a
    /// reply). Both engines report through here.
    pub(crate) fn served<H: Handler<Session = S>>(
        &mut self,
        handler: &H,
        flow: Flow,
        at: At,
        (cap, device): (usize, bool),
    ) -> Step {
        let over_cap = self.out_len() > cap;
        if over_cap {
            eprintln!("ringstore: closing a connection whose pending output passed {cap} bytes");
        }
        let served = Served {
            flow,
            partial: handler.has_partial_request(&self.session),
            held: device && handler.awaits_durable(&self.session),
            pending: self.pending(handler),
            over_cap,
        };
        self.machine.handle_served(at, served)
    }

    /// Where the next receive goes instead of a receive buffer: a storage value's missing
    /// bytes in its reserved item (their first byte and how many, [`Handler::recv_target`]),
    /// recorded in the machine so that the receive's completion is reported to the session
    /// ([`Conn::received`]). Both engines ask this before every receive (issue 38).
    #[inline]
    pub(crate) fn recv_target<H: Handler<Session = S>>(
        &mut self,
        handler: &H,
    ) -> Option<(*mut u8, usize)> {
        let target = handler.recv_target(&self.session);
        self.machine.receives_into_item(target.map(|(_, len)| len));
        target
    }

    /// A receive made at [`Conn::recv_target`]'s answer brought `n > 0` bytes at `at`. Into
    /// the item: the session is told how many came (nothing to copy), and the machine's
    /// next step is returned (`rules` as for [`Conn::served`]; the request stays partial
    /// until the bytes behind the value arrive as ordinary input). `None`: they are in the
    /// engine's receive buffer, for the engine to feed to the session. A value that needs
    /// nothing after it (binary) has the session answer at once ([`Flow::Drain`]: the
    /// machine calls it again with no input). The one definition of the received-into-item
    /// step for both engines.
    #[inline]
    pub(crate) fn received<H: Handler<Session = S>>(
        &mut self,
        handler: &H,
        n: usize,
        at: At,
        rules: (usize, bool),
    ) -> Option<Step> {
        if !self.machine.took_into_item(n) {
            return None;
        }
        let flow = handler.received_into(&mut self.session, n);
        self.machine.handle_received(at.now_ms);
        Some(self.served(handler, flow, at, rules))
    }

    /// `n` more bytes of the output went out (0: only ask). True when it is all out: then
    /// it is forgotten (a bounded capacity kept) and the session told, so it lets go of
    /// the values it pinned for the send. Both engines count their sends here.
    pub(crate) fn bytes_sent<H: Handler<Session = S>>(&mut self, handler: &H, n: usize) -> bool {
        self.sent += n;
        let total = output::output_len(&self.out, handler.splices(&self.session));
        assert!(
            self.sent <= total,
            "{} bytes sent of an output of {total}",
            self.sent
        );
        if self.sent < total {
            return false;
        }
        self.output_flushed();
        handler.output_flushed(&mut self.session);
        true
    }

    /// The output is pending: buffered bytes, or values the session sends from the item.
    pub(crate) fn pending<H: Handler<Session = S>>(&self, handler: &H) -> bool {
        !self.out.is_empty() || !handler.splices(&self.session).is_empty()
    }

    /// Output fully sent: forget it, keeping a bounded capacity.
    pub(crate) fn output_flushed(&mut self) {
        let capacity = self.out.capacity();
        if capacity > 4 * OUT_KEEP && self.out.len() <= capacity / 4 {
            self.small_flushes = self.small_flushes.saturating_add(1);
        } else {
            self.small_flushes = 0;
        }
        self.out.clear();
        self.sent = 0;
        if capacity > OUT_RETAIN_MAX {
            self.out = Vec::with_capacity(OUT_KEEP);
            self.small_flushes = 0;
        } else if self.small_flushes >= SMALL_FLUSHES_BEFORE_SHRINK {
            self.out.shrink_to(OUT_KEEP);
            self.small_flushes = 0;
        }
    }
}

/// A worker's connections, addressed by slot; each slot has a generation so a completion for
/// a closed connection can never be mistaken for its successor's.
pub(crate) struct Slab<S, X> {
    slots: Vec<Option<Conn<S, X>>>,
    generations: Vec<u32>,
    free: Vec<u32>,
    live: usize,
}

impl<S, X> Slab<S, X> {
    pub(crate) fn new() -> Slab<S, X> {
        Slab {
            slots: Vec::new(),
            generations: Vec::new(),
            free: Vec::new(),
            live: 0,
        }
    }

    pub(crate) fn live(&self) -> usize {
        self.live
    }

    pub(crate) fn capacity_slots(&self) -> usize {
        self.slots.len()
    }

    /// Stores a connection; returns (slot, generation).
    pub(crate) fn insert(&mut self, conn: Conn<S, X>) -> (u32, u32) {
        self.live += 1;
        if let Some(slot) = self.free.pop() {
            self.slots[slot as usize] = Some(conn);
            (slot, self.generations[slot as usize])
        } else {
            self.slots.push(Some(conn));
            self.generations.push(0);
            (crate::sys::u32_of(self.slots.len() - 1), 0)
        }
    }

    /// The connection in `slot` if it is still generation `generation`.
    pub(crate) fn get_mut(&mut self, slot: u32, generation: u32) -> Option<&mut Conn<S, X>> {
        if self.generations.get(slot as usize).copied()? & GEN_MASK != generation & GEN_MASK {
            return None;
        }
        self.slots.get_mut(slot as usize)?.as_mut()
    }

    /// The connection in `slot`, whatever its generation (timeout scans).
    pub(crate) fn at_mut(&mut self, slot: u32) -> Option<&mut Conn<S, X>> {
        self.slots.get_mut(slot as usize)?.as_mut()
    }

    pub(crate) fn generation(&self, slot: u32) -> u32 {
        self.generations[slot as usize]
    }

    /// The worker stops (`at` carries its drain deadline): every connection is asked
    /// ([`Machine::handle_stop`]); returns the slots of the idle ones, to be closed now.
    pub(crate) fn stop(&self, at: At) -> Vec<u32> {
        let mut idle = Vec::new();
        for (slot, conn) in self.slots.iter().enumerate() {
            if conn.as_ref().is_some_and(|c| c.machine.handle_stop(at)) {
                idle.push(crate::sys::u32_of(slot));
            }
        }
        idle
    }

    /// Output sessions produce without input (`watch`), asked of every connection with
    /// nothing pending (so what one holds is at most one poll's worth): returns the
    /// connections that produced some, which the machine now sends. Both engines' ticks
    /// poll through here.
    pub(crate) fn poll_output<H: Handler<Session = S>>(&mut self, handler: &H) -> Vec<(u32, u32)> {
        let mut produced = Vec::new();
        for (slot, conn) in self.slots.iter_mut().enumerate() {
            let Some(conn) = conn.as_mut() else {
                continue;
            };
            if !conn.machine.may_poll_output() || conn.pending(handler) {
                continue;
            }
            if handler.poll_output(&mut conn.session, &mut conn.out) && !conn.out.is_empty() {
                let step = conn.machine.handle_polled_output();
                assert_eq!(step, Step::Send, "polled output goes out");
                produced.push((crate::sys::u32_of(slot), self.generations[slot]));
            }
        }
        produced
    }

    /// Removes the connection (dropping it closes the fd) and retires the slot's generation.
    pub(crate) fn remove(&mut self, slot: u32) -> Option<Conn<S, X>> {
        let conn = self.slots.get_mut(slot as usize)?.take()?;
        self.generations[slot as usize] = self.generations[slot as usize].wrapping_add(1);
        self.free.push(slot);
        self.live -= 1;
        Some(conn)
    }
}

/// The RAM copies of records the device dropped (a failed write, an eviction: ADR 0039) go,
/// so no read sees them; each only if its CAS is still the dropped record's.
pub(crate) fn forget_dropped<H: Handler>(handler: &H, outcome: &Outcome, now: Now) {
    for (key, cas) in &outcome.forget {
        handler.hooks().forget_if_cas(key, *cas, now);
    }
}

/// Settled data-device records reported to their sessions, the same for both runtimes: a
/// failed write's RAM copy dropped first, then each session told ([`Handler::on_durable`]),
/// then the connections that no longer wait for the device named for the runtime to resume.
///
/// Reports `outcome` to the sessions of `conns`; a record of a held UDP request (slot
/// [`crate::datapath::kernel_udp::HELD_SLOT`]) goes to `udp` as (id, token, durable).
/// Returns the held connections whose session holds no reply any more, each once: the
/// engine reports them served again ([`Machine::handle_served`] with what they now have).
pub(crate) fn settle_sessions<H: Handler, X>(
    handler: &H,
    conns: &mut Slab<H::Session, X>,
    outcome: &Outcome,
    now: Now,
    mut udp: impl FnMut(u32, u64, bool),
) -> Vec<(u32, u32)> {
    // A failed write's RAM copy goes before its session answers, so no read sees it.
    forget_dropped(handler, outcome, now);
    let mut touched: Vec<(u32, u32)> = Vec::new();
    for &(slot, generation, token, ok) in &outcome.settled {
        if slot == crate::datapath::kernel_udp::HELD_SLOT {
            udp(generation, token, ok);
            continue;
        }
        let Some(conn) = conns.get_mut(slot, generation) else {
            continue; // closed meanwhile: nobody waits for the reply
        };
        let ((session, out), _) = conn.session_and_out();
        handler.on_durable(session, token, ok, out);
        if touched.last() != Some(&(slot, generation)) {
            touched.push((slot, generation));
        }
    }
    touched.sort_unstable();
    touched.dedup();
    touched.retain(|&(slot, generation)| {
        let Some(conn) = conns.get_mut(slot, generation) else {
            return false;
        };
        conn.machine.held() && !handler.awaits_durable(&conn.session)
    });
    touched
}

#[cfg(test)]
mod recv_tests;
#[cfg(test)]
mod tests {
    use super::*;

    fn conn() -> Conn<(), ()> {
        Conn::new(
            crate::sys::eventfd().unwrap(),
            (),
            Machine::new(0, false),
            (),
        )
    }

    #[test]
    fn stale_generations_are_rejected() {
        let mut slab = Slab::new();
        let (slot, gen) = slab.insert(conn());
        assert!(slab.get_mut(slot, gen).is_some());
        assert!(slab.remove(slot).is_some());
        assert_eq!(slab.live(), 0);
        let (slot2, gen2) = slab.insert(conn());
        assert_eq!(slot2, slot, "slot reused");
        assert_ne!(gen2, gen);
        assert!(
            slab.get_mut(slot, gen).is_none(),
            "old completion does not reach the new connection"
        );
        assert!(slab.get_mut(slot2, gen2).is_some());
    }

    /// While the kernel reads `out` (a send in flight), what the session writes goes to the
    /// spill: `out`'s bytes never move under the send, and the completion puts it behind them.
    #[test]
    fn output_written_during_a_send_waits_behind_it_and_never_moves_out() {
        let mut c = conn();
        c.out.extend_from_slice(b"watch line\n");
        c.out.shrink_to_fit();
        let at = c.out.as_ptr();
        c.machine.handle_polled_output();
        c.machine.armed(Io::Send);
        let ((_, out), _) = c.session_and_out();
        out.extend(std::iter::repeat_n(b'x', 1 << 16));
        assert_eq!(c.out.as_ptr(), at, "out moved while the kernel read it");
        assert_eq!(
            c.out_len(),
            11 + (1 << 16),
            "the output cap counts the spill"
        );
        c.machine.handle_completed(Io::Send);
        c.send_completed();
        assert!(c.out.starts_with(b"watch line\nxxx") && c.out.len() == 11 + (1 << 16));
        let ((_, out), _) = c.session_and_out();
        out.push(b'!');
        assert_eq!(
            c.out.last(),
            Some(&b'!'),
            "no send in flight: the session writes to out"
        );
    }

    /// The output is counted as one stream: all of it out forgets it; more than there was
    /// is a broken count, refused where it is kept.
    #[test]
    fn sent_bytes_are_counted_up_to_the_output() {
        use crate::handler::echo::Echo;
        let echo = Echo::default();
        let session = echo.open(ringstore_service::Protocol::Memcache, 0);
        let fd = crate::sys::eventfd().unwrap();
        let mut c = Conn::new(fd, session, Machine::new(0, false), ());
        c.out.extend_from_slice(b"VALUE k 0 3\r\nabc\r\nEND\r\n");
        let len = c.out.len();
        assert!(!c.bytes_sent(&echo, 0));
        assert!(!c.bytes_sent(&echo, len - 1), "a short send");
        assert!(c.bytes_sent(&echo, 1), "the rest");
        assert!(c.out.is_empty() && c.sent == 0, "forgotten once out");
        c.out.extend_from_slice(b"END\r\n");
        let over =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| c.bytes_sent(&echo, 6)));
        assert!(over.is_err(), "6 bytes counted of an output of 5");
    }

    #[test]
    fn flushed_output_shrinks_after_small_flushes() {
        let mut c = conn();
        c.out.extend(std::iter::repeat_n(0u8, 100 << 10));
        c.sent = c.out.len();
        c.output_flushed();
        assert!(c.out.is_empty() && c.sent == 0);
        assert!(
            c.out.capacity() >= 100 << 10,
            "a buffer that was just used whole is kept"
        );
        for round in 0..SMALL_FLUSHES_BEFORE_SHRINK {
            assert!(
                c.out.capacity() >= 100 << 10,
                "shrunk too early, after {round} small flushes"
            );
            c.out.extend_from_slice(b"END\r\n");
            c.output_flushed();
        }
        assert!(
            c.out.capacity() <= 4 * OUT_KEEP,
            "small bursts give the memory back"
        );
    }

    #[test]
    fn a_buffer_past_the_retained_maximum_is_released_at_its_flush() {
        let mut c = conn();
        c.out.extend(std::iter::repeat_n(0u8, 1 << 20));
        c.output_flushed();
        assert!(
            c.out.capacity() <= OUT_RETAIN_MAX,
            "an idle connection kept 1 MiB"
        );
    }

    #[test]
    fn repeated_large_batches_keep_their_buffer() {
        let mut c = conn();
        for _ in 0..32 {
            c.out.extend(std::iter::repeat_n(0u8, 66 << 10));
            c.output_flushed();
            assert!(c.out.capacity() >= 66 << 10);
        }
    }
}
