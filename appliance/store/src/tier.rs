//! NUMA sub memory (ADR 0035): the sub regions' description, and the decayed access scores
//! that decide which items held on a foreign node are promoted to the local region.
//!
//! A shard keeps one [`Scores`] table for the foreign items read recently. A read of a
//! foreign item adds one to its score after halving it once per [`SCORE_HALF_LIFE_SECS`]
//! since its last read (the decay is applied first: it has priority over promotion); a
//! score that reaches [`PROMOTE_SCORE`] queues the item for promotion, which the
//! background exchange ([`crate::Store::exchange`]) carries out.

use std::collections::HashMap;

use crate::arena::BindFn;
use crate::Time;

/// A read score at which a foreign item is queued for promotion.
pub const PROMOTE_SCORE: u16 = 4;
/// A score halves after this many seconds without a read.
pub const SCORE_HALF_LIFE_SECS: Time = 4;
/// A score at which a foreign item counts as warm: its segment is then spared by the sub
/// regions' eviction while colder ones are at hand (read more than once since demoted).
pub(crate) const WARM_SCORE: u16 = 2;
/// Items waiting for promotion per shard; more are not queued until the exchange catches up
/// (their scores stay, so their next read queues them).
pub(crate) const PROMOTE_QUEUE_MAX: usize = 256;
/// Fewest score entries a shard may hold, whatever its share of the sub regions.
const SCORES_MIN: usize = 64;
/// A shard holds one score entry per this many bytes of its share of the sub regions
/// (about 24 bytes each: at most 1.2% of the sub memory).
pub(crate) const SCORE_BYTES_PER_ENTRY: usize = 2048;

/// One region of item memory on another NUMA node.
#[derive(Debug, Clone, Copy)]
pub struct SubRegion {
    /// Its size; a whole number of segments of it is used.
    pub bytes: usize,
    /// The node its pages are bound to.
    pub node: u32,
    /// Binds the fresh mapping to `node` before it is touched; `None` leaves it to the
    /// thread's policy (the test-only simulation, where the "foreign" node is the local one).
    pub bind: Option<BindFn>,
    /// Advise transparent huge pages.
    pub huge_pages: bool,
}

/// One region's fill, for `stats` and the console.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionStats {
    /// `None`: the local region; `Some(n)`: the sub region on node `n`.
    pub node: Option<u32>,
    /// Bytes of the region (whole segments).
    pub bytes: u64,
    /// Bytes of its segments handed to shards.
    pub used_bytes: u64,
    /// Its address ranges `(start, length)`, ascending and merged: what the tuning check
    /// looks up in `/proc/self/numa_maps`.
    pub spans: Vec<(u64, u64)>,
}

#[derive(Debug, Clone, Copy)]
struct Score {
    value: u16,
    /// When it was last read (store time).
    at: Time,
    /// Queued for promotion and not yet tried.
    queued: bool,
}

/// A shard's scores of foreign items (by key hash), bounded to `max` entries.
#[derive(Debug, Default)]
pub(crate) struct Scores {
    /// Keyed by the key's hash already: a cheap fixed hasher is enough.
    map: HashMap<u64, Score, foldhash::fast::FixedState>,
    max: usize,
    /// Hashes of items to promote, oldest first, at most [`PROMOTE_QUEUE_MAX`].
    pub queue: Vec<u64>,
}

/// `value` halved once per half-life elapsed from `at` to `now`.
fn decayed(value: u16, at: Time, now: Time) -> u16 {
    let halvings = now.saturating_sub(at) / SCORE_HALF_LIFE_SECS;
    value.checked_shr(halvings).unwrap_or(0)
}

impl Scores {
    /// A table of at most `share / SCORE_BYTES_PER_ENTRY` entries (at least 64) for a shard
    /// whose share of the sub regions is `share` bytes.
    pub(crate) fn new(share: usize) -> Scores {
        Scores {
            map: HashMap::default(),
            max: (share / SCORE_BYTES_PER_ENTRY).max(SCORES_MIN),
            queue: Vec::new(),
        }
    }

