//! The `Store`: its state, construction, the data-device hooks, locking, flush_all, the
//! reaper and counters. Reads are in `store/read.rs`, writes in `store/write.rs`.

use super::*;
use crate::contention::{self, ShardGuard};

mod dump;
mod journaled;
mod persist;
mod read;
mod reserve;
mod write;

pub use dump::{DumpCursor, DumpItem};
pub use journaled::Journaled;
pub use persist::{Outcome, Region, Restart, SealReport, WallTime, FORMAT_VERSION};
pub use reserve::Reservation;

/// The keyspace. `Sync`: shared by every worker behind an `Arc`.
pub struct Store {
    shards: Box<[Mutex<Shard>]>,
    shared: Shared,
    /// The seed keys are hashed with (kept in a sealed region: shards are found by hash).
    hash_seed: u64,
    /// The region the arena lives in when it outlives the process (ADR 0052), and how the
    /// last start went.
    pub(crate) persist: Option<persist::Persist>,
    /// Floor of CAS uniques: every one handed out is above it (`raise_cas_floor`). Written
    /// only by recovery; each shard counts its own above it (`next_cas`).
    cas: AtomicU64,
    /// Pending or last flush_all: epoch in the high 32 bits (0 = none), `at` in the low 32.
    flush: AtomicU64,
    flush_lock: Mutex<()>,
    reap_next: AtomicUsize,
    config: StoreConfig,
    backing: Backing,
    arena_bytes: u64,
    hugepage_bytes: u64,
    /// Set once when a data device is attached: a write must then come with the journal
    /// that stages it ([`Store::journaled`]); one without is refused.
    journal_required: AtomicBool,
    /// Set once when a data device is attached; RAM misses are read through it.
    backfill: OnceLock<Arc<dyn Backfill>>,
    /// Counters of external items ([`StoreStats::external_reads`], [`StoreStats::external_lost`]).
    external_reads: AtomicU64,
    external_lost: AtomicU64,
    /// The sub regions (ADR 0035), in the order of `shared.subs`.
    sub_regions: Vec<SubRegion>,
    /// Each region's address ranges, the local arena first, then `sub_regions` in order.
    region_spans: Vec<Vec<(u64, u64)>>,
    /// Next shard the exchange looks at.
    exchange_next: AtomicUsize,
    exchange_cpu_usec: AtomicU64,
}

/// An item found under its shard lock: where it is and, for an external item, its value
/// as read from the device (kept alive while the caller looks at the item).
struct Found {
    loc: shard::Loc,
    device: Option<Vec<u8>>,
}

impl Found {
    /// The item's header and value: the RAM bytes, or the device's for an external item.
    fn view<'a>(&'a self, shard: &'a Shard) -> (&'a [u8], Header, &'a [u8]) {
        let h = Header::read(shard.bytes(self.loc));
        let (b, value) = self.view_as(shard, &h);
        (b, h, value)
    }

    /// [`Found::view`] when the caller holds the item's header `h` already (read at
    /// `self.loc`, or laid out as the item there now).
    fn view_as<'a>(&'a self, shard: &'a Shard, h: &Header) -> (&'a [u8], &'a [u8]) {
        let b = shard.bytes(self.loc);
        let value = match &self.device {
            Some(v) => &v[..],
            None => &b[h.value_start()..h.len()],
        };
        (b, value)
    }
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("config", &self.config)
            .field("backing", &self.backing)
            .field("shards", &self.shards.len())
            .field("segment_size", &self.shared.seg_size)
            .finish_non_exhaustive()
    }
}

