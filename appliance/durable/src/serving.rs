//! The data device while the server runs: each worker drives its own [`RegionLog`] (through
//! io_uring), everything else is shared here: the index (updated when a flush completes), an
//! overlay of staged-but-not-yet-durable writes (so a read-through never sees a state older
//! than RAM's), the global write sequence, the flush_all mark, and the logs of regions no
//! worker is driving. Sans-IO except [`Serving::lookup`] and [`Serving::for_each_value`], which
//! read the device synchronously (the read-through path; see ADR 0011).
//!
//! Large objects (see [`crate::large`]): chunks are staged with [`Serving::stage_chunk`] and
//! never enter the overlay; the manifest is staged (a [`crate::Mutation::Put`] with `large: true`)
//! only after every chunk of its object is durable. Chunks belong to the manifest currently durable for
//! their user key: when a settled write replaces it (or a large put is superseded before it
//! settles), the old object's chunks leave the index and become dead bytes that compaction
//! reclaims. A failed large put keeps its chunks until the next start (its manifest may still
//! reach the device). At start, chunks of no live manifest (an upload that crashed before
//! its manifest was durable, an object replaced just before a crash) are swept from the index.
//! flush_all and expiry do not remove chunks until their manifest is replaced, dropped by
//! compaction, or the next start.
//!
//! The parts: `staging` (staging writes, the overlay, settling completions), `reads`
//! (look-ups and the start-up warming pass), `objects` (large-object bookkeeping and chunk
//! reads). This file holds the shared state, its accessors and the checkpoint at stop.
use crate::units::count_u32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard};

use crate::crypt::Crypt;
use crate::device::BlockDevice;
use crate::engine::Durable;
use crate::error::DurableError;
use crate::index::{Index, Loc};
use crate::region::{RegionLog, COMPACTION_RESERVE, DELETE_RESERVE};
use crate::superblock::Superblock;

mod objects;
mod reads;
mod rekey;
mod reseal;
mod staging;
pub use rekey::RekeyStatus;
pub use reseal::OneBootSeal;

use objects::LargeObjects;
use staging::{OverlayShard, Pending};

/// The key under which a flush_all is logged (client keys are never empty). Its value is the
/// flush time (absolute Unix seconds, u64 LE); every record with a lower sequence is invalid
/// from that time on.
pub const FLUSH_KEY: &[u8] = b"";

const OVERLAY_SHARDS: usize = 64;

/// What a region with no room left for a value does: config's `data-full` (ADR 0039).
pub use ringstore_config::DataFull;

/// Which free segments a value write may take (ADR 0039). The caller says, never the key:
/// a write a client sent is [`Reserve::Client`] whatever its key, so no client can take the
/// segments kept for deletes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reserve {
    /// A client's value: keeps [`COMPACTION_RESERVE`] + [`DELETE_RESERVE`] free segments back,
    /// so deletes and flush_all still fit on a full device.
    Client,
    /// The appliance's own small write, staged in-process by its writer: may take the delete
    /// reserve (never compaction's).
    Internal,
}

impl Reserve {
    /// Free segments a value staged with this reserve leaves untouched.
    pub(crate) fn keep(self) -> u32 {
        match self {
            Reserve::Client => COMPACTION_RESERVE + DELETE_RESERVE,
            Reserve::Internal => COMPACTION_RESERVE,
        }
    }
}

/// Device evictions since start ([`Serving::evictions`]), in memcached extstore's terms.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Evictions {
    /// Records (keys) evicted: `extstore_objects_evicted`.
    pub objects: u64,
    /// Their bytes on the device: `extstore_bytes_evicted`.
    pub bytes: u64,
    /// Segments freed by eviction: `extstore_page_evictions`.
    pub segments: u64,
}

/// What became of a compaction copy, by the location of the original it copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Relocation {
    /// Durable, and the index now points at the copy.
    Moved(Loc),
    /// Durable, but the key changed meanwhile: the copy is an older duplicate.
    Superseded(Loc),
    /// The copy's write or flush failed.
    Failed(Loc),
}

/// What a worker learns from one completion.
#[derive(Debug, Default)]
pub struct Settled {
    /// Tokens now durable.
    pub acked: Vec<u64>,
    /// Tokens whose write failed: (token, key, cas). Their RAM copy must go.
    pub failed: Vec<(u64, Box<[u8]>, u64)>,
    /// Compaction copies settled (for the region's [`crate::Compactor`]).
    pub relocated: Vec<Relocation>,
}

