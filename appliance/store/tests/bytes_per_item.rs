//! Measures memory per item: one million 100-byte values with 11-byte keys, no eviction.
//!
//! Prints bytes per item and per-item overhead beyond key and value, counted two ways:
//! live item bytes plus the index (what memcached's per-item figure compares to), and
//! whole segments in use plus the index (what the budget is charged, unfilled segment
//! tails included). memcached 1.6 spends about 56 bytes of header with CAS, plus slab
//! rounding and its hash table, per item. Here: an 11-byte header and about 10 bytes of
//! index (ADR 0029).

use ringstore_store::{NewMeta, Store, StoreConfig, Write, NEVER};

const ITEMS: usize = 1_000_000;
const VALUE: usize = 100;
const KEY: usize = 11;

#[test]
fn one_million_small_items() {
    let s = Store::new(StoreConfig {
        memory_bytes: 256 << 20,
        item_size_max: 1 << 20,
        shards: 16,
        huge_pages: false,
        external_threshold: 0,
    })
    .expect("store");
    let value = [b'v'; VALUE];
    let meta = NewMeta {
        flags: 0,
        exptime: NEVER,
        cas: None,
    };
    for i in 0..ITEMS {
        let key = format!("key:{i:07}");
        assert_eq!(key.len(), KEY);
        s.update(key.as_bytes(), 1, |_| {
            (
                Write::Put {
                    value: &value,
                    meta,
                },
                (),
            )
        })
        .expect("put");
    }
    let st = s.stats();
    assert_eq!(st.evictions, 0, "{st:?}");
    assert_eq!(st.curr_items, ITEMS as u64);
    let n = ITEMS as f64;
    let live = (st.bytes + st.index_bytes) as f64 / n;
    let charged = (st.segment_bytes + st.index_bytes) as f64 / n;
    let payload = (KEY + VALUE) as f64;
    println!(
        "{ITEMS} items of {VALUE}-byte values, {KEY}-byte keys, {} shards: index {:.1} B/item; \
         live+index {live:.1} B/item (overhead {:.1}); segments+index {charged:.1} B/item (overhead {:.1})",
        s.shard_count(),
        st.index_bytes as f64 / n,
        live - payload,
        charged - payload,
    );
    assert!(
        live - payload <= 31.0,
        "per-item overhead {:.1} over 31 bytes",
        live - payload
    );
    assert!(
        charged - payload <= 36.0,
        "charged overhead {:.1} over 36 bytes",
        charged - payload
    );
}
