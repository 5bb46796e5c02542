//! The byte layout of one item inside a segment: a compact header, the key, the value.
//!
//! Layout (little endian, no padding, so items pack back to back):
//!
//! | offset | size | field |
//! | --- | --- | --- |
//! | 0 | 5 | CAS unique, its low 40 bits |
//! | 5 | 3 | last access (store time modulo 2^24, see [`Header::last_access`]) |
//! | 8 | 1 | key length |
//! | 9 | 1 | bits ([`FETCHED`], [`STALE`], ..., [`EXT`]) |
//! | 10 | 1 | more bits ([`HAS_FLAGS`], [`HAS_EXPTIME`], [`WIDE_CAS`]), only when [`EXT`] is set |
//! | then | 3 | CAS unique, its high 24 bits, only when [`WIDE_CAS`] is set |
//! | then | 4 | exptime (store time), only when [`HAS_EXPTIME`] is set (absent: never expires) |
//! | then | 4 | client flags, only when [`HAS_FLAGS`] is set |
//! | then | 1–5 | value length, LEB128 (7 bits a byte, low first; 1 byte below 128) |
//! | then | key length | key |
//! | then | value length | value, absent when [`EXTERNAL`] is set |
//!
//! An item set without exptime, client flags or a CAS unique of 2^40 and more (the store's
//! counter gets there after 10^12 writes) has an 11-byte header with a value under 128
//! bytes (ADR 0029, amendment 2026-12-03). The fields changed in place (CAS, last access,
//! bits, exptime when present) are at offsets fixed by the bytes before them, which are
//! written once; a change the item has no room for (an exptime on an item without one, a
//! CAS unique over 40 bits on a narrow one) is made by writing the item anew
//! ([`rewritten_len`], [`rewrite`]), like an append. Flags are absent when zero because most
//! clients never set them, and the value length takes the bytes it needs; neither changes
//! after the item is written, so the header never has to grow in place.
//!
//! An [`EXTERNAL`] item (extstore-like, only with a data device) is a stub: its header
//! keeps the real value length, but no value bytes follow the key; the value lives in the
//! key's own record on the device and is read from there. [`Header::len`] (what the item
//! occupies, what compaction steps over) counts no value bytes for such an item.

use crate::Time;

/// Bytes of the fixed part of the header.
pub(crate) const HEADER: usize = 10;
/// Bytes of the largest header: the second bits byte, a wide CAS, an exptime, client flags
/// and a 5-byte value length (values of 2^28 bytes and more).
pub(crate) const HEADER_MAX: usize = HEADER + 1 + 3 + 4 + 4 + VARINT_MAX;
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
/// A second bits byte follows the fixed header (the item has optional fields).
pub(crate) const EXT: u8 = 32;
/// The value is a large object's manifest (its head; the rest lives on the data device).
pub(crate) const LARGE: u8 = 64;
/// The value bytes are not in RAM, only on the data device (the header's value length is
/// the real length; no value bytes follow the key).
pub(crate) const EXTERNAL: u8 = 128;

/// In the second bits byte: client flags follow.
pub(crate) const HAS_FLAGS: u8 = 1;
/// In the second bits byte: an exptime follows.
pub(crate) const HAS_EXPTIME: u8 = 2;
/// In the second bits byte: the CAS unique's high 24 bits follow.
pub(crate) const WIDE_CAS: u8 = 4;

const CAS: usize = 0;
const ACCESS: usize = 5;
const KEY_LEN: usize = 8;
const BITS: usize = 9;
const EXT_BITS: usize = 10;

/// CAS uniques below this fit the narrow (40-bit) field.
const NARROW_CAS_END: u64 = 1 << 40;
/// The last access field keeps store time modulo this.
const ACCESS_MOD: u32 = 1 << 24;
/// A last access up to this many seconds ahead of the reader's clock (another worker's
/// clock a tick ahead) reads as now rather than 2^24 seconds ago.
const ACCESS_AHEAD: u32 = 1 << 16;

