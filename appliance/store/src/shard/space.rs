//! Making room in a shard: taking segments from the pool, growing the index within the
//! budget, and compacting a segment in place, which reclaims garbage from overwrites and
//! deletes and evicts what the second chance does not keep (docs/adr/0003-eviction.md).
use std::hash::BuildHasher;

use super::{slot_id, Loc, SegSlot, Shard, Shared, Why, LOCAL, SLOTS_MAX, SUB};
use crate::item::{self, Header};
use crate::{Evicted, StoreError};

/// How many of the oldest segments are looked at for one that is mostly garbage.
const DEAD_SCAN: usize = 8;

/// Which live items a compaction keeps.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Keep {
    /// Every live item (reclaiming garbage only).
    All,
    /// Items read since they were written or last kept (second chance).
    Accessed,
}

impl Shard {
    /// Grows the index before it would grow on its own, and gives segments back until
    /// segments plus index fit the budget again.
    pub(super) fn ensure_index_room(&mut self, sh: &Shared, now: u32) {
        if !self.index.full() {
            return;
        }
        let before = self.index.allocation_size();
        self.index.grow();
        sh.pool.index_grew(before, self.index.allocation_size());
        while sh.pool.over_budget() {
            let Some(victim) = self.lanes[LOCAL].fifo.pop_front() else {
                break;
            };
            self.compact(sh, usize::from(victim), 0, Keep::Accessed, now);
            if self.slots[usize::from(victim)].is_some() {
                self.release(sh, usize::from(victim));
            }
        }
    }

