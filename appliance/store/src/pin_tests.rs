//! Tests of pins: a pinned value's bytes survive overwrite, delete, eviction and flush_all
//! until unpinned; the segment then goes back to the pool; the cap and the budget hold.

use super::*;
use proptest::prelude::*;

fn store(memory_bytes: usize) -> Store {
    Store::new(StoreConfig {
        memory_bytes,
        item_size_max: 1 << 20,
        shards: 1,
        huge_pages: false,
        external_threshold: 0,
    })
    .expect("store")
}

fn put(s: &Store, key: &[u8], value: &[u8], now: Time) -> Result<(), StoreError> {
    let meta = NewMeta::default();
    s.update(key, now, |_| (Write::Put { value, meta }, ()))
        .map(|_| ())
}

/// Pins `key`'s value (the closure asks for it as a zero-copy GET would).
fn pin(s: &Store, key: &[u8], now: Time) -> Option<Pin> {
    let opts = ReadOpts {
        mark_access: true,
        ..ReadOpts::default()
    };
    let (_, pin) = s
        .journaled(None)
        .try_get_pinned(key, now, opts, 1, |it, req| it.is_some() && req.want())
        .expect("read");
    pin
}

/// What the pin's bytes read now, through the segment that holds them.
fn pinned_now(s: &Store, p: &Pin) -> Vec<u8> {
    s.pinned_copy(p)
}

