//! Unit tests of the store's public behaviour: reads, writes, CAS, expiry, flush, eviction, backing.

use super::*;

fn store(memory_bytes: usize) -> Store {
    store_with_shards(memory_bytes, 4)
}

fn store_with_shards(memory_bytes: usize, shards: usize) -> Store {
    Store::new(StoreConfig {
        memory_bytes,
        item_size_max: 1 << 20,
        shards,
        huge_pages: false,
        external_threshold: 0,
    })
    .expect("store")
}

fn put(s: &Store, key: &[u8], value: &[u8], exptime: Time, now: Time) -> u64 {
    let meta = NewMeta {
        flags: 0,
        exptime,
        cas: None,
    };
    s.update(key, now, |_| (Write::Put { value, meta }, ()))
        .expect("put")
        .cas
        .expect("cas")
}

fn read(s: &Store, key: &[u8], now: Time) -> Option<Vec<u8>> {
    s.get(
        key,
        now,
        ReadOpts {
            mark_access: true,
            touch: None,
            see_large: false,
        },
        |i| i.map(|i| i.value.to_vec()),
    )
}

#[test]
fn store_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Store>();
}

#[test]
fn set_get_overwrite_delete() {
    let s = store(8 << 20);
    assert_eq!(read(&s, b"a", 1), None);
    put(&s, b"a", b"one", NEVER, 1);
    assert_eq!(read(&s, b"a", 1).as_deref(), Some(&b"one"[..]));
    put(&s, b"a", b"two!", NEVER, 1);
    assert_eq!(read(&s, b"a", 1).as_deref(), Some(&b"two!"[..]));
    let flags = s.get(b"a", 1, ReadOpts::default(), |i| {
        i.map(|i| (i.flags, i.key.to_vec()))
    });
    assert_eq!(flags, Some((0, b"a".to_vec())));
    let meta = NewMeta {
        flags: 77,
        exptime: NEVER,
        cas: None,
    };
    s.update(b"f", 1, |_| (Write::Put { value: b"x", meta }, ()))
        .expect("put");
    assert_eq!(
        s.get(b"f", 1, ReadOpts::default(), |i| i.map(|i| i.flags)),
        Some(77)
    );
    let r = s
        .update(b"a", 2, |i| (Write::Delete, i.is_some()))
        .expect("delete");
    assert_eq!(
        r,
        Updated {
            result: true,
            cas: None
        }
    );
    assert_eq!(read(&s, b"a", 2), None);
    let st = s.stats();
    assert_eq!(st.curr_items, 1);
    assert_eq!(st.total_items, 3);
    assert_eq!(st.bytes, item::item_len(1, 1, 77) as u64);
}

#[test]
fn cas_uniques_are_fresh_and_meta_keeps_them() {
    let s = store(8 << 20);
    let mut seen = std::collections::HashSet::new();
    for i in 0..1000u32 {
        assert!(seen.insert(put(&s, &i.to_le_bytes(), b"v", NEVER, 1)));
    }
    let c = put(&s, b"k", b"v", NEVER, 1);
    let meta_only = Write::Meta {
        exptime: 50,
        stale: true,
        win_token_sent: true,
        new_cas: false,
    };
    assert_eq!(
        s.update(b"k", 1, |_| (meta_only, ())).expect("meta").cas,
        Some(c)
    );
    let seen_item = s.get(b"k", 1, ReadOpts::default(), |i| {
        i.map(|i| (i.cas, i.exptime, i.stale, i.win_token_sent))
    });
    assert_eq!(seen_item, Some((c, 50, true, true)));
    let bump = Write::Meta {
        exptime: 50,
        stale: false,
        win_token_sent: false,
        new_cas: true,
    };
    let c2 = s
        .update(b"k", 1, |_| (bump, ()))
        .expect("meta")
        .cas
        .expect("cas");
    assert!(c2 > c && seen.insert(c2));
    let explicit = NewMeta {
        flags: 0,
        exptime: NEVER,
        cas: Some(5),
    };
    let c3 = s
        .update(b"e", 1, |_| {
            (
                Write::Put {
                    value: b"v",
                    meta: explicit,
                },
                (),
            )
        })
        .expect("put")
        .cas;
    assert_eq!(c3, Some(5));
    assert!(
        put(&s, b"z", b"v", NEVER, 1) > c2,
        "explicit CAS does not reset the counter"
    );
}

