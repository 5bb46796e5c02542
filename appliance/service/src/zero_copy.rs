//! Values sent from the item (docs/adr/0027-big-values-sent-from-the-item.md): a GET hit of
//! at least [`ZERO_COPY_MIN`] bytes is not copied into the output; its value bytes stay
//! pinned in the store's arena and the runtime sends them with a vectored send, spliced into
//! the output at the offset the session recorded.
//!
//! Limits, each with a fallback to the copy path (counted as `zero_copy_fallbacks`): a
//! connection pins at most [`CONN_PINNED_MAX`] bytes, a worker at most
//! [`WORKER_PINNED_MAX`] (the `pinned_bytes` gauge), the store at most an eighth of its
//! segments. Pins are released when the runtime reports the output sent (or the connection
//! gone, once no send is in flight): a client that never reads holds its connection's
//! share until the idle timeout closes it.

use ringstore_durable::units::usize_from;
use ringstore_store::{Pin, PinRequest};

use crate::{Shared, WorkerStats};

/// Values of at least this many bytes are sent from the item; smaller ones are copied. 4 KiB
/// since issue 24: at depth 16 the copy of 4 KiB values into the output was a fifth of the
/// worker's CPU, and sending them from the item cut GET 4 KiB's server CPU per request by
/// about 12% there with depth 1 unchanged (ADR 0027's amendment, docs/BENCHMARKS.md); below
/// 4 KiB the pin bookkeeping and an iovec entry per value are not repaid.
pub const ZERO_COPY_MIN: usize = 4 << 10;
/// Value bytes one connection may have pinned at once.
pub const CONN_PINNED_MAX: usize = 2 << 20;
/// Value bytes one worker's connections may have pinned at once, together.
pub const WORKER_PINNED_MAX: usize = 64 << 20;

/// Pinned value bytes that go out at output offset `at` (before the byte there).
#[derive(Debug)]
pub struct Splice {
    pub at: usize,
    pub pin: Pin,
}

/// One connection's spliced values, in output order.
#[derive(Debug, Default)]
pub(crate) struct ZeroCopy {
    /// Off for transports that copy their output elsewhere (UDP) and with a data device
    /// (held replies move output bytes).
    pub enabled: bool,
    pub splices: Vec<Splice>,
    /// Bytes of `splices` together.
    pub pinned: usize,
}

impl ZeroCopy {
    /// Whether a value of `len` bytes may be pinned within the connection's and the
    /// worker's caps (the store's cap is checked by the store).
    pub(crate) fn room(&self, stats: &WorkerStats, len: usize) -> bool {
        self.pinned + len <= CONN_PINNED_MAX
            && usize_from(stats.pinned_bytes.get()) + len <= WORKER_PINNED_MAX
    }

    /// The value size from which a read on this connection asks for a pin: [`ZERO_COPY_MIN`],
    /// or never when the connection copies (`enabled` off) or has a data device (`device`).
    pub(crate) fn pin_from(&self, device: bool) -> usize {
        match self.enabled && !device {
            true => ZERO_COPY_MIN,
            false => usize::MAX,
        }
    }

    /// Decides, under the shard lock, whether a value of `len` bytes read with `pin_from`
    /// goes out from the item: true when it is big enough, within the connection's and the
    /// worker's caps, and the store grants `pin`. A big value that stays on the copy path
    /// counts as a fallback.
    pub(crate) fn splice(
        &self,
        stats: &WorkerStats,
        len: usize,
        pin_from: usize,
        pin: &mut PinRequest,
    ) -> bool {
        if len < pin_from {
            return false;
        }
        if self.room(stats, len) && pin.want() {
            return true;
        }
        stats.zero_copy_fallbacks.inc();
        false
    }

    /// Records `pin`, whose bytes go out at output offset `at`.
    pub(crate) fn push(&mut self, stats: &WorkerStats, at: usize, pin: Pin) {
        debug_assert!(self.splices.last().is_none_or(|s| s.at <= at));
        self.pinned += pin.len();
        stats.pinned_bytes.add(pin.len() as u64);
        stats.zero_copy_sends.inc();
        stats.bytes_written.add(pin.len() as u64);
        self.splices.push(Splice { at, pin });
    }

    /// Releases the pins of splices at output offset `from` or later (all with 0): their
    /// output was sent, or taken back.
    pub(crate) fn release_from(&mut self, shared: &Shared, stats: &WorkerStats, from: usize) {
        let keep = self.splices.partition_point(|s| s.at < from);
        for s in self.splices.drain(keep..) {
            self.pinned -= s.pin.len();
            // A gauge: the owning worker subtracts what it added.
            stats.pinned_bytes.add((s.pin.len() as u64).wrapping_neg());
            shared.store.unpin(s.pin);
        }
    }
}
