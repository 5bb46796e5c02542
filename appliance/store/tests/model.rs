//! Property tests of the store against a simple model (a BTreeMap and a fake clock).
//!
//! The store only offers `get` and read-decide-write `update`; memcached's commands are
//! built here on top of them, the way the service builds them, and every read is compared
//! with the model. A second test runs with a tiny budget: items may be evicted (missing)
//! but a live item never reads back a wrong value and the budget is never exceeded.
//!
//! Both run a second time with a fake data device (a map written by the journal, read by
//! the backfill) and a tiny `external_threshold`, so most values live only on the device
//! (extstore-like stubs in RAM): the answers must not change, and with the tiny budget every
//! value must still be found (through the device).

#![expect(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed step fails the test (allow-*-in-tests does not reach an integration test's helpers)"
)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use proptest::prelude::*;
use ringstore_store::{
    Backfill, Fetched, Journal, Journaled, Mutation, NewMeta, ReadOpts, Store, StoreConfig,
    StoreError, Time, Write, NEVER,
};

/// A fake data device: each key's newest journaled state; a flush_all empties it when its
/// time comes (as the model does), applied by [`Device::tick`].
#[derive(Default)]
struct Device {
    map: Mutex<BTreeMap<Vec<u8>, Fetched>>,
    flush_at: Mutex<Option<Time>>,
}

impl Device {
    fn tick(&self, now: Time) {
        let mut at = self.flush_at.lock().unwrap();
        if at.is_some_and(|at| now >= at) {
            self.map.lock().unwrap().clear();
            *at = None;
        }
    }
}

impl Journal for Device {
    fn record(&self, m: Mutation<'_>) -> Result<(), StoreError> {
        match m {
            Mutation::Put {
                key,
                value,
                flags,
                exptime,
                cas,
                large,
            } => {
                let item = Fetched {
                    value: value.to_vec(),
                    flags,
                    exptime,
                    cas,
                    large,
                };
                self.map.lock().unwrap().insert(key.to_vec(), item);
            }
            Mutation::Delete { key } => {
                self.map.lock().unwrap().remove(key);
            }
            Mutation::FlushAll { at } => *self.flush_at.lock().unwrap() = Some(at),
        }
        Ok(())
    }
}

impl Backfill for Device {
    fn fetch(&self, key: &[u8], now: Time) -> Option<Fetched> {
        let map = self.map.lock().unwrap();
        map.get(key)
            .filter(|f| f.exptime == NEVER || f.exptime > now)
            .cloned()
    }
}

/// A store with `memory_bytes`, and with `external_threshold` a fake device attached.
fn new_store(
    memory_bytes: usize,
    external_threshold: Option<usize>,
) -> (Store, Option<Arc<Device>>) {
    let s = Store::new(StoreConfig {
        memory_bytes,
        item_size_max: 1 << 20,
        shards: 4,
        huge_pages: false,
        external_threshold: external_threshold.unwrap_or(0),
    })
    .expect("store");
    let device = external_threshold.map(|_| {
        let d = Arc::new(Device::default());
        s.require_journal();
        s.attach_backfill(d.clone());
        d
    });
    (s, device)
}

#[derive(Debug, Clone, PartialEq)]
struct ModelItem {
    value: Vec<u8>,
    flags: u32,
    exptime: Time,
    cas: u64,
}

/// The reference: live items, a clock and a pending delayed flush.
#[derive(Debug, Default)]
struct Model {
    items: BTreeMap<Vec<u8>, ModelItem>,
    now: Time,
    flush_at: Option<Time>,
}

impl Model {
    /// Applies time: a due flush empties everything, expired items vanish.
    fn tick(&mut self) {
        if let Some(at) = self.flush_at {
            if self.now >= at {
                self.items.clear();
                self.flush_at = None;
            }
        }
        let now = self.now;
        self.items
            .retain(|_, i| i.exptime == NEVER || i.exptime > now);
    }
}

