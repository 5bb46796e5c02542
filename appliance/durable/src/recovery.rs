//! Recovery by scanning: every region's segments are read in parallel (one std thread per
//! region), each segment's crc chain is followed until the first record that does not decode,
//! and the records found are handed to the index, where the highest sequence wins.
//!
//! Where the chain ends, the rest of the segment is searched for more records of the same use
//! of the segment (ADR 0016): one that chains after the stored crc of the record that did not
//! decode, or one that chains after a record whose own crc cannot be checked. If such a record
//! (or one after it) carries a [`crate::record::Stamp`] saying that the segment was durable
//! past the place where the chain broke, that place was acknowledged history: a damaged
//! record or a lost write, reported as [`Damage`]. Otherwise it is the torn tail of a crash
//! (or of a failed write), which is normal, and nothing past it is used.
use crate::device::BlockDevice;
use crate::error::DurableError;
use crate::index::Loc;
use crate::record::{
    decode, encoded_len, recompute_crc, scan, RecordMeta, RecordView, Stamp, HEADER_LEN,
    RECORD_MAGIC,
};
use crate::region::SegState;
use crate::segment::SegmentHeader;
use crate::superblock::{le32, Superblock};

/// A place in acknowledged history where the log does not verify: a later record of the
/// same segment use says the segment was durable past it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Damage {
    /// Region.
    pub region: u32,
    /// Segment in the region.
    pub segment: u32,
    /// Bytes into the segment where the verified chain ends.
    pub offset: u32,
}

/// One record found on the device.
#[derive(Debug)]
pub struct ScannedRecord {
    /// Key bytes.
    pub key: Box<[u8]>,
    /// Header fields.
    pub meta: RecordMeta,
    /// Location.
    pub loc: Loc,
    /// Value length.
    pub value_len: u32,
    /// crc it chains after.
    pub seed: u32,
}

/// What one region holds.
#[derive(Debug)]
pub struct RegionScan {
    /// Per segment: sealed (has a valid header) or free, and its open sequence.
    pub states: Vec<(SegState, u64)>,
    /// One past the highest open sequence seen.
    pub next_open_seq: u64,
    /// Every record of the verified chains, in log order per segment.
    pub records: Vec<ScannedRecord>,
    /// Places in acknowledged history that do not verify.
    pub damaged: Vec<Damage>,
    /// Verified records found past a damaged place (used only when salvaging).
    pub past_damage: Vec<ScannedRecord>,
    /// The segment opened last (highest open sequence) and where its verified chain ends.
    pub newest: Option<(u32, u64, u32)>,
}

/// Scan one region.
pub fn scan_region<D: BlockDevice + ?Sized>(
    dev: &D,
    sb: &Superblock,
    region: u32,
) -> Result<RegionScan, DurableError> {
    let g = &sb.geometry;
    let block = g.block_size as usize;
    let mut out = RegionScan {
        states: Vec::new(),
        next_open_seq: 1,
        records: Vec::new(),
        damaged: Vec::new(),
        past_damage: Vec::new(),
        newest: None,
    };
    // Per segment: (open_seq, end of the verified chain from its header) when in use.
    let mut chain_ends: Vec<Option<(u64, u32)>> = vec![None; g.segments_per_region as usize];
    // Headers naming the segment written before them, and whether their own segment has an
    // acknowledged record (a stamp claiming some of it durable).
    let mut claims: Vec<(crate::segment::PrevSegment, bool)> = Vec::new();
    // Verified records past a break with no verdict yet, per segment (for salvage).
    let mut unclaimed: Vec<(u32, Vec<ScannedRecord>)> = Vec::new();
    let mut buf = vec![0u8; g.segment_size as usize];
    for seg in 0..g.segments_per_region {
        let off = g.segment_offset(region, seg);
        dev.read_at(off, &mut buf[..block])
            .map_err(|e| DurableError::io(off, &e))?;
        let header = SegmentHeader::decode(&buf[..block])
            .filter(|(h, _)| h.uuid == sb.uuid && h.region == region && h.segment == seg);
        let Some((h, seed)) = header else {
            out.states.push((SegState::Free, 0));
            continue;
        };
        out.states.push((SegState::Sealed, h.open_seq));
        out.next_open_seq = out.next_open_seq.max(h.open_seq + 1);
        dev.read_at(off + block as u64, &mut buf[block..])
            .map_err(|e| DurableError::io(off, &e))?;
        let tag = h.tag();
        let at = |pos: usize, r: &RecordView<'_>, seed: u32| ScannedRecord {
            key: r.key.into(),
            meta: r.meta,
            loc: Loc {
                region,
                segment: seg,
                offset: pos as u32,
                len: r.len as u32,
            },
            value_len: r.value.len() as u32,
            seed,
        };
        let records = &mut out.records;
        let mut prev = seed;
        let mut acked = false;
        let (mut end, mut chain) = scan(&buf, block, seed, block, |pos, r| {
            acked |= r.stamp.tag == tag && r.stamp.durable > 0;
            records.push(at(pos, r, prev));
            prev = r.crc;
        });
        chain_ends[seg as usize] = Some((h.open_seq, end as u32));
        if out.newest.is_none_or(|(_, o, _)| o < h.open_seq) {
            out.newest = Some((seg, h.open_seq, end as u32));
        }
        // Past the end of the chain: more of this segment's use?
        let mut later: Vec<(usize, Stamp, ScannedRecord)> = Vec::new();
        let mut breaks = Vec::new();
        while let Some((q, seed)) = resync(&buf, end, chain, tag, block) {
            breaks.push(end);
            let mut prev = seed;
            let (e, c) = scan(&buf, q, seed, block, |pos, r| {
                later.push((pos, r.stamp, at(pos, r, prev)));
                prev = r.crc;
            });
            (end, chain) = (e, c);
        }
        let damaged: Vec<usize> = breaks
            .into_iter()
            .filter(|&b| {
                later
                    .iter()
                    .any(|(pos, st, _)| *pos > b && st.tag == tag && st.durable as usize > b)
            })
            .collect();
        acked |= later
            .iter()
            .any(|(_, st, _)| st.tag == tag && st.durable > 0);
        if let Some(prev) = h.prev {
            claims.push((prev, acked));
        }
        if let Some(&first) = damaged.first() {
            out.damaged.extend(damaged.iter().map(|&b| Damage {
                region,
                segment: seg,
                offset: b as u32,
            }));
            out.past_damage.extend(
                later
                    .into_iter()
                    .filter(|(pos, ..)| *pos > first)
                    .map(|(.., r)| r),
            );
        } else if !later.is_empty() {
            unclaimed.push((seg, later.into_iter().map(|(.., r)| r).collect()));
        }
    }
    // Across segments: once a segment has an acknowledged record, the one its log wrote
    // before it was durable up to the end its header names (ADR 0016).
    for (prev, _) in claims.into_iter().filter(|(_, acked)| *acked) {
        let Some(Some((open_seq, end))) = chain_ends.get(prev.segment as usize).copied() else {
            continue;
        };
        let known = out.damaged.iter().any(|d| d.segment == prev.segment);
        // A claim on a block boundary may be a padded batch end (a checkpoint's clean tail):
        // the chain then only has to reach that block.
        let reach = if prev.end.is_multiple_of(block as u32) {
            end.div_ceil(block as u32) * block as u32
        } else {
            end
        };
        if open_seq == prev.open_seq && reach < prev.end && !known {
            out.damaged.push(Damage {
                region,
                segment: prev.segment,
                offset: end,
            });
            if let Some(at) = unclaimed.iter().position(|(s, _)| *s == prev.segment) {
                out.past_damage.extend(unclaimed.swap_remove(at).1);
            }
        }
    }
    Ok(out)
}

