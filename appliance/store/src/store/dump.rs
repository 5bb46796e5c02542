//! The key dump (memcached `lru_crawler metadump`): a cursor over every shard's items,
//! walked in bounded steps so a caller can produce the listing as its client drains it.
//!
//! Consistency: each step holds one shard lock, so between steps the keyspace changes.
//! An item that is live and unchanged for the whole dump is listed at least once, and
//! twice at most: when eviction compacts its segment while the dump is inside that segment
//! (the segment is walked again from its start). An item written, deleted, expired or
//! moved during the dump may be listed or missed, and its newest version may be listed
//! beside an older one. A key is never listed with another key's metadata, and no step
//! reads outside an item: offsets are used only in the segment layout they came from.

use super::*;

use crate::shard::WalkPos;

/// Where a key dump resumes ([`Store::dump`]); `DumpCursor::default()` starts one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DumpCursor {
    shard: usize,
    pos: WalkPos,
}

/// One item as a key dump shows it, borrowed while its shard lock is held.
#[derive(Debug, Clone, Copy)]
pub struct DumpItem<'a> {
    pub key: &'a [u8],
    /// Absolute expiry in store time, or [`NEVER`].
    pub exptime: Time,
    pub last_access: Time,
    pub cas: u64,
    /// Read since it was stored.
    pub fetched: bool,
    pub flags: u32,
    /// Length of the value (for an external item, the value on the data device).
    pub value_len: usize,
    /// The value is on the data device, only the key and header in RAM.
    pub external: bool,
}

impl Store {
    /// Calls `f` with the live items from `cursor` on, taking at most `budget` steps (one
    /// per item examined, dead ones included, and one per segment slot passed), one shard
    /// lock at a time; `f` runs under that lock and must be short. Returns where to resume,
    /// or `None` once every shard has been walked. Large objects are not listed (memcache
    /// does not see them); items only on the data device (not in RAM) are not listed.
    pub fn dump(
        &self,
        cursor: DumpCursor,
        now: Time,
        budget: usize,
        mut f: impl FnMut(DumpItem<'_>),
    ) -> Option<DumpCursor> {
        let mut cursor = cursor;
        let mut left = budget.max(1);
        let mut show = |b: &[u8], h: &Header| {
            f(DumpItem {
                key: &b[h.key_start()..h.value_start()],
                exptime: h.exptime,
                last_access: h.last_access(now),
                cas: h.cas,
                fetched: h.bits & item::FETCHED != 0,
                flags: h.flags,
                value_len: h.value_len,
                external: h.bits & item::EXTERNAL != 0,
            })
        };
        while cursor.shard < self.shards.len() {
            if left == 0 {
                return Some(cursor);
            }
            let shard = self.lock_index(cursor.shard, now);
            let (next, steps) = shard.walk(cursor.pos, now, left, &mut show);
            drop(shard);
            left = left.saturating_sub(steps);
            match next {
                Some(pos) => cursor.pos = pos,
                None => {
                    cursor = DumpCursor {
                        shard: cursor.shard + 1,
                        pos: WalkPos::default(),
                    }
                }
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn store() -> Store {
        Store::new(StoreConfig {
            memory_bytes: 32 << 20,
            item_size_max: 1 << 20,
            shards: 4,
            huge_pages: false,
            external_threshold: 0,
        })
        .expect("store")
    }

    fn put(s: &Store, key: &[u8], exptime: Time) {
        let meta = NewMeta {
            flags: 7,
            exptime,
            cas: None,
        };
        s.update(key, 1, |_| (Write::Put { value: b"vv", meta }, ()))
            .expect("put");
    }

    /// Every key, with how often it was listed, walking `budget` steps at a time.
    fn walk(s: &Store, now: Time, budget: usize) -> (HashMap<Vec<u8>, usize>, usize) {
        let mut seen = HashMap::new();
        let mut cursor = Some(DumpCursor::default());
        let mut calls = 0;
        while let Some(c) = cursor {
            calls += 1;
            cursor = s.dump(c, now, budget, |it| {
                assert_eq!((it.flags, it.value_len), (7, 2));
                *seen.entry(it.key.to_vec()).or_insert(0) += 1;
            });
        }
        (seen, calls)
    }

    #[test]
    fn lists_every_live_key_once_in_bounded_steps() {
        let s = store();
        for i in 0..1000 {
            put(&s, format!("k{i}").as_bytes(), 0);
        }
        put(&s, b"short", 5);
        put(&s, b"k3", 0); // overwritten: its old copy is dead
        s.update(b"k4", 1, |_| (Write::Delete, ())).expect("delete");
        let (seen, calls) = walk(&s, 10, 16);
        assert_eq!(seen.len(), 999, "k4 deleted, `short` expired");
        assert!(seen.values().all(|&n| n == 1));
        assert!(!seen.contains_key(&b"short"[..]) && !seen.contains_key(&b"k4"[..]));
        assert!(calls > 1000 / 16, "bounded steps: {calls} calls");
        let (whole, calls) = walk(&s, 10, usize::MAX);
        assert_eq!((whole, calls), (seen, 1));
    }

    #[test]
    fn survives_changes_between_steps() {
        let s = store();
        for i in 0..500 {
            put(&s, format!("k{i}").as_bytes(), 0);
        }
        let mut seen = HashMap::new();
        let mut cursor = Some(DumpCursor::default());
        let mut round = 0;
        while let Some(c) = cursor {
            round += 1;
            // Churn between steps: new keys, overwrites, deletes, a flush at the end.
            put(&s, format!("new{round}").as_bytes(), 0);
            put(&s, format!("k{}", round % 500).as_bytes(), 0);
            if round == 200 {
                s.flush_all(1, 1);
            }
            cursor = s.dump(c, 1, 8, |it| {
                assert!(it.key.starts_with(b"k") || it.key.starts_with(b"new"));
                *seen.entry(it.key.to_vec()).or_insert(0) += 1;
            });
            assert!(round < 100_000, "the dump ends");
        }
        assert!(seen.values().all(|&n| n <= 2), "{seen:?}");
    }

    #[test]
    fn counts_expired_and_flushed_lookups() {
        let s = store();
        put(&s, b"e", 5);
        put(&s, b"f", 0);
        assert!(!s.get(b"e", 10, ReadOpts::default(), |i| i.is_some()));
        s.flush_all(10, 10);
        assert!(!s.get(b"f", 10, ReadOpts::default(), |i| i.is_some()));
        // The second look-up of the flushed key is a plain miss, as in memcached.
        assert!(!s.get(b"f", 10, ReadOpts::default(), |i| i.is_some()));
        let st = s.stats();
        assert_eq!((st.get_expired, st.get_flushed), (1, 1));
    }

    #[test]
    fn put_stale_marks_the_new_value() {
        let s = store();
        put(&s, b"k", 0);
        let meta = NewMeta {
            flags: 0,
            exptime: 0,
            cas: None,
        };
        let w = Write::PutStale {
            value: b"new",
            meta,
            win_token_sent: true,
        };
        s.update(b"k", 1, |_| (w, ())).expect("put");
        let got = s.get(b"k", 1, ReadOpts::default(), |i| {
            i.map(|i| (i.value.to_vec(), i.stale, i.win_token_sent))
        });
        assert_eq!(got, Some((b"new".to_vec(), true, true)));
    }
}
