//! The data device on the workers: each worker drives one region log through its own ring.
//!
//! Sessions stay sans-IO: a mutation reaches [`ThreadJournal::record`] (called by the store
//! under the key's shard lock), which encodes it into the calling worker's log — kept in a
//! thread-local so the service needs no new parameters — and notes which connection and which
//! reply bytes it belongs to. At the end of each loop iteration the worker turns what its log
//! wants done into SQEs (one write per batch, then one fdatasync), with `user_data` =
//! `op id << 8 | opcode` (op ids never repeat). A connection whose output covers staged
//! records is held until a completed flush covers its newest record; a write completion
//! alone releases nothing (design seed 001). A failed write or flush turns the affected
//! replies into errors and drops their RAM copies.
use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;

use io_uring::{opcode, squeue, types};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use ringstore_durable::{
    parse_chunk_key, Action, Change, Compactor, DurableError, FileDevice, RegionLog, Serving, Step,
};
use ringstore_service::{Fetched, Journal, Mutation, Protocol};
use ringstore_store::{Backfill, StoreError, Time};

/// A write of a batch to the data device.
pub(crate) const OP_DISK_WRITE: u64 = 7;
/// An fdatasync of the data device.
pub(crate) const OP_DISK_FLUSH: u64 = 8;
/// Background compaction: the zeroed header write that frees a segment (linked to the next).
pub(crate) const OP_DISK_ERASE: u64 = 9;
/// Background compaction: the fdatasync after the erase write.
pub(crate) const OP_DISK_ERASE_FLUSH: u64 = 10;
/// A no-op that wakes the loop at once while compaction has work that needs no completion.
pub(crate) const OP_WAKE: u64 = 11;
/// Background compaction: a read of the victim segment into the compactor's buffer.
pub(crate) const OP_DISK_COMPACT_READ: u64 = 12;

/// Test-only fault injection (documented in ADR 0011, never set in production): with
/// `RINGSTORE_TEST_FAIL_DATA_WRITE=N` the Nth data-device batch write completion of the process
/// (counting from 1) is reported as EIO, with `RINGSTORE_TEST_FAIL_DATA_FLUSH=N` the Nth flush.
struct FaultHook {
    write: Option<u64>,
    flush: Option<u64>,
    writes: AtomicU64,
    flushes: AtomicU64,
}

fn fault_hook() -> &'static FaultHook {
    static HOOK: OnceLock<FaultHook> = OnceLock::new();
    HOOK.get_or_init(|| {
        let n = |name: &str| {
            std::env::var(name)
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .filter(|&n| n > 0)
        };
        FaultHook {
            write: n("RINGSTORE_TEST_FAIL_DATA_WRITE"),
            flush: n("RINGSTORE_TEST_FAIL_DATA_FLUSH"),
            writes: AtomicU64::new(0),
            flushes: AtomicU64::new(0),
        }
    })
}

/// The completion result after the test-only fault hook (unchanged unless the hook is set).
fn inject_fault(op: u64, res: i32) -> i32 {
    let hook = fault_hook();
    let (target, count) = match op {
        OP_DISK_WRITE => (hook.write, &hook.writes),
        OP_DISK_FLUSH => (hook.flush, &hook.flushes),
        _ => return res,
    };
    match target {
        Some(n) if count.fetch_add(1, Ordering::Relaxed) + 1 == n => -libc::EIO,
        _ => res,
    }
}

/// Writes a region log may have accepted and not yet settled (more is "out of memory").
pub(crate) const PENDING_WRITES_MAX: usize = 1 << 16;

/// One staged record on its way to the device.
struct Rec {
    /// Connection it answers: (slot, generation, protocol); `None` when staged outside a request.
    conn: Option<(u32, u32, Protocol)>,
    /// The reply's bytes in the connection's output.
    span: Option<(usize, usize)>,
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
    /// The connection whose bytes the session is consuming now.
    current: Option<(u32, u32, Protocol)>,
    /// Newest token staged during the current call.
    call_max: u64,
    /// Large objects with a chunk whose write failed, until their session asks
    /// ([`Journal::object_failed`]); oldest first, at most [`FAILED_OBJECTS_MAX`].
    failed_objects: VecDeque<u64>,
    /// Uploads given up: (token staged last when given up, object, chunks). Their chunks
    /// leave the index once everything up to that token has settled (a chunk acked later
    /// would otherwise enter it again).
    abandoned: VecDeque<(u64, u64, u32)>,
}

/// Failed large-object ids remembered per worker. A session asks right after its chunks
/// settled, so only ids of sessions that went away meanwhile accumulate; the oldest go first.
const FAILED_OBJECTS_MAX: usize = 1024;

