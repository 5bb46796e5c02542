//! The keyspace shared by every worker: items in a huge-page arena, a sharded hash index, eviction and expiry.
//!
//! This crate knows nothing of protocols or sockets. Time is passed in (`now`, seconds
//! since the store's epoch), so tests drive it with a fake clock. Protocol semantics
//! (add vs replace, incr rules, meta-command modes) live in `ringstore-service`, which
//! expresses each command as a read ([`Store::get`]) or a read-decide-write step
//! ([`Store::update`]) that runs under the item's shard lock.
#![forbid(unsafe_code)]

mod arena;
mod contention;
mod durability;
mod evictions;
mod index;
mod item;
mod pin;
mod pool;
mod shard;
mod store;
mod tier;

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

pub use durability::{Backfill, Fetched, Journal, Mutation};
pub use evictions::{Evicted, EvictionLog};
pub use pin::{Pin, PinRequest};

pub use arena::BindFn;
pub use contention::{snapshot as contention_snapshot, Contention};
use item::{Header, NewItem};
use shard::{Shard, Shared};
pub use store::{
    DumpCursor, DumpItem, Journaled, Outcome, Region, Reservation, Restart, SealReport, Store,
    WallTime, FORMAT_VERSION,
};
pub use tier::{RegionStats, SubRegion, PROMOTE_SCORE, SCORE_HALF_LIFE_SECS};

/// Longest key the store accepts, in bytes (keys are stored with an 8-bit length; memcache
/// and HTTP keys are at most 250). Longer keys are never found and writing one is
/// [`StoreError::TooLarge`].
pub const KEY_LEN_MAX: usize = u8::MAX as usize;

/// Largest `item_size_max` a store accepts (offsets inside a segment are 32-bit).
pub const ITEM_SIZE_MAX_LIMIT: usize = 1 << 30;

/// Most keys one [`Store::prefetch`] call loads ahead (a batch's first 32 requests; the rest
/// are looked up without it).
pub const PREFETCH_MAX: usize = 32;

/// Seconds since the store's epoch (the moment the server started), like memcached's `rel_time_t`.
pub type Time = u32;

/// Expiry time meaning "never expires".
pub const NEVER: Time = 0;

/// Configuration of a [`Store`]. Every limit is explicit.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// Hard budget in bytes for items plus their metadata (the index included).
    pub memory_bytes: usize,
    /// Largest item value accepted, in bytes (memcached's `-I`, 1 MiB by default).
    pub item_size_max: usize,
    /// Number of lock shards (a power of two).
    pub shards: usize,
    /// Try to back the arena with 2 MiB huge pages (MAP_HUGETLB), falling back to
    /// transparent huge pages, then normal pages.
    pub huge_pages: bool,
    /// With a data device (journal and backfill attached), values of at least this many
    /// bytes keep only their key and header in RAM and are read from the device on access
    /// (extstore-like); 0 = off. Large objects are never external.
    pub external_threshold: usize,
}

/// What the arena ended up backed by; reported once in the log and in `stats`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backing {
    /// Explicit 2 MiB huge pages (MAP_HUGETLB).
    HugeTlb,
    /// Normal pages with `MADV_HUGEPAGE` (transparent huge pages, best effort).
    TransparentHuge,
    /// Normal 4 KiB pages.
    Normal,
}

/// A live item, borrowed from the arena while its shard lock is held.
#[derive(Debug, Clone, Copy)]
pub struct ItemRef<'a> {
    pub key: &'a [u8],
    pub value: &'a [u8],
    /// Opaque client flags (memcache `flags`, HTTP `X-Flags`).
    pub flags: u32,
    /// Absolute expiry in store time, or [`NEVER`].
    pub exptime: Time,
    /// CAS unique; unique across the store, never reused.
    pub cas: u64,
    /// Last time the item was read or written.
    pub last_access: Time,
    /// Whether the item has been read since it was stored (meta `h` flag).
    pub fetched: bool,
    /// Marked stale by a meta invalidation (`md I`, `ms I`).
    pub stale: bool,
    /// A meta "win" token has already been handed out for this item.
    pub win_token_sent: bool,
    /// `value` is a large object's manifest (head in RAM, the rest on the data device).
    pub large: bool,
}

/// How a read marks the item it finds.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReadOpts {
    /// Set the `fetched` bit and `last_access` (and the eviction policy's access bit).
    pub mark_access: bool,
    /// Change the expiry time (gat / gats / mg T), in store time.
    pub touch: Option<Time>,
    /// Show large objects (their manifest, [`ItemRef::large`]); otherwise a large object
    /// reads as absent: it is larger than any memcache item (HTTP sets this).
    pub see_large: bool,
}

/// Metadata written with a new value.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NewMeta {
    pub flags: u32,
    /// Absolute expiry in store time, or [`NEVER`].
    pub exptime: Time,
    /// Explicit CAS unique to store (meta `ms E`); `None` allocates a fresh one.
    pub cas: Option<u64>,
}

