//! Unit tests of external values (extstore-like): with a data device, values of at least
//! `external_threshold` bytes keep only key and header in RAM and are read from the device.
use std::collections::HashMap;

use super::*;

/// A fake data device: the journal writes each key's newest state into a map, and the
/// backfill serves from the same map (like the real overlay + index).
/// One journaled `Put`: key, value length, exptime, CAS unique.
type Put = (Vec<u8>, usize, Time, u64);

#[derive(Default)]
struct Device {
    map: Mutex<HashMap<Vec<u8>, Fetched>>,
    /// Every `Put` as (key, value length, exptime, cas), in order.
    puts: Mutex<Vec<Put>>,
    fetches: AtomicU64,
}

impl Journal for Device {
    fn record(&self, m: Mutation<'_>) -> Result<(), StoreError> {
        let mut map = self.map.lock().unwrap();
        match m {
            Mutation::Put {
                key,
                value,
                flags,
                exptime,
                cas,
                large,
            } => {
                self.puts
                    .lock()
                    .unwrap()
                    .push((key.to_vec(), value.len(), exptime, cas));
                map.insert(
                    key.to_vec(),
                    Fetched {
                        value: value.to_vec(),
                        flags,
                        exptime,
                        cas,
                        large,
                    },
                );
            }
            Mutation::Delete { key } => {
                map.remove(key);
            }
            Mutation::FlushAll { .. } => map.clear(),
        }
        Ok(())
    }
}

impl Backfill for Device {
    fn fetch(&self, key: &[u8], now: Time) -> Option<Fetched> {
        self.fetches.fetch_add(1, Ordering::Relaxed);
        let map = self.map.lock().unwrap();
        map.get(key)
            .filter(|f| f.exptime == NEVER || f.exptime > now)
            .cloned()
    }
}

impl Device {
    fn value(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.map.lock().unwrap().get(key).map(|f| f.value.clone())
    }
    fn last_put(&self) -> Put {
        self.puts.lock().unwrap().last().cloned().unwrap()
    }
}

const THRESHOLD: usize = 4096;

fn store_with(memory: usize, threshold: usize) -> (Store, Arc<Device>) {
    let s = Store::new(StoreConfig {
        memory_bytes: memory,
        item_size_max: 1 << 20,
        shards: 4,
        huge_pages: false,
        external_threshold: threshold,
    })
    .unwrap();
    let d = Arc::new(Device::default());
    s.require_journal();
    s.attach_backfill(d.clone());
    (s, d)
}

fn store() -> (Store, Arc<Device>) {
    store_with(64 << 20, THRESHOLD)
}

fn meta(flags: u32, exptime: Time) -> NewMeta {
    NewMeta {
        flags,
        exptime,
        cas: None,
    }
}

fn set(s: &Journaled<'_>, key: &[u8], value: &[u8], m: NewMeta) -> u64 {
    s.update(key, 1, |_| (Write::Put { value, meta: m }, ()))
        .unwrap()
        .cas
        .unwrap()
}

fn value(s: &Journaled<'_>, key: &[u8]) -> Option<Vec<u8>> {
    s.get(key, 1, ReadOpts::default(), |i| i.map(|i| i.value.to_vec()))
}

/// A value of `len` bytes that differs per `seed`, so a mixed-up value is caught.
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn a_big_value_is_journaled_whole_and_only_its_stub_stays_in_ram() {
    let (s, d) = store();
    let s = s.journaled(Some(&*d));
    let big = pattern(64 << 10, 1);
    let cas = set(&s, b"big", &big, meta(7, 100));
    assert_eq!(
        d.value(b"big").as_deref(),
        Some(&big[..]),
        "journaled whole"
    );
    let st = s.store().stats();
    assert_eq!(st.curr_items, 1);
    assert_eq!(
        st.bytes,
        (item::header_len(7, 100, cas, big.len()) + 3) as u64,
        "RAM holds the header (with flags) and the key only"
    );
    let got = s.get(b"big", 1, ReadOpts::default(), |i| {
        i.map(|i| (i.key.to_vec(), i.value.to_vec(), i.flags, i.exptime, i.cas))
    });
    assert_eq!(got, Some((b"big".to_vec(), big.clone(), 7, 100, cas)));
    assert_eq!(s.store().stats().external_reads, 1);
    // The value is still exact after the read (nothing was cached into RAM).
    assert_eq!(value(&s, b"big").as_deref(), Some(&big[..]));
    assert_eq!(s.store().stats().bytes, st.bytes);
    // update() sees the whole value too.
    let seen = s
        .update(b"big", 1, |cur| {
            (Write::Nothing, cur.map(|c| c.value.to_vec()))
        })
        .unwrap()
        .result;
    assert_eq!(seen.as_deref(), Some(&big[..]));
    // Overwriting with a small value brings the value back into RAM.
    set(&s, b"big", b"small", meta(0, 0));
    assert_eq!(s.store().stats().bytes, item::item_len(3, 5, 0) as u64);
    assert_eq!(value(&s, b"big").as_deref(), Some(&b"small"[..]));
}

