//! The data device on a readiness worker (ADR 0033): the log's bookkeeping is the io_uring
//! worker's ([`DiskWorker`]); its I/O goes to the worker's [`SyncThread`], whose
//! completions arrive through an eventfd the loop watches, and settle the same way
//! ([`crate::connection::settle_sessions`]): replies held until their group commit.

use super::*;
use crate::connection::settle_sessions;
use crate::durable::{DiskWorker, Done, Outcome, SyncThread};

/// A readiness worker's data device: its region log and the thread that writes it.
pub(super) struct Disk {
    pub log: DiskWorker,
    pub thread: SyncThread,
    /// Completions taken from the thread, reused.
    pub done: Vec<Done>,
}

impl Disk {
    /// Takes region `index`'s log and starts its thread.
    pub(super) fn start(
        serving: &Arc<ringstore_durable::Serving<ringstore_durable::FileDevice>>,
        index: usize,
    ) -> Result<Disk, String> {
        let log = DiskWorker::install(serving.clone(), index)
            .ok_or("the data device has no free region for it")?;
        let files = log
            .clone_files()
            .map_err(|err| format!("cannot open the data device again for its thread: {err}"))?;
        let thread = SyncThread::start(index, files)
            .map_err(|err| format!("cannot start its data-device thread: {err}"))?;
        Ok(Disk {
            log,
            thread,
            done: Vec::new(),
        })
    }

    /// Waits for the thread to finish what it was given, then gives the log back.
    pub(super) fn stop(self) {
        let Disk { log, thread, .. } = self;
        drop(thread);
        log.uninstall();
    }
}

impl<H: Handler> Worker<H> {
    /// One compaction step, then this iteration's group commit (everything staged since the
    /// last one: one write and its flush), handed to the thread. True when compaction wants
    /// to go on without the loop sleeping.
    pub(super) fn pump_disk(&mut self) -> bool {
        let Some(disk) = &mut self.disk else {
            return false;
        };
        let may_start = self.stopping_deadline.is_none();
        let busy =
            disk.log
                .compact_step(&mut disk.thread, self.now.unix, self.now.mono_ms, may_start);
        disk.log.pump(&mut disk.thread);
        busy
    }

    /// The thread's completions: settle the log, report to the sessions, resume the
    /// connections no longer waiting.
    pub(super) fn on_disk(&mut self) {
        let Some(disk) = &mut self.disk else { return };
        let mut done = std::mem::take(&mut disk.done);
        disk.thread.drain(&mut done);
        for completion in done.drain(..) {
            let outcome = self.complete(completion);
            let resumed = settle_sessions(
                &*self.setup.handler,
                &mut self.conns,
                &outcome,
                self.now,
                |_, _, _| {}, // no UDP on this runtime
            );
            for (slot, generation) in resumed {
                let flow = self
                    .conns
                    .get_mut(slot, generation)
                    .and_then(|conn| conn.machine.held_flow());
                if flow.is_some_and(|flow| self.served(slot, flow)) {
                    self.runnable.push((slot, generation));
                }
            }
        }
        if let Some(disk) = &mut self.disk {
            disk.done = done;
        }
    }

    /// Feeds one completion to the log.
    fn complete(&mut self, completion: Done) -> Outcome {
        let now_ms = self.now.mono_ms;
        let Some(disk) = &mut self.disk else {
            return Outcome::default();
        };
        let log = &mut disk.log;
        match completion {
            Done::Write { id, res, bytes } => {
                log.recycle(bytes);
                return log.complete(false, id, res);
            }
            Done::Flush { id, res } => return log.complete(true, id, res),
            Done::Read { id, res, bytes } => {
                if let Some(buf) = log.read_buf_of(id) {
                    if res >= 0 && bytes.len() == buf.len() {
                        buf.copy_from_slice(&bytes);
                    }
                }
                log.read_complete(id, res, now_ms);
            }
            Done::Erase { flush, res } => return log.erase_complete(flush, res, now_ms),
        }
        Outcome::default()
    }

    /// True when nothing of the data device is staged or in flight.
    pub(super) fn disk_idle(&self) -> bool {
        self.disk.as_ref().is_none_or(|d| d.log.is_idle())
    }
}
