//! Compaction while serving: the worker that drives a region log also compacts that region,
//! in bounded steps between its loop iterations, so it never competes with its own writes
//! and never stalls its connections for long (ADR 0011).
//!
//! One compaction: pick the region's sealed segment with the fewest live bytes, read it
//! ([`READ_CHUNK`] per request: [`Step::Read`] asks the worker to read into the compactor's
//! buffer through its ring and report with [`Compactor::on_read`]), copy its live records
//! into the region's log as [`crate::Purpose::Relocate`] records ([`COPY_BUDGET`] bytes per
//! step; they share group commit with client writes), wait until every copy has settled, then
//! ask the worker to erase the victim's header and flush ([`Step::Erase`]); when that flush
//! completes, the segment is free and the index forgets what the erase made unreachable.
//!
//! Dropping instead of copying: a live tombstone or expired value with no older value of its
//! key left on the device (`older == 0`), checked again just before the erase, and only if its
//! sequence is below every region's oldest unsettled client write (an older write of the key
//! still in flight elsewhere could otherwise land after the tombstone is gone).
//!
//! The phases and the completions are driven here; choosing the victim and each record's
//! fate (copy, drop, dead) is in `compactor/victim.rs`.
use crate::device::BlockDevice;
use crate::error::DurableError;
use crate::record::RecordKind;
use crate::region::{RegionLog, SegState};
use crate::serving::{Relocation, Serving};
use crate::units::usize_from;

mod victim;

pub use victim::EVICT_HEADROOM;
use victim::{Plan, Work};

/// Bytes of the victim read per [`Step::Read`]. The read runs on the worker's ring, so this
/// bounds one request, not a stall; each request costs a completion round trip (through the
/// kernel's io-wq threads when the read cannot complete at once), so it is far larger than
/// the copy budget: with 256 KiB, compaction fell behind heavy overwrites on a loaded host.
pub const READ_CHUNK: usize = 2 << 20;
/// Bytes of live records staged as copies per step.
pub const COPY_BUDGET: usize = 256 << 10;
/// Milliseconds to wait before trying again after a compaction failed (I/O error, no room).
pub const RETRY_MS: u64 = 1000;

/// What the worker must do after a [`Compactor::step`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Nothing to do now: sleep as usual.
    Idle,
    /// Work remains that needs no completion: step again soon.
    Busy,
    /// Waiting for copies (group commit completions), a read or the erase: nothing to step.
    Waiting,
    /// Read `len` bytes at device `offset` into [`Compactor::read_buf`] (which stays put
    /// until then), then report with [`Compactor::on_read`].
    Read {
        /// Device offset of the chunk.
        offset: u64,
        /// Bytes to read (at most [`READ_CHUNK`]).
        len: usize,
    },
    /// Write [`Compactor::erase_block`] at `offset`, then flush; report with
    /// [`Compactor::on_erased`].
    Erase {
        /// Device offset of the victim's header.
        offset: u64,
    },
}

/// Totals since start (for logs and tests).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CompactorStats {
    /// Segments erased and freed.
    pub freed: u64,
    /// Live records copied.
    pub copied: u64,
    /// Bytes of live records copied.
    pub copied_bytes: u64,
    /// Tombstones and expired values dropped.
    pub dropped: u64,
    /// Compactions given up (I/O error or short read, no room for the copies).
    pub aborted: u64,
    /// Segments evicted (a full device, ADR 0039) and the records they evicted.
    pub evicted_segments: u64,
    pub evicted: u64,
}

#[derive(Debug)]
enum Phase {
    Idle,
    /// `done` bytes of the victim are in `buf`; the next step asks for more (or scans).
    Reading {
        seg: u32,
        evict: bool,
        done: usize,
    },
    /// A read of `buf[done..done + len]` is in flight until [`Compactor::on_read`].
    ReadWait {
        seg: u32,
        evict: bool,
        done: usize,
        len: usize,
    },
    Copying(Work),
    Erasing(Work),
}

