//! Integer narrowing for values bounded by construction (table indices, slot numbers, buffer
//! lengths), in one place so every crate above sys states the bound the same way. ringstore
//! builds only for 64-bit targets (x86_64, aarch64), asserted here at compile time.

const _: () = assert!(
    usize::BITS == 64,
    "ringstore builds for 64-bit targets only"
);

/// `value`, an index, slot or length its table or buffer bounds below 2^32, as a `u32`
/// (io_uring lengths, slot ids). Checked in debug builds; no branch in release.
#[inline(always)]
#[expect(
    clippy::cast_possible_truncation,
    reason = "callers pass values their tables or buffers bound below 2^32; checked in debug builds"
)]
pub fn u32_of(value: usize) -> u32 {
    debug_assert!(u32::try_from(value).is_ok(), "{value} does not fit in u32");
    value as u32
}

/// `value` as a `usize`: lossless, usize is 64 bits on every target ringstore builds for
/// (asserted above).
#[inline(always)]
#[expect(
    clippy::cast_possible_truncation,
    reason = "usize is 64 bits on every target ringstore builds for (asserted at compile time)"
)]
pub fn usize_of(value: u64) -> usize {
    value as usize
}