/// The pools of the sub regions, each mapped and bound to its node, with their address ranges.
fn sub_pools(subs: &[SubRegion], seg_size: usize) -> Result<Vec<SubPool>, StoreError> {
    if subs.len() >= usize::from(u8::MAX) {
        return Err(StoreError::Config(format!(
            "{} sub regions, at most 254",
            subs.len()
        )));
    }
    subs.iter()
        .map(|r| {
            let count = r.bytes / seg_size;
            if count == 0 {
                return Err(StoreError::Config(format!(
                    "sub memory {} on node {} holds no segment of {seg_size} bytes",
                    r.bytes, r.node
                )));
            }
            let segs = arena::allocate_at(count, seg_size, r.huge_pages, Some((r.node, r.bind)))
                .map_err(|e| {
                    StoreError::Config(format!("cannot map sub memory on node {}: {e}", r.node))
                })?;
            let spans = arena::spans(&segs);
            // No shard is guaranteed a sub segment (`shards` 0: nothing reserved).
            Ok((pool::Pool::new(segs, seg_size, count * seg_size, 0), spans))
        })
        .collect()
}

/// A sub region's pool and its address ranges.
type SubPool = (pool::Pool, Vec<(u64, u64)>);

/// Smallest segment; larger when `item_size_max` or the number of segments needs it.
const SEGMENT_MIN: usize = 1 << 20;
/// Average segments per shard stay under this so slot numbers (16 bits) never run out.
const SEGMENTS_PER_SHARD_MAX: usize = 16 * 1024;
/// A shard is only worth having with this many segments to rotate. Every shard keeps one
/// active segment that eviction empties whole and refills from the start, so on average
/// half a segment per shard holds nothing, and how much depends on how the hash seed
/// (random per store) splits the keys: 4 shards of a 64 MiB budget (63 segments at 8 per
/// shard) kept 447 432 or 455 406 items of the same fill, a segment's worth apart
/// (docs/BENCHMARKS.md, "Items kept in a 64 MiB budget"). At 32 a budget under 64
/// segments has one shard (same count every run) and the empty halves cost at most 1/64 of
/// the arena; 1 GiB still has 16 shards, 4 GiB and more the 64 a one-core server asks for.
const SEGMENTS_PER_SHARD_MIN: usize = 32;

/// The shard of `hash` among `shards` (a power of two).
#[inline]
pub(crate) fn shard_index(hash: u64, shards: usize) -> usize {
    (hash >> 32) as usize & (shards - 1)
}

/// The arena's shape for a configuration: segment size, segment count and lock shards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Geometry {
    pub seg_size: usize,
    pub segments: usize,
    pub shard_count: usize,
}

impl Geometry {
    /// Checks `config` and derives the arena's shape from it (and the sub regions' bytes).
    pub(crate) fn of(config: &StoreConfig, subs: &[SubRegion]) -> Result<Geometry, StoreError> {
        let sub_total: usize = subs.iter().map(|r| r.bytes).sum();
        if config.item_size_max == 0 || config.item_size_max > ITEM_SIZE_MAX_LIMIT {
            return Err(StoreError::Config(format!(
                "item_size_max {} must be between 1 and {ITEM_SIZE_MAX_LIMIT}",
                config.item_size_max
            )));
        }
        if config.shards == 0 || !config.shards.is_power_of_two() {
            return Err(StoreError::Config(format!(
                "shards {} must be a power of two",
                config.shards
            )));
        }
        let seg_size = (item::HEADER_MAX + KEY_LEN_MAX + config.item_size_max)
            .max(SEGMENT_MIN)
            .max((config.memory_bytes + sub_total) / (config.shards * SEGMENTS_PER_SHARD_MAX))
            .next_multiple_of(4096);
        if seg_size > crate::index::SEGMENT_MAX {
            return Err(StoreError::Config(format!(
                "memory_bytes {} needs segments of {seg_size} bytes, over the {} the index can address",
                config.memory_bytes,
                crate::index::SEGMENT_MAX
            )));
        }
        let segments = config.memory_bytes / seg_size;
        if segments < pool::MIN_HELD {
            return Err(StoreError::Config(format!(
                "memory_bytes {} holds fewer than {} segments of {seg_size} bytes (item_size_max {})",
                config.memory_bytes,
                pool::MIN_HELD,
                config.item_size_max
            )));
        }
        let shard_count = prev_power_of_two(
            config
                .shards
                .min((segments / SEGMENTS_PER_SHARD_MIN).max(1)),
        );
        Ok(Geometry {
            seg_size,
            segments,
            shard_count,
        })
    }
}