/// Total bytes an item with its value in RAM, no exptime and a narrow CAS occupies.
#[cfg(test)]
pub(crate) fn item_len(key_len: usize, value_len: usize, flags: u32) -> usize {
    header_len(flags, 0, 0, value_len) + key_len + value_len
}

/// The second bits byte an item with these fields needs (0: none).
fn ext_bits(flags: u32, exptime: Time, cas: u64) -> u8 {
    let mut ext = 0;
    if flags != 0 {
        ext |= HAS_FLAGS;
    }
    if exptime != 0 {
        ext |= HAS_EXPTIME;
    }
    if cas >= NARROW_CAS_END {
        ext |= WIDE_CAS;
    }
    ext
}

/// Bytes of the optional fields `ext` names, the second bits byte included.
fn ext_len(ext: u8) -> usize {
    if ext == 0 {
        return 0;
    }
    let mut n = 1;
    if ext & WIDE_CAS != 0 {
        n += 3;
    }
    if ext & HAS_EXPTIME != 0 {
        n += 4;
    }
    if ext & HAS_FLAGS != 0 {
        n += 4;
    }
    n
}

/// Bytes of the header of an item with these fields and this value length.
pub(crate) fn header_len(flags: u32, exptime: Time, cas: u64, value_len: usize) -> usize {
    HEADER + ext_len(ext_bits(flags, exptime, cas)) + varint_len(value_len)
}

/// Bytes the LEB128 encoding of `v` takes.
fn varint_len(v: usize) -> usize {
    let bits = (usize::BITS - v.leading_zeros()).max(1) as usize;
    bits.div_ceil(7)
}

/// The second bits byte of the item at `b[0]` (0 when it has none).
fn ext_of(b: &[u8]) -> u8 {
    if b[BITS] & EXT != 0 {
        b[EXT_BITS]
    } else {
        0
    }
}

/// Where the optional fields of an item with second bits byte `ext` start: the wide CAS,
/// the exptime, the flags and the value length, each where it would be.
struct Offsets {
    cas_high: usize,
    exptime: usize,
    flags: usize,
    varint: usize,
}

fn offsets(ext: u8) -> Offsets {
    let cas_high = if ext == 0 { HEADER } else { HEADER + 1 };
    let exptime = cas_high + if ext & WIDE_CAS != 0 { 3 } else { 0 };
    let flags = exptime + if ext & HAS_EXPTIME != 0 { 4 } else { 0 };
    let varint = flags + if ext & HAS_FLAGS != 0 { 4 } else { 0 };
    Offsets {
        cas_high,
        exptime,
        flags,
        varint,
    }
}

/// The decoded header of the item starting at `b[0]`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Header {
    pub cas: u64,
    pub exptime: u32,
    /// The last access field as stored: store time modulo 2^24 ([`Header::last_access`]).
    access: u32,
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
        let ext = if bits & EXT != 0 { b[EXT_BITS] } else { 0 };
        let o = offsets(ext);
        let mut cas = u64_of(&b[CAS..CAS + 5]);
        if ext & WIDE_CAS != 0 {
            cas |= u64_of(&b[o.cas_high..o.cas_high + 3]) << 40;
        }
        let exptime = if ext & HAS_EXPTIME != 0 {
            u32_at(b, o.exptime)
        } else {
            0
        };
        let flags = if ext & HAS_FLAGS != 0 {
            u32_at(b, o.flags)
        } else {
            0
        };
        let (value_len, at) = varint_at(b, o.varint);
        Header {
            cas,
            exptime,
            access: u32_of3(&b[ACCESS..ACCESS + 3]),
            bits,
            flags,
            key_len: usize::from(b[KEY_LEN]),
            value_len,
            key_start: at,
        }
    }

    /// This header with the layout (where the key starts) of `moved`, the same item
    /// written anew ([`rewrite`]): what a read shows of the fields as they were before it.
    pub(crate) fn laid_out_as(self, moved: &Header) -> Header {
        Header {
            key_start: moved.key_start,
            ..self
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
        expired(self.exptime, now)
    }

    /// The last time the item was read or written, seen at store time `now`: the latest
    /// time at or before `now` that is the stored value modulo 2^24 (194 days). Exact for
    /// an item idle less than that (always, while the store is younger than 194 days); a
    /// value up to 2^16 seconds ahead of `now` (another worker's clock) reads as `now`.
    pub(crate) fn last_access(&self, now: Time) -> Time {
        let ago = now.wrapping_sub(self.access) & (ACCESS_MOD - 1);
        if ago > ACCESS_MOD - ACCESS_AHEAD {
            return now;
        }
        now.saturating_sub(ago)
    }
}

