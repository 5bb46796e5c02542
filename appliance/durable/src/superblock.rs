//! The superblock at offset 0: magic, format version, device uuid, geometry and checksum;
//! plus detection of blank devices and of other filesystems' signatures.
//!
//! An encrypted device (ADR 0050) is format version 2 (older builds refuse it instead of
//! writing clear records into it): after the version 1 fields, `88 algorithm u32 (1 =
//! AES-256-GCM) | 96 key check value [32] | 128 crc32c of 0..128`. Two epoch slots, at 512 and
//! 1024 of the superblock block (`magic "RSEPOCH1" | 8 epoch u64 | 16 crc32c of 0..16 seeded
//! with the uuid's crc`), hold the open counter that makes nonces unique across opens: an open
//! writes the next epoch into the slot with the older (or invalid) one, so a torn write can
//! only lose the new epoch, never the last one that was made durable.
//!
//! On the appliance the data key is sealed by the TPM (ADR 0053) and the sealed key lives in
//! the superblock block at 2048..3072: `magic "RSTPMKY1" | 8 len u16 | 10 sealed key [len] |
//! 1020 crc32c of 2048..3068`. PID 1 writes it on a blank device before the format, so the key
//! is durable before any record sealed with it; a blank device holding only that area still
//! probes as blank, and the format (with a key) keeps it. `data reseal` writes a one-boot copy
//! (magic "RSTPMRS1", same layout) into the area the key in use is not in; the next boot spends
//! it (ADR 0053).
use crate::error::DurableError;
use crate::units::usize_from;

/// Magic at offset 0 of a ringstore data device.
pub const MAGIC: &[u8; 8] = b"RINGSTOR";
/// The on-disk format version this build reads and writes for a device without a data key.
pub const FORMAT_VERSION: u32 = 1;
/// The format version of a device formatted with a data key (ADR 0050).
pub const FORMAT_VERSION_SEALED: u32 = 2;
/// An encrypted device in the middle of a rekey (ADR 0055): version 2 plus the old key,
/// sealed under the new one. Builds before rekeys refuse it (`Version`) rather than read old
/// records with the new key; the retirement of the old key writes version 2 again.
pub const FORMAT_VERSION_REKEYING: u32 = 3;
/// Where the rekey fields end (their crc follows): `136 from u32 | 140 old key wrapped [48] |
/// 188 old key check [32] | 220 crc32c of 0..220`, all in sector 0 with the key check, so the
/// switch to a new key is one sector write.
const REKEY_LEN: usize = 220;
/// Superblock bytes covered by the second checksum of a sealed device.
const SEALED_LEN: usize = 128;
/// AES-256-GCM, the one algorithm id so far.
const ALG_AES_256_GCM: u32 = 1;
/// Offsets of the two epoch slots inside the superblock block.
pub const EPOCH_SLOTS: [usize; 2] = [512, 1024];
const EPOCH_MAGIC: &[u8; 8] = b"RSEPOCH1";
/// Bytes reserved for the superblock at the start of the device.
pub const SUPERBLOCK_LEN: u64 = 4096;
/// Bytes of the device examined for foreign signatures (covers btrfs at 65600).
pub const PROBE_LEN: usize = 65_600 + 8;
/// Superblock bytes covered by its checksum (the crc follows them).
const BODY_LEN: usize = 80;

/// How the device is cut up. Stored in the superblock; every field is fixed at format time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Alignment of every write, in bytes (512 or 4096).
    pub block_size: u32,
    /// Number of regions (one per writer/worker).
    pub regions: u32,
    /// Segments in each region.
    pub segments_per_region: u32,
    /// Bytes per segment (first block is the segment header).
    pub segment_size: u64,
    /// Start of the checkpoint area.
    pub checkpoint_offset: u64,
    /// Length of the checkpoint area (header block + body).
    pub checkpoint_len: u64,
    /// Start of region 0.
    pub data_offset: u64,
}