fn value(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

/// Writes enough other 100 KiB values to evict everything at least twice.
fn churn(s: &Store, rounds: usize, now: Time) {
    let v = value(0xEE, 100 << 10);
    for i in 0..rounds {
        put(s, format!("churn{i}").as_bytes(), &v, now).expect("churn set");
        let st = s.stats();
        assert!(
            st.segment_bytes + st.index_bytes <= st.limit_maxbytes,
            "over budget: {st:?}"
        );
    }
}

#[test]
fn a_pinned_value_survives_overwrite_eviction_and_comes_back_to_the_pool() {
    let s = store(16 << 20);
    let original = value(1, 512 << 10);
    put(&s, b"big", &original, 1).unwrap();
    let p = pin(&s, b"big", 1).expect("pin granted");
    assert_eq!(p.len(), original.len());
    put(&s, b"big", &value(2, 512 << 10), 1).unwrap();
    churn(&s, 400, 1);
    let st = s.stats();
    assert!(st.evictions > 0);
    assert_eq!((st.pinned_segments, st.orphaned_segments), (1, 1), "{st:?}");
    assert!(pinned_now(&s, &p) == original, "pinned bytes changed");
    s.unpin(p);
    let st = s.stats();
    assert_eq!((st.pinned_segments, st.orphaned_segments), (0, 0));
    let in_use = st.segment_bytes;
    churn(&s, 400, 1);
    assert!(
        s.stats().segment_bytes >= in_use,
        "the freed segment is usable again"
    );
}

#[test]
fn delete_and_flush_defer_the_free_until_the_last_unpin() {
    let s = store(16 << 20);
    let original = value(3, 300 << 10);
    put(&s, b"a", &original, 1).unwrap();
    let p1 = pin(&s, b"a", 1).expect("pin");
    let p2 = pin(&s, b"a", 1).expect("second pin, same segment");
    s.update(b"a", 1, |_| (Write::Delete, ())).unwrap();
    let before = s.stats().segment_bytes;
    s.flush_all(1, 1);
    let st = s.stats();
    assert_eq!(st.curr_items, 0);
    assert_eq!(st.orphaned_segments, 1, "{st:?}");
    assert_eq!(
        st.segment_bytes,
        s.segment_size() as u64,
        "the orphan still counts against the budget (was {before})"
    );
    churn(&s, 300, 2);
    assert!(pinned_now(&s, &p1) == original);
    s.unpin(p1);
    assert_eq!(s.stats().orphaned_segments, 1, "one pin still out");
    assert!(pinned_now(&s, &p2) == original);
    s.unpin(p2);
    let st = s.stats();
    assert_eq!((st.pinned_segments, st.orphaned_segments), (0, 0));
}

#[test]
fn the_pin_cap_refuses_and_the_caller_copies() {
    // 16 MiB, ~1 MiB segments: 15 segments, at most one pinned (15 / 8).
    let s = store(16 << 20);
    let seg = s.segment_size();
    let n = (16 << 20) / seg;
    for i in 0..n {
        put(
            &s,
            format!("k{i}").as_bytes(),
            &value(i as u8, seg / 2 + 1),
            1,
        )
        .unwrap();
    }
    let mut pins = Vec::new();
    let mut refused = 0;
    for i in 0..n {
        match pin(&s, format!("k{i}").as_bytes(), 1) {
            Some(p) => pins.push(p),
            None => refused += 1,
        }
    }
    let st = s.stats();
    let cap = (n / 8).max(1) as u64;
    assert_eq!(st.pinned_segments, cap, "{st:?}");
    assert_eq!(st.pins_refused, refused);
    assert!(refused > 0);
    for p in pins {
        s.unpin(p);
    }
    assert_eq!(s.stats().pinned_segments, 0);
}

#[test]
fn a_read_that_does_not_ask_pins_nothing() {
    let s = store(8 << 20);
    put(&s, b"a", b"small", 1).unwrap();
    let (r, p) = s
        .journaled(None)
        .try_get_pinned(b"a", 1, ReadOpts::default(), 0, |it, _| {
            it.map(|i| i.value.to_vec())
        })
        .unwrap();
    assert_eq!(r.as_deref(), Some(&b"small"[..]));
    assert!(p.is_none());
    assert_eq!(s.stats().pins_granted, 0);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    /// Any interleaving of sets, deletes, flushes, pins and unpins: every pinned value reads
    /// intact until released, the budget holds, and with no pin out no orphan remains.
    #[test]
    fn pins_survive_any_interleaving(ops in proptest::collection::vec((0u8..6, 0u8..8, 1usize..400), 1..120)) {
        let s = store(8 << 20);
        let mut pins: Vec<(Pin, Vec<u8>)> = Vec::new();
        for (i, (op, key, kib)) in ops.into_iter().enumerate() {
            let k = [b'k', key];
            match op {
                0 | 1 => {
                    let _ = put(&s, &k, &value(i as u8, kib << 10), 1);
                }
                2 => {
                    let want = s.get(&k, 1, ReadOpts::default(), |it| it.map(|i| i.value.to_vec()));
                    if let (Some(p), Some(v)) = (pin(&s, &k, 1), want) {
                        pins.push((p, v));
                    }
                }
                3 if !pins.is_empty() => {
                    let (p, v) = pins.swap_remove(i % pins.len());
                    prop_assert!(pinned_now(&s, &p) == v);
                    s.unpin(p);
                }
                4 => {
                    let _ = s.update(&k, 1, |_| (Write::Delete, ()));
                }
                _ => s.flush_all(1, 1),
            }
            let st = s.stats();
            prop_assert!(st.segment_bytes + st.index_bytes <= st.limit_maxbytes);
            for (p, v) in &pins {
                prop_assert!(&pinned_now(&s, p) == v);
            }
        }
        for (p, _) in pins {
            s.unpin(p);
        }
        let st = s.stats();
        prop_assert_eq!((st.pinned_segments, st.orphaned_segments), (0, 0));
    }
}

#[test]
fn a_touch_that_writes_a_pinned_item_anew_leaves_the_pinned_bytes_alone() {
    // The item has no exptime field, so the touch copies it (item.rs); the pinned copy is
    // killed like an overwritten one and keeps its bytes until the unpin.
    let s = store(16 << 20);
    let original = value(3, 200 << 10);
    put(&s, b"t", &original, 1).unwrap();
    let p = pin(&s, b"t", 1).expect("pin granted");
    let touch = ReadOpts {
        mark_access: true,
        touch: Some(500),
        see_large: false,
    };
    let got = s.get(b"t", 2, touch, |i| i.map(|i| (i.value.to_vec(), i.exptime)));
    assert_eq!(got, Some((original.clone(), 500)));
    churn(&s, 400, 2);
    assert!(pinned_now(&s, &p) == original, "pinned bytes changed");
    s.unpin(p);
    assert_eq!(s.stats().pinned_segments, 0);
}