#[test]
fn read_marks_and_touch() {
    let s = store(8 << 20);
    put(&s, b"k", b"v", NEVER, 3);
    let first = s.get(
        b"k",
        7,
        ReadOpts {
            mark_access: true,
            touch: Some(100),
            see_large: false,
        },
        |i| i.map(|i| (i.fetched, i.last_access, i.exptime)),
    );
    assert_eq!(
        first,
        Some((false, 3, 100)),
        "fetched/last_access as before this read, new exptime"
    );
    let second = s.get(b"k", 9, ReadOpts::default(), |i| {
        i.map(|i| (i.fetched, i.last_access))
    });
    assert_eq!(second, Some((true, 7)));
    assert_eq!(read(&s, b"k", 100), None, "touched expiry applies");
}

/// What a client sees of `key`: value, exptime, CAS, last access, fetched, stale, win.
type Seen = (Vec<u8>, Time, u64, Time, bool, bool, bool);

fn seen(s: &Store, key: &[u8], now: Time) -> Option<Seen> {
    s.get(key, now, ReadOpts::default(), |i| {
        i.map(|i| {
            let v = i.value.to_vec();
            (
                v,
                i.exptime,
                i.cas,
                i.last_access,
                i.fetched,
                i.stale,
                i.win_token_sent,
            )
        })
    })
}

#[test]
fn an_item_without_exptime_gains_one_by_being_written_anew_and_keeps_the_rest() {
    // The header has no exptime field for an item stored without one (item.rs): a touch,
    // `mg T` or a meta change that gives it one writes it anew, 5 bytes longer.
    let s = store(8 << 20);
    let cas = put(&s, b"k", b"value", NEVER, 3);
    let plain = s.stats().bytes;
    assert_eq!(plain, 11 + 1 + 5, "11-byte header");
    let touch = |t: Time| ReadOpts {
        mark_access: true,
        touch: Some(t),
        see_large: false,
    };
    let shown = s.get(b"k", 40, touch(500), |i| {
        i.map(|i| (i.key.to_vec(), i.value.to_vec(), i.exptime, i.last_access))
    });
    assert_eq!(
        shown,
        Some((b"k".to_vec(), b"value".to_vec(), 500, 3)),
        "the copy's key and value; the last access before this read"
    );
    assert_eq!(
        seen(&s, b"k", 41),
        Some((b"value".to_vec(), 500, cas, 40, true, false, false)),
        "same value and CAS; the touch's read is its last access"
    );
    assert_eq!(
        s.stats().bytes,
        plain + 5,
        "the second bits byte and the exptime"
    );
    assert_eq!(
        s.stats().curr_items,
        1,
        "the old copy is garbage, not an item"
    );
    // With the field, later touches are in place; back to never keeps the field.
    s.get(b"k", 50, touch(NEVER), |_| ());
    s.get(b"k", 60, touch(900), |_| ());
    assert_eq!(s.stats().bytes, plain + 5);
    assert_eq!(seen(&s, b"k", 61).map(|v| (v.1, v.3)), Some((900, 60)));
    // A meta change (md I T30) on another item without exptime: stale mark, new CAS.
    let c2 = put(&s, b"m", b"mv", NEVER, 70);
    s.get(
        b"m",
        75,
        ReadOpts {
            mark_access: true,
            ..ReadOpts::default()
        },
        |_| (),
    );
    let meta = Write::Meta {
        exptime: 130,
        stale: true,
        win_token_sent: true,
        new_cas: true,
    };
    let c3 = s.update(b"m", 80, |_| (meta, ())).expect("meta").cas;
    assert!(c3 > Some(c2));
    assert_eq!(
        seen(&s, b"m", 81),
        Some((b"mv".to_vec(), 130, c3.expect("cas"), 75, true, true, true))
    );
    assert_eq!(read(&s, b"m", 130), None, "the exptime it gained applies");
}