impl Store {
    /// Allocates the arena (bind the calling thread to the NUMA node first) and an empty index.
    pub fn new(config: StoreConfig) -> Result<Store, StoreError> {
        Store::with_sub_regions(config, &[])
    }

    /// [`Store::new`] with sub regions on other NUMA nodes (ADR 0035): items the local
    /// arena cannot keep are demoted there instead of evicted, and read-hot ones promoted
    /// back by [`Store::exchange`]. Each region must hold at least one segment.
    pub fn with_sub_regions(config: StoreConfig, subs: &[SubRegion]) -> Result<Store, StoreError> {
        let geo = Geometry::of(&config, subs)?;
        let segs = arena::allocate(geo.segments, geo.seg_size, config.huge_pages)
            .map_err(|e| StoreError::Config(format!("cannot map the arena: {e}")))?;
        Store::assemble(config, subs, &geo, segs, persist::random_seed())
    }

    /// A store over `segs` (the arena of `geo`), its keys hashed with `seed`.
    pub(crate) fn assemble(
        config: StoreConfig,
        subs: &[SubRegion],
        geo: &Geometry,
        segs: Vec<arena::Segment>,
        seed: u64,
    ) -> Result<Store, StoreError> {
        let (seg_size, segments, shard_count) = (geo.seg_size, geo.segments, geo.shard_count);
        let sub_total: usize = subs.iter().map(|r| r.bytes).sum();
        let hugepage_bytes = segs
            .iter()
            .filter(|s| s.backing == Backing::HugeTlb)
            .count()
            * seg_size;
        let backing = segs
            .iter()
            .map(|s| s.backing)
            .min_by_key(|b| backing_rank(*b))
            .unwrap_or(Backing::Normal);
        let mut spans = vec![arena::spans(&segs)];
        let pool = pool::Pool::new(segs, seg_size, config.memory_bytes, shard_count);
        let (sub_pools, sub_spans): (Vec<pool::Pool>, Vec<_>) =
            sub_pools(subs, seg_size)?.into_iter().unzip();
        spans.extend(sub_spans);
        let sub_segments = sub_pools.iter().map(|p| p.free_count()).sum::<usize>();
        Ok(Store {
            shards: (0..shard_count)
                .map(|_| Mutex::new(Shard::new(seg_size, sub_total / shard_count)))
                .collect(),
            shared: Shared {
                pool,
                hasher: foldhash::fast::FixedState::with_seed(seed),
                seg_size,
                pins: crate::pin::PinCounts::new(segments + sub_segments),
                subs: sub_pools,
                eviction_log: OnceLock::new(),
            },
            hash_seed: seed,
            persist: None,
            cas: AtomicU64::new(0),
            flush: AtomicU64::new(0),
            flush_lock: Mutex::new(()),
            reap_next: AtomicUsize::new(0),
            arena_bytes: (segments * seg_size) as u64,
            hugepage_bytes: hugepage_bytes as u64,
            backing,
            config,
            journal_required: AtomicBool::new(false),
            backfill: OnceLock::new(),
            external_reads: AtomicU64::new(0),
            external_lost: AtomicU64::new(0),
            sub_regions: subs.to_vec(),
            region_spans: spans,
            exchange_next: AtomicUsize::new(0),
            exchange_cpu_usec: AtomicU64::new(0),
        })
    }

    /// From now on every write must be logged: one made without a journal is refused with
    /// [`StoreError::OutOfMemory`] (a path with no device handle, e.g. memcache over UDP,
    /// must not change RAM behind the device's back).
    pub fn require_journal(&self) {
        self.journal_required.store(true, Ordering::Release);
    }

    /// See [`Store::require_journal`].
    pub(crate) fn journal_required(&self) -> bool {
        self.journal_required.load(Ordering::Acquire)
    }

