//! Large objects in [`Serving`] (see [`crate::large`]): which object each user key's durable
//! manifest names, manifests staged but not settled, uploads in progress and the space they
//! hold; the start-up sweep of orphaned chunks; reading chunks back (whole or a byte range,
//! verified piece by piece); removing the chunks of replaced or abandoned objects.
use crate::units::usize_from;
use std::collections::HashMap;
use std::sync::atomic::Ordering;

use super::{lock, Serving};
use crate::device::BlockDevice;
use crate::error::DurableError;
use crate::index::{Entry, Index};
use crate::large::{
    chunk_data, chunk_data_len, chunk_header_matches, chunk_key, parse_chunk_key, piece_table_len,
    Manifest, CHUNK_KEY_LEN, PIECE_LEN,
};
use crate::readback::record_offset;
use crate::record::{encoded_len, RecordKind, HEADER_LEN};
use crate::superblock::le32;

/// (object id, chunk count).
pub(super) type ObjectRef = (u64, u32);

#[derive(Debug, Default)]
pub(super) struct LargeObjects {
    /// User key → the object of its durable (index-current) manifest.
    pub(super) live: crate::index::KeyMap<Box<[u8]>, ObjectRef>,
    /// Sequence of a staged, unsettled manifest → its object (`Staged` carries no value bytes).
    pub(super) staged: HashMap<u64, ObjectRef>,
    /// Uploads in progress (chunks staged, no manifest yet) → device bytes of their chunks:
    /// space held until the manifest is staged or the upload is abandoned.
    pub(super) uploading: HashMap<u64, u64>,
}

impl LargeObjects {
    /// True while `object` may still be needed: the current object of `key`, or named by a
    /// manifest still in flight.
    pub(super) fn needed(&self, key: &[u8], object: u64) -> bool {
        self.live.get(key).is_some_and(|(o, _)| *o == object)
            || self.staged.values().any(|(o, _)| *o == object)
    }
}

/// Removes the chunk entries of `object` from the index (their bytes become dead); returns
/// how many were present.
pub(super) fn remove_chunks(index: &mut Index, (object, chunks): ObjectRef) -> usize {
    let mut n = 0;
    for i in 0..chunks {
        n += usize::from(index.remove(&chunk_key(object, i)));
    }
    n
}

impl<D: BlockDevice> Serving<D> {
    /// Start-up: learns every live manifest's object, then removes from the index every
    /// chunk of no live object (or past its object's chunk count). Skipped (nothing swept)
    /// when a manifest could not be read, so an I/O error never discards a live object's
    /// chunks. Returns how many chunk entries were removed.
    pub(super) fn load_objects(&self) -> usize {
        let mut manifests: Vec<(Box<[u8]>, Entry)> = self
            .read_index()
            .iter()
            .filter(|(k, e)| {
                e.meta.kind == RecordKind::Manifest && !k.is_empty() && parse_chunk_key(k).is_none()
            })
            .map(|(k, e)| (Box::<[u8]>::from(k), *e))
            .collect();
        manifests.sort_unstable_by_key(|(_, e)| (e.loc.region, e.loc.segment, e.loc.offset));
        let mut live =
            crate::index::KeyMap::with_capacity_and_hasher(manifests.len(), Default::default());
        let io_failed = self.read_each(&manifests, |key, rec| {
            if let Some(m) = rec.and_then(|r| Manifest::decode(&r.value)) {
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

    /// Bytes of one region that records may fill: its segments less those the serving path
    /// keeps back (compaction, deletes). What bounds the unfinished uploads of a region.
    pub fn region_len(&self) -> u64 {
        let g = self.sb.geometry;
        let keep = crate::region::COMPACTION_RESERVE + crate::region::DELETE_RESERVE;
        u64::from(g.segments_per_region.saturating_sub(keep)) * g.segment_size
    }

    /// Bytes of data per chunk on this device: a whole number of chunk records (piece table
    /// included; at least 4, as many as keep a chunk at most 1 MiB) fills a segment's
    /// payload, so large objects waste no segment tail; in whole 4 KiB, at least 4 KiB.
    pub fn chunk_len(&self) -> usize {
        let g = self.sb.geometry;
        let payload = usize_from(g.segment_size - u64::from(g.block_size));
        let per_segment = payload.div_ceil(1 << 20).max(4);
        let slot = payload / per_segment;
        let fit = slot.saturating_sub(self.record_len(CHUNK_KEY_LEN, 0));
        let mut len = fit.min(1 << 20) / 4096 * 4096;
        while len > 4096 && self.record_len(CHUNK_KEY_LEN, len + piece_table_len(len)) > slot {
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
        if self.crypt().is_some() {
            // A sealed chunk verifies only whole (one tag over the record): read it all.
            let data = self.read_chunk(object, index)?;
            let len = data.len();
            return data
                .get(start..end)
                .map(<[u8]>::to_vec)
                .ok_or(DurableError::BadRange { start, end, len });
        }
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
}
