//! Tests of the shard index: packing at its limits, colliding tags, full load, and random
//! operations against a `HashMap` model with the Robin Hood invariants checked after each.

use std::collections::HashMap;

use super::*;

/// Checks the layout invariants: `len` words used, a word away from its home never follows
/// an empty bucket, distances grow by at most one from bucket to bucket, and words with one
/// home are in tag order.
fn check(ix: &Index) {
    let cap = ix.words.len();
    assert_eq!(ix.words.iter().filter(|&&w| w != 0).count(), ix.len);
    for i in 0..cap {
        let w = ix.words[i];
        if w == 0 {
            continue;
        }
        let d = ix.dist(w, i);
        let prev = ix.words[(i + cap - 1) % cap];
        if d > 0 {
            assert_ne!(prev, 0, "bucket {i} is {d} from home after an empty bucket");
            assert!(
                d <= ix.dist(prev, (i + cap - 1) % cap) + 1,
                "Robin Hood order at {i}"
            );
        }
    }
}

#[test]
fn locations_at_their_limits_round_trip() {
    for seg_size in [1usize, 2, 4096, (1 << 20) + 4096, 1 << 31, SEGMENT_MAX] {
        let mut ix = Index::new(seg_size);
        let max_off = u32::try_from(seg_size - 1).unwrap();
        let locs = [
            Loc::new(0, 0),
            Loc::new(u16::try_from(SLOTS_MAX - 1).unwrap(), max_off),
            Loc::new(0, max_off),
            Loc::new(u16::try_from(SLOTS_MAX - 1).unwrap(), 0),
        ];
        let hashes = [0u64, u64::MAX, 1 << 63, u64::MAX >> 1];
        for (&h, &l) in hashes.iter().zip(&locs) {
            ix.insert_new(h, l);
        }
        for (&h, &l) in hashes.iter().zip(&locs) {
            assert_eq!(
                ix.find(h, |x| x == l),
                Some(l),
                "seg {seg_size} hash {h:#x}"
            );
        }
        let mut all: Vec<Loc> = ix.iter().collect();
        all.sort_by_key(|l| (l.slot, l.off));
        let mut want = locs.to_vec();
        want.sort_by_key(|l| (l.slot, l.off));
        want.dedup();
        all.dedup();
        assert_eq!(all, want);
        check(&ix);
        let tag_bits = ix.tag_mask.count_ones();
        assert!(tag_bits >= 16 && tag_bits + ix.off_bits + SLOT_BITS == 64);
        assert_eq!(ix.tag_mask.leading_ones(), tag_bits);
    }
}

#[test]
#[should_panic(expected = "segment size")]
fn a_segment_past_32_bit_offsets_is_refused() {
    let _ = Index::new(SEGMENT_MAX + 1);
}

#[test]
fn keys_with_one_hash_are_told_apart_by_their_locations() {
    // Every key has the same hash: one tag, one home, one long run.
    let mut ix = Index::new(1 << 20);
    let h = 0x1234_5678_9abc_def0;
    let n = 2000u32;
    for i in 0..n {
        ix.insert_new(h, Loc::new(u16::try_from(i).unwrap(), i));
    }
    check(&ix);
    for i in (0..n).step_by(2) {
        assert!(ix.remove(h, Loc::new(u16::try_from(i).unwrap(), i)));
    }
    assert!(!ix.remove(h, Loc::new(0, 0)), "already removed");
    check(&ix);
    assert_eq!(ix.len(), n as usize / 2);
    for i in 0..n {
        let l = Loc::new(u16::try_from(i).unwrap(), i);
        assert_eq!(ix.find(h, |x| x == l).is_some(), i % 2 == 1, "{i}");
    }
    // A different tag with the same home is not confused with them.
    assert_eq!(ix.find(h ^ 1 << 63, |_| true), None);
}

#[test]
fn a_full_table_holds_seven_eighths_then_grows_by_a_quarter() {
    let mut ix = Index::new(1 << 20);
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut hashes = Vec::new();
    ix.insert_new(1, Loc::new(1, 1));
    assert!(ix.remove(1, Loc::new(1, 1)));
    for _ in 0..3 {
        ix.grow();
    }
    let cap = ix.capacity();
    assert_eq!(cap, 125);
    while !ix.full() {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        hashes.push(x);
        ix.insert_new(x, Loc::new(u16::try_from(hashes.len()).unwrap(), 0));
    }
    assert_eq!(ix.capacity(), cap, "filled without growing");
    assert_eq!(ix.len(), cap * 7 / 8);
    assert_eq!(ix.allocation_size(), cap * 8);
    check(&ix);
    for (i, &h) in hashes.iter().enumerate() {
        let l = Loc::new(u16::try_from(i + 1).unwrap(), 0);
        assert_eq!(ix.find(h, |x| x == l), Some(l));
    }
    ix.insert_new(7, Loc::new(9999, 0));
    assert_eq!(ix.capacity(), cap + cap / 4);
    check(&ix);
    for (i, &h) in hashes.iter().enumerate() {
        assert!(ix.remove(h, Loc::new(u16::try_from(i + 1).unwrap(), 0)));
    }
    assert!(ix.remove(7, Loc::new(9999, 0)));
    assert_eq!(ix.len(), 0);
    assert!(
        ix.words.iter().all(|&w| w == 0),
        "no tombstones left behind"
    );
}

