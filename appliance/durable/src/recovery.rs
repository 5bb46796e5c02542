//! Recovery by scanning: every region's segments are read in parallel (one std thread per
//! region), each segment's crc chain is followed until the first record that does not decode
//! (the torn tail), and the records found are handed to the index, where the highest sequence wins.
use crate::device::BlockDevice;
use crate::error::DurableError;
use crate::index::Loc;
use crate::record::{scan, RecordMeta};
use crate::region::SegState;
use crate::segment::SegmentHeader;
use crate::superblock::Superblock;

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
    /// Every record, in log order per segment.
    pub records: Vec<ScannedRecord>,
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
    };
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
        let records = &mut out.records;
        let mut prev = seed;
        scan(&buf, block, seed, block, |pos, r| {
            records.push(ScannedRecord {
                key: r.key.into(),
                meta: r.meta,
                loc: Loc {
                    region,
                    segment: seg,
                    offset: pos as u32,
                    len: r.len as u32,
                },
                value_len: r.value.len() as u32,
                seed: prev,
            });
            prev = r.crc;
        });
    }
    Ok(out)
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
