//! The clean-shutdown checkpoint: an index snapshot plus every region's segment table and log
//! tail, so the next start reads one area instead of every segment.
//!
//! Published atomically: the body is written and flushed first, then the header that names its
//! length and crc is written and flushed. On open a valid checkpoint is loaded and its header is
//! erased (and flushed) before any new write, so a later crash never trusts a stale snapshot.
//!
//! Header (first block of the checkpoint area): `0 magic "RSCKPT01" | 8 uuid [16] |
//! 24 body_len u64 | 32 body crc32c u32 | 36 header crc32c u32 (over 0..36)`. Body at +4096.
use crate::index::{Entry, Loc};
use crate::record::{RecordKind, RecordMeta};
use crate::region::SegState;
use crate::superblock::{le32, le64};
use crate::units::{count_u32, key_len_u16};

/// Checkpoint header magic.
pub const CHECKPOINT_MAGIC: &[u8; 8] = b"RSCKPT01";
/// Offset of the body within the checkpoint area.
pub const BODY_OFFSET: u64 = 4096;

/// One region's state in a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionState {
    /// Next open sequence.
    pub next_open_seq: u64,
    /// Active segment, bytes used in it and the chain crc, if one was open.
    pub tail: Option<(u32, u64, u32)>,
    /// Per segment: state and open sequence.
    pub segments: Vec<(SegState, u64)>,
}

/// A decoded checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    /// Regions in order.
    pub regions: Vec<RegionState>,
    /// Highest sequence issued.
    pub max_seq: u64,
    /// Highest CAS issued.
    pub max_cas: u64,
    /// Index entries.
    pub entries: Vec<(Box<[u8]>, Entry)>,
}

/// Encode the body.
pub fn encode_body<'a>(
    regions: &[RegionState],
    max_seq: u64,
    max_cas: u64,
    entries: impl ExactSizeIterator<Item = (&'a [u8], &'a Entry)>,
) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&count_u32(regions.len()).to_le_bytes());
    for r in regions {
        b.extend_from_slice(&r.next_open_seq.to_le_bytes());
        let (seg, used, chain) = r.tail.unwrap_or((u32::MAX, 0, 0));
        b.extend_from_slice(&seg.to_le_bytes());
        b.extend_from_slice(&used.to_le_bytes());
        b.extend_from_slice(&chain.to_le_bytes());
        b.extend_from_slice(&count_u32(r.segments.len()).to_le_bytes());
        for (state, open_seq) in &r.segments {
            b.push(match state {
                SegState::Free => 0,
                SegState::Sealed => 1,
                SegState::Active => 2,
            });
            b.extend_from_slice(&open_seq.to_le_bytes());
        }
    }
    b.extend_from_slice(&max_seq.to_le_bytes());
    b.extend_from_slice(&max_cas.to_le_bytes());
    b.extend_from_slice(&(entries.len() as u64).to_le_bytes());
    for (key, e) in entries {
        b.extend_from_slice(&key_len_u16(key.len()).to_le_bytes());
        b.extend_from_slice(key);
        b.push(match e.meta.kind {
            RecordKind::Value => 0,
            RecordKind::Tombstone => 1,
            RecordKind::Manifest => 3,
        });
        for v in [
            e.meta.flags,
            e.loc.region,
            e.loc.segment,
            e.loc.offset,
            e.loc.len,
            e.value_len,
            e.seed,
            e.older,
        ] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        for v in [e.meta.exptime, e.meta.cas, e.meta.seq] {
            b.extend_from_slice(&v.to_le_bytes());
        }
    }
    b
}

/// Encode the header for a body.
pub fn encode_header(uuid: &[u8; 16], body: &[u8], block: usize) -> Vec<u8> {
    let mut h = vec![0u8; block];
    h[0..8].copy_from_slice(CHECKPOINT_MAGIC);
    h[8..24].copy_from_slice(uuid);
    h[24..32].copy_from_slice(&(body.len() as u64).to_le_bytes());
    h[32..36].copy_from_slice(&crc32c::crc32c(body).to_le_bytes());
    let crc = crc32c::crc32c(&h[..36]);
    h[36..40].copy_from_slice(&crc.to_le_bytes());
    h
}

/// Decode a header: `(body_len, body_crc)` when it is valid for this device.
pub fn decode_header(h: &[u8], uuid: &[u8; 16]) -> Option<(u64, u32)> {
    if h.len() < 40 || &h[0..8] != CHECKPOINT_MAGIC || &h[8..24] != uuid {
        return None;
    }
    if le32(h, 36) != crc32c::crc32c(&h[..36]) {
        return None;
    }
    Some((le64(h, 24), le32(h, 32)))
}

struct Cursor<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.b.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(s)
    }
    fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }
    fn u16(&mut self) -> Option<u16> {
        let s = self.take(2)?;
        Some(u16::from_le_bytes([s[0], s[1]]))
    }
    fn u32(&mut self) -> Option<u32> {
        Some(le32(self.take(4)?, 0))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(le64(self.take(8)?, 0))
    }
}

