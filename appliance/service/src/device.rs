//! The data device as a session sees it: a handle the runtime passes into each call, for
//! staging records (through the store, as its [`Journal`]), large-object chunks, and reads
//! of chunks the store never holds.
//!
//! A session never learns about I/O: it notes the newest [`Device::staged`] token a reply
//! depends on, holds the reply ([`crate::held`]), and the runtime later reports each of its
//! tokens settled through [`crate::Session::on_durable`].

use ringstore_store::{Journal, StoreError};

/// One worker's data device, for the connection being served.
///
/// Tokens: every record staged through a worker's log gets the next token of that worker
/// (1, 2, ...); the runtime reports a connection's tokens settled in increasing order.
pub trait Device: Journal {
    /// The token of the newest record staged through this worker's log (0: none yet).
    fn staged(&self) -> u64;
    /// Large objects: bytes per chunk on this device (0: large objects are not supported).
    fn chunk_len(&self) -> usize;
    /// Large objects: bytes of this worker's region that records may fill (its segments
    /// less the reserved ones): what unfinished uploads are bounded by (`http/uploads.rs`).
    fn region_len(&self) -> u64;
    /// Large objects: a fresh object id, never reused (also across restarts).
    fn new_object_id(&self) -> u64;
    /// Large objects: stage chunk `index` of `object` (at most [`Device::chunk_len`] bytes),
    /// as one record with its own token. A manifest naming the object may be staged only
    /// after every chunk's token was reported settled and none failed.
    fn stage_chunk(&self, object: u64, index: u32, bytes: &[u8]) -> Result<(), StoreError>;
    /// Large objects: the upload of `object` ended without a manifest; its chunks
    /// `0..chunks` are garbage once what is staged now has settled.
    fn abandon_object(&self, object: u64, chunks: u32);
    /// Large objects: the verified bytes of chunk `index` of `object` (a blocking device
    /// read). `None`: missing or unreadable (logged by the implementation).
    fn read_chunk(&self, object: u64, index: u32) -> Option<Vec<u8>>;
    /// Large objects: bytes `start..end` of chunk `index` of `object`, read and verified
    /// piece by piece (only the pieces covering the range). `None`: missing, unreadable, or
    /// out of range.
    fn read_chunk_range(
        &self,
        object: u64,
        index: u32,
        start: usize,
        end: usize,
    ) -> Option<Vec<u8>>;
    /// Counters of the device for `stats`, as `(name, value)` calls to `out`.
    fn stats(&self, out: &mut dyn FnMut(&'static str, u64));
    /// The group-commit histograms (`/metrics` `ringstore_data_commit_*`); `None`: not kept.
    fn commit_metrics(&self) -> Option<&ringstore_durable::CommitMetrics> {
        None
    }
    /// Records the full device evicted since start (ADR 0039): `stats` adds them to
    /// `evictions`, as memcached counts what its cache dropped for room.
    fn evictions(&self) -> u64 {
        0
    }
}
