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
use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;

use io_uring::{opcode, squeue, types};

use ringstore_durable::{Action, Change, Compactor, FileDevice, RegionLog, Serving, Step};
use ringstore_service::{Device, Fetched, Journal, Mutation};
use ringstore_store::{Backfill, StoreError, Time};

use crate::op::Op;

/// Writes a region log may have accepted and not yet settled (more is "out of memory").
pub(crate) const PENDING_WRITES_MAX: usize = 1 << 16;

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

fn to_unix(unix_start: u64, t: Time) -> u64 {
    if t == 0 {
        0
    } else {
        unix_start + u64::from(t)
    }
}

/// The data device for one session call: the worker's log, on behalf of one connection.
pub(crate) struct ConnDevice<'a> {
    disk: &'a DiskWorker,
    conn: (u32, u32),
}

impl Journal for ConnDevice<'_> {
    fn record(&self, m: Mutation<'_>) -> Result<(), StoreError> {
        let unix_start = self.disk.unix_start;
        let change = match m {
            Mutation::Put {
                key,
                value,
                flags,
                exptime,
                cas,
                large,
            } => Change::Put {
                key,
                value,
                flags,
                exptime: to_unix(unix_start, exptime),
                cas,
                large,
            },
            Mutation::Delete { key } => Change::Delete { key },
            Mutation::FlushAll { at } => Change::FlushAll {
                at: unix_start + u64::from(at),
            },
        };
        self.disk.stage(change, Some(self.conn))
    }
}

impl Device for ConnDevice<'_> {
    fn staged(&self) -> u64 {
        self.disk.log.borrow().staged
    }

    fn chunk_len(&self) -> usize {
        self.disk.serving.chunk_len()
    }

    fn new_object_id(&self) -> u64 {
        self.disk.serving.next_object_id()
    }

    fn stage_chunk(&self, object: u64, index: u32, bytes: &[u8]) -> Result<(), StoreError> {
        let change = Change::Chunk {
            object,
            index,
            bytes,
        };
        self.disk.stage(change, Some(self.conn))
    }

    fn abandon_object(&self, object: u64, chunks: u32) {
        let mut w = self.disk.log.borrow_mut();
        if w.recs.is_empty() {
            self.disk.serving.abandon_object(object, chunks);
        } else {
            let token = w.staged;
            w.abandoned.push_back((token, object, chunks));
        }
    }

    fn read_chunk(&self, object: u64, index: u32) -> Option<Vec<u8>> {
        let serving = &self.disk.serving;
        serving
            .read_chunk(object, index)
            .map_err(|err| {
                note_read_error(serving, &err);
                eprintln!("ringstore: data device: chunk {index} of object {object}: {err}")
            })
            .ok()
    }

    fn read_chunk_range(
        &self,
        object: u64,
        index: u32,
        start: usize,
        end: usize,
    ) -> Option<Vec<u8>> {
        let serving = &self.disk.serving;
        serving
            .read_chunk_range(object, index, start, end)
            .map_err(|err| {
                note_read_error(serving, &err);
                eprintln!(
                    "ringstore: data device: chunk {index} of object {object} \
                     bytes {start}..{end}: {err}"
                )
            })
            .ok()
    }

    fn stats(&self, out: &mut dyn FnMut(&'static str, u64)) {
        let serving = &self.disk.serving;
        let (uploads, reserved) = serving.uploads();
        out("data_reserved_bytes", reserved);
        out("data_uploads_in_progress", uploads as u64);
        out("data_corrupt_records", serving.corrupt_records());
    }
}

/// Counts a damaged record read (`stats data_corrupt_records`).
fn note_read_error(serving: &Serving<FileDevice>, err: &ringstore_durable::DurableError) {
    if matches!(err, ringstore_durable::DurableError::Corrupt { .. }) {
        serving.note_corrupt();
    }
}

/// Reads RAM misses from the device (synchronous pread on the calling worker; see ADR 0011).
pub(crate) struct DeviceBackfill {
    pub serving: Arc<Serving<FileDevice>>,
    pub unix_start: u64,
}

