//! The store as one caller sees it: with the journal of that caller's data-device handle
//! (or none), so every write of the call is logged there before RAM changes.
//!
//! The journal is passed per call rather than attached to the shared store because each
//! worker stages into its own region log: the caller knows which one, the store does not.

use super::*;

/// [`Store`] operations whose writes are logged to one journal (see [`Store::journaled`]).
#[derive(Clone, Copy)]
pub struct Journaled<'a> {
    store: &'a Store,
    journal: Option<&'a dyn Journal>,
}

impl Store {
    /// This store with every write logged to `journal` first (`None`: no data device; then a
    /// write is refused once [`Store::require_journal`] was called).
    pub fn journaled<'a>(&'a self, journal: Option<&'a dyn Journal>) -> Journaled<'a> {
        Journaled {
            store: self,
            journal,
        }
    }

    /// [`Journaled::set`] without a journal.
    pub fn set(
        &self,
        key: &[u8],
        now: Time,
        value: &[u8],
        meta: NewMeta,
    ) -> Result<u64, StoreError> {
        self.set_logged(key, now, None, value, meta)
    }

    /// [`Journaled::update`] without a journal.
    pub fn update<'v, R>(
        &self,
        key: &[u8],
        now: Time,
        f: impl FnOnce(Option<ItemRef<'_>>) -> (Write<'v>, R),
    ) -> Result<Updated<R>, StoreError> {
        self.update_logged(key, now, None, f)
    }

    /// [`Journaled::get`] without a journal.
    pub fn get<R>(
        &self,
        key: &[u8],
        now: Time,
        opts: ReadOpts,
        f: impl FnOnce(Option<ItemRef<'_>>) -> R,
    ) -> R {
        self.get_logged(key, now, opts, None, f)
    }

    /// [`Journaled::try_get`] without a journal.
    pub fn try_get<R>(
        &self,
        key: &[u8],
        now: Time,
        opts: ReadOpts,
        f: impl FnOnce(Option<ItemRef<'_>>) -> R,
    ) -> Result<R, StoreError> {
        self.try_get_logged(key, now, opts, None, f)
    }
}

impl<'a> Journaled<'a> {
    /// [`Journaled::try_get`] whose closure may ask for the value it sees to be pinned
    /// ([`PinRequest::want`]) rather than copying it, if the value has at least `pin_from`
    /// bytes: the pin comes back with the result (`None` when not asked for, or refused at
    /// the store's cap, see `pin.rs`) and must be released with [`Store::unpin`].
    pub fn try_get_pinned<R>(
        &self,
        key: &[u8],
        now: Time,
        opts: ReadOpts,
        pin_from: usize,
        f: impl FnOnce(Option<ItemRef<'_>>, &mut PinRequest) -> R,
    ) -> Result<(R, Option<Pin>), StoreError> {
        self.store
            .try_get_pinned_logged(key, now, opts, self.journal, pin_from, f)
    }

    /// The store behind this view.
    pub fn store(&self) -> &'a Store {
        self.store
    }

    /// Stores `value` under `key` whatever is there (memcached's `set`): the write
    /// [`Journaled::update`] makes for a `Write::Put`, without looking the old item up
    /// first. The old copy, if any, is replaced as an update would (an expired one counted
    /// as reclaimed); returns the CAS unique written. A look-up and a header read per SET
    /// saved, about 250 instructions (callgrind).
    pub fn set(
        &self,
        key: &[u8],
        now: Time,
        value: &[u8],
        meta: NewMeta,
    ) -> Result<u64, StoreError> {
        self.store.set_logged(key, now, self.journal, value, meta)
    }

    /// Read-decide-write under the shard lock: `f` sees the live item (or `None`) and returns
    /// the write to perform and a result for the caller; the write is logged before RAM
    /// changes, and a journal error refuses it (RAM unchanged).
    ///
    /// `Append`/`Prepend`/`Meta` on an absent item do nothing (`cas: None`): the store never
    /// creates an item from them. `Append`/`Prepend` write the item with the given `meta`.
    /// A `TooLarge` write leaves any existing item as it was (memcached unlinks it on a
    /// too-large `set`; do that with a separate `Delete` if wanted).
    pub fn update<'v, R>(
        &self,
        key: &[u8],
        now: Time,
        f: impl FnOnce(Option<ItemRef<'_>>) -> (Write<'v>, R),
    ) -> Result<Updated<R>, StoreError> {
        self.store.update_logged(key, now, self.journal, f)
    }

    /// Looks `key` up and calls `f` with the live item (expired and flushed items are `None`)
    /// while the shard lock is held: `f` must be short (copy the value out).
    ///
    /// A touch the journal refuses is dropped and the read still answers; a caller that
    /// reports the touch (memcache touch, gat, mg T) uses [`Journaled::try_get`] instead.
    pub fn get<R>(
        &self,
        key: &[u8],
        now: Time,
        opts: ReadOpts,
        f: impl FnOnce(Option<ItemRef<'_>>) -> R,
    ) -> R {
        self.store.get_logged(key, now, opts, self.journal, f)
    }

    /// [`Journaled::get`], except that a touch the journal refuses refuses the whole read:
    /// the error is returned, `f` is not called and RAM is unchanged.
    pub fn try_get<R>(
        &self,
        key: &[u8],
        now: Time,
        opts: ReadOpts,
        f: impl FnOnce(Option<ItemRef<'_>>) -> R,
    ) -> Result<R, StoreError> {
        self.store.try_get_logged(key, now, opts, self.journal, f)
    }

    /// [`Store::flush_all`], logged first; an error means nothing was flushed.
    pub fn flush_all(&self, now: Time, at: Time) -> Result<(), StoreError> {
        self.store.flush_all_logged(now, at, self.journal)
    }
}
