//! Writes: the read-decide-write `update` and the put it ends in, journal first.

use super::*;

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
                f(Some(item_ref(b, &h, value)))
            }
            None => f(None),
        };
        let cas = match write {
            Write::Nothing => None,
            Write::Put { value, meta } => {
                Some(self.put(&mut shard, hash, key, value, meta, now, false, journal)?)
            }
            Write::PutStale {
                value,
                meta,
                win_token_sent,
            } => {
                let cas = self.put(&mut shard, hash, key, value, meta, now, false, journal)?;
                if let Some(loc) = shard.lookup(&self.shared, hash, key, now) {
                    let b = shard.bytes_mut(loc);
                    let bits = Header::read(b).bits;
                    let win = if win_token_sent { item::WIN } else { 0 };
                    item::set_bits(b, bits | item::STALE | win);
                }
                Some(cas)
            }
            Write::PutLarge { manifest, meta } => {
                if journal.is_none() {
                    return Err(StoreError::TooLarge); // no device to hold the rest
                }
                Some(self.put(&mut shard, hash, key, manifest, meta, now, true, journal)?)
            }
            Write::PutNumber { value, meta } => {
                let mut buf = [0u8; 20];
                let digits = decimal(value, &mut buf);
                Some(self.put(&mut shard, hash, key, digits, meta, now, false, journal)?)
            }
            Write::Append {
                suffix: extra,
                meta,
            }
            | Write::Prepend {
                prefix: extra,
                meta,
            } => match &found {
                None => None,
                Some(found) => {
                    let (_, h, old) = found.view(&shard);
                    // A large object is not a memcache value: it cannot grow through append.
                    if h.bits & item::LARGE != 0
                        || old.len() + extra.len() > self.config.item_size_max
                    {
                        return Err(StoreError::TooLarge);
                    }
                    let mut joined = Vec::with_capacity(old.len() + extra.len());
                    if matches!(write, Write::Append { .. }) {
                        joined.extend_from_slice(old);
                        joined.extend_from_slice(extra);
                    } else {
                        joined.extend_from_slice(extra);
                        joined.extend_from_slice(old);
                    }
                    Some(self.put(&mut shard, hash, key, &joined, meta, now, false, journal)?)
                }
            },
            Write::Meta {
                exptime,
                stale,
                win_token_sent,
                ..
            }
            | Write::MetaWithCas {
                exptime,
                stale,
                win_token_sent,
                ..
            } => match &found {
                None => None,
                Some(found) => {
                    let loc = found.loc;
                    let (_, h, value) = found.view(&shard);
                    let mut bits = h.bits & !(item::STALE | item::WIN);
                    if stale {
                        bits |= item::STALE;
                    }
                    if win_token_sent {
                        bits |= item::WIN;
                    }
                    let cas = match write {
                        Write::MetaWithCas { cas, .. } => cas,
                        Write::Meta { new_cas: true, .. } => self.next_cas(),
                        _ => h.cas,
                    };
                    if let Some(journal) = journal {
                        journal.record(Mutation::Put {
                            key,
                            value,
                            flags: h.flags,
                            exptime,
                            cas,
                            large: h.bits & item::LARGE != 0,
                        })?;
                    }
                    let b = shard.bytes_mut(loc);
                    item::set_exptime(b, exptime);
                    item::set_bits(b, bits);
                    item::set_cas(b, cas);
                    Some(cas)
                }
            },
            Write::Delete => {
                if let Some(found) = found {
                    if let Some(journal) = journal {
                        journal.record(Mutation::Delete { key })?;
                    }
                    shard.delete(&self.shared, hash, found.loc);
                }
                None
            }
        };
        Ok(Updated { result, cas })
    }

    #[allow(clippy::too_many_arguments)] // the item's parts, passed through from `update`
    fn put(
        &self,
        shard: &mut Shard,
        hash: u64,
        key: &[u8],
        value: &[u8],
        meta: NewMeta,
        now: Time,
        large: bool,
        journal: Option<&dyn Journal>,
    ) -> Result<u64, StoreError> {
        if value.len() > self.config.item_size_max || key.len() > KEY_LEN_MAX {
            return Err(StoreError::TooLarge);
        }
        let cas = meta.cas.unwrap_or_else(|| self.next_cas());
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
        let stored = shard.store(&self.shared, hash, &new);
        if stored.is_err() && journal.is_some() {
            // The device may still get the new value; an older RAM copy must not outlive it.
            if let Some(loc) = shard.lookup(&self.shared, hash, key, now) {
                shard.delete(&self.shared, hash, loc);
            }
        }
        stored
    }
}
