//! `Durable`: opens (formats or recovers) a device and drives the region logs synchronously
//! through a [`BlockDevice`]. The io_uring runtime drives [`crate::RegionLog`] the same way,
//! submitting the actions as SQEs instead of calling the device.
//!
//! Opening (format, recovery) and shutdown (the checkpoint) are in `engine/lifecycle.rs`; this
//! file holds the types, the synchronous write path and reads.
use std::sync::Arc;
use std::time::Duration;

use crate::crypt::{Crypt, DataKey};

use crate::device::BlockDevice;
use crate::error::DurableError;
use crate::group_commit::{Action, Completion, Limits};
use crate::index::Index;
use crate::record::{RecordKind, RecordMeta};
use crate::region::{Purpose, RegionLog, Staged};
use crate::superblock::Superblock;

mod lifecycle;

/// How to open (and if blank, format) a device.
#[derive(Debug, Clone)]
pub struct Options {
    /// The data key (ADR 0050): a blank device is formatted encrypted with it, an encrypted
    /// one opens only with it. `None`: records in clear, and an encrypted device is refused.
    pub data_key: Option<DataKey>,
    /// Regions (one per worker) when formatting.
    pub regions: u32,
    /// Segment size when formatting.
    pub segment_size: u64,
    /// Write alignment when formatting (512 or 4096).
    pub block_size: u32,
    /// Checkpoint area size when formatting; 0 = 1/8 of the device (at least 64 KiB).
    pub checkpoint_len: u64,
    /// Overwrite a foreign, unknown or other-version device.
    pub force: bool,
    /// Start even when recovery finds damage in acknowledged history (ADR 0016): use every
    /// record that verifies, also past the damage, and report the damage in
    /// [`OpenReport::damaged`]. Keys whose newest record was the damaged one may then answer
    /// an older value or be missing. Off: such a device is refused with
    /// [`DurableError::CorruptHistory`].
    pub salvage: bool,
    /// Group-commit bounds per region.
    pub limits: Limits,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            data_key: None,
            regions: 1,
            segment_size: 8 << 20,
            block_size: 4096,
            checkpoint_len: 0,
            force: false,
            salvage: false,
            limits: Limits::default(),
        }
    }
}

/// What [`Durable::open`] found and did.
#[derive(Debug, Clone)]
pub struct OpenReport {
    /// The device was blank (or forced) and has been formatted.
    pub formatted: bool,
    /// The index came from a clean-shutdown checkpoint rather than a scan.
    pub from_checkpoint: bool,
    /// Records read by the scan (0 with a checkpoint).
    pub records_scanned: usize,
    /// Keys with a value or manifest after recovery (chunk records not counted).
    pub live_objects: usize,
    /// Places in acknowledged history that did not verify (only with [`Options::salvage`];
    /// otherwise such a device is refused).
    pub damaged: Vec<crate::recovery::Damage>,
    /// Wall time of recovery.
    pub elapsed: Duration,
}

/// The outcome of one client write, released by [`Durable::tick`].
#[derive(Debug)]
pub struct Ack {
    /// The caller's token.
    pub token: u64,
    /// `Ok` once durable; an error if the write or its flush failed.
    pub result: Result<(), DurableError>,
}

// `Item` is what a read back gives: it lives beside the read-back (`readback.rs`), which
// this engine calls, so the two do not import each other.
pub use crate::readback::Item;

/// An open data device.
#[derive(Debug)]
pub struct Durable<D: BlockDevice> {
    pub(crate) dev: D,
    pub(crate) sb: Superblock,
    /// The open's sealing state on a device with a data key (ADR 0050).
    pub(crate) crypt: Option<Arc<Crypt>>,
    pub(crate) regions: Vec<RegionLog<u64>>,
    pub(crate) index: Index,
    pub(crate) next_seq: u64,
    pub(crate) acks: Vec<Ack>,
    pub(crate) relocate_failures: u64,
}

impl<D: BlockDevice> Durable<D> {
    /// The superblock (uuid and geometry).
    pub fn superblock(&self) -> &Superblock {
        &self.sb
    }

    /// The open's sealing state; `None` on a device without a data key.
    pub fn crypt(&self) -> Option<&Crypt> {
        self.crypt.as_deref()
    }

    /// The device.
    pub fn device(&self) -> &D {
        &self.dev
    }

    /// Highest CAS on the device: the store's CAS counter must start above it.
    pub fn max_cas(&self) -> u64 {
        self.index.max_cas()
    }

    /// The index (key → location), for warming the RAM tier after recovery.
    pub fn index(&self) -> &Index {
        &self.index
    }

