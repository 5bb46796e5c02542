//! The log record: a 48-byte header, key and value, 8-byte aligned, chained by crc32c.
//!
//! Layout (little endian):
//! `0 magic "RSR1" | 4 crc32c | 8 kind u8 (1 value, 2 tombstone, 3 manifest) | 9 stamp tag high u8 | 10 key_len u16 |
//!  12 value_len u32 | 16 flags u32 | 20 stamp u32 (tag low u8 << 24 | durable bytes / 8) | 24 exptime u64 | 32 cas u64 |
//!  40 seq u64 | 48 key | value | zero pad to 8`.
//! The [`Stamp`] (ADR 0016) names the segment use the record was written in and how much of
//! that segment was durable when it was encoded; recovery uses it to tell a torn tail from a
//! damaged record in acknowledged history. Records written before stamps carry zeros there.
//!
//! On a device with a data key (ADR 0050) every record is sealed instead (magic "RSE1"):
//! `0 magic | 4 crc32c | 8 zero u8 | 9 stamp tag high u8 | 10 zero u16 | 12 body_len u32 |
//!  16 zero u32 | 20 stamp u32 | 24 nonce [12] | 36 zero [12] | 48 AES-256-GCM ciphertext of the
//!  body | tag [16] | zero pad to 8`, the body being `0 kind u8 | 1 zero | 2 key_len u16 |
//!  4 value_len u32 | 8 flags u32 | 12 zero u32 | 16 exptime u64 | 24 cas u64 | 32 seq u64 |
//!  40 key | value`. The framing (magic, lengths, stamp, crc chain over the bytes as stored) is
//! what recovery walks, so torn tails, resync and damage work unchanged; the tag, over the body
//! and the header's other fields and the device uuid, is checked right after the crc, and a
//! record whose tag fails does not decode, exactly like one whose crc fails.
//! The crc covers the header (crc field as zero), key and value, seeded with the previous
//! record's crc (the segment header's crc for the first record), so a stale record from an
//! earlier use of the segment, or one after a hole left by a torn batch, never decodes.
use std::borrow::Cow;

use crate::crypt::{Crypt, Sealer, NONCE_LEN, TAG_LEN};
use crate::superblock::{le32, le64};

/// Record magic, "RSR1".
pub const RECORD_MAGIC: u32 = u32::from_le_bytes(*b"RSR1");
/// Sealed record magic, "RSE1".
pub const SEALED_MAGIC: u32 = u32::from_le_bytes(*b"RSE1");
/// Header bytes before the key.
pub const HEADER_LEN: usize = 48;
/// Bytes of a sealed record's body before its key.
const BODY_HEAD: usize = 40;
/// Longest key a record can carry.
pub const KEY_LEN_MAX: usize = u16::MAX as usize;

/// What a record says about its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordKind {
    /// The key now holds the value.
    Value,
    /// The key was deleted.
    Tombstone,
    /// The key holds a large object: the value is an encoded [`crate::large::Manifest`]
    /// naming the chunk records that hold the object's bytes.
    Manifest,
}

impl RecordKind {
    /// True for the kinds that make their key hold something (a value or a manifest): what
    /// liveness, `older` counting, compaction and recovery treat as a value.
    pub fn has_value(self) -> bool {
        matches!(self, RecordKind::Value | RecordKind::Manifest)
    }

    /// The kind byte in the record header.
    pub fn byte(self) -> u8 {
        match self {
            RecordKind::Value => 1,
            RecordKind::Tombstone => 2,
            RecordKind::Manifest => 3,
        }
    }

    /// The kind for a header byte; `None` for an unknown one.
    pub fn from_byte(b: u8) -> Option<Self> {
        match b {
            1 => Some(RecordKind::Value),
            2 => Some(RecordKind::Tombstone),
            3 => Some(RecordKind::Manifest),
            _ => None,
        }
    }
}

/// What a record says about the log it was written into (bytes 9 and 20..24, covered by the
/// crc; not part of [`RecordMeta`], so the index and the read paths never compare it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stamp {
    /// 16 bits naming the segment's current use ([`crate::segment::SegmentHeader::tag`]);
    /// 0 only in records written before stamps existed. A record left from an earlier use of
    /// the segment carries another tag (2^-16 chance of the same one).
    pub tag: u16,
    /// Bytes of the segment, from its start, that were durable (covered by a completed flush)
    /// when the record was encoded: every record starting below this offset was acknowledged
    /// or is a durable compaction copy. 0: no claim. A multiple of 8; claims are capped at
    /// [`STAMP_DURABLE_MAX`] (a smaller claim is always true).
    pub durable: u32,
}

/// Largest durable offset a stamp can carry (24 bits of 8-byte units, just under 128 MiB).
pub const STAMP_DURABLE_MAX: u32 = 0xFF_FFFF * 8;