#[derive(Debug, Clone)]
enum Cmd {
    Set(u8, Vec<u8>, u32, i8),
    Add(u8, Vec<u8>, i8),
    Replace(u8, Vec<u8>, i8),
    Cas(u8, Vec<u8>, bool),
    Append(u8, Vec<u8>),
    Prepend(u8, Vec<u8>),
    Incr(u8, u64),
    Decr(u8, u64),
    Delete(u8),
    Touch(u8, i8),
    Gat(u8, i8),
    Get(u8),
    Flush(u8),
    Advance(u8),
    Reap(u8),
}

/// Absolute expiry from a relative TTL as memcached reads it: 0 never, negative already expired.
fn exptime(now: Time, ttl: i8) -> Time {
    match ttl {
        0 => NEVER,
        t if t < 0 => now,
        t => now + t as Time,
    }
}

fn key(k: u8) -> Vec<u8> {
    format!("key{k}").into_bytes()
}

fn value() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..24),
        (0u64..2000).prop_map(|n| n.to_string().into_bytes()),
        Just(b"18446744073709551614".to_vec()),
    ]
}

fn cmd() -> impl Strategy<Value = Cmd> {
    let k = 0u8..6;
    let ttl = prop_oneof![Just(0i8), -1i8..5];
    prop_oneof![
        4 => (k.clone(), value(), prop_oneof![Just(0u32), any::<u32>()], ttl.clone()).prop_map(|(k, v, f, t)| Cmd::Set(k, v, f, t)),
        2 => (k.clone(), value(), ttl.clone()).prop_map(|(k, v, t)| Cmd::Add(k, v, t)),
        2 => (k.clone(), value(), ttl.clone()).prop_map(|(k, v, t)| Cmd::Replace(k, v, t)),
        2 => (k.clone(), value(), any::<bool>()).prop_map(|(k, v, good)| Cmd::Cas(k, v, good)),
        1 => (k.clone(), value()).prop_map(|(k, v)| Cmd::Append(k, v)),
        1 => (k.clone(), value()).prop_map(|(k, v)| Cmd::Prepend(k, v)),
        2 => (k.clone(), prop_oneof![0u64..10, Just(u64::MAX)]).prop_map(|(k, d)| Cmd::Incr(k, d)),
        2 => (k.clone(), prop_oneof![0u64..10, Just(u64::MAX)]).prop_map(|(k, d)| Cmd::Decr(k, d)),
        2 => k.clone().prop_map(Cmd::Delete),
        1 => (k.clone(), ttl.clone()).prop_map(|(k, t)| Cmd::Touch(k, t)),
        1 => (k.clone(), ttl).prop_map(|(k, t)| Cmd::Gat(k, t)),
        5 => k.prop_map(Cmd::Get),
        1 => (0u8..4).prop_map(Cmd::Flush),
        2 => (0u8..4).prop_map(Cmd::Advance),
        1 => (0u8..4).prop_map(Cmd::Reap),
    ]
}

/// Stores `value` when `cond` (seeing the current item's CAS) allows; returns the new CAS.
fn store_if(
    s: &Journaled<'_>,
    k: &[u8],
    now: Time,
    value: &[u8],
    meta: NewMeta,
    cond: impl FnOnce(Option<u64>) -> bool,
) -> Option<u64> {
    s.update(k, now, |cur| {
        if cond(cur.map(|i| i.cas)) {
            (Write::Put { value, meta }, ())
        } else {
            (Write::Nothing, ())
        }
    })
    .expect("store")
    .cas
}

fn parse_number(v: &[u8]) -> Option<u64> {
    if v.is_empty() || v.len() > 20 || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(v).ok()?.parse().ok()
}

