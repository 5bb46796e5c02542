//! One shard's part of a key dump: a bounded walk over its segments in slot order.

use super::*;

/// Where a walk of one shard stands: the segment slot, the offset of the next item in it,
/// and the segment's generation when that offset was taken (an offset is only trusted in
/// the layout it was taken from; a changed generation restarts the segment at 0).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct WalkPos {
    slot: usize,
    off: usize,
    gen: u32,
}

impl WalkPos {
    fn next_slot(self) -> WalkPos {
        WalkPos {
            slot: self.slot + 1,
            off: 0,
            gen: 0,
        }
    }
}

impl Shard {
    /// Calls `f` with the bytes and header of each live item from `pos` on (not dead, not
    /// expired at `now`, not a large object), taking at most `budget` steps: one per item
    /// header read and one per segment slot passed. Returns where to resume (`None`: the
    /// shard's end was reached) and the steps taken.
    pub(crate) fn walk(
        &self,
        mut pos: WalkPos,
        now: u32,
        budget: usize,
        f: &mut dyn FnMut(&[u8], &Header),
    ) -> (Option<WalkPos>, usize) {
        let mut steps = 0;
        loop {
            if pos.slot >= self.slots.len() {
                return (None, steps);
            }
            if steps >= budget {
                return (Some(pos), steps);
            }
            steps += 1;
            let Some(s) = self.slots[pos.slot].as_ref() else {
                pos = pos.next_slot();
                continue;
            };
            if s.gen != pos.gen {
                pos.gen = s.gen;
                pos.off = 0;
            }
            if pos.off >= s.write {
                pos = pos.next_slot();
                continue;
            }
            let b = &s.seg.bytes[pos.off..];
            let h = Header::read(b);
            pos.off += h.len();
            if h.bits & (item::DEAD | item::LARGE) == 0 && !h.expired(now) {
                f(b, &h);
            }
        }
    }
}