impl Stamp {
    fn encode(self) -> (u8, u32) {
        let units = (self.durable.min(STAMP_DURABLE_MAX) / 8) & 0xFF_FFFF;
        (
            self.tag.to_le_bytes()[1],
            (u32::from(self.tag.to_le_bytes()[0]) << 24) | units,
        )
    }

    fn decode(b9: u8, w20: u32) -> Stamp {
        Stamp {
            tag: (u16::from(b9) << 8) | (w20 >> 24) as u16,
            durable: (w20 & 0xFF_FFFF) * 8,
        }
    }

    /// The stamp bytes of whatever lies at the start of `buf`, unverified (a cheap filter
    /// before checking a record's crc); `None` when `buf` is shorter than a header.
    pub fn peek(buf: &[u8]) -> Option<Stamp> {
        (buf.len() >= HEADER_LEN).then(|| Stamp::decode(buf[9], le32(buf, 20)))
    }
}

/// Everything in a record except the key and value bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordMeta {
    /// Value, tombstone or manifest.
    pub kind: RecordKind,
    /// Opaque client flags (memcache flags).
    pub flags: u32,
    /// Absolute expiry, seconds since the Unix epoch; 0 = never.
    pub exptime: u64,
    /// The item's CAS unique.
    pub cas: u64,
    /// Global write sequence: for one key the highest sequence on the device wins.
    pub seq: u64,
}

impl RecordMeta {
    /// A header with no flags, expiry or CAS: tombstones, chunks and the flush_all mark.
    pub(crate) fn bare(kind: RecordKind, seq: u64) -> RecordMeta {
        RecordMeta {
            kind,
            flags: 0,
            exptime: 0,
            cas: 0,
            seq,
        }
    }
}

/// Bytes a record with these lengths occupies in the log.
pub fn encoded_len(key_len: usize, value_len: usize) -> usize {
    (HEADER_LEN + key_len + value_len).div_ceil(8) * 8
}

/// Bytes a sealed record (ADR 0050) with these lengths occupies in the log.
pub fn sealed_len(key_len: usize, value_len: usize) -> usize {
    sealed_total(BODY_HEAD + key_len + value_len)
}

/// Bytes a sealed record with a body of `body_len` bytes occupies.
fn sealed_total(body_len: usize) -> usize {
    (HEADER_LEN + body_len + TAG_LEN).div_ceil(8) * 8
}

/// Bytes a record occupies: sealed on a device with a data key, in clear otherwise.
pub fn record_len(sealed: bool, key_len: usize, value_len: usize) -> usize {
    if sealed {
        sealed_len(key_len, value_len)
    } else {
        encoded_len(key_len, value_len)
    }
}

/// True for either record magic (a candidate place for a record; [`decode`] decides which
/// one the device allows).
pub fn is_magic(word: u32) -> bool {
    word == RECORD_MAGIC || word == SEALED_MAGIC
}

/// Bytes the record at the start of `buf` claims to occupy, from its lengths read as the
/// device's layout (`sealed`), unverified; `None` when shorter than a header.
pub fn claimed_len(buf: &[u8], sealed: bool) -> Option<usize> {
    if buf.len() < HEADER_LEN {
        return None;
    }
    Some(if sealed {
        sealed_total(le32(buf, 12) as usize)
    } else {
        encoded_len(
            usize::from(u16::from_le_bytes([buf[10], buf[11]])),
            le32(buf, 12) as usize,
        )
    })
}

/// Append one sealed record (ADR 0050) to `out`, chained after `prev_crc`, under `nonce`
/// (from [`crate::crypt::Sealer`]); returns this record's crc.
#[expect(
    clippy::cast_possible_truncation,
    reason = "the caller bounds key and value lengths (KEY_LEN_MAX, u32::MAX); asserted"
)]
#[expect(
    clippy::too_many_arguments,
    reason = "encode_into's plus the sealing pair"
)]
pub fn encode_sealed_into(
    out: &mut Vec<u8>,
    prev_crc: u32,
    meta: &RecordMeta,
    stamp: Stamp,
    key: &[u8],
    value: &[u8],
    sealer: &Sealer,
    nonce: [u8; NONCE_LEN],
) -> u32 {
    debug_assert!(key.len() <= KEY_LEN_MAX, "key of {} bytes", key.len());
    let start = out.len();
    let (b9, w20) = stamp.encode();
    let body_len = BODY_HEAD + key.len() + value.len();
    let total = sealed_len(key.len(), value.len());
    out.reserve(total);
    out.extend_from_slice(&SEALED_MAGIC.to_le_bytes());
    out.extend_from_slice(&[0, 0, 0, 0, 0, b9, 0, 0]);
    out.extend_from_slice(&(body_len as u32).to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&w20.to_le_bytes());
    out.extend_from_slice(&nonce);
    out.extend_from_slice(&[0; 12]);
    out.push(meta.kind.byte());
    out.push(0);
    out.extend_from_slice(&(key.len() as u16).to_le_bytes());
    out.extend_from_slice(&(value.len() as u32).to_le_bytes());
    out.extend_from_slice(&meta.flags.to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&meta.exptime.to_le_bytes());
    out.extend_from_slice(&meta.cas.to_le_bytes());
    out.extend_from_slice(&meta.seq.to_le_bytes());
    out.extend_from_slice(key);
    out.extend_from_slice(value);
    let (head, body) = out[start..].split_at_mut(HEADER_LEN);
    let tag = sealer.seal(nonce, &sealed_aad(head), body);
    out.extend_from_slice(&tag);
    out.resize(start + total, 0);
    debug_assert_eq!(out.len() - start, total);
    let crc = sealed_crc(
        prev_crc,
        &out[start..start + HEADER_LEN + body_len + TAG_LEN],
    );
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
    crc
}

