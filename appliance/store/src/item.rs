//! The byte layout of one item inside a segment: a compact header, the key, the value.
//!
//! Layout (little endian, no padding, so items pack back to back):
//!
//! | offset | size | field |
//! | --- | --- | --- |
//! | 0 | 8 | CAS unique |
//! | 8 | 4 | exptime (store time, 0 = never) |
//! | 12 | 4 | last access (store time) |
//! | 16 | 4 | value length |
//! | 20 | 1 | key length |
//! | 21 | 1 | bits ([`FETCHED`], [`STALE`], ...) |
//! | 22 | 4 | client flags, only when [`HAS_FLAGS`] is set |
//! | 22 or 26 | key length | key |
//! | then | value length | value, absent when [`EXTERNAL`] is set |
//!
//! Flags are absent when zero because most clients never set them; they never change
//! after the item is written, so the variable header never has to grow in place.
//!
//! An [`EXTERNAL`] item (extstore-like, only with a data device) is a stub: its header
//! keeps the real value length, but no value bytes follow the key; the value lives in the
//! key's own record on the device and is read from there. [`Header::len`] (what the item
//! occupies, what compaction steps over) counts no value bytes for such an item.

/// Bytes of the fixed part of the header.
pub(crate) const HEADER: usize = 22;
/// Bytes of the largest header (with client flags).
pub(crate) const HEADER_MAX: usize = HEADER + 4;

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
const VALUE_LEN: usize = 16;
const KEY_LEN: usize = 20;
const BITS: usize = 21;

/// Total bytes an item with its value in RAM occupies in a segment.
pub(crate) fn item_len(key_len: usize, value_len: usize, flags: u32) -> usize {
    header_len(flags != 0) + key_len + value_len
}

fn header_len(has_flags: bool) -> usize {
    if has_flags {
        HEADER_MAX
    } else {
        HEADER
    }
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
}

impl Header {
    /// Decodes the header of the item that starts at `b[0]` (`b` runs to the segment's end).
    pub(crate) fn read(b: &[u8]) -> Header {
        let bits = b[BITS];
        let flags = if bits & HAS_FLAGS != 0 {
            u32_at(b, HEADER)
        } else {
            0
        };
        Header {
            cas: u64::from_le_bytes(b[CAS..CAS + 8].try_into().expect("8 bytes")),
            exptime: u32_at(b, EXPTIME),
            last_access: u32_at(b, ACCESS),
            bits,
            flags,
            key_len: usize::from(b[KEY_LEN]),
            value_len: u32_at(b, VALUE_LEN) as usize,
        }
    }

    pub(crate) fn key_start(&self) -> usize {
        header_len(self.bits & HAS_FLAGS != 0)
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

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
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
        item_len(self.key.len(), stored, self.flags)
    }
}

/// Writes `item` at the start of `b`, which must hold [`NewItem::len`] bytes.
pub(crate) fn write(b: &mut [u8], item: &NewItem<'_>) {
    let key_len = u8::try_from(item.key.len()).expect("key length checked by the caller");
    let value_len = u32::try_from(item.value.len()).expect("value length checked by the caller");
    b[CAS..CAS + 8].copy_from_slice(&item.cas.to_le_bytes());
    b[EXPTIME..EXPTIME + 4].copy_from_slice(&item.exptime.to_le_bytes());
    b[ACCESS..ACCESS + 4].copy_from_slice(&item.now.to_le_bytes());
    b[VALUE_LEN..VALUE_LEN + 4].copy_from_slice(&value_len.to_le_bytes());
    b[KEY_LEN] = key_len;
    let mut at = HEADER;
    let mut bits = if item.large { LARGE } else { 0 };
    if item.external {
        bits |= EXTERNAL;
    }
    if item.flags != 0 {
        b[BITS] = HAS_FLAGS | bits;
        b[HEADER..HEADER_MAX].copy_from_slice(&item.flags.to_le_bytes());
        at = HEADER_MAX;
    } else {
        b[BITS] = bits;
    }
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
        assert_eq!(item_len(10, 100, 0), 132);
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
        assert_eq!(item.len(), HEADER_MAX + 3);
        let mut b = vec![0xEE; item.len() + 8];
        write(&mut b, &item);
        let h = Header::read(&b);
        assert_eq!(h.value_len, 5000, "the real length is kept");
        assert_eq!(h.len(), HEADER_MAX + 3, "no value bytes are stored");
        assert!(h.bits & EXTERNAL != 0 && h.bits & LARGE == 0);
        assert_eq!(h.flags, 9);
        assert_eq!(&b[h.key_start()..h.value_start()], b"key");
        assert!(
            b[h.len()..].iter().all(|&x| x == 0xEE),
            "nothing written past the key"
        );
    }
}