/// Whether the header of the item at `b[0]` decodes within `b` (bytes a sealed region
/// hands back are checked before [`Header::read`] trusts them, ADR 0052).
pub(crate) fn header_fits(b: &[u8]) -> bool {
    if b.len() <= EXT_BITS {
        return false;
    }
    let at = offsets(ext_of(b)).varint;
    b.get(at..)
        .is_some_and(|rest| rest.iter().take(VARINT_MAX).any(|&x| x & 0x80 == 0))
}

/// The bits byte of the item at `b[0]` ([`Header::bits`], without decoding the rest).
pub(crate) fn bits_of(b: &[u8]) -> u8 {
    b[BITS]
}

/// Bytes of the item at `b[0]` in its segment ([`Header::len`], without decoding the
/// CAS, flags, exptime and last access).
pub(crate) fn len_of(b: &[u8]) -> usize {
    let (value_len, at) = varint_at(b, offsets(ext_of(b)).varint);
    let value_start = at + usize::from(b[KEY_LEN]);
    if b[BITS] & EXTERNAL != 0 {
        value_start
    } else {
        value_start + value_len
    }
}

/// Whether the item at `b[0]` carries an exptime (one that can expire).
pub(crate) fn has_exptime(b: &[u8]) -> bool {
    ext_of(b) & HAS_EXPTIME != 0
}

/// Whether the item at `b[0]` has expired at `now` ([`Header::expired`], reading only its
/// exptime: a GET's look-up asks this of every hit, and a whole [`Header::read`] there cost
/// about 55 instructions, callgrind).
pub(crate) fn expired_at(b: &[u8], now: u32) -> bool {
    let ext = ext_of(b);
    if ext & HAS_EXPTIME == 0 {
        return false;
    }
    expired(u32_at(b, offsets(ext).exptime), now)
}

/// The one expiry rule: an exptime of 0 never expires; any other has at `now` or after.
fn expired(exptime: u32, now: u32) -> bool {
    exptime != 0 && exptime <= now
}

/// The key of the item that starts at `b[0]`, without decoding the rest of its header
/// (what every index probe that matches a tag reads).
pub(crate) fn key(b: &[u8]) -> &[u8] {
    let mut at = offsets(ext_of(b)).varint;
    while b[at] & 0x80 != 0 {
        at += 1;
    }
    at += 1;
    &b[at..at + usize::from(b[KEY_LEN])]
}

/// The value length encoded (LEB128) at `b[at]`, and the offset just past it.
#[inline]
fn varint_at(b: &[u8], mut at: usize) -> (usize, usize) {
    let (mut v, mut shift) = (0usize, 0);
    loop {
        let byte = b[at];
        at += 1;
        v |= usize::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return (v, at);
        }
        shift += 7;
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

/// The little-endian number in `b` (at most 8 bytes).
fn u64_of(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a[..b.len()].copy_from_slice(b);
    u64::from_le_bytes(a)
}

/// The little-endian 24-bit number in `b` (3 bytes).
fn u32_of3(b: &[u8]) -> u32 {
    let mut a = [0u8; 4];
    a[..3].copy_from_slice(&b[..3]);
    u32::from_le_bytes(a)
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
        header_len(self.flags, self.exptime, self.cas, self.value.len()) + self.key.len() + stored
    }
}

