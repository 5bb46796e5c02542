//! Staging and settling: a worker encodes a store [`Mutation`] or a large object's chunk into
//! its region log ([`Serving::stage`], [`Serving::stage_chunk`]),
//! the write is visible through the overlay of staged-but-not-durable writes until its
//! completion is applied ([`Serving::settle`]): durable records enter the index (and the
//! large-object bookkeeping), failed ones are reported; both leave the overlay.
use crate::units::usize_from;
use std::hash::BuildHasher;
use std::sync::atomic::Ordering;
use std::sync::MutexGuard;

use super::objects::{remove_chunks, ObjectRef};
use ringstore_store::Mutation;

use super::{lock, Relocation, Reserve, Serving, Settled, FLUSH_KEY, OVERLAY_SHARDS};
use crate::device::BlockDevice;
use crate::engine::Item;
use crate::error::DurableError;
use crate::group_commit::Completion;
use crate::large::{chunk_key, encode_chunk_value, parse_chunk_key, Manifest};
use crate::record::{RecordKind, RecordMeta};
use crate::region::{Purpose, RegionLog, Staged, COMPACTION_RESERVE};

#[derive(Debug)]
pub(super) enum Pending {
    Value(Item),
    Deleted(u64),
}

impl Pending {
    fn seq(&self) -> u64 {
        match self {
            Pending::Value(i) => i.seq,
            Pending::Deleted(s) => *s,
        }
    }
}

/// Staged-but-not-durable writes of the keys hashing to one shard: key → newest pending state.
pub(super) type OverlayShard = crate::index::KeyMap<Box<[u8]>, Pending>;

