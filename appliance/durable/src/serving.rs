//! The data device while the server runs: each worker drives its own [`RegionLog`] (through
//! io_uring), everything else is shared here: the index (updated when a flush completes), an
//! overlay of staged-but-not-yet-durable writes (so a read-through never sees a state older
//! than RAM's), the global write sequence, the flush_all mark, and the logs of regions no
//! worker is driving. Sans-IO except [`Serving::lookup`] and [`Serving::for_each_value`], which
//! read the device synchronously (the read-through path; see ADR 0011).
//!
//! Large objects (see [`crate::large`]): chunks are staged with [`Change::Chunk`] and never
//! enter the overlay; the manifest is staged (with [`Change::Put`] `large: true`) only after
//! every chunk of its object is durable. Chunks belong to the manifest currently durable for
//! their user key: when a settled write replaces it (or a large put is superseded before it
//! settles), the old object's chunks leave the index and become dead bytes that compaction
//! reclaims. A failed large put keeps its chunks until the next start (its manifest may still
//! reach the device). At start, chunks of no live manifest (an upload that crashed before
//! its manifest was durable, an object replaced just before a crash) are swept from the index.
//! flush_all and expiry do not remove chunks until their manifest is replaced, dropped by
//! compaction, or the next start.
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard};

use crate::device::BlockDevice;
use crate::engine::{Durable, Item};
use crate::error::DurableError;
use crate::group_commit::Completion;
use crate::index::{Entry, Index, Loc};
use crate::large::{
    chunk_data, chunk_data_len, chunk_header_matches, chunk_key, encode_chunk_value,
    parse_chunk_key, piece_table_len, Manifest, CHUNK_KEY_LEN, PIECE_LEN,
};
use crate::readback::{read_entry, record_offset, verify};
use crate::record::{encoded_len, RecordKind, RecordMeta, RecordView, HEADER_LEN};
use crate::region::{Purpose, RegionLog, Staged, COMPACTION_RESERVE, DELETE_RESERVE};
use crate::superblock::le32;
use crate::superblock::Superblock;

/// The key under which a flush_all is logged (client keys are never empty). Its value is the
/// flush time (absolute Unix seconds, u64 LE); every record with a lower sequence is invalid
/// from that time on.
pub const FLUSH_KEY: &[u8] = b"";

const OVERLAY_SHARDS: usize = 64;

/// A change to log, in device terms (absolute Unix expiry).
#[derive(Debug, Clone, Copy)]
pub enum Change<'a> {
    /// The key holds this value.
    Put {
        /// Key.
        key: &'a [u8],
        /// Value; with `large`, an encoded [`Manifest`].
        value: &'a [u8],
        /// Client flags.
        flags: u32,
        /// Absolute Unix seconds, 0 = never.
        exptime: u64,
        /// CAS unique.
        cas: u64,
        /// The value is a large object's manifest (record kind [`RecordKind::Manifest`]).
        /// Stage it only after every chunk of its object is durable.
        large: bool,
    },
    /// One chunk of a large object, logged under [`chunk_key`]`(object, index)` with its
    /// piece table in front ([`crate::large::encode_chunk_value`]). Settled like a client
    /// write (its token is acked or failed; a failed one is reported with the chunk key and
    /// cas 0); never visible to [`Serving::lookup`].
    Chunk {
        /// Object id from [`Serving::next_object_id`].
        object: u64,
        /// Chunk number.
        index: u32,
        /// The chunk's bytes (at most [`Serving::chunk_len`]).
        bytes: &'a [u8],
    },
    /// The key is gone.
    Delete {
        /// Key.
        key: &'a [u8],
    },
    /// Everything logged before is invalid from Unix time `at` on.
    FlushAll {
        /// Absolute Unix seconds.
        at: u64,
    },
}

#[derive(Debug)]
enum Pending {
    Value(Item),
    Deleted(u64),
}

impl Pending {
    fn seq(&self) -> u64 {
        match self {
            Pending::Value(i) => i.seq,
            Pending::Deleted(s) => *s,
        }
    }
}