/// The header fields [`write_header`] writes.
struct Fields {
    cas: u64,
    access: u32,
    key_len: usize,
    bits: u8,
    exptime: Time,
    flags: u32,
    value_len: usize,
}

/// Writes a header at the start of `b`; returns its length (where the key goes).
#[expect(
    clippy::expect_used,
    reason = "Store::put refuses keys over KEY_LEN_MAX (255) and values over item_size_max (< 4 GiB) before any item is written"
)]
fn write_header(b: &mut [u8], f: &Fields) -> usize {
    let key_len = u8::try_from(f.key_len).expect("key length checked by the caller");
    let value_len = u32::try_from(f.value_len).expect("value length checked by the caller");
    let ext = ext_bits(f.flags, f.exptime, f.cas);
    b[CAS..CAS + 5].copy_from_slice(&f.cas.to_le_bytes()[..5]);
    b[ACCESS..ACCESS + 3].copy_from_slice(&f.access.to_le_bytes()[..3]);
    b[KEY_LEN] = key_len;
    let bits = f.bits & !EXT;
    let o = offsets(ext);
    if ext == 0 {
        b[BITS] = bits;
    } else {
        b[BITS] = bits | EXT;
        b[EXT_BITS] = ext;
    }
    if ext & WIDE_CAS != 0 {
        b[o.cas_high..o.cas_high + 3].copy_from_slice(&f.cas.to_le_bytes()[5..]);
    }
    if ext & HAS_EXPTIME != 0 {
        b[o.exptime..o.exptime + 4].copy_from_slice(&f.exptime.to_le_bytes());
    }
    if ext & HAS_FLAGS != 0 {
        b[o.flags..o.flags + 4].copy_from_slice(&f.flags.to_le_bytes());
    }
    let mut at = o.varint;
    let mut v = value_len;
    while v >= 0x80 {
        b[at] = (v.to_le_bytes()[0] & 0x7f) | 0x80;
        v >>= 7;
        at += 1;
    }
    b[at] = v.to_le_bytes()[0]; // below 0x80 here
    at + 1
}

/// Writes `item` at the start of `b`, which must hold [`NewItem::len`] bytes.
pub(crate) fn write(b: &mut [u8], item: &NewItem<'_>) {
    let mut bits = if item.large { LARGE } else { 0 };
    if item.external {
        bits |= EXTERNAL;
    }
    let mut at = write_header(
        b,
        &Fields {
            cas: item.cas,
            access: item.now,
            key_len: item.key.len(),
            bits,
            exptime: item.exptime,
            flags: item.flags,
            value_len: item.value.len(),
        },
    );
    b[at..at + item.key.len()].copy_from_slice(item.key);
    at += item.key.len();
    if !item.external {
        b[at..at + item.value.len()].copy_from_slice(item.value);
    }
}

/// Writes the header and key of a reserved item (a value of `value_len` bytes still to
/// come, its bytes left as they are) at the start of `b`, marked [`DEAD`] so nothing takes
/// it for a live item before it is linked; returns where the value starts.
pub(crate) fn write_reserved(b: &mut [u8], item: &NewItem<'_>, value_len: usize) -> usize {
    let at = write_header(
        b,
        &Fields {
            cas: item.cas,
            access: item.now,
            key_len: item.key.len(),
            bits: DEAD,
            exptime: item.exptime,
            flags: item.flags,
            value_len,
        },
    );
    b[at..at + item.key.len()].copy_from_slice(item.key);
    at + item.key.len()
}

