//! One region's append-only log (one per worker): segment allocation within the region,
//! record encoding with the crc chain, and the region's group commit. Sans-IO: the caller
//! executes the emitted actions and reports completions.
use crate::crypt::Sealer;
use crate::error::DurableError;
use crate::group_commit::{Action, Completion, GroupCommit, Limits, OpId};
use crate::index::Loc;
use crate::record::{encode_into, encode_sealed_into, record_len, RecordMeta, Stamp, KEY_LEN_MAX};
use crate::segment::{PrevSegment, SegmentHeader};
use crate::superblock::Geometry;
use crate::units::{count_u32, seg_u32, usize_from};

/// Free segments a region keeps back from client writes so compaction can always make progress.
pub const COMPACTION_RESERVE: u32 = 1;

/// Free segments beyond [`COMPACTION_RESERVE`] that the serving path keeps from value writes
/// but lets deletes (and flush_all) take, so a device full of live values still accepts the
/// deletes that free it (ADR 0011).
pub const DELETE_RESERVE: u32 = 1;

/// Lifecycle of a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SegState {
    /// Header erased; may be opened.
    Free,
    /// Receiving appends.
    Active,
    /// Full or closed; only compaction changes it.
    Sealed,
}

/// Why a record was staged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Purpose<T> {
    /// A client write; the token is released when it is durable.
    Client(T),
    /// Compaction copying the live record that was at this location.
    Relocate(Loc),
}

/// A staged record travelling through group commit; returned in completions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Staged<T> {
    /// The key.
    pub key: Box<[u8]>,
    /// Its header fields.
    pub meta: RecordMeta,
    /// Where it will be.
    pub loc: Loc,
    /// Value length.
    pub value_len: u32,
    /// crc it chains after.
    pub seed: u32,
    /// Client write or compaction copy.
    pub purpose: Purpose<T>,
}

/// The log of one region.
#[derive(Debug)]
pub struct RegionLog<T> {
    region: u32,
    geo: Geometry,
    uuid: [u8; 16],
    states: Vec<SegState>,
    open_seqs: Vec<u64>,
    next_open_seq: u64,
    active: Option<u32>,
    chain: u32,
    /// Stamp of the records appended to the active segment: its tag, and how many of its
    /// bytes are known durable (end of the last acknowledged record in it; ADR 0016).
    stamp: Stamp,
    /// End of the last record staged into the active segment.
    last_end: u32,
    /// What the next segment's header says about the one before it (ADR 0016).
    prev: Option<PrevSegment>,
    commit: GroupCommit<Staged<T>>,
    scratch: Vec<u8>,
    /// On a device with a data key: seals every record (ADR 0050).
    sealer: Option<Sealer>,
}

impl<T> RegionLog<T> {
    /// A region whose segments are in `states` (all `Free` or `Sealed`; new writes open a fresh segment).
    pub fn new(
        region: u32,
        geo: Geometry,
        uuid: [u8; 16],
        limits: Limits,
        states: Vec<(SegState, u64)>,
        next_open_seq: u64,
    ) -> Self {
        let (states, open_seqs) = states.into_iter().unzip();
        RegionLog {
            region,
            geo,
            uuid,
            states,
            open_seqs,
            next_open_seq,
            active: None,
            chain: 0,
            stamp: Stamp::default(),
            last_end: 0,
            prev: None,
            commit: GroupCommit::new(limits, geo.block_size, 0),
            scratch: Vec::new(),
            sealer: None,
        }
    }

    /// Seal every record this log writes from now on (a device opened with its data key).
    pub fn set_sealer(&mut self, sealer: Option<Sealer>) {
        self.sealer = sealer;
    }

    /// Bytes a record with these lengths occupies in this log.
    pub fn record_len(&self, key_len: usize, value_len: usize) -> usize {
        record_len(self.sealer.is_some(), key_len, value_len)
    }

    /// Encodes one record into the scratch buffer, chained after `seed`; returns its crc.
    fn encode(
        &mut self,
        seed: u32,
        meta: &RecordMeta,
        key: &[u8],
        value: &[u8],
    ) -> Result<u32, DurableError> {
        self.scratch.clear();
        Ok(match &mut self.sealer {
            None => encode_into(&mut self.scratch, seed, meta, self.stamp, key, value),
            Some(sealer) => {
                let nonce = sealer.next_nonce()?;
                encode_sealed_into(
                    &mut self.scratch,
                    seed,
                    meta,
                    self.stamp,
                    key,
                    value,
                    sealer,
                    nonce,
                )
            }
        })
    }

