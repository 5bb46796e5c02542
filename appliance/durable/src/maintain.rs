//! Compaction: pick the sealed segment with the fewest live bytes, copy its live records to the
//! region's log, erase its header, and forget what the erase made unreachable.
//!
//! Space bound (ADR 0010): after [`Durable::maintain`], the bytes in sealed segments are at most
//! `SPACE_FACTOR ×` the live bytes in them plus one segment, so the whole device use is at most
//! `SPACE_FACTOR × live + (regions + 1) × segment_size` (one partly filled active segment per region).
use crate::device::BlockDevice;
use crate::engine::Durable;
use crate::error::DurableError;
use crate::index::Loc;
use crate::record::{scan, RecordKind, RecordMeta};
use crate::region::{Purpose, SegState};
use crate::segment::SegmentHeader;
use crate::units::{seg_u32, usize_from};

/// The stated bound between bytes in sealed segments and live bytes in them.
pub const SPACE_FACTOR: u64 = 2;

/// What one compaction did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompactReport {
    /// Region of the erased segment.
    pub region: u32,
    /// Erased segment.
    pub segment: u32,
    /// Live records copied.
    pub copied: usize,
    /// Live bytes copied.
    pub copied_bytes: u64,
    /// Tombstones and expired values dropped because nothing older remained under them.
    pub dropped: usize,
}

/// Device space in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpaceUsage {
    /// Bytes of segments in use (active or sealed).
    pub used: u64,
    /// Bytes of live records.
    pub live: u64,
    /// Bytes of sealed segments.
    pub sealed: u64,
    /// Live bytes in sealed segments.
    pub sealed_live: u64,
    /// Bytes of free segments.
    pub free: u64,
}

struct Found {
    key: Box<[u8]>,
    value: Vec<u8>,
    meta: RecordMeta,
    loc: Loc,
}

impl<D: BlockDevice> Durable<D> {
    /// Current space accounting.
    pub fn space(&self) -> SpaceUsage {
        let s = self.sb.geometry.segment_size;
        let mut u = SpaceUsage {
            used: 0,
            live: self.index.total_live(),
            sealed: 0,
            sealed_live: 0,
            free: 0,
        };
        for log in &self.regions {
            for (seg, state, _) in log.segments() {
                match state {
                    SegState::Free => u.free += s,
                    SegState::Active => u.used += s,
                    SegState::Sealed => {
                        u.used += s;
                        u.sealed += s;
                        u.sealed_live += self.index.live_bytes(log.region(), seg);
                    }
                }
            }
        }
        u
    }

    fn pick_victim(&self) -> Option<(usize, u32, u64)> {
        let mut best: Option<(usize, u32, u64, u64)> = None;
        for (r, log) in self.regions.iter().enumerate() {
            for (seg, state, open_seq) in log.segments() {
                if state != SegState::Sealed {
                    continue;
                }
                let live = self.index.live_bytes(log.region(), seg);
                if best.is_none_or(|(_, _, l, o)| (live, open_seq) < (l, o)) {
                    best = Some((r, seg, live, open_seq));
                }
            }
        }
        best.map(|(r, s, l, _)| (r, s, l))
    }

    /// Compact the sealed segment with the fewest live bytes. `now` (Unix seconds) lets expired
    /// values be dropped. `Ok(None)` when there is no sealed segment.
    pub fn compact(&mut self, now: u64) -> Result<Option<CompactReport>, DurableError> {
        let early = self.sync();
        self.pending_acks_extend(early);
        let Some((r, seg, _)) = self.pick_victim() else {
            return Ok(None);
        };
        let g = self.sb.geometry;
        let region = self.regions[r].region();
        let base = g.segment_offset(region, seg);
        let mut buf = vec![0u8; usize_from(g.segment_size)];
        self.dev
            .read_at(base, &mut buf)
            .map_err(|e| DurableError::io(base, &e))?;
        let block = g.block_size as usize;
        let mut found = Vec::new();
        if let Some((_, seed)) = SegmentHeader::decode(&buf[..block]) {
            let crypt = self.crypt.as_deref();
            scan(&buf, block, seed, block, crypt, |pos, rec| {
                found.push(Found {
                    key: (*rec.key).into(),
                    value: rec.value.to_vec(),
                    meta: rec.meta,
                    loc: Loc {
                        region,
                        segment: seg,
                        offset: seg_u32(pos),
                        len: seg_u32(rec.len),
                    },
                });
            });
        }
        drop(buf);
        let mut report = CompactReport {
            region,
            segment: seg,
            copied: 0,
            copied_bytes: 0,
            dropped: 0,
        };
        let mut dead = Vec::new();
        let mut drop_live = Vec::new();
        for f in found {
            if !self.index.is_live(&f.key, &f.loc) {
                dead.push((f.key, f.meta.kind));
                continue;
            }
            let older = self.index.get(&f.key).map_or(0, |e| e.older);
            let expired = f.meta.exptime != 0 && f.meta.exptime <= now;
            if older == 0 && (f.meta.kind == RecordKind::Tombstone || expired) {
                drop_live.push(f.key);
                continue;
            }
            self.regions[r].stage(&f.key, &f.value, f.meta, Purpose::Relocate(f.loc), true)?;
            report.copied += 1;
            report.copied_bytes += u64::from(f.loc.len);
        }
        let failures = self.relocate_failures;
        let acks = self.sync();
        self.pending_acks_extend(acks);
        if self.relocate_failures != failures {
            return Err(DurableError::Io {
                offset: base,
                kind: std::io::ErrorKind::Other,
            });
        }
        // The copies are durable; now erase the victim so recovery can no longer see it.
        let (off, zero) = self.regions[r].erase_write(seg);
        self.dev
            .write_at(off, &zero)
            .map_err(|e| DurableError::io(off, &e))?;
        self.dev.flush().map_err(|e| DurableError::io(off, &e))?;
        self.regions[r].mark_free(seg);
        for key in drop_live {
            self.index.remove(&key);
            report.dropped += 1;
        }
        for (key, kind) in dead {
            self.index.reclaimed(&key, kind);
        }
        Ok(Some(report))
    }

    /// Compact until the space bound holds (or no compaction can gain space). Returns how many ran.
    pub fn maintain(&mut self, now: u64) -> Result<usize, DurableError> {
        let g = self.sb.geometry;
        let payload = g.segment_size - u64::from(g.block_size);
        let limit = self.regions.len() * g.segments_per_region as usize;
        let mut runs = 0;
        while runs < limit {
            let u = self.space();
            if u.sealed <= SPACE_FACTOR * u.sealed_live + g.segment_size {
                break;
            }
            match self.pick_victim() {
                Some((_, _, live)) if live < payload => {}
                _ => break,
            }
            self.compact(now)?;
            runs += 1;
        }
        Ok(runs)
    }
}
