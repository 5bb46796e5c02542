//! The free-segment pool shared by all shards, and the memory budget it enforces.
//!
//! Lock order: a shard lock may be held while taking the pool lock, never the reverse.
//! Each shard is guaranteed [`MIN_HELD`] segments: a shard below that may always take one,
//! a shard above it only while more segments are free than other shards' guarantees
//! still need. So no shard is starved by others that grabbed the whole arena first.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::arena::Segment;

/// Segments every shard may count on (one to write into, one to reclaim from).
pub(crate) const MIN_HELD: usize = 2;

pub(crate) struct Pool {
    inner: Mutex<Inner>,
    seg_size: usize,
    budget: usize,
    /// Bytes of every shard's index allocation together.
    index_bytes: AtomicUsize,
}

struct Inner {
    free: Vec<Segment>,
    in_use: usize,
    /// Sum over shards of `MIN_HELD - held` where positive.
    reserved: usize,
}

impl Pool {
    pub(crate) fn new(free: Vec<Segment>, seg_size: usize, budget: usize, shards: usize) -> Pool {
        Pool {
            inner: Mutex::new(Inner {
                free,
                in_use: 0,
                reserved: shards * MIN_HELD,
            }),
            seg_size,
            budget,
            index_bytes: AtomicUsize::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes a free segment for a shard that holds `held` segments, if the budget and the
    /// other shards' guarantees allow it.
    pub(crate) fn take(&self, held: usize) -> Option<Segment> {
        let mut p = self.lock();
        if (p.in_use + 1) * self.seg_size + self.index_bytes.load(Ordering::Relaxed) > self.budget {
            return None;
        }
        let guaranteed = held < MIN_HELD;
        if !guaranteed && p.free.len() <= p.reserved {
            return None;
        }
        let seg = p.free.pop()?;
        p.in_use += 1;
        if guaranteed {
            // A shard below its guarantee was counted in `reserved` (TIGER_STYLE: the
            // accounting is asserted where it is kept; once per segment, not per item).
            assert!(
                p.reserved > 0,
                "pool: a guaranteed take with nothing reserved"
            );
            p.reserved -= 1;
        }
        assert!(
            p.in_use * self.seg_size <= self.budget,
            "pool: {} segments in use exceed the budget of {} bytes",
            p.in_use,
            self.budget
        );
        Some(seg)
    }

    /// Returns a segment from a shard that holds `held_after` segments once it is gone.
    pub(crate) fn give(&self, seg: Segment, held_after: usize) {
        let mut p = self.lock();
        assert!(
            p.in_use > 0,
            "pool: a segment given back that was never taken"
        );
        p.free.push(seg);
        p.in_use -= 1;
        if held_after < MIN_HELD {
            p.reserved += 1;
        }
    }

    /// Takes out of the free list every segment `wanted` picks, without counting them as
    /// in use: a sealed region's segments, each then adopted by its shard ([`Pool::adopt`]).
    pub(crate) fn take_where(&self, mut wanted: impl FnMut(&Segment) -> bool) -> Vec<Segment> {
        let mut p = self.lock();
        let (taken, free): (Vec<Segment>, Vec<Segment>) = std::mem::take(&mut p.free)
            .into_iter()
            .partition(|s| wanted(s));
        p.free = free;
        taken
    }

    /// Each free segment's address and a copy of its bytes (tests).
    #[cfg(test)]
    pub(crate) fn free_copies(&self) -> Vec<(usize, Vec<u8>)> {
        let p = self.lock();
        p.free
            .iter()
            .map(|s| (s.bytes.as_ptr() as usize, s.bytes.to_vec()))
            .collect()
    }

    /// Counts a segment from [`Pool::take_where`] as taken by a shard holding `held`.
    pub(crate) fn adopt(&self, held: usize) {
        let mut p = self.lock();
        p.in_use += 1;
        if held < MIN_HELD && p.reserved > 0 {
            p.reserved -= 1;
        }
    }

    /// Records a change of one shard's index allocation.
    pub(crate) fn index_grew(&self, old: usize, new: usize) {
        if new >= old {
            self.index_bytes.fetch_add(new - old, Ordering::Relaxed);
        } else {
            let before = self.index_bytes.fetch_sub(old - new, Ordering::Relaxed);
            // The shard's old allocation was counted here: shrinking below zero would wrap.
            assert!(
                before >= old - new,
                "pool: index bytes {before} shrunk by {}",
                old - new
            );
        }
    }

    pub(crate) fn index_bytes(&self) -> usize {
        self.index_bytes.load(Ordering::Relaxed)
    }

    /// Bytes of segments handed out to shards.
    pub(crate) fn segment_bytes(&self) -> usize {
        self.lock().in_use * self.seg_size
    }

    /// Segments not handed out.
    pub(crate) fn free_count(&self) -> usize {
        self.lock().free.len()
    }

    /// Bytes of every segment it was made with.
    pub(crate) fn total_bytes(&self) -> usize {
        let p = self.lock();
        (p.free.len() + p.in_use) * self.seg_size
    }

    /// Whether segments in use plus the index exceed the budget.
    pub(crate) fn over_budget(&self) -> bool {
        self.segment_bytes() + self.index_bytes() > self.budget
    }

    /// Empties the pool (for recycling when the store is dropped).
    pub(crate) fn drain(&mut self) -> Vec<Segment> {
        std::mem::take(&mut self.inner.get_mut().unwrap_or_else(|e| e.into_inner()).free)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arena;

    #[test]
    fn guarantees_and_budget_hold() {
        let segs = arena::allocate(6, 4096, false).expect("map");
        // 6 segments, 2 shards: 4 reserved; budget for 5 segments.
        let pool = Pool::new(segs, 4096, 5 * 4096, 2);
        let a1 = pool.take(0).expect("guaranteed");
        let a2 = pool.take(1).expect("guaranteed");
        // Shard A now holds 2; 4 free, 2 still reserved for shard B.
        let a3 = pool.take(2).expect("spare");
        let a4 = pool.take(3).expect("spare");
        assert!(pool.take(4).is_none(), "the last two are B's guarantee");
        let b1 = pool.take(0).expect("B guaranteed");
        assert!(pool.take(1).is_none(), "budget allows only 5 segments");
        pool.give(b1, 0);
        pool.index_grew(0, 100);
        assert!(
            pool.take(0).is_none(),
            "the index counts against the budget"
        );
        pool.index_grew(100, 0);
        let b1 = pool
            .take(0)
            .expect("B can take its guaranteed segment again");
        assert!(!pool.over_budget());
        pool.index_grew(0, 4096);
        assert!(pool.over_budget());
        pool.give(b1, 0);
        let mut pool = pool;
        for s in [a1, a2, a3, a4] {
            pool.give(s, 5);
        }
        let all = pool.drain();
        assert_eq!(all.len(), 6);
        arena::recycle(all);
    }
}
