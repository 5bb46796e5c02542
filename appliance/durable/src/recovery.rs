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
use crate::crypt::Crypt;
use crate::device::BlockDevice;
use crate::error::DurableError;
use crate::index::Loc;
use crate::record::{
    claimed_len, decode, is_magic, recompute_crc, scan, RecordMeta, RecordView, Stamp, HEADER_LEN,
};
use crate::region::SegState;
use crate::segment::{PrevSegment, SegmentHeader};
use crate::superblock::{le32, Superblock};
use crate::units::{seg_u32, usize_from};

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

/// Scan one region: each segment's passes ([`scan_segment`]), then the claims segment
/// headers make on the segment written before them ([`judge_claims`]).
pub fn scan_region<D: BlockDevice + ?Sized>(
    dev: &D,
    sb: &Superblock,
    region: u32,
    crypt: Option<&Crypt>,
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
    let mut claims = Claims {
        chain_ends: vec![None; g.segments_per_region as usize],
        made: Vec::new(),
        unclaimed: Vec::new(),
    };
    let mut buf = vec![0u8; usize_from(g.segment_size)];
    for seg in 0..g.segments_per_region {
        let Some((h, seed)) = read_segment(dev, sb, region, seg, &mut buf)? else {
            out.states.push((SegState::Free, 0));
            continue;
        };
        out.states.push((SegState::Sealed, h.open_seq));
        out.next_open_seq = out.next_open_seq.max(h.open_seq + 1);
        let at = SegmentUse {
            region,
            segment: seg,
            tag: h.tag(),
            block,
            crypt,
        };
        scan_segment(&buf, at, &h, seed, &mut out, &mut claims);
    }
    judge_claims(&mut out, claims, region, block);
    debug_assert_eq!(out.states.len(), g.segments_per_region as usize);
    debug_assert!(out
        .states
        .iter()
        .all(|&(_, open_seq)| open_seq < out.next_open_seq));
    debug_assert!(out
        .records
        .iter()
        .chain(&out.past_damage)
        .all(|r| r.loc.region == region
            && u64::from(r.loc.offset) + u64::from(r.loc.len) <= g.segment_size));
    debug_assert!(out
        .damaged
        .iter()
        .all(|d| d.region == region && d.segment < g.segments_per_region));
    Ok(out)
}

/// One use of one segment being scanned: where it is and the tag its records carry.
#[derive(Debug, Clone, Copy)]
struct SegmentUse<'c> {
    region: u32,
    segment: u32,
    tag: u16,
    block: usize,
    /// The open's sealing state on a device with a data key: records must verify under it.
    crypt: Option<&'c Crypt>,
}

impl SegmentUse<'_> {
    /// The record `r` found at `pos`, chained after `seed`.
    fn record(self, pos: usize, r: &RecordView<'_>, seed: u32) -> ScannedRecord {
        ScannedRecord {
            key: (*r.key).into(),
            meta: r.meta,
            loc: Loc {
                region: self.region,
                segment: self.segment,
                offset: seg_u32(pos),
                len: seg_u32(r.len),
            },
            value_len: seg_u32(r.value.len()),
            seed,
        }
    }

    /// A stamp of this use that claims some of the segment durable.
    fn acknowledges(self, st: Stamp) -> bool {
        st.tag == self.tag && st.durable > 0
    }
}

/// What the segment headers of a region say about the segments written before them, kept
/// until every segment was scanned.
struct Claims {
    /// Per segment: (open_seq, end of the verified chain from its header) when in use.
    chain_ends: Vec<Option<(u64, u32)>>,
    /// Headers naming the segment written before them, and whether their own segment has an
    /// acknowledged record (a stamp claiming some of it durable).
    made: Vec<(PrevSegment, bool)>,
    /// Verified records past a break with no verdict yet, per segment (for salvage).
    unclaimed: Vec<(u32, Vec<ScannedRecord>)>,
}