#[expect(
    clippy::too_many_lines,
    reason = "one match arm per command, each checked against the model: it reads as one table"
)]
fn run(cmds: Vec<Cmd>, external_threshold: Option<usize>) -> Result<(), TestCaseError> {
    let (s, device) = new_store(16 << 20, external_threshold);
    let s = s.journaled(device.as_deref().map(|d| d as &dyn Journal));
    let mut m = Model {
        now: 1,
        ..Model::default()
    };
    for c in cmds {
        m.tick();
        let now = m.now;
        if let Some(d) = &device {
            d.tick(now);
        }
        match c.clone() {
            Cmd::Set(k, v, flags, ttl) => {
                let meta = NewMeta {
                    flags,
                    exptime: exptime(now, ttl),
                    cas: None,
                };
                let cas = store_if(&s, &key(k), now, &v, meta, |_| true).expect("set writes");
                m.items.insert(
                    key(k),
                    ModelItem {
                        value: v,
                        flags,
                        exptime: meta.exptime,
                        cas,
                    },
                );
            }
            Cmd::Add(k, v, ttl) | Cmd::Replace(k, v, ttl) => {
                let add = matches!(c, Cmd::Add(..));
                let meta = NewMeta {
                    flags: 0,
                    exptime: exptime(now, ttl),
                    cas: None,
                };
                let cas = store_if(&s, &key(k), now, &v, meta, |cur| cur.is_some() != add);
                prop_assert_eq!(cas.is_some(), m.items.contains_key(&key(k)) != add);
                if let Some(cas) = cas {
                    m.items.insert(
                        key(k),
                        ModelItem {
                            value: v,
                            flags: 0,
                            exptime: meta.exptime,
                            cas,
                        },
                    );
                }
            }
            Cmd::Cas(k, v, good) => {
                let want = m
                    .items
                    .get(&key(k))
                    .map(|i| if good { i.cas } else { i.cas + 1_000_000 });
                let meta = NewMeta {
                    flags: 1,
                    exptime: NEVER,
                    cas: None,
                };
                let cas = store_if(&s, &key(k), now, &v, meta, |cur| {
                    cur.is_some() && cur == want
                });
                prop_assert_eq!(cas.is_some(), want.is_some() && good);
                if let Some(cas) = cas {
                    m.items.insert(
                        key(k),
                        ModelItem {
                            value: v,
                            flags: 1,
                            exptime: NEVER,
                            cas,
                        },
                    );
                }
            }
            Cmd::Append(k, v) | Cmd::Prepend(k, v) => {
                let append = matches!(c, Cmd::Append(..));
                let r = s
                    .update(&key(k), now, |cur| match cur {
                        None => (Write::Nothing, ()),
                        Some(i) => {
                            let meta = NewMeta {
                                flags: i.flags,
                                exptime: i.exptime,
                                cas: None,
                            };
                            if append {
                                (Write::Append { suffix: &v, meta }, ())
                            } else {
                                (Write::Prepend { prefix: &v, meta }, ())
                            }
                        }
                    })
                    .expect("append");
                prop_assert_eq!(r.cas.is_some(), m.items.contains_key(&key(k)));
                if let (Some(i), Some(cas)) = (m.items.get_mut(&key(k)), r.cas) {
                    i.value = if append {
                        [&i.value[..], &v[..]].concat()
                    } else {
                        [&v[..], &i.value[..]].concat()
                    };
                    i.cas = cas;
                }
            }
            Cmd::Incr(k, d) | Cmd::Decr(k, d) => {
                let incr = matches!(c, Cmd::Incr(..));
                let r = s
                    .update(&key(k), now, |cur| {
                        match cur.and_then(|i| parse_number(i.value).map(|n| (n, i))) {
                            None => (Write::Nothing, None),
                            Some((n, i)) => {
                                let value = if incr {
                                    n.wrapping_add(d)
                                } else {
                                    n.saturating_sub(d)
                                };
                                let meta = NewMeta {
                                    flags: i.flags,
                                    exptime: i.exptime,
                                    cas: None,
                                };
                                (Write::PutNumber { value, meta }, Some(value))
                            }
                        }
                    })
                    .expect("incr");
                let expect = m
                    .items
                    .get(&key(k))
                    .and_then(|i| parse_number(&i.value))
                    .map(|n| {
                        if incr {
                            n.wrapping_add(d)
                        } else {
                            n.saturating_sub(d)
                        }
                    });
                prop_assert_eq!(r.result, expect);
                if let (Some(i), Some(n), Some(cas)) = (m.items.get_mut(&key(k)), expect, r.cas) {
                    i.value = n.to_string().into_bytes();
                    i.cas = cas;
                }
            }
            Cmd::Delete(k) => {
                let r = s
                    .update(&key(k), now, |cur| (Write::Delete, cur.is_some()))
                    .expect("delete");
                prop_assert_eq!(r.result, m.items.remove(&key(k)).is_some());
            }
            Cmd::Touch(k, ttl) => {
                let e = exptime(now, ttl);
                let r = s
                    .update(&key(k), now, |cur| match cur {
                        None => (Write::Nothing, false),
                        Some(i) => (
                            Write::Meta {
                                exptime: e,
                                stale: i.stale,
                                win_token_sent: i.win_token_sent,
                                new_cas: false,
                            },
                            true,
                        ),
                    })
                    .expect("touch");
                prop_assert_eq!(r.result, m.items.contains_key(&key(k)));
                if let Some(i) = m.items.get_mut(&key(k)) {
                    prop_assert_eq!(r.cas, Some(i.cas));
                    i.exptime = e;
                }
            }
            Cmd::Gat(k, ttl) => {
                let e = exptime(now, ttl);
                let got = s.get(
                    &key(k),
                    now,
                    ReadOpts {
                        mark_access: true,
                        touch: Some(e),
                        see_large: false,
                    },
                    |i| {
                        i.map(|i| ModelItem {
                            value: i.value.to_vec(),
                            flags: i.flags,
                            exptime: i.exptime,
                            cas: i.cas,
                        })
                    },
                );
                if let Some(i) = m.items.get_mut(&key(k)) {
                    i.exptime = e;
                }
                prop_assert_eq!(got.as_ref(), m.items.get(&key(k)));
            }
            Cmd::Get(k) => {
                let got = s.get(
                    &key(k),
                    now,
                    ReadOpts {
                        mark_access: true,
                        touch: None,
                        see_large: false,
                    },
                    |i| {
                        i.map(|i| ModelItem {
                            value: i.value.to_vec(),
                            flags: i.flags,
                            exptime: i.exptime,
                            cas: i.cas,
                        })
                    },
                );
                prop_assert_eq!(got.as_ref(), m.items.get(&key(k)));
            }
            Cmd::Flush(delay) => {
                let at = now + Time::from(delay);
                s.flush_all(now, at).expect("flush");
                m.flush_at = Some(at);
                m.tick();
                if let Some(d) = &device {
                    d.tick(now);
                }
            }
            Cmd::Advance(secs) => m.now += Time::from(secs),
            Cmd::Reap(n) => {
                s.store().reclaim_expired(now, usize::from(n) * 3);
            }
        }
    }
    m.tick();
    if let Some(d) = &device {
        d.tick(m.now);
    }
    for k in 0..6u8 {
        let got = s.get(&key(k), m.now, ReadOpts::default(), |i| {
            i.map(|i| ModelItem {
                value: i.value.to_vec(),
                flags: i.flags,
                exptime: i.exptime,
                cas: i.cas,
            })
        });
        prop_assert_eq!(got.as_ref(), m.items.get(&key(k)));
    }
    let st = s.store().stats();
    prop_assert_eq!(st.evictions, 0);
    prop_assert!(
        st.curr_items >= m.items.len() as u64,
        "expired items may wait for the reaper"
    );
    Ok(())
}

