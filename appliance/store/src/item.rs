//! The byte layout of one item inside a segment: a compact header, the key, the value.
//!
//! Layout (little endian, no padding, so items pack back to back):
//!
//! | offset | size | field |
//! | --- | --- | --- |
//! | 0 | 8 | CAS unique |
//! | 8 | 4 | exptime (store time, 0 = never) |
//! | 12 | 4 | last access (store time) |
//! | 16 | 1 | key length |
//! | 17 | 1 | bits ([`FETCHED`], [`STALE`], ...) |
//! | 18 | 4 | client flags, only when [`HAS_FLAGS`] is set |
//! | 18 or 22 | 1–5 | value length, LEB128 (7 bits a byte, low first; 1 byte below 128) |
//! | then | key length | key |
//! | then | value length | value, absent when [`EXTERNAL`] is set |
//!
//! The fields changed in place (CAS, exptime, last access, bits) are at fixed offsets; the
//! ones after them are written once. Flags are absent when zero because most clients never
//! set them, and the value length takes the bytes it needs; neither changes after the item
//! is written (an append writes a new item), so the header never has to grow in place.
//!
//! An [`EXTERNAL`] item (extstore-like, only with a data device) is a stub: its header
//! keeps the real value length, but no value bytes follow the key; the value lives in the
//! key's own record on the device and is read from there. [`Header::len`] (what the item
//! occupies, what compaction steps over) counts no value bytes for such an item.

/// Bytes of the fixed part of the header.
pub(crate) const HEADER: usize = 18;
/// Bytes of the largest header: client flags and a 5-byte value length (values of 2^28
/// bytes and more).
pub(crate) const HEADER_MAX: usize = HEADER + 4 + VARINT_MAX;
/// Most bytes a LEB128 `u32` takes.
const VARINT_MAX: usize = 5;

/// The item has been read since it was stored.
pub(crate) const FETCHED: u8 = 1;
/// Marked stale by a meta invalidation.
pub(crate) const STALE: u8 = 2;
/// A meta "win" token has been handed out.
pub(crate) const WIN: u8 = 4;
/// Overwritten, deleted, expired or evicted: the bytes are garbage awaiting compaction.
pub(crate) const DEAD: u8 = 8;
/// Read since it was stored or last copied forward: the eviction policy's second-chance bit.
pub(crate) const ACCESSED: u8 = 16;
/// Client flags follow the fixed header.
pub(crate) const HAS_FLAGS: u8 = 32;
/// The value is a large object's manifest (its head; the rest lives on the data device).
pub(crate) const LARGE: u8 = 64;
/// The value bytes are not in RAM, only on the data device (the header's value length is
/// the real length; no value bytes follow the key).
pub(crate) const EXTERNAL: u8 = 128;

const CAS: usize = 0;
const EXPTIME: usize = 8;
const ACCESS: usize = 12;
const KEY_LEN: usize = 16;
const BITS: usize = 17;

/// Total bytes an item with its value in RAM occupies in a segment.
#[cfg(test)]
pub(crate) fn item_len(key_len: usize, value_len: usize, flags: u32) -> usize {
    header_len(flags != 0, value_len) + key_len + value_len
}

/// Bytes of the header of an item with these flags and this value length.
pub(crate) fn header_len(has_flags: bool, value_len: usize) -> usize {
    let flags = if has_flags { 4 } else { 0 };
    HEADER + flags + varint_len(value_len)
}

/// Bytes the LEB128 encoding of `v` takes.
fn varint_len(v: usize) -> usize {
    let bits = (usize::BITS - v.leading_zeros()).max(1) as usize;
    bits.div_ceil(7)
}

/// The decoded header of the item starting at `b[0]`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Header {
    pub cas: u64,
    pub exptime: u32,
    pub last_access: u32,
    pub bits: u8,
    pub flags: u32,
    pub key_len: usize,
    pub value_len: usize,
    /// Offset of the key: the header's length.
    key_start: usize,
}

impl Header {
    /// Decodes the header of the item that starts at `b[0]` (`b` runs to the segment's end).
    pub(crate) fn read(b: &[u8]) -> Header {
        let bits = b[BITS];
        let (flags, mut at) = if bits & HAS_FLAGS != 0 {
            (u32_at(b, HEADER), HEADER + 4)
        } else {
            (0, HEADER)
        };
        let mut value_len = 0usize;
        let mut shift = 0;
        loop {
            let byte = b[at];
            at += 1;
            value_len |= usize::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                break;
            }
            shift += 7;
        }
        Header {
            cas: u64::from_le_bytes(array_at(b, CAS)),
            exptime: u32_at(b, EXPTIME),
            last_access: u32_at(b, ACCESS),
            bits,
            flags,
            key_len: usize::from(b[KEY_LEN]),
            value_len,
            key_start: at,
        }
    }

    pub(crate) fn key_start(&self) -> usize {
        self.key_start
    }

    pub(crate) fn value_start(&self) -> usize {
        self.key_start() + self.key_len
    }

    /// Total bytes of the item in its segment (no value bytes for an [`EXTERNAL`] stub).
    pub(crate) fn len(&self) -> usize {
        if self.bits & EXTERNAL != 0 {
            self.value_start()
        } else {
            self.value_start() + self.value_len
        }
    }

    pub(crate) fn expired(&self, now: u32) -> bool {
        self.exptime != 0 && self.exptime <= now
    }
}