    /// The journal a write logs to; `Err` when one is required and none was given.
    pub(crate) fn journal_for_write<'j>(
        &self,
        journal: Option<&'j dyn Journal>,
    ) -> Result<Option<&'j dyn Journal>, StoreError> {
        match journal {
            None if self.journal_required() => Err(StoreError::OutOfMemory),
            j => Ok(j),
        }
    }

    /// Reads RAM misses through `backfill` (once; later calls are ignored).
    pub fn attach_backfill(&self, backfill: Arc<dyn Backfill>) {
        let _ = self.backfill.set(backfill);
    }

    /// Tells `log` of every item evicted from now on while it wants that (once; later
    /// calls are ignored).
    pub fn attach_eviction_log(&self, log: Arc<dyn EvictionLog>) {
        let _ = self.shared.eviction_log.set(log);
    }

    /// CAS uniques handed out from now on are above `cas` (restored items keep theirs).
    pub fn raise_cas_floor(&self, cas: u64) {
        self.cas.fetch_max(cas, Ordering::Relaxed);
    }

    /// Puts an item recovered from the device into RAM, keeping its CAS; not journaled.
    ///
    /// A value of at least `external_threshold` bytes is kept as an external stub (key and
    /// header only): attach the backfill before serving reads, or such items read as absent.
    pub fn load(&self, key: &[u8], item: &Fetched, now: Time) -> Result<(), StoreError> {
        if item.value.len() > self.config.item_size_max || key.len() > KEY_LEN_MAX {
            return Err(StoreError::TooLarge);
        }
        let hash = self.shared.hasher.hash_one(key);
        let mut shard = self.lock(hash, now);
        let new = fetched_item(
            key,
            item,
            now,
            self.keeps_external(item.value.len(), item.large),
        );
        shard.store(&self.shared, hash, &new, false).map(|_| ())
    }

    /// Whether a value of `len` bytes read from (or written to) the device stays out of RAM.
    fn keeps_external(&self, len: usize, large: bool) -> bool {
        let t = self.config.external_threshold;
        t > 0 && len >= t && !large
    }

    /// Drops the RAM copy of `key` if its CAS is still `cas` (a write whose logging failed);
    /// not journaled, so the device's older value is what reads see next.
    pub fn forget_if_cas(&self, key: &[u8], cas: u64, now: Time) {
        if key.len() > KEY_LEN_MAX {
            return;
        }
        let hash = self.shared.hasher.hash_one(key);
        let mut shard = self.lock(hash, now);
        if let Some(loc) = shard.lookup(&self.shared, hash, key, now) {
            if Header::read(shard.bytes(loc)).cas == cas {
                shard.delete(&self.shared, hash, loc);
            }
        }
    }

    /// Finds `key` in RAM, reading it through the backfill on a miss; an external item's
    /// value is read from the device.
    ///
    /// An external item whose value the device no longer has under the same CAS unique is
    /// dropped and reported absent: RAM is only a cache of the device, and a wrong value is
    /// never served.
    fn find(&self, shard: &mut Shard, hash: u64, key: &[u8], now: Time) -> Option<Found> {
        if let Some(loc) = shard.lookup(&self.shared, hash, key, now) {
            if item::bits_of(shard.bytes(loc)) & item::EXTERNAL == 0 {
                return Some(Found { loc, device: None });
            }
            let h = Header::read(shard.bytes(loc));
            let fetched = self.backfill.get().and_then(|b| b.fetch(key, now));
            return match fetched {
                Some(f) if f.cas == h.cas && f.value.len() == h.value_len && !f.large => {
                    self.external_reads.fetch_add(1, Ordering::Relaxed);
                    Some(Found {
                        loc,
                        device: Some(f.value),
                    })
                }
                _ => {
                    self.external_lost.fetch_add(1, Ordering::Relaxed);
                    shard.delete(&self.shared, hash, loc);
                    None
                }
            };
        }
        let backfill = self.backfill.get()?;
        if key.len() > KEY_LEN_MAX {
            return None;
        }
        let item = backfill.fetch(key, now)?;
        let external = self.keeps_external(item.value.len(), item.large);
        let new = fetched_item(key, &item, now, external);
        shard.store(&self.shared, hash, &new, false).ok()?;
        let loc = shard.lookup(&self.shared, hash, key, now)?;
        Some(Found {
            loc,
            device: external.then_some(item.value),
        })
    }

    /// What backs the arena.
    pub fn backing(&self) -> Backing {
        self.backing
    }

    /// Number of lock shards in use (at most `StoreConfig::shards`, fewer for small budgets).
    pub fn shard_count(&self) -> usize {
        self.shards.len()
    }

    /// Size of one arena segment; the largest item must fit in one.
    pub fn segment_size(&self) -> usize {
        self.shared.seg_size
    }

    /// A new CAS unique for an item of `shard` (the shard of `hash`, locked): the next number
    /// above both the shard's last and the floor that is congruent to the shard's index
    /// modulo the shard count, so shards never hand out the same one and no request writes
    /// a counter shared by every worker (one such atomic was the store's largest serial
    /// term: a cache line every SET on every core pulled to itself).
    fn next_cas(&self, shard: &mut Shard, hash: u64) -> u64 {
        let base = shard.last_cas.max(self.cas.load(Ordering::Relaxed));
        let cas = cas_above(base, self.shards.len() as u64, self.shard_of(hash) as u64);
        shard.last_cas = cas;
        cas
    }

    /// Index of the shard of `hash`.
    fn shard_of(&self, hash: u64) -> usize {
        shard_index(hash, self.shards.len())
    }

    /// Whether a delayed flush_all is pending at `now` (not yet due).
    #[expect(
        clippy::cast_possible_truncation,
        reason = "the flush word packs (epoch << 32 | at): `as u32` takes its low half, `at`"
    )]
    pub(crate) fn flush_pending(&self, now: Time) -> bool {
        let v = self.flush.load(Ordering::Acquire);
        v >> 32 != 0 && now < v as u32
    }

    /// Starts loading, for each key of a batch about to be executed, its index bucket and
    /// then the item that bucket points at, so the batch's cache misses overlap instead of
    /// each waiting for the one before (ADR 0038). Changes nothing; a shard another thread
    /// holds is skipped rather than waited for. At most [`PREFETCH_MAX`] keys are used.
    pub fn prefetch(&self, keys: &[&[u8]]) {
        let mut hashes = [0u64; PREFETCH_MAX];
        let n = keys.len().min(PREFETCH_MAX);
        for (h, &key) in hashes.iter_mut().zip(&keys[..n]) {
            // The key itself, as the look-up hashes it (through `&&[u8]` it was not inlined).
            *h = self.shared.hasher.hash_one(key);
        }
        // All buckets first: by the time the second pass reads one, it has arrived.
        for &hash in &hashes[..n] {
            if let Ok(shard) = self.shards[self.shard_of(hash)].try_lock() {
                shard.prefetch_bucket(hash);
            }
        }
        for &hash in &hashes[..n] {
            if let Ok(shard) = self.shards[self.shard_of(hash)].try_lock() {
                shard.prefetch_item(hash);
            }
        }
    }

    /// Locks the shard of `hash`, first applying a flush_all that has come due.
    fn lock(&self, hash: u64, now: Time) -> ShardGuard<'_> {
        let i = self.shard_of(hash);
        let mut shard = contention::lock(&self.shards[i]);
        self.apply_flush(&mut shard, now);
        shard
    }

    fn lock_index(&self, i: usize, now: Time) -> ShardGuard<'_> {
        let mut shard = contention::lock(&self.shards[i]);
        self.apply_flush(&mut shard, now);
        shard
    }

    /// A flush is applied to a shard by dropping everything in it the first time the shard
    /// is used at or after the flush time; items written after that survive, so a set in
    /// the same second right after `flush_all` is kept.
    #[expect(
        clippy::cast_possible_truncation,
        reason = "the flush word packs (epoch << 32 | at): `as u32` takes its low half, `at`"
    )]
    fn apply_flush(&self, shard: &mut Shard, now: Time) {
        let v = self.flush.load(Ordering::Acquire);
        let epoch = (v >> 32) as u32;
        if epoch != shard.flush_epoch && now >= v as u32 {
            shard.clear(&self.shared);
            shard.flush_epoch = epoch;
        }
    }

    /// `flush_all`: every item stored at or before `at` is invalid once `now >= at`.
    ///
    /// A later flush_all replaces a pending delayed one (as in memcached); one that has come
    /// due is applied everywhere first. With `at <= now` every shard is emptied before
    /// this returns.
    #[expect(
        clippy::cast_possible_truncation,
        reason = "the flush word packs (epoch << 32 | at): `as u32` takes its low half, `at`"
    )]
    pub fn flush_all(&self, now: Time, at: Time) {
        let _serial = self.flush_lock.lock().unwrap_or_else(|e| e.into_inner());
        let v = self.flush.load(Ordering::Acquire);
        if v >> 32 != 0 && now >= v as u32 {
            for i in 0..self.shards.len() {
                drop(self.lock_index(i, now));
            }
        }
        let epoch = match (v >> 32) as u32 {
            u32::MAX => 1,
            e => e + 1,
        };
        self.flush
            .store((u64::from(epoch) << 32) | u64::from(at), Ordering::Release);
        if at <= now {
            for i in 0..self.shards.len() {
                drop(self.lock_index(i, now));
            }
        }
    }

    /// [`Store::flush_all`], logged to `journal` first; an error means nothing was flushed.
    pub(crate) fn flush_all_logged(
        &self,
        now: Time,
        at: Time,
        journal: Option<&dyn Journal>,
    ) -> Result<(), StoreError> {
        if let Some(journal) = self.journal_for_write(journal)? {
            journal.record(Mutation::FlushAll { at })?;
        }
        self.flush_all(now, at);
        Ok(())
    }

    /// Background reaper step: reclaims up to `max_items` expired items; returns how many.
    ///
    /// Walks the shards' segments from where the previous call stopped, examining at most
    /// `4 * max_items + 1024` items, so each call is bounded work.
    pub fn reclaim_expired(&self, now: Time, max_items: usize) -> usize {
        let n = self.shards.len();
        let start = self.reap_next.fetch_add(1, Ordering::Relaxed);
        let mut reclaimed = 0;
        let mut examine = max_items.saturating_mul(4).saturating_add(1024);
        for i in 0..n {
            if reclaimed >= max_items || examine == 0 {
                break;
            }
            let mut shard = self.lock_index((start + i) % n, now);
            let (r, e) = shard.reap(&self.shared, now, max_items - reclaimed, examine);
            reclaimed += r;
            examine -= e.min(examine);
        }
        reclaimed
    }

    /// Releases a pin granted by [`Journaled::try_get_pinned`]: once a segment's last pin
    /// is gone it may be compacted or reused again, and an orphan goes back to the pool.
    pub fn unpin(&self, pin: Pin) {
        let Some(shard) = self.shards.get(pin.shard as usize) else {
            debug_assert!(false, "a pin of another store");
            return;
        };
        let mut shard = shard.lock().unwrap_or_else(|e| e.into_inner());
        shard.unpin(&self.shared, pin.slot, pin.addr);
    }

    /// Which region holds `key` (0 local, `r + 1` sub region `r`), if it is present (tests).
    #[cfg(test)]
    pub(crate) fn region_of(&self, key: &[u8], now: Time) -> Option<u8> {
        self.place_of(key, now).map(|(region, _)| region)
    }

    /// The region and the shard-local segment slot holding `key` (tests).
    #[cfg(test)]
    pub(crate) fn place_of(&self, key: &[u8], now: Time) -> Option<(u8, usize)> {
        let hash = self.shared.hasher.hash_one(key);
        let mut shard = self.lock(hash, now);
        let loc = shard.lookup(&self.shared, hash, key, now)?;
        Some((shard.region_at(loc), loc.slot()))
    }

    /// Free segments of every sub region together (tests).
    #[cfg(test)]
    pub(crate) fn sub_free_segments(&self) -> usize {
        self.shared.subs.iter().map(|p| p.free_count()).sum()
    }

    /// Items queued for promotion in every shard (tests).
    #[cfg(test)]
    pub(crate) fn queued_promotions(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().expect("shard").queued())
            .sum()
    }

    /// Score entries looked at by reads so far and the score tables' capacity, over every
    /// shard (tests).
    #[cfg(test)]
    pub(crate) fn score_work(&self) -> (u64, usize) {
        self.shards
            .iter()
            .map(|s| s.lock().expect("shard").score_work())
            .fold((0, 0), |(t, c), (t2, c2)| (t + t2, c + c2))
    }

    /// A copy of a pin's bytes, read through the segment that holds them (tests).
    #[cfg(test)]
    pub(crate) fn pinned_copy(&self, pin: &Pin) -> Vec<u8> {
        let shard = self.shards[pin.shard as usize].lock().expect("shard");
        shard.pinned_copy(pin.slot, pin.addr, pin.len)
    }

    /// One step of the background exchange (ADR 0035): promotes up to `max_items` queued
    /// foreign items to the local region, looking at the shards in turn from where the last
    /// step stopped and holding one shard lock at a time; returns how many were tried.
    /// Nothing to do without sub regions.
    pub fn exchange(&self, now: Time, max_items: usize) -> usize {
        if self.sub_regions.is_empty() {
            return 0;
        }
        let n = self.shards.len();
        let start = self.exchange_next.fetch_add(1, Ordering::Relaxed);
        let mut tried = 0;
        for i in 0..n {
            if tried >= max_items {
                break;
            }
            let mut shard = self.lock_index((start + i) % n, now);
            tried += shard.exchange(&self.shared, now, max_items - tried);
        }
        tried
    }

    /// Adds CPU time the exchange's thread used ([`StoreStats::numa_exchange_cpu_usec`]).
    pub fn add_exchange_cpu(&self, usec: u64) {
        self.exchange_cpu_usec.fetch_add(usec, Ordering::Relaxed);
    }

    /// The sub regions this store was made with.
    pub fn sub_regions(&self) -> &[SubRegion] {
        &self.sub_regions
    }

    /// Each region's size and fill: the local one first, then the sub regions.
    pub fn regions(&self) -> Vec<RegionStats> {
        let mut out = vec![RegionStats {
            node: None,
            bytes: self.arena_bytes,
            used_bytes: self.shared.pool.segment_bytes() as u64,
            spans: self.region_spans[0].clone(),
        }];
        let sub_spans = self.region_spans.iter().skip(1);
        for ((r, p), spans) in self
            .sub_regions
            .iter()
            .zip(&self.shared.subs)
            .zip(sub_spans)
        {
            out.push(RegionStats {
                node: Some(r.node),
                bytes: p.total_bytes() as u64,
                used_bytes: p.segment_bytes() as u64,
                spans: spans.clone(),
            });
        }
        out
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> StoreStats {
        let mut st = StoreStats {
            limit_maxbytes: self.config.memory_bytes as u64,
            hugepage_bytes: self.hugepage_bytes,
            arena_bytes: self.arena_bytes,
            ..StoreStats::default()
        };
        for s in self.shards.iter() {
            let shard = s.lock().unwrap_or_else(|e| e.into_inner());
            let c = shard.counters;
            let (items, bytes) = shard.usage();
            st.curr_items += items;
            st.bytes += bytes;
            st.total_items += c.total_items;
            st.evictions += c.evictions;
            st.reclaimed += c.reclaimed;
            st.expired_unfetched += c.expired_unfetched;
            st.evicted_unfetched += c.evicted_unfetched;
            st.get_expired += c.get_expired;
            st.get_flushed += c.get_flushed;
            st.unwritten_bytes += shard.unwritten_bytes(self.shared.seg_size);
            if !self.sub_regions.is_empty() {
                let [local, foreign] = shard.usage_by_lane();
                st.numa_local_bytes += local;
                st.numa_foreign_bytes += foreign;
                st.get_hits_local += c.get_hits_local;
                st.get_hits_foreign += c.get_hits_foreign;
                st.numa_promotions += c.promotions;
                st.numa_demotions += c.demotions;
            }
        }
        st.segment_size = self.shared.seg_size as u64;
        st.segment_bytes = self.shared.pool.segment_bytes() as u64;
        st.external_reads = self.external_reads.load(Ordering::Relaxed);
        st.external_lost = self.external_lost.load(Ordering::Relaxed);
        st.index_bytes = self.shared.pool.index_bytes() as u64;
        let pins = &self.shared.pins;
        st.pinned_segments = pins.segments.load(Ordering::Relaxed) as u64;
        st.orphaned_segments = pins.orphans.load(Ordering::Relaxed) as u64;
        st.pins_granted = pins.granted.load(Ordering::Relaxed);
        st.pins_refused = pins.refused.load(Ordering::Relaxed);
        st.numa_exchange_cpu_usec = self.exchange_cpu_usec.load(Ordering::Relaxed);
        st
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        if self.persist.is_some() {
            // A region's segments are its caller's memory: never handed to another store.
            return;
        }
        let mut segs = self.shared.pool.drain();
        for p in &mut self.shared.subs {
            segs.extend(p.drain());
        }
        for s in self.shards.iter_mut() {
            segs.extend(s.get_mut().unwrap_or_else(|e| e.into_inner()).drain());
        }
        arena::recycle(segs);
    }
}