/// The shared half of an open data device.
#[derive(Debug)]
pub struct Serving<D: BlockDevice> {
    dev: Arc<D>,
    sb: Superblock,
    /// The open's sealing state on a device with a data key (ADR 0050).
    crypt: Option<Arc<Crypt>>,
    index: RwLock<Index>,
    overlay: Box<[Mutex<OverlayShard>]>,
    hasher: crate::index::KeyHasher,
    next_seq: AtomicU64,
    /// (sequence, Unix time) of the newest flush_all.
    flush: Mutex<Option<(u64, u64)>>,
    /// Region logs not currently driven by a worker (all of them before start and after stop).
    parked: Mutex<Vec<Option<RegionLog<u64>>>>,
    /// Per region: sequence of its oldest staged client record not yet settled (u64::MAX: none).
    /// Compaction forgets a tombstone only below every floor (see `Compactor`).
    pending_floor: Box<[AtomicU64]>,
    /// Large objects: the live one of each user key and the manifests staged, not settled.
    /// Lock order: index, then this.
    objects: Mutex<LargeObjects>,
    /// Chunk entries removed from the index by the start-up sweep.
    swept: usize,
    /// Records read back that did not verify, as counted by [`Serving::note_corrupt`].
    corrupt: AtomicU64,
    /// Background compactions finished and given up ([`Serving::note_compaction`]), and the
    /// recovered values the RAM store refused at start ([`Serving::note_load_refused`]).
    compactions: [AtomicU64; 2],
    load_refused: AtomicU64,
    /// What a full region does.
    data_full: DataFull,
    /// [`Evictions`]: objects, bytes, segments.
    evicted: [AtomicU64; 3],
    /// Unix seconds of store time 0: a staged [`Mutation`]'s times are store times.
    unix_start: u64,
    /// Every region log's group commit reports here (`/metrics` `ringstore_data_commit_*`).
    commit: Arc<crate::CommitMetrics>,
    /// `data rekey` (ADR 0055): the superblock as on the device, regions done rewriting.
    rekey: Mutex<rekey::RekeyState>,
}