impl Geometry {
    /// Lay out a device of `len` bytes. `checkpoint_len` 0 means "choose" (1/8 of the device, at least 64 KiB).
    pub fn plan(
        len: u64,
        regions: u32,
        segment_size: u64,
        block_size: u32,
        checkpoint_len: u64,
    ) -> Result<Geometry, DurableError> {
        if !(block_size == 512 || block_size == 4096) {
            return Err(DurableError::CorruptSuperblock(
                "block size must be 512 or 4096",
            ));
        }
        let bs = u64::from(block_size);
        if regions == 0
            || segment_size < 4 * bs
            || !segment_size.is_multiple_of(bs)
            || segment_size > u64::from(u32::MAX)
        {
            return Err(DurableError::CorruptSuperblock(
                "impossible region/segment geometry",
            ));
        }
        let ckpt = if checkpoint_len == 0 {
            (len / 8).max(64 * 1024)
        } else {
            checkpoint_len
        };
        let ckpt = round_up(ckpt, 4096);
        let data_offset = SUPERBLOCK_LEN + ckpt;
        let per_region = len.saturating_sub(data_offset) / u64::from(regions) / segment_size;
        // Each region needs an active segment, a compaction reserve and something to compact.
        if per_region < 3 {
            let need = data_offset + u64::from(regions) * 3 * segment_size;
            return Err(DurableError::TooSmall { len, need });
        }
        Ok(Geometry {
            block_size,
            regions,
            segments_per_region: u32::try_from(per_region).unwrap_or(u32::MAX),
            segment_size,
            checkpoint_offset: SUPERBLOCK_LEN,
            checkpoint_len: ckpt,
            data_offset,
        })
    }

    /// Device offset of segment `seg` of region `region`.
    pub fn segment_offset(&self, region: u32, seg: u32) -> u64 {
        self.data_offset
            + (u64::from(region) * u64::from(self.segments_per_region) + u64::from(seg))
                * self.segment_size
    }

    /// Total bytes of all regions.
    pub fn data_len(&self) -> u64 {
        u64::from(self.regions) * u64::from(self.segments_per_region) * self.segment_size
    }

    /// [`Self::data_len`], or `None` where it overflows: a superblock read off a device is
    /// hostile even with a valid checksum, so decoding must not multiply blindly.
    fn checked_data_len(&self) -> Option<u64> {
        u64::from(self.regions)
            .checked_mul(u64::from(self.segments_per_region))?
            .checked_mul(self.segment_size)
    }
}

/// Round `v` up to a multiple of `to` (a power of two or any nonzero).
pub fn round_up(v: u64, to: u64) -> u64 {
    v.div_ceil(to) * to
}

/// The decoded superblock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Superblock {
    /// Random id chosen at format; segment headers and checkpoints carry it.
    pub uuid: [u8; 16],
    /// Device length at format time.
    pub device_len: u64,
    /// The layout.
    pub geometry: Geometry,
    /// The key check value of a device formatted with a data key; `None`: records in clear.
    pub key_check: Option<[u8; 32]>,
    /// A rekey whose old key is not retired yet (ADR 0055).
    pub rekey: Option<Rekey>,
}

/// The superblock's record of a rekey in progress: records sealed under an epoch below
/// `from` are under the old key, which is kept sealed under the new one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rekey {
    /// The first epoch sealed under the present key.
    pub from: u32,
    /// The old key, sealed under the present one ([`crate::DataKey::wrap`]).
    pub wrapped: [u8; crate::crypt::WRAPPED_LEN],
    /// The old key's check value: a start with the old key is told it was replaced.
    pub old_check: [u8; 32],
}

