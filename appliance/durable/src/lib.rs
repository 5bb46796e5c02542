//! The data device: acknowledged writes survive crashes and reboots.
//!
//! Layout and protocol are specified in `docs/adr/0010-data-device-format.md`. In short: a
//! superblock, a checkpoint area, then one region per worker, each cut into segments that hold
//! an append-only log of crc32c-chained records. Writes are group-committed: one block-aligned
//! write and one flush per batch, and a write is acknowledged only after the flush covering it
//! (and every earlier batch of its log) completed.
//!
//! The pieces, from the bottom:
//! - [`BlockDevice`]: the storage seam; [`FileDevice`] (pread/pwrite/fdatasync) and
//!   [`sim::SimDevice`] (crashes, torn writes, injected EIO) implement it.
//! - [`GroupCommit`]: the sans-IO batching state machine (actions out, completions in).
//! - [`RegionLog`]: one worker's log; encodes records and allocates segments; sans-IO.
//! - [`Index`]: key → newest record, live bytes per segment, tombstone bookkeeping.
//! - [`large`]: large objects as chunk records plus a [`Manifest`] under the user key.
//! - [`Compactor`]: one region's compaction while serving, in bounded steps on its worker.
//! - [`Durable`]: opens (formats, refuses foreign signatures, recovers from a checkpoint or a
//!   parallel scan), drives the logs synchronously through a [`BlockDevice`], compacts, and
//!   writes the checkpoint at [`Durable::shutdown`]. The io_uring runtime drives
//!   [`RegionLog`] itself and shares the rest.
#![forbid(unsafe_code)]

mod checkpoint;
pub mod commit_metrics;
pub mod compactor;
pub mod crypt;
mod device;
mod engine;
mod error;
pub mod group_commit;
mod index;
pub mod large;
#[cfg(test)]
mod large_tests;
mod maintain;
mod readback;
pub mod record;
mod recovery;
mod region;
mod segment;
pub mod serving;
pub mod sim;
pub mod superblock;
pub mod units;

pub use commit_metrics::CommitMetrics;
pub use compactor::{Compactor, CompactorStats, Step};
pub use crypt::DataKey;
pub use device::{BlockDevice, FileDevice};
pub use engine::{Ack, Durable, Item, OpenReport, Options};
pub use error::DurableError;
pub use group_commit::{Action, Completion, GroupCommit, Limits, OpId};
pub use index::{Entry, Index, Loc};
pub use large::{chunk_key, parse_chunk_key, Manifest, CHUNK_KEY_LEN, MANIFEST_HEAD_MAX};
pub use maintain::{CompactReport, SpaceUsage, SPACE_FACTOR};
pub use record::{RecordKind, RecordMeta};
pub use recovery::Damage;
pub use region::{Purpose, RegionLog, SegState, Staged, COMPACTION_RESERVE};
/// What the store logs: the one mutation type, staged with [`Serving::stage`].
pub use ringstore_store::Mutation;
pub use serving::{
    DataFull, Evictions, OneBootSeal, RekeyStatus, Relocation, Reserve, Serving, ServingState,
    Settled, FLUSH_KEY,
};
