//! The device index: key → newest record location, plus live bytes per segment and the
//! bookkeeping that tells compaction when a tombstone may be forgotten.
use std::collections::HashMap;

use crate::record::{RecordKind, RecordMeta};

/// The hasher of the durable engine's key maps (index, overlay, large-object maps): foldhash,
/// seeded per process like the store's shards. Every settled write hashes its key about half
/// a dozen times (index apply, overlay), where SipHash cost more than the lookups themselves.
pub type KeyHasher = foldhash::fast::RandomState;

/// A map from keys (or ids) with [`KeyHasher`].
pub type KeyMap<K, V> = HashMap<K, V, KeyHasher>;

/// Where a record lives on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Loc {
    /// Region (writer) number.
    pub region: u32,
    /// Segment within the region.
    pub segment: u32,
    /// Byte offset of the record within the segment.
    pub offset: u32,
    /// Record length in the log, padding included (0 marks a placeholder with no live record).
    pub len: u32,
}

/// The index's view of one key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// Header of the newest record.
    pub meta: RecordMeta,
    /// Where it is.
    pub loc: Loc,
    /// Value length.
    pub value_len: u32,
    /// crc the record chains after (needed to verify it when read alone).
    pub seed: u32,
    /// Value records for this key still on the device that are older than (or duplicates of)
    /// this one. A tombstone may be dropped only when this is zero, or recovery would resurrect one.
    pub older: u32,
}

/// key → [`Entry`], live bytes per segment, and the highest sequence and CAS seen.
#[derive(Debug)]
pub struct Index {
    map: KeyMap<Box<[u8]>, Entry>,
    live: Vec<u64>,
    segments_per_region: u32,
    max_seq: u64,
    max_cas: u64,
}

impl Index {
    /// An empty index for `regions × segments_per_region` segments.
    pub fn new(regions: u32, segments_per_region: u32) -> Self {
        Index {
            map: KeyMap::default(),
            live: vec![0; regions as usize * segments_per_region as usize],
            segments_per_region,
            max_seq: 0,
            max_cas: 0,
        }
    }

    fn slot(&self, loc: &Loc) -> usize {
        loc.region as usize * self.segments_per_region as usize + loc.segment as usize
    }

    fn add_live(&mut self, loc: &Loc, delta: i64) {
        let i = self.slot(loc);
        debug_assert!(i < self.live.len(), "{loc:?} outside the geometry");
        if let Some(v) = self.live.get_mut(i) {
            // A record leaves a segment's live bytes only after it entered them.
            debug_assert!(
                delta >= 0 || *v >= delta.unsigned_abs(),
                "{loc:?}: live bytes below zero"
            );
            *v = v.saturating_add_signed(delta);
        }
    }

    /// Make room for `n` more keys (recovery knows the count up front).
    pub fn reserve(&mut self, n: usize) {
        self.map.reserve(n);
    }

    /// The entry for `key` (tombstones included).
    pub fn get(&self, key: &[u8]) -> Option<&Entry> {
        self.map.get(key)
    }

    /// Number of keys tracked (tombstones included).
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// True when no key is tracked.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Highest sequence applied.
    pub fn max_seq(&self) -> u64 {
        self.max_seq
    }

    /// Highest CAS applied.
    pub fn max_cas(&self) -> u64 {
        self.max_cas
    }

    /// Live bytes in segment `seg` of `region`.
    pub fn live_bytes(&self, region: u32, seg: u32) -> u64 {
        self.live
            .get(self.slot(&Loc {
                region,
                segment: seg,
                offset: 0,
                len: 0,
            }))
            .copied()
            .unwrap_or(0)
    }

    /// Total live bytes.
    pub fn total_live(&self) -> u64 {
        self.live.iter().sum()
    }