#[test]
fn a_cas_unique_over_40_bits_on_a_narrow_item_writes_it_anew() {
    let s = store(8 << 20);
    let cas = put(&s, b"k", b"v", NEVER, 1);
    let big = (1u64 << 40) + 7;
    let meta = Write::MetaWithCas {
        exptime: NEVER,
        stale: false,
        win_token_sent: false,
        cas: big,
    };
    assert_eq!(
        s.update(b"k", 2, |_| (meta, ())).expect("meta").cas,
        Some(big)
    );
    assert_ne!(cas, big);
    assert_eq!(
        seen(&s, b"k", 3),
        Some((b"v".to_vec(), NEVER, big, 1, false, false, false))
    );
    assert_eq!(
        s.stats().bytes,
        11 + 4 + 1 + 1,
        "the second bits byte and 3 CAS bytes"
    );
    // Explicit wide CAS on a new item (meta E) and back to a small one, in place.
    let explicit = NewMeta {
        flags: 0,
        exptime: NEVER,
        cas: Some(u64::MAX),
    };
    let put_wide = Write::Put {
        value: b"w",
        meta: explicit,
    };
    s.update(b"w", 4, |_| (put_wide, ())).expect("put");
    assert_eq!(seen(&s, b"w", 5).map(|v| v.2), Some(u64::MAX));
    let small = Write::MetaWithCas {
        exptime: NEVER,
        stale: false,
        win_token_sent: false,
        cas: 9,
    };
    s.update(b"w", 6, |_| (small, ())).expect("meta");
    assert_eq!(seen(&s, b"w", 7).map(|v| v.2), Some(9));
}

#[test]
fn last_access_survives_the_second_chance_copy() {
    // A read item is kept by the second chance (copied within its segment) with its last
    // access; the index still finds it and `l`/`la=` read the same.
    let s = store(8 << 20);
    put(&s, b"hot", b"h", NEVER, 1);
    s.get(
        b"hot",
        5,
        ReadOpts {
            mark_access: true,
            ..ReadOpts::default()
        },
        |_| (),
    );
    let value = [b'x'; 1000];
    let mut i = 0u32;
    while s.stats().evictions == 0 {
        // Up to the first eviction: the oldest segment, with "hot" in it, was compacted.
        put(&s, format!("fill{i}").as_bytes(), &value, NEVER, 10);
        i += 1;
    }
    assert_eq!(seen(&s, b"hot", 20).map(|v| (v.3, v.4)), Some((5, true)));
}

#[test]
fn append_prepend_number_and_limits() {
    let s = store(8 << 20);
    let meta = NewMeta::default();
    let r = s
        .update(b"n", 1, |_| (Write::Append { suffix: b"x", meta }, ()))
        .expect("append");
    assert_eq!(r.cas, None, "append never creates an item");
    assert_eq!(read(&s, b"n", 1), None);
    put(&s, b"n", b"mid", NEVER, 1);
    s.update(b"n", 1, |_| {
        (
            Write::Append {
                suffix: b">>",
                meta,
            },
            (),
        )
    })
    .expect("append");
    s.update(b"n", 1, |_| {
        (
            Write::Prepend {
                prefix: b"<<",
                meta,
            },
            (),
        )
    })
    .expect("prepend");
    assert_eq!(read(&s, b"n", 1).as_deref(), Some(&b"<<mid>>"[..]));
    s.update(b"c", 1, |_| {
        (
            Write::PutNumber {
                value: u64::MAX,
                meta,
            },
            (),
        )
    })
    .expect("number");
    assert_eq!(
        read(&s, b"c", 1).as_deref(),
        Some(&b"18446744073709551615"[..])
    );
    s.update(b"c", 1, |_| (Write::PutNumber { value: 0, meta }, ()))
        .expect("number");
    assert_eq!(read(&s, b"c", 1).as_deref(), Some(&b"0"[..]));
    let big = vec![7u8; (1 << 20) + 1];
    let e = s.update(b"big", 1, |_| (Write::Put { value: &big, meta }, ()));
    assert_eq!(e, Err(StoreError::TooLarge));
    let max = vec![7u8; 1 << 20];
    put(&s, b"big", &max, NEVER, 1);
    let e = s.update(b"big", 1, |_| (Write::Append { suffix: b"1", meta }, ()));
    assert_eq!(e, Err(StoreError::TooLarge));
    assert_eq!(
        read(&s, b"big", 1).map(|v| v.len()),
        Some(1 << 20),
        "failed append leaves the item"
    );
    let long_key = vec![b'k'; KEY_LEN_MAX + 1];
    assert_eq!(
        s.update(&long_key, 1, |_| (Write::Put { value: b"v", meta }, ())),
        Err(StoreError::TooLarge)
    );
}