impl Superblock {
    /// Encode into a [`SUPERBLOCK_LEN`]-byte block.
    pub fn encode(&self) -> Vec<u8> {
        let g = &self.geometry;
        let mut b = vec![0u8; usize_from(SUPERBLOCK_LEN)];
        b[0..8].copy_from_slice(MAGIC);
        let version = match (&self.key_check, &self.rekey) {
            (Some(_), Some(_)) => FORMAT_VERSION_REKEYING,
            (Some(_), None) => FORMAT_VERSION_SEALED,
            (None, _) => FORMAT_VERSION,
        };
        b[8..12].copy_from_slice(&version.to_le_bytes());
        b[12..16].copy_from_slice(&g.block_size.to_le_bytes());
        b[16..32].copy_from_slice(&self.uuid);
        b[32..40].copy_from_slice(&self.device_len.to_le_bytes());
        b[40..48].copy_from_slice(&g.checkpoint_offset.to_le_bytes());
        b[48..56].copy_from_slice(&g.checkpoint_len.to_le_bytes());
        b[56..60].copy_from_slice(&g.regions.to_le_bytes());
        b[60..64].copy_from_slice(&g.segments_per_region.to_le_bytes());
        b[64..72].copy_from_slice(&g.segment_size.to_le_bytes());
        b[72..80].copy_from_slice(&g.data_offset.to_le_bytes());
        let crc = crc32c::crc32c(&b[..BODY_LEN]);
        b[BODY_LEN..BODY_LEN + 4].copy_from_slice(&crc.to_le_bytes());
        if let Some(check) = &self.key_check {
            b[88..92].copy_from_slice(&ALG_AES_256_GCM.to_le_bytes());
            b[96..SEALED_LEN].copy_from_slice(check);
            let crc = crc32c::crc32c(&b[..SEALED_LEN]);
            b[SEALED_LEN..SEALED_LEN + 4].copy_from_slice(&crc.to_le_bytes());
            if let Some(r) = &self.rekey {
                b[136..140].copy_from_slice(&r.from.to_le_bytes());
                b[140..188].copy_from_slice(&r.wrapped);
                b[188..REKEY_LEN].copy_from_slice(&r.old_check);
                let crc = crc32c::crc32c(&b[..REKEY_LEN]);
                b[REKEY_LEN..REKEY_LEN + 4].copy_from_slice(&crc.to_le_bytes());
            }
        }
        b
    }

    /// The highest valid epoch in the superblock block `b` (0 when neither slot is valid) and
    /// the slot to write the next one into (the other one).
    pub fn epoch(&self, b: &[u8]) -> (u32, usize) {
        let seed = crc32c::crc32c(&self.uuid);
        let read = |at: usize| {
            let s = b.get(at..at + 20)?;
            (&s[..8] == EPOCH_MAGIC && le32(s, 16) == crc32c::crc32c_append(seed, &s[..16]))
                .then(|| le64(s, 8))
        };
        let [a, c] = EPOCH_SLOTS.map(read);
        let newest = a.unwrap_or(0).max(c.unwrap_or(0));
        let slot = if a.unwrap_or(0) <= c.unwrap_or(0) {
            0
        } else {
            1
        };
        (u32::try_from(newest).unwrap_or(u32::MAX), EPOCH_SLOTS[slot])
    }

    /// Writes `epoch` into slot `at` of the superblock block `b`.
    pub fn set_epoch(&self, b: &mut [u8], at: usize, epoch: u32) {
        let seed = crc32c::crc32c(&self.uuid);
        b[at..at + 8].copy_from_slice(EPOCH_MAGIC);
        b[at + 8..at + 16].copy_from_slice(&u64::from(epoch).to_le_bytes());
        let crc = crc32c::crc32c_append(seed, &b[at..at + 16]);
        b[at + 16..at + 20].copy_from_slice(&crc.to_le_bytes());
    }