/// The key of the item that starts at `b[0]`, without decoding the rest of its header
/// (what every index probe that matches a tag reads).
pub(crate) fn key(b: &[u8]) -> &[u8] {
    let mut at = if b[BITS] & HAS_FLAGS != 0 {
        HEADER + 4
    } else {
        HEADER
    };
    while b[at] & 0x80 != 0 {
        at += 1;
    }
    at += 1;
    &b[at..at + usize::from(b[KEY_LEN])]
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(array_at(b, at))
}

/// The `N` bytes of `b` from `at` (panics past the end, like indexing).
fn array_at<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&b[at..at + N]);
    a
}

/// What a new item is made of.
pub(crate) struct NewItem<'a> {
    pub key: &'a [u8],
    pub value: &'a [u8],
    pub flags: u32,
    pub exptime: u32,
    pub cas: u64,
    pub now: u32,
    /// The value is a large object's manifest ([`LARGE`]).
    pub large: bool,
    /// Write a stub ([`EXTERNAL`]): the header records `value.len()`, the bytes stay out.
    pub external: bool,
}

impl NewItem<'_> {
    /// Bytes the item will occupy in a segment.
    pub(crate) fn len(&self) -> usize {
        let stored = if self.external { 0 } else { self.value.len() };
        header_len(self.flags != 0, self.value.len()) + self.key.len() + stored
    }
}

/// Writes `item` at the start of `b`, which must hold [`NewItem::len`] bytes.
#[expect(
    clippy::expect_used,
    reason = "Store::put refuses keys over KEY_LEN_MAX (255) and values over item_size_max (< 4 GiB) before any item is written"
)]
pub(crate) fn write(b: &mut [u8], item: &NewItem<'_>) {
    let key_len = u8::try_from(item.key.len()).expect("key length checked by the caller");
    let value_len = u32::try_from(item.value.len()).expect("value length checked by the caller");
    b[CAS..CAS + 8].copy_from_slice(&item.cas.to_le_bytes());
    b[EXPTIME..EXPTIME + 4].copy_from_slice(&item.exptime.to_le_bytes());
    b[ACCESS..ACCESS + 4].copy_from_slice(&item.now.to_le_bytes());
    b[KEY_LEN] = key_len;
    let mut at = HEADER;
    let mut bits = if item.large { LARGE } else { 0 };
    if item.external {
        bits |= EXTERNAL;
    }
    if item.flags != 0 {
        b[BITS] = HAS_FLAGS | bits;
        b[HEADER..HEADER + 4].copy_from_slice(&item.flags.to_le_bytes());
        at += 4;
    } else {
        b[BITS] = bits;
    }
    let mut v = value_len;
    while v >= 0x80 {
        b[at] = (v.to_le_bytes()[0] & 0x7f) | 0x80;
        v >>= 7;
        at += 1;
    }
    b[at] = v.to_le_bytes()[0]; // below 0x80 here
    at += 1;
    b[at..at + item.key.len()].copy_from_slice(item.key);
    at += item.key.len();
    if !item.external {
        b[at..at + item.value.len()].copy_from_slice(item.value);
    }
}

pub(crate) fn set_bits(b: &mut [u8], bits: u8) {
    b[BITS] = bits;
}

pub(crate) fn set_exptime(b: &mut [u8], exptime: u32) {
    b[EXPTIME..EXPTIME + 4].copy_from_slice(&exptime.to_le_bytes());
}

pub(crate) fn set_last_access(b: &mut [u8], now: u32) {
    b[ACCESS..ACCESS + 4].copy_from_slice(&now.to_le_bytes());
}

