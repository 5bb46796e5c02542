//! Writes: the read-decide-write `update` and the put it ends in, journal first.

use super::*;

/// Where one write lands: the key, its hash, the clock and the journal it is recorded in.
#[derive(Clone, Copy)]
pub(super) struct Target<'k, 'j> {
    pub hash: u64,
    pub key: &'k [u8],
    pub now: Time,
    pub journal: Option<&'j dyn Journal>,
}

impl Store {
    /// [`Journaled::update`] with the journal passed in.
    pub(crate) fn update_logged<'v, R>(
        &self,
        key: &[u8],
        now: Time,
        journal: Option<&dyn Journal>,
        f: impl FnOnce(Option<ItemRef<'_>>) -> (Write<'v>, R),
    ) -> Result<Updated<R>, StoreError> {
        let journal = self.journal_for_write(journal)?;
        let hash = self.shared.hasher.hash_one(key);
        let mut shard = self.lock(hash, now);
        let found = if key.len() <= KEY_LEN_MAX {
            self.find(&mut shard, hash, key, now)
        } else {
            None
        };
        let (write, result) = match &found {
            Some(found) => {
                let (b, h, value) = found.view(&shard);
                f(Some(item_ref(b, &h, value, now)))
            }
            None => f(None),
        };
        let at = Target {
            hash,
            key,
            now,
            journal,
        };
        let cas = self.apply(&mut shard, at, found.as_ref(), write)?;
        Ok(Updated { result, cas })
    }

    /// [`Journaled::set`] with the journal passed in.
    pub(crate) fn set_logged(
        &self,
        key: &[u8],
        now: Time,
        journal: Option<&dyn Journal>,
        value: &[u8],
        meta: NewMeta,
    ) -> Result<u64, StoreError> {
        let journal = self.journal_for_write(journal)?;
        let hash = self.shared.hasher.hash_one(key);
        let mut shard = self.lock(hash, now);
        let at = Target {
            hash,
            key,
            now,
            journal,
        };
        self.put(&mut shard, at, value, meta, false)
    }

    /// Carries out the caller's decision on the item `found` (if any); the new CAS unique
    /// when something was written. Inlined: a SET's path stays one frame, as before the split
    /// (callgrind: a separate frame cost about 45 instructions per set).
    #[inline(always)]
    pub(super) fn apply(
        &self,
        shard: &mut Shard,
        at: Target<'_, '_>,
        found: Option<&Found>,
        write: Write<'_>,
    ) -> Result<Option<u64>, StoreError> {
        match write {
            Write::Nothing => Ok(None),
            Write::Put { value, meta } => self.put(shard, at, value, meta, false).map(Some),
            Write::PutStale {
                value,
                meta,
                win_token_sent,
            } => self
                .put_stale(shard, at, value, meta, win_token_sent)
                .map(Some),
            Write::PutLarge { manifest, meta } => {
                if at.journal.is_none() {
                    return Err(StoreError::TooLarge); // no device to hold the rest
                }
                self.put(shard, at, manifest, meta, true).map(Some)
            }
            Write::PutNumber { value, meta } => {
                let mut buf = [0u8; 20];
                let digits = decimal(value, &mut buf);
                self.put(shard, at, digits, meta, false).map(Some)
            }
            Write::Append { suffix, meta } => match found {
                None => Ok(None),
                Some(found) => self.join(shard, at, found, Joined::Append(suffix), meta),
            },
            Write::Prepend { prefix, meta } => match found {
                None => Ok(None),
                Some(found) => self.join(shard, at, found, Joined::Prepend(prefix), meta),
            },
            Write::Meta {
                exptime,
                stale,
                win_token_sent,
                new_cas,
            } => match found {
                None => Ok(None),
                Some(found) => {
                    let cas = if new_cas { NewCas::Next } else { NewCas::Keep };
                    let marks = Marks {
                        stale,
                        win_token_sent,
                    };
                    self.rewrite_meta(shard, at, found, exptime, marks, cas)
                        .map(Some)
                }
            },
            Write::MetaWithCas {
                exptime,
                stale,
                win_token_sent,
                cas,
            } => match found {
                None => Ok(None),
                Some(found) => {
                    let marks = Marks {
                        stale,
                        win_token_sent,
                    };
                    self.rewrite_meta(shard, at, found, exptime, marks, NewCas::Given(cas))
                        .map(Some)
                }
            },
            Write::Delete => {
                if let Some(found) = found {
                    if let Some(journal) = at.journal {
                        journal.record(Mutation::Delete { key: at.key })?;
                    }
                    shard.delete(&self.shared, at.hash, found.loc);
                }
                Ok(None)
            }
        }
    }

    /// `value` stored, then marked stale (and won, if the win token was sent).
    fn put_stale(
        &self,
        shard: &mut Shard,
        at: Target<'_, '_>,
        value: &[u8],
        meta: NewMeta,
        win_token_sent: bool,
    ) -> Result<u64, StoreError> {
        let cas = self.put(shard, at, value, meta, false)?;
        if let Some(loc) = shard.lookup(&self.shared, at.hash, at.key, at.now) {
            let b = shard.bytes_mut(loc);
            let bits = Header::read(b).bits;
            let win = if win_token_sent { item::WIN } else { 0 };
            item::set_bits(b, bits | item::STALE | win);
        }
        Ok(cas)
    }

    /// The existing value with `extra` joined on one side (append/prepend), stored anew.
    fn join(
        &self,
        shard: &mut Shard,
        at: Target<'_, '_>,
        found: &Found,
        extra: Joined<'_>,
        meta: NewMeta,
    ) -> Result<Option<u64>, StoreError> {
        let (_, h, old) = found.view(shard);
        let extra_len = match extra {
            Joined::Append(b) | Joined::Prepend(b) => b.len(),
        };
        // A large object is not a memcache value: it cannot grow through append.
        if h.bits & item::LARGE != 0 || old.len() + extra_len > self.config.item_size_max {
            return Err(StoreError::TooLarge);
        }
        let mut joined = Vec::with_capacity(old.len() + extra_len);
        match extra {
            Joined::Append(suffix) => {
                joined.extend_from_slice(old);
                joined.extend_from_slice(suffix);
            }
            Joined::Prepend(prefix) => {
                joined.extend_from_slice(prefix);
                joined.extend_from_slice(old);
            }
        }
        self.put(shard, at, &joined, meta, false).map(Some)
    }

    /// The item's TTL, stale/win marks and CAS unique changed in place (journal first).
    fn rewrite_meta(
        &self,
        shard: &mut Shard,
        at: Target<'_, '_>,
        found: &Found,
        exptime: Time,
        marks: Marks,
        new_cas: NewCas,
    ) -> Result<u64, StoreError> {
        let loc = found.loc;
        // Drawn before the item is borrowed: the shard's CAS counter lives in the shard.
        let next = matches!(new_cas, NewCas::Next).then(|| self.next_cas(shard, at.hash));
        let (_, h, value) = found.view(shard);
        let mut bits = h.bits & !(item::STALE | item::WIN);
        if marks.stale {
            bits |= item::STALE;
        }
        if marks.win_token_sent {
            bits |= item::WIN;
        }
        let cas = match new_cas {
            NewCas::Given(cas) => cas,
            NewCas::Next => next.unwrap_or(h.cas),
            NewCas::Keep => h.cas,
        };
        if let Some(journal) = at.journal {
            journal.record(Mutation::Put {
                key: at.key,
                value,
                flags: h.flags,
                exptime,
                cas,
                large: h.bits & item::LARGE != 0,
            })?;
        }
        let b = shard.bytes_mut(loc);
        let loc = if item::set_exptime(b, exptime) && item::set_cas(b, cas) {
            loc
        } else {
            // The header has no room for the exptime or the CAS unique: written anew.
            match self.rewrite(shard, at, loc, exptime, cas)? {
                Some(new) => new,
                None => return Ok(cas), // evicted to make its own room
            }
        };
        item::set_bits(shard.bytes_mut(loc), bits);
        Ok(cas)
    }

    /// [`Shard::rewrite`] of the item at `loc` (already journaled with `exptime` and
    /// `cas`); when there is no room, a journaled item's RAM copy is dropped, so the
    /// device's new state is what reads see next.
    pub(super) fn rewrite(
        &self,
        shard: &mut Shard,
        at: Target<'_, '_>,
        loc: shard::Loc,
        exptime: Time,
        cas: u64,
    ) -> Result<Option<shard::Loc>, StoreError> {
        let rewritten = shard.rewrite(&self.shared, at.hash, loc, exptime, cas, at.now);
        if rewritten.is_err() && at.journal.is_some() {
            if let Some(l) = shard.lookup(&self.shared, at.hash, at.key, at.now) {
                shard.delete(&self.shared, at.hash, l);
            }
        }
        rewritten
    }

    fn put(
        &self,
        shard: &mut Shard,
        at: Target<'_, '_>,
        value: &[u8],
        meta: NewMeta,
        large: bool,
    ) -> Result<u64, StoreError> {
        let Target {
            hash,
            key,
            now,
            journal,
        } = at;
        if value.len() > self.config.item_size_max || key.len() > KEY_LEN_MAX {
            return Err(StoreError::TooLarge);
        }
        let cas = match meta.cas {
            Some(cas) => cas,
            None => self.next_cas(shard, hash),
        };
        if let Some(journal) = journal {
            journal.record(Mutation::Put {
                key,
                value,
                flags: meta.flags,
                exptime: meta.exptime,
                cas,
                large,
            })?;
        }
        // Extstore-like: the journal has the whole value, RAM keeps a stub; needs the
        // backfill to read it back.
        let external = journal.is_some()
            && self.backfill.get().is_some()
            && self.keeps_external(value.len(), large);
        let new = NewItem {
            key,
            value,
            flags: meta.flags,
            exptime: meta.exptime,
            cas,
            now,
            large,
            external,
        };
        let stored = shard.store(&self.shared, hash, &new, true);
        if stored.is_err() && journal.is_some() {
            // The device may still get the new value; an older RAM copy must not outlive it.
            if let Some(loc) = shard.lookup(&self.shared, hash, key, now) {
                shard.delete(&self.shared, hash, loc);
            }
        }
        stored
    }
}

/// The bytes an append or prepend joins to the existing value, and on which side.
#[derive(Clone, Copy)]
enum Joined<'v> {
    Append(&'v [u8]),
    Prepend(&'v [u8]),
}

/// The stale and win-token marks a metadata rewrite leaves on the item.
#[derive(Clone, Copy)]
struct Marks {
    stale: bool,
    win_token_sent: bool,
}

/// The CAS unique a metadata rewrite gives the item.
#[derive(Clone, Copy)]
enum NewCas {
    /// The one it has.
    Keep,
    /// A fresh one from the store's counter.
    Next,
    /// The caller's (meta `E`).
    Given(u64),
}