/// Staged-but-not-durable writes of the keys hashing to one shard: key → newest pending state.
type OverlayShard = HashMap<Box<[u8]>, Pending>;

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
    index: RwLock<Index>,
    overlay: Box<[Mutex<OverlayShard>]>,
    hasher: std::collections::hash_map::RandomState,
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
}

/// (object id, chunk count).
type ObjectRef = (u64, u32);

#[derive(Debug, Default)]
struct LargeObjects {
    /// User key → the object of its durable (index-current) manifest.
    live: HashMap<Box<[u8]>, ObjectRef>,
    /// Sequence of a staged, unsettled manifest → its object (`Staged` carries no value bytes).
    staged: HashMap<u64, ObjectRef>,
    /// Uploads in progress (chunks staged, no manifest yet) → device bytes of their chunks:
    /// space held until the manifest is staged or the upload is abandoned.
    uploading: HashMap<u64, u64>,
}

impl LargeObjects {
    /// True while `object` may still be needed: the current object of `key`, or named by a
    /// manifest still in flight.
    fn needed(&self, key: &[u8], object: u64) -> bool {
        self.live.get(key).is_some_and(|(o, _)| *o == object)
            || self.staged.values().any(|(o, _)| *o == object)
    }
}

/// Removes the chunk entries of `object` from the index (their bytes become dead); returns
/// how many were present.
fn remove_chunks(index: &mut Index, (object, chunks): ObjectRef) -> usize {
    let mut n = 0;
    for i in 0..chunks {
        n += usize::from(index.remove(&chunk_key(object, i)));
    }
    n
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl<D: BlockDevice> Serving<D> {
    /// Takes over an opened (recovered) device.
    pub fn new(d: Durable<D>) -> Self {
        let Durable {
            dev,
            sb,
            regions,
            index,
            next_seq,
            ..
        } = d;
        let mut me = Serving {
            dev: Arc::new(dev),
            sb,
            index: RwLock::new(index),
            overlay: (0..OVERLAY_SHARDS)
                .map(|_| Mutex::new(HashMap::new()))
                .collect(),
            hasher: Default::default(),
            next_seq: AtomicU64::new(next_seq),
            flush: Mutex::new(None),
            parked: Mutex::new(regions.into_iter().map(Some).collect()),
            pending_floor: (0..sb.geometry.regions)
                .map(|_| AtomicU64::new(u64::MAX))
                .collect(),
            objects: Mutex::new(LargeObjects::default()),
            swept: 0,
            corrupt: AtomicU64::new(0),
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

    /// Start-up: learns every live manifest's object, then removes from the index every
    /// chunk of no live object (or past its object's chunk count). Skipped (nothing swept)
    /// when a manifest could not be read, so an I/O error never discards a live object's
    /// chunks. Returns how many chunk entries were removed.
    fn load_objects(&self) -> usize {
        let mut manifests: Vec<(Box<[u8]>, Entry)> = self
            .read_index()
            .iter()
            .filter(|(k, e)| {
                e.meta.kind == RecordKind::Manifest && !k.is_empty() && parse_chunk_key(k).is_none()
            })
            .map(|(k, e)| (Box::<[u8]>::from(k), *e))
            .collect();
        manifests.sort_unstable_by_key(|(_, e)| (e.loc.region, e.loc.segment, e.loc.offset));
        let mut live = HashMap::with_capacity(manifests.len());
        let io_failed = self.read_each(&manifests, |key, rec| {
            if let Some(m) = rec.and_then(|r| Manifest::decode(r.value)) {
                live.insert(Box::<[u8]>::from(key), (m.object, m.chunks()));
            }
        });
        let chunks_of: HashMap<u64, u32> = live.values().copied().collect();
        let mut swept = 0;
        if io_failed == 0 {
            let mut index = self.write_index();
            let orphans: Vec<[u8; CHUNK_KEY_LEN]> = index
                .iter()
                .filter_map(|(k, e)| {
                    let (object, i) = parse_chunk_key(k)?;
                    let keep = chunks_of.get(&object).is_some_and(|&n| i < n);
                    (e.meta.kind.has_value() && !keep).then(|| chunk_key(object, i))
                })
                .collect();
            for k in &orphans {
                swept += usize::from(index.remove(k));
            }
        }
        lock(&self.objects).live = live;
        swept
    }

    /// Chunk entries the start-up sweep removed (orphans of interrupted uploads or of
    /// replaced objects), for a log line.
    pub fn swept_chunks(&self) -> usize {
        self.swept
    }

    /// A fresh large-object id, never reused (also across restarts: it comes from the write
    /// sequence, whose floor recovery raises above every record on the device).
    pub fn next_object_id(&self) -> u64 {
        self.next_seq.fetch_add(1, Ordering::Relaxed)
    }

    /// Bytes of data per chunk on this device: a whole number of chunk records (piece table
    /// included; at least 4, as many as keep a chunk at most 1 MiB) fills a segment's
    /// payload, so large objects waste no segment tail; in whole 4 KiB, at least 4 KiB.
    pub fn chunk_len(&self) -> usize {
        let g = self.sb.geometry;
        let payload = (g.segment_size - u64::from(g.block_size)) as usize;
        let per_segment = payload.div_ceil(1 << 20).max(4);
        let slot = payload / per_segment;
        let fit = slot.saturating_sub(encoded_len(CHUNK_KEY_LEN, 0));
        let mut len = fit.min(1 << 20) / 4096 * 4096;
        while len > 4096 && encoded_len(CHUNK_KEY_LEN, len + piece_table_len(len)) > slot {
            len -= 4096;
        }
        len.max(4096)
    }

    /// Reads chunk `index` of `object` from the device, verified (crc, key, header), and
    /// returns its data (without the piece table). A chunk compaction moved meanwhile is
    /// looked up again once. `MissingChunk` when the index has no such chunk.
    pub fn read_chunk(&self, object: u64, index: u32) -> Result<Vec<u8>, DurableError> {
        let key = chunk_key(object, index);
        let Some(item) = self.read_durable(&key)? else {
            return Err(DurableError::MissingChunk { object, index });
        };
        let table = match chunk_data(&item.value) {
            Some(data) => item.value.len() - data.len(),
            None => {
                let offset = self
                    .read_index()
                    .get(&key)
                    .map_or(0, |e| self.entry_offset(e));
                return Err(DurableError::Corrupt { offset });
            }
        };
        let mut value = item.value;
        value.drain(..table);
        Ok(value)
    }

    /// Reads bytes `start..end` of the data of chunk `index` of `object`: the record's header,
    /// key and piece table in one read, checked against the index entry (magic, kind, key and
    /// every header field, lengths), then only the pieces covering the range, each verified
    /// against its crc in the table. So the bytes returned are those the chunk was written
    /// with, as with [`Serving::read_chunk`], for a fraction of the I/O and checksumming.
    /// A chunk compaction moved meanwhile is looked up again once.
    ///
    /// Errors: `MissingChunk` when the index has no such chunk; `Corrupt` when the header or a
    /// piece does not verify; `BadRange` when `start > end` or `end` is past the chunk's data.
    pub fn read_chunk_range(
        &self,
        object: u64,
        index: u32,
        start: usize,
        end: usize,
    ) -> Result<Vec<u8>, DurableError> {
        let key = chunk_key(object, index);
        let missing = || DurableError::MissingChunk { object, index };
        self.read_moving(&key, |e| self.read_entry_range(&key, e, start, end))?
            .ok_or_else(missing)
    }

    /// [`Serving::read_chunk_range`] against one index entry; `None` for a tombstone.
    fn read_entry_range(
        &self,
        key: &[u8; CHUNK_KEY_LEN],
        e: &Entry,
        start: usize,
        end: usize,
    ) -> Result<Option<Vec<u8>>, DurableError> {
        if !e.meta.kind.has_value() {
            return Ok(None);
        }
        let offset = self.entry_offset(e);
        let corrupt = DurableError::Corrupt { offset };
        let value_len = e.value_len as usize;
        let Some(data_len) = chunk_data_len(value_len) else {
            return Err(corrupt);
        };
        if e.loc.len as usize != encoded_len(CHUNK_KEY_LEN, value_len) {
            return Err(corrupt);
        }
        if start > end || end > data_len {
            return Err(DurableError::BadRange {
                start,
                end,
                len: data_len,
            });
        }
        let table_at = HEADER_LEN + CHUNK_KEY_LEN;
        let data_at = table_at + piece_table_len(data_len);
        let mut head = vec![0u8; data_at];
        self.dev
            .read_at(offset, &mut head)
            .map_err(|err| DurableError::io(offset, &err))?;
        if !chunk_header_matches(&head, key, &e.meta, value_len) {
            return Err(corrupt);
        }
        if start == end {
            return Ok(Some(Vec::new()));
        }
        let first = start / PIECE_LEN;
        let lo = first * PIECE_LEN;
        let hi = (end.div_ceil(PIECE_LEN) * PIECE_LEN).min(data_len);
        let at = offset + (data_at + lo) as u64;
        let mut buf = vec![0u8; hi - lo];
        self.dev
            .read_at(at, &mut buf)
            .map_err(|err| DurableError::io(at, &err))?;
        for (i, piece) in buf.chunks(PIECE_LEN).enumerate() {
            if crc32c::crc32c(piece) != le32(&head, table_at + 4 * (first + i)) {
                return Err(DurableError::Corrupt {
                    offset: at + (i * PIECE_LEN) as u64,
                });
            }
        }
        buf.copy_within(start - lo..end - lo, 0);
        buf.truncate(end - start);
        Ok(Some(buf))
    }

    /// Device offset of the record `e` points at.
    fn entry_offset(&self, e: &Entry) -> u64 {
        record_offset(&self.sb.geometry, &e.loc)
    }

    /// Removes the chunks `0..chunks` of `object` from the index: for an upload given up
    /// before its manifest was staged. Call only once every chunk staged for it has settled
    /// (a chunk acked later would enter the index again). Returns how many were present.
    pub fn abandon_object(&self, object: u64, chunks: u32) -> usize {
        let mut index = self.write_index();
        let mut objects = lock(&self.objects);
        objects.uploading.remove(&object);
        if objects.staged.values().any(|(o, _)| *o == object) {
            return 0;
        }
        remove_chunks(&mut index, (object, chunks))
    }

    /// Large uploads in progress (chunks staged, no manifest staged yet, not abandoned) and
    /// the device bytes their chunks hold: space a stalled upload keeps from everyone else.
    pub fn uploads(&self) -> (usize, u64) {
        let objects = lock(&self.objects);
        (objects.uploading.len(), objects.uploading.values().sum())
    }

    /// Counts a record read back from the device that did not verify (reported in `stats`).
    pub fn note_corrupt(&self) {
        self.corrupt.fetch_add(1, Ordering::Relaxed);
    }

    /// Records read back that did not verify since start ([`Serving::note_corrupt`]).
    pub fn corrupt_records(&self) -> u64 {
        self.corrupt.load(Ordering::Relaxed)
    }

    /// Compaction dropped the manifest of `key` (expired, nothing older): its object's
    /// chunks go too. Called with the index write lock held.
    pub(crate) fn dropped_manifest(&self, index: &mut Index, key: &[u8]) {
        let mut objects = lock(&self.objects);
        if let Some(obj) = objects.live.remove(key) {
            if !objects.needed(key, obj.0) {
                remove_chunks(index, obj);
            }
        }
    }

    /// The superblock.
    pub fn superblock(&self) -> &Superblock {
        &self.sb
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

    fn overlay_shard(&self, key: &[u8]) -> MutexGuard<'_, OverlayShard> {
        lock(&self.overlay[self.hasher.hash_one(key) as usize % OVERLAY_SHARDS])
    }

    /// Encode `change` into `log` with ack `token`; returns its sequence. Call under the
    /// store's shard lock for the key, so sequence order is write order. Errors: `NoSpace`,
    /// `Backpressure`, `TooLarge`. Values keep [`DELETE_RESERVE`] free segments back for deletes.
    pub fn stage(
        &self,
        log: &mut RegionLog<u64>,
        change: Change<'_>,
        token: u64,
    ) -> Result<u64, DurableError> {
        let large = match change {
            Change::Put {
                large: true, value, ..
            } => {
                let m = Manifest::decode(value).ok_or(DurableError::BadManifest)?;
                Some((m.object, m.chunks()))
            }
            _ => None,
        };
        let seq = self.next_seq.fetch_add(1, Ordering::Relaxed);
        let at_bytes;
        let chunk;
        let chunk_value;
        let (key, value, meta) = match change {
            Change::Put {
                key,
                value,
                flags,
                exptime,
                cas,
                large,
            } => (
                key,
                value,
                RecordMeta {
                    kind: if large {
                        RecordKind::Manifest
                    } else {
                        RecordKind::Value
                    },
                    flags,
                    exptime,
                    cas,
                    seq,
                },
            ),
            Change::Chunk {
                object,
                index,
                bytes,
            } => {
                chunk = chunk_key(object, index);
                chunk_value = encode_chunk_value(bytes);
                (
                    &chunk[..],
                    &chunk_value[..],
                    RecordMeta::bare(RecordKind::Value, seq),
                )
            }
            Change::Delete { key } => (
                key,
                &[][..],
                RecordMeta::bare(RecordKind::Tombstone, seq),
            ),
            Change::FlushAll { at } => {
                at_bytes = at.to_le_bytes();
                (
                    FLUSH_KEY,
                    &at_bytes[..],
                    RecordMeta::bare(RecordKind::Value, seq),
                )
            }
        };
        let keep = match change {
            Change::Put { .. } | Change::Chunk { .. } => COMPACTION_RESERVE + DELETE_RESERVE,
            Change::Delete { .. } | Change::FlushAll { .. } => COMPACTION_RESERVE,
        };
        log.stage_keeping(key, value, meta, Purpose::Client(token), keep)?;
        if let Change::FlushAll { at } = change {
            let mut f = lock(&self.flush);
            if f.is_none_or(|(s, _)| s < seq) {
                *f = Some((seq, at));
            }
            return Ok(seq);
        }
        if let Change::Chunk { object, .. } = change {
            let bytes = encoded_len(key.len(), value.len()) as u64;
            *lock(&self.objects).uploading.entry(object).or_default() += bytes;
            return Ok(seq); // nobody reads a chunk before its manifest is durable
        }
        if let Some(obj) = large {
            let mut objects = lock(&self.objects);
            objects.uploading.remove(&obj.0);
            objects.staged.insert(seq, obj);
        }
        let pending = match meta.kind {
            RecordKind::Value | RecordKind::Manifest => {
                Pending::Value(Item::new(&meta, value.to_vec()))
            }
            RecordKind::Tombstone => Pending::Deleted(seq),
        };
        let mut shard = self.overlay_shard(key);
        match shard.get_mut(key) {
            Some(p) if p.seq() > seq => {}
            Some(p) => *p = pending,
            None => {
                shard.insert(key.into(), pending);
            }
        }
        Ok(seq)
    }

    /// Apply a completion of a worker's log: durable records enter the index, failed ones are
    /// noted (they may or may not be on the device); both leave the overlay.
    pub fn settle(&self, done: Completion<Staged<u64>>) -> Settled {
        let mut out = Settled::default();
        if done.acked.is_empty() && done.failed.is_empty() {
            return out;
        }
        {
            let mut index = self.write_index();
            let mut objects = lock(&self.objects);
            // (user key, object) whose chunks may have become garbage.
            let mut garbage: Vec<(&[u8], ObjectRef)> = Vec::new();
            for s in &done.acked {
                match s.purpose {
                    Purpose::Client(_) => {
                        index.apply(&s.key, s.meta, s.loc, s.value_len, s.seed);
                        if s.key.is_empty() || parse_chunk_key(&s.key).is_some() {
                            continue;
                        }
                        let mine = if s.meta.kind == RecordKind::Manifest {
                            objects.staged.remove(&s.meta.seq)
                        } else {
                            None
                        };
                        let newest = index.get(&s.key).is_some_and(|e| e.meta.seq == s.meta.seq);
                        if newest {
                            let prev = match mine {
                                Some(obj) => objects.live.insert(s.key.clone(), obj),
                                None => objects.live.remove(&s.key),
                            };
                            if let Some(prev) = prev {
                                garbage.push((&s.key, prev));
                            }
                        } else if let Some(obj) = mine {
                            garbage.push((&s.key, obj)); // superseded before it settled
                        }
                    }
                    Purpose::Relocate(from) => {
                        let moved = index.relocate(&s.key, s.meta, from, s.loc, s.seed);
                        out.relocated.push(if moved {
                            Relocation::Moved(from)
                        } else {
                            Relocation::Superseded(from)
                        });
                    }
                }
            }
            for s in &done.failed {
                index.note_unapplied(&s.key, s.meta, s.loc);
                match s.purpose {
                    Purpose::Relocate(from) => out.relocated.push(Relocation::Failed(from)),
                    Purpose::Client(_) if s.meta.kind == RecordKind::Manifest => {
                        // Its chunks stay: a failed write may still be on the device (a
                        // failed flush, a later flush persisting it) and come back after a
                        // crash; the start-up sweep removes them if it does not.
                        objects.staged.remove(&s.meta.seq);
                    }
                    Purpose::Client(_) => {}
                }
            }
            for (key, obj) in garbage {
                if !objects.needed(key, obj.0) {
                    remove_chunks(&mut index, obj);
                }
            }
        }
        // Index first, overlay second: a reader that misses the overlay finds the index current.
        for s in done.acked.iter().chain(&done.failed) {
            if matches!(s.purpose, Purpose::Relocate(_)) || parse_chunk_key(&s.key).is_some() {
                continue; // copies and chunks never enter the overlay
            }
            let mut shard = self.overlay_shard(&s.key);
            if shard.get(&s.key).is_some_and(|p| p.seq() == s.meta.seq) {
                shard.remove(&s.key);
            }
        }
        for s in done.acked {
            if let Purpose::Client(t) = s.purpose {
                out.acked.push(t);
            }
        }
        for s in done.failed {
            if let Purpose::Client(t) = s.purpose {
                out.failed.push((t, s.key, s.meta.cas));
            }
        }
        out
    }

    fn flushed(&self, seq: u64, now_unix: u64) -> bool {
        lock(&self.flush).is_some_and(|(s, at)| seq < s && now_unix >= at)
    }

    /// The key's newest value (staged or durable), if live at `now_unix`. Reads the device.
    pub fn lookup(&self, key: &[u8], now_unix: u64) -> Result<Option<Item>, DurableError> {
        if key.is_empty() {
            return Ok(None);
        }
        let staged = match self.overlay_shard(key).get(key) {
            Some(Pending::Deleted(_)) => return Ok(None),
            Some(Pending::Value(item)) => Some(item.clone()),
            None => None,
        };
        let item = match staged {
            Some(item) => item,
            None => match self.read_durable(key)? {
                Some(item) => item,
                None => return Ok(None),
            },
        };
        let expired = item.exptime != 0 && item.exptime <= now_unix;
        if expired || self.flushed(item.seq, now_unix) {
            return Ok(None);
        }
        Ok(Some(item))
    }

    /// The key's durable value.
    fn read_durable(&self, key: &[u8]) -> Result<Option<Item>, DurableError> {
        self.read_moving(key, |e| self.read_entry(key, e))
    }

    /// Looks `key` up in the index and reads its record with `read`; `None` when the index has
    /// no entry (or `read` found no value). Background compaction may move the record and erase
    /// (and reuse) its segment between the look-up and the read: a record that no longer
    /// verifies is looked up again once if the index moved it meanwhile.
    fn read_moving<T>(
        &self,
        key: &[u8],
        read: impl Fn(&Entry) -> Result<Option<T>, DurableError>,
    ) -> Result<Option<T>, DurableError> {
        let Some(e) = self.read_index().get(key).copied() else {
            return Ok(None);
        };
        match read(&e) {
            Err(DurableError::Corrupt { offset }) => {
                let Some(again) = self.read_index().get(key).copied() else {
                    return Ok(None);
                };
                if again == e {
                    return Err(DurableError::Corrupt { offset });
                }
                read(&again)
            }
            other => other,
        }
    }

    fn read_entry(&self, key: &[u8], e: &Entry) -> Result<Option<Item>, DurableError> {
        read_entry(&*self.dev, &self.sb.geometry, key, e)
    }

    /// Calls `f` with every value live at `now_unix` (for warming RAM at start), reading the
    /// device one segment at a time in log order. Manifests come with `large: true`; chunks
    /// are never delivered. Returns how many were delivered; a record that does not verify is
    /// skipped and counted in the error total returned second.
    pub fn for_each_value(&self, now_unix: u64, mut f: impl FnMut(&[u8], Item)) -> (usize, usize) {
        let mut entries: Vec<(Box<[u8]>, Entry)> = {
            let index = self.read_index();
            index
                .iter()
                .filter(|(k, e)| {
                    !k.is_empty()
                        && e.meta.kind.has_value()
                        && parse_chunk_key(k).is_none()
                        && (e.meta.exptime == 0 || e.meta.exptime > now_unix)
                })
                .map(|(k, e)| (Box::<[u8]>::from(k), *e))
                .collect()
        };
        entries.retain(|(_, e)| !self.flushed(e.meta.seq, now_unix));
        entries.sort_unstable_by_key(|(_, e)| (e.loc.region, e.loc.segment, e.loc.offset));
        let (mut delivered, mut bad) = (0, 0);
        bad += self.read_each(&entries, |key, rec| match rec {
            Some(r) => {
                delivered += 1;
                f(key, Item::from_record(&r));
            }
            None => bad += 1,
        });
        (delivered, bad)
    }

    /// Reads the records of `entries` (sorted by location) one segment span at a time and
    /// calls `f(key, record)`, with `None` for a record that does not verify. Entries whose
    /// read failed are not passed to `f`; returns how many there were.
    fn read_each(
        &self,
        entries: &[(Box<[u8]>, Entry)],
        mut f: impl FnMut(&[u8], Option<RecordView<'_>>),
    ) -> usize {
        let g = self.sb.geometry;
        let mut io_failed = 0;
        let mut buf = Vec::new();
        let mut i = 0;
        while i < entries.len() {
            let (region, segment) = (entries[i].1.loc.region, entries[i].1.loc.segment);
            let mut j = i;
            while j < entries.len()
                && entries[j].1.loc.region == region
                && entries[j].1.loc.segment == segment
            {
                j += 1;
            }
            let lo = u64::from(entries[i].1.loc.offset);
            let hi = entries[i..j]
                .iter()
                .map(|(_, e)| u64::from(e.loc.offset) + u64::from(e.loc.len))
                .max()
                .unwrap_or(lo);
            buf.resize((hi - lo) as usize, 0);
            if self
                .dev
                .read_at(g.segment_offset(region, segment) + lo, &mut buf)
                .is_err()
            {
                io_failed += j - i;
                i = j;
                continue;
            }
            for (key, e) in &entries[i..j] {
                let at = (u64::from(e.loc.offset) - lo) as usize;
                let rec = buf.get(at..).and_then(|b| verify(b, key, e));
                f(key, rec);
            }
            i = j;
        }
        io_failed
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
        let index = std::mem::replace(
            &mut *self.index.write().unwrap_or_else(|e| e.into_inner()),
            Index::new(0, 0),
        );
        let d = Durable {
            dev: self.dev.clone(),
            sb: self.sb,
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
            crate::group_commit::Action::WriteBatch { id, offset, bytes } => {
                let ok = s.device().write_at(offset, &bytes).is_ok();
                log.on_write_complete(id, ok)?
            }
            crate::group_commit::Action::Flush { id } => {
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
mod tests {
    use super::*;
    use crate::engine::Options;
    use crate::group_commit::Action;
    use crate::sim::{SimDevice, SimRng};

    fn open(dev: SimDevice) -> Serving<SimDevice> {
        let opts = Options {
            regions: 2,
            segment_size: 16 * 1024,
            block_size: 512,
            ..Options::default()
        };
        Serving::new(Durable::open(dev, &opts).unwrap().0)
    }

    /// Executes every action of `log` against the device, as the io_uring worker does.
    fn drive(s: &Serving<SimDevice>, log: &mut RegionLog<u64>) -> Settled {
        let mut all = Settled::default();
        while let Some(a) = log.poll_action() {
            let done = match a {
                Action::WriteBatch { id, offset, bytes } => {
                    let ok = s.device().write_at(offset, &bytes).is_ok();
                    log.on_write_complete(id, ok).unwrap()
                }
                Action::Flush { id } => {
                    let ok = s.device().flush().is_ok();
                    log.on_flush_complete(id, ok).unwrap()
                }
            };
            let got = s.settle(done);
            all.acked.extend(got.acked);
            all.failed.extend(got.failed);
        }
        all
    }

    fn put<'a>(key: &'a [u8], value: &'a [u8], cas: u64) -> Change<'a> {
        Change::Put {
            key,
            value,
            flags: 1,
            exptime: 0,
            cas,
            large: false,
        }
    }

    #[test]
    fn staged_writes_are_visible_before_and_after_their_flush() {
        let s = open(SimDevice::new(1 << 20));
        let mut log = s.take_log(0).unwrap();
        assert!(s.take_log(0).is_none(), "a log is driven by one worker");
        s.stage(&mut log, put(b"a", b"1", 5), 1).unwrap();
        s.stage(&mut log, Change::Delete { key: b"b" }, 2).unwrap();
        assert_eq!(s.lookup(b"a", 0).unwrap().unwrap().value, b"1", "overlay");
        let got = drive(&s, &mut log);
        assert_eq!(got.acked, vec![1, 2]);
        assert_eq!(s.lookup(b"a", 0).unwrap().unwrap().cas, 5, "index");
        s.stage(&mut log, Change::Delete { key: b"a" }, 3).unwrap();
        assert_eq!(
            s.lookup(b"a", 0).unwrap(),
            None,
            "staged delete hides the durable value"
        );
        drive(&s, &mut log);
        assert_eq!(s.lookup(b"a", 0).unwrap(), None);
        s.stage(&mut log, put(b"x", b"old", 6), 4).unwrap();
        s.stage(&mut log, Change::FlushAll { at: 100 }, 5).unwrap();
        s.stage(&mut log, put(b"y", b"new", 7), 6).unwrap();
        drive(&s, &mut log);
        assert!(s.lookup(b"x", 99).unwrap().is_some(), "flush not due yet");
        assert_eq!(s.lookup(b"x", 100).unwrap(), None, "flushed");
        assert!(
            s.lookup(b"y", 100).unwrap().is_some(),
            "written after the flush"
        );
        s.park_log(log);
        assert!(s.checkpoint().unwrap());
    }

    #[test]
    fn checkpoint_and_crash_recovery_keep_values_and_the_flush_mark() {
        let s = open(SimDevice::new(1 << 20));
        let mut log = s.take_log(1).unwrap();
        for i in 0..50u64 {
            s.stage(
                &mut log,
                put(format!("k{i}").as_bytes(), &i.to_le_bytes(), 100 + i),
                i,
            )
            .unwrap();
        }
        s.stage(&mut log, Change::FlushAll { at: 1 }, 99).unwrap();
        s.stage(&mut log, put(b"after", b"v", 500), 100).unwrap();
        assert_eq!(drive(&s, &mut log).acked.len(), 52);
        let img = s.device().crash_image(&mut SimRng::new(1));
        let s2 = open(SimDevice::from_image(img));
        assert_eq!(s2.max_cas(), 500);
        let mut seen = Vec::new();
        let (n, bad) = s2.for_each_value(10, |k, _| seen.push(k.to_vec()));
        assert_eq!((n, bad), (1, 0), "only the write after the flush is live");
        assert_eq!(seen, vec![b"after".to_vec()]);
        assert_eq!(
            s2.for_each_value(0, |_, _| {}).0,
            51,
            "before the flush time everything is live"
        );
    }

    #[test]
    fn failed_writes_are_reported_with_their_key_and_leave_the_older_value() {
        let s = open(SimDevice::new(1 << 20));
        let mut log = s.take_log(0).unwrap();
        s.stage(&mut log, put(b"k", b"good", 1), 1).unwrap();
        drive(&s, &mut log);
        s.device().fail_next_flush();
        s.stage(&mut log, put(b"k", b"lost", 2), 2).unwrap();
        let got = drive(&s, &mut log);
        assert!(got.acked.is_empty());
        assert_eq!(got.failed.len(), 1);
        assert_eq!(
            (got.failed[0].0, &*got.failed[0].1, got.failed[0].2),
            (2, &b"k"[..], 2)
        );
        assert_eq!(s.lookup(b"k", 0).unwrap().unwrap().value, b"good");
    }
}
