//! One shard's side of pins (see `pin.rs`): granting a pin on an item's value, releasing
//! it, and turning a pinned segment that would be freed or rewritten into an orphan.

use super::{slot_id, Loc, Shard, Shared};
use crate::item::Header;
use std::sync::atomic::Ordering;

impl Shard {
    /// Whether the value of the item at `loc` may be pinned (its segment is pinned already,
    /// or the store is under its cap of pinned segments).
    pub(crate) fn can_pin(&self, sh: &Shared, loc: Loc) -> bool {
        self.pinned(loc.slot()) || sh.pins.room()
    }

    /// Pins the value of the item at `loc` (in RAM, not an external stub; [`Shard::can_pin`]
    /// said yes under the same lock); returns the slot, the exposed address and the length.
    pub(crate) fn pin(&mut self, sh: &Shared, loc: Loc) -> (u16, usize, usize) {
        let slot = loc.slot();
        let h = Header::read(self.bytes(loc));
        debug_assert!(
            h.bits & crate::item::EXTERNAL == 0,
            "an external stub has no value bytes"
        );
        let (start, len) = (loc.off() + h.value_start(), h.value_len);
        let s = self.slot_mut(slot);
        if s.pins == 0 {
            sh.pins.segments.fetch_add(1, Ordering::AcqRel);
        }
        s.pins += 1;
        sh.pins.granted.fetch_add(1, Ordering::Relaxed);
        let addr = s.seg.bytes[start..start + len].as_ptr().expose_provenance();
        (slot_id(slot), addr, len)
    }

    /// Releases one pin of segment `slot` (whose bytes include `addr`); the last pin of an
    /// orphan gives the segment back to the pool.
    pub(crate) fn unpin(&mut self, sh: &Shared, slot: u16, addr: usize) {
        let slot = usize::from(slot);
        let Some(s) = self.slots.get_mut(slot).and_then(|s| s.as_mut()) else {
            debug_assert!(false, "unpin of a segment that is not held");
            return;
        };
        let base = s.seg.bytes.as_ptr().addr();
        if s.pins == 0 || addr < base || addr >= base + s.seg.bytes.len() {
            debug_assert!(false, "unpin of a pin this segment did not grant");
            return;
        }
        s.pins -= 1;
        if s.pins > 0 {
            return;
        }
        sh.pins.segments.fetch_sub(1, Ordering::AcqRel);
        if s.orphan {
            sh.pins.orphans.fetch_sub(1, Ordering::AcqRel);
            s.orphan = false;
            self.release(sh, slot);
        }
    }

    /// Whether segment `slot` has pins (it must not be compacted, reset or freed).
    pub(super) fn pinned(&self, slot: usize) -> bool {
        self.slots[slot].as_ref().is_some_and(|s| s.pins > 0)
    }

    /// Segment `slot`, which holds no live item and is in neither the FIFO nor active, is
    /// pinned: keep it (counted in use) until its last pin goes. Nothing walks it meanwhile.
    pub(super) fn orphan(&mut self, sh: &Shared, slot: usize) {
        let s = self.slot_mut(slot);
        if !s.orphan {
            s.orphan = true;
            sh.pins.orphans.fetch_add(1, Ordering::AcqRel);
        }
        s.write = 0;
        s.live_bytes = 0;
        s.live_items = 0;
        s.hot = 0;
    }
}

#[cfg(test)]
impl Shard {
    /// A copy of the pinned bytes, read through the segment itself (tests: the crate has no
    /// `unsafe` to follow the pin's address).
    pub(crate) fn pinned_copy(&self, slot: u16, addr: usize, len: usize) -> Vec<u8> {
        let s = self.slots[usize::from(slot)]
            .as_ref()
            .expect("pinned segment is held");
        assert!(s.pins > 0, "the segment is still pinned");
        let off = addr - s.seg.bytes.as_ptr().addr();
        s.seg.bytes[off..off + len].to_vec()
    }
}
