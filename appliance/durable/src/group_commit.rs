//! Sans-IO group commit: collect writes with their ack tokens, emit one block-aligned
//! `WriteBatch` then a `Flush`, and release acks only when a completed flush covers the batch
//! and every batch before it.
//!
//! Two rules, decided in `docs/adr/0010-data-device-format.md` (group commit): a write's
//! completion alone never acks, because a write and its flush complete in different ticks and
//! only the flush makes the batch durable; and operation ids are never reused, so a stale
//! completion cannot be credited to a newer batch: write ids are `batch << 1`, flush ids
//! `(flush << 1) | 1`, and both counters only grow.
//!
//! Flushes are pipelined (up to [`Limits::max_inflight_flushes`]): a flush is issued as soon
//! as a batch's write completes, even while an earlier flush is still in flight, so a write
//! waits for about one flush instead of the rest of the running one plus its own. A flush
//! covers every write completed before it was issued, so when it completes every batch of
//! an earlier flush is durable too; tokens are still released in log order only.
//!
//! Chained mode ([`GroupCommit::chain_flushes`], what the io_uring driver uses): a batch is
//! written only when a flush lane is free for it, and its flush is emitted right after it,
//! to be chained behind the write by the driver (`IOSQE_IO_LINK`: the fsync starts only
//! after the write completed, in the same kernel worker). A group is then sized by time
//! (it collects while both lanes' flushes run) and by bytes (a batch that reaches
//! [`Limits::max_batch_bytes`] is written at once, unchained, and flushed by the next free
//! lane), and each group costs one write and one flush instead of a write per loop
//! iteration. A second lane is taken only by a group of at least a block while the other
//! flush runs: small groups wait behind it and grow (fewer flushes per write). A chained
//! flush covers its own write only once that write's completion is known too (never by a
//! later flush's success, which may have run before the write ended).
use crate::units::usize_from;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use crate::commit_metrics::CommitMetrics;

use crate::error::DurableError;

/// Identifies one emitted operation; pass it back in the completion (io_uring `user_data`).
pub type OpId = u64;

/// Most flushes in flight at once, each on its own lane (open file description).
pub const FLUSH_LANES: usize = 2;

/// Batch buffers kept for reuse ([`GroupCommit::recycle`]): one per write in flight is enough
/// for the steady state, where each completed write's buffer becomes the next batch's.
const SPARE_BUFFERS_MAX: usize = 4;

/// What the driver must do next.
#[derive(Debug, PartialEq, Eq)]
pub enum Action {
    /// Write `bytes` at `offset` (both multiples of the block size).
    WriteBatch {
        /// Completion id.
        id: OpId,
        /// Device offset.
        offset: u64,
        /// Block-padded bytes.
        bytes: Vec<u8>,
        /// The next action is this batch's [`Action::Flush`], which must not start before
        /// this write completed: an asynchronous driver chains the two (`IOSQE_IO_LINK` on
        /// the write, both in one submission); a synchronous one runs them in order.
        chained: bool,
    },
    /// Flush the device (fdatasync). Covers every write whose completion was reported before it
    /// was emitted, and, when it follows a chained [`Action::WriteBatch`], that write.
    Flush {
        /// Completion id.
        id: OpId,
        /// The open file description to flush through (0: the one writes use; below
        /// [`FLUSH_LANES`]). A lane has at most one flush in flight. Linux reports a
        /// writeback error once per open file description, so two flushes in flight on one
        /// description could leave the error to the one whose batches were not lost while
        /// the other reports success; on separate descriptions each flush sees every error
        /// since the last flush on its lane, and any failed flush fails every batch not yet
        /// durable.
        lane: usize,
    },
}