/// A value that names its key and version, so a read can be checked against what was last stored.
fn versioned(k: u8, version: u32, len: usize) -> Vec<u8> {
    let mut v = format!("{k}:{version}:").into_bytes();
    v.resize(len.max(v.len()), (version % 251) as u8);
    v
}

#[derive(Debug, Clone)]
enum SmallCmd {
    Set(u8, usize),
    Append(u8, usize),
    Delete(u8),
    Get(u8),
}

fn small_cmd() -> impl Strategy<Value = SmallCmd> {
    let k = 0u8..24;
    let len = prop_oneof![0usize..200, 1000usize..50_000, 200_000usize..(1 << 20)];
    prop_oneof![
        4 => (k.clone(), len.clone()).prop_map(|(k, l)| SmallCmd::Set(k, l)),
        1 => (k.clone(), len).prop_map(|(k, l)| SmallCmd::Append(k, l)),
        1 => k.clone().prop_map(SmallCmd::Delete),
        4 => k.prop_map(SmallCmd::Get),
    ]
}

fn run_small(cmds: Vec<SmallCmd>, external_threshold: Option<usize>) -> Result<(), TestCaseError> {
    let (s, device) = new_store(4 << 20, external_threshold);
    let s = s.journaled(device.as_deref().map(|d| d as &dyn Journal));
    // With the device every value is found (RAM is only its cache).
    let complete = device.is_some();
    let mut latest: BTreeMap<u8, Vec<u8>> = BTreeMap::new();
    let mut version = 0u32;
    for c in cmds {
        version += 1;
        match c {
            SmallCmd::Set(k, len) => {
                let v = versioned(k, version, len);
                let meta = NewMeta::default();
                s.update(&key(k), 1, |_| (Write::Put { value: &v, meta }, ()))
                    .expect("set");
                latest.insert(k, v);
            }
            SmallCmd::Append(k, len) => {
                let suffix = versioned(k, version, len);
                let r = s.update(&key(k), 1, |cur| match cur {
                    None => (Write::Nothing, None),
                    Some(i) => (
                        Write::Append {
                            suffix: &suffix,
                            meta: NewMeta::default(),
                        },
                        Some(i.value.len()),
                    ),
                });
                match r {
                    Err(StoreError::TooLarge) => {}
                    Err(e) => return Err(TestCaseError::fail(format!("append: {e}"))),
                    Ok(u) => {
                        if let (Some(_), Some(old)) = (u.cas, latest.get_mut(&k)) {
                            old.extend_from_slice(&suffix);
                        }
                    }
                }
            }
            SmallCmd::Delete(k) => {
                s.update(&key(k), 1, |_| (Write::Delete, ()))
                    .expect("delete");
                latest.remove(&k);
            }
            SmallCmd::Get(k) => {
                let got = s.get(
                    &key(k),
                    1,
                    ReadOpts {
                        mark_access: true,
                        touch: None,
                        see_large: false,
                    },
                    |i| i.map(|i| i.value.to_vec()),
                );
                if complete || got.is_some() {
                    prop_assert_eq!(got.as_ref(), latest.get(&k), "key {} read a wrong value", k);
                }
            }
        }
        let st = s.store().stats();
        prop_assert!(
            st.segment_bytes + st.index_bytes <= st.limit_maxbytes,
            "over budget: {:?}",
            st
        );
    }
    for (k, v) in &latest {
        let got = s.get(&key(*k), 1, ReadOpts::default(), |i| {
            i.map(|i| i.value.to_vec())
        });
        if complete || got.is_some() {
            prop_assert_eq!(got.as_ref(), Some(v));
        }
    }
    Ok(())
}

// 256 cases each by default; set PROPTEST_CASES for a longer run.
proptest! {
    #[test]
    fn matches_the_model(cmds in prop::collection::vec(cmd(), 1..120)) {
        run(cmds, None)?;
    }

    #[test]
    fn matches_the_model_with_external_values(cmds in prop::collection::vec(cmd(), 1..120)) {
        run(cmds, Some(4))?;
    }

    #[test]
    fn small_budget_never_corrupts(cmds in prop::collection::vec(small_cmd(), 1..80)) {
        run_small(cmds, None)?;
    }

    #[test]
    fn small_budget_with_external_values_finds_everything(
        cmds in prop::collection::vec(small_cmd(), 1..80),
    ) {
        run_small(cmds, Some(1000))?;
    }
}
