//! The seams a data device plugs into: a [`Journal`] that sees every mutation before the RAM
//! copy changes, and a [`Backfill`] that supplies items RAM does not hold (RAM is a cache of
//! the device). Both are optional; without them the store does no extra work.
use crate::{StoreError, Time};

/// One mutation, as the journal must log it: always the item's complete new state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mutation<'a> {
    /// The key now holds this value (set, add, cas, append, incr, touch, meta changes...).
    Put {
        key: &'a [u8],
        value: &'a [u8],
        flags: u32,
        /// Absolute expiry in store time, or [`crate::NEVER`].
        exptime: Time,
        cas: u64,
        /// `value` is a large object's manifest; its chunks were staged and made durable
        /// before, through the service's device handle.
        large: bool,
    },
    /// The key is gone.
    Delete { key: &'a [u8] },
    /// Everything written before this is invalid from store time `at` on.
    FlushAll { at: Time },
}

/// Receives every mutation, under the key's shard lock, before RAM changes: the order of
/// records for one key is the order of its writes. An error refuses the write (RAM unchanged).
///
/// Sans-IO: an implementation stages bytes; it never blocks. It is handed to the store per
/// call ([`crate::Store::journaled`]), so it knows which connection and which worker's log a
/// record belongs to without any shared or thread-local state.
pub trait Journal {
    /// Stage `m`; `Err` (device full, too many pending writes) refuses the request.
    fn record(&self, m: Mutation<'_>) -> Result<(), StoreError>;
}

/// An item read back from the device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetched {
    pub value: Vec<u8>,
    pub flags: u32,
    /// Absolute expiry in store time, or [`crate::NEVER`].
    pub exptime: Time,
    pub cas: u64,
    /// `value` is a large object's manifest.
    pub large: bool,
}

/// Supplies a key RAM does not hold. Called under the key's shard lock (so no write to the
/// key can race it); may block on a device read.
pub trait Backfill: Send + Sync {
    /// The key's current durable (or staged) value, if it has one and it is live at `now`.
    fn fetch(&self, key: &[u8], now: Time) -> Option<Fetched>;
}
