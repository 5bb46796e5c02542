//! Reading one indexed record back from the device: the one place that locates a record from
//! its index entry, reads it and verifies it (crc chain, key, and header against the entry)
//! before decoding it into an [`Item`]. [`crate::Durable::get`] and every read of
//! [`crate::Serving`] (look-ups, chunk reads, start-up warming) go through it.
use crate::crypt::Crypt;
use crate::device::BlockDevice;
use crate::error::DurableError;
use crate::index::{Entry, Loc};
use crate::record::{decode, RecordKind, RecordMeta, RecordView};
use crate::superblock::Geometry;

/// A value read back from the device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item {
    /// Client flags.
    pub flags: u32,
    /// Absolute expiry (Unix seconds), 0 = never.
    pub exptime: u64,
    /// CAS unique.
    pub cas: u64,
    /// Write sequence.
    pub seq: u64,
    /// The value; for a large object (`large`), an encoded [`crate::large::Manifest`].
    pub value: Vec<u8>,
    /// The record is a manifest: the object's bytes are in chunk records.
    pub large: bool,
}

/// Device offset of the record at `loc`.
pub(crate) fn record_offset(g: &Geometry, loc: &Loc) -> u64 {
    g.segment_offset(loc.region, loc.segment) + u64::from(loc.offset)
}

/// The record at the start of `buf`, if it verifies as the one `e` names for `key`: its crc
/// chains after `e.seed` (and its tag verifies under `crypt` on a device with a data key), and
/// its key and header are those the index holds.
pub(crate) fn verify<'a>(
    buf: &'a [u8],
    key: &[u8],
    e: &Entry,
    crypt: Option<&Crypt>,
) -> Option<RecordView<'a>> {
    decode(buf, e.seed, crypt).filter(|r| *r.key == *key && r.meta == e.meta)
}

/// Reads the record `e` names for `key` and returns its value; `None` for a tombstone.
/// `Corrupt` (with the record's offset) when it does not verify.
pub(crate) fn read_entry<D: BlockDevice>(
    dev: &D,
    g: &Geometry,
    key: &[u8],
    e: &Entry,
    crypt: Option<&Crypt>,
) -> Result<Option<Item>, DurableError> {
    if !e.meta.kind.has_value() {
        return Ok(None);
    }
    let offset = record_offset(g, &e.loc);
    let mut buf = vec![0u8; e.loc.len as usize];
    dev.read_at(offset, &mut buf)
        .map_err(|err| DurableError::io(offset, &err))?;
    let rec = verify(&buf, key, e, crypt).ok_or(DurableError::Corrupt { offset })?;
    Ok(Some(Item::from_record(rec)))
}

impl Item {
    /// The value of a record with header `meta`.
    pub(crate) fn new(meta: &RecordMeta, value: Vec<u8>) -> Item {
        Item {
            flags: meta.flags,
            exptime: meta.exptime,
            cas: meta.cas,
            seq: meta.seq,
            value,
            large: meta.kind == RecordKind::Manifest,
        }
    }

    /// The value a verified record holds.
    pub(crate) fn from_record(r: RecordView<'_>) -> Item {
        Item::new(&r.meta, r.value.into_owned())
    }
}