/// Bounds of one group-commit queue.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// A batch is cut when it would grow past this (a single larger record still goes alone).
    pub max_batch_bytes: usize,
    /// Writes accepted but not yet acked or failed; more is [`DurableError::Backpressure`].
    pub max_pending_writes: usize,
    /// Batch writes in flight at once.
    pub max_inflight_writes: usize,
    /// Flushes in flight at once (1 to [`FLUSH_LANES`]). Two are enough on a journaling
    /// filesystem: one commit runs while the next transaction collects.
    pub max_inflight_flushes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_batch_bytes: 1 << 20,
            max_pending_writes: 4096,
            max_inflight_writes: 4,
            max_inflight_flushes: 2,
        }
    }
}

/// Tokens whose fate became known in one completion.
#[derive(Debug, PartialEq, Eq)]
pub struct Completion<T> {
    /// Durable: reply success.
    pub acked: Vec<T>,
    /// Lost to an I/O error: reply with an error. The bytes may or may not be on the device.
    pub failed: Vec<T>,
    /// The device offset of the failure, when there was one.
    pub error_offset: Option<u64>,
}

impl<T> Completion<T> {
    fn empty() -> Self {
        Completion {
            acked: Vec::new(),
            failed: Vec::new(),
            error_offset: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Collecting (only the last batch) or sealed and waiting for a write slot.
    Queued,
    Writing,
    Written,
    /// Covered by the flush with this sequence number, in flight.
    Flushing(u64),
    /// Written, and covered only by the flush chained behind its write (this sequence).
    ChainFlushing(u64),
    Durable,
    Failed,
}

#[derive(Debug)]
struct Batch<T> {
    seq: u64,
    offset: u64,
    bytes: Vec<u8>,
    len: usize,
    tokens: Vec<T>,
    state: State,
    sealed: bool,
    in_flight: bool,
    /// The flush chained behind this batch's write (chained mode).
    chain: Option<u64>,
    /// That flush completed successfully before the write's completion was reported.
    chain_done: bool,
    /// When its first bytes were pushed (with [`GroupCommit::attach_metrics`] only).
    opened: Option<Instant>,
}

/// The group-commit state machine of one log. `T` is the caller's ack token.
#[derive(Debug)]
pub struct GroupCommit<T> {
    limits: Limits,
    block: u64,
    batches: VecDeque<Batch<T>>,
    next_batch: u64,
    next_flush: u64,
    /// (sequence number, lane) of the flushes in flight, oldest first.
    flushing: VecDeque<(u64, usize)>,
    next_offset: u64,
    pending_writes: usize,
    writing: usize,
    broken: bool,
    /// Emptied batch buffers handed back by the driver, reused for new batches so a batch
    /// does not grow from nothing by reallocation (at most [`SPARE_BUFFERS_MAX`]).
    spare: Vec<Vec<u8>>,
    /// Chained mode ([`GroupCommit::chain_flushes`]).
    chained: bool,
    /// The flush chained behind the write `poll_action` returned last, returned next.
    chained_flush: Option<Action>,
    /// Where each durable group's latency and size go ([`GroupCommit::attach_metrics`]).
    metrics: Option<Arc<CommitMetrics>>,
}

impl<T> GroupCommit<T> {
    /// A queue whose first byte lands at `offset` (block-aligned); `block` is the write alignment.
    pub fn new(limits: Limits, block: u32, offset: u64) -> Self {
        GroupCommit {
            limits,
            block: u64::from(block),
            batches: VecDeque::new(),
            next_batch: 1,
            next_flush: 1,
            flushing: VecDeque::new(),
            next_offset: offset,
            pending_writes: 0,
            writing: 0,
            broken: false,
            spare: Vec::new(),
            chained: false,
            chained_flush: None,
            metrics: None,
        }
    }

    /// Reports each group released durable to `metrics` (two clock reads per group).
    pub fn attach_metrics(&mut self, metrics: Arc<CommitMetrics>) {
        self.metrics = Some(metrics);
    }

    /// Chained mode (see the module notes): batches wait for a free flush lane unless full,
    /// and each is followed by its own flush, which the driver chains behind the write.
    pub fn chain_flushes(&mut self, on: bool) {
        self.chained = on;
    }

    /// Hands back the buffer of a completed [`Action::WriteBatch`] for a later batch. Buffers
    /// larger than a full batch (a single oversized record) and more than a few are dropped.
    pub fn recycle(&mut self, mut buf: Vec<u8>) {
        let cap_max = self.limits.max_batch_bytes + usize_from(self.block);
        if self.spare.len() < SPARE_BUFFERS_MAX && buf.capacity() <= cap_max {
            buf.clear();
            self.spare.push(buf);
        }
    }

    /// Where `len` bytes pushed now would land (a full batch is cut first).
    pub fn place(&self, len: usize) -> u64 {
        match self.open_batch() {
            Some(b) if b.len + len > self.limits.max_batch_bytes && b.len > 0 => {
                self.align(b.offset + b.len as u64)
            }
            Some(b) => b.offset + b.len as u64,
            None => self.next_offset,
        }
    }

    /// Caps the flushes in flight at `lanes` (the open file descriptions the driver has).
    pub fn limit_flush_lanes(&mut self, lanes: usize) {
        self.limits.max_inflight_flushes = self.limits.max_inflight_flushes.min(lanes.max(1));
    }

    /// Writes accepted and not yet acked or failed.
    pub fn pending_writes(&self) -> usize {
        self.pending_writes
    }

    /// True when nothing is queued or in flight.
    pub fn is_idle(&self) -> bool {
        self.batches.is_empty()
    }

    /// Device offset of the oldest batch not yet settled (acked or failed).
    pub fn oldest_unsettled_offset(&self) -> Option<u64> {
        self.batches.front().map(|b| b.offset)
    }

    /// True after an I/O error until [`GroupCommit::relocate`]: the log tail is unknown.
    pub fn is_broken(&self) -> bool {
        self.broken
    }

    /// Error if one more tracked write would exceed the pending limit.
    pub fn check_room(&self) -> Result<(), DurableError> {
        if self.pending_writes >= self.limits.max_pending_writes {
            return Err(DurableError::Backpressure {
                limit: self.limits.max_pending_writes,
            });
        }
        Ok(())
    }

    /// Queue `bytes` with an ack token (or none for internal bytes such as a segment header).
    /// Returns the device offset where they will land.
    pub fn push(&mut self, token: Option<T>, bytes: &[u8]) -> Result<u64, DurableError> {
        if self.broken {
            return Err(DurableError::Io {
                offset: self.next_offset,
                kind: std::io::ErrorKind::Other,
            });
        }
        if token.is_some() {
            self.check_room()?;
        }
        let at = self.place(bytes.len());
        if self
            .open_batch()
            .is_none_or(|b| b.offset + b.len as u64 != at)
        {
            self.seal_open();
            let seq = self.next_batch;
            self.next_batch += 1;
            // Batches are queued, written and released in sequence order (TIGER_STYLE).
            debug_assert!(self.batches.back().is_none_or(|b| b.seq < seq && b.sealed));
            let buf = self
                .spare
                .pop()
                .unwrap_or_else(|| Vec::with_capacity(usize_from(self.block)));
            self.batches.push_back(Batch {
                seq,
                offset: at,
                bytes: buf,
                len: 0,
                tokens: Vec::new(),
                state: State::Queued,
                sealed: false,
                in_flight: false,
                chain: None,
                chain_done: false,
                opened: self.metrics.as_ref().map(|_| Instant::now()),
            });
        }
        let Some(b) = self.batches.back_mut() else {
            return Err(DurableError::UnexpectedCompletion(0)); // unreachable: pushed above
        };
        b.bytes.extend_from_slice(bytes);
        b.len += bytes.len();
        debug_assert_eq!(b.len, b.bytes.len(), "only the open batch collects bytes");
        if let Some(t) = token {
            b.tokens.push(t);
            self.pending_writes += 1;
        }
        Ok(at)
    }

    /// Continue the log at `offset` (block-aligned), e.g. at the start of a new segment.
    /// Seals the collecting batch and clears the broken state.
    pub fn relocate(&mut self, offset: u64) {
        self.seal_open();
        self.next_offset = offset;
        self.broken = false;
    }

    /// The next operation to submit, if any. Call until `None` once per tick.
    pub fn poll_action(&mut self) -> Option<Action> {
        if let Some(flush) = self.chained_flush.take() {
            return Some(flush);
        }
        let lanes = self.limits.max_inflight_flushes.clamp(1, FLUSH_LANES);
        let free_lane = (0..lanes)
            .find(|l| self.flushing.iter().all(|&(_, f)| f != *l))
            .filter(|_| self.flushing.len() < lanes);
        if let Some(lane) =
            free_lane.filter(|_| self.batches.iter().any(|b| b.state == State::Written))
        {
            let seq = self.next_flush;
            self.next_flush += 1;
            for b in self
                .batches
                .iter_mut()
                .filter(|b| b.state == State::Written)
            {
                b.state = State::Flushing(seq);
            }
            self.flushing.push_back((seq, lane));
            return Some(Action::Flush {
                id: (seq << 1) | 1,
                lane,
            });
        }
        if self.writing >= self.limits.max_inflight_writes {
            return None;
        }
        let block = self.block;
        let chained = self.chained;
        let b = self
            .batches
            .iter_mut()
            .find(|b| b.state == State::Queued && b.len > 0)?;
        // Chained: a batch goes with a flush lane for it, or when full (sealed: cut by bytes
        // or by a relocation); otherwise it keeps collecting until a flush completes. While
        // a flush runs, the next lane is taken only by a group of at least a block: a flush
        // costs the same for 100 bytes as for a block, so small groups collect behind the
        // running flush instead (fewer flushes per write), and large ones pipeline.
        let worth_a_lane = self.flushing.is_empty() || b.len as u64 >= block;
        let chain = match free_lane {
            Some(lane) if chained && worth_a_lane => Some(lane),
            _ if chained && !b.sealed => return None,
            _ => None,
        };
        let padded = (b.len as u64).div_ceil(block) * block;
        let mut bytes = std::mem::take(&mut b.bytes);
        bytes.resize(usize_from(padded), 0);
        if !b.sealed {
            b.sealed = true;
            self.next_offset = b.offset + padded;
        }
        b.state = State::Writing;
        b.in_flight = true;
        self.writing += 1;
        let write = Action::WriteBatch {
            id: b.seq << 1,
            offset: b.offset,
            bytes,
            chained: chain.is_some(),
        };
        if let Some(lane) = chain {
            let seq = self.next_flush;
            self.next_flush += 1;
            b.chain = Some(seq);
            self.flushing.push_back((seq, lane));
            self.chained_flush = Some(Action::Flush {
                id: (seq << 1) | 1,
                lane,
            });
        }
        Some(write)
    }

    /// Report the completion of a `WriteBatch`. An error fails that batch and every later one.
    pub fn on_write_complete(&mut self, id: OpId, ok: bool) -> Result<Completion<T>, DurableError> {
        let seq = id >> 1;
        let idx = self
            .batches
            .iter()
            .position(|b| b.seq == seq && b.in_flight && id & 1 == 0)
            .ok_or(DurableError::UnexpectedCompletion(id))?;
        self.batches[idx].in_flight = false;
        assert!(
            self.writing > 0,
            "group commit: a write completed with none in flight"
        );
        self.writing -= 1;
        let b = &mut self.batches[idx];
        match b.state {
            State::Writing if ok => {
                b.state = match b.chain {
                    Some(_) if b.chain_done => State::Durable,
                    Some(f) => State::ChainFlushing(f),
                    None => State::Written,
                }
            }
            State::Writing => {
                let offset = self.batches[idx].offset;
                return Ok(self.fail_from(idx, offset));
            }
            // Already failed by an earlier error: the late completion only frees its slot.
            _ => {}
        }
        Ok(self.drain_front())
    }

    /// Report the completion of a `Flush`. Success makes the covered batches durable and
    /// returns the tokens of the durable prefix. An error fails every batch not yet durable:
    /// after a failed fdatasync nothing unflushed can be trusted.
    pub fn on_flush_complete(&mut self, id: OpId, ok: bool) -> Result<Completion<T>, DurableError> {
        let seq = id >> 1;
        let at = self
            .flushing
            .iter()
            .position(|&(f, _)| f == seq)
            .filter(|_| id & 1 == 1)
            .ok_or(DurableError::UnexpectedCompletion(id))?;
        self.flushing.remove(at);
        // Flushes complete in any order, but one that succeeded covers only batches whose
        // write had completed when it was issued, and they are released front first.
        if ok {
            // Everything this flush covers, and what every earlier flush covers: those
            // writes completed before it was issued.
            // A chained write is covered by its own flush only, and only once its completion
            // is known too (the flush cannot have succeeded unless the write did, but the
            // write's own completion still decides, as for every batch).
            for b in self.batches.iter_mut() {
                match b.state {
                    State::Flushing(f) if f <= seq => b.state = State::Durable,
                    State::ChainFlushing(f) if f == seq => b.state = State::Durable,
                    State::Writing if b.chain == Some(seq) => b.chain_done = true,
                    _ => {}
                }
            }
            return Ok(self.drain_front());
        }
        let Some(idx) = self.batches.iter().position(|b| b.state != State::Durable) else {
            return Ok(self.drain_front());
        };
        let offset = self.batches[idx].offset;
        Ok(self.fail_from(idx, offset))
    }

    fn fail_from(&mut self, idx: usize, offset: u64) -> Completion<T> {
        let mut done = Completion::empty();
        done.error_offset = Some(offset);
        for b in self.batches.iter_mut().skip(idx) {
            b.state = State::Failed;
            b.sealed = true;
            assert!(
                b.tokens.len() <= self.pending_writes,
                "group commit: tokens uncounted"
            );
            self.pending_writes -= b.tokens.len();
            done.failed.append(&mut b.tokens);
        }
        self.broken = true;
        done.acked = self.drain_front().acked;
        done
    }

    /// Pop finished batches from the front: durable ones release their tokens in order.
    /// A failed batch whose write is still in flight stays until its completion arrives.
    fn drain_front(&mut self) -> Completion<T> {
        let mut done = Completion::empty();
        while let Some(front) = self.batches.front() {
            let finished =
                front.state == State::Durable || (front.state == State::Failed && !front.in_flight);
            if !finished {
                break;
            }
            let Some(mut b) = self.batches.pop_front() else {
                break;
            };
            if b.state == State::Durable {
                // Acknowledged in push order: only the front batch is ever released, and
                // only once durable; every token of it was counted when pushed.
                assert!(
                    b.tokens.len() <= self.pending_writes,
                    "group commit: tokens uncounted"
                );
                debug_assert!(self.batches.front().is_none_or(|n| n.seq > b.seq));
                self.pending_writes -= b.tokens.len();
                if let (Some(m), Some(opened)) = (&self.metrics, b.opened) {
                    m.note_group(opened, b.tokens.len());
                }
                done.acked.append(&mut b.tokens);
            }
        }
        done
    }

    fn open_batch(&self) -> Option<&Batch<T>> {
        self.batches
            .back()
            .filter(|b| !b.sealed && b.state == State::Queued)
    }

    fn seal_open(&mut self) {
        let block = self.block;
        if let Some(b) = self
            .batches
            .back_mut()
            .filter(|b| !b.sealed && b.state == State::Queued)
        {
            b.sealed = true;
            self.next_offset = b.offset + (b.len as u64).div_ceil(block) * block;
        }
    }

    fn align(&self, v: u64) -> u64 {
        v.div_ceil(self.block) * self.block
    }
}

#[cfg(test)]
#[path = "group_commit_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "group_commit_chain_tests.rs"]
mod chain_tests;