    /// Decode a superblock whose magic is present; checks version, checksum and geometry.
    pub fn decode(b: &[u8], device_len: u64) -> Result<Superblock, DurableError> {
        if b.len() < BODY_LEN + 4 || &b[0..8] != MAGIC {
            return Err(DurableError::CorruptSuperblock("missing magic"));
        }
        let version = le32(b, 8);
        if ![
            FORMAT_VERSION,
            FORMAT_VERSION_SEALED,
            FORMAT_VERSION_REKEYING,
        ]
        .contains(&version)
        {
            return Err(DurableError::Version {
                found: version,
                supported: FORMAT_VERSION,
            });
        }
        if le32(b, BODY_LEN) != crc32c::crc32c(&b[..BODY_LEN]) {
            return Err(DurableError::CorruptSuperblock("checksum mismatch"));
        }
        let key_check = if version != FORMAT_VERSION {
            if b.len() < SEALED_LEN + 4 || le32(b, SEALED_LEN) != crc32c::crc32c(&b[..SEALED_LEN]) {
                return Err(DurableError::CorruptSuperblock(
                    "key check checksum mismatch",
                ));
            }
            if le32(b, 88) != ALG_AES_256_GCM {
                return Err(DurableError::CorruptSuperblock("unknown data encryption"));
            }
            let mut check = [0u8; 32];
            check.copy_from_slice(&b[96..SEALED_LEN]);
            Some(check)
        } else {
            None
        };
        let rekey = if version == FORMAT_VERSION_REKEYING {
            Some(decode_rekey(b)?)
        } else {
            None
        };
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(&b[16..32]);
        let geometry = Geometry {
            block_size: le32(b, 12),
            checkpoint_offset: le64(b, 40),
            checkpoint_len: le64(b, 48),
            regions: le32(b, 56),
            segments_per_region: le32(b, 60),
            segment_size: le64(b, 64),
            data_offset: le64(b, 72),
        };
        let sb = Superblock {
            uuid,
            device_len: le64(b, 32),
            geometry,
            key_check,
            rekey,
        };
        let g = &sb.geometry;
        let sane = (g.block_size == 512 || g.block_size == 4096)
            && g.regions > 0
            && g.segments_per_region >= 3
            && g.segment_size >= 4 * u64::from(g.block_size)
            && g.segment_size.is_multiple_of(u64::from(g.block_size))
            && g.segment_size <= u64::from(u32::MAX)
            && g.checkpoint_offset == SUPERBLOCK_LEN
            && g.data_offset == SUPERBLOCK_LEN + g.checkpoint_len
            && g.checked_data_len()
                .and_then(|len| g.data_offset.checked_add(len))
                .is_some_and(|end| end <= device_len);
        if !sane {
            return Err(DurableError::CorruptSuperblock(
                "geometry does not fit the device",
            ));
        }
        Ok(sb)
    }
}

fn decode_rekey(b: &[u8]) -> Result<Rekey, DurableError> {
    if b.len() < REKEY_LEN + 4 || le32(b, REKEY_LEN) != crc32c::crc32c(&b[..REKEY_LEN]) {
        return Err(DurableError::CorruptSuperblock("rekey checksum mismatch"));
    }
    let mut r = Rekey {
        from: le32(b, 136),
        wrapped: [0; crate::crypt::WRAPPED_LEN],
        old_check: [0; 32],
    };
    r.wrapped.copy_from_slice(&b[140..188]);
    r.old_check.copy_from_slice(&b[188..REKEY_LEN]);
    Ok(r)
}

/// The superblock block's bytes holding the TPM-sealed data key (ADR 0053): the first of
/// the two [`SEALED_KEY_AREAS`].
pub const SEALED_KEY_AREA: std::ops::Range<usize> = 2048..3072;
/// Two sealed-key areas: a rekey on the appliance (ADR 0055) writes the new key's sealed copy
/// into the one the present key is not in, before the switch.
pub const SEALED_KEY_AREAS: [std::ops::Range<usize>; 2] = [2048..3072, 3072..4096];
/// The longest sealed key an area holds.
pub const SEALED_KEY_MAX: usize = SEALED_KEY_AREA.end - SEALED_KEY_AREA.start - 14 - 32;
const SEALED_KEY_MAGIC: &[u8; 8] = b"RSTPMKY1";
/// The magic of a one-boot copy: builds that do not know it see an empty area.
const ONE_BOOT_MAGIC: &[u8; 8] = b"RSTPMRS1";
/// Where in an area the sealed key's key check value sits (zero: written before the format,
/// when the device had no uuid yet; that is the one key of a device never rekeyed).
const SEALED_CHECK_AT: usize = 1024 - 4 - 32;

/// The sealed key in the first area of superblock block `b`, if it holds a valid one.
pub fn sealed_key(b: &[u8]) -> Option<&[u8]> {
    sealed_key_in(b, 0)
}

/// The sealed key in area `area` (0 or 1) of superblock block `b`, if it holds a valid one.
pub fn sealed_key_in(b: &[u8], area: usize) -> Option<&[u8]> {
    area_holding(b, area, SEALED_KEY_MAGIC)
}