thread_local! {
    static LOG: RefCell<Option<WorkerLog>> = const { RefCell::new(None) };
}

/// The journal the store calls; stages into the calling worker's log.
pub(crate) struct ThreadJournal {
    pub serving: Arc<Serving<FileDevice>>,
    /// Unix time of store time 0.
    pub unix_start: u64,
}

fn to_unix(unix_start: u64, t: Time) -> u64 {
    if t == 0 {
        0
    } else {
        unix_start + u64::from(t)
    }
}

impl Journal for ThreadJournal {
    fn record(&self, m: Mutation<'_>) -> Result<(), StoreError> {
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
                exptime: to_unix(self.unix_start, exptime),
                cas,
                large,
            },
            Mutation::Delete { key } => Change::Delete { key },
            Mutation::FlushAll { at } => Change::FlushAll {
                at: self.unix_start + u64::from(at),
            },
        };
        self.stage(change)
    }

    fn new_object_id(&self) -> u64 {
        self.serving.next_object_id()
    }

    fn chunk_len(&self) -> usize {
        self.serving.chunk_len()
    }

    fn stage_chunk(&self, object: u64, index: u32, bytes: &[u8]) -> Result<(), StoreError> {
        self.stage(Change::Chunk {
            object,
            index,
            bytes,
        })
    }

    fn abandon_object(&self, object: u64, chunks: u32) {
        LOG.with(|cell| {
            let Ok(mut guard) = cell.try_borrow_mut() else {
                return; // not a worker: the next start's sweep drops them
            };
            let Some(w) = guard.as_mut() else { return };
            if w.recs.is_empty() {
                self.serving.abandon_object(object, chunks);
            } else {
                w.abandoned.push_back((w.staged, object, chunks));
            }
        })
    }

    fn object_failed(&self, object: u64) -> bool {
        LOG.with(|cell| {
            let Ok(mut guard) = cell.try_borrow_mut() else {
                return true;
            };
            let Some(w) = guard.as_mut() else { return true };
            match w.failed_objects.iter().position(|&o| o == object) {
                Some(at) => {
                    w.failed_objects.remove(at);
                    true
                }
                None => false,
            }
        })
    }

    fn device_stats(&self, out: &mut dyn FnMut(&'static str, u64)) {
        let (uploads, reserved) = self.serving.uploads();
        out("data_reserved_bytes", reserved);
        out("data_uploads_in_progress", uploads as u64);
        out("data_corrupt_records", self.serving.corrupt_records());
    }

    fn staged(&self) -> u64 {
        LOG.with(|cell| {
            cell.try_borrow()
                .ok()
                .and_then(|g| g.as_ref().map(|w| w.staged))
                .unwrap_or(0)
        })
    }

    fn reply_span(&self, since: u64, start: usize, end: usize) {
        self.note_span(since, start, end)
    }
}

