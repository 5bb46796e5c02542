//! One shard's side of NUMA sub memory (ADR 0035): demoting an item the local region cannot
//! keep to a sub region, counting reads by region, and promoting a queued foreign item back.
//!
//! Both moves are copies under the shard lock (memory only, no I/O). The index is pointed
//! at the new copy and the old one is killed like an overwritten item, so a segment that is
//! pinned keeps its bytes untouched until its last send completes (ADR-0027); promotion
//! does not even copy out of a pinned segment, it waits for the next read after the send.

use super::{key_at, Loc, Shard, Shared, LOCAL, SUB};
use crate::item::{self, Header};

impl Shard {
    /// Copies the item of `len` bytes at `old` (a local item being reclaimed) into the sub
    /// regions and points the index there; `false` when they have no room (then it is evicted).
    pub(super) fn demote(
        &mut self,
        sh: &Shared,
        hash: u64,
        old: Loc,
        len: usize,
        now: u32,
    ) -> bool {
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.clear();
        scratch.extend_from_slice(&self.bytes(old)[..len]);
        let placed = self.alloc(sh, len, now, SUB, item::has_exptime(&scratch));
        let done = match placed {
            Ok((slot, off)) => {
                let s = self.slot_mut(slot);
                s.seg.bytes[off..off + len].copy_from_slice(&scratch);
                s.live_bytes += len;
                s.live_items += 1;
                self.index.replace(hash, |l| l == old, Loc::at(slot, off));
                self.counters.demotions += 1;
                true
            }
            Err(_) => false,
        };
        self.scratch = scratch;
        done
    }

    /// Counts a read of the item at `loc` by region; a foreign one scores toward promotion.
    pub(crate) fn note_hit(&mut self, sh: &Shared, hash: u64, loc: Loc, now: u32) {
        if sh.subs.is_empty() {
            return;
        }
        let slot = loc.slot();
        if self.slot(slot).region == 0 {
            self.counters.get_hits_local += 1;
        } else {
            self.counters.get_hits_foreign += 1;
            if self.scores.hit(hash, now) == crate::tier::WARM_SCORE {
                self.slot_mut(slot).hot += 1;
            }
        }
    }

    /// The region of the item at `loc` (0 local, `r + 1` sub region `r`).
    #[cfg(test)]
    pub(crate) fn region_at(&self, loc: Loc) -> u8 {
        self.slot(loc.slot()).region
    }

    /// Items queued for promotion.
    #[cfg(test)]
    pub(crate) fn queued(&self) -> usize {
        self.scores.queue.len()
    }

    /// Score entries looked at by reads so far, and the table's capacity.
    #[cfg(test)]
    pub(crate) fn score_work(&self) -> (u64, usize) {
        (self.scores.touched(), self.scores.capacity())
    }

    /// Promotes up to `max` queued items; returns how many were tried.
    pub(crate) fn exchange(&mut self, sh: &Shared, now: u32, max: usize) -> usize {
        let n = self.scores.queue.len().min(max);
        let batch: Vec<u64> = self.scores.queue.drain(..n).collect();
        for &hash in &batch {
            self.promote(sh, hash, now);
        }
        n
    }

    /// Copies the foreign item `hash` into the local region (whose reclaiming may demote
    /// colder local items in exchange). Not while its segment is pinned, nor when it is gone,
    /// expired or already local.
    fn promote(&mut self, sh: &Shared, hash: u64, now: u32) -> bool {
        let slots = &self.slots;
        let foreign = |l: Loc| slots[l.slot()].as_ref().is_some_and(|s| s.region != 0);
        let Some(loc) = self.index.find(hash, foreign) else {
            self.scores.forget(hash);
            return false;
        };
        if self.pinned(loc.slot()) {
            self.scores.unqueue(hash);
            return false;
        }
        let h = Header::read(self.bytes(loc));
        if h.expired(now) {
            self.scores.forget(hash);
            return false;
        }
        let len = h.len();
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.clear();
        scratch.extend_from_slice(&self.bytes(loc)[..len]);
        let done = match self.alloc(sh, len, now, LOCAL, item::has_exptime(&scratch)) {
            Ok((slot, off)) => {
                let s = self.slot_mut(slot);
                let dst = &mut s.seg.bytes[off..off + len];
                dst.copy_from_slice(&scratch);
                // Hot: the local second chance keeps it through the next reclaim.
                item::set_bits(dst, h.bits | item::ACCESSED);
                s.live_bytes += len;
                s.live_items += 1;
                let new = Loc::at(slot, off);
                let key = item::key(&scratch);
                let slots = &self.slots;
                // Reclaiming local room may have demoted or evicted other items; the old copy
                // is found by its key wherever it is now.
                let old = self
                    .index
                    .replace(hash, |l| l != new && key_at(slots, l) == key, new);
                if let Some(old) = old {
                    self.kill(sh, old);
                    self.counters.promotions += 1;
                } else {
                    // Evicted while room was made: the copy is garbage.
                    self.kill(sh, new);
                }
                self.scores.forget(hash);
                old.is_some()
            }
            Err(_) => {
                self.scores.unqueue(hash);
                false
            }
        };
        self.scratch = scratch;
        done
    }
}
