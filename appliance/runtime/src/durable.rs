//! The data device on the workers: each worker drives one region log through its own ring.
//!
//! Sessions stay sans-IO and the flow runs one way. The runtime hands each session call a
//! [`ConnDevice`]: the worker's log plus the connection being served. A mutation reaches
//! [`ConnDevice::record`] (called by the store under the key's shard lock), which encodes it
//! into the log and notes its token and connection. At the end of each loop iteration the
//! worker turns what its log wants done into SQEs (one write per batch, then one fdatasync;
//! `user_data` from [`crate::op`]). A write completion alone settles nothing: a record is
//! settled when a completed flush covers it (made durable) or its write or flush failed
//! (ADR 0011). Each settled record of a connection is reported to its session
//! ([`ringstore_service::Session::on_durable`]), which then writes the reply it held, or the
//! error; a failed record's RAM copy is dropped first.
use std::cell::RefCell;
use std::collections::VecDeque;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;

use ringstore_durable::{Action, Compactor, DurableError, FileDevice, RegionLog, Serving, Step};
use ringstore_service::{Device, Fetched, Journal, Mutation};
use ringstore_store::{Backfill, StoreError, Time};

mod compaction;
mod device;
pub(crate) mod open;
mod sync;

pub(crate) use device::{ConnDevice, DeviceBackfill};
pub(crate) use sync::{Done, SyncThread};

/// Where a worker's data-device I/O goes: the io_uring worker's SQEs or the readiness
/// runtime's sync thread (ADR 0033). The log's bookkeeping ([`DeviceWorker`]) is the same for
/// both; a sink only says how each operation reaches the device, and its completion comes
/// back through [`DeviceWorker::complete`], [`DeviceWorker::erase_complete`] and
/// [`DeviceWorker::read_complete`].
pub(crate) trait DiskSink {
    /// Batch write `id` of `bytes` at `offset`; when `chained`, the next [`DiskSink::flush`]
    /// is its flush and must start only after it ended (and not at all if it failed).
    /// Returns the bytes when the sink only borrows them until the completion.
    fn write(&mut self, id: u64, offset: u64, bytes: Vec<u8>, chained: bool) -> Option<Vec<u8>>;
    /// fdatasync `id` on flush lane `lane` (0 or 1: the region's own descriptions, `FlushFiles`).
    fn flush(&mut self, id: u64, lane: usize);
    /// Everything of this pump was handed over (io_uring: a chain is complete).
    fn end_of_batch(&mut self) {}
    /// Compaction read `id`: `buf.len()` bytes at `offset` into `buf`, which stays
    /// untouched until [`DeviceWorker::read_complete`].
    fn read(&mut self, id: u64, offset: u64, buf: &mut [u8]);
    /// Erase `id`: `block` written at `offset`, then an fdatasync chained behind it.
    fn erase(&mut self, id: u64, offset: u64, block: &[u8]);
}

/// Writes a region log may have accepted and not yet settled (more is "out of memory").
pub(crate) const PENDING_WRITES_MAX: usize = 1 << 16;

/// The open file descriptions a region's fdatasyncs go through: its log's flush lanes and
/// its erases', each opened for this region alone and never the one its writes use.
///
/// Why (ADR 0011, one description per flusher): on a block device every fdatasync writes
/// back the dirty pages of the whole device, other regions' too, and Linux reports a
/// writeback error once per open file description. A description two flushers share lets
/// one take the error of a write the other made, and the other's flush then succeeds over a
/// lost write (an acknowledged set gone after a restart; tests/e2e, test_durable.py,
/// writeback errors). On descriptions of its own, each flush sees every error since its
/// last one: at worst a flush fails for another region's lost write, never the reverse.
pub(crate) struct FlushFiles {
    /// Lane 0 of the log's flushes.
    pub(crate) lane: std::fs::File,
    /// Lane 1; None when it could not be opened (then one flush at a time).
    pub(crate) second_lane: Option<std::fs::File>,
    /// The erases' chained fdatasyncs (compaction frees segments while the log flushes).
    pub(crate) erase: std::fs::File,
}

/// A sink's descriptors (see [`DeviceWorker::fds`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct SinkFds {
    /// Writes and reads.
    pub(crate) io: RawFd,
    /// The log's flush lanes, indexed by lane ([`FlushFiles::for_lane`]).
    pub(crate) lanes: [RawFd; 2],
    /// The erases' flushes.
    pub(crate) erase: RawFd,
}

impl FlushFiles {
    fn open(device: &FileDevice) -> std::io::Result<FlushFiles> {
        Ok(FlushFiles {
            lane: device.open_flush_lane()?,
            second_lane: device.open_flush_lane().ok(),
            erase: device.open_flush_lane()?,
        })
    }