/// One region's background compaction (owned by the worker driving the region's log).
#[derive(Debug)]
pub struct Compactor {
    phase: Phase,
    buf: Vec<u8>,
    zero: Vec<u8>,
    retry_at_ms: u64,
    stats: CompactorStats,
    /// `stats.aborted` already handed to [`Serving::note_compaction`] (a failed read has no
    /// `Serving` at hand: the next step reports it).
    aborted_noted: u64,
    /// Keys evicted and the CAS of the evicted record, not yet taken by the worker
    /// ([`Compactor::take_evicted`]): their RAM copies go too. At most one segment's records.
    evicted: Vec<(Box<[u8]>, u64)>,
    /// The key generation last seen ([`crate::crypt::Crypt::generation`]), and while an old
    /// key is kept, the first open sequence after this region's switch: every segment opened
    /// before it may hold a record under the old key and is rewritten (ADR 0055).
    rekey_seen: u64,
    old_before: Option<u64>,
    /// This compactor's step retired the old key ([`Compactor::take_retired`]).
    retired: bool,
    /// This region told the serving device it has no segment from before the switch left.
    region_done: bool,
    /// Segments whose walk found fewer live bytes than the index counts (damage): never
    /// picked again by this compactor, so the rest of the region still compacts. At most the
    /// region's segments.
    damaged: Vec<u32>,
}

impl Compactor {
    /// A compactor for a device with this write alignment.
    pub fn new(block_size: u32) -> Self {
        Compactor {
            phase: Phase::Idle,
            buf: Vec::new(),
            zero: vec![0; block_size as usize],
            retry_at_ms: 0,
            stats: CompactorStats::default(),
            aborted_noted: 0,
            evicted: Vec::new(),
            rekey_seen: 0,
            old_before: None,
            retired: false,
            region_done: false,
            damaged: Vec::new(),
        }
    }

    /// True once after a step of this compactor retired the old key (the runtime logs it).
    pub fn take_retired(&mut self) -> bool {
        std::mem::take(&mut self.retired)
    }

    /// Follows a rekey (ADR 0055): at a new key generation (once idle) closes the active
    /// segment, so every segment that may hold a record under the old key is sealed and
    /// opened before `old_before`; says so to `s` once none is left in this region.
    fn follow_rekey<D: BlockDevice>(&mut self, s: &Serving<D>, log: &mut RegionLog<u64>) {
        let Some(c) = s.crypt() else { return };
        if !c.has_old_key() {
            self.old_before = None;
            return;
        }
        let generation = c.generation();
        if generation != self.rekey_seen && matches!(self.phase, Phase::Idle) {
            self.rekey_seen = generation;
            self.old_before = Some(log.next_open_seq());
            self.region_done = false;
            log.seal();
        }
        let Some(before) = self.old_before else {
            return;
        };
        if self.region_done {
            return;
        }
        let left = log
            .segments()
            .any(|(_, state, open_seq)| state != SegState::Free && open_seq < before);
        if !left {
            // Said once; a failed retirement write is said again at a later step.
            match s.rekey_region_done(log.region()) {
                Ok(retired) => {
                    self.retired |= retired;
                    self.region_done = true;
                }
                Err(_) => self.region_done = false,
            }
        }
    }

    /// While a rekey keeps an old key: the sealed segment opened before the switch with the
    /// fewest live bytes, if its live bytes fit.
    fn pick_old<D: BlockDevice>(&self, s: &Serving<D>, log: &RegionLog<u64>) -> Option<u32> {
        let before = self.old_before?;
        let g = s.superblock().geometry;
        let in_flight_from = log.unsettled_since().unwrap_or(u64::MAX);
        let index = s.read_index();
        let (live, seg) = log
            .segments()
            .filter(|&(_, st, os)| st == SegState::Sealed && os < before && os < in_flight_from)
            .map(|(seg, _, _)| (index.live_bytes(log.region(), seg), seg))
            .min()?;
        (live + u64::from(g.block_size) * 2 <= log.room(0)).then_some(seg)
    }

    /// True when no compaction is in progress (nothing of it is in flight).
    pub fn is_idle(&self) -> bool {
        matches!(self.phase, Phase::Idle)
    }

    /// Totals since start.
    pub fn stats(&self) -> CompactorStats {
        self.stats
    }

    /// Where the read asked for by [`Step::Read`] lands: exactly its `len` bytes (empty when
    /// no read is in flight). The buffer is neither resized nor freed until
    /// [`Compactor::on_read`], so a pointer into it stays valid for an asynchronous read.
    pub fn read_buf(&mut self) -> &mut [u8] {
        match self.phase {
            Phase::ReadWait { done, len, .. } => &mut self.buf[done..done + len],
            _ => &mut [],
        }
    }

