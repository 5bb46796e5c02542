//! Large objects on the data device: an object's bytes are stored as chunk records under
//! internal keys ([`chunk_key`]), and its user key holds a small manifest record
//! ([`crate::RecordKind::Manifest`], value = an encoded [`Manifest`]).
//!
//! Chunk keys start with a 0x00 byte, which no client key can (memcache and HTTP refuse
//! control characters; [`crate::FLUSH_KEY`] is the empty key), so they never collide.
//!
//! Manifest encoding (little endian): `0 magic "RSLO" | 4 version u8 (1) | 5 zero [3] |
//! 8 object u64 | 16 len u64 | 24 chunk_len u32 | 28 head_len u32 | 32 head`.
//!
//! Chunk record value: a piece table, one crc32c (u32 LE) per [`PIECE_LEN`] of the chunk's
//! data (the last piece may be shorter), then the data. The record's chained crc covers it
//! all (recovery and whole-chunk reads rely on that); the table lets a range read fetch and
//! verify only the pieces it covers.
use crate::record::{RecordKind, RecordMeta, HEADER_LEN, RECORD_MAGIC};
use crate::superblock::{le32, le64};
use crate::units::seg_u32;

/// Length of a chunk key.
pub const CHUNK_KEY_LEN: usize = 14;
/// Most bytes of an object's head a manifest carries (kept in RAM with the key).
pub const MANIFEST_HEAD_MAX: usize = 4096;
/// Manifest magic.
pub const MANIFEST_MAGIC: &[u8; 4] = b"RSLO";
/// Manifest encoding version.
pub const MANIFEST_VERSION: u8 = 1;
/// Bytes of an encoded manifest before its head.
pub const MANIFEST_FIXED_LEN: usize = 32;

/// Bytes of chunk data one piece-table entry covers.
pub const PIECE_LEN: usize = 64 * 1024;

/// Bytes of the piece table in front of `data_len` bytes of chunk data.
pub fn piece_table_len(data_len: usize) -> usize {
    data_len.div_ceil(PIECE_LEN) * 4
}

/// A chunk record's value for `data`: the piece table, then the data.
pub fn encode_chunk_value(data: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(piece_table_len(data.len()) + data.len());
    for piece in data.chunks(PIECE_LEN) {
        v.extend_from_slice(&crc32c::crc32c(piece).to_le_bytes());
    }
    v.extend_from_slice(data);
    v
}

/// The data length of a chunk record whose value is `value_len` bytes long; `None` when no
/// data length gives that value length (the record is not a chunk of this layout).
pub fn chunk_data_len(value_len: usize) -> Option<usize> {
    // d + 4 * ceil(d / P) == value_len has at most one solution, ceil(value_len / (P + 4)) pieces.
    let pieces = value_len.div_ceil(PIECE_LEN + 4);
    let data_len = value_len.checked_sub(pieces * 4)?;
    (data_len.div_ceil(PIECE_LEN) == pieces).then_some(data_len)
}

/// The data of a chunk record's value (the table stripped); `None` if its length is
/// inconsistent. The record crc, checked when it was read, covers table and data.
pub fn chunk_data(value: &[u8]) -> Option<&[u8]> {
    let data_len = chunk_data_len(value.len())?;
    value.get(value.len() - data_len..)
}

/// True when `head`, the first bytes of a record read alone (at least its header and key),
/// is a value record of `key` with exactly `meta` and a value of `value_len` bytes: what the
/// index says the record at that place must be. Without the record crc (the range read does
/// not read the whole record), these fields are what tells a stale or reused place apart;
/// `meta.seq` is unique to one write.
pub(crate) fn chunk_header_matches(
    head: &[u8],
    key: &[u8; CHUNK_KEY_LEN],
    meta: &RecordMeta,
    value_len: usize,
) -> bool {
    head.len() >= HEADER_LEN + CHUNK_KEY_LEN
        && meta.kind == RecordKind::Value
        && le32(head, 0) == RECORD_MAGIC
        && head[8] == RecordKind::Value.byte()
        && u16::from_le_bytes([head[10], head[11]]) as usize == CHUNK_KEY_LEN
        && le32(head, 12) as usize == value_len
        && le32(head, 16) == meta.flags
        && le64(head, 24) == meta.exptime
        && le64(head, 32) == meta.cas
        && le64(head, 40) == meta.seq
        && head[HEADER_LEN..HEADER_LEN + CHUNK_KEY_LEN] == key[..]
}

/// The internal key of chunk `index` of object `object`:
/// `[0x00, b'C', object big endian (8), index big endian (4)]`.
pub fn chunk_key(object: u64, index: u32) -> [u8; CHUNK_KEY_LEN] {
    let mut k = [0u8; CHUNK_KEY_LEN];
    k[1] = b'C';
    k[2..10].copy_from_slice(&object.to_be_bytes());
    k[10..14].copy_from_slice(&index.to_be_bytes());
    k
}

