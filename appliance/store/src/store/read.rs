//! Reads: `get`, `try_get` and the read they share, under the item's shard lock.

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

    /// The read behind `get` and `try_get`; a refused touch hands `f` back uncalled.
    fn read<R, F: FnOnce(Option<ItemRef<'_>>) -> R>(
        &self,
        key: &[u8],
        now: Time,
        opts: ReadOpts,
        journal: Option<&dyn Journal>,
        f: F,
    ) -> Result<R, (StoreError, F)> {
        let hash = self.shared.hasher.hash_one(key);
        let mut shard = self.lock(hash, now);
        let Some(found) = self.find(&mut shard, hash, key, now) else {
            return Ok(f(None));
        };
        let loc = found.loc;
        let h = Header::read(shard.bytes(loc));
        if h.bits & item::LARGE != 0 && !opts.see_large {
            return Ok(f(None));
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
        if opts.mark_access || opts.touch.is_some() {
            let b = shard.bytes_mut(loc);
            if let Some(t) = opts.touch {
                item::set_exptime(b, t);
                shown.exptime = t;
            }
            if opts.mark_access {
                item::set_bits(b, h.bits | item::FETCHED | item::ACCESSED);
                item::set_last_access(b, now);
            }
        }
        // `fetched` and `last_access` are shown as they were before this read (meta h, l, t).
        let (b, _, value) = found.view(&shard);
        Ok(f(Some(item_ref(b, &shown, value))))
    }
}
