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
        /// before (see [`Journal::stage_chunk`]).
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
/// Sans-IO: an implementation stages bytes and reports what it staged; it never blocks.
pub trait Journal: Send + Sync {
    /// Stage `m`; `Err` (device full, too many pending writes) refuses the request.
    fn record(&self, m: Mutation<'_>) -> Result<(), StoreError>;
    /// Records staged so far by the calling thread (a monotonic count).
    fn staged(&self) -> u64;
    /// The reply to the records the calling thread staged since the count was `since` is
    /// `out[start..end]` of its connection's output (so a failed write's reply can be replaced).
    fn reply_span(&self, since: u64, start: usize, end: usize);

    /// Large objects: a fresh object id, never reused (also across restarts).
    fn new_object_id(&self) -> u64 {
        0
    }
    /// Large objects: bytes per chunk on this device (0: large objects are not supported).
    fn chunk_len(&self) -> usize {
        0
    }
    /// Large objects: stage chunk `index` of `object` (at most [`Journal::chunk_len`] bytes).
    /// Like [`Journal::record`] it only stages; the runtime holds the calling connection
    /// until it is durable. A manifest naming the object may be staged only after every
    /// chunk has been, and none [`Journal::object_failed`].
    fn stage_chunk(&self, object: u64, index: u32, bytes: &[u8]) -> Result<(), StoreError> {
        let _ = (object, index, bytes);
        Err(StoreError::OutOfMemory)
    }
    /// Large objects: the upload of `object` was given up before its manifest was staged;
    /// its chunks `0..chunks` are garbage once everything staged so far has settled.
    fn abandon_object(&self, object: u64, chunks: u32) {
        let _ = (object, chunks);
    }
    /// Counters of the device for `stats`, as `(name, value)` calls to `out` (none by default).
    fn device_stats(&self, out: &mut dyn FnMut(&'static str, u64)) {
        let _ = out;
    }

    /// Large objects: whether a staged chunk of `object` failed to reach the device (the
    /// answer is forgotten once it was true).
    fn object_failed(&self, object: u64) -> bool {
        let _ = object;
        false
    }
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

    /// Large objects: the verified bytes of chunk `index` of `object`, read from the device
    /// (blocking, like `fetch`). `None`: missing or unreadable (logged by the implementation).
    fn read_chunk(&self, object: u64, index: u32) -> Option<Vec<u8>> {
        let _ = (object, index);
        None
    }

    /// Large objects: bytes `start..end` of chunk `index` of `object`'s data, read and
    /// verified piece by piece (only the pieces covering the range). `None`: missing,
    /// unreadable, or out of range (logged by the implementation).
    fn read_chunk_range(
        &self,
        object: u64,
        index: u32,
        start: usize,
        end: usize,
    ) -> Option<Vec<u8>> {
        let _ = (object, index, start, end);
        None
    }
}