/// The item whose RAM bytes start at `b[0]`, shown with header `h` and `value` (its RAM
/// value, or an external item's value read from the device), as seen at `now`.
fn item_ref<'a>(b: &'a [u8], h: &Header, value: &'a [u8], now: Time) -> ItemRef<'a> {
    ItemRef {
        key: &b[h.key_start()..h.value_start()],
        value,
        flags: h.flags,
        exptime: h.exptime,
        cas: h.cas,
        last_access: h.last_access(now),
        fetched: h.bits & item::FETCHED != 0,
        stale: h.bits & item::STALE != 0,
        win_token_sent: h.bits & item::WIN != 0,
        large: h.bits & item::LARGE != 0,
    }
}

/// Worst backing first, so a store with any normal pages reports them.
fn backing_rank(b: Backing) -> u8 {
    match b {
        Backing::Normal => 0,
        Backing::TransparentHuge => 1,
        Backing::HugeTlb => 2,
    }
}

fn prev_power_of_two(n: usize) -> usize {
    1 << (usize::BITS - 1 - n.max(1).leading_zeros())
}

/// Writes `v` in decimal at the end of `buf` and returns the digits.
fn decimal(mut v: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            return &buf[i..];
        }
    }
}

/// The RAM item for `item` read from the device under `key` (kept as a stub when `external`).
fn fetched_item<'a>(key: &'a [u8], item: &'a Fetched, now: Time, external: bool) -> NewItem<'a> {
    NewItem {
        key,
        value: &item.value,
        flags: item.flags,
        exptime: item.exptime,
        cas: item.cas,
        now,
        large: item.large,
        external,
    }
}

/// The least number above `base` that is `class` modulo `classes` (`class < classes`).
fn cas_above(base: u64, classes: u64, class: u64) -> u64 {
    let candidate = base - base % classes + class;
    if candidate > base {
        candidate
    } else {
        candidate + classes
    }
}

#[cfg(test)]
mod cas_tests {
    use super::cas_above;

    #[test]
    fn cas_above_is_the_least_number_of_its_class_above_the_base() {
        assert_eq!(cas_above(0, 16, 0), 16);
        assert_eq!(cas_above(0, 16, 3), 3);
        assert_eq!(cas_above(3, 16, 3), 19);
        assert_eq!(cas_above(1000, 1, 0), 1001);
        for base in 0..100 {
            for class in 0..8 {
                let c = cas_above(base, 8, class);
                assert!(
                    c > base && c % 8 == class && c - base <= 8,
                    "{base} {class} {c}"
                );
            }
        }
    }
}