/// What a sealed record's tag authenticates besides its body: the header but its crc.
fn sealed_aad(header: &[u8]) -> [u8; HEADER_LEN - 4] {
    let mut aad = [0u8; HEADER_LEN - 4];
    aad[..4].copy_from_slice(&header[..4]);
    aad[4..].copy_from_slice(&header[8..HEADER_LEN]);
    aad
}

/// The crc of a sealed record's stored bytes (`rec`: header, ciphertext and tag), the crc
/// field counted as zero.
fn sealed_crc(prev_crc: u32, rec: &[u8]) -> u32 {
    let crc = crc32c::crc32c_append(prev_crc, &rec[0..4]);
    let crc = crc32c::crc32c_append(crc, &[0; 4]);
    crc32c::crc32c_append(crc, &rec[8..])
}

/// The stored bytes (header through tag) of the sealed record at the start of `buf`.
fn sealed_bytes(buf: &[u8]) -> Option<&[u8]> {
    if buf.len() < HEADER_LEN || le32(buf, 0) != SEALED_MAGIC {
        return None;
    }
    sealed_extent(buf)
}

/// The bytes a sealed record at the start of `buf` claims (header through tag), by its body
/// length alone.
fn sealed_extent(buf: &[u8]) -> Option<&[u8]> {
    if buf.len() < HEADER_LEN {
        return None;
    }
    let end = HEADER_LEN
        .checked_add(le32(buf, 12) as usize)?
        .checked_add(TAG_LEN)?;
    buf.get(..end)
}

/// The sealed record at the start of `buf` whose framing and crc check (its tag unchecked).
struct Framed<'a> {
    /// Header through tag, as stored.
    rec: &'a [u8],
    body_len: usize,
    /// Bytes the record occupies, padding included.
    len: usize,
    crc: u32,
    nonce: [u8; NONCE_LEN],
}

fn framed(buf: &[u8], prev_crc: u32) -> Option<Framed<'_>> {
    let rec = sealed_bytes(buf)?;
    let body_len = rec.len() - HEADER_LEN - TAG_LEN;
    let len = sealed_total(body_len);
    if body_len < BODY_HEAD || buf.len() < len {
        return None;
    }
    let crc = le32(buf, 4);
    if sealed_crc(prev_crc, rec) != crc {
        return None;
    }
    let nonce: [u8; NONCE_LEN] = rec[24..24 + NONCE_LEN].try_into().ok()?;
    Some(Framed {
        rec,
        body_len,
        len,
        crc,
        nonce,
    })
}

/// Decodes a sealed record: crc first (the framing), then the tag, then the body's fields.
fn decode_sealed<'a>(buf: &'a [u8], prev_crc: u32, crypt: &Crypt) -> Option<RecordView<'a>> {
    let Framed {
        rec,
        body_len,
        len,
        crc,
        nonce,
    } = framed(buf, prev_crc)?;
    let mut body = crypt.open(nonce, &sealed_aad(rec), &rec[HEADER_LEN..])?;
    let (meta, key_len) = body_fields(&body, body_len)?;
    let key = body[BODY_HEAD..BODY_HEAD + key_len].to_vec();
    body.drain(..BODY_HEAD + key_len);
    Some(RecordView {
        meta,
        stamp: Stamp::decode(buf[9], le32(buf, 20)),
        key: Cow::Owned(key),
        value: Cow::Owned(body),
        len,
        crc,
    })
}

