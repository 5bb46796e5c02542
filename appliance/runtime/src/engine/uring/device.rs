//! The data device on the io_uring worker: the log's I/O as SQEs ([`UringSink`]), and the
//! completions: settle writes and flushes, report each settled record to its session, and
//! resume the connections no longer waiting.

use super::*;
use crate::durable::{DiskSink, SinkFds};

/// The log's operations as SQEs: single entries in `sqes`, and each batch write (and each
/// erase) with the flush chained behind it (`IOSQE_IO_LINK`) as one pair in `chains`, which
/// the worker submits together (a chain split across two submissions would let the flush
/// start before the write ended, while the log counts it as covering that write).
pub(super) struct UringSink<'a> {
    /// The device's descriptor (writes, reads) and the region's flushes' (see
    /// [`crate::durable::FlushFiles`]).
    pub fds: SinkFds,
    pub sqes: &'a mut Vec<squeue::Entry>,
    pub chains: &'a mut Vec<[squeue::Entry; 2]>,
    /// A chained write waiting for its flush (the log's very next action).
    pub chained_write: Option<squeue::Entry>,
}

impl UringSink<'_> {
    /// A write of `bytes` at `offset` on the device's descriptor, completing as `op`.
    fn write_entry(&self, bytes: &[u8], offset: u64, op: Op) -> squeue::Entry {
        opcode::Write::new(
            types::Fd(self.fds.io),
            bytes.as_ptr(),
            crate::sys::u32_of(bytes.len()),
        )
        .offset(offset)
        .build()
        .user_data(op.encode())
    }
}

impl DiskSink for UringSink<'_> {
    fn write(&mut self, id: u64, offset: u64, bytes: Vec<u8>, chained: bool) -> Option<Vec<u8>> {
        let entry = self.write_entry(&bytes, offset, Op::DiskWrite { id });
        if chained {
            self.chained_write = Some(entry);
        } else {
            self.sqes.push(entry);
        }
        // The kernel reads the bytes until the completion: the log keeps them.
        Some(bytes)
    }

    fn flush(&mut self, id: u64, lane: usize) {
        let flush = opcode::Fsync::new(types::Fd(self.fds.lanes[lane]))
            .flags(types::FsyncFlags::DATASYNC)
            .build()
            .user_data(Op::DiskFlush { id }.encode());
        match self.chained_write.take() {
            Some(write) => self
                .chains
                .push([write.flags(squeue::Flags::IO_LINK), flush]),
            None => self.sqes.push(flush),
        }
    }

    fn end_of_batch(&mut self) {
        // Unreachable (the log returns a chained write's flush next); never drop the write
        // (it carries no link flag until it is paired).
        debug_assert!(self.chained_write.is_none());
        self.sqes.extend(self.chained_write.take());
    }

    fn read(&mut self, id: u64, offset: u64, buf: &mut [u8]) {
        self.sqes.push(
            opcode::Read::new(
                types::Fd(self.fds.io),
                buf.as_mut_ptr(),
                crate::sys::u32_of(buf.len()),
            )
            .offset(offset)
            .build()
            .user_data(Op::DiskCompactRead { id }.encode()),
        );
    }

    fn erase(&mut self, id: u64, offset: u64, block: &[u8]) {
        // The write and its flush are linked: the flush runs only after the write, and a
        // failed write cancels it. One chain, submitted whole (as a batch and its flush).
        let write = self
            .write_entry(block, offset, Op::DiskErase { id })
            .flags(squeue::Flags::IO_LINK);
        let flush = opcode::Fsync::new(types::Fd(self.fds.erase))
            .flags(types::FsyncFlags::DATASYNC)
            .build()
            .user_data(Op::DiskEraseFlush { id }.encode());
        self.chains.push([write, flush]);
    }
}

impl<H: Handler> Worker<H> {
    /// A data-device batch write (`flush` false) or flush completed.
    pub(super) fn on_device(&mut self, flush: bool, id: u64, res: i32) {
        let Some(device) = &mut self.device else {
            return;
        };
        let outcome = device.complete(flush, id, res);
        let mut held_udp = Vec::new();
        let resumed = crate::connection::settle_sessions(
            &*self.core.setup.handler,
            &mut self.core.conns,
            &outcome,
            self.core.now,
            |generation, token, ok| held_udp.push((generation, token, ok)),
        );
        for (generation, token, ok) in held_udp {
            self.on_udp_durable(generation, token, ok);
        }
        for (slot, generation) in resumed {
            let flow = self
                .core
                .conns
                .get_mut(slot, generation)
                .and_then(|conn| conn.machine.held_flow());
            if let Some(flow) = flow {
                self.served(slot, flow);
            }
        }
    }
}
