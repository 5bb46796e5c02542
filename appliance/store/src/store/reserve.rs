//! Reservations: an item's room taken when a storage command's header arrives, so its value
//! is received straight into the item (issue 38) instead of through a buffer and a copy.
//!
//! [`Store::reserve`] allocates the item inside the memory budget (evicting as a store
//! does), writes its header and key marked dead and pins its segment (`pin.rs`): the item
//! is invisible, nothing compacts or reuses its bytes, and the caller (the runtime's receive)
//! may write the value through [`Reservation::as_mut_ptr`] until it gives the reservation
//! back. [`Store::commit`] decides under the shard lock as [`crate::Journaled::update`]
//! does and links the item in place of the old one, atomically; [`Store::abandon`] leaves
//! it as garbage. An eviction or a flush_all that took the segment meanwhile makes it an
//! orphan: the commit then stores a copy (the value is still there, pinned).
//!
//! Only a store without a journal reserves: a journaled write records the whole value first.

use super::*;
use crate::shard::Loc;

/// An item reserved for a value still arriving. Give it back with [`Store::commit`] or
/// [`Store::abandon`]; dropped otherwise, its segment stays pinned for good (safe, a leak).
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a reservation holds its segment until Store::commit or Store::abandon"]
pub struct Reservation {
    pin: Pin,
    loc: Loc,
    hash: u64,
    meta: NewMeta,
}

impl Reservation {
    /// The first value byte. Writing `len()` bytes from it is sound while the reservation is
    /// held and the store that granted it is alive (its segment is pinned: never rewritten
    /// or recycled, and nothing else writes the item's value).
    pub fn as_mut_ptr(&self) -> *mut u8 {
        std::ptr::with_exposed_provenance_mut(self.pin.addr)
    }

    /// Value bytes reserved.
    pub fn len(&self) -> usize {
        self.pin.len
    }

    /// Whether no value byte is reserved (never: zero-length values are not reserved).
    pub fn is_empty(&self) -> bool {
        self.pin.len == 0
    }
}

impl Store {
    /// Reserves an item for `key` with a value of `value_len` bytes and `meta` (a fresh CAS
    /// unique is drawn at the commit). `None` when none is taken and the caller buffers the
    /// value as before: a journaled store, the pin cap reached, a key or value the store
    /// refuses or no room (the ordinary write then answers those).
    pub fn reserve(
        &self,
        key: &[u8],
        value_len: usize,
        meta: NewMeta,
        now: Time,
    ) -> Option<Reservation> {
        if self.journal_required()
            || value_len == 0
            || value_len > self.config.item_size_max
            || key.len() > KEY_LEN_MAX
            || meta.cas.is_some()
            || !self.shared.pins.room()
        {
            return None;
        }
        let hash = self.shared.hasher.hash_one(key);
        let mut shard = self.lock(hash, now);
        let new = NewItem {
            key,
            value: &[],
            flags: meta.flags,
            exptime: meta.exptime,
            cas: 0,
            now,
            large: false,
            external: false,
        };
        let (loc, slot, addr) = shard.reserve(&self.shared, &new, value_len).ok()?;
        let pin = Pin {
            shard: u32::try_from(self.shard_of(hash)).ok()?,
            slot,
            addr,
            len: value_len,
        };
        Some(Reservation {
            pin,
            loc,
            hash,
            meta,
        })
    }

    /// Copies `bytes` into the reserved value at `offset` (the bytes that arrived with the
    /// command's header, or a session whose input is not received into the item: TLS),
    /// also after an eviction or flush made its segment an orphan. False when they do not fit.
    pub fn fill(&self, r: &Reservation, offset: usize, bytes: &[u8]) -> bool {
        let Some(shard) = self.shards.get(r.pin.shard as usize) else {
            return false;
        };
        let mut shard = shard.lock().unwrap_or_else(|e| e.into_inner());
        // An orphan (evicted or flushed meanwhile) still holds the bytes the commit copies.
        let Some(value) = shard.reserved_value_mut(r.loc) else {
            return false;
        };
        match value.get_mut(offset..offset + bytes.len()) {
            Some(to) => {
                to.copy_from_slice(bytes);
                true
            }
            None => false,
        }
    }

    /// The value is whole: `decide` sees the current item (as [`crate::Journaled::update`]'s
    /// closure does) and says whether the reserved one replaces it. Either way the
    /// reservation is given back.
    pub fn commit<R>(
        &self,
        r: Reservation,
        key: &[u8],
        now: Time,
        decide: impl FnOnce(Option<ItemRef<'_>>) -> (bool, R),
    ) -> Result<Updated<R>, StoreError> {
        let hash = r.hash;
        let mut shard = self.lock(hash, now);
        let found = self.find(&mut shard, hash, key, now);
        let (store, result) = match &found {
            Some(found) => {
                let (b, h, value) = found.view(&shard);
                decide(Some(item_ref(b, &h, value, now)))
            }
            None => decide(None),
        };
        if !store {
            shard.unpin(&self.shared, r.pin.slot, r.pin.addr);
            return Ok(Updated { result, cas: None });
        }
        let cas = self.next_cas(&mut shard, hash);
        if shard.link_reserved(&self.shared, (hash, r.loc), cas, now) {
            shard.unpin(&self.shared, r.pin.slot, r.pin.addr);
            return Ok(Updated {
                result,
                cas: Some(cas),
            });
        }
        // Not linkable where it is: a copy of the value goes the ordinary way.
        let value = shard.pinned_value(r.pin.slot, r.pin.addr, r.pin.len);
        shard.unpin(&self.shared, r.pin.slot, r.pin.addr);
        let at = write::Target {
            hash,
            key,
            now,
            journal: None,
        };
        let meta = NewMeta {
            cas: Some(cas),
            ..r.meta
        };
        let found = self.find(&mut shard, hash, key, now);
        self.apply(
            &mut shard,
            at,
            found.as_ref(),
            Write::Put {
                value: &value,
                meta,
            },
        )?;
        Ok(Updated {
            result,
            cas: Some(cas),
        })
    }

    /// The value will not be completed (the connection closed or stalled, the command was
    /// refused): the reserved item stays garbage and its segment is unpinned.
    pub fn abandon(&self, r: Reservation) {
        self.unpin(r.pin);
    }
}