/// memcached's t/issue_14.t at store level (issue 35): 10 items of 65 KiB with a 2 s TTL,
/// 10 more after they expired: the expired items' room is reused, no segment is added, and
/// an item touched before it expired stays with its value.
#[test]
fn expired_items_room_is_reused_before_a_fresh_segment_is_taken() {
    let s = store_with_shards(64 << 20, 1);
    let value = vec![b'B'; 66_560];
    let key = |i: u32| format!("key{i}").into_bytes();
    for i in 0..10 {
        put(&s, &key(i), &value, 3, 1);
    }
    let touch = ReadOpts {
        touch: Some(NEVER),
        ..ReadOpts::default()
    };
    assert!(s.get(&key(9), 2, touch, |i| i.is_some()), "key9 touched");
    let first = s.stats();
    for i in 10..20 {
        put(&s, &key(i), &value, 7, 5);
    }
    let second = s.stats();
    assert_eq!(
        second.segment_bytes, first.segment_bytes,
        "a fresh segment was taken while expired items held the room"
    );
    assert_eq!(second.reclaimed, 9, "the nine expired items were reclaimed");
    assert_eq!(second.curr_items, 11);
    for i in 9..20 {
        assert_eq!(read(&s, &key(i), 5), Some(value.clone()), "key{i}");
    }
    assert_eq!(read(&s, &key(0), 5), None);
}

#[test]
fn expiry_is_lazy_and_reaped_in_background() {
    let s = store(8 << 20);
    for i in 0..100u32 {
        put(
            &s,
            &i.to_le_bytes(),
            b"value",
            if i % 2 == 0 { 10 } else { NEVER },
            1,
        );
    }
    assert_eq!(
        read(&s, &0u32.to_le_bytes(), 9).as_deref(),
        Some(&b"value"[..])
    );
    assert_eq!(s.reclaim_expired(9, 1000), 0);
    let mut got = 0;
    for _ in 0..10 {
        got += s.reclaim_expired(10, 7);
    }
    assert_eq!(got, 50);
    let st = s.stats();
    assert_eq!(st.reclaimed, 50);
    assert_eq!(st.expired_unfetched, 49, "item 0 was read");
    assert_eq!(st.curr_items, 50);
    assert_eq!(read(&s, &0u32.to_le_bytes(), 10), None);
    assert_eq!(
        read(&s, &1u32.to_le_bytes(), 10).as_deref(),
        Some(&b"value"[..])
    );
}

/// A blind `set` leaves the store, its reads and its counters as the read-decide-write
/// put does: over nothing, over a live item, over an expired one, over a flushed one.
#[test]
fn a_blind_set_is_an_update_that_puts() {
    let meta = |exptime| NewMeta {
        flags: 3,
        exptime,
        cas: None,
    };
    let run = |blind: bool| {
        let s = store(8 << 20);
        let write = |key: &[u8], value: &[u8], exptime: Time, now: Time| {
            if blind {
                s.set(key, now, value, meta(exptime)).expect("set")
            } else {
                let value = Write::Put {
                    value,
                    meta: meta(exptime),
                };
                s.update(key, now, |_| (value, ()))
                    .expect("put")
                    .cas
                    .expect("cas")
            }
        };
        let mut cas = vec![write(b"fresh", b"1", NEVER, 5)];
        cas.push(write(b"live", b"2", NEVER, 5));
        cas.push(write(b"live", b"22", NEVER, 6));
        cas.push(write(b"expiring", b"3", 7, 5));
        cas.push(write(b"expiring", b"33", NEVER, 8));
        s.flush_all(8, 8);
        cas.push(write(b"fresh", b"11", NEVER, 9));
        let reads: Vec<_> = [&b"fresh"[..], b"live", b"expiring"]
            .iter()
            .map(|k| read(&s, k, 9))
            .collect();
        let st = s.stats();
        (
            cas,
            reads,
            st.curr_items,
            st.reclaimed,
            st.get_expired,
            st.get_flushed,
            st.total_items,
        )
    };
    let (blind, update) = (run(true), run(false));
    assert_eq!(blind, update);
    assert_eq!(blind.3, 1, "the expired copy counted as reclaimed");
    assert_eq!(
        blind.5, 3,
        "each flushed key counted once: one set, two reads"
    );
}