    fn try_clone(&self) -> std::io::Result<FlushFiles> {
        Ok(FlushFiles {
            lane: self.lane.try_clone()?,
            second_lane: match &self.second_lane {
                Some(f) => Some(f.try_clone()?),
                None => None,
            },
            erase: self.erase.try_clone()?,
        })
    }

    /// The description lane `lane` flushes through (lane 1 falls back to lane 0 when absent).
    pub(crate) fn for_lane(&self, lane: usize) -> &std::fs::File {
        match (&self.second_lane, lane) {
            (Some(file), 1) => file,
            _ => &self.lane,
        }
    }
}

/// One staged record on its way to the device.
struct Rec {
    /// Connection it answers, (slot, generation); `None` when staged outside a request.
    conn: Option<(u32, u32)>,
    /// Its write sequence.
    seq: u64,
    /// 0 pending, 1 durable, 2 failed.
    state: u8,
}

/// The worker's region log and the bookkeeping of records not yet settled.
struct WorkerLog {
    log: RegionLog<u64>,
    /// Records staged so far; a record's token is the count after it was staged.
    staged: u64,
    /// Unsettled records in token order; the front has token `front_token`.
    recs: VecDeque<Rec>,
    front_token: u64,
    /// Uploads given up: (token staged last when given up, object, chunks). Their chunks
    /// leave the index once everything up to that token has settled (a chunk acked later
    /// would otherwise enter it again).
    abandoned: VecDeque<(u64, u64, u32)>,
}

impl WorkerLog {
    fn rec_mut(&mut self, token: u64) -> Option<&mut Rec> {
        token
            .checked_sub(self.front_token)
            .and_then(|i| self.recs.get_mut(usize::try_from(i).ok()?))
    }
}

/// What a completion changed for the worker.
#[derive(Default)]
pub(crate) struct Outcome {
    /// RAM copies to drop: (key, cas).
    pub forget: Vec<(Box<[u8]>, u64)>,
    /// Records of connections settled, in token order: (slot, generation, token, durable).
    pub settled: Vec<(u32, u32, u64, bool)>,
}

/// A worker's side of the data device.
pub(crate) struct DeviceWorker {
    serving: Arc<Serving<FileDevice>>,
    fd: RawFd,
    region: usize,
    /// The region's log. A `RefCell` because the store stages into it through the
    /// [`ConnDevice`] a session call holds (shared), while completions update it between
    /// calls; the two never overlap on the worker's one thread.
    log: RefCell<WorkerLog>,
    /// Batch writes in flight: op id, length, and the bytes when the sink only borrowed them
    /// (the kernel reads them until the completion). A handful at most (the log's
    /// `max_inflight_writes`), so a list.
    inflight: Vec<(u64, usize, Option<Vec<u8>>)>,
    /// The open file descriptions this region's flushes go through (see [`FlushFiles`]).
    flush_files: FlushFiles,
    flushing: usize,
    /// This region's background compaction.
    compactor: Compactor,
    /// An erase is in flight: Some(outcome of its write once completed).
    erasing: Option<Option<bool>>,
    /// Where the erase in flight (or the last one) writes.
    erase_offset: u64,
    /// The erase was written and its flush failed once: it is written and flushed again
    /// (at `erase_offset`) before the compaction is given up.
    erase_again: bool,
    /// The erase in flight is that second try.
    erase_retried: bool,
    /// The id of the compaction read in flight (at most one).
    reading: Option<u64>,
    /// Ids of compaction operations, erases and reads (never repeat).
    next_compaction_op: u64,
}

impl DeviceWorker {
    /// Takes region `region`'s log for this worker; Err says why it cannot.
    pub(crate) fn install(
        serving: Arc<Serving<FileDevice>>,
        region: usize,
    ) -> Result<DeviceWorker, String> {
        let mut log = serving
            .take_log(region)
            .ok_or("the data device has no free region for it")?;
        let fd = serving.device().as_raw_fd();
        let flush_files = match FlushFiles::open(serving.device()) {
            Ok(files) => files,
            Err(e) => {
                serving.park_log(log);
                return Err(format!(
                    "cannot open the data device again for region {region}'s flushes: {e}"
                ));
            }
        };
        // Each group: one write with its flush chained behind it (ADR 0011, chained flushes).
        log.chain_flushes(true);
        if flush_files.second_lane.is_none() {
            eprintln!("ringstore: region {region}: one flush at a time (no second description)");
            log.limit_flush_lanes(1);
        }
        let compactor = Compactor::new(serving.superblock().geometry.block_size);
        Ok(DeviceWorker {
            serving,
            fd,
            region,
            log: RefCell::new(WorkerLog {
                log,
                staged: 0,
                recs: VecDeque::new(),
                front_token: 1,
                abandoned: VecDeque::new(),
            }),
            inflight: Vec::new(),
            flush_files,
            flushing: 0,
            compactor,
            erasing: None,
            erase_offset: 0,
            erase_again: false,
            erase_retried: false,
            reading: None,
            next_compaction_op: 1,
        })
    }

