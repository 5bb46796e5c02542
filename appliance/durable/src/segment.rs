//! The segment header: the first block of every segment in use. Erasing it frees the segment.
//!
//! Layout: `0 magic "RSSEGMT1" | 8 device uuid [16] | 24 region u32 | 28 segment u32 |
//! 32 open_seq u64 | 40 crc32c of bytes 0..40`. `open_seq` grows every time a region opens a
//! segment, so records left from an earlier use never chain after the new header's crc.
//!
//! Optional extension (ADR 0016): `48 prev segment u32 | 52 prev end u32 | 56 prev open_seq u64 |
//! 64 crc32c of bytes 48..64 seeded with the header's crc`: the segment the region's log wrote
//! before this one and where its records end (or, after a failed write, how far it was durable).
//! Once any record of this segment is acknowledged, that segment was durable up to there.
use crate::superblock::{le32, le64};

/// Segment header magic.
pub const SEGMENT_MAGIC: &[u8; 8] = b"RSSEGMT1";
const BODY: usize = 40;
const EXT_END: usize = 68;

/// A decoded segment header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentHeader {
    /// Device uuid (a segment from a previous format is not ours).
    pub uuid: [u8; 16],
    /// Owning region.
    pub region: u32,
    /// Index within the region.
    pub segment: u32,
    /// Region-wide order in which segments were opened.
    pub open_seq: u64,
    /// The segment written before this one: (segment, its open sequence, end of its records).
    pub prev: Option<PrevSegment>,
}

/// What a segment header says about the segment its log wrote before it (ADR 0016).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrevSegment {
    /// That segment's index in the region.
    pub segment: u32,
    /// Its open sequence (so a later reuse of the segment is not mistaken for it).
    pub open_seq: u64,
    /// Bytes into it where its records end: durable once this segment has an acknowledged record.
    pub end: u32,
}

impl SegmentHeader {
    /// Encode into one block of `block` bytes; returns the bytes and the crc the first record chains after.
    pub fn encode(&self, block: usize) -> (Vec<u8>, u32) {
        let mut b = vec![0u8; block];
        b[0..8].copy_from_slice(SEGMENT_MAGIC);
        b[8..24].copy_from_slice(&self.uuid);
        b[24..28].copy_from_slice(&self.region.to_le_bytes());
        b[28..32].copy_from_slice(&self.segment.to_le_bytes());
        b[32..40].copy_from_slice(&self.open_seq.to_le_bytes());
        let crc = crc32c::crc32c(&b[..BODY]);
        b[BODY..BODY + 4].copy_from_slice(&crc.to_le_bytes());
        if let (Some(p), true) = (self.prev, block >= EXT_END) {
            b[48..52].copy_from_slice(&p.segment.to_le_bytes());
            b[52..56].copy_from_slice(&p.end.to_le_bytes());
            b[56..64].copy_from_slice(&p.open_seq.to_le_bytes());
            let ext = crc32c::crc32c_append(crc, &b[48..64]);
            b[64..68].copy_from_slice(&ext.to_le_bytes());
        }
        (b, crc)
    }

    /// The tag every record written in this use of the segment carries in its
    /// [`crate::record::Stamp`]: 16 bits of a crc of uuid, region, segment and open sequence,
    /// never 0 (0 marks records from before stamps).
    #[expect(
        clippy::cast_possible_truncation,
        reason = "folds the crc's two halves into 16 bits: dropping the high half is the point"
    )]
    pub fn tag(&self) -> u16 {
        let mut b = [0u8; 32];
        b[..16].copy_from_slice(&self.uuid);
        b[16..20].copy_from_slice(&self.region.to_le_bytes());
        b[20..24].copy_from_slice(&self.segment.to_le_bytes());
        b[24..32].copy_from_slice(&self.open_seq.to_le_bytes());
        let c = crc32c::crc32c(&b);
        match (c ^ (c >> 16)) as u16 {
            0 => 1,
            t => t,
        }
    }

    /// Decode a header; `None` for a free segment or anything damaged. Returns the chain seed too.
    pub fn decode(b: &[u8]) -> Option<(SegmentHeader, u32)> {
        if b.len() < BODY + 4 || &b[0..8] != SEGMENT_MAGIC {
            return None;
        }
        let crc = le32(b, BODY);
        if crc != crc32c::crc32c(&b[..BODY]) {
            return None;
        }
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(&b[8..24]);
        let prev = (b.len() >= EXT_END && crc32c::crc32c_append(crc, &b[48..64]) == le32(b, 64))
            .then(|| PrevSegment {
                segment: le32(b, 48),
                end: le32(b, 52),
                open_seq: le64(b, 56),
            });
        Some((
            SegmentHeader {
                uuid,
                region: le32(b, 24),
                segment: le32(b, 28),
                open_seq: le64(b, 32),
                prev,
            },
            crc,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_roundtrip_and_damage() {
        let h = SegmentHeader {
            uuid: [3; 16],
            region: 1,
            segment: 9,
            open_seq: 77,
            prev: Some(PrevSegment {
                segment: 3,
                open_seq: 76,
                end: 4096,
            }),
        };
        let (mut b, crc) = h.encode(512);
        assert_eq!(b.len(), 512);
        assert_eq!(SegmentHeader::decode(&b), Some((h, crc)));
        let (_, other) = SegmentHeader { open_seq: 78, ..h }.encode(512);
        assert_ne!(crc, other, "reopening a segment changes the chain seed");
        let bare = SegmentHeader { prev: None, ..h };
        let (plain, plain_crc) = bare.encode(512);
        assert_eq!(
            plain_crc, crc,
            "the extension is not part of the chain seed"
        );
        assert_eq!(SegmentHeader::decode(&plain), Some((bare, crc)));
        let mut ext = b.clone();
        ext[53] ^= 1;
        assert_eq!(
            SegmentHeader::decode(&ext),
            Some((bare, crc)),
            "a bad extension is none"
        );
        b[30] ^= 1;
        assert_eq!(SegmentHeader::decode(&b), None);
        assert_eq!(SegmentHeader::decode(&[0; 512]), None);
    }
}
