//! One connection's I/O state on its worker, and the slab that owns every connection of a worker.

use std::os::fd::OwnedFd;

use ringstore_service::{Flow, Now};

use crate::durable::Outcome;
use crate::handler::Handler;
use crate::linger::Linger;
use crate::op::GEN_MASK;

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
pub(crate) struct Conn<S> {
    pub fd: OwnedFd,
    pub session: S,
    /// Replies not yet fully sent; never touched while a send is in flight.
    pub out: Vec<u8>,
    /// How much of the output the kernel has taken: of `out`, with the session's spliced
    /// values counted where they go (`worker/send_vec.rs`).
    pub sent: usize,
    pub recv_armed: bool,
    pub send_armed: bool,
    /// What to do once `out` is flushed.
    pub after_send: Flow,
    /// Close requested; the fd is closed once no operation is in flight.
    pub closing: bool,
    /// Last completed receive or send (idle timeout).
    pub last_active_ms: u64,
    /// When the currently buffered partial request started (slow-client timeout).
    pub partial_since_ms: Option<u64>,
    /// Receive buffer when the kernel has no provided-buffer rings.
    pub own_buf: Option<Box<[u8]>>,
    /// The session holds a reply until the data device settles its records: nothing is
    /// sent or read until [`crate::handler::Handler::on_durable`] released it.
    pub awaits_device: bool,
    /// Set once the last reply is sent and the write side shut: reading only to discard.
    pub linger: Option<Linger>,
    /// Flushes in a row that used at most a quarter of `out`'s capacity.
    small_flushes: u8,
    /// `sendmsg` state for output with spliced values (made on first use).
    // The one import from `worker` back into `conn`, on purpose: the connection owns its
    // vectored send's state (the iovecs and msghdr the kernel reads until the SENDMSG
    // completes, so it must live as long as the connection's op), while the type and the
    // code that fills and submits it stay with the worker's ring code (`worker/send_vec.rs`).
    pub vec_send: Option<Box<crate::worker::send_vec::VecSend>>,
    /// The readiness runtime only: the socket may hold input (an edge was reported and no
    /// read has found it empty since; ADR 0033).
    pub ready_in: bool,
}

impl<S> Conn<S> {
    pub(crate) fn new(fd: OwnedFd, session: S, now_ms: u64, own_buf: Option<Box<[u8]>>) -> Conn<S> {
        Conn {
            fd,
            session,
            out: Vec::new(),
            sent: 0,
            recv_armed: false,
            send_armed: false,
            after_send: Flow::Continue,
            closing: false,
            last_active_ms: now_ms,
            partial_since_ms: None,
            own_buf,
            awaits_device: false,
            linger: None,
            small_flushes: 0,
            vec_send: None,
            ready_in: false,
        }
    }

    /// Whether the worker's tick closes this connection at `now_ms`: its lingering close
    /// ran out, its started request is older than `request_timeout_ms` (a slow client), it
    /// sat idle `idle_timeout_ms` (0 = never), or the stop's drain deadline passed. Both
    /// runtimes ask this (ADR 0033).
    pub(crate) fn due_to_close(
        &self,
        now_ms: u64,
        request_timeout_ms: u64,
        idle_timeout_ms: u64,
        past_deadline: bool,
    ) -> bool {
        if let Some(linger) = &self.linger {
            return linger.expired(now_ms) || past_deadline;
        }
        let slow = self
            .partial_since_ms
            .is_some_and(|since| now_ms.saturating_sub(since) >= request_timeout_ms);
        let idle = idle_timeout_ms > 0
            && self.partial_since_ms.is_none()
            && now_ms.saturating_sub(self.last_active_ms) >= idle_timeout_ms;
        slow || idle || past_deadline
    }

    /// [`Conn::due_to_close`], or the session's own reason ([`Handler::expired`]): what both
    /// runtimes' ticks close a connection for.
    pub(crate) fn closed_by_tick<H: Handler<Session = S>>(
        &mut self,
        handler: &H,
        now_ms: u64,
        limits: &crate::worker::Limits,
        past_deadline: bool,
    ) -> bool {
        self.due_to_close(
            now_ms,
            limits.request_timeout_ms,
            limits.idle_timeout_ms,
            past_deadline,
        ) || handler.expired(&mut self.session, now_ms)
    }

    pub(crate) fn in_flight(&self) -> bool {
        self.recv_armed || self.send_armed
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
pub(crate) struct Slab<S> {
    slots: Vec<Option<Conn<S>>>,
    generations: Vec<u32>,
    free: Vec<u32>,
    live: usize,
}

impl<S> Slab<S> {
    pub(crate) fn new() -> Slab<S> {
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
    pub(crate) fn insert(&mut self, conn: Conn<S>) -> (u32, u32) {
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
    pub(crate) fn get_mut(&mut self, slot: u32, generation: u32) -> Option<&mut Conn<S>> {
        if self.generations.get(slot as usize).copied()? & GEN_MASK != generation & GEN_MASK {
            return None;
        }
        self.slots.get_mut(slot as usize)?.as_mut()
    }

    /// The connection in `slot`, whatever its generation (timeout scans).
    pub(crate) fn at_mut(&mut self, slot: u32) -> Option<&mut Conn<S>> {
        self.slots.get_mut(slot as usize)?.as_mut()
    }

    pub(crate) fn generation(&self, slot: u32) -> u32 {
        self.generations[slot as usize]
    }

    /// Removes the connection (dropping it closes the fd) and retires the slot's generation.
    pub(crate) fn remove(&mut self, slot: u32) -> Option<Conn<S>> {
        let conn = self.slots.get_mut(slot as usize)?.take()?;
        self.generations[slot as usize] = self.generations[slot as usize].wrapping_add(1);
        self.free.push(slot);
        self.live -= 1;
        Some(conn)
    }
}

/// Settled data-device records reported to their sessions, the same for both runtimes: a
/// failed write's RAM copy dropped first, then each session told ([`Handler::on_durable`]),
/// then the connections that no longer wait for the device named for the runtime to resume.
///
/// Reports `outcome` to the sessions of `conns`; a record of a held UDP request (slot
/// [`crate::datapath::kernel_udp::HELD_SLOT`]) goes to `udp` as (id, token, durable).
/// Returns the connections whose session holds no reply any more (their `awaits_device`
/// cleared), each once: the runtime sends what they now have and goes on per `after_send`.
pub(crate) fn settle_sessions<H: Handler>(
    handler: &H,
    conns: &mut Slab<H::Session>,
    outcome: &Outcome,
    now: Now,
    mut udp: impl FnMut(u32, u64, bool),
) -> Vec<(u32, u32)> {
    // A failed write's RAM copy goes before its session answers, so no read sees it.
    for (key, cas) in &outcome.forget {
        handler.forget_if_cas(key, *cas, now);
    }
    let mut touched: Vec<(u32, u32)> = Vec::new();
    for &(slot, generation, token, ok) in &outcome.settled {
        if slot == crate::datapath::kernel_udp::HELD_SLOT {
            udp(generation, token, ok);
            continue;
        }
        let Some(conn) = conns.get_mut(slot, generation) else {
            continue; // closed meanwhile: nobody waits for the reply
        };
        handler.on_durable(&mut conn.session, token, ok, &mut conn.out);
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
        if !conn.awaits_device || handler.awaits_durable(&conn.session) {
            return false;
        }
        conn.awaits_device = false;
        true
    });
    touched
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn() -> Conn<()> {
        Conn::new(crate::sys::eventfd().unwrap(), (), 0, None)
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