impl Backfill for DeviceBackfill {
    fn fetch(&self, key: &[u8], now: Time) -> Option<Fetched> {
        let now_unix = self.unix_start + u64::from(now);
        match self.serving.lookup(key, now_unix) {
            Ok(Some(item)) => Some(Fetched {
                value: item.value,
                flags: item.flags,
                exptime: if item.exptime == 0 {
                    0
                } else {
                    item.exptime
                        .saturating_sub(self.unix_start)
                        .clamp(1, u64::from(u32::MAX)) as Time
                },
                cas: item.cas,
                large: item.large,
            }),
            Ok(None) => None,
            Err(err) => {
                note_read_error(&self.serving, &err);
                eprintln!("ringstore: data device read failed: {err}");
                None
            }
        }
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
pub(crate) struct DiskWorker {
    serving: Arc<Serving<FileDevice>>,
    /// Unix time of store time 0.
    unix_start: u64,
    fd: RawFd,
    region: usize,
    /// The region's log. A `RefCell` because the store stages into it through the
    /// [`ConnDevice`] a session call holds (shared), while completions update it between
    /// calls; the two never overlap on the worker's one thread.
    log: RefCell<WorkerLog>,
    /// Batch bytes of writes in flight, by op id (the kernel reads them until the completion).
    inflight: HashMap<u64, Vec<u8>>,
    flushing: usize,
    /// This region's background compaction.
    compactor: Compactor,
    /// An erase is in flight: Some(outcome of its write once completed).
    erasing: Option<Option<bool>>,
    /// The id of the compaction read in flight (at most one).
    reading: Option<u64>,
    /// Ids of compaction operations, erases and reads (never repeat).
    next_compaction_op: u64,
}

impl DiskWorker {
    /// Takes region `region`'s log for this worker.
    pub(crate) fn install(
        serving: Arc<Serving<FileDevice>>,
        region: usize,
        unix_start: u64,
    ) -> Option<DiskWorker> {
        let log = serving.take_log(region)?;
        let fd = serving.device().as_raw_fd();
        let compactor = Compactor::new(serving.superblock().geometry.block_size);
        Some(DiskWorker {
            serving,
            unix_start,
            fd,
            region,
            log: RefCell::new(WorkerLog {
                log,
                staged: 0,
                recs: VecDeque::new(),
                front_token: 1,
                abandoned: VecDeque::new(),
            }),
            inflight: HashMap::new(),
            flushing: 0,
            compactor,
            erasing: None,
            reading: None,
            next_compaction_op: 1,
        })
    }

    /// The device for one session call on behalf of connection `(slot, generation)`.
    pub(crate) fn for_conn(&self, slot: u32, generation: u32) -> ConnDevice<'_> {
        ConnDevice {
            disk: self,
            conn: (slot, generation),
        }
    }

    /// Stages `change` into the log for `conn`; its token is the new [`WorkerLog::staged`].
    fn stage(&self, change: Change<'_>, conn: Option<(u32, u32)>) -> Result<(), StoreError> {
        let mut guard = self.log.borrow_mut();
        let w = &mut *guard;
        let token = w.staged + 1;
        let seq = self
            .serving
            .stage(&mut w.log, change, token)
            .map_err(|_| StoreError::OutOfMemory)?;
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
                "ringstore: region {}: background compaction freed {} segments, copied {} records ({} KiB), dropped {}, gave up {} times",
                self.region,
                st.freed,
                st.copied,
                st.copied_bytes >> 10,
                st.dropped,
                st.aborted
            );
        }
        let w = self.log.into_inner();
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
            && self.reading.is_none()
            && self.inflight.is_empty()
            && self.flushing == 0
            && self.log.borrow().log.is_idle()
    }

    /// One bounded step of background compaction (before [`DiskWorker::pump`], so its copies
    /// join this iteration's batch). Returns true when the loop should not sleep.
    pub(crate) fn compact_step(
        &mut self,
        sqes: &mut Vec<squeue::Entry>,
        now_unix: u64,
        now_ms: u64,
        may_start: bool,
    ) -> bool {
        if self.erasing.is_some() || self.reading.is_some() {
            return false;
        }
        let log = &mut self.log.get_mut().log;
        let step = self
            .compactor
            .step(&self.serving, log, now_unix, now_ms, may_start);
        match step {
            Step::Idle | Step::Waiting => false,
            Step::Busy => true,
            Step::Read { offset, len } => {
                let id = self.next_compaction_op;
                self.next_compaction_op += 1;
                let buf = self.compactor.read_buf();
                debug_assert_eq!(buf.len(), len);
                // The buffer lives in the compactor, unmoved and untouched, until `on_read`
                // (fed by `read_complete`); the loop sleeps until the completion.
                sqes.push(
                    opcode::Read::new(types::Fd(self.fd), buf.as_mut_ptr(), buf.len() as u32)
                        .offset(offset)
                        .build()
                        .user_data(Op::DiskCompactRead { id }.encode()),
                );
                self.reading = Some(id);
                false
            }
            Step::Erase { offset } => {
                let id = self.next_compaction_op;
                self.next_compaction_op += 1;
                let block = self.compactor.erase_block();
                // The write and its flush are linked: the flush runs only after the write, and a
                // failed write cancels it. The block lives in the compactor until `on_erased`.
                sqes.push(
                    opcode::Write::new(types::Fd(self.fd), block.as_ptr(), block.len() as u32)
                        .offset(offset)
                        .build()
                        .flags(squeue::Flags::IO_LINK)
                        .user_data(Op::DiskErase { id }.encode()),
                );
                sqes.push(
                    opcode::Fsync::new(types::Fd(self.fd))
                        .flags(types::FsyncFlags::DATASYNC)
                        .build()
                        .user_data(Op::DiskEraseFlush { id }.encode()),
                );
                self.erasing = Some(None);
                false
            }
        }
    }

    /// An erase write (`flush` false) or its flush completed.
    pub(crate) fn erase_complete(&mut self, flush: bool, res: i32, now_ms: u64) {
        let want = self.compactor.erase_block().len();
        if !flush {
            self.erasing = Some(Some(res >= 0 && res as usize == want));
            return;
        }
        let ok = matches!(self.erasing, Some(Some(true))) && res >= 0;
        self.erasing = None;
        if !ok {
            eprintln!("ringstore: data device: freeing a compacted segment failed in region {}; will retry", self.region);
        }
        let log = &mut self.log.get_mut().log;
        self.compactor.on_erased(&self.serving, log, ok, now_ms);
    }

    /// The compaction read `id` completed with `res` (bytes read or -errno).
    pub(crate) fn read_complete(&mut self, id: u64, res: i32, now_ms: u64) {
        if self.reading != Some(id) {
            return;
        }
        self.reading = None;
        let want = self.compactor.read_buf().len();
        if res < 0 || res as usize != want {
            let err = if res < 0 {
                std::io::Error::from_raw_os_error(-res).to_string()
            } else {
                format!("short read ({res} of {want} bytes)")
            };
            eprintln!(
                "ringstore: data device: compaction read failed in region {}: {err}; will retry",
                self.region
            );
        }
        self.compactor
            .on_read(usize::try_from(res).map_err(|_| ()), now_ms);
    }

    /// Queues what the log wants done as SQEs.
    pub(crate) fn pump(&mut self, sqes: &mut Vec<squeue::Entry>) {
        let w = self.log.get_mut();
        while let Some(action) = w.log.poll_action() {
            match action {
                Action::WriteBatch { id, offset, bytes } => {
                    let entry =
                        opcode::Write::new(types::Fd(self.fd), bytes.as_ptr(), bytes.len() as u32)
                            .offset(offset)
                            .build()
                            .user_data(Op::DiskWrite { id }.encode());
                    // The Vec's heap buffer does not move when the Vec is moved into the map.
                    self.inflight.insert(id, bytes);
                    sqes.push(entry);
                }
                Action::Flush { id } => {
                    self.flushing += 1;
                    sqes.push(
                        opcode::Fsync::new(types::Fd(self.fd))
                            .flags(types::FsyncFlags::DATASYNC)
                            .build()
                            .user_data(Op::DiskFlush { id }.encode()),
                    );
                }
            }
        }
    }

    /// Feeds a batch write (`flush` false) or flush completion back; returns what the worker
    /// must do about it.
    pub(crate) fn complete(&mut self, flush: bool, id: u64, res: i32) -> Outcome {
        let ok = if flush {
            self.flushing = self.flushing.saturating_sub(1);
            res >= 0
        } else {
            let want = self.inflight.remove(&id).map_or(0, |b| b.len());
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
            let rec = w.recs.pop_front().expect("front exists");
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
            let (_, object, chunks) = w.abandoned.pop_front().expect("front exists");
            serving.abandon_object(object, chunks);
        }
        serving.set_pending_floor(
            w.log.region() as usize,
            w.recs.front().map_or(u64::MAX, |r| r.seq),
        );
        out
    }
}