/// The `eq` a shard passes: does the item at the location have this key?
fn owned_by(owner: &HashMap<Loc, u32>, key: u32) -> impl FnMut(Loc) -> bool + '_ {
    move |l| owner.get(&l) == Some(&key)
}

#[test]
fn random_operations_match_a_model() {
    // Hashes come from a small pool so tags collide often; keys are told apart by `eq`.
    model_run(|key| u64::from(key % 512).wrapping_mul(0xa076_1d64_78bd_642f));
}

#[test]
fn runs_that_wrap_past_the_end_match_a_model() {
    // Half the keys have homes in the last buckets, half in the first: runs wrap round the
    // table's end and meet the runs starting at bucket 0.
    model_run(|key| {
        let spread = u64::from(key % 97) << 20;
        if key % 2 == 0 {
            u64::MAX - spread
        } else {
            spread
        }
    });
}

fn model_run(hash_of: impl Fn(u32) -> u64) {
    let mut ix = Index::new(4096);
    let mut model: HashMap<u32, (u64, Loc)> = HashMap::new();
    let mut owner: HashMap<Loc, u32> = HashMap::new();
    let mut x = 1u64;
    let mut next_loc = 0u32;
    for step in 0..40_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let key = (x % 3000) as u32;
        let hash = hash_of(key);
        let found = ix.find(hash, owned_by(&owner, key));
        assert_eq!(found, model.get(&key).map(|e| e.1), "step {step} key {key}");
        next_loc += 1;
        let loc = Loc::new((next_loc % 60_000) as u16, next_loc % 4096);
        if owner.contains_key(&loc) {
            continue;
        }
        match (x >> 40) % 3 {
            0 | 1 => match found {
                Some(old) => {
                    assert_eq!(ix.replace(hash, owned_by(&owner, key), loc), Some(old));
                    owner.remove(&old);
                    owner.insert(loc, key);
                    model.insert(key, (hash, loc));
                }
                None => {
                    ix.insert_new(hash, loc);
                    owner.insert(loc, key);
                    model.insert(key, (hash, loc));
                }
            },
            _ => {
                if let Some(old) = found {
                    assert!(ix.remove(hash, old));
                    owner.remove(&old);
                    model.remove(&key);
                }
            }
        }
        assert_eq!(ix.len(), model.len());
        if step % 997 == 0 {
            check(&ix);
        }
    }
    check(&ix);
    for (key, (hash, loc)) in &model {
        assert_eq!(ix.find(*hash, |l| owner.get(&l) == Some(key)), Some(*loc));
    }
    ix.clear();
    assert_eq!((ix.len(), ix.iter().count()), (0, 0));
}

/// `guess` is the first word with the hash's tag among the first [`GUESS_PROBES`] buckets
/// from its home, stopping at an empty one and at the table's end: checked against that
/// definition written as plainly as possible, on a table with runs, collisions and wraps.
#[test]
fn a_guess_is_the_first_tag_match_near_the_home() {
    assert_eq!(Index::new(4096).guess(7), None, "an empty table");
    let mut ix = Index::new(4096);
    let hash_of = |key: u32| u64::from(key % 200).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    for key in 0..600u32 {
        ix.insert_new(hash_of(key), Loc::new((key % 60_000) as u16, key));
    }
    let cap = ix.words.len();
    let mut found = 0;
    for key in 0..1000u32 {
        let hash = hash_of(key);
        let tag = ix.tag_of(hash);
        let home = Index::home(tag, cap);
        let mut want = None;
        for i in home..(home + GUESS_PROBES).min(cap) {
            let w = ix.words[i];
            if w == 0 {
                break;
            }
            if ix.word_tag(w) == tag {
                want = Some(ix.decode(w));
                break;
            }
        }
        found += usize::from(want.is_some());
        assert_eq!(ix.guess(hash), want, "key {key}");
    }
    assert!(found > 100, "the test looks at hits too ({found})");
}