    /// Queue a write of `key` in region `region`. Its [`Ack`] (with `token`) comes from a later
    /// [`Durable::tick`], only after the flush covering it completed. Returns its sequence.
    #[expect(
        clippy::too_many_arguments,
        reason = "the record's parts (key, value, flags, expiry, cas) plus where and for whom"
    )]
    pub fn set(
        &mut self,
        region: usize,
        key: &[u8],
        value: &[u8],
        flags: u32,
        exptime: u64,
        cas: u64,
        token: u64,
    ) -> Result<u64, DurableError> {
        let meta = RecordMeta {
            kind: RecordKind::Value,
            flags,
            exptime,
            cas,
            seq: self.next_seq,
        };
        self.stage(region, key, value, meta, token)
    }

    /// Queue a delete of `key` (a tombstone record). Acked like [`Durable::set`].
    pub fn delete(&mut self, region: usize, key: &[u8], token: u64) -> Result<u64, DurableError> {
        let meta = RecordMeta::bare(RecordKind::Tombstone, self.next_seq);
        self.stage(region, key, &[], meta, token)
    }

    fn stage(
        &mut self,
        region: usize,
        key: &[u8],
        value: &[u8],
        meta: RecordMeta,
        token: u64,
    ) -> Result<u64, DurableError> {
        let log = self
            .regions
            .get_mut(region)
            .ok_or(DurableError::NoRegion(region))?;
        log.stage(key, value, meta, Purpose::Client(token), false)?;
        self.next_seq += 1;
        Ok(meta.seq)
    }

    /// Submit everything queued (one write + one flush per batch) and return the acks released.
    pub fn tick(&mut self) -> Vec<Ack> {
        for r in 0..self.regions.len() {
            self.drive(r);
        }
        std::mem::take(&mut self.acks)
    }

    pub(crate) fn drive(&mut self, r: usize) {
        while let Some(action) = self.regions[r].poll_action() {
            let (done, err) = match action {
                Action::WriteBatch {
                    id, offset, bytes, ..
                } => {
                    let res = self.dev.write_at(offset, &bytes);
                    let kind = res.as_ref().err().map(|e| e.kind());
                    (self.regions[r].on_write_complete(id, res.is_ok()), kind)
                }
                Action::Flush { id, .. } => {
                    let res = self.dev.flush();
                    let kind = res.as_ref().err().map(|e| e.kind());
                    (self.regions[r].on_flush_complete(id, res.is_ok()), kind)
                }
            };
            // A completion the state machine rejects cannot happen in this synchronous driver.
            if let Ok(done) = done {
                self.settle(done, err.unwrap_or(std::io::ErrorKind::Other));
            }
        }
    }

    fn settle(&mut self, done: Completion<Staged<u64>>, kind: std::io::ErrorKind) {
        for s in done.acked {
            match s.purpose {
                Purpose::Client(token) => {
                    self.index.apply(&s.key, s.meta, s.loc, s.value_len, s.seed);
                    self.acks.push(Ack {
                        token,
                        result: Ok(()),
                    });
                }
                Purpose::Relocate(from) => {
                    self.index.relocate(&s.key, s.meta, from, s.loc, s.seed);
                }
            }
        }
        let offset = done.error_offset.unwrap_or(0);
        for s in done.failed {
            self.index.note_unapplied(&s.key, s.meta, s.loc);
            match s.purpose {
                Purpose::Client(token) => self.acks.push(Ack {
                    token,
                    result: Err(DurableError::Io { offset, kind }),
                }),
                Purpose::Relocate(_) => self.relocate_failures += 1,
            }
        }
    }

    pub(crate) fn pending_acks_extend(&mut self, acks: Vec<Ack>) {
        self.acks.extend(acks);
    }

    /// Tick until nothing is queued; returns every ack released.
    pub fn sync(&mut self) -> Vec<Ack> {
        let mut out = Vec::new();
        for _ in 0..4 {
            out.extend(self.tick());
            if self.regions.iter().all(|r| r.is_idle()) {
                break;
            }
        }
        out
    }

    /// Read `key` back from the device, verifying its checksum. Tombstones read as `None`.
    /// Expiry is the caller's business (`exptime` is returned).
    pub fn get(&self, key: &[u8]) -> Result<Option<Item>, DurableError> {
        match self.index.get(key) {
            Some(e) => crate::readback::read_entry(
                &self.dev,
                &self.sb.geometry,
                key,
                e,
                self.crypt.as_deref(),
            ),
            None => Ok(None),
        }
    }
}

#[cfg(test)]
#[path = "engine_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "sealed_tests.rs"]
mod sealed_tests;