/// Append one record to `out`, chained after `prev_crc`; returns this record's crc.
/// The caller checks `key.len() <= KEY_LEN_MAX` and `value.len() <= u32::MAX`.
#[expect(
    clippy::cast_possible_truncation,
    reason = "the caller bounds key and value lengths (KEY_LEN_MAX, u32::MAX); asserted"
)]
pub fn encode_into(
    out: &mut Vec<u8>,
    prev_crc: u32,
    meta: &RecordMeta,
    stamp: Stamp,
    key: &[u8],
    value: &[u8],
) -> u32 {
    debug_assert!(key.len() <= KEY_LEN_MAX, "key of {} bytes", key.len());
    debug_assert!(
        u32::try_from(value.len()).is_ok(),
        "value of {} bytes",
        value.len()
    );
    let start = out.len();
    let (b9, w20) = stamp.encode();
    let total = encoded_len(key.len(), value.len());
    out.reserve(total);
    out.extend_from_slice(&RECORD_MAGIC.to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    out.push(meta.kind.byte());
    out.push(b9);
    out.extend_from_slice(&(key.len() as u16).to_le_bytes());
    out.extend_from_slice(&(value.len() as u32).to_le_bytes());
    out.extend_from_slice(&meta.flags.to_le_bytes());
    out.extend_from_slice(&w20.to_le_bytes());
    out.extend_from_slice(&meta.exptime.to_le_bytes());
    out.extend_from_slice(&meta.cas.to_le_bytes());
    out.extend_from_slice(&meta.seq.to_le_bytes());
    out.extend_from_slice(key);
    out.extend_from_slice(value);
    out.resize(start + total, 0);
    debug_assert_eq!(out.len() - start, total);
    debug_assert!(total.is_multiple_of(8) && total >= HEADER_LEN);
    let crc = record_crc(prev_crc, &out[start..start + HEADER_LEN], key, value);
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
    crc
}

fn record_crc(prev_crc: u32, header: &[u8], key: &[u8], value: &[u8]) -> u32 {
    let mut crc = crc32c::crc32c_append(prev_crc, &header[0..4]);
    crc = crc32c::crc32c_append(crc, &[0; 4]);
    crc = crc32c::crc32c_append(crc, &header[8..HEADER_LEN]);
    crc = crc32c::crc32c_append(crc, key);
    crc32c::crc32c_append(crc, value)
}

/// The crc the record at the start of `buf` would have if it chained after `prev_crc`,
/// computed from its declared lengths whatever its stored crc says (recovery uses it to step
/// over a record whose crc field is the damaged part). `None` when the lengths run past `buf`.
/// `sealed`: the device seals its records, so the bytes are read as a sealed record whatever
/// its (maybe damaged) magic says.
pub fn recompute_crc(buf: &[u8], prev_crc: u32, sealed: bool) -> Option<u32> {
    if sealed {
        return sealed_extent(buf).map(|rec| sealed_crc(prev_crc, rec));
    }
    if buf.len() < HEADER_LEN {
        return None;
    }
    let key_len = usize::from(u16::from_le_bytes([buf[10], buf[11]]));
    let value_len = le32(buf, 12) as usize;
    let end = HEADER_LEN.checked_add(key_len)?.checked_add(value_len)?;
    if end > buf.len() {
        return None;
    }
    let key = &buf[HEADER_LEN..HEADER_LEN + key_len];
    Some(record_crc(
        prev_crc,
        &buf[..HEADER_LEN],
        key,
        &buf[HEADER_LEN + key_len..end],
    ))
}

/// A record decoded in place (a sealed one: decrypted into owned key and value).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordView<'a> {
    /// Header fields.
    pub meta: RecordMeta,
    /// What the record says about its segment.
    pub stamp: Stamp,
    /// Key bytes.
    pub key: Cow<'a, [u8]>,
    /// Value bytes (empty for a tombstone).
    pub value: Cow<'a, [u8]>,
    /// Bytes the record occupies, padding included.
    pub len: usize,
    /// This record's crc (the next record's seed).
    pub crc: u32,
}

/// Decode the record at the start of `buf`, which must chain after `prev_crc`: a sealed one
/// under `crypt` on a device with a data key, one in clear otherwise (never the other kind).
/// `None` for anything else: wrong magic, impossible lengths, truncation, bad crc, a tag that
/// does not verify. Never panics.
pub fn decode<'a>(buf: &'a [u8], prev_crc: u32, crypt: Option<&Crypt>) -> Option<RecordView<'a>> {
    if let Some(c) = crypt {
        return decode_sealed(buf, prev_crc, c);
    }
    if buf.len() < HEADER_LEN || le32(buf, 0) != RECORD_MAGIC {
        return None;
    }
    let kind = RecordKind::from_byte(buf[8])?;
    let key_len = usize::from(u16::from_le_bytes([buf[10], buf[11]]));
    let value_len = le32(buf, 12) as usize;
    if kind == RecordKind::Tombstone && value_len != 0 {
        return None;
    }
    let len = encoded_len(key_len, value_len);
    if buf.len() < len {
        return None;
    }
    let key = &buf[HEADER_LEN..HEADER_LEN + key_len];
    let value = &buf[HEADER_LEN + key_len..HEADER_LEN + key_len + value_len];
    let crc = le32(buf, 4);
    if record_crc(prev_crc, &buf[..HEADER_LEN], key, value) != crc {
        return None;
    }
    // A record that verified is whole and padded: the next one starts 8-aligned, inside `buf`.
    debug_assert!(
        len.is_multiple_of(8) && len >= HEADER_LEN + key_len + value_len && len <= buf.len()
    );
    let meta = RecordMeta {
        kind,
        flags: le32(buf, 16),
        exptime: le64(buf, 24),
        cas: le64(buf, 32),
        seq: le64(buf, 40),
    };
    Some(RecordView {
        meta,
        stamp: Stamp::decode(buf[9], le32(buf, 20)),
        key: Cow::Borrowed(key),
        value: Cow::Borrowed(value),
        len,
        crc,
    })
}