/// The contents of area `area` if it is valid and carries `magic`.
fn area_holding<'a>(b: &'a [u8], area: usize, magic: &[u8; 8]) -> Option<&'a [u8]> {
    let area = b.get(SEALED_KEY_AREAS.get(area)?.clone())?;
    let crc_at = area.len() - 4;
    let len = usize::from(u16::from_le_bytes([area[8], area[9]]));
    (&area[..8] == magic
        && len <= SEALED_KEY_MAX
        && le32(area, crc_at) == crc32c::crc32c(&area[..crc_at]))
    .then(|| &area[10..10 + len])
}

/// A one-boot copy of the data key (`data reseal`, ADR 0053) in the superblock block `b`:
/// its area, its bytes and the key check value of the key it holds. At most one area holds
/// one: it is written only into the area the key in use is not in.
pub fn one_boot_key(b: &[u8]) -> Option<(usize, &[u8], [u8; 32])> {
    (0..SEALED_KEY_AREAS.len()).find_map(|a| {
        let key = area_holding(b, a, ONE_BOOT_MAGIC)?;
        Some((a, key, check_beside(b, a)?))
    })
}

/// The key check value stored in area `area`, whatever the area holds.
fn check_beside(b: &[u8], area: usize) -> Option<[u8; 32]> {
    let at = SEALED_KEY_AREAS.get(area)?.start + SEALED_CHECK_AT;
    b.get(at..at + 32)?.try_into().ok()
}

/// Writes a one-boot copy `key` of the key whose check value is `check` into area `area`.
pub fn set_one_boot_key(
    b: &mut [u8],
    area: usize,
    key: &[u8],
    check: [u8; 32],
) -> Result<(), DurableError> {
    set_area(b, area, ONE_BOOT_MAGIC, key, check)
}

/// Zeroes area `area` of superblock block `b` (a spent or cancelled one-boot copy).
pub fn clear_area(b: &mut [u8], area: usize) {
    if let Some(range) = SEALED_KEY_AREAS.get(area) {
        b[range.clone()].fill(0);
    }
}

/// The sealed copy of the key whose check value is `key_check` (the superblock's; `None`
/// before the format): the area carrying that check, else the one carrying none (sealed
/// before the format, the one key of a device never rekeyed). During a rekey both areas hold
/// a key; the superblock's check says which one the device is under (ADR 0055).
pub fn sealed_key_for(b: &[u8], key_check: Option<[u8; 32]>) -> Option<&[u8]> {
    let areas = 0..SEALED_KEY_AREAS.len();
    let exact = key_check.and_then(|c| areas.clone().find(|&a| sealed_key_check(b, a) == Some(c)));
    let area = exact.or_else(|| {
        areas
            .clone()
            .find(|&a| sealed_key_check(b, a) == Some([0; 32]))
    })?;
    sealed_key_in(b, area)
}

/// The key check value stored beside the sealed key of area `area` (all zero: the key sealed
/// before the format); `None` when the area holds no valid sealed key.
pub fn sealed_key_check(b: &[u8], area: usize) -> Option<[u8; 32]> {
    sealed_key_in(b, area)?;
    check_beside(b, area)
}

/// Writes `key` into the first sealed-key area of superblock block `b` (at least 4096 bytes).
pub fn set_sealed_key(b: &mut [u8], key: &[u8]) -> Result<(), DurableError> {
    set_sealed_key_in(b, 0, key, [0; 32])
}

/// Writes `key`, whose key check value is `check`, into area `area` of superblock block `b`.
pub fn set_sealed_key_in(
    b: &mut [u8],
    area: usize,
    key: &[u8],
    check: [u8; 32],
) -> Result<(), DurableError> {
    set_area(b, area, SEALED_KEY_MAGIC, key, check)
}