    /// The read asked for by [`Step::Read`] completed: `Ok(bytes read)` or `Err(())`. A failed
    /// or short read gives the compaction up (nothing was copied yet); it is retried after
    /// [`RETRY_MS`]. Ignored when no read is in flight.
    pub fn on_read(&mut self, res: Result<usize, ()>, now_ms: u64) {
        let Phase::ReadWait {
            seg,
            evict,
            done,
            len,
        } = self.phase
        else {
            return;
        };
        if res == Ok(len) {
            self.phase = Phase::Reading {
                seg,
                evict,
                done: done + len,
            };
        } else {
            self.phase = Phase::Idle;
            self.stats.aborted += 1;
            self.retry_at_ms = now_ms + RETRY_MS;
        }
    }

    /// Performs the read asked for by [`Step::Read`] synchronously on `dev` and reports it
    /// (tests and tools that drive the compactor without a ring).
    pub fn read_sync<D: BlockDevice>(&mut self, dev: &D, offset: u64, now_ms: u64) {
        let buf = self.read_buf();
        let len = buf.len();
        let res = dev.read_at(offset, buf).map(|()| len).map_err(|_| ());
        self.on_read(res, now_ms);
    }

    /// The zeroed block [`Step::Erase`] writes; stays put until [`Compactor::on_erased`].
    pub fn erase_block(&self) -> &[u8] {
        &self.zero
    }

    /// Does one bounded piece of work. `may_start`: false while stopping (a compaction in
    /// progress still finishes). `now_unix` decides expiry; `now_ms` paces retries.
    pub fn step<D: BlockDevice>(
        &mut self,
        s: &Serving<D>,
        log: &mut RegionLog<u64>,
        now_unix: u64,
        now_ms: u64,
        may_start: bool,
    ) -> Step {
        while self.aborted_noted < self.stats.aborted {
            s.note_compaction(false);
            self.aborted_noted += 1;
        }
        let g = s.superblock().geometry;
        self.follow_rekey(s, log);
        match std::mem::replace(&mut self.phase, Phase::Idle) {
            Phase::Idle => {
                if !may_start || now_ms < self.retry_at_ms {
                    return Step::Idle;
                }
                let old = self.pick_old(s, log).map(|seg| (seg, false));
                let Some((seg, evict)) = old.or_else(|| Self::pick(s, log, &self.damaged)) else {
                    return Step::Idle;
                };
                self.buf.resize(usize_from(g.segment_size), 0);
                self.phase = Phase::Reading {
                    seg,
                    evict,
                    done: 0,
                };
                Step::Busy
            }
            Phase::Reading { seg, evict, done } if done < self.buf.len() => {
                let len = READ_CHUNK.min(self.buf.len() - done);
                let offset = g.segment_offset(log.region(), seg) + done as u64;
                self.phase = Phase::ReadWait {
                    seg,
                    evict,
                    done,
                    len,
                };
                Step::Read { offset, len }
            }
            Phase::Reading { seg, evict, .. } => {
                let work = self.plan(s, log.region(), (seg, evict), now_unix);
                self.phase = Phase::Copying(work);
                Step::Busy
            }
            other @ Phase::ReadWait { .. } => {
                self.phase = other;
                Step::Waiting
            }
            Phase::Copying(mut w) => {
                self.copy_some(s, log, &mut w);
                if w.next < w.recs.len() && !w.failed {
                    self.phase = Phase::Copying(w);
                    return Step::Busy;
                }
                if w.outstanding > 0 {
                    self.phase = Phase::Copying(w);
                    return Step::Waiting;
                }
                if w.failed {
                    if w.unfound && !self.damaged.contains(&w.seg) {
                        self.damaged.push(w.seg);
                    }
                    self.abort(s, w, now_ms);
                    return Step::Idle;
                }
                if self.recheck_drops(s, &mut w) {
                    self.phase = Phase::Copying(w);
                    return Step::Busy;
                }
                let (offset, _) = log.erase_write(w.seg);
                self.phase = Phase::Erasing(w);
                Step::Erase { offset }
            }
            other @ Phase::Erasing(_) => {
                self.phase = other;
                Step::Waiting
            }
        }
    }

    /// Copies settled (from [`Serving::settle`] of this region's completions).
    pub fn on_relocated(&mut self, done: &[Relocation]) {
        let w = match &mut self.phase {
            Phase::Copying(w) | Phase::Erasing(w) => w,
            _ => return,
        };
        for r in done {
            w.outstanding = w.outstanding.saturating_sub(1);
            match *r {
                Relocation::Moved(from) => {
                    w.moved.insert(from);
                }
                Relocation::Superseded(_) => {}
                Relocation::Failed(_) => w.failed = true,
            }
        }
    }