pub(crate) fn set_cas(b: &mut [u8], cas: u64) {
    b[CAS..CAS + 8].copy_from_slice(&cas.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_with_and_without_flags() {
        for flags in [0u32, 7] {
            let item = NewItem {
                key: b"k1",
                value: b"hello",
                flags,
                exptime: 9,
                cas: 42,
                now: 3,
                large: flags != 0,
                external: false,
            };
            let len = item_len(2, 5, flags);
            let mut b = vec![0xAA; len + 4];
            write(&mut b, &item);
            let h = Header::read(&b);
            assert_eq!(h.len(), len);
            assert_eq!(
                (h.cas, h.exptime, h.last_access, h.flags),
                (42, 9, 3, flags)
            );
            assert_eq!(&b[h.key_start()..h.value_start()], b"k1");
            assert_eq!(&b[h.value_start()..h.len()], b"hello");
            assert!(h.expired(9) && !h.expired(8));
            assert_eq!(h.bits & LARGE != 0, flags != 0);
        }
        assert_eq!(item_len(10, 100, 0), 129, "18 + 1-byte length + 10 + 100");
    }

    #[test]
    fn an_external_stub_keeps_the_length_but_not_the_bytes() {
        let value = vec![7u8; 5000];
        let item = NewItem {
            key: b"key",
            value: &value,
            flags: 9,
            exptime: 0,
            cas: 5,
            now: 1,
            large: false,
            external: true,
        };
        assert_eq!(item.len(), HEADER + 4 + 2 + 3, "flags and a 2-byte length");
        let mut b = vec![0xEE; item.len() + 8];
        write(&mut b, &item);
        let h = Header::read(&b);
        assert_eq!(h.value_len, 5000, "the real length is kept");
        assert_eq!(h.len(), HEADER + 4 + 2 + 3, "no value bytes are stored");
        assert!(h.bits & EXTERNAL != 0 && h.bits & LARGE == 0);
        assert_eq!(h.flags, 9);
        assert_eq!(&b[h.key_start()..h.value_start()], b"key");
        assert!(
            b[h.len()..].iter().all(|&x| x == 0xEE),
            "nothing written past the key"
        );
    }

    /// Writes a stub (no value bytes) with the largest fields and reads it back.
    fn stub_round_trip(key_len: usize, value_len: usize, flags: u32, cas: u64) {
        let key = vec![b'k'; key_len];
        // Zeroed and never touched: a stub copies no value bytes.
        let value = vec![0u8; value_len];
        let item = NewItem {
            key: &key,
            value: &value,
            flags,
            exptime: u32::MAX,
            cas,
            now: u32::MAX,
            large: false,
            external: true,
        };
        let len = item.len();
        assert_eq!(len, header_len(flags != 0, value_len) + key_len);
        let mut b = vec![0x5A; len + 1];
        write(&mut b, &item);
        let h = Header::read(&b);
        assert_eq!(
            (
                h.value_len,
                h.key_len,
                h.flags,
                h.cas,
                h.exptime,
                h.last_access
            ),
            (value_len, key_len, flags, cas, u32::MAX, u32::MAX),
            "value length {value_len}"
        );
        assert_eq!(h.len(), len);
        assert_eq!(&b[h.key_start()..h.value_start()], &key[..]);
        assert_eq!(super::key(&b), &key[..]);
        assert_eq!(b[len], 0x5A, "nothing written past the item");
    }

    #[test]
    fn value_lengths_at_every_varint_boundary_round_trip() {
        let cases = [
            (0, 1),
            (127, 1),
            (128, 2),
            ((1 << 14) - 1, 2),
            (1 << 14, 3),
            ((1 << 21) - 1, 3),
            (1 << 21, 4),
            ((1 << 28) - 1, 4),
            (1 << 28, 5),
            (crate::ITEM_SIZE_MAX_LIMIT, 5),
        ];
        for (value_len, bytes) in cases {
            assert_eq!(varint_len(value_len), bytes, "{value_len}");
            assert_eq!(header_len(false, value_len), HEADER + bytes);
            stub_round_trip(crate::KEY_LEN_MAX, value_len, u32::MAX, u64::MAX);
            stub_round_trip(1, value_len, 0, 0);
        }
        assert_eq!(
            header_len(true, crate::ITEM_SIZE_MAX_LIMIT),
            HEADER_MAX,
            "the largest header is what segments are sized for"
        );
    }

    #[test]
    fn in_place_setters_leave_the_variable_fields_alone() {
        let value = [3u8; 300];
        let item = NewItem {
            key: &[b'q'; 250],
            value: &value,
            flags: 1,
            exptime: 5,
            cas: u64::MAX - 1,
            now: 2,
            large: false,
            external: false,
        };
        let mut b = vec![0; item.len()];
        write(&mut b, &item);
        set_cas(&mut b, u64::MAX);
        set_exptime(&mut b, u32::MAX);
        set_last_access(&mut b, 7);
        set_bits(&mut b, HAS_FLAGS | FETCHED | DEAD);
        let h = Header::read(&b);
        assert_eq!((h.cas, h.exptime, h.last_access), (u64::MAX, u32::MAX, 7));
        assert_eq!((h.flags, h.key_len, h.value_len), (1, 250, 300));
        assert_eq!(&b[h.key_start()..h.value_start()], &[b'q'; 250][..]);
        assert_eq!(&b[h.value_start()..h.len()], &value[..]);
        assert_eq!(h.len(), HEADER + 4 + 2 + 250 + 300);
    }
}