    /// Counts a read of the foreign item `hash` at `now`; queues it once its score reaches
    /// [`PROMOTE_SCORE`]. A full table first decays every entry (dropping those at zero); a
    /// read that still finds no room is not counted. Returns the new score (0: not counted).
    pub(crate) fn hit(&mut self, hash: u64, now: Time) -> u16 {
        if self.map.len() >= self.max && !self.map.contains_key(&hash) {
            self.decay_all(now);
            if self.map.len() >= self.max {
                return 0;
            }
        }
        let s = self.map.entry(hash).or_insert(Score {
            value: 0,
            at: now,
            queued: false,
        });
        s.value = decayed(s.value, s.at, now).saturating_add(1);
        s.at = now;
        if s.value >= PROMOTE_SCORE && !s.queued && self.queue.len() < PROMOTE_QUEUE_MAX {
            s.queued = true;
            self.queue.push(hash);
        }
        s.value
    }

    /// Applies the decay to every entry and drops those that reach zero.
    fn decay_all(&mut self, now: Time) {
        self.map.retain(|_, s| {
            s.value = decayed(s.value, s.at, now);
            s.at = now;
            s.value > 0 || s.queued
        });
    }

    /// The item `hash` was promoted, or is gone: forget its score.
    pub(crate) fn forget(&mut self, hash: u64) {
        self.map.remove(&hash);
    }

    /// Its promotion was tried and could not be done now: its next read may queue it again.
    pub(crate) fn unqueue(&mut self, hash: u64) {
        if let Some(s) = self.map.get_mut(&hash) {
            s.queued = false;
        }
    }

    /// The current (decayed) score of `hash`, for tests.
    #[cfg(test)]
    pub(crate) fn score(&self, hash: u64, now: Time) -> u16 {
        self.map
            .get(&hash)
            .map_or(0, |s| decayed(s.value, s.at, now))
    }

    /// Entries held.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// Most entries it may hold.
    #[cfg(test)]
    pub(crate) fn capacity(&self) -> usize {
        self.max
    }

    /// Drops every score and queued promotion (flush_all).
    pub(crate) fn clear(&mut self) {
        self.map.clear();
        self.queue.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decay_comes_before_the_threshold() {
        let mut s = Scores::new(0);
        for _ in 0..3 {
            s.hit(7, 100);
        }
        assert_eq!(s.score(7, 100), 3);
        assert!(s.queue.is_empty());
        // One half-life later 3 decays to 1; this read makes 2, not 4: no promotion.
        s.hit(7, 100 + SCORE_HALF_LIFE_SECS);
        assert_eq!(s.score(7, 100 + SCORE_HALF_LIFE_SECS), 2);
        assert!(s.queue.is_empty(), "a decayed score does not promote");
        s.hit(7, 100 + SCORE_HALF_LIFE_SECS);
        s.hit(7, 100 + SCORE_HALF_LIFE_SECS);
        assert_eq!(s.queue, vec![7], "four reads within a half-life promote");
        s.hit(7, 100 + SCORE_HALF_LIFE_SECS);
        assert_eq!(s.queue, vec![7], "queued once");
        assert_eq!(
            s.score(7, 100 + 64 * SCORE_HALF_LIFE_SECS),
            0,
            "no overflow of the shift"
        );
    }

    #[test]
    fn the_table_and_the_queue_stay_within_their_bounds() {
        let mut s = Scores::new(0);
        assert_eq!(s.capacity(), SCORES_MIN);
        // An attacker reading many distinct foreign keys cannot grow the table.
        for h in 0..10_000u64 {
            s.hit(h, 1);
        }
        assert_eq!(s.len(), SCORES_MIN);
        // Once the old entries decay to zero, new keys get room again.
        s.hit(99_999, 1 + 20 * SCORE_HALF_LIFE_SECS);
        assert_eq!(s.len(), 1);
        let mut s = Scores::new(1 << 30);
        for h in 0..(2 * PROMOTE_QUEUE_MAX as u64) {
            for _ in 0..PROMOTE_SCORE {
                s.hit(h, 5);
            }
        }
        assert_eq!(s.queue.len(), PROMOTE_QUEUE_MAX);
        s.unqueue(3);
        s.forget(4);
        assert_eq!(s.score(4, 5), 0);
        s.clear();
        assert_eq!((s.len(), s.queue.len()), (0, 0));
    }
}
