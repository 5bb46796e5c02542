//! Tests of reservations: a reserved item is invisible until committed, replaces the old
//! one whole, survives an eviction or flush_all meanwhile (as a copy), and an abandoned one
//! gives its segment back; the budget and the pin accounting end where they began.

use super::*;

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

fn put(s: &Store, key: &[u8], value: &[u8], now: Time) {
    let meta = NewMeta::default();
    s.update(key, now, |_| (Write::Put { value, meta }, ()))
        .expect("put");
}

fn read(s: &Store, key: &[u8], now: Time) -> Option<(Vec<u8>, u32, u64)> {
    s.get(key, now, ReadOpts::default(), |it| {
        it.map(|it| (it.value.to_vec(), it.flags, it.cas))
    })
}

fn value(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

/// Fills the reservation in pieces of `step` bytes, as receives would.
fn fill(s: &Store, r: &Reservation, v: &[u8], step: usize) {
    for (i, piece) in v.chunks(step).enumerate() {
        assert!(s.fill(r, i * step, piece));
    }
}

#[test]
fn a_reserved_value_is_invisible_until_its_commit_and_then_replaces_the_old_whole() {
    let s = store(8 << 20);
    put(&s, b"k", b"old", 1);
    let v = value(7, 5000);
    let meta = NewMeta {
        flags: 9,
        ..NewMeta::default()
    };
    let r = s.reserve(b"k", v.len(), meta, 1).expect("reserved");
    assert_eq!(r.len(), 5000);
    fill(&s, &r, &v, 777);
    assert_eq!(read(&s, b"k", 1).map(|x| x.0), Some(b"old".to_vec()));
    let before = s.stats();
    let done = s
        .commit(r, b"k", 2, |old| (true, old.is_some()))
        .expect("commit");
    assert!(done.result, "the commit saw the old item");
    let (got, flags, cas) = read(&s, b"k", 2).expect("stored");
    assert_eq!((got, flags, Some(cas)), (v, 9, done.cas));
    let after = s.stats();
    assert_eq!(after.curr_items, before.curr_items, "replaced, not added");
    assert_eq!(after.pinned_segments, 0, "the reservation's pin went back");
}

#[test]
fn a_commit_that_decides_not_to_store_leaves_the_old_item() {
    let s = store(8 << 20);
    put(&s, b"k", b"old", 1);
    let r = s
        .reserve(b"k", 4096, NewMeta::default(), 1)
        .expect("reserved");
    let done = s
        .commit(r, b"k", 1, |old| (old.is_none(), ()))
        .expect("commit");
    assert_eq!(done.cas, None);
    assert_eq!(read(&s, b"k", 1).map(|x| x.0), Some(b"old".to_vec()));
    assert_eq!(s.stats().pinned_segments, 0);
}

#[test]
fn an_abandoned_reservation_leaves_nothing_and_its_memory_is_reused() {
    let s = store(4 << 20);
    let before = s.stats();
    for i in 0..200u32 {
        let r = s
            .reserve(b"gone", 100 << 10, NewMeta::default(), 1)
            .expect("reserved");
        s.fill(&r, 0, &value(i as u8, 100 << 10));
        s.abandon(r);
    }
    assert_eq!(read(&s, b"gone", 1), None);
    let after = s.stats();
    assert_eq!(after.pinned_segments, 0);
    assert_eq!(after.curr_items, before.curr_items);
    assert!(after.segment_bytes + after.index_bytes <= after.limit_maxbytes);
    put(&s, b"k", &value(1, 100 << 10), 1);
    assert!(read(&s, b"k", 1).is_some(), "the garbage was reclaimed");
}

#[test]
fn a_value_whose_segment_was_flushed_or_evicted_meanwhile_is_stored_as_a_copy() {
    let s = store(4 << 20);
    let v = value(3, 100 << 10);
    let r = s
        .reserve(b"k", v.len(), NewMeta::default(), 1)
        .expect("reserved");
    fill(&s, &r, &v, 4096);
    s.flush_all(1, 0);
    for i in 0..100u32 {
        put(&s, format!("churn{i}").as_bytes(), &value(9, 100 << 10), 2);
    }
    let done = s.commit(r, b"k", 2, |_| (true, ())).expect("commit");
    let (got, _, cas) = read(&s, b"k", 2).expect("stored");
    assert_eq!((got, Some(cas)), (v, done.cas));
    let st = s.stats();
    assert_eq!(st.pinned_segments, 0);
    assert!(st.segment_bytes + st.index_bytes <= st.limit_maxbytes);
}

#[test]
fn bytes_filled_after_a_flush_or_eviction_are_the_ones_stored() {
    // A TLS session fills every value byte through `fill`: those after the orphaning must
    // land in the pinned bytes the commit copies, or the stored value is torn.
    let s = store(4 << 20);
    let v = value(5, 100 << 10);
    let r = s
        .reserve(b"k", v.len(), NewMeta::default(), 1)
        .expect("reserved");
    assert!(s.fill(&r, 0, &v[..4096]));
    s.flush_all(1, 0);
    for i in 0..100u32 {
        put(&s, format!("churn{i}").as_bytes(), &value(9, 100 << 10), 2);
    }
    assert!(
        s.fill(&r, 4096, &v[4096..]),
        "an orphan still takes its value"
    );
    let done = s.commit(r, b"k", 2, |_| (true, ())).expect("commit");
    let (got, _, cas) = read(&s, b"k", 2).expect("stored");
    assert!(got == v, "the stored value is the one sent, byte for byte");
    assert_eq!(Some(cas), done.cas);
}

#[test]
fn a_journaled_store_does_not_reserve() {
    let s = store(4 << 20);
    s.require_journal();
    assert!(s.reserve(b"k", 4096, NewMeta::default(), 1).is_none());
}