/// Bytes the item with header `h` occupies once rewritten with `exptime` and `cas`.
pub(crate) fn rewritten_len(h: &Header, exptime: Time, cas: u64) -> usize {
    h.len() - h.key_start() + header_len(h.flags, exptime, cas, h.value_len)
}

/// Writes the item `src` (header `h`) into `dst` ([`rewritten_len`] bytes) with `exptime`
/// and `cas` instead of its own: the same key, value, flags, bits and last access.
pub(crate) fn rewrite(src: &[u8], h: &Header, dst: &mut [u8], exptime: Time, cas: u64) {
    let at = write_header(
        dst,
        &Fields {
            cas,
            access: h.access,
            key_len: h.key_len,
            bits: h.bits,
            exptime,
            flags: h.flags,
            value_len: h.value_len,
        },
    );
    let body = &src[h.key_start()..h.len()];
    dst[at..at + body.len()].copy_from_slice(body);
}

pub(crate) fn set_bits(b: &mut [u8], bits: u8) {
    b[BITS] = (bits & !EXT) | (b[BITS] & EXT);
}

/// Sets the exptime in place; `false` (nothing changed) when the item has no exptime field
/// and `exptime` is not [`crate::NEVER`]: it must be written anew ([`rewrite`]).
#[must_use]
pub(crate) fn set_exptime(b: &mut [u8], exptime: u32) -> bool {
    let ext = ext_of(b);
    if ext & HAS_EXPTIME == 0 {
        return exptime == 0;
    }
    let at = offsets(ext).exptime;
    b[at..at + 4].copy_from_slice(&exptime.to_le_bytes());
    true
}

pub(crate) fn set_last_access(b: &mut [u8], now: u32) {
    b[ACCESS..ACCESS + 3].copy_from_slice(&now.to_le_bytes()[..3]);
}