    /// Every entry (for checkpoints and warming the RAM tier).
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &Entry)> {
        self.map.iter().map(|(k, e)| (&**k, e))
    }

    /// A record for `key` is on the device (acked write, or found by recovery): the highest sequence wins.
    /// Returns true when the key's entry is now this record (what a second look-up would say).
    pub fn apply(
        &mut self,
        key: &[u8],
        meta: RecordMeta,
        loc: Loc,
        value_len: u32,
        seed: u32,
    ) -> bool {
        self.max_seq = self.max_seq.max(meta.seq);
        self.max_cas = self.max_cas.max(meta.cas);
        let new = Entry {
            meta,
            loc,
            value_len,
            seed,
            older: 0,
        };
        match self.map.get_mut(key) {
            None => {
                self.map.insert(key.into(), new);
                self.add_live(&loc, i64::from(loc.len));
                true
            }
            Some(e) if meta.seq > e.meta.seq => {
                let old = *e;
                *e = Entry {
                    older: old.older + u32::from(old.meta.kind.has_value() && old.loc.len > 0),
                    ..new
                };
                self.add_live(&old.loc, -i64::from(old.loc.len));
                self.add_live(&loc, i64::from(loc.len));
                true
            }
            Some(e) => {
                if meta.kind.has_value() {
                    e.older += 1;
                }
                e.meta.seq == meta.seq
            }
        }
    }

    /// A record may be on the device but was not applied (its write failed): count it so no
    /// tombstone is dropped while it could still be found by recovery.
    pub fn note_unapplied(&mut self, key: &[u8], meta: RecordMeta, loc: Loc) {
        if !meta.kind.has_value() {
            return;
        }
        match self.map.get_mut(key) {
            Some(e) => e.older += 1,
            None => {
                // Placeholder: absent key that still has a value record somewhere on the device.
                let meta = RecordMeta {
                    kind: RecordKind::Tombstone,
                    ..meta
                };
                let loc = Loc { len: 0, ..loc };
                self.map.insert(
                    key.into(),
                    Entry {
                        meta,
                        loc,
                        value_len: 0,
                        seed: 0,
                        older: 1,
                    },
                );
            }
        }
    }

    /// Compaction copied the live record at `from` to `to` (or, evicting it, wrote a tombstone
    /// of the same sequence there: the entry becomes that tombstone). False (and the copy counts as an
    /// older duplicate) when the entry changed meanwhile.
    pub fn relocate(
        &mut self,
        key: &[u8],
        meta: RecordMeta,
        from: Loc,
        to: Loc,
        seed: u32,
    ) -> bool {
        match self.map.get_mut(key) {
            Some(e) if e.meta.seq == meta.seq && e.loc == from => {
                e.loc = to;
                e.seed = seed;
                if !meta.kind.has_value() {
                    // An eviction's tombstone at the evicted record's sequence (ADR 0039).
                    e.meta = meta;
                    e.value_len = 0;
                }
                self.add_live(&from, -i64::from(from.len));
                self.add_live(&to, i64::from(to.len));
                true
            }
            _ => {
                self.note_unapplied(key, meta, to);
                false
            }
        }
    }

    /// True when `loc` holds the entry's current record.
    pub fn is_live(&self, key: &[u8], loc: &Loc) -> bool {
        self.map
            .get(key)
            .is_some_and(|e| e.loc == *loc && loc.len > 0)
    }

    /// The segment holding a dead record was erased: one older record fewer for its key.
    /// A tombstone with no older value left is forgotten.
    pub fn reclaimed(&mut self, key: &[u8], kind: RecordKind) {
        self.reclaimed_below(key, kind, u64::MAX);
    }

    /// [`Index::reclaimed`] while writes may be in flight: the tombstone is forgotten only if
    /// its sequence is below `floor`, the oldest unsettled client write of any region (an older
    /// write of the key settling later would otherwise find no entry and come back to life).
    pub fn reclaimed_below(&mut self, key: &[u8], kind: RecordKind, floor: u64) {
        if !kind.has_value() {
            return;
        }
        let Some(e) = self.map.get_mut(key) else {
            return;
        };
        if e.older == 0 {
            return;
        }
        e.older -= 1;
        if e.older == 0 && e.meta.kind == RecordKind::Tombstone && e.meta.seq < floor {
            let loc = e.loc;
            self.map.remove(key);
            self.add_live(&loc, -i64::from(loc.len));
        }
    }

    /// Forget `key`: its live record is being erased with its segment and nothing older
    /// remains, or it is a chunk no manifest needs (its bytes become dead and compaction
    /// reclaims them). Its segment's live bytes drop by the record's length. True when the
    /// key was tracked.
    pub fn remove(&mut self, key: &[u8]) -> bool {
        match self.map.remove(key) {
            Some(e) => {
                self.add_live(&e.loc, -i64::from(e.loc.len));
                true
            }
            None => false,
        }
    }

    /// Restore an entry from a checkpoint.
    pub fn restore(&mut self, key: Box<[u8]>, entry: Entry) {
        self.max_seq = self.max_seq.max(entry.meta.seq);
        self.max_cas = self.max_cas.max(entry.meta.cas);
        self.add_live(&entry.loc, i64::from(entry.loc.len));
        self.map.insert(key, entry);
    }

    /// Raise the sequence/CAS floors (a checkpoint remembers them even for forgotten keys).
    pub fn raise_floors(&mut self, seq: u64, cas: u64) {
        self.max_seq = self.max_seq.max(seq);
        self.max_cas = self.max_cas.max(cas);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(kind: RecordKind, seq: u64) -> RecordMeta {
        RecordMeta {
            kind,
            flags: 0,
            exptime: 0,
            cas: seq * 10,
            seq,
        }
    }
    fn l(seg: u32, off: u32) -> Loc {
        Loc {
            region: 0,
            segment: seg,
            offset: off,
            len: 64,
        }
    }

    #[test]
    fn newest_sequence_wins_in_any_order() {
        let mut a = Index::new(1, 4);
        assert!(a.apply(b"k", m(RecordKind::Value, 2), l(1, 0), 5, 0));
        assert!(
            !a.apply(b"k", m(RecordKind::Value, 1), l(0, 0), 5, 0),
            "older: not the entry"
        );
        let mut b = Index::new(1, 4);
        assert!(b.apply(b"k", m(RecordKind::Value, 1), l(0, 0), 5, 0));
        assert!(b.apply(b"k", m(RecordKind::Value, 2), l(1, 0), 5, 0));
        for ix in [&a, &b] {
            let e = ix.get(b"k").unwrap();
            assert_eq!((e.meta.seq, e.loc, e.older), (2, l(1, 0), 1));
            assert_eq!((ix.live_bytes(0, 0), ix.live_bytes(0, 1)), (0, 64));
            assert_eq!((ix.max_seq(), ix.max_cas()), (2, 20));
        }
    }

    #[test]
    fn tombstone_is_dropped_only_after_every_older_value_is_erased() {
        let mut ix = Index::new(1, 4);
        ix.apply(b"k", m(RecordKind::Value, 1), l(0, 0), 5, 0);
        ix.apply(b"k", m(RecordKind::Value, 2), l(1, 0), 5, 0);
        ix.apply(b"k", m(RecordKind::Tombstone, 3), l(2, 0), 0, 0);
        assert_eq!(ix.get(b"k").unwrap().older, 2);
        ix.reclaimed(b"k", RecordKind::Value);
        assert!(ix.get(b"k").is_some());
        ix.reclaimed(b"k", RecordKind::Value);
        assert!(ix.get(b"k").is_none());
        assert_eq!(ix.total_live(), 0);
    }

    #[test]
    fn failed_write_keeps_a_placeholder() {
        let mut ix = Index::new(1, 4);
        ix.note_unapplied(b"k", m(RecordKind::Value, 4), l(3, 0));
        let e = *ix.get(b"k").unwrap();
        assert_eq!(
            (e.meta.kind, e.older, e.loc.len),
            (RecordKind::Tombstone, 1, 0)
        );
        assert!(!ix.is_live(b"k", &e.loc));
        ix.reclaimed(b"k", RecordKind::Value);
        assert!(ix.get(b"k").is_none());
    }

    #[test]
    fn remove_drops_the_records_live_bytes_and_manifests_count_as_values() {
        let mut ix = Index::new(1, 4);
        ix.apply(b"c1", m(RecordKind::Value, 1), l(0, 0), 5, 0);
        ix.apply(b"c2", m(RecordKind::Value, 2), l(0, 64), 5, 0);
        ix.apply(b"k", m(RecordKind::Manifest, 3), l(1, 0), 5, 0);
        assert_eq!((ix.live_bytes(0, 0), ix.total_live()), (128, 192));
        assert!(ix.remove(b"c1"));
        assert!(!ix.remove(b"c1"), "already gone");
        assert_eq!((ix.live_bytes(0, 0), ix.total_live()), (64, 128));
        // A manifest replaced by a tombstone is an older value the tombstone must outlive.
        ix.apply(b"k", m(RecordKind::Tombstone, 4), l(2, 0), 0, 0);
        assert_eq!(ix.get(b"k").unwrap().older, 1);
        ix.reclaimed(b"k", RecordKind::Manifest);
        assert!(ix.get(b"k").is_none());
        ix.note_unapplied(b"m", m(RecordKind::Manifest, 5), l(3, 0));
        assert_eq!(ix.get(b"m").unwrap().older, 1);
    }

    #[test]
    fn relocate_moves_live_bytes_or_counts_a_duplicate() {
        let mut ix = Index::new(1, 4);
        ix.apply(b"k", m(RecordKind::Value, 1), l(0, 0), 5, 0);
        assert!(ix.relocate(b"k", m(RecordKind::Value, 1), l(0, 0), l(1, 8), 7));
        assert_eq!((ix.live_bytes(0, 0), ix.live_bytes(0, 1)), (0, 64));
        assert!(!ix.relocate(b"k", m(RecordKind::Value, 1), l(0, 0), l(2, 8), 7));
        assert_eq!(ix.get(b"k").unwrap().older, 1);
    }
}
