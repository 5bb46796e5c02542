//! Background compaction on the worker's data device: the compactor's reads, erases and
//! their flushes handed to the runtime's [`DiskSink`], and their completions fed back.

use super::*;

impl DeviceWorker {
    /// One bounded step of background compaction (before [`DeviceWorker::pump`], so its copies
    /// join this iteration's batch). Returns true when the loop should not sleep.
    pub(crate) fn compact_step(
        &mut self,
        sink: &mut impl DiskSink,
        now_unix: u64,
        now_ms: u64,
        may_start: bool,
    ) -> bool {
        if self.erasing.is_some() || self.reading.is_some() {
            return false;
        }
        if std::mem::take(&mut self.erase_again) {
            self.start_erase(sink, self.erase_offset);
            return false;
        }
        let log = &mut self.log.get_mut().log;
        let step = self
            .compactor
            .step(&self.serving, log, now_unix, now_ms, may_start);
        if self.compactor.take_retired() {
            eprintln!("ringstore: data device: the old data key is retired: every record under it was rewritten and the superblock no longer holds it");
        }
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
                sink.read(id, offset, buf);
                self.reading = Some(id);
                false
            }
            Step::Erase { offset } => {
                self.erase_retried = false;
                self.start_erase(sink, offset);
                false
            }
        }
    }

    fn start_erase(&mut self, sink: &mut impl DiskSink, offset: u64) {
        let id = self.next_compaction_op;
        self.next_compaction_op += 1;
        // The block lives in the compactor until `on_erased`.
        sink.erase(id, offset, self.compactor.erase_block());
        self.erasing = Some(None);
        self.erase_offset = offset;
    }

    /// The buffer of compaction read `id` (a sink that read into a buffer of its own copies
    /// it here before [`DeviceWorker::read_complete`]); None when that read is not in flight.
    pub(crate) fn read_buf_of(&mut self, id: u64) -> Option<&mut [u8]> {
        (self.reading == Some(id)).then(|| self.compactor.read_buf())
    }

    /// An erase write (`flush` false) or its flush completed. The outcome names the RAM
    /// copies of what an eviction dropped (ADR 0039), for [`crate::connection::settle_sessions`].
    pub(crate) fn erase_complete(&mut self, flush: bool, res: i32, now_ms: u64) -> Outcome {
        let want = self.compactor.erase_block().len();
        if !flush {
            self.erasing = Some(Some(res >= 0 && res as usize == want));
            return Outcome::default();
        }
        let written = matches!(self.erasing, Some(Some(true)));
        let ok = written && res >= 0;
        self.erasing = None;
        if written && !ok && !self.erase_retried {
            // The erases' description reports every writeback error since its last flush,
            // the log's lost writes too (FlushFiles): the first failure may not be the
            // erase's own. Written and flushed once more, a failure is.
            self.erase_retried = true;
            self.erase_again = true;
            return Outcome::default();
        }
        if !ok {
            eprintln!("ringstore: data device: freeing a compacted segment failed in region {}; will retry", self.region);
        }
        let log = &mut self.log.get_mut().log;
        self.compactor.on_erased(&self.serving, log, ok, now_ms);
        Outcome {
            forget: self.compactor.take_evicted(),
            settled: Vec::new(),
        }
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
}
