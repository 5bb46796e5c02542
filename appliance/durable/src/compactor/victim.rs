//! What one compaction works on: the victim segment [`Compactor`] picks in a region, and per
//! record of it found by the scan, whether it is dead, copied into the log (within
//! [`COPY_BUDGET`] a step) or dropped at the erase (checked again just before it).
use crate::units::seg_u32;
use std::collections::HashSet;

use super::{Compactor, COPY_BUDGET};
use crate::device::BlockDevice;
use crate::index::Loc;
use crate::large::parse_chunk_key;
use crate::record::{decode, scan_heads, RecordKind, RecordMeta};
use crate::region::{Purpose, RegionLog, SegState, COMPACTION_RESERVE, DELETE_RESERVE};
use crate::segment::SegmentHeader;
use crate::serving::{DataFull, Serving};
use crate::SPACE_FACTOR;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Plan {
    /// Not live when scanned (or when its turn to be copied came).
    Dead,
    Copy,
    /// Live tombstone / expired value with nothing older: dropped at the erase if still so.
    Drop,
    /// Evicting: a live value (or manifest) with nothing older, dropped at the erase if still
    /// so (ADR 0039).
    Evict,
    /// Evicting: a live value with older records of its key left on the device (or a write of
    /// it in flight): a tombstone of the same sequence is written first, so recovery never
    /// brings an older value back.
    Mask,
}

#[derive(Debug)]
pub(super) struct Found {
    pub(super) key: Box<[u8]>,
    pub(super) meta: RecordMeta,
    pub(super) loc: Loc,
    pub(super) seed: u32,
    pub(super) plan: Plan,
}

#[derive(Debug)]
pub(super) struct Work {
    pub(super) seg: u32,
    pub(super) recs: Vec<Found>,
    pub(super) next: usize,
    pub(super) outstanding: usize,
    pub(super) moved: HashSet<Loc>,
    pub(super) failed: bool,
    /// An eviction (the device is full) rather than a compaction.
    pub(super) evict: bool,
    /// The walk found fewer live bytes than the index counts (damage): failed from the start.
    pub(super) unfound: bool,
}

/// Free segments beyond the reserves below which a full region in `evict` mode evicts its
/// oldest segment: values keep this much room (the active segment's rest, one segment) while
/// the eviction's read, tombstones and erase run.
pub const EVICT_HEADROOM: u32 = 2;

impl Compactor {
    /// The sealed segment to compact next (none of `damaged`), if the region needs it: its
    /// sealed bytes exceed `SPACE_FACTOR ×` their live bytes plus one segment (then any gain
    /// will do), or fewer than three segments are free beyond the reserves (then it must be
    /// at most 7/8 live); and its live bytes fit in the room left. Otherwise, when values are
    /// about to run out of room and the device evicts ([`DataFull::Evict`]): the oldest sealed
    /// segment, evicted (true).
    pub(super) fn pick<D: BlockDevice>(
        s: &Serving<D>,
        log: &RegionLog<u64>,
        damaged: &[u32],
    ) -> Option<(u32, bool)> {
        let g = s.superblock().geometry;
        let payload = g.segment_size - u64::from(g.block_size);
        let index = s.read_index();
        let (mut sealed, mut sealed_live) = (0u64, 0u64);
        let mut best: Option<(u64, u64, u32)> = None;
        let mut oldest: Option<(u64, u64, u32)> = None;
        // Records in flight are not in the index yet: their segments would look dead.
        let in_flight_from = log.unsettled_since().unwrap_or(u64::MAX);
        for (seg, state, open_seq) in log.segments() {
            if state != SegState::Sealed {
                continue;
            }
            let live = index.live_bytes(log.region(), seg);
            sealed += g.segment_size;
            sealed_live += live;
            if open_seq >= in_flight_from || damaged.contains(&seg) {
                continue;
            }
            if best.is_none_or(|(l, o, _)| (live, open_seq) < (l, o)) {
                best = Some((live, open_seq, seg));
            }
            if oldest.is_none_or(|(_, o, _)| open_seq < o) {
                oldest = Some((live, open_seq, seg));
            }
        }
        drop(index);
        let (live, _, seg) = best?;
        let over_bound = sealed > SPACE_FACTOR * sealed_live + g.segment_size;
        let pressed = log.free_count() < COMPACTION_RESERVE + DELETE_RESERVE + 3;
        // Under pressure alone, a victim must free at least 1/8 segment: otherwise a device
        // full of live values would be recopied forever for the slack at segment ends.
        let gains = if over_bound {
            live < payload
        } else {
            live <= payload - payload / 8
        };
        let fits = live + u64::from(g.block_size) * 2 <= log.room(0);
        if gains && fits && (over_bound || pressed) {
            return Some((seg, false));
        }
        let full = log.free_count() < COMPACTION_RESERVE + DELETE_RESERVE + EVICT_HEADROOM;
        let (live, _, seg) = oldest?;
        // An eviction copies at most the victim's live bytes (tombstones are smaller).
        let fits = live + u64::from(g.block_size) * 2 <= log.room(0);
        (full && fits && s.data_full() == DataFull::Evict).then_some((seg, true))
    }

