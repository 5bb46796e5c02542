//! One lock shard: its segments (a FIFO, oldest first, plus the active one being appended to),
//! its hash index, and the eviction, compaction and expiry work on them.
//!
//! Eviction is FIFO with reinsertion at segment granularity (see docs/adr/0003-eviction.md):
//! when a shard needs space and the pool has none for it, the oldest segment is compacted
//! in place. Live items read since they were written (or last copied) slide to the front
//! of the segment with their access bit cleared, up to half the segment; everything else
//! is evicted. The compacted segment becomes the newest one and receives new writes.
//!
//! Allocation, index growth and that compaction are in `shard/space.rs`; this file holds the
//! shard's state, look-ups, stores, deletes and expiry.

use std::collections::VecDeque;

use foldhash::fast::FixedState;
use std::hash::BuildHasher;

use crate::arena::Segment;
pub(crate) use crate::index::Loc;
use crate::index::{slot_id, Index, SLOTS_MAX};
use crate::item::{self, Header, NewItem};
use crate::pool::Pool;
use crate::StoreError;

mod dump;
mod pin;
mod reserve;
mod restore;
mod space;
mod tier;

pub(crate) use dump::WalkPos;
pub(crate) use restore::{check_chain, SealedSeg, Shift};

/// A segment held by a shard and its accounting.
struct SegSlot {
    seg: Segment,
    /// Bytes appended so far.
    write: usize,
    live_bytes: usize,
    live_items: usize,
    /// Changes whenever items move or the segment is reused, so a saved reaper cursor is
    /// never applied to a different layout.
    gen: u32,
    /// Pins on this segment's bytes (`pin.rs`): while any, it is never compacted, reset or freed.
    pins: u32,
    /// Its items are gone and only pins hold it; freed at the last unpin.
    orphan: bool,
    /// 0: the local region; `r + 1`: sub region `r` (ADR 0035).
    region: u8,
    /// Its items that became warm (read twice, `tier::WARM_SCORE`) since it was last
    /// compacted (sub segments only): the sub lane evicts the one of its oldest segments
    /// with the fewest.
    hot: u32,
    /// An item with an exptime was placed here since the segment was last started over
    /// ([`Shard::alloc`]'s `expires`): without one it has nothing that can expire, so a
    /// full active segment is not walked for expired items (`mostly_expired`). That walk
    /// read every header of the segment, about 140 instructions per SET of an overwrite
    /// load without TTLs (callgrind).
    may_expire: bool,
}

/// The local region's lane of segments.
pub(crate) const LOCAL: usize = 0;
/// The sub regions' lane (every sub region together).
pub(crate) const SUB: usize = 1;

/// The segments a shard holds in one lane (local or sub): a FIFO and the active one.
#[derive(Default)]
struct Lane {
    /// Non-active segments, oldest first.
    fifo: VecDeque<u16>,
    active: Option<u16>,
    held: usize,
}

impl SegSlot {
    /// [`LOCAL`] or [`SUB`].
    fn lane(&self) -> usize {
        usize::from(self.region != 0)
    }
}

/// Read-only context every shard shares.
pub(crate) struct Shared {
    pub pool: Pool,
    /// Seeded per store at random, or with a sealed region's seed (ADR 0052).
    pub hasher: FixedState,
    pub seg_size: usize,
    /// Store-wide pin accounting and cap (`pin.rs`).
    pub pins: crate::pin::PinCounts,
    /// The sub regions' pools, in [`crate::SubRegion`] order (empty: no sub memory).
    pub subs: Vec<Pool>,
    /// Told of each eviction while it wants to be (`watch evictions`).
    pub eviction_log: std::sync::OnceLock<std::sync::Arc<dyn crate::EvictionLog>>,
}

/// Counters kept per shard and summed for `stats`.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Counters {
    pub total_items: u64,
    pub evictions: u64,
    pub reclaimed: u64,
    pub expired_unfetched: u64,
    pub evicted_unfetched: u64,
    /// Look-ups that found the item expired (memcached `get_expired`).
    pub get_expired: u64,
    /// Look-ups of a key the last flush_all removed (memcached `get_flushed`), as far as
    /// [`FLUSHED_TRACKED`] remembers them.
    pub get_flushed: u64,
    pub get_hits_local: u64,
    pub get_hits_foreign: u64,
    pub promotions: u64,
    pub demotions: u64,
}