fn set_area(
    b: &mut [u8],
    area: usize,
    magic: &[u8; 8],
    key: &[u8],
    check: [u8; 32],
) -> Result<(), DurableError> {
    let len = u16::try_from(key.len())
        .ok()
        .filter(|_| key.len() <= SEALED_KEY_MAX)
        .ok_or(DurableError::CorruptSuperblock("sealed key too long"))?;
    let range = SEALED_KEY_AREAS
        .get(area)
        .ok_or(DurableError::CorruptSuperblock("no such sealed-key area"))?;
    let area = &mut b[range.clone()];
    area.fill(0);
    area[..8].copy_from_slice(magic);
    area[8..10].copy_from_slice(&len.to_le_bytes());
    area[10..10 + key.len()].copy_from_slice(key);
    area[SEALED_CHECK_AT..SEALED_CHECK_AT + 32].copy_from_slice(&check);
    let crc_at = area.len() - 4;
    let crc = crc32c::crc32c(&area[..crc_at]);
    area[crc_at..].copy_from_slice(&crc.to_le_bytes());
    Ok(())
}

/// What the first bytes of a device say it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    /// All zero and no signature: safe to format.
    Blank,
    /// Carries the ringstore magic (decode it to check version and checksum).
    Ringstore,
    /// Another filesystem, swap or partition table.
    Foreign(&'static str),
    /// Nonzero bytes with no known signature.
    Unknown,
}

/// Classify a device from its first [`PROBE_LEN`] bytes (fewer if the device is shorter).
pub fn probe(head: &[u8]) -> Probe {
    let at = |off: usize, sig: &[u8]| {
        head.len() >= off + sig.len() && &head[off..off + sig.len()] == sig
    };
    if at(0, MAGIC) {
        return Probe::Ringstore;
    }
    if at(1080, &0xEF53u16.to_le_bytes()) {
        return Probe::Foreign("ext2/3/4");
    }
    if at(0, b"XFSB") {
        return Probe::Foreign("XFS");
    }
    if at(65_600, b"_BHRfS_M") {
        return Probe::Foreign("btrfs");
    }
    if at(4086, b"SWAPSPACE2") || at(4086, b"SWAP-SPACE") {
        return Probe::Foreign("swap");
    }
    if at(512, b"EFI PART") {
        return Probe::Foreign("GPT");
    }
    if at(510, &[0x55, 0xAA]) && (0..4).any(|i| head[446 + i * 16 + 4] != 0) {
        return Probe::Foreign("MBR partition table");
    }
    let first = &head[..head.len().min(usize_from(SUPERBLOCK_LEN))];
    // A sealed key written ahead of the format (ADR 0053) leaves the device blank.
    let waiting = sealed_key(first).is_some();
    let blank = |(i, &b): (usize, &u8)| b == 0 || (waiting && SEALED_KEY_AREA.contains(&i));
    if first.iter().enumerate().all(blank) {
        Probe::Blank
    } else {
        Probe::Unknown
    }
}

pub(crate) fn le32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

