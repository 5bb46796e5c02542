//! The keyspace shared by every worker: items in a huge-page arena, a sharded hash index, eviction and expiry.
//!
//! This crate knows nothing of protocols or sockets. Time is passed in (`now`, seconds
//! since the store's epoch), so tests drive it with a fake clock. Protocol semantics
//! (add vs replace, incr rules, meta-command modes) live in `ringstore-service`, which
//! expresses each command as a read ([`Store::get`]) or a read-decide-write step
//! ([`Store::update`]) that runs under the item's shard lock.
#![forbid(unsafe_code)]

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
}

/// How a read marks the item it finds.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReadOpts {
    /// Set the `fetched` bit and `last_access` (and the eviction policy's access bit).
    pub mark_access: bool,
    /// Change the expiry time (gat / gats / mg T), in store time.
    pub touch: Option<Time>,
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
    /// Store the decimal text of `value` (incr/decr results).
    PutNumber { value: u64, meta: NewMeta },
    /// Existing value followed by `suffix`; requires an existing item.
    Append { suffix: &'v [u8], meta: NewMeta },
    /// `prefix` followed by the existing value; requires an existing item.
    Prepend { prefix: &'v [u8], meta: NewMeta },
    /// Change only metadata of the existing item, in place, without a new CAS unique
    /// unless `new_cas` is set.
    Meta { exptime: Time, stale: bool, win_token_sent: bool, new_cas: bool },
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
    /// Bytes of the arena backed by explicit huge pages.
    pub hugepage_bytes: u64,
    /// Bytes of the arena, whatever backs it.
    pub arena_bytes: u64,
}

/// The keyspace. `Sync`: shared by every worker behind an `Arc`.
pub struct Store {
    _private: (),
}

impl Store {
    /// Allocates the arena (bind the calling thread to the NUMA node first) and an empty index.
    pub fn new(config: StoreConfig) -> Result<Store, StoreError> {
        let _ = config;
        todo!()
    }

    /// What backs the arena.
    pub fn backing(&self) -> Backing {
        todo!()
    }

    /// Looks `key` up and calls `f` with the live item (expired and flushed items are `None`)
    /// while the shard lock is held: `f` must be short (copy the value out).
    pub fn get<R>(&self, key: &[u8], now: Time, opts: ReadOpts, f: impl FnOnce(Option<ItemRef<'_>>) -> R) -> R {
        let _ = (key, now, opts, f);
        todo!()
    }

    /// Read-decide-write under the shard lock: `f` sees the live item (or `None`) and returns
    /// the write to perform and a result for the caller.
    pub fn update<'v, R>(
        &self,
        key: &[u8],
        now: Time,
        f: impl FnOnce(Option<ItemRef<'_>>) -> (Write<'v>, R),
    ) -> Result<Updated<R>, StoreError> {
        let _ = (key, now, f);
        todo!()
    }

    /// `flush_all`: every item stored at or before `at` is invalid once `now >= at`.
    pub fn flush_all(&self, now: Time, at: Time) {
        let _ = (now, at);
        todo!()
    }

    /// Background reaper step: reclaims up to `max_items` expired items; returns how many.
    pub fn reclaim_expired(&self, now: Time, max_items: usize) -> usize {
        let _ = (now, max_items);
        todo!()
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> StoreStats {
        todo!()
    }
}