/// A snapshot of a serving device ([`Serving::state`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServingState {
    pub geometry: crate::superblock::Geometry,
    pub device_len: u64,
    /// Keys in the index.
    pub records: usize,
    /// Live record bytes per region.
    pub region_live_bytes: Vec<u64>,
    /// Segments holding any live record, per region.
    pub region_live_segments: Vec<u32>,
    /// Records read back that did not verify since start.
    pub corrupt_records: u64,
    /// Background compactions since start: segments freed, and compactions given up.
    pub compactions: u64,
    pub compactions_aborted: u64,
    /// Recovered values the RAM store refused at start (read through from the device instead).
    pub load_refused_records: u64,
    /// Records evicted from a full device since start, and the segments that freed.
    pub evicted_records: u64,
    pub evicted_segments: u64,
    /// Large uploads in progress and the space they hold.
    pub uploads: usize,
    pub upload_reserved_bytes: u64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl<D: BlockDevice> Serving<D> {
    /// Store time 0 is Unix second `unix_start` (0 by default: store times are Unix times).
    pub fn with_unix_start(mut self, unix_start: u64) -> Self {
        self.unix_start = unix_start;
        self
    }

    /// What a full region does (default [`DataFull::Evict`]).
    pub fn with_data_full(mut self, data_full: DataFull) -> Self {
        self.data_full = data_full;
        self
    }

    /// What a full region does.
    pub fn data_full(&self) -> DataFull {
        self.data_full
    }

    /// One segment evicted: `objects` records of `bytes` device bytes left the index.
    pub fn note_eviction(&self, objects: u64, bytes: u64) {
        for (c, n) in self.evicted.iter().zip([objects, bytes, 1]) {
            c.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Device evictions since start.
    pub fn evictions(&self) -> Evictions {
        let [objects, bytes, segments] = self.evicted.each_ref().map(|c| c.load(Ordering::Relaxed));
        Evictions {
            objects,
            bytes,
            segments,
        }
    }

    /// Takes over an opened (recovered) device.
    pub fn new(d: Durable<D>) -> Self {
        let Durable {
            dev,
            sb,
            crypt,
            regions,
            index,
            next_seq,
            ..
        } = d;
        let commit = Arc::new(crate::CommitMetrics::default());
        let mut me = Serving {
            dev: Arc::new(dev),
            sb,
            crypt,
            index: RwLock::new(index),
            overlay: (0..OVERLAY_SHARDS)
                .map(|_| Mutex::new(Default::default()))
                .collect(),
            hasher: Default::default(),
            next_seq: AtomicU64::new(next_seq),
            flush: Mutex::new(None),
            parked: Mutex::new(
                regions
                    .into_iter()
                    .map(|mut log| {
                        log.attach_metrics(commit.clone());
                        Some(log)
                    })
                    .collect(),
            ),
            pending_floor: (0..sb.geometry.regions)
                .map(|_| AtomicU64::new(u64::MAX))
                .collect(),
            objects: Mutex::new(LargeObjects::default()),
            swept: 0,
            corrupt: AtomicU64::new(0),
            compactions: [AtomicU64::new(0), AtomicU64::new(0)],
            load_refused: AtomicU64::new(0),
            data_full: DataFull::Evict,
            evicted: Default::default(),
            unix_start: 0,
            commit,
            rekey: rekey::RekeyState::new(sb),
        };
        let mark = me.read_index().get(FLUSH_KEY).copied();
        if let Some(e) = mark {
            if let Ok(Some(item)) = me.read_entry(FLUSH_KEY, &e) {
                let at = item
                    .value
                    .get(..8)
                    .and_then(|b| b.try_into().ok())
                    .map(u64::from_le_bytes)
                    .unwrap_or(0);
                *lock(&me.flush) = Some((e.meta.seq, at));
            }
        }
        me.swept = me.load_objects();
        me
    }

    /// Counts a record read back from the device that did not verify (reported in `stats`).
    pub fn note_corrupt(&self) {
        self.corrupt.fetch_add(1, Ordering::Relaxed);
    }

    /// A compaction freed its segment (`done`) or was given up; `data` reports the counts.
    pub fn note_compaction(&self, done: bool) {
        self.compactions[usize::from(!done)].fetch_add(1, Ordering::Relaxed);
    }

    /// `n` recovered values did not fit the RAM store at start.
    pub fn note_load_refused(&self, n: u64) {
        self.load_refused.fetch_add(n, Ordering::Relaxed);
    }

    /// The group-commit histograms of every region ([`crate::CommitMetrics`]).
    pub fn commit_metrics(&self) -> &crate::CommitMetrics {
        &self.commit
    }

    /// Records read back that did not verify since start ([`Serving::note_corrupt`]).
    pub fn corrupt_records(&self) -> u64 {
        self.corrupt.load(Ordering::Relaxed)
    }

    /// The superblock.
    pub fn superblock(&self) -> &Superblock {
        &self.sb
    }

    /// The open's sealing state; `None` on a device without a data key.
    pub fn crypt(&self) -> Option<&Crypt> {
        self.crypt.as_deref()
    }

    /// Bytes a record with these lengths occupies on this device.
    pub fn record_len(&self, key_len: usize, value_len: usize) -> usize {
        crate::record::record_len(self.crypt.is_some(), key_len, value_len)
    }

    /// The device.
    pub fn device(&self) -> &D {
        &self.dev
    }

    /// Number of regions (the most workers that can write).
    pub fn regions(&self) -> usize {
        self.sb.geometry.regions as usize
    }

    /// Highest CAS on the device.
    pub fn max_cas(&self) -> u64 {
        self.read_index().max_cas()
    }

    /// Takes region `r`'s log for a worker to drive; `None` if taken or absent.
    pub fn take_log(&self, r: usize) -> Option<RegionLog<u64>> {
        lock(&self.parked).get_mut(r)?.take()
    }

    /// Gives a worker's log back (at stop, after it drained).
    pub fn park_log(&self, log: RegionLog<u64>) {
        let r = log.region() as usize;
        if let Some(slot) = lock(&self.parked).get_mut(r) {
            *slot = Some(log);
        }
    }

    /// Region `region`'s oldest unsettled client record has sequence `seq` (u64::MAX: none).
    /// The worker driving the region keeps this current (under the key's shard lock when staging).
    pub fn set_pending_floor(&self, region: usize, seq: u64) {
        if let Some(f) = self.pending_floor.get(region) {
            f.store(seq, Ordering::SeqCst);
        }
    }

    /// Lowest sequence of any staged client record not yet settled, in any region.
    pub fn min_pending_seq(&self) -> u64 {
        self.pending_floor
            .iter()
            .map(|f| f.load(Ordering::SeqCst))
            .min()
            .unwrap_or(u64::MAX)
    }

    pub(crate) fn write_index(&self) -> std::sync::RwLockWriteGuard<'_, Index> {
        self.index.write().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn read_index(&self) -> RwLockReadGuard<'_, Index> {
        self.index.read().unwrap_or_else(|e| e.into_inner())
    }

    /// The device's state for the console's `data`: layout, index size, live bytes per region.
    pub fn state(&self) -> ServingState {
        let g = self.sb.geometry;
        let index = self.read_index();
        let mut region_live_bytes = Vec::new();
        let mut region_live_segments = Vec::new();
        for r in 0..g.regions {
            let live: Vec<u64> = (0..g.segments_per_region)
                .map(|seg| index.live_bytes(r, seg))
                .collect();
            region_live_bytes.push(live.iter().sum());
            region_live_segments.push(count_u32(live.iter().filter(|&&b| b > 0).count()));
        }
        let records = index.len();
        drop(index);
        let (uploads, upload_reserved_bytes) = self.uploads();
        let evicted = self.evictions();
        ServingState {
            geometry: g,
            device_len: self.sb.device_len,
            records,
            region_live_bytes,
            region_live_segments,
            corrupt_records: self.corrupt_records(),
            compactions: self.compactions[0].load(Ordering::Relaxed),
            compactions_aborted: self.compactions[1].load(Ordering::Relaxed),
            load_refused_records: self.load_refused.load(Ordering::Relaxed),
            evicted_records: evicted.objects,
            evicted_segments: evicted.segments,
            uploads,
            upload_reserved_bytes,
        }
    }

    /// After every worker parked its drained log: write the checkpoint (see ADR 0010) so the
    /// next start skips the scan. Returns whether it was written.
    pub fn checkpoint(&self) -> Result<bool, DurableError> {
        let regions: Vec<RegionLog<u64>> = {
            let mut parked = lock(&self.parked);
            if parked.iter().any(Option::is_none) {
                return Err(DurableError::NoRegion(
                    parked.iter().position(Option::is_none).unwrap_or(0),
                ));
            }
            parked.drain(..).flatten().collect()
        };
        if !regions.iter().all(RegionLog::is_idle) {
            // A worker stopped early: that batch's flush would go through the device's
            // descriptor, where a rekey or reseal may already have taken its writeback
            // error (the workers flush through their own, ADR 0011). Trust only a scan.
            return Err(DurableError::Unsettled);
        }
        // The workers' flushes reported every error on their descriptions; this one's
        // reports would be old news and fail the checkpoint.
        self.dev.settle_errors();
        let index = std::mem::replace(&mut *self.write_index(), Index::new(0, 0));
        let d = Durable {
            dev: self.dev.clone(),
            sb: self.sb,
            crypt: self.crypt.clone(),
            regions,
            index,
            next_seq: self.next_seq.load(Ordering::Relaxed),
            acks: Vec::new(),
            relocate_failures: 0,
        };
        d.shutdown().map(|(_, written)| written)
    }
}

/// Executes every action of `log` synchronously against the device and settles it (what the
/// io_uring worker does asynchronously); `relocated` sees each completion's compaction copies.
/// For tests and tools. Returns the client tokens acked and failed.
pub fn drive_sync<D: BlockDevice>(
    s: &Serving<D>,
    log: &mut RegionLog<u64>,
    mut relocated: impl FnMut(&[Relocation]),
) -> Result<Settled, DurableError> {
    let mut all = Settled::default();
    while let Some(a) = log.poll_action() {
        let done = match a {
            crate::group_commit::Action::WriteBatch {
                id, offset, bytes, ..
            } => {
                let ok = s.device().write_at(offset, &bytes).is_ok();
                log.on_write_complete(id, ok)?
            }
            crate::group_commit::Action::Flush { id, .. } => {
                let ok = s.device().flush().is_ok();
                log.on_flush_complete(id, ok)?
            }
        };
        let got = s.settle(done);
        relocated(&got.relocated);
        all.acked.extend(got.acked);
        all.failed.extend(got.failed);
    }
    Ok(all)
}

#[cfg(test)]
#[path = "serving_tests.rs"]
pub(crate) mod tests;

#[cfg(test)]
#[path = "serving/rekey_tests.rs"]
mod rekey_tests;

#[cfg(test)]
#[path = "serving/reseal_tests.rs"]
mod reseal_tests;