/// Reads segment `seg` of `region` into `buf`: its header and the crc its first record
/// chains after, or `None` for a segment not in use (no header of this device, region and
/// segment). Only a segment in use is read past its header block.
fn read_segment<D: BlockDevice + ?Sized>(
    dev: &D,
    sb: &Superblock,
    region: u32,
    seg: u32,
    buf: &mut [u8],
) -> Result<Option<(SegmentHeader, u32)>, DurableError> {
    let g = &sb.geometry;
    let block = g.block_size as usize;
    debug_assert_eq!(buf.len(), usize_from(g.segment_size));
    let off = g.segment_offset(region, seg);
    dev.read_at(off, &mut buf[..block])
        .map_err(|e| DurableError::io(off, &e))?;
    let header = SegmentHeader::decode(&buf[..block])
        .filter(|(h, _)| h.uuid == sb.uuid && h.region == region && h.segment == seg);
    if header.is_some() {
        dev.read_at(off + block as u64, &mut buf[block..])
            .map_err(|e| DurableError::io(off, &e))?;
    }
    Ok(header)
}

/// The passes over one segment in use: follow its chain from the header (pass 1), search
/// past each break for more of the same use (pass 2), and judge each break (pass 3): damage
/// when a later stamp says the segment was durable past it, a torn tail otherwise.
fn scan_segment(
    buf: &[u8],
    at: SegmentUse<'_>,
    h: &SegmentHeader,
    seed: u32,
    out: &mut RegionScan,
    claims: &mut Claims,
) {
    let first_record = out.records.len();
    let (end, chain, mut acked) = follow_chain(buf, at, seed, &mut out.records);
    claims.chain_ends[at.segment as usize] = Some((h.open_seq, seg_u32(end)));
    if out.newest.is_none_or(|(_, o, _)| o < h.open_seq) {
        out.newest = Some((at.segment, h.open_seq, seg_u32(end)));
    }
    debug_assert!(out.records[first_record..]
        .windows(2)
        .all(|w| w[0].loc.offset + w[0].loc.len <= w[1].loc.offset));
    let (breaks, later) = search_past_breaks(buf, at, end, chain);
    let damaged = damaged_breaks(&breaks, &later, at.tag);
    acked |= later.iter().any(|(_, st, _)| at.acknowledges(*st));
    if let Some(prev) = h.prev {
        claims.made.push((prev, acked));
    }
    if let Some(&first) = damaged.first() {
        out.damaged.extend(damaged.iter().map(|&b| Damage {
            region: at.region,
            segment: at.segment,
            offset: seg_u32(b),
        }));
        out.past_damage.extend(
            later
                .into_iter()
                .filter(|(pos, ..)| *pos > first)
                .map(|(.., r)| r),
        );
    } else if !later.is_empty() {
        let later = later.into_iter().map(|(.., r)| r).collect();
        claims.unclaimed.push((at.segment, later));
    }
}

/// Pass 1: the verified chain from the segment header (records appended to `records`).
/// Returns where it ends, the crc to chain after, and whether a record of it is acknowledged.
fn follow_chain(
    buf: &[u8],
    at: SegmentUse<'_>,
    seed: u32,
    records: &mut Vec<ScannedRecord>,
) -> (usize, u32, bool) {
    let mut prev = seed;
    let mut acked = false;
    let (end, chain) = scan(buf, at.block, seed, at.block, at.crypt, |pos, r| {
        acked |= at.acknowledges(r.stamp);
        records.push(at.record(pos, r, prev));
        prev = r.crc;
    });
    // Segment boundary: the chain starts after the header block and ends inside the segment.
    debug_assert!(end >= at.block && end <= buf.len() && end.is_multiple_of(8));
    debug_assert_eq!(chain, prev);
    (end, chain, acked)
}

/// A verified record found past a break of the chain: its offset, stamp and record.
type Later = (usize, Stamp, ScannedRecord);

/// Pass 2: past the end of the chain, more records of the same segment use, each run found
/// by [`resync`]. Returns the places where the chain broke (ascending) and the records found
/// after them.
fn search_past_breaks(
    buf: &[u8],
    at: SegmentUse<'_>,
    mut end: usize,
    mut chain: u32,
) -> (Vec<usize>, Vec<Later>) {
    let mut later: Vec<Later> = Vec::new();
    let mut breaks = Vec::new();
    while let Some((q, seed)) = resync(buf, end, chain, at) {
        debug_assert!(
            q > end && q.is_multiple_of(8),
            "resync went back: {q} <= {end}"
        );
        breaks.push(end);
        let mut prev = seed;
        let (e, c) = scan(buf, q, seed, at.block, at.crypt, |pos, r| {
            later.push((pos, r.stamp, at.record(pos, r, prev)));
            prev = r.crc;
        });
        debug_assert!(e > q, "resync found a record that scan does not decode");
        (end, chain) = (e, c);
    }
    debug_assert!(breaks.windows(2).all(|w| w[0] < w[1]));
    (breaks, later)
}