/// Keys of one shard a flush_all removed whose hashes are kept, so a later look-up of one
/// counts as `get_flushed` (memcached counts the flushed item it still finds; ringstore
/// drops them at once and remembers this many per shard, inline, no allocation).
pub(crate) const FLUSHED_TRACKED: usize = 8;

#[derive(Debug, Default, Clone, Copy)]
struct ReapCursor {
    slot: usize,
    off: usize,
    gen: u32,
}

impl ReapCursor {
    /// The start of the next segment slot.
    fn next_slot(self) -> ReapCursor {
        ReapCursor {
            slot: self.slot + 1,
            off: 0,
            gen: 0,
        }
    }
}

pub(crate) struct Shard {
    slots: Vec<Option<SegSlot>>,
    free_slots: Vec<u16>,
    /// [`LOCAL`] and [`SUB`].
    lanes: [Lane; 2],
    index: Index,
    next_gen: u32,
    reap: ReapCursor,
    /// Epoch of the last flush_all applied to this shard.
    pub flush_epoch: u32,
    /// The last CAS unique this shard handed out (`Store::next_cas`): kept under the shard
    /// lock so that no request writes a cache line every worker shares.
    pub last_cas: u64,
    pub counters: Counters,
    /// Hashes of up to [`FLUSHED_TRACKED`] keys the last flush removed (the first
    /// `flushed_len`), each forgotten once looked up.
    flushed: [u64; FLUSHED_TRACKED],
    flushed_len: usize,
    /// Scores of foreign items and the promotion queue (empty without sub regions).
    scores: crate::tier::Scores,
    /// Where an item being demoted or promoted is copied through.
    scratch: Vec<u8>,
}

/// Why an item is dropped; decides which counter it lands in.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Why {
    /// Overwritten or deleted by a client.
    Removed,
    /// Found expired.
    Expired,
    /// Evicted for space.
    Evicted,
}

#[expect(
    clippy::expect_used,
    reason = "the index and the FIFO only name held segments: a free slot here is a broken invariant"
)]
fn key_at(slots: &[Option<SegSlot>], loc: Loc) -> &[u8] {
    item::key(
        &slots[loc.slot()]
            .as_ref()
            .expect("index points at a held segment")
            .seg
            .bytes[loc.off()..],
    )
}

/// Bytes of a cache line on the machines ringstore runs on (x86-64).
const CACHE_LINE: usize = 64;

impl Shard {
    /// Starts loading the index bucket a look-up of `hash` reads first.
    pub(crate) fn prefetch_bucket(&self, hash: u64) {
        if let Some(w) = self.index.home_word(hash) {
            ringstore_sys::prefetch_read(w);
        }
    }

    /// Starts loading the first two cache lines of the item the index most likely holds for
    /// `hash`: its header and key (what a look-up compares and a write marks), and for small
    /// items the value too.
    pub(crate) fn prefetch_item(&self, hash: u64) {
        let Some(loc) = self.index.guess(hash) else {
            return;
        };
        if let Some(Some(s)) = self.slots.get(loc.slot()) {
            for at in [loc.off(), loc.off() + CACHE_LINE] {
                if let Some(b) = s.seg.bytes.get(at) {
                    ringstore_sys::prefetch_read(b);
                }
            }
        }
    }

    /// An empty shard whose segments are `seg_size` bytes.
    /// `sub_share` is its share of the sub regions' bytes (sizes its score table).
    pub(crate) fn new(seg_size: usize, sub_share: usize) -> Shard {
        Shard {
            slots: Vec::new(),
            free_slots: Vec::new(),
            lanes: [Lane::default(), Lane::default()],
            index: Index::new(seg_size),
            next_gen: 0,
            reap: ReapCursor::default(),
            flush_epoch: 0,
            last_cas: 0,
            counters: Counters::default(),
            flushed: [0; FLUSHED_TRACKED],
            flushed_len: 0,
            scores: crate::tier::Scores::new(sub_share),
            scratch: Vec::new(),
        }
    }

