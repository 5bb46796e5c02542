//! A shard's side of a sealed region (ADR 0052): the segments it lists at a seal, and
//! taking them back in place at the next start, the index rebuilt from their items.

use super::*;

/// One segment a shard holds in the local lane, as the seal records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SealedSeg {
    /// Address of the segment's first byte (the store turns it into a segment number).
    pub addr: usize,
    /// Bytes written into it; the seal's checksum covers exactly these.
    pub write: usize,
    /// The lane's active segment (appended to next); the others are the FIFO, oldest first.
    pub active: bool,
}

/// How store times of the sealed run map onto this one's.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shift {
    /// Seconds to add to a sealed exptime: the old store epoch minus the new one (wall clock).
    pub delta: i64,
    /// Store time now; an item whose shifted exptime is at or before it expired while down.
    pub now: u32,
}

impl Shift {
    /// The exptime in this run's store time, `None` when it has passed.
    fn exptime(self, sealed: u32) -> Option<u32> {
        if sealed == crate::NEVER {
            return Some(crate::NEVER);
        }
        let t = i64::from(sealed) + self.delta;
        if t <= i64::from(self.now) {
            return None;
        }
        Some(u32::try_from(t).unwrap_or(u32::MAX))
    }
}

/// Items a restored segment kept, and those that expired while the process was down.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Restored {
    pub kept: u64,
    pub expired: u64,
}

/// Walks the items in `bytes[..write]` without trusting them: every header must decode
/// inside the written bytes, the chain must end exactly at `write`, and `key_ok` must accept
/// every live key (it hashes to this shard). Returns the live items, or what is wrong.
pub(crate) fn check_chain(
    bytes: &[u8],
    write: usize,
    mut key_ok: impl FnMut(&[u8]) -> bool,
) -> Result<u64, &'static str> {
    let Some(written) = bytes.get(..write) else {
        return Err("a segment written past its end");
    };
    let mut off = 0;
    let mut live = 0;
    while off < write {
        let b = &written[off..];
        if !item::header_fits(b) {
            return Err("an item header runs past the written bytes");
        }
        let h = Header::read(b);
        if h.len() <= h.key_start() || h.len() > b.len() {
            return Err("an item runs past the written bytes");
        }
        if h.bits & item::DEAD == 0 {
            if !key_ok(&b[h.key_start()..h.value_start()]) {
                return Err("a key in a segment of another shard");
            }
            live += 1;
        }
        off += h.len();
    }
    Ok(live)
}

impl Shard {
    /// The local lane's segments, oldest first and the active one last (segments only pins
    /// hold, their items gone, are left out).
    pub(crate) fn sealed_segments(&self) -> Vec<SealedSeg> {
        let lane = &self.lanes[LOCAL];
        let listed = lane.fifo.iter().map(|&s| (s, false));
        listed
            .chain(lane.active.map(|s| (s, true)))
            .filter_map(|(slot, active)| {
                let s = self.slots.get(usize::from(slot))?.as_ref()?;
                (!s.orphan).then_some(SealedSeg {
                    addr: s.seg.bytes.as_ptr() as usize,
                    write: s.write,
                    active,
                })
            })
            .collect()
    }

    /// The written bytes of the local segment at `addr` (what the seal's checksum covers).
    pub(crate) fn sealed_bytes(&self, seg: SealedSeg) -> &[u8] {
        self.slots
            .iter()
            .flatten()
            .find(|s| s.seg.bytes.as_ptr() as usize == seg.addr)
            .map_or(&[][..], |s| &s.seg.bytes[..seg.write])
    }

    /// Sizes the index for `n` more items at once (before a sealed shard is restored).
    pub(crate) fn reserve_index(&mut self, sh: &Shared, n: usize) {
        let before = self.index.allocation_size();
        self.index.reserve(self.index.len() + n);
        sh.pool.index_grew(before, self.index.allocation_size());
    }

    /// Takes back `seg`, written up to `write` and checked by [`check_chain`], as the lane's
    /// newest segment (or its active one): items that expired while down are marked dead,
    /// the others get this run's exptime and last access and go into the index. A segment
    /// left with nothing live goes back to the pool. `pool_held` is told of the take.
    pub(crate) fn restore(
        &mut self,
        sh: &Shared,
        seg: Segment,
        write: usize,
        active: bool,
        shift: Shift,
    ) -> Restored {
        sh.pool.adopt(self.lanes[LOCAL].held);
        let gen = self.gen();
        let slot = match self.free_slots.pop() {
            Some(i) => usize::from(i),
            None => {
                self.slots.push(None);
                self.slots.len() - 1
            }
        };
        self.slots[slot] = Some(SegSlot {
            seg,
            write,
            live_bytes: 0,
            live_items: 0,
            gen,
            pins: 0,
            orphan: false,
            region: 0,
            hot: 0,
            // Resumed items may carry exptimes: walked when full, as before.
            may_expire: true,
        });
        self.lanes[LOCAL].held += 1;
        match active {
            true => self.lanes[LOCAL].active = Some(slot_id(slot)),
            false => self.lanes[LOCAL].fifo.push_back(slot_id(slot)),
        }
        let done = self.restore_items(sh, slot, write, shift);
        let s = self.slot(slot);
        if s.live_items == 0 && !active {
            self.lanes[LOCAL].fifo.pop_back();
            self.release(sh, slot);
        }
        done
    }

    /// [`Shard::restore`]'s walk over the items of `slot`.
    fn restore_items(&mut self, sh: &Shared, slot: usize, write: usize, shift: Shift) -> Restored {
        let mut done = Restored::default();
        let mut off = 0;
        while off < write {
            let loc = Loc::at(slot, off);
            let h = Header::read(self.bytes(loc));
            off += h.len();
            if h.bits & item::DEAD != 0 {
                continue;
            }
            let b = self.bytes_mut(loc);
            let exptime = shift.exptime(h.exptime);
            match exptime.map(|t| item::set_exptime(b, t)) {
                Some(true) => item::set_last_access(b, shift.now),
                // Expired while down (a missing field cannot happen: only NEVER maps to NEVER).
                _ => {
                    item::set_bits(b, h.bits | item::DEAD);
                    done.expired += 1;
                    continue;
                }
            }
            let hash = sh
                .hasher
                .hash_one(&self.bytes(loc)[h.key_start()..h.value_start()]);
            if self.index.full() {
                // Grown without the budget's evictions (`ensure_index_room`): those could
                // compact the segment this walk is in. A store over budget takes no new
                // segment until eviction brings it back.
                let before = self.index.allocation_size();
                self.index.grow();
                sh.pool.index_grew(before, self.index.allocation_size());
            }
            let s = self.slot_mut(slot);
            s.live_bytes += h.len();
            s.live_items += 1;
            let slots = &self.slots;
            let key = key_at(slots, loc);
            match self.index.replace(hash, |l| key_at(slots, l) == key, loc) {
                // Two live copies cannot be sealed; were there, the later one wins.
                Some(old) => self.kill(sh, old),
                None => {
                    let before = self.index.allocation_size();
                    self.index.insert_new(hash, loc);
                    sh.pool.index_grew(before, self.index.allocation_size());
                }
            }
            done.kept += 1;
        }
        done
    }
}

#[cfg(test)]
impl Shard {
    /// Each held segment's address and a copy of its bytes (tests).
    pub(crate) fn segment_copies(&self) -> Vec<(usize, Vec<u8>)> {
        self.slots
            .iter()
            .flatten()
            .map(|s| (s.seg.bytes.as_ptr() as usize, s.seg.bytes.to_vec()))
            .collect()
    }
}