/// A load from the data device that replaces an expired copy is no client's look-up: it
/// counts nothing (the blind set's accounting is for client writes only).
#[test]
fn a_load_over_an_expired_copy_counts_no_look_up() {
    let s = store(8 << 20);
    put(&s, b"k", b"old", 7, 5);
    let item = Fetched {
        value: b"new".to_vec(),
        flags: 0,
        exptime: NEVER,
        cas: 99,
        large: false,
    };
    s.load(b"k", &item, 8).expect("load");
    let st = s.stats();
    assert_eq!((st.get_expired, st.reclaimed, st.get_flushed), (0, 0, 0));
    assert_eq!(read(&s, b"k", 8).as_deref(), Some(&b"new"[..]));
}

#[test]
fn flush_all_now_and_delayed() {
    let s = store(8 << 20);
    put(&s, b"a", b"1", NEVER, 10);
    s.flush_all(10, 10);
    assert_eq!(read(&s, b"a", 10), None);
    assert_eq!(s.stats().curr_items, 0);
    put(&s, b"b", b"2", NEVER, 10);
    assert_eq!(
        read(&s, b"b", 10).as_deref(),
        Some(&b"2"[..]),
        "a set right after flush_all survives"
    );

    s.flush_all(11, 20);
    put(&s, b"c", b"3", NEVER, 15);
    assert_eq!(read(&s, b"b", 19).as_deref(), Some(&b"2"[..]));
    assert_eq!(read(&s, b"c", 19).as_deref(), Some(&b"3"[..]));
    assert_eq!(read(&s, b"b", 20), None);
    assert_eq!(read(&s, b"c", 20), None);
    put(&s, b"d", b"4", NEVER, 20);
    assert_eq!(read(&s, b"d", 21).as_deref(), Some(&b"4"[..]));

    // A pending delayed flush is replaced by a later one.
    s.flush_all(30, 40);
    s.flush_all(31, 50);
    assert_eq!(read(&s, b"d", 45).as_deref(), Some(&b"4"[..]));
    assert_eq!(read(&s, b"d", 50), None);
}

#[test]
fn eviction_counts_and_stays_in_budget() {
    let s = Store::new(StoreConfig {
        memory_bytes: 4 << 20,
        item_size_max: 1 << 20,
        shards: 8,
        huge_pages: false,
        external_threshold: 0,
    })
    .expect("store");
    assert_eq!(s.shard_count(), 1);
    let value = vec![1u8; 10_000];
    for i in 0..2000u32 {
        put(&s, format!("k{i}").as_bytes(), &value, NEVER, 1);
        let st = s.stats();
        assert!(st.segment_bytes + st.index_bytes <= st.limit_maxbytes);
    }
    let st = s.stats();
    assert!(st.evictions > 1000, "{st:?}");
    assert_eq!(st.evicted_unfetched, st.evictions);
    assert_eq!(st.curr_items + st.evictions, 2000);
    assert_eq!(
        read(&s, b"k1999", 1).as_deref(),
        Some(&value[..]),
        "the newest item is kept"
    );
    assert_eq!(read(&s, b"k0", 1), None, "the oldest is gone");
}