/// Walk the chained records of one segment body.
///
/// `buf` is the segment from its start; records begin at `start` chained after `seed`. Between
/// batches the log is zero-padded to the next `block` boundary; a zero word where a record could
/// start (and that is not on a block boundary) is that padding. The first record that does not
/// decode ends the log: that is the torn tail. Calls `f(offset_in_segment, record)` for each
/// record; returns the end of the last good record and the crc to chain the next one after.
pub fn scan<'a>(
    buf: &'a [u8],
    start: usize,
    seed: u32,
    block: usize,
    crypt: Option<&Crypt>,
    f: impl FnMut(usize, &RecordView<'a>),
) -> (usize, u32) {
    let step = |b, crc| decode(b, crc, crypt).map(|r| (r.len, r.crc, r));
    walk(buf, (start, seed, block), step, f)
}

/// [`scan`] for what a record says about itself without its value: a sealed record's framing
/// and crc are checked as by [`decode`], but only its body's head and key are decrypted, and
/// its tag is *not* checked ([`Crypt::peek`]). For deciding which records are dead; whatever
/// is kept or copied is decoded again with [`decode`], which checks the tag.
pub fn scan_heads<'a>(
    buf: &'a [u8],
    start: usize,
    seed: u32,
    block: usize,
    crypt: Option<&Crypt>,
    f: impl FnMut(usize, &RecordHead<'a>),
) -> (usize, u32) {
    let step = |b, crc| head(b, crc, crypt).map(|r| (r.len, r.crc, r));
    walk(buf, (start, seed, block), step, f)
}

/// The walk [`scan`] and [`scan_heads`] share: `decode` gives a record with its length and
/// crc (where the next one starts and what it chains after).
fn walk<'a, R>(
    buf: &'a [u8],
    (start, seed, block): (usize, u32, usize),
    mut decode: impl FnMut(&'a [u8], u32) -> Option<(usize, u32, R)>,
    mut f: impl FnMut(usize, &R),
) -> (usize, u32) {
    let mut pos = start;
    let mut crc = seed;
    let mut end = start;
    loop {
        if !pos.is_multiple_of(block) && pos + 4 <= buf.len() && le32(buf, pos) == 0 {
            pos = pos.div_ceil(block) * block;
        }
        let Some((len, next, rec)) = buf.get(pos..).and_then(|rest| decode(rest, crc)) else {
            debug_assert!(start <= end && end <= buf.len().max(start));
            return (end, crc);
        };
        // Record boundary: records start 8-aligned (batches are block-aligned, records padded
        // to 8) and each one lies wholly inside the segment.
        debug_assert!(
            pos.is_multiple_of(8) || !start.is_multiple_of(8) || !block.is_multiple_of(8)
        );
        debug_assert!(pos >= end && pos + len <= buf.len());
        f(pos, &rec);
        crc = next;
        pos += len;
        end = pos;
    }
}

/// A record's fields and key, not its value ([`scan_heads`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordHead<'a> {
    /// Header fields.
    pub meta: RecordMeta,
    /// Key bytes.
    pub key: Cow<'a, [u8]>,
    /// Bytes the record occupies, padding included.
    pub len: usize,
    /// This record's crc (the next record's seed).
    pub crc: u32,
}

/// The head of the record at the start of `buf`: a record in clear decoded whole (its key is
/// borrowed), a sealed one checked as far as its crc and then peeked ([`scan_heads`]).
pub fn head<'a>(buf: &'a [u8], prev_crc: u32, crypt: Option<&Crypt>) -> Option<RecordHead<'a>> {
    let Some(c) = crypt else {
        let r = decode(buf, prev_crc, None)?;
        return Some(RecordHead {
            meta: r.meta,
            key: r.key,
            len: r.len,
            crc: r.crc,
        });
    };
    let Framed {
        rec,
        body_len,
        len,
        crc,
        nonce,
    } = framed(buf, prev_crc)?;
    let body = &rec[HEADER_LEN..HEADER_LEN + body_len];
    let mut fields = [0u8; BODY_HEAD];
    fields.copy_from_slice(&body[..BODY_HEAD]);
    c.peek(nonce, 0, &mut fields);
    let (meta, key_len) = body_fields(&fields, body_len)?;
    let mut key = body[BODY_HEAD..BODY_HEAD + key_len].to_vec();
    c.peek(nonce, BODY_HEAD, &mut key);
    Some(RecordHead {
        meta,
        key: Cow::Owned(key),
        len,
        crc,
    })
}

