//! Pins: a value's bytes lent to the runtime while a send of them is in flight (zero-copy
//! GET replies, docs/adr/0027-big-values-sent-from-the-item.md).
//!
//! A [`Pin`] names a segment of one shard (shard, slot) and a byte range in it; while a
//! segment has pins it is never compacted, reset or handed back to the pool. Eviction,
//! overwrite, delete, flush_all or a reset of a pinned segment drop its items from the
//! index as usual, but the segment itself becomes an *orphan*: still counted as in use
//! against the memory budget, holding no live item, freed when its last pin is released
//! ([`crate::Store::unpin`]). At most [`PinCounts::max_segments`] segments of the store are
//! pinned at once (an eighth of the arena, give or take one per concurrently reading worker): past that no pin is granted and the caller
//! copies the value instead, so no number of non-reading clients can pin the arena.
//!
//! This crate forbids `unsafe`: a pin only carries the address of the bytes (taken with
//! `as_ptr`, its provenance exposed), and the runtime's unsafe send reads them under the pin
//! invariant: the segment is not recycled or rewritten while pinned.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Value bytes lent out of the arena; give it back with [`crate::Store::unpin`].
///
/// Not `Clone`: each pin is released once. A pin that is dropped without being released
/// keeps its segment out of the pool for good (safe, but a leak the budget keeps counting).
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a pin holds its segment until Store::unpin"]
pub struct Pin {
    pub(crate) shard: u32,
    pub(crate) slot: u16,
    /// Exposed address of the first value byte.
    pub(crate) addr: usize,
    pub(crate) len: usize,
}

impl Pin {
    /// The first pinned byte. Reading `len()` bytes from it is sound while the pin is held
    /// and the store that granted it is alive: the segment is neither rewritten nor recycled
    /// until [`crate::Store::unpin`] (a segment still pinned when its store is dropped is
    /// leaked, never reused).
    pub fn as_ptr(&self) -> *const u8 {
        std::ptr::with_exposed_provenance(self.addr)
    }

    /// Bytes pinned.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no byte is pinned (never, for a pin the store granted).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Handed to the closure of [`crate::Journaled::try_get_pinned`]: it may ask for the value it
/// sees to be pinned instead of copying it.
#[derive(Debug)]
pub struct PinRequest {
    pub(crate) possible: bool,
    /// Not possible only because of the store's cap.
    pub(crate) capped: bool,
    pub(crate) wanted: bool,
    pub(crate) asked: bool,
}

impl PinRequest {
    /// Asks for the value to be pinned; false (and no pin) when that is not possible: the
    /// value is not in RAM (read from the data device) or the store's pin cap is reached.
    /// When it returns true the pin is granted.
    pub fn want(&mut self) -> bool {
        self.asked = true;
        self.wanted = self.possible;
        self.possible
    }
}

/// The store-wide pin accounting.
#[derive(Debug)]
pub(crate) struct PinCounts {
    /// Segments with at least one pin.
    pub segments: AtomicUsize,
    /// Of those, segments whose items are gone (held only by pins), waiting for the last unpin.
    pub orphans: AtomicUsize,
    /// Pins granted since start.
    pub granted: AtomicU64,
    /// Pins refused at the cap.
    pub refused: AtomicU64,
    /// Most segments pinned at once.
    pub max_segments: usize,
}

impl PinCounts {
    /// One eighth of `segments` (at least one) may be pinned at once.
    pub(crate) fn new(segments: usize) -> PinCounts {
        PinCounts {
            segments: AtomicUsize::new(0),
            orphans: AtomicUsize::new(0),
            granted: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            max_segments: (segments / 8).max(1),
        }
    }

    /// Whether a segment not pinned yet may be: fewer than the cap are. Checked before the
    /// caller decides (it then writes its reply without the value); concurrent readers on
    /// other shards may each pass it, so the count can pass the cap by at most one segment
    /// per worker reading at that moment.
    pub(crate) fn room(&self) -> bool {
        self.segments.load(Ordering::Acquire) < self.max_segments
    }
}
