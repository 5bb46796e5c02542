//! Unit tests of the data-device seams: every mutation reaches the journal before RAM changes,
//! a refused journal write leaves RAM as it was, and misses are read through the backfill.
use std::collections::HashMap;

use super::*;

#[derive(Default)]
struct Recorder {
    log: Mutex<Vec<String>>,
    refuse: std::sync::atomic::AtomicBool,
}

impl Journal for Recorder {
    fn record(&self, m: Mutation<'_>) -> Result<(), StoreError> {
        if self.refuse.load(Ordering::Relaxed) {
            return Err(StoreError::OutOfMemory);
        }
        let line = match m {
            Mutation::Put {
                key,
                value,
                exptime,
                cas,
                large,
                ..
            } => format!(
                "put{} {} {} e{exptime} c{cas}",
                if large { "-large" } else { "" },
                String::from_utf8_lossy(key),
                String::from_utf8_lossy(value)
            ),
            Mutation::Delete { key } => format!("del {}", String::from_utf8_lossy(key)),
            Mutation::FlushAll { at } => format!("flush {at}"),
        };
        self.log.lock().unwrap().push(line);
        Ok(())
    }
}

struct Disk(HashMap<Vec<u8>, Fetched>);

impl Backfill for Disk {
    fn fetch(&self, key: &[u8], _: Time) -> Option<Fetched> {
        self.0.get(key).cloned()
    }
}

fn store() -> Store {
    Store::new(StoreConfig {
        memory_bytes: 64 << 20,
        item_size_max: 1 << 20,
        shards: 4,
        huge_pages: false,
        external_threshold: 0,
    })
    .unwrap()
}

fn meta() -> NewMeta {
    NewMeta {
        flags: 0,
        exptime: 0,
        cas: None,
    }
}

#[test]
fn every_mutation_is_journaled_with_its_full_new_state() {
    let s = store();
    let j = Arc::new(Recorder::default());
    s.require_journal();
    let s = s.journaled(Some(&*j));
    s.update(b"k", 1, |_| {
        (
            Write::Put {
                value: b"ab",
                meta: meta(),
            },
            (),
        )
    })
    .unwrap();
    s.update(b"k", 1, |_| {
        (
            Write::Append {
                suffix: b"c",
                meta: meta(),
            },
            (),
        )
    })
    .unwrap();
    s.update(b"n", 1, |_| {
        (
            Write::PutNumber {
                value: 42,
                meta: meta(),
            },
            (),
        )
    })
    .unwrap();
    s.update(b"k", 1, |_| {
        (
            Write::Meta {
                exptime: 50,
                stale: false,
                win_token_sent: false,
                new_cas: false,
            },
            (),
        )
    })
    .unwrap();
    let touch = ReadOpts {
        mark_access: true,
        touch: Some(60),
        see_large: false,
    };
    assert_eq!(s.get(b"k", 1, touch, |i| i.map(|i| i.exptime)), Some(60));
    s.update(b"k", 1, |_| (Write::Delete, ())).unwrap();
    s.update(b"absent", 1, |_| (Write::Delete, ())).unwrap();
    s.flush_all(1, 1).unwrap();
    let log = j.log.lock().unwrap().clone();
    assert_eq!(log.len(), 7, "{log:?}");
    assert!(log[0].starts_with("put k ab e0 c1"), "{log:?}");
    assert!(log[1].starts_with("put k abc e0 c2"), "{log:?}");
    assert!(log[2].starts_with("put n 42"), "{log:?}");
    assert!(log[3].starts_with("put k abc e50 c2"), "{log:?}");
    assert!(log[4].starts_with("put k abc e60 c2"), "{log:?}");
    assert_eq!(log[5], "del k");
    assert_eq!(log[6], "flush 1");
}

#[test]
fn a_refused_journal_write_leaves_ram_unchanged() {
    let s = store();
    let j = Arc::new(Recorder::default());
    s.require_journal();
    let s = s.journaled(Some(&*j));
    s.update(b"k", 1, |_| {
        (
            Write::Put {
                value: b"old",
                meta: meta(),
            },
            (),
        )
    })
    .unwrap();
    j.refuse.store(true, Ordering::Relaxed);
    let err = s.update(b"k", 1, |_| {
        (
            Write::Put {
                value: b"new",
                meta: meta(),
            },
            (),
        )
    });
    assert_eq!(err.unwrap_err(), StoreError::OutOfMemory);
    assert!(s.update(b"k", 1, |_| (Write::Delete, ())).is_err());
    assert!(s.flush_all(1, 1).is_err());
    let v = s.get(b"k", 1, ReadOpts::default(), |i| {
        i.map(|i| i.value.to_vec())
    });
    assert_eq!(v.as_deref(), Some(&b"old"[..]));
}

#[test]
fn a_refused_touch_is_reported_and_leaves_the_expiry_unchanged() {
    let s = store();
    let j = Arc::new(Recorder::default());
    s.require_journal();
    let s = s.journaled(Some(&*j));
    s.update(b"k", 1, |_| {
        (
            Write::Put {
                value: b"v",
                meta: NewMeta {
                    flags: 0,
                    exptime: 100,
                    cas: None,
                },
            },
            (),
        )
    })
    .unwrap();
    j.refuse.store(true, Ordering::Relaxed);
    let touch = ReadOpts {
        mark_access: true,
        touch: Some(500),
        see_large: false,
    };
    let mut called = false;
    let got = s.try_get(b"k", 1, touch, |i| {
        called = true;
        i.map(|i| i.exptime)
    });
    assert_eq!(got, Err(StoreError::OutOfMemory));
    assert!(!called, "the read must not answer a refused touch");
    // A touch of a missing key writes nothing, so nothing is refused.
    assert_eq!(s.try_get(b"absent", 1, touch, |i| i.is_none()), Ok(true));
    // The lenient read answers without the touch; RAM keeps the old expiry either way.
    assert_eq!(s.get(b"k", 1, touch, |i| i.map(|i| i.exptime)), Some(100));
    let plain = ReadOpts::default();
    assert_eq!(s.get(b"k", 1, plain, |i| i.map(|i| i.exptime)), Some(100));
    j.refuse.store(false, Ordering::Relaxed);
    assert_eq!(
        s.try_get(b"k", 1, touch, |i| i.map(|i| i.exptime)),
        Ok(Some(500))
    );
}