    /// Continue appending to `segment` at `tail` (bytes into the segment, block-aligned) after `chain`.
    /// Only valid for a tail known to be clean (a checkpoint written at shutdown).
    pub fn resume(&mut self, segment: u32, tail: u64, chain: u32) {
        if let Some(s) = self.states.get_mut(segment as usize) {
            *s = SegState::Active;
            self.active = Some(segment);
            self.chain = chain;
            let header = SegmentHeader {
                uuid: self.uuid,
                region: self.region,
                segment,
                open_seq: self.open_seqs[segment as usize],
                prev: None,
            };
            self.last_end = u32::try_from(tail).unwrap_or(u32::MAX);
            // Everything before a checkpoint's clean tail is durable.
            self.stamp = Stamp {
                tag: header.tag(),
                durable: u32::try_from(tail).unwrap_or(u32::MAX),
            };
            self.commit
                .relocate(self.geo.segment_offset(self.region, segment) + tail);
        }
    }

    /// This region's number.
    pub fn region(&self) -> u32 {
        self.region
    }

    /// State and open sequence of every segment.
    pub fn segments(&self) -> impl Iterator<Item = (u32, SegState, u64)> + '_ {
        self.states
            .iter()
            .zip(&self.open_seqs)
            .enumerate()
            .map(|(i, (s, o))| (count_u32(i), *s, *o))
    }

    /// Next open sequence (for checkpoints).
    pub fn next_open_seq(&self) -> u64 {
        self.next_open_seq
    }

    /// Open sequence of the segment holding the oldest record not yet settled: that segment
    /// and every one opened after it may have records in flight (not yet in the index), so
    /// compaction must not pick them. `None` when everything is settled.
    pub fn unsettled_since(&self) -> Option<u64> {
        let off = self.commit.oldest_unsettled_offset()?;
        let base = self.geo.segment_offset(self.region, 0);
        let seg = usize_from(off.saturating_sub(base) / self.geo.segment_size);
        Some(self.open_seqs.get(seg).copied().unwrap_or(0))
    }

    /// Segments not in use.
    pub fn free_count(&self) -> u32 {
        count_u32(self.states.iter().filter(|s| **s == SegState::Free).count())
    }

    /// True when no write is queued or in flight.
    pub fn is_idle(&self) -> bool {
        self.commit.is_idle()
    }

    /// Writes accepted and not yet acked or failed.
    pub fn pending_writes(&self) -> usize {
        self.commit.pending_writes()
    }

    /// Active segment, bytes used in it, and the chain crc (meaningful when idle).
    pub fn tail(&self) -> Option<(u32, u64, u32)> {
        let seg = self.active?;
        let start = self.geo.segment_offset(self.region, seg);
        Some((seg, self.commit.place(0) - start, self.chain))
    }

    /// Largest key + value a single record can hold in this geometry.
    pub fn max_record_len(&self) -> usize {
        usize_from(self.geo.segment_size - u64::from(self.geo.block_size))
    }

    /// Encode and queue one record. `use_reserve` lets compaction take the last free segment.
    pub fn stage(
        &mut self,
        key: &[u8],
        value: &[u8],
        meta: RecordMeta,
        purpose: Purpose<T>,
        use_reserve: bool,
    ) -> Result<Loc, DurableError> {
        let keep = if use_reserve { 0 } else { COMPACTION_RESERVE };
        self.stage_keeping(key, value, meta, purpose, keep)
    }

    /// Bytes that can still be appended without opening a segment that would leave fewer
    /// than `keep` free: the rest of the active segment plus every free segment above `keep`.
    pub fn room(&self, keep: u32) -> u64 {
        let payload = self.geo.segment_size - u64::from(self.geo.block_size);
        let active = self.active.map_or(0, |seg| {
            let end = self.geo.segment_offset(self.region, seg) + self.geo.segment_size;
            end.saturating_sub(self.commit.place(0))
        });
        active + u64::from(self.free_count().saturating_sub(keep)) * payload
    }

    /// [`RegionLog::stage`], opening a new segment only while more than `keep` are free.
    pub fn stage_keeping(
        &mut self,
        key: &[u8],
        value: &[u8],
        meta: RecordMeta,
        purpose: Purpose<T>,
        keep: u32,
    ) -> Result<Loc, DurableError> {
        if key.len() > KEY_LEN_MAX {
            return Err(DurableError::TooLarge {
                len: key.len(),
                limit: KEY_LEN_MAX,
            });
        }
        let len = self.record_len(key.len(), value.len());
        if len > self.max_record_len() {
            return Err(DurableError::TooLarge {
                len,
                limit: self.max_record_len(),
            });
        }
        if matches!(purpose, Purpose::Client(_)) {
            self.commit.check_room()?;
        }
        if self.commit.is_broken() {
            // The tail of the active segment is unknown after an I/O error: never append there again.
            self.seal_active();
        }
        let fits = self.active.is_some_and(|seg| {
            let end = self.geo.segment_offset(self.region, seg) + self.geo.segment_size;
            self.commit.place(len) + len as u64 <= end
        });
        if !fits {
            self.open_segment(keep)?;
        }
        let seg = self.active.ok_or(DurableError::NoSpace)?;
        let seed = self.chain;
        let crc = self.encode(seed, &meta, key, value)?;
        let start = self.geo.segment_offset(self.region, seg);
        let at = self.commit.place(len);
        let loc = Loc {
            region: self.region,
            segment: seg,
            offset: seg_u32(usize_from(at - start)),
            len: seg_u32(len),
        };
        let staged = Staged {
            key: key.into(),
            meta,
            loc,
            value_len: seg_u32(value.len()),
            seed,
            purpose,
        };
        // Record boundary: the record lies after the segment header, inside the active segment,
        // 8-aligned, right after the last record staged in it (or past batch padding).
        debug_assert_eq!(self.scratch.len(), len);
        debug_assert!(at >= start + u64::from(self.geo.block_size));
        debug_assert!(u64::from(loc.offset) + u64::from(loc.len) <= self.geo.segment_size);
        debug_assert!(loc.offset.is_multiple_of(8));
        let got = self.commit.push(Some(staged), &self.scratch)?;
        debug_assert_eq!(got, at);
        self.chain = crc;
        self.last_end = loc.offset + loc.len;
        Ok(loc)
    }

    /// The segment opened after a restart will say that `segment` (opened as `open_seq`) was
    /// found ending at `end`: recovery read it, and the first flush of the new segment makes
    /// whatever of it was still only in the page cache durable too.
    pub fn note_recovered_tail(&mut self, segment: u32, open_seq: u64, end: u32) {
        if self.active.is_none() {
            self.prev = Some(PrevSegment {
                segment,
                open_seq,
                end,
            });
        }
    }

    fn seal_active(&mut self) {
        if let Some(seg) = self.active.take() {
            self.states[seg as usize] = SegState::Sealed;
            // Broken: only what was durable in it is vouched for; otherwise all it holds.
            let end = if self.commit.is_broken() {
                self.stamp.durable
            } else {
                self.last_end
            };
            self.prev = Some(PrevSegment {
                segment: seg,
                open_seq: self.open_seqs[seg as usize],
                end,
            });
        }
    }

    fn open_segment(&mut self, keep: u32) -> Result<(), DurableError> {
        let free = self.free_count();
        if free == 0 || free <= keep {
            return Err(DurableError::NoSpace);
        }
        let seg = self
            .states
            .iter()
            .position(|s| *s == SegState::Free)
            .ok_or(DurableError::NoSpace)?;
        let seg = count_u32(seg);
        self.seal_active();
        let open_seq = self.next_open_seq;
        self.next_open_seq += 1;
        let header = SegmentHeader {
            uuid: self.uuid,
            region: self.region,
            segment: seg,
            open_seq,
            prev: self.prev.take(),
        };
        // Segment boundary: a free segment gets a header of this device, region and segment, one
        // block long, and recovery must read back exactly what is written here.
        debug_assert!(header
            .prev
            .is_none_or(|p| p.segment != seg || p.open_seq < open_seq));
        let (bytes, crc) = header.encode(self.geo.block_size as usize);
        debug_assert_eq!(bytes.len(), self.geo.block_size as usize);
        debug_assert_eq!(
            SegmentHeader::decode(&bytes)
                .map(|(h, c)| (h.uuid, h.region, h.segment, h.open_seq, c)),
            Some((self.uuid, self.region, seg, open_seq, crc))
        );
        self.commit
            .relocate(self.geo.segment_offset(self.region, seg));
        self.commit.push(None, &bytes)?;
        self.states[seg as usize] = SegState::Active;
        self.open_seqs[seg as usize] = open_seq;
        self.active = Some(seg);
        self.chain = crc;
        self.stamp = Stamp {
            tag: header.tag(),
            durable: 0,
        };
        self.last_end = 0;
        Ok(())
    }

    /// Close the active segment (it becomes a compaction candidate).
    pub fn seal(&mut self) {
        self.seal_active();
    }

    /// The write that frees `seg`: a zeroed header block at its start.
    pub fn erase_write(&self, seg: u32) -> (u64, Vec<u8>) {
        (
            self.geo.segment_offset(self.region, seg),
            vec![0; self.geo.block_size as usize],
        )
    }

    /// Mark `seg` free. Call only after its erase write has been flushed.
    pub fn mark_free(&mut self, seg: u32) {
        if let Some(s) = self.states.get_mut(seg as usize) {
            if *s == SegState::Sealed {
                *s = SegState::Free;
            }
        }
    }

    /// Caps the flushes in flight at the lanes (open file descriptions) the driver has.
    pub fn limit_flush_lanes(&mut self, lanes: usize) {
        self.commit.limit_flush_lanes(lanes);
    }

    /// Reports each durable group to `metrics` ([`GroupCommit::attach_metrics`]).
    pub fn attach_metrics(&mut self, metrics: std::sync::Arc<crate::CommitMetrics>) {
        self.commit.attach_metrics(metrics);
    }

    /// Chained group commit ([`GroupCommit::chain_flushes`]): for drivers that chain each
    /// batch's flush behind its write.
    pub fn chain_flushes(&mut self, on: bool) {
        self.commit.chain_flushes(on);
    }

    /// Next I/O to submit.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.commit.poll_action()
    }

    /// Hands back a completed write's buffer for reuse ([`GroupCommit::recycle`]).
    pub fn recycle(&mut self, buf: Vec<u8>) {
        self.commit.recycle(buf);
    }

    /// Completion of a write.
    pub fn on_write_complete(
        &mut self,
        id: OpId,
        ok: bool,
    ) -> Result<Completion<Staged<T>>, DurableError> {
        let done = self.commit.on_write_complete(id, ok)?;
        self.note_durable(&done);
        Ok(done)
    }

    /// Completion of a flush.
    pub fn on_flush_complete(
        &mut self,
        id: OpId,
        ok: bool,
    ) -> Result<Completion<Staged<T>>, DurableError> {
        let done = self.commit.on_flush_complete(id, ok)?;
        self.note_durable(&done);
        Ok(done)
    }

    /// Acknowledged records are the durable prefix of the log: the active segment is durable
    /// up to the end of the last of them in it. Later records stamp that claim.
    fn note_durable(&mut self, done: &Completion<Staged<T>>) {
        let Some(seg) = self.active else { return };
        for s in done.acked.iter().filter(|s| s.loc.segment == seg) {
            let end = s.loc.offset.saturating_add(s.loc.len);
            self.stamp.durable = self.stamp.durable.max(end);
        }
    }

    /// The stamp the next record appended to the active segment carries.
    pub fn stamp(&self) -> Stamp {
        self.stamp
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::RecordKind;

    fn log() -> RegionLog<u32> {
        let geo = Geometry::plan(1 << 20, 1, 8192, 512, 0).unwrap();
        let n = geo.segments_per_region as usize;
        RegionLog::new(
            0,
            geo,
            [1; 16],
            Limits::default(),
            vec![(SegState::Free, 0); n],
            1,
        )
    }

    fn meta(seq: u64) -> RecordMeta {
        RecordMeta {
            kind: RecordKind::Value,
            flags: 0,
            exptime: 0,
            cas: seq,
            seq,
        }
    }

    #[test]
    fn first_write_opens_a_segment_and_records_follow_its_header() {
        let mut l = log();
        let loc = l
            .stage(b"k", b"v", meta(1), Purpose::Client(1), false)
            .unwrap();
        assert_eq!((loc.segment, loc.offset), (0, 512));
        let loc2 = l
            .stage(b"k2", b"v", meta(2), Purpose::Client(2), false)
            .unwrap();
        assert_eq!(loc2.offset, 512 + loc.len);
        let Some(Action::WriteBatch { offset, bytes, .. }) = l.poll_action() else {
            panic!()
        };
        assert_eq!(offset % 512, 0);
        assert_eq!(bytes.len(), 1024);
        assert!(SegmentHeader::decode(&bytes).is_some());
    }

    #[test]
    fn full_segment_rolls_over_and_reserve_is_kept() {
        let mut l = log();
        let total = l.free_count();
        let value = vec![7u8; 3000];
        let mut segs = std::collections::BTreeSet::new();
        let mut n = 0;
        let err = loop {
            match l.stage(
                b"k",
                &value,
                meta(n),
                Purpose::Client(u32::try_from(n).unwrap()),
                false,
            ) {
                Ok(loc) => segs.insert(loc.segment),
                Err(e) => break e,
            };
            n += 1;
        };
        assert!(matches!(err, DurableError::NoSpace));
        assert_eq!(
            u32::try_from(segs.len()).unwrap(),
            total - COMPACTION_RESERVE
        );
        assert!(l
            .stage(
                b"k",
                &value,
                meta(n),
                Purpose::Relocate(Loc {
                    region: 0,
                    segment: 0,
                    offset: 0,
                    len: 0
                }),
                true
            )
            .is_ok());
        assert!(matches!(
            l.stage(b"k", &vec![0; 9000], meta(n), Purpose::Client(0), true),
            Err(DurableError::TooLarge { .. })
        ));
    }
}