    /// Scans the victim (now in `buf`) and decides, per record, copy / drop / dead, and when
    /// `evict`, evict / mask.
    pub(super) fn plan<D: BlockDevice>(
        &self,
        s: &Serving<D>,
        region: u32,
        (seg, evict): (u32, bool),
        now_unix: u64,
    ) -> Work {
        let block = s.superblock().geometry.block_size as usize;
        let mut recs = Vec::new();
        let index = s.read_index();
        if let Some((_, seed)) = SegmentHeader::decode(&self.buf[..block]) {
            let mut prev = seed;
            // Heads only: on a sealed device most of a victim is dead, and what is copied is
            // decoded (its tag checked) again in `copy_some`.
            scan_heads(&self.buf, block, seed, block, s.crypt(), |pos, rec| {
                let loc = Loc {
                    region,
                    segment: seg,
                    offset: seg_u32(pos),
                    len: seg_u32(rec.len),
                };
                let plan = match index.get(&rec.key) {
                    Some(e) if e.loc == loc && loc.len > 0 => {
                        let expired = rec.meta.exptime != 0 && rec.meta.exptime <= now_unix;
                        let droppable = rec.meta.kind == RecordKind::Tombstone || expired;
                        if droppable && e.older == 0 && !rec.key.is_empty() {
                            Plan::Drop
                        } else if evict && !droppable && evictable(&rec.key) {
                            if e.older == 0 {
                                Plan::Evict
                            } else {
                                Plan::Mask
                            }
                        } else {
                            Plan::Copy
                        }
                    }
                    _ => Plan::Dead,
                };
                recs.push(Found {
                    key: (*rec.key).into(),
                    meta: rec.meta,
                    loc,
                    seed: prev,
                    plan,
                });
                prev = rec.crc;
            });
        }
        // The walk stops at the first record that does not decode (and finds none behind a
        // damaged segment header): live records past it would be erased unseen. The index's
        // live bytes of the segment are the sum of its live records' lengths; any short of it
        // and the compaction gives up, the victim kept (ADR 0016: refuse, never lose).
        let found: u64 = recs
            .iter()
            .filter(|f| f.plan != Plan::Dead)
            .map(|f| u64::from(f.loc.len))
            .sum();
        let unfound = found < index.live_bytes(region, seg);
        drop(index);
        Work {
            seg,
            recs,
            next: 0,
            outstanding: 0,
            moved: HashSet::new(),
            failed: unfound,
            evict,
            unfound,
        }
    }

    /// Stages copies of the next live records, up to [`COPY_BUDGET`] bytes.
    pub(super) fn copy_some<D: BlockDevice>(
        &mut self,
        s: &Serving<D>,
        log: &mut RegionLog<u64>,
        w: &mut Work,
    ) {
        let mut budget = COPY_BUDGET;
        while w.next < w.recs.len() && budget > 0 && !w.failed {
            let f = &mut w.recs[w.next];
            w.next += 1;
            if f.plan != Plan::Copy && f.plan != Plan::Mask {
                continue;
            }
            if !s.read_index().is_live(&f.key, &f.loc) {
                f.plan = Plan::Dead; // overwritten or deleted since the scan
                continue;
            }
            let at = f.loc.offset as usize;
            let Some(rec) = self
                .buf
                .get(at..)
                .and_then(|b| decode(b, f.seed, s.crypt()))
            else {
                w.failed = true;
                break;
            };
            let (value, meta) = if f.plan == Plan::Mask {
                let meta = RecordMeta {
                    cas: rec.meta.cas,
                    ..RecordMeta::bare(RecordKind::Tombstone, rec.meta.seq)
                };
                (&[][..], meta)
            } else {
                (&*rec.value, rec.meta)
            };
            match log.stage_keeping(&rec.key, value, meta, Purpose::Relocate(f.loc), 0) {
                Ok(_) => {
                    w.outstanding += 1;
                    budget = budget.saturating_sub(rec.len);
                    self.stats.copied += 1;
                    self.stats.copied_bytes += rec.len as u64;
                }
                Err(_) => w.failed = true,
            }
        }
    }

    /// Just before the erase: a record planned to be dropped (evicted) that gained an older
    /// value, or whose sequence is not below every unsettled client write, is copied (masked)
    /// instead. True when it added copies.
    pub(super) fn recheck_drops<D: BlockDevice>(&self, s: &Serving<D>, w: &mut Work) -> bool {
        let floor = s.min_pending_seq();
        let index = s.read_index();
        let mut first = None;
        for (i, f) in w.recs.iter_mut().enumerate() {
            let drops = matches!(f.plan, Plan::Drop | Plan::Evict);
            if !drops || !index.is_live(&f.key, &f.loc) {
                continue;
            }
            let older = index.get(&f.key).map_or(0, |e| e.older);
            if older > 0 || f.meta.seq >= floor {
                f.plan = if f.plan == Plan::Evict {
                    Plan::Mask
                } else {
                    Plan::Copy
                };
                first.get_or_insert(i);
            }
        }
        if let Some(i) = first {
            w.next = w.next.min(i);
            return true;
        }
        false
    }
}

/// Records an eviction may drop: client values and manifests. The flush_all mark stays (it
/// invalidates older records), and so do large-object chunks: a chunk leaves with its manifest
/// (its object evicted whole), never alone, or the object would be served short.
fn evictable(key: &[u8]) -> bool {
    !key.is_empty() && parse_chunk_key(key).is_none()
}