#[test]
fn accessed_items_survive_eviction() {
    let s = Store::new(StoreConfig {
        memory_bytes: 8 << 20,
        item_size_max: 1 << 20,
        shards: 1,
        huge_pages: false,
        external_threshold: 0,
    })
    .expect("store");
    let value = vec![1u8; 1000];
    for i in 0..100u32 {
        put(&s, format!("hot{i}").as_bytes(), &value, NEVER, 1);
    }
    for round in 0..30u32 {
        for i in 0..100u32 {
            assert!(
                read(&s, format!("hot{i}").as_bytes(), 1).is_some(),
                "hot{i} lost in round {round}"
            );
        }
        for i in 0..1000u32 {
            put(&s, format!("cold{round}-{i}").as_bytes(), &value, NEVER, 1);
        }
    }
    assert!(s.stats().evictions > 20_000);
}

#[test]
fn overwrites_and_deletes_do_not_waste_the_budget() {
    let s = store(8 << 20);
    let value = vec![3u8; 5000];
    for round in 0..200u32 {
        for i in 0..10u32 {
            put(&s, format!("k{i}").as_bytes(), &value, NEVER, round);
        }
        s.update(b"k3", round, |_| (Write::Delete, ()))
            .expect("delete");
    }
    let st = s.stats();
    assert_eq!(st.evictions, 0, "{st:?}");
    assert_eq!(st.curr_items, 9);
    assert!(st.segment_bytes <= 4 * s.segment_size() as u64, "{st:?}");
}

#[test]
fn huge_page_fallback_is_reported() {
    let s = Store::new(StoreConfig {
        memory_bytes: 8 << 20,
        item_size_max: 1 << 20,
        shards: 1,
        huge_pages: true,
        external_threshold: 0,
    })
    .expect("store");
    let st = s.stats();
    match s.backing() {
        Backing::HugeTlb => assert_eq!(st.hugepage_bytes, st.arena_bytes),
        Backing::TransparentHuge | Backing::Normal => assert!(st.hugepage_bytes < st.arena_bytes),
    }
    put(&s, b"k", b"v", NEVER, 1);
    assert_eq!(read(&s, b"k", 1).as_deref(), Some(&b"v"[..]));
    let plain = store(8 << 20);
    assert_eq!(plain.backing(), Backing::Normal);
    assert_eq!(plain.stats().hugepage_bytes, 0);
}

#[test]
fn rejects_bad_configs() {
    let bad = |memory_bytes, item_size_max, shards| {
        Store::new(StoreConfig {
            memory_bytes,
            item_size_max,
            shards,
            huge_pages: false,
            external_threshold: 0,
        })
        .is_err()
    };
    assert!(bad(1 << 20, 1 << 20, 1), "too small for two segments");
    assert!(bad(64 << 20, 0, 1));
    assert!(bad(64 << 20, 1 << 20, 3));
    assert!(!bad(4 << 20, 1 << 20, 16));
    // 2^47 bytes in one shard needs 2^33-byte segments: past the index's 32-bit offsets,
    // refused before anything is mapped.
    let err = Store::new(StoreConfig {
        memory_bytes: 1 << 47,
        item_size_max: 1 << 20,
        shards: 1,
        huge_pages: false,
        external_threshold: 0,
    })
    .expect_err("segments too large to address");
    assert!(
        matches!(&err, StoreError::Config(m) if m.contains("index can address")),
        "{err}"
    );
}

