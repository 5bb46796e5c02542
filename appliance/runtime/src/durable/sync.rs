//! The readiness runtime's data-device thread (ADR 0033): one per worker, it performs the
//! worker's log I/O with plain `pwrite`/`fdatasync`/`pread` in the order given, and signals
//! each completion on an eventfd the worker's epoll loop waits on.
//!
//! One thread per worker, not per device: each worker owns one region log, whose group
//! commit is one write then one fdatasync, so a thread of its own keeps the region's order
//! with no lock and no queue shared between workers, and a slow flush of one region never
//! delays another's. Jobs run one at a time: a chained write's flush simply follows it (and
//! is cancelled, as io_uring's link would be, when the write failed).

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::mpsc::{Receiver, Sender, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;

use ringstore_durable::{BlockDevice, FileDevice};

use super::{DiskSink, FlushFiles};

/// Jobs handed to the thread and not yet taken. The log keeps a handful of writes and flushes
/// in flight and compaction one operation, so this is never reached in practice; reaching
/// it would only make the worker wait for the device, as it must.
const JOBS_MAX: usize = 64;

/// One operation for the thread.
enum Job {
    /// A batch write, with the flush chained behind it (id, lane) if any.
    Write {
        id: u64,
        offset: u64,
        bytes: Vec<u8>,
        then_flush: Option<(u64, usize)>,
    },
    Flush {
        id: u64,
        lane: usize,
    },
    Read {
        id: u64,
        offset: u64,
        len: usize,
    },
    Erase {
        offset: u64,
        block: Vec<u8>,
    },
}

/// A completed operation; `res` as io_uring reports it (bytes moved, or -errno).
pub(crate) enum Done {
    /// The batch bytes come back for reuse.
    Write {
        id: u64,
        res: i32,
        bytes: Vec<u8>,
    },
    Flush {
        id: u64,
        res: i32,
    },
    /// The bytes read, for the compactor's buffer.
    Read {
        id: u64,
        res: i32,
        bytes: Vec<u8>,
    },
    /// An erase's write (`flush` false) or its flush.
    Erase {
        flush: bool,
        res: i32,
    },
}

/// The worker's handle on its data-device thread.
pub(crate) struct SyncThread {
    jobs: Option<SyncSender<Job>>,
    done: Receiver<Done>,
    /// Readable when a completion waits (watched by the worker's epoll).
    wake: Arc<OwnedFd>,
    thread: Option<JoinHandle<()>>,
    /// A chained write waiting for its flush (the log's very next action).
    chained: Option<(u64, u64, Vec<u8>)>,
    /// Completions of jobs the thread could not be given (it is gone): failures.
    lost: Vec<Done>,
}

impl SyncThread {
    /// Starts the thread of worker `index` on its own handles of the device and its flushes'.
    pub(crate) fn start(
        index: usize,
        files: (FileDevice, FlushFiles),
    ) -> std::io::Result<SyncThread> {
        let wake = Arc::new(crate::sys::eventfd()?);
        let (jobs, job_rx) = std::sync::mpsc::sync_channel(JOBS_MAX);
        let (done_tx, done) = std::sync::mpsc::channel();
        let signal = Arc::clone(&wake);
        let thread = std::thread::Builder::new()
            .name(format!("ringstore-sync-{index}"))
            .spawn(move || serve(&files, &job_rx, &done_tx, signal.as_raw_fd()))?;
        Ok(SyncThread {
            jobs: Some(jobs),
            done,
            wake,
            thread: Some(thread),
            chained: None,
            lost: Vec::new(),
        })
    }

    /// The eventfd to watch (level-triggered).
    pub(crate) fn eventfd(&self) -> RawFd {
        self.wake.as_raw_fd()
    }

    /// Takes every completion that arrived (and resets the eventfd).
    pub(crate) fn drain(&mut self, into: &mut Vec<Done>) {
        use std::os::fd::AsFd;
        let _ = crate::sys::eventfd_read(self.wake.as_fd());
        into.append(&mut self.lost);
        while let Ok(done) = self.done.try_recv() {
            into.push(done);
        }
    }

    fn send(&mut self, job: Job) {
        let Some(jobs) = &self.jobs else { return };
        let job = match jobs.try_send(job) {
            Ok(()) => return,
            // Full: wait for the device (bounded by JOBS_MAX; see there).
            Err(TrySendError::Full(job)) => match jobs.send(job) {
                Ok(()) => return,
                Err(err) => err.0,
            },
            Err(TrySendError::Disconnected(job)) => job,
        };
        // The thread is gone: every operation fails, so the sessions still get their answers.
        self.lost.extend(failed(job));
        crate::sys::eventfd_signal(self.eventfd());
    }
}

impl DiskSink for SyncThread {
    fn write(&mut self, id: u64, offset: u64, bytes: Vec<u8>, chained: bool) -> Option<Vec<u8>> {
        if chained {
            self.chained = Some((id, offset, bytes));
        } else {
            self.send(Job::Write {
                id,
                offset,
                bytes,
                then_flush: None,
            });
        }
        None
    }

    fn flush(&mut self, id: u64, lane: usize) {
        match self.chained.take() {
            Some((write, offset, bytes)) => self.send(Job::Write {
                id: write,
                offset,
                bytes,
                then_flush: Some((id, lane)),
            }),
            None => self.send(Job::Flush { id, lane }),
        }
    }

    fn end_of_batch(&mut self) {
        // Unreachable (the log returns a chained write's flush next); never drop the write.
        debug_assert!(self.chained.is_none());
        if let Some((id, offset, bytes)) = self.chained.take() {
            self.send(Job::Write {
                id,
                offset,
                bytes,
                then_flush: None,
            });
        }
    }

    fn read(&mut self, id: u64, offset: u64, buf: &mut [u8]) {
        self.send(Job::Read {
            id,
            offset,
            len: buf.len(),
        });
    }

    fn erase(&mut self, _id: u64, offset: u64, block: &[u8]) {
        self.send(Job::Erase {
            offset,
            block: block.to_vec(),
        });
    }
}

impl Drop for SyncThread {
    /// Lets the thread finish what it was given, then joins it.
    fn drop(&mut self) {
        self.jobs = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The completions of a job that never ran: all failed (EIO).
fn failed(job: Job) -> Vec<Done> {
    let res = -libc::EIO;
    match job {
        Job::Write {
            id,
            bytes,
            then_flush,
            ..
        } => {
            let mut out = vec![Done::Write { id, res, bytes }];
            out.extend(then_flush.map(|(id, _)| Done::Flush { id, res }));
            out
        }
        Job::Flush { id, .. } => vec![Done::Flush { id, res }],
        Job::Read { id, .. } => vec![Done::Read {
            id,
            res,
            bytes: Vec::new(),
        }],
        Job::Erase { .. } => vec![
            Done::Erase { flush: false, res },
            Done::Erase { flush: true, res },
        ],
    }
}

/// The thread: runs each job in order until the worker drops its sender.
fn serve(files: &(FileDevice, FlushFiles), jobs: &Receiver<Job>, done: &Sender<Done>, wake: RawFd) {
    while let Ok(job) = jobs.recv() {
        for completion in run(files, job) {
            if done.send(completion).is_err() {
                return; // the worker is gone
            }
        }
        crate::sys::eventfd_signal(wake);
    }
}

/// Performs one job; its completions in order.
fn run((device, flushes): &(FileDevice, FlushFiles), job: Job) -> Vec<Done> {
    let flush = |lane: usize| result(flushes.for_lane(lane).sync_data(), 0);
    match job {
        Job::Write {
            id,
            offset,
            bytes,
            then_flush,
        } => {
            let res = result(device.write_at(offset, &bytes), bytes.len());
            let mut out = vec![Done::Write { id, res, bytes }];
            if let Some((flush_id, lane_no)) = then_flush {
                // Linked as on io_uring: a failed write cancels its flush.
                let res = if res < 0 {
                    -libc::ECANCELED
                } else {
                    flush(lane_no)
                };
                out.push(Done::Flush { id: flush_id, res });
            }
            out
        }
        Job::Flush { id, lane } => vec![Done::Flush {
            id,
            res: flush(lane),
        }],
        Job::Read { id, offset, len } => {
            let mut bytes = vec![0u8; len];
            let res = result(device.read_at(offset, &mut bytes), len);
            vec![Done::Read { id, res, bytes }]
        }
        Job::Erase { offset, block } => {
            let res = result(device.write_at(offset, &block), block.len());
            let synced = if res < 0 {
                -libc::ECANCELED
            } else {
                result(flushes.erase.sync_data(), 0)
            };
            vec![
                Done::Erase { flush: false, res },
                Done::Erase {
                    flush: true,
                    res: synced,
                },
            ]
        }
    }
}

/// An operation's result as io_uring reports it: `len` on success, else -errno.
fn result(r: std::io::Result<()>, len: usize) -> i32 {
    match r {
        Ok(()) => i32::try_from(len).unwrap_or(i32::MAX),
        Err(err) => -err.raw_os_error().unwrap_or(libc::EIO),
    }
}