    /// The erase write and its flush completed (`ok`: both succeeded): free the segment and
    /// forget what it held, or give the compaction up.
    pub fn on_erased<D: BlockDevice>(
        &mut self,
        s: &Serving<D>,
        log: &mut RegionLog<u64>,
        ok: bool,
        now_ms: u64,
    ) {
        let Phase::Erasing(w) = std::mem::replace(&mut self.phase, Phase::Idle) else {
            return;
        };
        if !ok {
            self.abort(s, w, now_ms);
            return;
        }
        log.mark_free(w.seg);
        let (mut evicted, mut evicted_bytes) = (0, 0);
        // Before the index lock: a write staged after this has a higher sequence than any
        // record of the victim, so the floor only rises.
        let floor = s.min_pending_seq();
        let mut index = s.write_index();
        for f in &w.recs {
            let masked = f.plan == Plan::Mask && w.moved.contains(&f.loc);
            let evict = masked || (f.plan == Plan::Evict && index.is_live(&f.key, &f.loc));
            if !evict && w.moved.contains(&f.loc) {
                continue;
            }
            if !evict && !index.is_live(&f.key, &f.loc) {
                index.reclaimed_below(&f.key, f.meta.kind, floor);
                continue;
            }
            // Evicted, or dropped (only verified drops are still live here: copies moved,
            // failures aborted): gone from the index, or for a masked key now its tombstone.
            if !masked {
                index.remove(&f.key);
            }
            if f.meta.kind == RecordKind::Manifest {
                s.dropped_manifest(&mut index, &f.key);
            }
            if evict {
                // ... and from RAM.
                self.evicted.push((f.key.clone(), f.meta.cas));
                evicted += 1;
                evicted_bytes += u64::from(f.loc.len);
            } else {
                self.stats.dropped += 1;
            }
        }
        drop(index);
        self.stats.freed += 1;
        if w.evict {
            self.stats.evicted_segments += 1;
            self.stats.evicted += evicted;
            s.note_eviction(evicted, evicted_bytes);
        }
        s.note_compaction(true);
    }

    /// Keys evicted since the last call, with the CAS of the evicted record: the worker drops
    /// their RAM copies (if still that write), so RAM never serves what the device lost.
    pub fn take_evicted(&mut self) -> Vec<(Box<[u8]>, u64)> {
        std::mem::take(&mut self.evicted)
    }

    /// Gives up: the victim stays sealed; originals that were copied stay on the device as
    /// older duplicates of their copies, so they are counted as such.
    fn abort<D: BlockDevice>(&mut self, s: &Serving<D>, w: Work, now_ms: u64) {
        let mut index = s.write_index();
        for f in &w.recs {
            if w.moved.contains(&f.loc) {
                index.note_unapplied(&f.key, f.meta, f.loc);
            }
        }
        self.stats.aborted += 1;
        self.retry_at_ms = now_ms + RETRY_MS;
    }
}

/// Drives a compaction synchronously against the device (tests and tools): steps, performs
/// its reads, executes the log's actions, settles them, and performs the erase. Returns the
/// last step.
pub fn run_to_idle<D: BlockDevice>(
    c: &mut Compactor,
    s: &Serving<D>,
    log: &mut RegionLog<u64>,
    now_unix: u64,
    max_steps: usize,
) -> Result<Step, DurableError> {
    run_to_idle_at(c, s, log, (now_unix, 0), max_steps)
}

/// [`run_to_idle`] at `now_ms` on the compactor's clock (its retries wait on it).
pub fn run_to_idle_at<D: BlockDevice>(
    c: &mut Compactor,
    s: &Serving<D>,
    log: &mut RegionLog<u64>,
    (now_unix, now_ms): (u64, u64),
    max_steps: usize,
) -> Result<Step, DurableError> {
    let mut last = Step::Idle;
    for _ in 0..max_steps {
        last = c.step(s, log, now_unix, now_ms, true);
        if let Step::Read { offset, .. } = last {
            c.read_sync(s.device(), offset, now_ms);
        }
        crate::serving::drive_sync(s, log, |r| c.on_relocated(r))?;
        if let Step::Erase { offset } = last {
            let ok =
                s.device().write_at(offset, c.erase_block()).is_ok() && s.device().flush().is_ok();
            c.on_erased(s, log, ok, now_ms);
        }
        if last == Step::Idle {
            break;
        }
    }
    Ok(last)
}

#[cfg(test)]
#[path = "compactor_tests.rs"]
mod tests;