impl<D: BlockDevice> Serving<D> {
    pub(super) fn overlay_shard(&self, key: &[u8]) -> MutexGuard<'_, OverlayShard> {
        lock(&self.overlay[usize_from(self.hasher.hash_one(key)) % OVERLAY_SHARDS])
    }

    /// Encodes the store's mutation `m` into `log` with ack `token`; returns its sequence.
    /// Call under the store's shard lock for the key, so sequence order is write order.
    /// Errors: `NoSpace`, `Backpressure`, `TooLarge`, `BadManifest`. A client's write: values
    /// keep [`crate::region::DELETE_RESERVE`] free segments back for deletes ([`Reserve::Client`]).
    pub fn stage(
        &self,
        log: &mut RegionLog<u64>,
        m: Mutation<'_>,
        token: u64,
    ) -> Result<u64, DurableError> {
        self.stage_reserving(log, m, token, Reserve::Client)
    }

    /// [`Serving::stage`] with the reserve a value may take chosen by the caller: only the
    /// appliance's own in-process writers pass [`Reserve::Internal`].
    pub fn stage_reserving(
        &self,
        log: &mut RegionLog<u64>,
        m: Mutation<'_>,
        token: u64,
        reserve: Reserve,
    ) -> Result<u64, DurableError> {
        let object = match m {
            Mutation::Put {
                large: true, value, ..
            } => {
                let m = Manifest::decode(value).ok_or(DurableError::BadManifest)?;
                Some((m.object, m.chunks()))
            }
            _ => None,
        };
        let seq = self.next_seq.fetch_add(1, Ordering::Relaxed);
        match m {
            Mutation::Put {
                key,
                value,
                flags,
                exptime,
                cas,
                large,
            } => {
                let meta = RecordMeta {
                    kind: if large {
                        RecordKind::Manifest
                    } else {
                        RecordKind::Value
                    },
                    flags,
                    exptime: self.to_unix(exptime),
                    cas,
                    seq,
                };
                let keep = reserve.keep(); // the caller's choice, never the key's (ADR 0039)
                log.stage_keeping(key, value, meta, Purpose::Client(token), keep)?;
                if let Some(obj) = object {
                    let mut objects = lock(&self.objects);
                    objects.uploading.remove(&obj.0);
                    objects.staged.insert(seq, obj);
                }
                self.overlay_put(key, Pending::Value(Item::new(&meta, value.to_vec())));
            }
            Mutation::Delete { key } => {
                let meta = RecordMeta::bare(RecordKind::Tombstone, seq);
                log.stage_keeping(key, &[], meta, Purpose::Client(token), COMPACTION_RESERVE)?;
                self.overlay_put(key, Pending::Deleted(seq));
            }
            Mutation::FlushAll { at } => {
                let at = self.unix_start + u64::from(at);
                let meta = RecordMeta::bare(RecordKind::Value, seq);
                let value = at.to_le_bytes();
                let client = Purpose::Client(token);
                log.stage_keeping(FLUSH_KEY, &value, meta, client, COMPACTION_RESERVE)?;
                let mut f = lock(&self.flush);
                if f.is_none_or(|(s, _)| s < seq) {
                    *f = Some((seq, at));
                }
            }
        }
        Ok(seq)
    }

    /// Encodes chunk `index` of large object `object` into `log` with ack `token`: logged
    /// under [`chunk_key`]`(object, index)` with its piece table in front
    /// ([`encode_chunk_value`]), settled like a client write (a failed one is reported with
    /// the chunk key and cas 0), never visible to [`Serving::lookup`]. `bytes` is at most
    /// [`Serving::chunk_len`]; returns the record's sequence.
    pub fn stage_chunk(
        &self,
        log: &mut RegionLog<u64>,
        object: u64,
        index: u32,
        bytes: &[u8],
        token: u64,
    ) -> Result<u64, DurableError> {
        let seq = self.next_seq.fetch_add(1, Ordering::Relaxed);
        let key = chunk_key(object, index);
        let value = encode_chunk_value(bytes);
        let meta = RecordMeta::bare(RecordKind::Value, seq);
        let keep = Reserve::Client.keep();
        log.stage_keeping(&key, &value, meta, Purpose::Client(token), keep)?;
        let len = log.record_len(key.len(), value.len()) as u64;
        *lock(&self.objects).uploading.entry(object).or_default() += len;
        Ok(seq) // nobody reads a chunk before its manifest is durable
    }

    /// A store time as Unix seconds (0, never, stays 0).
    fn to_unix(&self, t: ringstore_store::Time) -> u64 {
        if t == 0 {
            0
        } else {
            self.unix_start + u64::from(t)
        }
    }

    /// Makes `pending` the key's newest staged state, unless a newer one is there already.
    fn overlay_put(&self, key: &[u8], pending: Pending) {
        let seq = pending.seq();
        let mut shard = self.overlay_shard(key);
        match shard.get_mut(key) {
            Some(p) if p.seq() > seq => {}
            Some(p) => *p = pending,
            None => {
                shard.insert(key.into(), pending);
            }
        }
    }

    /// Apply a completion of a worker's log: durable records enter the index, failed ones are
    /// noted (they may or may not be on the device); both leave the overlay.
    pub fn settle(&self, done: Completion<Staged<u64>>) -> Settled {
        let mut out = Settled::default();
        if done.acked.is_empty() && done.failed.is_empty() {
            return out;
        }
        {
            let mut index = self.write_index();
            let mut objects = lock(&self.objects);
            // (user key, object) whose chunks may have become garbage.
            let mut garbage: Vec<(&[u8], ObjectRef)> = Vec::new();
            for s in &done.acked {
                match s.purpose {
                    Purpose::Client(_) => {
                        let newest = index.apply(&s.key, s.meta, s.loc, s.value_len, s.seed);
                        if s.key.is_empty() || parse_chunk_key(&s.key).is_some() {
                            continue;
                        }
                        let mine = if s.meta.kind == RecordKind::Manifest {
                            objects.staged.remove(&s.meta.seq)
                        } else {
                            None
                        };
                        if newest {
                            let prev = match mine {
                                Some(obj) => objects.live.insert(s.key.clone(), obj),
                                // No large object anywhere: nothing to look up.
                                None if objects.live.is_empty() => None,
                                None => objects.live.remove(&s.key),
                            };
                            if let Some(prev) = prev {
                                garbage.push((&s.key, prev));
                            }
                        } else if let Some(obj) = mine {
                            garbage.push((&s.key, obj)); // superseded before it settled
                        }
                    }
                    Purpose::Relocate(from) => {
                        let moved = index.relocate(&s.key, s.meta, from, s.loc, s.seed);
                        out.relocated.push(if moved {
                            Relocation::Moved(from)
                        } else {
                            Relocation::Superseded(from)
                        });
                    }
                }
            }
            for s in &done.failed {
                index.note_unapplied(&s.key, s.meta, s.loc);
                match s.purpose {
                    Purpose::Relocate(from) => out.relocated.push(Relocation::Failed(from)),
                    Purpose::Client(_) if s.meta.kind == RecordKind::Manifest => {
                        // Its chunks stay: a failed write may still be on the device (a
                        // failed flush, a later flush persisting it) and come back after a
                        // crash; the start-up sweep removes them if it does not.
                        objects.staged.remove(&s.meta.seq);
                    }
                    Purpose::Client(_) => {}
                }
            }
            for (key, obj) in garbage {
                if !objects.needed(key, obj.0) {
                    remove_chunks(&mut index, obj);
                }
            }
        }
        // Index first, overlay second: a reader that misses the overlay finds the index current.
        for s in done.acked.iter().chain(&done.failed) {
            if matches!(s.purpose, Purpose::Relocate(_)) || parse_chunk_key(&s.key).is_some() {
                continue; // copies and chunks never enter the overlay
            }
            let mut shard = self.overlay_shard(&s.key);
            if shard.get(&s.key).is_some_and(|p| p.seq() == s.meta.seq) {
                shard.remove(&s.key);
            }
        }
        for s in done.acked {
            if let Purpose::Client(t) = s.purpose {
                out.acked.push(t);
            }
        }
        for s in done.failed {
            if let Purpose::Client(t) = s.purpose {
                out.failed.push((t, s.key, s.meta.cas));
            }
        }
        out
    }
}