    /// Finds `len` bytes in the active segment of `lane` ([`LOCAL`] or [`SUB`]), taking a
    /// segment from the pool or reclaiming the oldest one when it is full. Reclaiming a
    /// local segment demotes what it does not keep to the sub regions when they have room.
    /// `expires`: the item to be written there carries an exptime (`SegSlot::may_expire`).
    #[expect(
        clippy::expect_used,
        reason = "mostly_dead returns a position inside the FIFO it just walked"
    )]
    pub(super) fn alloc(
        &mut self,
        sh: &Shared,
        len: usize,
        now: u32,
        lane: usize,
        expires: bool,
    ) -> Result<(usize, usize), StoreError> {
        debug_assert!(len <= sh.seg_size);
        loop {
            if let Some(a) = self.lanes[lane].active {
                let a = usize::from(a);
                let seg_size = sh.seg_size;
                let pinned = self.pinned(a);
                let s = self.slot_mut(a);
                if s.write + len <= seg_size {
                    let off = s.write;
                    s.write += len;
                    s.may_expire |= expires;
                    return Ok((a, off));
                }
                if s.live_items == 0 && pinned {
                    // Nothing live, but a send still reads it: keep it aside (an orphan).
                    self.lanes[lane].active = None;
                    self.orphan(sh, a);
                    continue;
                }
                if s.live_items == 0 {
                    // Nothing live in the full active segment: start it over.
                    s.write = 0;
                    s.hot = 0;
                    s.may_expire = false;
                    let g = self.gen();
                    self.slot_mut(a).gen = g;
                    continue;
                }
                if !pinned && self.mostly_expired(a, len, seg_size, now) {
                    // Expired items' room is reused before a fresh segment is taken, as
                    // memcached reuses an expired item's chunk (its t/issue_14.t).
                    self.compact(sh, a, seg_size, Keep::All, now);
                    continue;
                }
                self.lanes[lane].active = None;
                self.lanes[lane].fifo.push_back(slot_id(a));
            }
            if self.free_slots.len() + (SLOTS_MAX - self.slots.len()) > 0 {
                if let Some((seg, region)) = self.take_segment(sh, lane) {
                    let g = self.gen();
                    let fresh = SegSlot {
                        seg,
                        write: 0,
                        live_bytes: 0,
                        live_items: 0,
                        gen: g,
                        pins: 0,
                        orphan: false,
                        region,
                        hot: 0,
                        may_expire: false,
                    };
                    let slot = match self.free_slots.pop() {
                        Some(i) => {
                            self.slots[usize::from(i)] = Some(fresh);
                            i
                        }
                        None => {
                            self.slots.push(Some(fresh));
                            slot_id(self.slots.len() - 1)
                        }
                    };
                    self.lanes[lane].held += 1;
                    self.lanes[lane].active = Some(slot);
                    continue;
                }
            }
            if let Some(pos) = self.mostly_dead(sh.seg_size, len, lane) {
                // Garbage from overwrites and deletes is reclaimed without evicting anything.
                let victim = self.lanes[lane]
                    .fifo
                    .remove(pos)
                    .expect("position from the FIFO");
                self.compact(sh, usize::from(victim), sh.seg_size, Keep::All, now);
                self.lanes[lane].active = Some(victim);
                continue;
            }
            let Some(victim) = self.eviction_victim(lane) else {
                return Err(StoreError::OutOfMemory);
            };
            if self.pinned(usize::from(victim)) {
                // A pinned segment is never rewritten: evict all of it, keep it as an orphan
                // until its last pin goes, and look for room again.
                self.compact(sh, usize::from(victim), 0, Keep::Accessed, now);
                self.release(sh, usize::from(victim));
                continue;
            }
            let keep = (sh.seg_size / 2).min(sh.seg_size - len);
            self.compact(sh, usize::from(victim), keep, Keep::Accessed, now);
            self.lanes[lane].active = Some(victim);
        }
    }

    /// A free segment for `lane` and its region number: the local pool's (within its
    /// guarantees), or the sub pool with the most free segments. Sub pools guarantee no
    /// shard any segment: a shard without one evicts as it would without sub memory.
    fn take_segment(&self, sh: &Shared, lane: usize) -> Option<(crate::arena::Segment, u8)> {
        if lane == LOCAL {
            return sh.pool.take(self.lanes[LOCAL].held).map(|s| (s, 0));
        }
        let mut order: Vec<usize> = (0..sh.subs.len()).collect();
        order.sort_by_key(|&r| std::cmp::Reverse(sh.subs[r].free_count()));
        order.into_iter().find_map(|r| {
            let seg = sh.subs[r].take(usize::MAX)?;
            Some((seg, u8::try_from(r + 1).ok()?))
        })
    }

    /// The segment `lane` reclaims next, taken out of its FIFO: the local lane's oldest (FIFO
    /// with second chance, ADR 0003); the sub lane's one with the fewest warm items among
    /// its [`DEAD_SCAN`] oldest (the oldest of those), so the hot items waiting there are
    /// not evicted by the room their own promotion makes.
    fn eviction_victim(&mut self, lane: usize) -> Option<u16> {
        if lane == LOCAL {
            return self.lanes[LOCAL].fifo.pop_front();
        }
        let (pos, _) = self.lanes[SUB]
            .fifo
            .iter()
            .take(DEAD_SCAN)
            .map(|&f| match self.pinned(usize::from(f)) {
                true => u32::MAX,
                false => self.slot(usize::from(f)).hot,
            })
            .enumerate()
            .min_by_key(|&(i, accessed)| (accessed, i))?;
        self.lanes[SUB].fifo.remove(pos)
    }

    /// Among the oldest [`DEAD_SCAN`] segments, the one with the fewest live bytes if at
    /// most half of it is live and compacting it leaves room for `len` more bytes.
    fn mostly_dead(&self, seg_size: usize, len: usize, lane: usize) -> Option<usize> {
        let (pos, live) = self.lanes[lane]
            .fifo
            .iter()
            .take(DEAD_SCAN)
            .map(|&f| match self.pinned(usize::from(f)) {
                true => usize::MAX, // never compacted in place while pinned
                false => self.slot(usize::from(f)).live_bytes,
            })
            .enumerate()
            .min_by_key(|&(_, live)| live)?;
        (live <= seg_size / 2 && live + len <= seg_size).then_some(pos)
    }

    /// Whether segment `slot`, once its expired items are dropped, is at most half live and
    /// has room for `len` more bytes. Reads its item headers (stopping once more than half is
    /// seen live): called when an active segment is full, so at most once per segment's
    /// worth of bytes written.
    fn mostly_expired(&self, slot: usize, len: usize, seg_size: usize, now: u32) -> bool {
        let s = self.slot(slot);
        if !s.may_expire {
            return false;
        }
        let half = seg_size / 2;
        let (mut rd, mut live) = (0, 0);
        while rd < s.write {
            let b = &s.seg.bytes[rd..];
            let len = item::len_of(b);
            if item::bits_of(b) & item::DEAD == 0 && !item::expired_at(b, now) {
                live += len;
                if live > half {
                    return false;
                }
            }
            rd += len;
        }
        live < s.live_bytes && live + len <= seg_size
    }

    /// Compacts segment `slot` in place: keeps live items (all, or those accessed since they
    /// were written or last copied, clearing that bit) while they fit in `keep` bytes, and
    /// drops the rest (expired ones as reclaimed); a local segment's other items are
    /// demoted to the sub regions while they have room, the rest evicted.
    fn compact(&mut self, sh: &Shared, slot: usize, keep: usize, which: Keep, now: u32) {
        let demote = self.slot(slot).region == 0 && !sh.subs.is_empty();
        let log = sh.eviction_log.get().filter(|l| l.wanted());
        let mut rd = 0;
        let mut wr = 0;
        let mut kept_items = 0;
        let end = self.slot(slot).write;
        while rd < end {
            let b = &self.slot(slot).seg.bytes[rd..];
            if item::bits_of(b) & item::DEAD != 0 {
                // Overwritten or deleted: only its length is needed to step over it.
                rd += item::len_of(b);
                continue;
            }
            let h = Header::read(b);
            let len = h.len();
            let key_range = rd + h.key_start()..rd + h.value_start();
            let hash = sh
                .hasher
                .hash_one(&self.slot(slot).seg.bytes[key_range.clone()]);
            let old = Loc::at(slot, rd);
            let expired = h.expired(now);
            let wanted = which == Keep::All || h.bits & item::ACCESSED != 0;
            if !expired && wanted && wr + len <= keep {
                let s = self.slot_mut(slot);
                s.seg.bytes.copy_within(rd..rd + len, wr);
                if which == Keep::Accessed {
                    item::set_bits(&mut s.seg.bytes[wr..], h.bits & !item::ACCESSED);
                }
                let new = Loc::at(slot, wr);
                self.index.replace(hash, |l| l == old, new);
                wr += len;
                kept_items += 1;
            } else if expired || !demote || !self.demote(sh, hash, old, len, now) {
                let why = if expired { Why::Expired } else { Why::Evicted };
                if let (Some(log), Why::Evicted) = (log, why) {
                    let key = &self.slot(slot).seg.bytes[key_range];
                    log.evicted(&Evicted::of(&h, key, now));
                }
                self.index.remove(hash, old);
                self.count_drop(why, h.bits);
            }
            rd += len;
        }
        let g = self.gen();
        let s = self.slot_mut(slot);
        s.write = wr;
        s.live_bytes = wr;
        s.live_items = kept_items;
        s.hot = 0;
        s.gen = g;
    }
}