/// The decision a caller of [`Store::update`] takes after seeing the current item.
#[derive(Debug, Clone, Copy)]
pub enum Write<'v> {
    /// Leave everything as it is.
    Nothing,
    /// Store `value` under the key (create or overwrite).
    Put { value: &'v [u8], meta: NewMeta },
    /// Store a large object's manifest under the key: its chunks are already durable on the
    /// data device (only with a journal attached).
    PutLarge { manifest: &'v [u8], meta: NewMeta },
    /// Store the decimal text of `value` (incr/decr results).
    PutNumber { value: u64, meta: NewMeta },
    /// Existing value followed by `suffix`; requires an existing item.
    Append { suffix: &'v [u8], meta: NewMeta },
    /// `prefix` followed by the existing value; requires an existing item.
    Prepend { prefix: &'v [u8], meta: NewMeta },
    /// Change only metadata of the existing item, in place, without a new CAS unique
    /// unless `new_cas` is set.
    Meta {
        exptime: Time,
        stale: bool,
        win_token_sent: bool,
        new_cas: bool,
    },
    /// [`Write::Meta`] that gives the item the CAS unique `cas` (meta `E` flag, memcached
    /// 1.6.21+).
    MetaWithCas {
        exptime: Time,
        stale: bool,
        win_token_sent: bool,
        cas: u64,
    },
    /// Store `value` marked stale, keeping the win-token mark given (meta `ms I` with a
    /// CAS older than the item's: memcached keeps the old TTL, marks the new value stale).
    PutStale {
        value: &'v [u8],
        meta: NewMeta,
        win_token_sent: bool,
    },
    /// Remove the item.
    Delete,
}

/// What [`Store::update`] returns besides the caller's own result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Updated<R> {
    /// The caller's result from its decision closure.
    pub result: R,
    /// The CAS unique of the item after the write, when something was written.
    pub cas: Option<u64>,
}

/// Why a write could not be done.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    #[error("object too large for cache")]
    TooLarge,
    #[error("out of memory storing object")]
    OutOfMemory,
    /// The data device has no room for the record (`data-full refuse`, ADR 0039).
    #[error("data device full storing object")]
    DeviceFull,
    #[error("invalid store configuration: {0}")]
    Config(String),
}

/// Counters of the keyspace, as reported by memcache `stats`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreStats {
    pub curr_items: u64,
    pub total_items: u64,
    /// Bytes used by live items (key + value + item header).
    pub bytes: u64,
    pub limit_maxbytes: u64,
    pub evictions: u64,
    /// Expired items reclaimed by the background reaper or on access.
    pub reclaimed: u64,
    pub expired_unfetched: u64,
    pub evicted_unfetched: u64,
    /// Look-ups (reads and writes) that found their item expired (memcached `get_expired`).
    pub get_expired: u64,
    /// Look-ups of a key the last flush_all removed, for up to 8 keys per lock shard
    /// (memcached `get_flushed`).
    pub get_flushed: u64,
    /// Bytes of the arena backed by explicit huge pages.
    pub hugepage_bytes: u64,
    /// Bytes of the arena, whatever backs it.
    pub arena_bytes: u64,
    /// Bytes of segments in use (items, their garbage and unfilled tails); with
    /// `index_bytes` this is what the budget `limit_maxbytes` bounds.
    pub segment_bytes: u64,
    /// Bytes of the hash index.
    pub index_bytes: u64,
    /// Values of external items (key and header in RAM, value on the device) read from
    /// the device.
    pub external_reads: u64,
    /// External items dropped because the device no longer had their value (RAM is only a
    /// cache of the device; they read as absent).
    pub external_lost: u64,
    /// Segments holding pinned values (a zero-copy send in flight), orphans included;
    /// at most an eighth of the arena (`pin.rs`).
    pub pinned_segments: u64,
    /// Of those, segments whose items are gone (evicted, overwritten, deleted, flushed),
    /// kept only until their last pin is released; counted in `segment_bytes`.
    pub orphaned_segments: u64,
    /// Pins granted since start.
    pub pins_granted: u64,
    /// Pins refused because `pinned_segments` was at its cap (the value was copied).
    pub pins_refused: u64,
    /// Bytes of one segment (`stats slabs`: a page).
    pub segment_size: u64,
    /// Bytes never written at the ends of the segments shards hold (`stats slabs`'
    /// `free_chunks_end`).
    pub unwritten_bytes: u64,
    // NUMA sub memory (issue 23, ADR 0035); all zero without sub regions.
    /// Bytes of live items in the local region (`bytes` split by where they are).
    pub numa_local_bytes: u64,
    /// Bytes of live items in the sub regions on other nodes.
    pub numa_foreign_bytes: u64,
    /// Reads that found their item in the local region.
    pub get_hits_local: u64,
    /// Reads that found their item in a sub region (these count toward its score).
    pub get_hits_foreign: u64,
    /// Items copied from a sub region to the local one (their score crossed the threshold).
    pub numa_promotions: u64,
    /// Items copied from the local region to a sub region instead of being evicted.
    pub numa_demotions: u64,
    /// CPU time the background exchange has used ([`Store::add_exchange_cpu`]).
    pub numa_exchange_cpu_usec: u64,
}

#[cfg(test)]
mod durability_tests;
#[cfg(test)]
#[expect(
    clippy::cast_possible_truncation,
    reason = "test value patterns take the low byte of an index on purpose"
)]
mod external_tests;
#[cfg(test)]
mod persist_tests;
#[cfg(test)]
#[expect(
    clippy::cast_possible_truncation,
    reason = "test value patterns take the low byte of an index on purpose"
)]
mod pin_tests;
#[cfg(test)]
#[expect(
    clippy::cast_possible_truncation,
    reason = "test value patterns take the low byte of an index on purpose"
)]
mod reserve_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
#[expect(
    clippy::cast_possible_truncation,
    reason = "test value patterns take the low byte of an index on purpose"
)]
mod tier_tests;