#[test]
fn below_the_threshold_or_without_a_backfill_values_stay_in_ram() {
    let (s, d) = store();
    let s = s.journaled(Some(&*d));
    let v = pattern(THRESHOLD - 1, 2);
    set(&s, b"k", &v, meta(0, 0));
    assert_eq!(
        s.store().stats().bytes,
        item::item_len(1, v.len(), 0) as u64
    );
    let fetches = d.fetches.load(Ordering::Relaxed);
    assert_eq!(value(&s, b"k"), Some(v));
    assert_eq!(d.fetches.load(Ordering::Relaxed), fetches, "read from RAM");
    assert_eq!(s.store().stats().external_reads, 0);

    // A journal without a backfill could never read a stub back: values stay in RAM.
    let s = Store::new(StoreConfig {
        memory_bytes: 64 << 20,
        item_size_max: 1 << 20,
        shards: 4,
        huge_pages: false,
        external_threshold: THRESHOLD,
    })
    .unwrap();
    s.require_journal();
    let device = Device::default();
    let s = s.journaled(Some(&device));
    let big = pattern(THRESHOLD, 3);
    set(&s, b"k", &big, meta(0, 0));
    assert_eq!(
        s.store().stats().bytes,
        item::item_len(1, big.len(), 0) as u64
    );
    assert_eq!(value(&s, b"k"), Some(big));

    // Threshold 0 is off.
    let (s, d) = store_with(64 << 20, 0);
    let s = s.journaled(Some(&*d));
    let big = pattern(64 << 10, 4);
    set(&s, b"k", &big, meta(0, 0));
    assert_eq!(
        s.store().stats().bytes,
        item::item_len(1, big.len(), 0) as u64
    );
}

#[test]
fn append_prepend_touch_and_meta_journal_the_full_new_state() {
    let (s, d) = store();
    let s = s.journaled(Some(&*d));
    let base = pattern(THRESHOLD, 5);
    let cas = set(&s, b"k", &base, meta(3, 0));
    let grow = |w: Write<'static>| s.update(b"k", 1, move |_| (w, ())).unwrap().cas.unwrap();
    let c2 = grow(Write::Append {
        suffix: b"-tail",
        meta: meta(3, 0),
    });
    assert!(c2 > cas);
    let c3 = grow(Write::Prepend {
        prefix: b"head-",
        meta: meta(3, 0),
    });
    let mut want = b"head-".to_vec();
    want.extend_from_slice(&base);
    want.extend_from_slice(b"-tail");
    assert_eq!(d.value(b"k").as_deref(), Some(&want[..]));
    assert_eq!(d.last_put(), (b"k".to_vec(), want.len(), 0, c3));
    assert_eq!(value(&s, b"k").as_deref(), Some(&want[..]));
    assert_eq!(
        s.store().stats().bytes,
        (item::header_len(3, 0, c3, want.len()) + 1) as u64,
        "still a stub"
    );

    // A touch (gat) keeps the value and journals it whole with the new expiry.
    let touch = ReadOpts {
        mark_access: true,
        touch: Some(500),
        see_large: false,
    };
    let got = s.try_get(b"k", 1, touch, |i| i.map(|i| (i.value.to_vec(), i.exptime)));
    assert_eq!(got, Ok(Some((want.clone(), 500))));
    assert_eq!(d.last_put(), (b"k".to_vec(), want.len(), 500, c3));
    assert_eq!(d.value(b"k").as_deref(), Some(&want[..]));

    // A meta change with a new CAS unique journals the whole value under that CAS.
    let c4 = s
        .update(b"k", 1, |_| {
            (
                Write::Meta {
                    exptime: 600,
                    stale: true,
                    win_token_sent: false,
                    new_cas: true,
                },
                (),
            )
        })
        .unwrap()
        .cas
        .unwrap();
    assert!(c4 > c3);
    assert_eq!(d.last_put(), (b"k".to_vec(), want.len(), 600, c4));
    let got = s.get(b"k", 1, ReadOpts::default(), |i| {
        i.map(|i| (i.value.to_vec(), i.exptime, i.cas, i.stale, i.flags))
    });
    assert_eq!(got, Some((want.clone(), 600, c4, true, 3)));

    // A small value that grows past the threshold through append becomes a stub.
    set(&s, b"s", b"x", meta(0, 0));
    let big = pattern(THRESHOLD, 6);
    s.update(b"s", 1, |_| {
        (
            Write::Append {
                suffix: &big,
                meta: meta(0, 0),
            },
            (),
        )
    })
    .unwrap();
    let mut want_s = b"x".to_vec();
    want_s.extend_from_slice(&big);
    assert_eq!(value(&s, b"s").as_deref(), Some(&want_s[..]));
    assert_eq!(d.value(b"s").as_deref(), Some(&want_s[..]));
    assert_eq!(
        s.store().stats().bytes,
        (item::header_len(3, 600, c4, want.len()) + 1 + item::header_len(0, 0, 1, want_s.len()) + 1)
            as u64,
        "two stubs (one with flags and the exptime it gained)"
    );

    // Delete removes it from both.
    s.update(b"k", 1, |_| (Write::Delete, ())).unwrap();
    assert_eq!(value(&s, b"k"), None);
    assert_eq!(d.value(b"k"), None);
}