/// Sets the CAS unique in place; `false` (nothing changed) when it needs more than the
/// item's narrow 40-bit field: it must be written anew ([`rewrite`]).
#[must_use]
pub(crate) fn set_cas(b: &mut [u8], cas: u64) -> bool {
    let ext = ext_of(b);
    let bytes = cas.to_le_bytes();
    if ext & WIDE_CAS != 0 {
        let at = offsets(ext).cas_high;
        b[at..at + 3].copy_from_slice(&bytes[5..]);
    } else if cas >= NARROW_CAS_END {
        return false;
    }
    b[CAS..CAS + 5].copy_from_slice(&bytes[..5]);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn new_item<'a>(
        key: &'a [u8],
        value: &'a [u8],
        flags: u32,
        exptime: u32,
        cas: u64,
    ) -> NewItem<'a> {
        NewItem {
            key,
            value,
            flags,
            exptime,
            cas,
            now: 3,
            large: flags != 0,
            external: false,
        }
    }

    #[test]
    fn round_trips_with_and_without_each_optional_field() {
        for flags in [0u32, 7, u32::MAX] {
            for exptime in [0u32, 9, u32::MAX] {
                for cas in [0u64, 42, NARROW_CAS_END - 1, NARROW_CAS_END, u64::MAX] {
                    let item = new_item(b"k1", b"hello", flags, exptime, cas);
                    let len = item.len();
                    let mut b = vec![0xAA; len + 4];
                    write(&mut b, &item);
                    let h = Header::read(&b);
                    assert_eq!(h.len(), len);
                    assert_eq!(
                        (h.cas, h.exptime, h.last_access(3), h.flags),
                        (cas, exptime, 3, flags)
                    );
                    assert_eq!(&b[h.key_start()..h.value_start()], b"k1");
                    assert_eq!(key(&b), b"k1");
                    assert_eq!(bits_of(&b), h.bits);
                    assert_eq!(len_of(&b), h.len());
                    for now in [0, 1, 8, 9, 10, u32::MAX - 1, u32::MAX] {
                        assert_eq!(expired_at(&b, now), h.expired(now), "{exptime} at {now}");
                    }
                    assert_eq!(&b[h.value_start()..h.len()], b"hello");
                    assert_eq!(h.bits & LARGE != 0, flags != 0);
                    assert_eq!(b[len], 0xAA, "nothing written past the item");
                    let optional = [flags != 0, exptime != 0, cas >= NARROW_CAS_END];
                    let extra: usize = usize::from(optional.iter().any(|&o| o))
                        + if optional[0] { 4 } else { 0 }
                        + if optional[1] { 4 } else { 0 }
                        + if optional[2] { 3 } else { 0 };
                    assert_eq!(len, HEADER + extra + 1 + 2 + 5, "{flags} {exptime} {cas}");
                }
            }
        }
        let plain = new_item(b"key:000000000", &[0; 100], 0, 0, 1);
        assert_eq!(
            plain.len(),
            124,
            "11-byte header + 13-byte key + 100-byte value"
        );
        assert_eq!(item_len(13, 100, 0), 124);
    }

    #[test]
    fn an_exptime_on_an_item_without_one_needs_a_rewrite_that_keeps_the_rest() {
        let item = NewItem {
            now: 70_000,
            ..new_item(b"key", b"value", 0, 0, 5)
        };
        let mut b = vec![0; item.len()];
        write(&mut b, &item);
        set_bits(&mut b, FETCHED | ACCESSED | STALE);
        assert!(set_exptime(&mut b, 0), "never to never needs no room");
        assert!(!set_exptime(&mut b, 100), "no exptime field: not in place");
        let h = Header::read(&b);
        assert_eq!(h.exptime, 0, "unchanged");
        let mut dst = vec![0x11; rewritten_len(&h, 100, 5) + 1];
        assert_eq!(
            dst.len() - 1,
            b.len() + 5,
            "the second bits byte and the exptime"
        );
        rewrite(&b, &h, &mut dst, 100, 5);
        let r = Header::read(&dst);
        assert_eq!((r.exptime, r.cas, r.flags), (100, 5, 0));
        assert_eq!(r.last_access(70_010), 70_000, "the last access survives");
        assert_eq!(r.bits & !EXT, FETCHED | ACCESSED | STALE);
        assert_eq!(&dst[r.key_start()..r.value_start()], b"key");
        assert_eq!(&dst[r.value_start()..r.len()], b"value");
        assert_eq!(dst[r.len()], 0x11);
        // With the field, touches are in place, back to never included.
        assert!(set_exptime(&mut dst, 200) && Header::read(&dst).exptime == 200);
        assert!(set_exptime(&mut dst, 0) && !Header::read(&dst).expired(u32::MAX));
    }

    #[test]
    fn a_wide_cas_on_a_narrow_item_needs_a_rewrite() {
        let item = new_item(b"k", b"v", 9, 0, 1);
        let mut b = vec![0; item.len()];
        write(&mut b, &item);
        assert!(set_cas(&mut b, NARROW_CAS_END - 1));
        assert_eq!(Header::read(&b).cas, NARROW_CAS_END - 1);
        assert!(!set_cas(&mut b, NARROW_CAS_END));
        let h = Header::read(&b);
        assert_eq!(h.cas, NARROW_CAS_END - 1, "unchanged");
        let mut dst = vec![0; rewritten_len(&h, 0, u64::MAX)];
        rewrite(&b, &h, &mut dst, 0, u64::MAX);
        let r = Header::read(&dst);
        assert_eq!((r.cas, r.flags, r.exptime), (u64::MAX, 9, 0));
        assert!(set_cas(&mut dst, 7), "a wide field takes any CAS unique");
        assert_eq!(Header::read(&dst).cas, 7);
        assert_eq!(&dst[r.value_start()..r.len()], b"v");
    }

    #[test]
    fn last_access_is_exact_within_its_window_whatever_the_uptime() {
        let item = new_item(b"k", b"v", 0, 0, 1);
        let mut b = vec![0; item.len()];
        write(&mut b, &item);
        for (at, now) in [
            (0u32, 0u32),
            (5, 65),
            (1 << 24, (1 << 24) + 2),
            ((1 << 24) - 1, 1 << 24),
            (3_000_000_000, 3_000_000_000 + (1 << 23)),
            (u32::MAX - 10, u32::MAX),
            (100, 100 + ACCESS_MOD - ACCESS_AHEAD),
        ] {
            set_last_access(&mut b, at);
            let h = Header::read(&b);
            assert_eq!(h.last_access(now), at, "stored at {at}, read at {now}");
            assert_eq!(h.cas, 1, "the CAS next to it is untouched");
        }
        set_last_access(&mut b, 1001);
        assert_eq!(
            Header::read(&b).last_access(1000),
            1000,
            "a clock a tick ahead reads as now"
        );
        assert_eq!(
            Header::read(&b).last_access(1001 + ACCESS_MOD),
            1001 + ACCESS_MOD,
            "past the window: modulo 2^24"
        );
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
        assert_eq!(
            item.len(),
            HEADER + 1 + 4 + 2 + 3,
            "flags and a 2-byte length"
        );
        let mut b = vec![0xEE; item.len() + 8];
        write(&mut b, &item);
        let h = Header::read(&b);
        assert_eq!(h.value_len, 5000, "the real length is kept");
        assert_eq!(h.len(), HEADER + 1 + 4 + 2 + 3, "no value bytes are stored");
        assert!(h.bits & EXTERNAL != 0 && h.bits & LARGE == 0);
        assert_eq!(h.flags, 9);
        assert_eq!(&b[h.key_start()..h.value_start()], b"key");
        assert!(
            b[h.len()..].iter().all(|&x| x == 0xEE),
            "nothing written past the key"
        );
        let mut dst = vec![0xEE; rewritten_len(&h, 50, 5) + 8];
        rewrite(&b, &h, &mut dst, 50, 5);
        let r = Header::read(&dst);
        assert_eq!((r.value_len, r.exptime, r.len()), (5000, 50, h.len() + 4));
        assert!(
            dst[r.len()..].iter().all(|&x| x == 0xEE),
            "a stub stays a stub"
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
        assert_eq!(len, header_len(flags, u32::MAX, cas, value_len) + key_len);
        let mut b = vec![0x5A; len + 1];
        write(&mut b, &item);
        let h = Header::read(&b);
        assert_eq!(len_of(&b), len, "a stub's length has no value bytes");
        assert_eq!(
            (
                h.value_len,
                h.key_len,
                h.flags,
                h.cas,
                h.exptime,
                h.last_access(u32::MAX)
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
            assert_eq!(header_len(0, 0, 0, value_len), HEADER + bytes);
            stub_round_trip(crate::KEY_LEN_MAX, value_len, u32::MAX, u64::MAX);
            stub_round_trip(1, value_len, 0, 0);
        }
        assert_eq!(
            header_len(1, 1, u64::MAX, crate::ITEM_SIZE_MAX_LIMIT),
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
        assert!(set_cas(&mut b, u64::MAX));
        assert!(set_exptime(&mut b, u32::MAX));
        set_last_access(&mut b, 7);
        set_bits(&mut b, FETCHED | DEAD);
        let h = Header::read(&b);
        assert_eq!(
            (h.cas, h.exptime, h.last_access(7)),
            (u64::MAX, u32::MAX, 7)
        );
        assert_eq!(h.bits, FETCHED | DEAD | EXT, "the layout bit is kept");
        assert_eq!((h.flags, h.key_len, h.value_len), (1, 250, 300));
        assert_eq!(&b[h.key_start()..h.value_start()], &[b'q'; 250][..]);
        assert_eq!(&b[h.value_start()..h.len()], &value[..]);
        assert_eq!(h.len(), HEADER + 1 + 3 + 4 + 4 + 2 + 250 + 300);
    }
}