pub(crate) fn le64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// A fresh random uuid (std's randomly keyed hasher mixed with time and pid; no extra crate needed).
pub fn new_uuid() -> [u8; 16] {
    use std::hash::{BuildHasher, Hasher};
    let mut out = [0u8; 16];
    for (i, chunk) in out.chunks_mut(8).enumerate() {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_usize(i);
        h.write_u32(std::process::id());
        if let Ok(t) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
            h.write_u128(t.as_nanos());
        }
        chunk.copy_from_slice(&h.finish().to_le_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geo() -> Geometry {
        Geometry::plan(1 << 20, 2, 64 * 1024, 512, 0).unwrap()
    }

    #[test]
    fn superblock_roundtrip_and_corruption() {
        let sb = Superblock {
            uuid: new_uuid(),
            device_len: 1 << 20,
            geometry: geo(),
            key_check: None,
            rekey: None,
        };
        let mut b = sb.encode();
        assert_eq!(Superblock::decode(&b, 1 << 20).unwrap(), sb);
        assert!(matches!(
            Superblock::decode(&b, 1 << 19),
            Err(DurableError::CorruptSuperblock(_))
        ));
        b[20] ^= 1;
        assert!(matches!(
            Superblock::decode(&b, 1 << 20),
            Err(DurableError::CorruptSuperblock(_))
        ));
        b[8] = 9;
        assert!(matches!(
            Superblock::decode(&b, 1 << 20),
            Err(DurableError::Version { found: 9, .. })
        ));
    }

    fn sealed() -> Superblock {
        Superblock {
            uuid: new_uuid(),
            device_len: 1 << 20,
            geometry: geo(),
            key_check: Some([7; 32]),
            rekey: None,
        }
    }

    #[test]
    fn sealed_superblock_is_version_2_with_a_checked_key_check() {
        let sb = sealed();
        let mut b = sb.encode();
        assert_eq!(le32(&b, 8), FORMAT_VERSION_SEALED);
        assert_eq!(Superblock::decode(&b, 1 << 20).unwrap(), sb);
        b[100] ^= 1;
        assert!(matches!(
            Superblock::decode(&b, 1 << 20),
            Err(DurableError::CorruptSuperblock(_))
        ));
    }

    #[test]
    fn a_rekeying_superblock_is_version_3_and_keeps_the_old_key_in_sector_0() {
        let mut sb = sealed();
        sb.rekey = Some(Rekey {
            from: 7,
            wrapped: [3; crate::crypt::WRAPPED_LEN],
            old_check: [4; 32],
        });
        let mut b = sb.encode();
        assert_eq!(le32(&b, 8), FORMAT_VERSION_REKEYING);
        assert!(b[512..].iter().all(|&x| x == 0), "all of it in sector 0");
        assert_eq!(Superblock::decode(&b, 1 << 20).unwrap(), sb);
        b[150] ^= 1;
        assert!(matches!(
            Superblock::decode(&b, 1 << 20),
            Err(DurableError::CorruptSuperblock(_))
        ));
    }

    #[test]
    fn two_sealed_key_areas_each_with_its_key_check() {
        let mut b = vec![0u8; 4096];
        set_sealed_key(&mut b, b"first").unwrap();
        assert_eq!(sealed_key_check(&b, 0), Some([0; 32]));
        assert_eq!(sealed_key_in(&b, 1), None);
        set_sealed_key_in(&mut b, 1, b"second", [9; 32]).unwrap();
        assert_eq!(sealed_key_in(&b, 0), Some(&b"first"[..]));
        assert_eq!(sealed_key_in(&b, 1), Some(&b"second"[..]));
        assert_eq!(sealed_key_check(&b, 1), Some([9; 32]));
        b[3500] ^= 1;
        assert_eq!(sealed_key_in(&b, 1), None);
        assert!(set_sealed_key_in(&mut b, 2, b"x", [0; 32]).is_err());
        b[3500] ^= 1;
        // Which one boots: the area with the superblock's check, else the one sealed before
        // the format (no check).
        assert_eq!(sealed_key_for(&b, Some([9; 32])), Some(&b"second"[..]));
        assert_eq!(sealed_key_for(&b, Some([8; 32])), Some(&b"first"[..]));
        assert_eq!(sealed_key_for(&b, None), Some(&b"first"[..]));
        set_sealed_key_in(&mut b, 0, b"third", [8; 32]).unwrap();
        assert_eq!(sealed_key_for(&b, Some([8; 32])), Some(&b"third"[..]));
        assert_eq!(sealed_key_for(&b, Some([7; 32])), None);
        assert!(set_sealed_key_in(&mut b, 1, &[0; SEALED_KEY_MAX + 1], [0; 32]).is_err());
    }

    #[test]
    fn a_one_boot_copy_is_told_apart_from_a_sealed_key() {
        let mut b = vec![0u8; 4096];
        set_sealed_key_in(&mut b, 0, b"normal", [8; 32]).unwrap();
        assert_eq!(one_boot_key(&b), None);
        set_one_boot_key(&mut b, 1, b"pending", [8; 32]).unwrap();
        assert_eq!(one_boot_key(&b), Some((1, &b"pending"[..], [8; 32])));
        // Never taken for the key in use, whatever check value is asked for.
        assert_eq!(sealed_key_in(&b, 1), None);
        assert_eq!(sealed_key_for(&b, Some([8; 32])), Some(&b"normal"[..]));
        assert_eq!(sealed_key_for(&b, Some([7; 32])), None);
        // A torn one (half of its two sectors old) is no copy.
        b[3100] ^= 1;
        assert_eq!(one_boot_key(&b), None);
        b[3100] ^= 1;
        clear_area(&mut b, 1);
        assert_eq!(one_boot_key(&b), None);
        assert_eq!(sealed_key_in(&b, 0), Some(&b"normal"[..]));
        clear_area(&mut b, 2);
    }

    #[test]
    fn epoch_slots_alternate_and_survive_a_torn_slot() {
        let sb = sealed();
        let mut b = sb.encode();
        assert_eq!(sb.epoch(&b), (0, EPOCH_SLOTS[0]));
        let mut slots = Vec::new();
        for want in 1..=4u32 {
            let (e, at) = sb.epoch(&b);
            assert_eq!(e + 1, want);
            sb.set_epoch(&mut b, at, want);
            slots.push(at);
        }
        assert_eq!(slots, [512, 1024, 512, 1024]);
        // The write of epoch 5 tears: its slot is garbage, epoch 4 is still there, and the
        // next write goes to the torn slot again.
        let (_, at) = sb.epoch(&b);
        b[at + 9] ^= 0xFF;
        assert_eq!(sb.epoch(&b), (4, at));
        // The superblock itself still decodes: the slots are outside its checksums.
        assert_eq!(Superblock::decode(&b, 1 << 20).unwrap(), sb);
        // Another device's slots do not count.
        let other = Superblock {
            uuid: new_uuid(),
            ..sb
        };
        assert_eq!(other.epoch(&b).0, 0);
    }

    #[test]
    fn a_checksummed_geometry_that_overflows_is_refused_not_wrapped() {
        // Every field passes its own check and the checksum is valid, but regions ×
        // segments × segment size is past u64: decode must refuse it, never wrap.
        let mut geometry = geo();
        geometry.regions = u32::MAX;
        geometry.segments_per_region = u32::MAX;
        geometry.segment_size = u64::from(u32::MAX) & !511;
        let sb = Superblock {
            uuid: new_uuid(),
            device_len: u64::MAX,
            geometry,
            key_check: None,
            rekey: None,
        };
        assert!(matches!(
            Superblock::decode(&sb.encode(), u64::MAX),
            Err(DurableError::CorruptSuperblock(_))
        ));
    }

    #[test]
    fn geometry_fits_and_rejects_tiny_devices() {
        let g = geo();
        assert!(g.data_offset + g.data_len() <= 1 << 20);
        assert_eq!(
            g.segment_offset(1, 0),
            g.data_offset + u64::from(g.segments_per_region) * 65536
        );
        assert!(matches!(
            Geometry::plan(100_000, 2, 64 * 1024, 512, 0),
            Err(DurableError::TooSmall { .. })
        ));
    }

    #[test]
    fn probe_finds_signatures() {
        let blank = vec![0u8; PROBE_LEN];
        assert_eq!(probe(&blank), Probe::Blank);
        let cases: [(usize, &[u8], &str); 7] = [
            (1080, &[0x53, 0xEF], "ext2/3/4"),
            (0, b"XFSB", "XFS"),
            (65_600, b"_BHRfS_M", "btrfs"),
            (4086, b"SWAPSPACE2", "swap"),
            (4086, b"SWAP-SPACE", "swap"),
            (512, b"EFI PART", "GPT"),
            (510, &[0x55, 0xAA], "MBR partition table"),
        ];
        for (off, sig, name) in cases {
            let mut b = blank.clone();
            b[off..off + sig.len()].copy_from_slice(sig);
            if name.starts_with("MBR") {
                assert_eq!(
                    probe(&b),
                    Probe::Unknown,
                    "boot signature alone is not a partition table"
                );
                b[446 + 4] = 0x83;
            }
            assert_eq!(probe(&b), Probe::Foreign(name));
        }
        let mut junk = blank.clone();
        junk[100] = 1;
        assert_eq!(probe(&junk), Probe::Unknown);
        assert_eq!(probe(&[]), Probe::Blank);
        assert_eq!(probe(MAGIC), Probe::Ringstore);
    }
}