    /// The device for one session call on behalf of connection `(slot, generation)`.
    pub(crate) fn for_conn(&self, slot: u32, generation: u32) -> ConnDevice<'_> {
        ConnDevice {
            device: self,
            conn: (slot, generation),
        }
    }

    /// Stages one record into the log for `conn` with `encode` (given the log and the
    /// record's token, the new [`WorkerLog::staged`]; it returns the record's sequence).
    fn stage(
        &self,
        conn: Option<(u32, u32)>,
        encode: impl FnOnce(&mut RegionLog<u64>, u64) -> Result<u64, DurableError>,
    ) -> Result<(), StoreError> {
        let mut guard = self.log.borrow_mut();
        let w = &mut *guard;
        let token = w.staged + 1;
        let seq = encode(&mut w.log, token).map_err(|e| match e {
            // Said as such, not as "out of memory" (ADR 0039).
            DurableError::NoSpace => StoreError::DeviceFull,
            _ => StoreError::OutOfMemory,
        })?;
        w.staged = token;
        if w.recs.is_empty() {
            // Still under the key's shard lock: compaction elsewhere sees this write as pending.
            self.serving.set_pending_floor(w.log.region() as usize, seq);
        }
        w.recs.push_back(Rec {
            conn,
            seq,
            state: 0,
        });
        Ok(())
    }

    /// Gives the log back (after it drained).
    pub(crate) fn uninstall(self) {
        let st = self.compactor.stats();
        if st.freed > 0 || st.aborted > 0 {
            eprintln!(
                "ringstore: region {}: background compaction freed {} segments, copied {} records ({} KiB), dropped {}, gave up {} times; the full region evicted {} segments ({} records)",
                self.region,
                st.freed,
                st.copied,
                st.copied_bytes >> 10,
                st.dropped,
                st.aborted,
                st.evicted_segments,
                st.evicted
            );
        }
        let mut w = self.log.into_inner();
        // The stop checkpoint drives the log synchronously.
        w.log.chain_flushes(false);
        if !w.log.is_idle() {
            eprintln!(
                "ringstore: region {} stopped with writes in flight",
                self.region
            );
        }
        self.serving.park_log(w.log);
    }

    /// True when nothing is staged or in flight (a compaction in progress included).
    pub(crate) fn is_idle(&self) -> bool {
        self.compactor.is_idle()
            && self.erasing.is_none()
            && !self.erase_again
            && self.reading.is_none()
            && self.inflight.is_empty()
            && self.flushing == 0
            && self.log.borrow().log.is_idle()
    }

    /// The descriptors for a sink: the device's (writes and reads) and this region's flushes'.
    pub(crate) fn fds(&self) -> SinkFds {
        SinkFds {
            io: self.fd,
            lanes: [0, 1].map(|lane| self.flush_files.for_lane(lane).as_raw_fd()),
            erase: self.flush_files.erase.as_raw_fd(),
        }
    }

    /// Other handles on the same open file descriptions (the device's, the flushes'), for a
    /// runtime that performs the I/O on a thread of its own (ADR 0033).
    pub(crate) fn clone_files(&self) -> std::io::Result<(FileDevice, FlushFiles)> {
        Ok((
            self.serving.device().try_clone()?,
            self.flush_files.try_clone()?,
        ))
    }

    /// Hands what the log wants done to `sink` (io_uring SQEs, or the sync thread's jobs): a
    /// batch write whose flush is chained behind it is followed by that flush at once.
    pub(crate) fn pump(&mut self, sink: &mut impl DiskSink) {
        let w = self.log.get_mut();
        while let Some(action) = w.log.poll_action() {
            match action {
                Action::WriteBatch {
                    id,
                    offset,
                    bytes,
                    chained,
                } => {
                    let len = bytes.len();
                    // A sink that only borrows the bytes gives them back: they stay here
                    // (the Vec's heap buffer does not move) until the completion.
                    let kept = sink.write(id, offset, bytes, chained);
                    self.inflight.push((id, len, kept));
                }
                Action::Flush { id, lane } => {
                    // Without a second lane the log was limited to one (`install`).
                    debug_assert!(lane == 0 || self.flush_files.second_lane.is_some());
                    self.flushing += 1;
                    sink.flush(id, lane);
                }
            }
        }
        sink.end_of_batch();
    }

    /// A batch buffer a sink took (`DiskSink::write` returned None) comes back after its
    /// completion: the next batch reuses the allocation.
    pub(crate) fn recycle(&mut self, buf: Vec<u8>) {
        self.log.get_mut().log.recycle(buf);
    }

    /// Feeds a batch write (`flush` false) or flush completion back; returns what the worker
    /// must do about it.
    pub(crate) fn complete(&mut self, flush: bool, id: u64, res: i32) -> Outcome {
        let ok = if flush {
            self.flushing = self.flushing.saturating_sub(1);
            res >= 0
        } else {
            let entry = self
                .inflight
                .iter()
                .position(|(i, _, _)| *i == id)
                .map(|at| self.inflight.swap_remove(at));
            let want = entry.as_ref().map_or(0, |e| e.1);
            if let Some(buf) = entry.and_then(|e| e.2) {
                // The kernel is done with it: the next batch reuses the allocation.
                self.log.get_mut().log.recycle(buf);
            }
            res >= 0 && res as usize == want
        };
        if !ok {
            let what = if flush { "fdatasync" } else { "write" };
            let err = if res < 0 {
                std::io::Error::from_raw_os_error(-res).to_string()
            } else {
                format!("short write ({res} bytes)")
            };
            eprintln!("ringstore: data device {what} failed in region {}: {err}; failing the affected requests", self.region);
        }
        let serving = &self.serving;
        let w = self.log.get_mut();
        let done = if flush {
            w.log.on_flush_complete(id, ok)
        } else {
            w.log.on_write_complete(id, ok)
        };
        let mut out = Outcome::default();
        match done {
            Ok(done) => {
                let settled = serving.settle(done);
                self.compactor.on_relocated(&settled.relocated);
                for t in settled.acked {
                    if let Some(rec) = w.rec_mut(t) {
                        rec.state = 1;
                    }
                }
                for (t, key, cas) in settled.failed {
                    if let Some(rec) = w.rec_mut(t) {
                        rec.state = 2;
                    }
                    // A failed chunk has no RAM copy; its session learns of it by its token.
                    if ringstore_durable::parse_chunk_key(&key).is_none() {
                        out.forget.push((key, cas));
                    }
                }
            }
            Err(err) => eprintln!("ringstore: data device completion refused: {err}"),
        }
        while w.recs.front().is_some_and(|r| r.state != 0) {
            let Some(rec) = w.recs.pop_front() else {
                break;
            };
            let token = w.front_token;
            w.front_token += 1;
            if let Some((slot, generation)) = rec.conn {
                out.settled.push((slot, generation, token, rec.state == 1));
            }
        }
        let settled_through = w.front_token - 1;
        while w
            .abandoned
            .front()
            .is_some_and(|&(token, _, _)| token <= settled_through)
        {
            let Some((_, object, chunks)) = w.abandoned.pop_front() else {
                break;
            };
            serving.abandon_object(object, chunks);
        }
        serving.set_pending_floor(
            w.log.region() as usize,
            w.recs.front().map_or(u64::MAX, |r| r.seq),
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Seek, SeekFrom};

    /// The offset of `fd`'s open file description (`/proc/self/fdinfo`); a description's
    /// offset is shared by every descriptor of it and by no other.
    fn offset_of(fd: RawFd) -> u64 {
        let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).unwrap();
        let line = info.lines().find(|l| l.starts_with("pos:")).unwrap();
        line["pos:".len()..].trim().parse().unwrap()
    }

    #[test]
    fn every_flusher_has_an_open_file_description_of_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let device = FileDevice::create(&dir.path().join("device"), 1 << 20).unwrap();
        let files = FlushFiles::open(&device).unwrap();
        let second = files.second_lane.as_ref().expect("a second lane");
        let flushers = [&files.lane, second, &files.erase];
        // Distinct offsets: two descriptors of one description would end at the later one.
        for (i, mut file) in flushers.into_iter().enumerate() {
            file.seek(SeekFrom::Start(4096 * (i as u64 + 1))).unwrap();
        }
        for (i, file) in flushers.into_iter().enumerate() {
            assert_eq!(offset_of(file.as_raw_fd()), 4096 * (i as u64 + 1));
        }
        assert_eq!(
            offset_of(device.as_raw_fd()),
            0,
            "a flusher shares the device's"
        );
        // The sync thread's copies are the same descriptions (its flushes see the same errors).
        let copies = files.try_clone().unwrap();
        assert_eq!(offset_of(copies.erase.as_raw_fd()), 4096 * 3);
        assert_eq!(files.for_lane(1).as_raw_fd(), second.as_raw_fd());
        assert_eq!(files.for_lane(0).as_raw_fd(), files.lane.as_raw_fd());
    }
}
