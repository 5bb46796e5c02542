//! Conversions between device units (u64 offsets and lengths, u32 offsets inside a segment)
//! and memory units (usize), each with the bound that makes it lossless.
//!
//! Values read off the device are checked where they are decoded (the superblock's geometry,
//! a record's lengths against its buffer); what reaches these helpers is already bounded.

// ringstore runs on 64-bit machines only (x86_64 and aarch64 images): a u64 fits a usize.
const _: () = assert!(usize::BITS >= u64::BITS, "ringstore needs a 64-bit target");

/// `n` (a device length or offset that indexes memory: a segment, a checkpoint body, a
/// block; for the service, a large object's offsets and ranges) as a `usize`.
#[expect(
    clippy::cast_possible_truncation,
    reason = "usize is at least 64 bits (asserted at compile time above)"
)]
#[inline]
pub const fn usize_from(n: u64) -> usize {
    n as usize
}

/// `n`, an offset or length inside one segment (a segment is at most `u32::MAX` bytes:
/// `Geometry::plan` and `Superblock::decode` check it), as the u32 a [`crate::Loc`] holds.
#[expect(
    clippy::cast_possible_truncation,
    reason = "below the segment size, which plan and decode keep at most u32::MAX (asserted)"
)]
#[inline]
pub(crate) fn seg_u32(n: usize) -> u32 {
    debug_assert!(u32::try_from(n).is_ok(), "{n} is past any segment");
    n as u32
}

/// `n`, a count of regions or segments (the geometry holds both as u32), as a u32.
#[expect(
    clippy::cast_possible_truncation,
    reason = "regions and segments per region are u32 in the geometry; a count of them fits (asserted)"
)]
#[inline]
pub(crate) fn count_u32(n: usize) -> u32 {
    debug_assert!(u32::try_from(n).is_ok(), "{n} regions or segments");
    n as u32
}

/// `n`, the length of a key the index holds, as the u16 a record or checkpoint entry stores.
#[expect(
    clippy::cast_possible_truncation,
    reason = "every indexed key came from a record, whose key length is a u16 (KEY_LEN_MAX); asserted"
)]
#[inline]
pub(crate) fn key_len_u16(n: usize) -> u16 {
    debug_assert!(u16::try_from(n).is_ok(), "key of {n} bytes");
    n as u16
}