impl ThreadJournal {
    /// Stages `change` into the calling worker's log, for the connection being served.
    fn stage(&self, change: Change<'_>) -> Result<(), StoreError> {
        LOG.with(|cell| {
            // No log on this thread (not a worker, e.g. the UDP thread): refuse rather than lie.
            let Ok(mut guard) = cell.try_borrow_mut() else {
                return Err(StoreError::OutOfMemory);
            };
            let Some(w) = guard.as_mut() else {
                return Err(StoreError::OutOfMemory);
            };
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
                conn: w.current,
                span: None,
                seq,
                state: 0,
            });
            w.call_max = token;
            Ok(())
        })
    }

    fn note_span(&self, since: u64, start: usize, end: usize) {
        LOG.with(|cell| {
            let Ok(mut guard) = cell.try_borrow_mut() else {
                return;
            };
            let Some(w) = guard.as_mut() else { return };
            for token in since + 1..=w.staged {
                if let Some(rec) = token
                    .checked_sub(w.front_token)
                    .and_then(|i| w.recs.get_mut(i as usize))
                {
                    rec.span = Some((start, end));
                }
            }
        })
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
                if matches!(err, DurableError::Corrupt { .. }) {
                    self.serving.note_corrupt();
                }
                eprintln!("ringstore: data device read failed: {err}");
                None
            }
        }
    }

    fn read_chunk(&self, object: u64, index: u32) -> Option<Vec<u8>> {
        self.serving
            .read_chunk(object, index)
            .map_err(|err| {
                if matches!(err, DurableError::Corrupt { .. }) {
                    self.serving.note_corrupt();
                }
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
        self.serving
            .read_chunk_range(object, index, start, end)
            .map_err(|err| {
                if matches!(err, DurableError::Corrupt { .. }) {
                    self.serving.note_corrupt();
                }
                eprintln!(
                    "ringstore: data device: chunk {index} of object {object} \
                     bytes {start}..{end}: {err}"
                )
            })
            .ok()
    }
}

/// What a completion changed for the worker.
#[derive(Default)]
pub(crate) struct Outcome {
    /// RAM copies to drop: (key, cas).
    pub forget: Vec<(Box<[u8]>, u64)>,
    /// Replies to replace with an error: (slot, generation, protocol, start, end).
    pub failed_replies: Vec<(u32, u32, Protocol, usize, usize)>,
    /// Every token up to this one is settled.
    pub settled_through: u64,
}

/// A worker's side of the data device.
pub(crate) struct DiskWorker {
    serving: Arc<Serving<FileDevice>>,
    fd: RawFd,
    region: usize,
    /// Batch bytes of writes in flight, by op id (the kernel reads them until the completion).
    inflight: HashMap<u64, Vec<u8>>,
    flushing: usize,
    /// Held connections in gate order: (slot, generation, token their output waits for).
    pub waiting: VecDeque<(u32, u32, u64)>,
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
    /// Takes region `region`'s log onto the calling thread.
    pub(crate) fn install(serving: Arc<Serving<FileDevice>>, region: usize) -> Option<DiskWorker> {
        let log = serving.take_log(region)?;
        LOG.with(|cell| {
            *cell.borrow_mut() = Some(WorkerLog {
                log,
                staged: 0,
                recs: VecDeque::new(),
                front_token: 1,
                current: None,
                call_max: 0,
                failed_objects: VecDeque::new(),
                abandoned: VecDeque::new(),
            })
        });
        let fd = serving.device().as_raw_fd();
        let compactor = Compactor::new(serving.superblock().geometry.block_size);
        Some(DiskWorker {
            serving,
            fd,
            region,
            inflight: HashMap::new(),
            flushing: 0,
            waiting: VecDeque::new(),
            compactor,
            erasing: None,
            reading: None,
            next_compaction_op: 1,
        })
    }

    /// Gives the log back (after it drained).
    pub(crate) fn uninstall(&self) {
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
        if let Some(w) = LOG.with(|cell| cell.borrow_mut().take()) {
            if !w.log.is_idle() {
                eprintln!(
                    "ringstore: region {} stopped with writes in flight",
                    self.region
                );
            }
            self.serving.park_log(w.log);
        }
    }

    /// The session is about to consume bytes of this connection.
    pub(crate) fn begin_call(conn: (u32, u32, Protocol)) {
        LOG.with(|cell| {
            if let Some(w) = cell.borrow_mut().as_mut() {
                w.current = Some(conn);
                w.call_max = 0;
            }
        })
    }

    /// The newest token staged during the call (0: nothing was staged, nothing to wait for).
    pub(crate) fn end_call() -> u64 {
        LOG.with(|cell| {
            cell.borrow_mut().as_mut().map_or(0, |w| {
                w.current = None;
                std::mem::take(&mut w.call_max)
            })
        })
    }

    /// True when nothing is staged or in flight (a compaction in progress included).
    pub(crate) fn is_idle(&self) -> bool {
        self.compactor.is_idle()
            && self.erasing.is_none()
            && self.reading.is_none()
            && self.inflight.is_empty()
            && self.flushing == 0
            && LOG.with(|cell| cell.borrow().as_ref().is_none_or(|w| w.log.is_idle()))
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
        let serving = &self.serving;
        let compactor = &mut self.compactor;
        let step = LOG.with(|cell| {
            let mut guard = cell.borrow_mut();
            let Some(w) = guard.as_mut() else {
                return Step::Idle;
            };
            compactor.step(serving, &mut w.log, now_unix, now_ms, may_start)
        });
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
                        .user_data((id << 8) | OP_DISK_COMPACT_READ),
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
                        .user_data((id << 8) | OP_DISK_ERASE),
                );
                sqes.push(
                    opcode::Fsync::new(types::Fd(self.fd))
                        .flags(types::FsyncFlags::DATASYNC)
                        .build()
                        .user_data((id << 8) | OP_DISK_ERASE_FLUSH),
                );
                self.erasing = Some(None);
                false
            }
        }
    }

    /// An erase write or its flush completed.
    pub(crate) fn erase_complete(&mut self, op: u64, res: i32, now_ms: u64) {
        let want = self.compactor.erase_block().len();
        if op == OP_DISK_ERASE {
            self.erasing = Some(Some(res >= 0 && res as usize == want));
            return;
        }
        let ok = matches!(self.erasing, Some(Some(true))) && res >= 0;
        self.erasing = None;
        if !ok {
            eprintln!("ringstore: data device: freeing a compacted segment failed in region {}; will retry", self.region);
        }
        let serving = &self.serving;
        let compactor = &mut self.compactor;
        LOG.with(|cell| {
            if let Some(w) = cell.borrow_mut().as_mut() {
                compactor.on_erased(serving, &mut w.log, ok, now_ms);
            }
        });
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
        LOG.with(|cell| {
            let mut guard = cell.borrow_mut();
            let Some(w) = guard.as_mut() else { return };
            while let Some(action) = w.log.poll_action() {
                match action {
                    Action::WriteBatch { id, offset, bytes } => {
                        let entry = opcode::Write::new(
                            types::Fd(self.fd),
                            bytes.as_ptr(),
                            bytes.len() as u32,
                        )
                        .offset(offset)
                        .build()
                        .user_data((id << 8) | OP_DISK_WRITE);
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
                                .user_data((id << 8) | OP_DISK_FLUSH),
                        );
                    }
                }
            }
        })
    }

    /// Feeds a completion back; returns what the worker must do about it.
    pub(crate) fn complete(&mut self, op: u64, id: u64, res: i32) -> Outcome {
        let res = inject_fault(op, res);
        let ok = if op == OP_DISK_WRITE {
            let want = self.inflight.remove(&id).map_or(0, |b| b.len());
            res >= 0 && res as usize == want
        } else {
            self.flushing = self.flushing.saturating_sub(1);
            res >= 0
        };
        if !ok {
            let what = if op == OP_DISK_WRITE {
                "write"
            } else {
                "fdatasync"
            };
            let err = if res < 0 {
                std::io::Error::from_raw_os_error(-res).to_string()
            } else {
                format!("short write ({res} bytes)")
            };
            eprintln!("ringstore: data device {what} failed in region {}: {err}; failing the affected requests", self.region);
        }
        let serving = &self.serving;
        let compactor = &mut self.compactor;
        LOG.with(|cell| {
            let mut guard = cell.borrow_mut();
            let Some(w) = guard.as_mut() else {
                return Outcome::default();
            };
            let done = if op == OP_DISK_WRITE {
                w.log.on_write_complete(id, ok)
            } else {
                w.log.on_flush_complete(id, ok)
            };
            let mut out = Outcome::default();
            match done {
                Ok(done) => {
                    let settled = serving.settle(done);
                    compactor.on_relocated(&settled.relocated);
                    for t in settled.acked {
                        if let Some(rec) = t
                            .checked_sub(w.front_token)
                            .and_then(|i| w.recs.get_mut(i as usize))
                        {
                            rec.state = 1;
                        }
                    }
                    for (t, key, cas) in settled.failed {
                        if let Some(rec) = t
                            .checked_sub(w.front_token)
                            .and_then(|i| w.recs.get_mut(i as usize))
                        {
                            rec.state = 2;
                        }
                        if let Some((object, _)) = parse_chunk_key(&key) {
                            if w.failed_objects.len() == FAILED_OBJECTS_MAX {
                                w.failed_objects.pop_front();
                            }
                            if !w.failed_objects.contains(&object) {
                                w.failed_objects.push_back(object);
                            }
                            continue;
                        }
                        out.forget.push((key, cas));
                    }
                }
                Err(err) => eprintln!("ringstore: data device completion refused: {err}"),
            }
            while w.recs.front().is_some_and(|r| r.state != 0) {
                let rec = w.recs.pop_front().expect("front exists");
                w.front_token += 1;
                if rec.state == 2 {
                    if let (Some((slot, gen, proto)), Some((start, end))) = (rec.conn, rec.span) {
                        out.failed_replies.push((slot, gen, proto, start, end));
                    }
                }
            }
            out.settled_through = w.front_token - 1;
            while w
                .abandoned
                .front()
                .is_some_and(|&(token, _, _)| token <= out.settled_through)
            {
                let (_, object, chunks) = w.abandoned.pop_front().expect("front exists");
                serving.abandon_object(object, chunks);
            }
            serving.set_pending_floor(
                w.log.region() as usize,
                w.recs.front().map_or(u64::MAX, |r| r.seq),
            );
            out
        })
    }
}

/// Failed reply spans of one connection: its protocol and the byte ranges to replace.
pub(crate) type FailedSpans = (Protocol, Vec<(usize, usize)>);

/// Replaces failed replies in `out` (spans sorted from the back so offsets stay valid).
pub(crate) fn rewrite_failed(
    out: &mut Vec<u8>,
    mut spans: Vec<(usize, usize)>,
    protocol: Protocol,
) {
    spans.sort_unstable_by_key(|&(start, _)| std::cmp::Reverse(start));
    spans.dedup();
    for (start, end) in spans {
        if start < end && end <= out.len() {
            out.splice(
                start..end,
                ringstore_service::durable_failure_reply(protocol)
                    .iter()
                    .copied(),
            );
        }
    }
}