/// `(object, index)` when `key` is a chunk key.
pub fn parse_chunk_key(key: &[u8]) -> Option<(u64, u32)> {
    if key.len() != CHUNK_KEY_LEN || key[0] != 0 || key[1] != b'C' {
        return None;
    }
    let object = u64::from_be_bytes(key[2..10].try_into().ok()?);
    let index = u32::from_be_bytes(key[10..14].try_into().ok()?);
    Some((object, index))
}

/// What a large object's user key holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    /// Object id (from [`crate::Serving::next_object_id`]); its chunks are under
    /// [`chunk_key`]`(object, 0..chunks())`.
    pub object: u64,
    /// Object length in bytes.
    pub len: u64,
    /// Bytes per chunk (the last chunk may be shorter).
    pub chunk_len: u32,
    /// The first `min(len, MANIFEST_HEAD_MAX)` bytes of the object (or fewer), kept in RAM.
    pub head: Vec<u8>,
}

impl Manifest {
    /// The encoded manifest (a manifest record's value).
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(MANIFEST_FIXED_LEN + self.head.len());
        b.extend_from_slice(MANIFEST_MAGIC);
        b.push(MANIFEST_VERSION);
        b.extend_from_slice(&[0; 3]);
        b.extend_from_slice(&self.object.to_le_bytes());
        b.extend_from_slice(&self.len.to_le_bytes());
        b.extend_from_slice(&self.chunk_len.to_le_bytes());
        b.extend_from_slice(&(seg_u32(self.head.len())).to_le_bytes());
        b.extend_from_slice(&self.head);
        b
    }

    /// Decode a manifest; `None` for anything malformed or inconsistent (wrong magic or
    /// version, trailing or missing bytes, `chunk_len == 0`, a head longer than the object or
    /// than [`MANIFEST_HEAD_MAX`], more than `u32::MAX` chunks). Never panics.
    pub fn decode(b: &[u8]) -> Option<Manifest> {
        if b.len() < MANIFEST_FIXED_LEN
            || &b[0..4] != MANIFEST_MAGIC
            || b[4] != MANIFEST_VERSION
            || b[5..8] != [0; 3]
        {
            return None;
        }
        let object = le64(b, 8);
        let len = le64(b, 16);
        let chunk_len = le32(b, 24);
        let head_len = le32(b, 28) as usize;
        if chunk_len == 0
            || head_len > MANIFEST_HEAD_MAX
            || head_len as u64 > len
            || b.len() != MANIFEST_FIXED_LEN + head_len
            || len.div_ceil(u64::from(chunk_len)) > u64::from(u32::MAX)
        {
            return None;
        }
        Some(Manifest {
            object,
            len,
            chunk_len,
            head: b[MANIFEST_FIXED_LEN..].to_vec(),
        })
    }

    /// Number of chunks: `ceil(len / chunk_len)` (0 for an empty object).
    pub fn chunks(&self) -> u32 {
        if self.chunk_len == 0 {
            return 0;
        }
        u32::try_from(self.len.div_ceil(u64::from(self.chunk_len))).unwrap_or(u32::MAX)
    }

    /// Byte range `[start, end)` of chunk `index` within the object (empty past the end).
    pub fn chunk_range(&self, index: u32) -> (u64, u64) {
        let start = (u64::from(index) * u64::from(self.chunk_len)).min(self.len);
        let end = (start + u64::from(self.chunk_len)).min(self.len);
        (start, end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> Manifest {
        Manifest {
            object: 0x0102_0304_0506_0708,
            len: 10_000,
            chunk_len: 4096,
            head: vec![7; 100],
        }
    }

    #[test]
    fn chunk_values_carry_a_crc_per_piece_and_strip_back_to_the_data() {
        for len in [
            0,
            1,
            4096,
            PIECE_LEN - 1,
            PIECE_LEN,
            PIECE_LEN + 1,
            (1 << 20) - 4096,
            1 << 20,
        ] {
            let data: Vec<u8> = (0..len)
                .map(|i| (i * 13 + i / 7).to_le_bytes()[0])
                .collect();
            let v = encode_chunk_value(&data);
            let pieces = len.div_ceil(PIECE_LEN);
            assert_eq!(piece_table_len(len), pieces * 4);
            assert_eq!(v.len(), pieces * 4 + len, "len {len}");
            assert_eq!(chunk_data_len(v.len()), Some(len), "len {len}");
            assert_eq!(chunk_data(&v), Some(&data[..]));
            for (i, piece) in data.chunks(PIECE_LEN).enumerate() {
                assert_eq!(
                    le32(&v, 4 * i),
                    crc32c::crc32c(piece),
                    "len {len} piece {i}"
                );
            }
        }
        // Value lengths no data length produces.
        for bad in [1, 2, 3, 4, PIECE_LEN + 4 + 1, PIECE_LEN + 4 + 4] {
            assert_eq!(chunk_data_len(bad), None, "value length {bad}");
            assert_eq!(chunk_data(&vec![0; bad]), None);
        }
    }

    proptest! {
        #[test]
        fn chunk_data_len_inverts_the_table(len in 0usize..3_000_000) {
            prop_assert_eq!(chunk_data_len(len + piece_table_len(len)), Some(len));
        }
    }

    #[test]
    fn chunk_keys_roundtrip_and_never_look_like_client_keys() {
        let k = chunk_key(0xABCD, 7);
        assert_eq!(k.len(), CHUNK_KEY_LEN);
        assert_eq!(&k[..2], &[0, b'C']);
        assert_eq!(&k[2..10], &0xABCDu64.to_be_bytes());
        assert_eq!(&k[10..], &7u32.to_be_bytes());
        assert_eq!(parse_chunk_key(&k), Some((0xABCD, 7)));
        assert_eq!(parse_chunk_key(b""), None);
        assert_eq!(parse_chunk_key(b"abcdefghijklmn"), None);
        assert_eq!(parse_chunk_key(&k[..13]), None);
        let mut other = k;
        other[1] = b'D';
        assert_eq!(parse_chunk_key(&other), None);
        // Big-endian ids keep an object's chunks adjacent in key order.
        assert!(chunk_key(1, 2) < chunk_key(1, 3) && chunk_key(1, u32::MAX) < chunk_key(2, 0));
    }

    #[test]
    fn manifest_roundtrip() {
        let m = sample();
        let b = m.encode();
        assert_eq!(b.len(), MANIFEST_FIXED_LEN + 100);
        assert_eq!(&b[..4], b"RSLO");
        assert_eq!(Manifest::decode(&b), Some(m));
        let empty = Manifest {
            object: 1,
            len: 0,
            chunk_len: 4096,
            head: Vec::new(),
        };
        assert_eq!(Manifest::decode(&empty.encode()), Some(empty));
    }

    #[test]
    fn corrupt_manifests_are_refused() {
        let good = sample().encode();
        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("empty", Vec::new()),
            ("truncated header", good[..20].to_vec()),
            ("truncated head", good[..good.len() - 1].to_vec()),
            ("trailing byte", [&good[..], &[0]].concat()),
            ("magic", {
                let mut b = good.clone();
                b[0] = b'X';
                b
            }),
            ("version", {
                let mut b = good.clone();
                b[4] = 2;
                b
            }),
            ("reserved", {
                let mut b = good.clone();
                b[6] = 1;
                b
            }),
            (
                "chunk_len 0",
                Manifest {
                    chunk_len: 0,
                    ..sample()
                }
                .encode(),
            ),
            (
                "head longer than len",
                Manifest {
                    len: 50,
                    ..sample()
                }
                .encode(),
            ),
            (
                "head over the limit",
                Manifest {
                    len: 100_000,
                    head: vec![0; MANIFEST_HEAD_MAX + 1],
                    ..sample()
                }
                .encode(),
            ),
            (
                "too many chunks",
                Manifest {
                    len: u64::MAX,
                    chunk_len: 1,
                    ..sample()
                }
                .encode(),
            ),
        ];
        for (what, b) in cases {
            assert_eq!(Manifest::decode(&b), None, "{what} accepted");
        }
    }

    #[test]
    fn chunk_math_covers_the_object_exactly() {
        let m = sample(); // 10_000 bytes in 4096-byte chunks: 4096, 4096, 1808
        assert_eq!(m.chunks(), 3);
        assert_eq!(m.chunk_range(0), (0, 4096));
        assert_eq!(m.chunk_range(1), (4096, 8192));
        assert_eq!(m.chunk_range(2), (8192, 10_000));
        assert_eq!(m.chunk_range(3), (10_000, 10_000));
        let exact = Manifest {
            len: 8192,
            ..sample()
        };
        assert_eq!(exact.chunks(), 2);
        assert_eq!(exact.chunk_range(1), (4096, 8192));
        let empty = Manifest {
            len: 0,
            head: Vec::new(),
            ..sample()
        };
        assert_eq!(empty.chunks(), 0);
        let huge = Manifest {
            len: 1 << 30,
            chunk_len: 1 << 20,
            ..sample()
        };
        assert_eq!(huge.chunks(), 1024);
        assert_eq!(huge.chunk_range(1023), ((1 << 30) - (1 << 20), 1 << 30));
    }

    proptest! {
        #[test]
        fn chunks_tile_the_object(len in 0u64..1_000_000, chunk_len in 1u32..70_000,
                                  head_len in 0usize..200, object: u64) {
            let head_len = head_len.min(usize::try_from(len).unwrap());
            let m = Manifest { object, len, chunk_len, head: vec![1; head_len] };
            prop_assert_eq!(Manifest::decode(&m.encode()), Some(m.clone()));
            let mut at = 0;
            for i in 0..m.chunks() {
                let (s, e) = m.chunk_range(i);
                prop_assert_eq!(s, at);
                prop_assert!(e > s && e - s <= u64::from(chunk_len));
                at = e;
            }
            prop_assert_eq!(at, len);
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            if let Some(m) = Manifest::decode(&bytes) {
                prop_assert!(m.chunk_len > 0 && m.head.len() as u64 <= m.len);
                prop_assert_eq!(m.encode(), bytes);
            }
        }
    }
}
