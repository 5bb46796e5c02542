//! Background compaction on the worker's ring: the compactor's reads, erases and their
//! flushes as SQEs, and their completions fed back.

use super::*;

impl DiskWorker {
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
                    opcode::Read::new(
                        types::Fd(self.fd),
                        buf.as_mut_ptr(),
                        crate::sys::u32_of(buf.len()),
                    )
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
                    opcode::Write::new(
                        types::Fd(self.fd),
                        block.as_ptr(),
                        crate::sys::u32_of(block.len()),
                    )
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
}
