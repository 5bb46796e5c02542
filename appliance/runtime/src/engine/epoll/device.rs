//! The data device on a readiness worker (ADR 0033): the log's bookkeeping is the io_uring
//! worker's ([`DeviceWorker`]); its I/O goes to the worker's [`SyncThread`], whose
//! completions arrive through an eventfd the loop watches, and settle the same way
//! ([`crate::connection::settle_sessions`]): replies held until their group commit.

use super::*;
use crate::connection::settle_sessions;
use crate::durable::{DeviceWorker, Done, Outcome, SyncThread};

/// A readiness worker's data device: its region log and the thread that writes it.
pub(super) struct DeviceThreads {
    pub log: DeviceWorker,
    pub thread: SyncThread,
    /// Completions taken from the thread, reused.
    pub done: Vec<Done>,
}

impl DeviceThreads {
    /// Takes region `index`'s log and starts its thread.
    pub(super) fn start(
        serving: &Arc<ringstore_durable::Serving<ringstore_durable::FileDevice>>,
        index: usize,
    ) -> Result<DeviceThreads, String> {
        let log = DeviceWorker::install(serving.clone(), index)?;
        let thread = match log.clone_files() {
            Err(err) => Err(format!(
                "cannot open the data device again for its thread: {err}"
            )),
            Ok(files) => SyncThread::start(index, files)
                .map_err(|err| format!("cannot start its data-device thread: {err}")),
        };
        let thread = match thread {
            Ok(thread) => thread,
            Err(err) => {
                log.uninstall(); // the region's log goes back, as install leaves it on failure
                return Err(err);
            }
        };
        Ok(DeviceThreads {
            log,
            thread,
            done: Vec::new(),
        })
    }

    /// Waits for the thread to finish what it was given, then gives the log back.
    pub(super) fn stop(self) {
        let DeviceThreads { log, thread, .. } = self;
        drop(thread);
        log.uninstall();
    }
}

impl<H: Handler> Worker<H> {
    /// One compaction step, then this iteration's group commit (everything staged since the
    /// last one: one write and its flush), handed to the thread. True when compaction wants
    /// to go on without the loop sleeping.
    pub(super) fn pump_device(&mut self) -> bool {
        let Some(device) = &mut self.device else {
            return false;
        };
        let may_start = self.core.stopping_deadline.is_none();
        let busy = device.log.compact_step(
            &mut device.thread,
            self.core.now.unix,
            self.core.now.mono_ms,
            may_start,
        );
        device.log.pump(&mut device.thread);
        busy
    }

    /// The thread's completions: settle the log, report to the sessions, resume the
    /// connections no longer waiting.
    pub(super) fn on_device(&mut self) {
        let Some(device) = &mut self.device else {
            return;
        };
        let mut done = std::mem::take(&mut device.done);
        device.thread.drain(&mut done);
        for completion in done.drain(..) {
            let outcome = self.complete(completion);
            let resumed = settle_sessions(
                &*self.core.setup.handler,
                &mut self.core.conns,
                &outcome,
                self.core.now,
                |_, _, _| {}, // no UDP on this runtime
            );
            for (slot, generation) in resumed {
                let flow = self
                    .core
                    .conns
                    .get_mut(slot, generation)
                    .and_then(|conn| conn.machine.held_flow());
                if flow.is_some_and(|flow| self.served(slot, flow)) {
                    self.runnable.push((slot, generation));
                }
            }
        }
        if let Some(device) = &mut self.device {
            device.done = done;
        }
    }

    /// Feeds one completion to the log.
    fn complete(&mut self, completion: Done) -> Outcome {
        let now_ms = self.core.now.mono_ms;
        let Some(device) = &mut self.device else {
            return Outcome::default();
        };
        let log = &mut device.log;
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
    pub(super) fn device_idle(&self) -> bool {
        self.device.as_ref().is_none_or(|d| d.log.is_idle())
    }
}