/// A sealed body's fields from its first [`BODY_HEAD`] bytes, checked against the body's
/// length; with the key's length.
fn body_fields(body: &[u8], body_len: usize) -> Option<(RecordMeta, usize)> {
    let kind = RecordKind::from_byte(*body.first()?)?;
    let key_len = usize::from(u16::from_le_bytes([body[2], body[3]]));
    let value_len = le32(body, 4) as usize;
    if BODY_HEAD + key_len + value_len != body_len
        || (kind == RecordKind::Tombstone && value_len != 0)
    {
        return None;
    }
    let meta = RecordMeta {
        kind,
        flags: le32(body, 8),
        exptime: le64(body, 16),
        cas: le64(body, 24),
        seq: le64(body, 32),
    };
    Some((meta, key_len))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypt::{DataKey, Sealer};
    use proptest::prelude::*;
    use std::sync::Arc;

    fn crypt(b: u8) -> Arc<Crypt> {
        Arc::new(Crypt::new(&DataKey::from_bytes([b; 32]), [4; 16], 1).unwrap())
    }

    fn seal(
        out: &mut Vec<u8>,
        s: &mut Sealer,
        prev: u32,
        m: &RecordMeta,
        k: &[u8],
        v: &[u8],
    ) -> u32 {
        let nonce = s.next_nonce().unwrap();
        encode_sealed_into(out, prev, m, STAMP, k, v, s, nonce)
    }

    #[test]
    fn sealed_record_hides_everything_and_fails_like_a_bad_crc() {
        let c = crypt(1);
        let mut s = Sealer::new(c.clone());
        let mut buf = Vec::new();
        let crc = seal(
            &mut buf,
            &mut s,
            5,
            &meta(77),
            b"secret-key",
            b"secret-value",
        );
        assert_eq!(buf.len(), sealed_len(10, 12));
        assert_eq!(claimed_len(&buf, true), Some(buf.len()));
        assert!(!buf.windows(6).any(|w| w == b"secret"));
        // Neither the meta (flags 7, exptime 99, cas 42, seq 77) shows.
        assert!(!buf
            .windows(8)
            .any(|w| w == 77u64.to_le_bytes() || w == 99u64.to_le_bytes()));
        assert_eq!(Stamp::peek(&buf), Some(STAMP));
        assert_eq!(recompute_crc(&buf, 5, true), Some(crc));
        let r = decode(&buf, 5, Some(&c)).unwrap();
        assert_eq!(
            (&*r.key, &*r.value, r.meta, r.crc, r.len),
            (
                &b"secret-key"[..],
                &b"secret-value"[..],
                meta(77),
                crc,
                buf.len()
            )
        );
        // A device in clear never takes a sealed record, nor another key, nor another chain.
        assert!(decode(&buf, 5, None).is_none());
        assert!(decode(&buf, 5, Some(&crypt(2))).is_none());
        assert!(decode(&buf, 6, Some(&c)).is_none());
        for i in 0..buf.len() - 4 {
            let mut b = buf.clone();
            b[i] ^= 0x10;
            assert!(decode(&b, 5, Some(&c)).is_none(), "flip at {i} accepted");
        }
        // A flip that keeps the crc right (the crc field recomputed) is still caught by the tag.
        let mut b = buf.clone();
        b[HEADER_LEN + 3] ^= 1;
        let fixed = recompute_crc(&b, 5, true).unwrap();
        b[4..8].copy_from_slice(&fixed.to_le_bytes());
        assert!(decode(&b, 5, Some(&c)).is_none());
        // A clear record is not accepted on a sealed device.
        let mut clear = Vec::new();
        encode_into(&mut clear, 5, &meta(1), STAMP, b"k", b"v");
        assert!(decode(&clear, 5, Some(&c)).is_none());
    }

    /// The instruction cost of sealing, for callgrind (`docs/adr/0050`): encodes 2,000 records
    /// of 4 KiB, sealed when `RINGSTORE_SEAL_COST=sealed`, in clear otherwise; the difference of
    /// two runs' totals over 2,000 is the seal's cost per record.
    #[test]
    #[ignore = "a measurement: run under valgrind --tool=callgrind"]
    fn seal_cost_per_4k_record() {
        let sealed = std::env::var("RINGSTORE_SEAL_COST").is_ok_and(|v| v == "sealed");
        let mut s = Sealer::new(crypt(1));
        let value = vec![0x5Au8; 4096];
        let mut out = Vec::with_capacity(8192);
        let mut crc = 0;
        for i in 0..2000u64 {
            out.clear();
            crc = if sealed {
                seal(&mut out, &mut s, crc, &meta(i), b"key-0000000001", &value)
            } else {
                encode_into(&mut out, crc, &meta(i), STAMP, b"key-0000000001", &value)
            };
        }
        assert!(out.len() >= 4096);
    }

    #[test]
    fn sealed_records_chain_and_scan() {
        let c = crypt(3);
        let mut s = Sealer::new(c.clone());
        let mut seg = Vec::new();
        let c1 = seal(&mut seg, &mut s, 1, &meta(1), b"a", b"x");
        seg.resize(512, 0);
        let c2 = seal(&mut seg, &mut s, c1, &meta(2), b"b", b"");
        seg.resize(2048, 0);
        let mut seen = Vec::new();
        let (end, crc) = scan(&seg, 0, 1, 512, Some(&c), |off, r| {
            seen.push((off, r.meta.seq))
        });
        assert_eq!(seen, vec![(0, 1), (512, 2)]);
        assert_eq!((end, crc), (512 + sealed_len(1, 0), c2));
    }

    #[test]
    fn a_head_is_not_authenticated_but_its_record_is() {
        // What `scan_heads` promises and no more: a sealed record whose ciphertext was changed
        // and its crc forged to match still has a head (its key garbled), but never decodes,
        // so compaction, which decodes every record it keeps, gives up rather than copy it.
        let c = crypt(3);
        let mut s = Sealer::new(c.clone());
        let mut rec = Vec::new();
        seal(&mut rec, &mut s, 1, &meta(1), b"key", b"value");
        rec[HEADER_LEN + BODY_HEAD] ^= 1; // the key's first byte
        let body_len = le32(&rec, 12) as usize;
        let forged = sealed_crc(1, &rec[..HEADER_LEN + body_len + TAG_LEN]);
        rec[4..8].copy_from_slice(&forged.to_le_bytes());
        let h = head(&rec, 1, Some(&c)).unwrap();
        assert_eq!(&*h.key, b"jey");
        assert!(decode(&rec, 1, Some(&c)).is_none());
        // A flip the crc catches ends the walk for both.
        rec[HEADER_LEN + BODY_HEAD + 1] ^= 1;
        assert!(head(&rec, 1, Some(&c)).is_none());
        let (end, _) = scan_heads(&rec, 0, 1, 512, Some(&c), |_, _| panic!("no head"));
        assert_eq!(end, 0);
    }

    #[test]
    fn scan_heads_walks_what_scan_walks() {
        let c = crypt(3);
        let mut s = Sealer::new(c.clone());
        let mut seg = Vec::new();
        let c1 = seal(&mut seg, &mut s, 1, &meta(1), b"a", &[7; 3000]);
        seg.resize(seg.len().div_ceil(512) * 512, 0); // the batch's padding
        let c2 = seal(&mut seg, &mut s, c1, &meta(2), b"bb", b"");
        seal(&mut seg, &mut s, c2, &meta(3), &[b'c'; 200], b"v");
        seg.resize(8192, 0);
        let (mut full, mut heads) = (Vec::new(), Vec::new());
        let a = scan(&seg, 0, 1, 512, Some(&c), |o, r| {
            full.push((o, r.meta, r.key.to_vec(), r.len))
        });
        let b = scan_heads(&seg, 0, 1, 512, Some(&c), |o, r| {
            heads.push((o, r.meta, r.key.to_vec(), r.len))
        });
        assert_eq!(full.len(), 3);
        assert_eq!((full, a), (heads, b));
    }

    const STAMP: Stamp = Stamp {
        tag: 0xA55A,
        durable: 4096,
    };

    fn meta(seq: u64) -> RecordMeta {
        RecordMeta {
            kind: RecordKind::Value,
            flags: 7,
            exptime: 99,
            cas: 42,
            seq,
        }
    }

    #[test]
    fn chain_rejects_wrong_seed_and_flipped_bits() {
        let mut buf = Vec::new();
        let c = encode_into(&mut buf, 5, &meta(1), STAMP, b"key", b"value");
        let r = decode(&buf, 5, None).unwrap();
        assert_eq!(
            (&*r.key, &*r.value, r.crc, r.len),
            (&b"key"[..], &b"value"[..], c, 56)
        );
        assert!(decode(&buf, 6, None).is_none());
        for i in 0..(HEADER_LEN + 8) {
            let mut b = buf.clone();
            b[i] ^= 0x10;
            assert!(decode(&b, 5, None).is_none(), "flip at {i} accepted");
        }
        assert!(decode(&buf[..40], 5, None).is_none());
    }

    #[test]
    fn scan_skips_padding_and_stops_at_hole() {
        let block = 512;
        let mut seg = Vec::new();
        let c1 = encode_into(&mut seg, 1, &meta(1), STAMP, b"a", b"x");
        seg.resize(512, 0); // batch padding
        let c2 = encode_into(&mut seg, c1, &meta(2), STAMP, b"b", b"y");
        let _c3 = encode_into(&mut seg, c2, &meta(3), STAMP, b"c", b"z");
        seg.resize(2048, 0);
        let mut seen = Vec::new();
        let (end, crc) = scan(&seg, 0, 1, block, None, |off, r| {
            seen.push((off, r.meta.seq))
        });
        assert_eq!(seen, vec![(0, 1), (512, 2), (568, 3)]);
        assert_eq!(end, 624);
        assert_ne!(crc, c2);
        // Wipe record 2 (a torn batch): record 3 is behind a hole and must not appear.
        seg[512..568].fill(0);
        seen.clear();
        let (end, crc) = scan(&seg, 0, 1, block, None, |off, r| {
            seen.push((off, r.meta.seq))
        });
        assert_eq!((seen, end, crc), (vec![(0, 1)], 56, c1));
    }

    proptest! {
        #[test]
        fn roundtrip(key in proptest::collection::vec(any::<u8>(), 0..300),
                     value in proptest::collection::vec(any::<u8>(), 0..3000),
                     flags: u32, exptime: u64, cas: u64, seq: u64, seed: u32, kind in 1u8..=3,
                     tag: u16, durable in 0u32..STAMP_DURABLE_MAX) {
            let kind = RecordKind::from_byte(kind).unwrap();
            let tomb = kind == RecordKind::Tombstone;
            let value = if tomb { Vec::new() } else { value };
            let m = RecordMeta { kind, flags, exptime, cas, seq };
            let mut buf = vec![9u8; 3];
            let stamp = Stamp { tag, durable: durable / 8 * 8 };
            let crc = encode_into(&mut buf, seed, &m, stamp, &key, &value);
            prop_assert_eq!(buf.len() - 3, encoded_len(key.len(), value.len()));
            let r = decode(&buf[3..], seed, None).unwrap();
            prop_assert_eq!(r.meta, m);
            prop_assert_eq!(r.stamp, stamp);
            prop_assert_eq!(&*r.key, &key[..]);
            prop_assert_eq!(&*r.value, &value[..]);
            prop_assert_eq!(r.crc, crc);
        }

        #[test]
        fn sealed_roundtrip(key in proptest::collection::vec(any::<u8>(), 0..300),
                     value in proptest::collection::vec(any::<u8>(), 0..3000),
                     flags: u32, exptime: u64, cas: u64, seq: u64, seed: u32, kind in 1u8..=3) {
            let kind = RecordKind::from_byte(kind).unwrap();
            let value = if kind == RecordKind::Tombstone { Vec::new() } else { value };
            let m = RecordMeta { kind, flags, exptime, cas, seq };
            let c = crypt(9);
            let mut s = Sealer::new(c.clone());
            let mut buf = vec![9u8; 8];
            let crc = seal(&mut buf, &mut s, seed, &m, &key, &value);
            prop_assert_eq!(buf.len() - 8, sealed_len(key.len(), value.len()));
            let r = decode(&buf[8..], seed, Some(&c)).unwrap();
            prop_assert_eq!(r.meta, m);
            prop_assert_eq!(&*r.key, &key[..]);
            prop_assert_eq!(&*r.value, &value[..]);
            prop_assert_eq!(r.crc, crc);
        }

        #[test]
        fn heads_say_what_decode_says(key in proptest::collection::vec(any::<u8>(), 0..300),
                     value in proptest::collection::vec(any::<u8>(), 0..3000),
                     flags: u32, exptime: u64, cas: u64, seq: u64, seed: u32, kind in 1u8..=3,
                     sealed: bool) {
            let kind = RecordKind::from_byte(kind).unwrap();
            let value = if kind == RecordKind::Tombstone { Vec::new() } else { value };
            let m = RecordMeta { kind, flags, exptime, cas, seq };
            let c = crypt(9);
            let mut s = Sealer::new(c.clone());
            let mut buf = Vec::new();
            let crc = if sealed {
                seal(&mut buf, &mut s, seed, &m, &key, &value)
            } else {
                encode_into(&mut buf, seed, &m, STAMP, &key, &value)
            };
            let crypt = sealed.then_some(&*c);
            let r = decode(&buf, seed, crypt).unwrap();
            let h = head(&buf, seed, crypt).unwrap();
            prop_assert_eq!(h.meta, r.meta);
            prop_assert_eq!(&*h.key, &*r.key);
            prop_assert_eq!((h.len, h.crc), (r.len, crc));
            // The chain is checked as by decode: another seed, no head.
            prop_assert!(head(&buf, seed ^ 1, crypt).is_none());
        }

        #[test]
        fn arbitrary_bytes_never_panic_sealed(bytes in proptest::collection::vec(any::<u8>(), 0..2000), seed: u32) {
            let c = crypt(9);
            let _ = decode(&bytes, seed, Some(&c));
            let _ = claimed_len(&bytes, true);
            let _ = recompute_crc(&bytes, seed, true);
            let (end, _) = scan(&bytes, 0, seed, 512, Some(&c), |_, _| ());
            prop_assert!(end <= bytes.len());
            let _ = head(&bytes, seed, Some(&c));
            let (end, _) = scan_heads(&bytes, 0, seed, 512, Some(&c), |_, _| ());
            prop_assert!(end <= bytes.len());
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2000), seed: u32) {
            let _ = decode(&bytes, seed, None);
            let mut n = 0usize;
            let (end, _) = scan(&bytes, 0, seed, 512, None, |_, _| n += 1);
            prop_assert!(end <= bytes.len());
        }
    }
}