#[test]
fn a_stub_the_device_no_longer_backs_reads_as_a_miss_and_is_dropped() {
    let (s, d) = store();
    let s = s.journaled(Some(&*d));
    let big = pattern(THRESHOLD * 2, 7);
    let cas = set(&s, b"k", &big, meta(0, 0));
    // The device has another CAS unique for the key (it must never be mixed up).
    d.map.lock().unwrap().get_mut(b"k".as_slice()).unwrap().cas = cas + 10;
    let seen = s
        .update(b"k", 1, |cur| (Write::Nothing, cur.is_some()))
        .unwrap()
        .result;
    assert!(!seen, "a stub with the wrong CAS is absent");
    let st = s.store().stats();
    assert_eq!((st.curr_items, st.bytes, st.external_lost), (0, 0, 1));
    // RAM is a cache: the next read goes to the device and finds what it has.
    assert_eq!(
        s.get(b"k", 1, ReadOpts::default(), |i| i.map(|i| i.cas)),
        Some(cas + 10)
    );

    let cas = set(&s, b"gone", &big, meta(0, 0));
    assert!(cas > 0);
    d.map.lock().unwrap().remove(b"gone".as_slice());
    assert_eq!(value(&s, b"gone"), None);
    assert_eq!(s.store().stats().external_lost, 2);
    // Without a backfill a stub can never be read: absent too.
    let bare = Store::new(StoreConfig {
        memory_bytes: 64 << 20,
        item_size_max: 1 << 20,
        shards: 4,
        huge_pages: false,
        external_threshold: THRESHOLD,
    })
    .unwrap();
    bare.load(
        b"x",
        &Fetched {
            value: big.clone(),
            flags: 0,
            exptime: 0,
            cas: 1,
            large: false,
        },
        1,
    )
    .unwrap();
    assert_eq!(value(&bare.journaled(None), b"x"), None);
    assert_eq!(bare.stats().curr_items, 0);
}

#[test]
fn load_and_read_through_keep_big_values_as_stubs() {
    let (s, d) = store();
    let s = s.journaled(Some(&*d));
    let big = pattern(100_000, 8);
    let item = Fetched {
        value: big.clone(),
        flags: 9,
        exptime: 0,
        cas: 42,
        large: false,
    };
    d.map.lock().unwrap().insert(b"a".to_vec(), item.clone());
    d.map.lock().unwrap().insert(b"b".to_vec(), item.clone());
    s.store().load(b"a", &item, 1).unwrap();
    assert_eq!(
        s.store().stats().bytes,
        (item::header_len(9, 0, 42, big.len()) + 1) as u64
    );
    let got = s.get(b"a", 1, ReadOpts::default(), |i| {
        i.map(|i| (i.value.to_vec(), i.flags, i.cas))
    });
    assert_eq!(got, Some((big.clone(), 9, 42)));
    // "b" is only on the device: the read-through leaves a stub and answers the value.
    let before = d.fetches.load(Ordering::Relaxed);
    assert_eq!(value(&s, b"b").as_deref(), Some(&big[..]));
    assert_eq!(
        d.fetches.load(Ordering::Relaxed),
        before + 1,
        "one device read"
    );
    let st = s.store().stats();
    assert_eq!(
        (st.curr_items, st.bytes),
        (2, 2 * (item::header_len(9, 0, 42, big.len()) + 1) as u64)
    );
    // A large object's manifest is never external, however long.
    let manifest = Fetched {
        large: true,
        ..item
    };
    s.store().load(b"m", &manifest, 1).unwrap();
    let http = ReadOpts {
        see_large: true,
        ..ReadOpts::default()
    };
    assert_eq!(
        s.get(b"m", 1, http, |i| i.map(|i| (i.large, i.value.len()))),
        Some((true, big.len()))
    );
    assert!(s.store().stats().bytes > big.len() as u64);
}