    #[expect(
        clippy::expect_used,
        reason = "the index and the FIFO only name held segments: a free slot here is a broken invariant"
    )]
    fn slot(&self, i: usize) -> &SegSlot {
        self.slots[i].as_ref().expect("held segment")
    }

    #[expect(
        clippy::expect_used,
        reason = "the index and the FIFO only name held segments: a free slot here is a broken invariant"
    )]
    fn slot_mut(&mut self, i: usize) -> &mut SegSlot {
        self.slots[i].as_mut().expect("held segment")
    }

    /// The bytes from `loc` to the end of its segment.
    pub(crate) fn bytes(&self, loc: Loc) -> &[u8] {
        &self.slot(loc.slot()).seg.bytes[loc.off()..]
    }

    pub(crate) fn bytes_mut(&mut self, loc: Loc) -> &mut [u8] {
        let off = loc.off();
        &mut self.slot_mut(loc.slot()).seg.bytes[off..]
    }

    /// Finds the live item under `key`; an expired one is reclaimed and reported absent.
    pub(crate) fn lookup(&mut self, sh: &Shared, hash: u64, key: &[u8], now: u32) -> Option<Loc> {
        let slots = &self.slots;
        let Some(loc) = self.index.find(hash, |l| key_at(slots, l) == key) else {
            self.forget_flushed(hash);
            return None;
        };
        if item::expired_at(self.bytes(loc), now) {
            self.counters.get_expired += 1;
            self.drop_item(sh, hash, loc, Why::Expired);
            return None;
        }
        Some(loc)
    }

    /// A look-up missed: if the last flush removed this key, count it once (`get_flushed`).
    fn forget_flushed(&mut self, hash: u64) {
        let tracked = &mut self.flushed[..self.flushed_len];
        if let Some(i) = tracked.iter().position(|&h| h == hash) {
            tracked.swap(i, self.flushed_len - 1);
            self.flushed_len -= 1;
            self.counters.get_flushed += 1;
        }
    }

    /// Marks the item at `loc` dead, takes it out of the index and counts why.
    fn drop_item(&mut self, sh: &Shared, hash: u64, loc: Loc, why: Why) {
        self.index.remove(hash, loc);
        let h = Header::read(self.bytes(loc));
        self.count_drop(why, h.bits);
        self.kill(sh, loc);
    }

    /// Counts an item dropped for `why`; `bits` are its header bits (was it ever fetched?).
    fn count_drop(&mut self, why: Why, bits: u8) {
        let unfetched = u64::from(bits & item::FETCHED == 0);
        match why {
            Why::Removed => {}
            Why::Expired => {
                self.counters.reclaimed += 1;
                self.counters.expired_unfetched += unfetched;
            }
            Why::Evicted => {
                self.counters.evictions += 1;
                self.counters.evicted_unfetched += unfetched;
            }
        }
    }

    /// Marks the bytes at `loc` dead (the index no longer points at them) and gives the
    /// segment back to the pool once nothing in it is live.
    fn kill(&mut self, sh: &Shared, loc: Loc) {
        // The bits and the length only: every overwrite kills its old copy, and a whole
        // Header::read there cost a SET about 45 instructions more (callgrind).
        let b = self.bytes(loc);
        let (bits, len) = (item::bits_of(b), item::len_of(b));
        item::set_bits(self.bytes_mut(loc), bits | item::DEAD);
        let slot = loc.slot();
        let s = self.slot_mut(slot);
        // The hot path: checked in debug builds and the property tests (TIGER_STYLE).
        debug_assert!(
            s.live_items > 0 && s.live_bytes >= len,
            "kill of a dead slot's item"
        );
        debug_assert!(bits & item::DEAD == 0, "an item killed twice");
        s.live_bytes -= len;
        s.live_items -= 1;
        debug_assert!(
            s.live_bytes <= s.seg.bytes.len(),
            "live bytes beyond the segment"
        );
        let lane = s.lane();
        if s.live_items == 0 && self.lanes[lane].active != Some(slot_id(slot)) {
            let fifo = &mut self.lanes[lane].fifo;
            if let Some(pos) = fifo.iter().position(|&f| usize::from(f) == slot) {
                fifo.remove(pos);
                self.release(sh, slot);
            }
        }
    }

    /// Removes the item at `loc` (client delete).
    pub(crate) fn delete(&mut self, sh: &Shared, hash: u64, loc: Loc) {
        self.drop_item(sh, hash, loc, Why::Removed);
    }

    /// Gives segment `slot` back to the pool, or keeps it as an orphan while it is pinned.
    #[expect(
        clippy::expect_used,
        reason = "the index and the FIFO only name held segments: a free slot here is a broken invariant"
    )]
    fn release(&mut self, sh: &Shared, slot: usize) {
        if self.pinned(slot) {
            self.orphan(sh, slot);
            return;
        }
        let s = self.slots[slot].take().expect("held segment");
        self.free_slots.push(slot_id(slot));
        let lane = &mut self.lanes[s.lane()];
        lane.held -= 1;
        match s.region {
            0 => sh.pool.give(s.seg, lane.held),
            // Sub pools guarantee no shard any segment (see `Shard::take_segment`).
            r => sh.subs[usize::from(r) - 1].give(s.seg, usize::MAX),
        }
    }

    fn gen(&mut self) -> u32 {
        self.next_gen = self.next_gen.wrapping_add(1);
        self.next_gen
    }

    /// Stores a new item and makes the index point at it, replacing any old copy.
    /// Returns the CAS unique written. `client`: a client's write, which counts an expired
    /// copy it replaces, and a flushed key, as the look-up before it would have (a blind
    /// `set` makes none); a load from the data device or a backfill counts nothing.
    pub(crate) fn store(
        &mut self,
        sh: &Shared,
        hash: u64,
        new: &NewItem<'_>,
        client: bool,
    ) -> Result<u64, StoreError> {
        let len = new.len();
        self.ensure_index_room(sh, new.now);
        let (slot, off) = self.alloc(sh, len, new.now, LOCAL, new.exptime != 0)?;
        {
            let s = self.slot_mut(slot);
            item::write(&mut s.seg.bytes[off..off + len], new);
            s.live_bytes += len;
            s.live_items += 1;
            debug_assert!(
                s.live_bytes <= s.seg.bytes.len(),
                "live bytes beyond the segment"
            );
        }
        let loc = Loc::at(slot, off);
        let slots = &self.slots;
        let old = self
            .index
            .replace(hash, |l| key_at(slots, l) == new.key, loc);
        match old {
            // The index already points at the new copy; retire the old bytes (an expired
            // copy counted as a look-up would have: a blind `set` makes none).
            Some(old) => {
                let b = self.bytes(old);
                if client && item::expired_at(b, new.now) {
                    let bits = item::bits_of(b);
                    self.counters.get_expired += 1;
                    self.count_drop(Why::Expired, bits);
                }
                self.kill(sh, old);
            }
            None => {
                if client {
                    self.forget_flushed(hash);
                }
                let before = self.index.allocation_size();
                self.index.insert_new(hash, loc);
                sh.pool.index_grew(before, self.index.allocation_size());
            }
        }
        self.counters.total_items += 1;
        Ok(new.cas)
    }

    /// Writes the live item at `loc` anew with `exptime` and `cas` (a change its header has
    /// no room for, `item.rs`), keeping its key, value, flags, bits and last access, and
    /// points the index at the copy. Returns the copy's place, or `None` when making room
    /// evicted the item itself; an error when there is no room (the old copy is unchanged).
    pub(crate) fn rewrite(
        &mut self,
        sh: &Shared,
        hash: u64,
        loc: Loc,
        exptime: u32,
        cas: u64,
        now: u32,
    ) -> Result<Option<Loc>, StoreError> {
        let h = Header::read(self.bytes(loc));
        let len = item::rewritten_len(&h, exptime, cas);
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.clear();
        scratch.extend_from_slice(&self.bytes(loc)[..h.len()]);
        let placed = self.alloc(sh, len, now, LOCAL, exptime != 0);
        let done = placed.map(|(slot, off)| {
            let s = self.slot_mut(slot);
            item::rewrite(&scratch, &h, &mut s.seg.bytes[off..off + len], exptime, cas);
            s.live_bytes += len;
            s.live_items += 1;
            let new = Loc::at(slot, off);
            let key = item::key(&scratch);
            let slots = &self.slots;
            // Making room may have moved (compacted) or evicted the old copy: it is found
            // by its key wherever it is now.
            match self
                .index
                .replace(hash, |l| l != new && key_at(slots, l) == key, new)
            {
                Some(old) => {
                    self.kill(sh, old);
                    Some(new)
                }
                None => {
                    self.kill(sh, new);
                    None
                }
            }
        });
        self.scratch = scratch;
        done
    }

    /// Drops every item and returns every segment to the pool (flush_all).
    pub(crate) fn clear(&mut self, sh: &Shared) {
        self.flushed_len = 0;
        for loc in self.index.iter() {
            if self.flushed_len == FLUSHED_TRACKED {
                break;
            }
            self.flushed[self.flushed_len] = sh.hasher.hash_one(key_at(&self.slots, loc));
            self.flushed_len += 1;
        }
        self.index.clear();
        self.scores.clear();
        for lane in &mut self.lanes {
            lane.fifo.clear();
            lane.active = None;
        }
        for i in 0..self.slots.len() {
            if self.slots[i].is_some() {
                self.release(sh, i);
            }
        }
    }

    /// Reclaims expired items, resuming where the previous call stopped. Examines at most
    /// `max_examined` items and reclaims at most `max_items`; returns (reclaimed, examined).
    pub(crate) fn reap(
        &mut self,
        sh: &Shared,
        now: u32,
        max_items: usize,
        max_examined: usize,
    ) -> (usize, usize) {
        let mut reclaimed = 0;
        let mut examined = 0;
        let mut slots_passed = 0;
        let mut cur = self.reap;
        while reclaimed < max_items && examined < max_examined && slots_passed <= self.slots.len() {
            if cur.slot >= self.slots.len() {
                cur = ReapCursor::default();
                slots_passed += 1;
                if self.slots.is_empty() {
                    break;
                }
                continue;
            }
            let Some(s) = self.slots[cur.slot].as_ref() else {
                cur = cur.next_slot();
                slots_passed += 1;
                continue;
            };
            if s.gen != cur.gen {
                cur.gen = s.gen;
                cur.off = 0;
            }
            if cur.off >= s.write {
                cur = cur.next_slot();
                slots_passed += 1;
                continue;
            }
            let h = Header::read(&s.seg.bytes[cur.off..]);
            examined += 1;
            let loc = Loc::at(cur.slot, cur.off);
            cur.off += h.len();
            if h.bits & item::DEAD == 0 && h.expired(now) {
                let key = &s.seg.bytes[loc.off() + h.key_start()..loc.off() + h.value_start()];
                let hash = sh.hasher.hash_one(key);
                self.drop_item(sh, hash, loc, Why::Expired);
                reclaimed += 1;
            }
        }
        self.reap = cur;
        (reclaimed, examined)
    }

    /// Live items and their bytes.
    pub(crate) fn usage(&self) -> (u64, u64) {
        self.slots.iter().flatten().fold((0, 0), |(n, b), s| {
            (n + s.live_items as u64, b + s.live_bytes as u64)
        })
    }

    /// Bytes never written at the ends of this shard's segments (the active one's free
    /// tail, and what a sealed one left when the next item did not fit).
    pub(crate) fn unwritten_bytes(&self, seg_size: usize) -> u64 {
        self.slots
            .iter()
            .flatten()
            .map(|s| seg_size.saturating_sub(s.write) as u64)
            .sum()
    }

    /// Bytes of live items in the local region and in the sub regions.
    pub(crate) fn usage_by_lane(&self) -> [u64; 2] {
        let mut out = [0, 0];
        for s in self.slots.iter().flatten() {
            out[s.lane()] += s.live_bytes as u64;
        }
        out
    }

    /// Hands every segment back (the store is being dropped).
    pub(crate) fn drain(&mut self) -> Vec<Segment> {
        self.index.clear();
        self.lanes = [Lane::default(), Lane::default()];
        // A segment still pinned is leaked, never recycled: its pins may still be read.
        self.slots
            .drain(..)
            .flatten()
            .filter(|s| s.pins == 0)
            .map(|s| s.seg)
            .collect()
    }
}