/// Pass 3: the breaks that lie in acknowledged history, that is, a record found after one
/// carries a stamp of this use saying the segment was durable past it (ADR 0016).
fn damaged_breaks(breaks: &[usize], later: &[Later], tag: u16) -> Vec<usize> {
    let damaged: Vec<usize> = breaks
        .iter()
        .copied()
        .filter(|&b| {
            later
                .iter()
                .any(|(pos, st, _)| *pos > b && st.tag == tag && st.durable as usize > b)
        })
        .collect();
    debug_assert!(damaged.iter().all(|b| breaks.contains(b)));
    damaged
}

/// Pass 4, across segments: once a segment has an acknowledged record, the one its log wrote
/// before it was durable up to the end its header names (ADR 0016); a chain that ends short
/// of that is damage.
fn judge_claims(out: &mut RegionScan, claims: Claims, region: u32, block: usize) {
    let Claims {
        chain_ends,
        made,
        mut unclaimed,
    } = claims;
    let block = seg_u32(block);
    for (prev, _) in made.into_iter().filter(|(_, acked)| *acked) {
        let Some(Some((open_seq, end))) = chain_ends.get(prev.segment as usize).copied() else {
            continue;
        };
        let known = out.damaged.iter().any(|d| d.segment == prev.segment);
        // A claim on a block boundary may be a padded batch end (a checkpoint's clean tail):
        // the chain then only has to reach that block.
        let reach = if prev.end.is_multiple_of(block) {
            end.div_ceil(block) * block
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
}

/// Where the verified chain (crc `chain`) of a segment use tagged `tag` ends at `end`, the
/// next record of the same use that can be verified, with the seed it chains after. With `bad`
/// the place after `end` (past batch padding) where the chain broke, that is either a record
/// after `bad` chained after the stored crc of the record at `bad` or after the crc that record
/// would have were only its crc field damaged, or the record after any record at or after
/// `bad` (whose own predecessor may be lost) chained after that record's stored crc.
/// Candidates are 8-byte aligned places holding the record magic; ones stamped with another
/// tag (left from an earlier use of the segment) are skipped before any crc is computed.
fn resync(buf: &[u8], end: usize, chain: u32, at: SegmentUse<'_>) -> Option<(usize, u32)> {
    let (tag, block, crypt) = (at.tag, at.block, at.crypt);
    let past_padding = |pos: usize| {
        if !pos.is_multiple_of(block) && pos + 4 <= buf.len() && le32(buf, pos) == 0 {
            pos.div_ceil(block) * block
        } else {
            pos
        }
    };
    let ours = |pos: usize| {
        pos + HEADER_LEN <= buf.len()
            && is_magic(le32(buf, pos))
            && Stamp::peek(&buf[pos..]).is_some_and(|st| st.tag == tag)
    };
    let bad = past_padding(end);
    if bad + HEADER_LEN > buf.len() {
        return None;
    }
    let sealed = crypt.is_some();
    let seeds = [
        Some(le32(buf, bad + 4)),
        recompute_crc(&buf[bad..], chain, sealed),
    ];
    let mut q = bad;
    while q + HEADER_LEN <= buf.len() {
        if q > bad && ours(q) {
            for seed in seeds.iter().flatten() {
                if decode(&buf[q..], *seed, crypt).is_some() {
                    return Some((q, *seed));
                }
            }
        }
        if is_magic(le32(buf, q)) || q == bad {
            let next = past_padding(q.saturating_add(claimed_len(&buf[q..], sealed).unwrap_or(0)));
            let seed = le32(buf, q + 4);
            if next > q && ours(next) && decode(&buf[next..], seed, crypt).is_some() {
                return Some((next, seed));
            }
        }
        q += 8;
    }
    None
}

/// Scan every region, one thread per region.
pub fn scan_all<D: BlockDevice>(
    dev: &D,
    sb: &Superblock,
    crypt: Option<&Crypt>,
) -> Result<Vec<RegionScan>, DurableError> {
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..sb.geometry.regions)
            .map(|r| s.spawn(move || scan_region(dev, sb, r, crypt)))
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