/// Decode a body (already checked against its crc). `None` if it is malformed; never panics.
pub fn decode_body(b: &[u8], expect_regions: u32, segments_per_region: u32) -> Option<Checkpoint> {
    let mut c = Cursor { b, at: 0 };
    let n = c.u32()?;
    if n != expect_regions {
        return None;
    }
    let mut regions = Vec::new();
    for _ in 0..n {
        let next_open_seq = c.u64()?;
        let seg = c.u32()?;
        let used = c.u64()?;
        let chain = c.u32()?;
        let count = c.u32()?;
        if count != segments_per_region {
            return None;
        }
        let mut segments = Vec::with_capacity(count as usize);
        for _ in 0..count {
            let state = match c.u8()? {
                0 => SegState::Free,
                1 => SegState::Sealed,
                2 => SegState::Active,
                _ => return None,
            };
            segments.push((state, c.u64()?));
        }
        let tail = (seg != u32::MAX).then_some((seg, used, chain));
        if tail.is_some_and(|(s, _, _)| s >= count) {
            return None;
        }
        regions.push(RegionState {
            next_open_seq,
            tail,
            segments,
        });
    }
    let max_seq = c.u64()?;
    let max_cas = c.u64()?;
    let count = c.u64()?;
    let mut entries = Vec::with_capacity(
        usize::try_from(count)
            .unwrap_or(usize::MAX)
            .min(b.len() / 60),
    );
    for _ in 0..count {
        let klen = c.u16()?;
        let key: Box<[u8]> = c.take(usize::from(klen))?.into();
        let kind = match c.u8()? {
            0 => RecordKind::Value,
            1 => RecordKind::Tombstone,
            3 => RecordKind::Manifest,
            _ => return None,
        };
        let mut v = [0u32; 8];
        for x in &mut v {
            *x = c.u32()?;
        }
        let (exptime, cas, seq) = (c.u64()?, c.u64()?, c.u64()?);
        if v[1] >= expect_regions || v[2] >= segments_per_region {
            return None;
        }
        let meta = RecordMeta {
            kind,
            flags: v[0],
            exptime,
            cas,
            seq,
        };
        let loc = Loc {
            region: v[1],
            segment: v[2],
            offset: v[3],
            len: v[4],
        };
        entries.push((
            key,
            Entry {
                meta,
                loc,
                value_len: v[5],
                seed: v[6],
                older: v[7],
            },
        ));
    }
    (c.at == b.len()).then_some(Checkpoint {
        regions,
        max_seq,
        max_cas,
        entries,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn body_roundtrip() {
        let regions = vec![RegionState {
            next_open_seq: 5,
            tail: Some((1, 4096, 77)),
            segments: vec![
                (SegState::Sealed, 1),
                (SegState::Active, 4),
                (SegState::Free, 0),
            ],
        }];
        let e = Entry {
            meta: RecordMeta {
                kind: RecordKind::Value,
                flags: 3,
                exptime: 9,
                cas: 11,
                seq: 12,
            },
            loc: Loc {
                region: 0,
                segment: 1,
                offset: 512,
                len: 64,
            },
            value_len: 5,
            seed: 1234,
            older: 2,
        };
        let mut m = e;
        m.meta.kind = RecordKind::Manifest;
        let mut t = e;
        t.meta.kind = RecordKind::Tombstone;
        let body = encode_body(
            &regions,
            12,
            11,
            [(&b"key"[..], &e), (&b"big"[..], &m), (&b"del"[..], &t)].into_iter(),
        );
        let ck = decode_body(&body, 1, 3).unwrap();
        assert_eq!(ck.regions, regions);
        assert_eq!((ck.max_seq, ck.max_cas), (12, 11));
        assert_eq!(
            ck.entries,
            vec![
                (b"key".to_vec().into_boxed_slice(), e),
                (b"big".to_vec().into_boxed_slice(), m),
                (b"del".to_vec().into_boxed_slice(), t)
            ]
        );
        // An unknown kind byte makes the body invalid (the open falls back to a scan).
        let single = encode_body(&regions, 12, 11, [(&b"key"[..], &e)].into_iter());
        let kind_at = single.len() - (3 + 1 + 32 + 24) + 3;
        assert_eq!(single[kind_at], 0);
        let mut bad = single.clone();
        bad[kind_at] = 2;
        assert!(decode_body(&bad, 1, 3).is_none());
        assert!(decode_body(&body, 2, 3).is_none());
        assert!(decode_body(&body[..body.len() - 1], 1, 3).is_none());
        let h = encode_header(&[1; 16], &body, 512);
        assert_eq!(
            decode_header(&h, &[1; 16]),
            Some((body.len() as u64, crc32c::crc32c(&body)))
        );
        assert_eq!(decode_header(&h, &[2; 16]), None);
    }

    proptest! {
        #[test]
        fn arbitrary_bodies_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode_body(&bytes, 1, 3);
            let _ = decode_header(&bytes, &[0; 16]);
        }
    }
}
