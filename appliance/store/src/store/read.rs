//! Reads: `get`, `try_get` and the read they share, under the item's shard lock.

use super::write::Target;
use super::*;

impl Store {
    /// [`Journaled::get`] with the journal passed in.
    pub(crate) fn get_logged<R>(
        &self,
        key: &[u8],
        now: Time,
        opts: ReadOpts,
        journal: Option<&dyn Journal>,
        f: impl FnOnce(Option<ItemRef<'_>>) -> R,
    ) -> R {
        match self.read(key, now, opts, journal, f) {
            Ok(r) => r,
            Err((_, f)) => {
                let untouched = ReadOpts {
                    touch: None,
                    ..opts
                };
                // Without a touch nothing is journaled, so this read cannot be refused.
                self.read(key, now, untouched, None, f)
                    .unwrap_or_else(|(_, f)| f(None))
            }
        }
    }

    /// [`Journaled::try_get`] with the journal passed in.
    pub(crate) fn try_get_logged<R>(
        &self,
        key: &[u8],
        now: Time,
        opts: ReadOpts,
        journal: Option<&dyn Journal>,
        f: impl FnOnce(Option<ItemRef<'_>>) -> R,
    ) -> Result<R, StoreError> {
        self.read(key, now, opts, journal, f).map_err(|(e, _)| e)
    }

    /// [`Journaled::try_get_pinned`] with the journal passed in.
    pub(crate) fn try_get_pinned_logged<R>(
        &self,
        key: &[u8],
        now: Time,
        opts: ReadOpts,
        journal: Option<&dyn Journal>,
        pin_from: usize,
        f: impl FnOnce(Option<ItemRef<'_>>, &mut PinRequest) -> R,
    ) -> Result<(R, Option<Pin>), StoreError> {
        self.read_with(key, now, opts, journal, pin_from, f)
            .map_err(|(e, _)| e)
    }

    /// The read behind `get` and `try_get`; a refused touch hands `f` back uncalled.
    #[expect(
        clippy::expect_used,
        reason = "read_with calls its closure at most once, and not at all when it refuses"
    )]
    fn read<R, F: FnOnce(Option<ItemRef<'_>>) -> R>(
        &self,
        key: &[u8],
        now: Time,
        opts: ReadOpts,
        journal: Option<&dyn Journal>,
        f: F,
    ) -> Result<R, (StoreError, F)> {
        let mut f = Some(f);
        match self.read_with(key, now, opts, journal, usize::MAX, |item, _| {
            (f.take().expect("called once"))(item)
        }) {
            Ok((r, _)) => Ok(r),
            Err((e, _)) => Err((e, f.take().expect("not called when refused"))),
        }
    }

    /// [`Store::read`]; for a value of at least `pin_from` bytes, `f` may ask for it to be
    /// pinned ([`PinRequest::want`]) and the pin is returned with its result.
    fn read_with<R, F: FnOnce(Option<ItemRef<'_>>, &mut PinRequest) -> R>(
        &self,
        key: &[u8],
        now: Time,
        opts: ReadOpts,
        journal: Option<&dyn Journal>,
        pin_from: usize,
        f: F,
    ) -> Result<(R, Option<Pin>), (StoreError, F)> {
        let mut request = PinRequest {
            possible: false,
            capped: false,
            wanted: false,
            asked: false,
        };
        let hash = self.shared.hasher.hash_one(key);
        let mut shard = self.lock(hash, now);
        let Some(mut found) = self.find(&mut shard, hash, key, now) else {
            return Ok((f(None, &mut request), None));
        };
        let mut loc = found.loc;
        let h = Header::read(shard.bytes(loc));
        if h.bits & item::LARGE != 0 && !opts.see_large {
            return Ok((f(None, &mut request), None));
        }
        if opts.mark_access {
            shard.note_hit(&self.shared, hash, loc, now);
        }
        let mut shown = h;
        if opts.touch.is_some() && journal.is_none() && self.journal_required() {
            return Err((StoreError::OutOfMemory, f)); // a touch that cannot be logged
        }
        if let (Some(t), Some(journal)) = (opts.touch, journal) {
            let (_, _, value) = found.view(&shard);
            let touched = Mutation::Put {
                key,
                value,
                flags: h.flags,
                exptime: t,
                cas: h.cas,
                large: h.bits & item::LARGE != 0,
            };
            if let Err(e) = journal.record(touched) {
                // Not logged, so not applied.
                return Err((e, f));
            }
        }
        if opts.mark_access {
            let b = shard.bytes_mut(loc);
            item::set_bits(b, h.bits | item::FETCHED | item::ACCESSED);
            item::set_last_access(b, now);
        }
        if let Some(t) = opts.touch {
            shown.exptime = t;
            if !item::set_exptime(shard.bytes_mut(loc), t) {
                // No exptime field: the item is written anew with one.
                let at = Target {
                    hash,
                    key,
                    now,
                    journal,
                };
                match self.rewrite(&mut shard, at, loc, t, h.cas) {
                    Ok(Some(new)) => {
                        loc = new;
                        found.loc = new;
                        shown = shown.laid_out_as(&Header::read(shard.bytes(new)));
                    }
                    Ok(None) => return Ok((f(None, &mut request), None)), // evicted for room
                    Err(e) => return Err((e, f)),
                }
            }
        }
        // `fetched` and `last_access` are shown as they were before this read (meta h, l, t).
        // Only a RAM value can be pinned (an external one was read from the device), and only
        // under the store's cap (checked only for a value that may be pinned: an atomic load).
        if h.value_len >= pin_from && found.device.is_none() {
            request.possible = shard.can_pin(&self.shared, loc);
            request.capped = !request.possible;
        }
        // `shown` has the layout of the item at `found.loc` (moved there by a rewrite, or
        // the one read above): no third header read.
        let (b, value) = found.view_as(&shard, &shown);
        let r = f(Some(item_ref(b, &shown, value, now)), &mut request);
        let pin = match request.wanted {
            true => {
                let (slot, addr, len) = shard.pin(&self.shared, loc);
                #[expect(
                    clippy::cast_possible_truncation,
                    reason = "the shard count is a power of two far below 2^32 (Store::new)"
                )]
                let shard_index = self.shard_of(hash) as u32;
                Some(Pin {
                    shard: shard_index,
                    slot,
                    addr,
                    len,
                })
            }
            false => {
                if request.asked && request.capped {
                    self.shared.pins.refused.fetch_add(1, Ordering::Relaxed);
                }
                None
            }
        };
        Ok((r, pin))
    }
}