#[test]
fn concurrent_writers_and_readers() {
    let s = std::sync::Arc::new(store(32 << 20));
    let threads: Vec<_> = (0..4u32)
        .map(|t| {
            let s = s.clone();
            std::thread::spawn(move || {
                for i in 0..5000u32 {
                    let key = format!("t{t}-{}", i % 500);
                    let value = format!("{t}:{i}");
                    put(&s, key.as_bytes(), value.as_bytes(), NEVER, 1);
                    assert_eq!(read(&s, key.as_bytes(), 1), Some(value.into_bytes()));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("thread");
    }
    assert_eq!(s.stats().curr_items, 2000);
}

#[test]
fn overwrite_heavy_working_set_that_fits_is_kept() {
    let s = Store::new(StoreConfig {
        memory_bytes: 8 << 20,
        item_size_max: 1 << 20,
        shards: 1,
        huge_pages: false,
        external_threshold: 0,
    })
    .expect("store");
    let value = vec![5u8; 1000];
    let mut x = 12345u64;
    for _ in 0..100_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        put(&s, format!("w{}", x % 3000).as_bytes(), &value, NEVER, 1);
    }
    let st = s.stats();
    assert!(st.evictions < 1000, "{st:?}");
}

#[test]
fn an_index_full_of_tiny_items_stays_in_budget_and_finds_what_it_keeps() {
    // 1-byte values: the index is a large share of each item, it grows while segments are
    // evicted to pay for it, and the budget holds at every step.
    let s = store_with_shards(8 << 20, 1);
    let n = 600_000u32;
    let mut grew = 0;
    let mut last_index = 0;
    for i in 0..n {
        put(&s, format!("{i:x}").as_bytes(), b"v", NEVER, 1);
        if i % 1024 == 0 {
            let st = s.stats();
            assert!(
                st.segment_bytes + st.index_bytes <= st.limit_maxbytes,
                "{st:?}"
            );
            grew += usize::from(st.index_bytes > last_index);
            last_index = st.index_bytes;
        }
    }
    let st = s.stats();
    assert!(st.evictions > 100_000, "{st:?}");
    assert!(grew > 5, "the index grew in steps: {grew}");
    // Growth evicts a segment to pay for it, which here costs more items than the larger
    // table can add (docs/BENCHMARKS.md, issue 14): the table is still at least half full.
    assert!(
        st.index_bytes <= st.curr_items * 8 * 2,
        "at least half full: {st:?}"
    );
    // Every item the store counts is found under its key, newest first.
    let mut found = 0u64;
    for i in (0..n).rev() {
        if read(&s, format!("{i:x}").as_bytes(), 1).is_some() {
            found += 1;
        }
    }
    assert_eq!(found, st.curr_items);
    assert!(read(&s, format!("{:x}", n - 1).as_bytes(), 1).is_some());
}

#[test]
fn set_and_delete_churn_leaves_no_tombstones_to_grow_the_index() {
    let s = store(8 << 20);
    for i in 0..200_000u32 {
        let key = format!("churn{i}");
        put(&s, key.as_bytes(), b"x", NEVER, 1);
        if i % 2 == 0 {
            s.update(key.as_bytes(), 1, |_| (Write::Delete, ()))
                .expect("delete");
        } else {
            // Expired on the next look-up, dropped there.
            s.update(key.as_bytes(), 1, |_| {
                (
                    Write::Meta {
                        exptime: 2,
                        stale: false,
                        win_token_sent: false,
                        new_cas: false,
                    },
                    (),
                )
            })
            .expect("touch");
            assert_eq!(read(&s, key.as_bytes(), 2), None);
        }
    }
    let st = s.stats();
    assert_eq!(st.curr_items, 0, "{st:?}");
    assert!(
        st.index_bytes <= (4 * 64 * 8) as u64,
        "never more than one live key per shard, so the first table suffices: {st:?}"
    );
}

/// One told eviction: key, fetched, ttl, idle, size.
type EvictedRow = (Vec<u8>, bool, Option<u32>, u32, usize);

/// Records evictions while `on`.
#[derive(Default)]
struct EvictionRecorder {
    on: AtomicBool,
    seen: Mutex<Vec<EvictedRow>>,
}

impl EvictionLog for EvictionRecorder {
    fn wanted(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }
    fn evicted(&self, e: &Evicted<'_>) {
        let row = (e.key.to_vec(), e.fetched, e.ttl, e.idle, e.size);
        self.seen.lock().expect("lock").push(row);
    }
}

#[test]
fn every_eviction_is_told_while_wanted_and_none_otherwise() {
    let s = store_with_shards(4 << 20, 1);
    let log = Arc::new(EvictionRecorder::default());
    s.attach_eviction_log(log.clone());
    let value = vec![1u8; 10_000];
    for i in 0..600u32 {
        put(&s, format!("k{i}").as_bytes(), &value, NEVER, 1);
    }
    assert!(s.stats().evictions > 0);
    assert!(log.seen.lock().expect("lock").is_empty(), "nobody asked");
    log.on.store(true, Ordering::Relaxed);
    let before = s.stats().evictions;
    for i in 600..1200u32 {
        let exptime = if i % 2 == 0 { 100 } else { NEVER };
        put(&s, format!("k{i}").as_bytes(), &value, exptime, 5);
    }
    let seen = log.seen.lock().expect("lock");
    assert_eq!(seen.len() as u64, s.stats().evictions - before);
    assert!(seen
        .iter()
        .all(|(k, fetched, _, _, size)| k.starts_with(b"k") && !fetched && *size == 10_000));
    assert!(seen.iter().any(|r| r.2 == Some(95)), "ttl is what was left");
    assert!(
        seen.iter().any(|r| r.2.is_none() && r.3 == 4),
        "never-expiring, idle 4 s"
    );
}

/// A budget under 64 segments gets one shard whatever the server asks for, so a fill keeps
/// the same count in every store (each has its own random hash seed). With several shards
/// the count moved by whole segments with the seed (each shard's active segment is refilled
/// from empty, and how full each is at the end depends on the split).
#[test]
fn a_small_budget_keeps_the_same_count_whatever_the_hash_seed() {
    let value = [b'v'; 100];
    let kept: Vec<(usize, u64, u64)> = (0..3)
        .map(|_| {
            let s = store_with_shards(32 << 20, 64);
            for i in 0..400_000u32 {
                put(&s, format!("key:{i:09}").as_bytes(), &value, NEVER, 1);
            }
            let st = s.stats();
            assert!(
                st.segment_bytes + st.index_bytes <= st.limit_maxbytes,
                "{st:?}"
            );
            assert!(st.evictions > 0, "the fill must evict: {st:?}");
            (s.shard_count(), st.curr_items, st.unwritten_bytes)
        })
        .collect();
    assert_eq!(kept[0].0, 1, "{kept:?}");
    assert!(kept.iter().all(|k| *k == kept[0]), "{kept:?}");
}

#[test]
fn a_prefetch_changes_nothing_it_reads_or_marks() {
    let s = store(64 << 20);
    // An empty store (no index words yet) and keys it never held.
    s.prefetch(&[b"absent", b"", &[0xff; 250]]);
    let keys: Vec<Vec<u8>> = (0..200).map(|i| format!("k{i}").into_bytes()).collect();
    for (i, k) in keys.iter().enumerate() {
        put(&s, k, format!("v{i}").as_bytes(), 0, 1);
    }
    let refs: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
    let before = s.stats();
    // More keys than PREFETCH_MAX: the rest are ignored, not an error.
    s.prefetch(&refs);
    s.prefetch(&refs[..2]);
    assert_eq!(s.stats(), before);
    assert_eq!(before.curr_items, 200);
    for (i, k) in keys.iter().enumerate() {
        assert_eq!(read(&s, k, 2), Some(format!("v{i}").into_bytes()));
    }
}

#[test]
fn cas_uniques_are_distinct_across_shards_and_above_the_floor() {
    // Each shard counts its own CAS uniques (no counter every worker writes): they must
    // still never repeat across shards, and stay above a floor recovery raises.
    let s = store_with_shards(512 << 20, 16);
    assert!(s.shard_count() > 1, "{} shards", s.shard_count());
    let mut seen = std::collections::HashSet::new();
    for round in 0..3u32 {
        for k in 0..500u32 {
            let cas = put(&s, format!("k{k}").as_bytes(), b"v", 0, 1);
            assert!(
                seen.insert(cas),
                "CAS {cas} handed out twice (round {round})"
            );
        }
    }
    let floor = seen.iter().max().copied().unwrap_or(0) + 1000;
    s.raise_cas_floor(floor);
    for k in 0..500u32 {
        let cas = put(&s, format!("k{k}").as_bytes(), b"w", 0, 1);
        assert!(cas > floor, "{cas} not above the floor {floor}");
        assert!(seen.insert(cas), "CAS {cas} handed out twice");
    }
}
