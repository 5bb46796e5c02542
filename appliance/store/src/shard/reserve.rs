//! One shard's side of reservations (`store/reserve.rs`): an item's room taken before its
//! value has arrived, pinned while the value is received into it, then linked into the
//! index (visible only then, whole) or left as garbage.

use std::sync::atomic::Ordering;

use super::{key_at, slot_id, Loc, Shard, Shared, LOCAL};
use crate::item::{self, Header, NewItem};
use crate::StoreError;

impl Shard {
    /// Allocates an item of `new`'s key and meta with room for `value_len` value bytes
    /// (evicting as a store does), writes its header and key marked dead (not indexed, not
    /// live: compaction and readers step over it) and pins its segment. Returns the item's
    /// place, its segment's slot and the exposed address of its first value byte.
    pub(crate) fn reserve(
        &mut self,
        sh: &Shared,
        new: &NewItem<'_>,
        value_len: usize,
    ) -> Result<(Loc, u16, usize), StoreError> {
        let head = item::header_len(new.flags, new.exptime, new.cas, value_len);
        let len = head + new.key.len() + value_len;
        self.ensure_index_room(sh, new.now);
        let (slot, off) = self.alloc(sh, len, new.now, LOCAL, new.exptime != 0)?;
        let s = self.slot_mut(slot);
        let start = off + item::write_reserved(&mut s.seg.bytes[off..off + len], new, value_len);
        if s.pins == 0 {
            sh.pins.segments.fetch_add(1, Ordering::AcqRel);
        }
        s.pins += 1;
        let addr = s.seg.bytes[start..start + value_len]
            .as_mut_ptr()
            .expose_provenance();
        Ok((Loc::at(slot, off), slot_id(slot), addr))
    }

    /// The value bytes of the reserved item at `loc` while it is pinned, its segment an
    /// orphan or not: an orphan keeps its bytes until the last unpin, and the commit then
    /// copies them, so every value byte must land there whatever happened to the segment.
    pub(crate) fn reserved_value_mut(&mut self, loc: Loc) -> Option<&mut [u8]> {
        let s = self.slots[loc.slot()].as_mut()?;
        if s.pins == 0 {
            return None;
        }
        let b = &mut s.seg.bytes[loc.off()..];
        let h = Header::read(b);
        Some(&mut b[h.value_start()..h.len()])
    }

    /// Whether the reserved item at `loc` can be linked where it is: pinned and its segment
    /// still the shard's (not an orphan after an eviction or a flush).
    fn linkable(&self, loc: Loc) -> bool {
        self.slots[loc.slot()]
            .as_ref()
            .is_some_and(|s| !s.orphan && s.pins > 0)
    }

    /// Makes the reserved item at `loc` live with `cas` at `now`, pointing the index at it
    /// in place of any old copy (whose bytes are retired). False, with nothing changed, when
    /// it cannot be linked where it is (its segment became an orphan, or `cas` needs a wider
    /// header than it was written with): the caller stores a copy instead.
    pub(crate) fn link_reserved(
        &mut self,
        sh: &Shared,
        (hash, loc): (u64, Loc),
        cas: u64,
        now: u32,
    ) -> bool {
        self.ensure_index_room(sh, now);
        if !self.linkable(loc) {
            return false;
        }
        let b = self.bytes_mut(loc);
        if !item::set_cas(b, cas) {
            return false;
        }
        item::set_bits(b, 0);
        item::set_last_access(b, now);
        let len = Header::read(b).len();
        let s = self.slot_mut(loc.slot());
        s.live_bytes += len;
        s.live_items += 1;
        let slots = &self.slots;
        let key = key_at(slots, loc);
        match self.index.replace(hash, |l| key_at(slots, l) == key, loc) {
            Some(old) => self.kill(sh, old),
            None => {
                let before = self.index.allocation_size();
                self.index.insert_new(hash, loc);
                sh.pool.index_grew(before, self.index.allocation_size());
            }
        }
        self.counters.total_items += 1;
        true
    }

    /// A copy of the `len` bytes at `addr` in pinned segment `slot` (a reservation's value
    /// whose item could not be linked in place).
    pub(crate) fn pinned_value(&self, slot: u16, addr: usize, len: usize) -> Vec<u8> {
        let Some(s) = self.slots[usize::from(slot)].as_ref() else {
            return Vec::new();
        };
        let off = addr.wrapping_sub(s.seg.bytes.as_ptr().addr());
        s.seg
            .bytes
            .get(off..off.saturating_add(len))
            .map(<[u8]>::to_vec)
            .unwrap_or_default()
    }
}