#[test]
fn more_external_data_than_ram_stays_resident_and_exact() {
    let value_len = 256 << 10;
    let n = 200; // 50 MiB of values in a 16 MiB store
    let (s, d) = store_with(16 << 20, THRESHOLD);
    let s = s.journaled(Some(&*d));
    for i in 0..n {
        set(
            &s,
            format!("k{i}").as_bytes(),
            &pattern(value_len, i as u8),
            meta(0, 0),
        );
    }
    let st = s.store().stats();
    assert_eq!(st.curr_items, n as u64, "every stub fits");
    assert_eq!(st.evictions, 0);
    for i in 0..n {
        let got = value(&s, format!("k{i}").as_bytes()).unwrap();
        assert!(got == pattern(value_len, i as u8), "k{i} wrong");
    }
    assert_eq!(s.store().stats().external_reads, n as u64);
    assert!(d.fetches.load(Ordering::Relaxed) >= n as u64);

    // The same load with external values off evicts, and reads go through the device.
    let (s, d) = store_with(16 << 20, 0);
    let s = s.journaled(Some(&*d));
    for i in 0..n {
        set(
            &s,
            format!("k{i}").as_bytes(),
            &pattern(value_len, i as u8),
            meta(0, 0),
        );
    }
    let st = s.store().stats();
    assert!(st.curr_items < n as u64 && st.evictions > 0, "{st:?}");
    for i in (0..n).step_by(7) {
        let got = value(&s, format!("k{i}").as_bytes()).unwrap();
        assert!(got == pattern(value_len, i as u8), "k{i} wrong");
    }
}

#[test]
fn stubs_survive_compaction_and_eviction_keeps_working() {
    let (s, d) = store_with(16 << 20, THRESHOLD);
    let s = s.journaled(Some(&*d));
    let big = |i: usize| pattern(THRESHOLD + i, i as u8);
    for i in 0..50 {
        set(&s, format!("ext{i}").as_bytes(), &big(i), meta(i as u32, 0));
    }
    // Read them so the eviction policy keeps (copies forward) their stubs.
    for i in 0..50 {
        assert_eq!(value(&s, format!("ext{i}").as_bytes()), Some(big(i)));
    }
    let reads = s.store().stats().external_reads;
    assert_eq!(reads, 50);
    // 40 MiB of small values through a 16 MiB store: segments are compacted and evicted.
    let small = pattern(2000, 9);
    for round in 0..20_000 {
        set(&s, format!("small{round}").as_bytes(), &small, meta(0, 0));
        if round % 2000 == 0 {
            // Keep the stubs accessed through every compaction.
            for i in 0..50 {
                let key = format!("ext{i}");
                let got = s.get(
                    key.as_bytes(),
                    1,
                    ReadOpts {
                        mark_access: true,
                        ..ReadOpts::default()
                    },
                    |it| it.map(|it| (it.value.to_vec(), it.flags)),
                );
                assert_eq!(got, Some((big(i), i as u32)), "{key} after round {round}");
            }
        }
    }
    let st = s.store().stats();
    assert!(st.evictions > 0, "{st:?}");
    assert!(
        st.segment_bytes + st.index_bytes <= st.limit_maxbytes,
        "{st:?}"
    );
    // Every stub is still exact, whether it was copied forward (read from its stub) or
    // evicted (read through the device).
    for i in 0..50 {
        let key = format!("ext{i}");
        let got = s.get(key.as_bytes(), 1, ReadOpts::default(), |it| {
            it.map(|it| (it.value.to_vec(), it.flags))
        });
        assert_eq!(got, Some((big(i), i as u32)), "{key}");
    }
    let st = s.store().stats();
    assert_eq!(st.external_lost, 0);
    assert!(
        st.external_reads > reads + 50 * 9,
        "stubs were read from RAM after compactions: {st:?}"
    );
    assert!(d.fetches.load(Ordering::Relaxed) >= st.external_reads);
}