/// Where the verified chain (crc `chain`) of a segment use tagged `tag` ends at `end`, the
/// next record of the same use that can be verified, with the seed it chains after. With `bad`
/// the place after `end` (past batch padding) where the chain broke, that is either a record
/// after `bad` chained after the stored crc of the record at `bad` or after the crc that record
/// would have were only its crc field damaged, or the record after any record at or after
/// `bad` (whose own predecessor may be lost) chained after that record's stored crc.
/// Candidates are 8-byte aligned places holding the record magic; ones stamped with another
/// tag (left from an earlier use of the segment) are skipped before any crc is computed.
fn resync(buf: &[u8], end: usize, chain: u32, tag: u16, block: usize) -> Option<(usize, u32)> {
    let past_padding = |pos: usize| {
        if !pos.is_multiple_of(block) && pos + 4 <= buf.len() && le32(buf, pos) == 0 {
            pos.div_ceil(block) * block
        } else {
            pos
        }
    };
    let ours = |pos: usize| {
        pos + HEADER_LEN <= buf.len()
            && le32(buf, pos) == RECORD_MAGIC
            && Stamp::peek(&buf[pos..]).is_some_and(|st| st.tag == tag)
    };
    let bad = past_padding(end);
    if bad + HEADER_LEN > buf.len() {
        return None;
    }
    let seeds = [Some(le32(buf, bad + 4)), recompute_crc(&buf[bad..], chain)];
    let mut q = bad;
    while q + HEADER_LEN <= buf.len() {
        if q > bad && ours(q) {
            for seed in seeds.iter().flatten() {
                if decode(&buf[q..], *seed).is_some() {
                    return Some((q, *seed));
                }
            }
        }
        if le32(buf, q) == RECORD_MAGIC || q == bad {
            let key_len = usize::from(u16::from_le_bytes([buf[q + 10], buf[q + 11]]));
            let next = past_padding(q + encoded_len(key_len, le32(buf, q + 12) as usize));
            let seed = le32(buf, q + 4);
            if next > q && ours(next) && decode(&buf[next..], seed).is_some() {
                return Some((next, seed));
            }
        }
        q += 8;
    }
    None
}

/// Scan every region, one thread per region.
pub fn scan_all<D: BlockDevice>(dev: &D, sb: &Superblock) -> Result<Vec<RegionScan>, DurableError> {
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..sb.geometry.regions)
            .map(|r| s.spawn(move || scan_region(dev, sb, r)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or(Err(DurableError::CorruptSuperblock(
                    "recovery thread panicked",
                )))
            })
            .collect()
    })
}