#[test]
fn misses_are_read_through_and_cas_floor_and_forget_work() {
    let s = store();
    let mut disk = HashMap::new();
    disk.insert(
        b"d".to_vec(),
        Fetched {
            value: b"disk".to_vec(),
            flags: 3,
            exptime: 0,
            cas: 77,
            large: false,
        },
    );
    s.attach_backfill(Arc::new(Disk(disk)));
    let got = s.get(b"d", 1, ReadOpts::default(), |i| {
        i.map(|i| (i.value.to_vec(), i.flags, i.cas))
    });
    assert_eq!(got, Some((b"disk".to_vec(), 3, 77)));
    // An append to a key only on the device sees the device value.
    s.update(b"d", 1, |i| {
        assert!(i.is_some());
        (
            Write::Append {
                suffix: b"!",
                meta: NewMeta {
                    flags: 3,
                    exptime: 0,
                    cas: None,
                },
            },
            (),
        )
    })
    .unwrap();
    assert!(s.get(b"nope", 1, ReadOpts::default(), |i| i.is_none()));
    s.raise_cas_floor(1000);
    let cas = s
        .update(b"x", 1, |_| {
            (
                Write::Put {
                    value: b"v",
                    meta: meta(),
                },
                (),
            )
        })
        .unwrap()
        .cas;
    assert_eq!(cas, Some(1001));
    s.forget_if_cas(b"x", 5, 1);
    assert!(s.get(b"x", 1, ReadOpts::default(), |i| i.is_some()));
    s.forget_if_cas(b"x", 1001, 1);
    assert!(s.get(b"x", 1, ReadOpts::default(), |i| i.is_none()));
    s.load(
        b"y",
        &Fetched {
            value: b"l".to_vec(),
            flags: 0,
            exptime: 0,
            cas: 9,
            large: false,
        },
        1,
    )
    .unwrap();
    assert_eq!(
        s.get(b"y", 1, ReadOpts::default(), |i| i.map(|i| i.cas)),
        Some(9)
    );
}

#[test]
fn large_objects_need_a_journal_and_are_hidden_from_memcache_reads() {
    let s = store();
    let put_large = |s: Journaled<'_>| {
        s.update(b"big", 1, |_| {
            (
                Write::PutLarge {
                    manifest: b"MANIFEST",
                    meta: meta(),
                },
                (),
            )
        })
    };
    assert_eq!(
        put_large(s.journaled(None)),
        Err(StoreError::TooLarge),
        "no device, no large object"
    );
    let j = Arc::new(Recorder::default());
    s.require_journal();
    let s = s.journaled(Some(&*j));
    let cas = put_large(s).unwrap().cas.unwrap();
    let memcache = ReadOpts::default();
    let http = ReadOpts {
        see_large: true,
        ..ReadOpts::default()
    };
    assert!(s.get(b"big", 1, memcache, |i| i.is_none()));
    assert_eq!(
        s.get(b"big", 1, http, |i| i.map(|i| (
            i.large,
            i.value.to_vec(),
            i.cas
        ))),
        Some((true, b"MANIFEST".to_vec(), cas))
    );
    // Growing it through memcache is refused; a touch keeps it large on the device.
    let append = s.update(b"big", 1, |_| {
        (
            Write::Append {
                suffix: b"x",
                meta: meta(),
            },
            (),
        )
    });
    assert_eq!(append, Err(StoreError::TooLarge));
    let touch = ReadOpts {
        touch: Some(50),
        see_large: true,
        ..ReadOpts::default()
    };
    assert!(s.try_get(b"big", 1, touch, |i| i.is_some()).unwrap());
    // Overwriting it with a plain value makes it an ordinary item again.
    s.update(b"big", 1, |cur| {
        assert!(cur.is_some_and(|c| c.large));
        (
            Write::Put {
                value: b"small",
                meta: meta(),
            },
            (),
        )
    })
    .unwrap();
    assert_eq!(
        s.get(b"big", 1, memcache, |i| i
            .map(|i| (i.large, i.value.to_vec()))),
        Some((false, b"small".to_vec()))
    );
    let log = j.log.lock().unwrap().clone();
    assert_eq!(
        log,
        [
            format!("put-large big MANIFEST e0 c{cas}"),
            format!("put-large big MANIFEST e50 c{cas}"),
            format!("put big small e0 c{}", cas + 1),
        ]
    );
    // A large object read back from the device comes back large.
    s.store()
        .load(
            b"loaded",
            &Fetched {
                value: b"M2".to_vec(),
                flags: 1,
                exptime: 0,
                cas: 3,
                large: true,
            },
            1,
        )
        .unwrap();
    assert!(s.get(b"loaded", 1, memcache, |i| i.is_none()));
    assert!(s.get(b"loaded", 1, http, |i| i
        .is_some_and(|i| i.large && i.flags == 1)));
}
