//! The hot-key sketch against an exact count, its accuracy when sampled, its memory bound.

use std::collections::HashMap;

use proptest::prelude::*;

use super::*;

/// Checks the index finds every entry at its own place and the heap is ordered.
fn check_structure(s: &SpaceSaving) {
    for e in 0..s.used {
        assert_eq!(
            s.find(s.hash[e], s.key(e)),
            Some(e),
            "entry {e} not indexed"
        );
        assert_eq!(usize::from(s.heap[usize::from(s.pos[e])]), e);
    }
    let indexed = s.index.iter().filter(|&&i| i != 0).count();
    assert_eq!(indexed, s.used, "index holds stale entries");
    for p in 1..s.used {
        assert!(
            s.counted((p - 1) / 2) <= s.counted(p),
            "heap out of order at {p}"
        );
    }
}

/// A small deterministic generator for the streams (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = usize::try_from(self.next() % (i as u64 + 1)).unwrap_or(0);
            v.swap(i, j);
        }
    }
}

/// The workload: 10 keys read 2,000 times each among 20,000 keys read once, in random order.
fn accuracy_stream(seed: u64) -> Vec<Vec<u8>> {
    let mut stream = Vec::with_capacity(40_000);
    for hot in 0..10 {
        for _ in 0..2_000 {
            stream.push(format!("hot:{hot}").into_bytes());
        }
    }
    for cold in 0..20_000 {
        stream.push(format!("cold:{cold}").into_bytes());
    }
    Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1).shuffle(&mut stream);
    stream
}

#[test]
fn ten_hot_keys_among_twenty_thousand_cold_are_found_sampled_over_several_workers() {
    for seed in 1..=20 {
        let hot = HotKeys::seeded(4, SAMPLE_ONE_IN, entries_for(4), seed);
        for (i, key) in accuracy_stream(seed).iter().enumerate() {
            hot.record(i % 4, key);
        }
        let top = hot.top(10, b"");
        let found = top.iter().filter(|k| k.key.starts_with(b"hot:")).count();
        assert!(
            found >= 9,
            "seed {seed}: {found} of 10 hot keys in the top 10: {top:?}"
        );
        // The estimate is the sampled count scaled back: near 2,000.
        for k in top.iter().filter(|k| k.key.starts_with(b"hot:")) {
            assert!((800..=4_000).contains(&k.count), "seed {seed}: {k:?}");
        }
    }
}

#[test]
fn unsampled_counts_are_exact_while_the_sketch_has_room() {
    let hot = HotKeys::with(2, 1, 64);
    for i in 0..30u64 {
        for _ in 0..=i {
            hot.record(
                usize::try_from(i % 3).unwrap_or(0),
                format!("k{i}").as_bytes(),
            );
        }
    }
    let top = hot.top(3, b"");
    let expect: Vec<HotKey> = [29u64, 28, 27]
        .iter()
        .map(|&i| HotKey {
            key: format!("k{i}").into_bytes(),
            count: i + 1,
        })
        .collect();
    assert_eq!(top, expect);
    assert_eq!(hot.top(500, b"").len(), TOP_MAX.min(30));
    assert_eq!(hot.top(10, b"k1").len(), 10, "k1 and k10..k19");
    assert!(hot.top(10, b"k1").iter().all(|k| k.key.starts_with(b"k1")));
}

#[test]
fn memory_stays_fixed_under_a_million_distinct_long_keys_and_hot_ones_survive() {
    let hot = HotKeys::with(1, 1, ENTRIES);
    hot.record(0, b"warm-up");
    let before = hot.memory_bytes();
    assert_eq!(before, SKETCH_BYTES);
    assert_eq!(hot.memory_bound_bytes(), SKETCH_BYTES);
    let mut key = [b'x'; 250];
    for i in 0..1_000_000u32 {
        key[..4].copy_from_slice(&i.to_le_bytes());
        hot.record(0, &key);
        if i % 100 == 0 {
            hot.record(0, format!("hot:{}", i % 500).as_bytes());
        }
    }
    assert_eq!(hot.memory_bytes(), before, "the sketch never grows");
    // Each hot key has 20 of 1,010,000 observations: below n/m, so not guaranteed; the
    // five most frequent keys of a flood with a real hot set are:
    for i in 0..200_000u32 {
        key[..4].copy_from_slice(&(i + 2_000_000).to_le_bytes());
        hot.record(0, &key);
        hot.record(0, format!("very-hot:{}", i % 5).as_bytes());
    }
    let top = hot.top(5, b"");
    assert!(
        top.iter().all(|k| k.key.starts_with(b"very-hot:")),
        "{top:?}"
    );
    assert_eq!(hot.memory_bytes(), before);
}

#[test]
fn many_workers_share_a_fixed_total() {
    assert_eq!(SKETCH_BYTES, 147_456, "144 KiB, as the docs say");
    assert_eq!(entries_for(3), ENTRIES);
    assert_eq!(entries_for(14), ENTRIES);
    assert_eq!(entries_for(15), ENTRIES / 2);
    for slots in 1..=227 {
        let bytes = HotKeys::new(slots).memory_bound_bytes();
        assert!(bytes <= TOTAL_BYTES, "{slots} slots: {bytes}");
    }
    assert_eq!(entries_for(1000), ENTRIES_MIN);
}

#[test]
fn keys_over_the_limit_are_not_counted() {
    let mut s = SpaceSaving::new(4, 7);
    s.observe(&[b'a'; KEY_MAX + 1]);
    assert_eq!(s.observed(), 0);
    s.observe(&[b'a'; KEY_MAX]);
    assert_eq!(s.entries().next().map(|e| e.key.len()), Some(KEY_MAX));
}

#[test]
fn stats_lines_show_text_keys_as_they_are_and_others_in_base64() {
    let keys = [
        HotKey {
            key: b"user:1".to_vec(),
            count: 64,
        },
        HotKey {
            key: vec![0, 1, 0xff],
            count: 32,
        },
        HotKey {
            key: b"has space".to_vec(),
            count: 1,
        },
    ];
    let mut out = Vec::new();
    stats_lines(&mut out, &keys);
    assert_eq!(
        String::from_utf8_lossy(&out),
        "STAT hotkey:1:key user:1\r\nSTAT hotkey:1:count 64\r\n\
         STAT hotkey:2:key AAH/\r\nSTAT hotkey:2:base64 1\r\nSTAT hotkey:2:count 32\r\n\
         STAT hotkey:3:key aGFzIHNwYWNl\r\nSTAT hotkey:3:base64 1\r\nSTAT hotkey:3:count 1\r\n"
    );
}

#[test]
fn json_escapes_text_keys_and_gives_others_in_base64() {
    let hot = HotKeys::with(1, 1, 4);
    let keys = [
        HotKey {
            key: "q\"u\\oté".as_bytes().to_vec(),
            count: 3,
        },
        HotKey {
            key: vec![0xff, 0x00],
            count: 2,
        },
    ];
    let text = String::from_utf8(json(&hot, 10, &keys)).unwrap_or_default();
    assert_eq!(
        text,
        "{\"k\":10,\"sample_one_in\":1,\"memory_bytes\":0,\"memory_bound_bytes\":1152,\"keys\":[\
         {\"rank\":1,\"key\":\"q\\\"u\\\\oté\",\"count\":3},\
         {\"rank\":2,\"key_base64\":\"/wA=\",\"count\":2}]}\n"
    );
}

/// A skewed stream: key `i` of `alphabet` drawn with weight about 1/(i+1).
fn skewed(alphabet: u32) -> impl Strategy<Value = Vec<u32>> {
    prop::collection::vec(0..alphabet * alphabet, 0..3_000).prop_map(move |draws| {
        draws
            .into_iter()
            .map(|d| (alphabet * alphabet / (d + 1)).min(alphabet - 1))
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Space-Saving's guarantees against an exact count: every key seen more than n/m times
    /// is held; every count is at least the true count and exceeds it by at most n/m (and
    /// by at most the entry's own error); the index and heap stay consistent.
    #[test]
    fn space_saving_against_an_exact_count(
        stream in skewed(60),
        cap in 1usize..40,
        seed in any::<u64>(),
    ) {
        let mut s = SpaceSaving::new(cap, seed);
        let mut exact: HashMap<Vec<u8>, u64> = HashMap::new();
        for k in &stream {
            let key = format!("key-{k}").into_bytes();
            s.observe(&key);
            *exact.entry(key).or_default() += 1;
        }
        check_structure(&s);
        let n = stream.len() as u64;
        prop_assert_eq!(s.observed(), n);
        let bound = n / cap as u64;
        let held: HashMap<&[u8], Entry<'_>> = s.entries().map(|e| (e.key, e)).collect();
        prop_assert_eq!(held.len(), exact.len().min(cap));
        prop_assert!(s.min_count() <= bound);
        for (key, &truth) in &exact {
            match held.get(key.as_slice()) {
                Some(e) => {
                    prop_assert!(e.count >= truth);
                    prop_assert!(e.count - truth <= bound);
                    prop_assert!(e.count - e.err <= truth);
                }
                None => prop_assert!(truth <= bound, "{:?} seen {} > n/m = {}", key, truth, bound),
            }
        }
        prop_assert_eq!(held.values().map(|e| e.count).sum::<u64>(), n);
    }
}

/// `stats hotkeys` and `GET /_hotkeys` through sessions, every request counted (`one_in` 1).
mod sessions {
    use std::sync::Arc;

    use sha2::{Digest, Sha256};

    use crate::auth::{Auth, HttpTokens};
    use crate::{Flow, Now, Protocol, ServiceConfig, Session, Shared, Topology};
    use ringstore_store::{Store, StoreConfig};

    const NOW: Now = Now {
        store: 100,
        unix: 1_700_000_100,
        mono_ms: 5_000,
        mono_ns: 5_000 * 1_000_000,
    };

    fn shared(tokens: Option<&str>) -> Arc<Shared> {
        let auth = tokens.map(|file| {
            let tokens = HttpTokens::parse(file).expect("tokens file");
            Auth::new(None, Some(tokens), |_| {})
        });
        shared_started(crate::Started {
            auth,
            ..crate::Started::default()
        })
    }

    fn shared_started(started: crate::Started) -> Arc<Shared> {
        let store = Store::new(StoreConfig {
            memory_bytes: 16 << 20,
            item_size_max: 1 << 20,
            shards: 2,
            huge_pages: false,
            external_threshold: 0,
        })
        .expect("store");
        let config = ServiceConfig::default();
        let shared = Shared::with(store, config, Topology::default(), 2, 1, 0, started);
        shared.hotkeys.set_one_in(1);
        shared
    }

    fn run(shared: &Shared, protocol: Protocol, worker: usize, input: &[u8]) -> String {
        let mut s = Session::new(protocol, worker);
        let mut out = Vec::new();
        let mut flow = s.on_bytes(input, NOW, shared, None, &mut out);
        while flow == Flow::Drain {
            flow = s.on_bytes(&[], NOW, shared, None, &mut out);
        }
        String::from_utf8_lossy(&out).into_owned()
    }

    fn hex(token: &str) -> String {
        Sha256::digest(token.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    #[test]
    fn stats_hotkeys_ranks_reads_and_writes_of_every_worker() {
        let shared = shared(None);
        run(
            &shared,
            Protocol::Memcache,
            0,
            b"set a 0 0 1\r\nx\r\nget a a a\r\n",
        );
        run(
            &shared,
            Protocol::Memcache,
            1,
            b"get a b\r\nmg b v\r\nmg AAH/ b v\r\n",
        );
        let http = run(
            &shared,
            Protocol::Http,
            1,
            b"GET /c HTTP/1.1\r\nHost: x\r\n\r\n",
        );
        assert!(http.starts_with("HTTP/1.1 404"), "{http}");
        let reply = run(&shared, Protocol::Memcache, 0, b"stats hotkeys 3\r\n");
        assert_eq!(
            reply,
            "STAT hotkey:1:key a\r\nSTAT hotkey:1:count 5\r\n\
             STAT hotkey:2:key b\r\nSTAT hotkey:2:count 2\r\n\
             STAT hotkey:3:key AAH/\r\nSTAT hotkey:3:base64 1\r\nSTAT hotkey:3:count 1\r\n\
             END\r\n"
        );
        let reply = run(&shared, Protocol::Memcache, 0, b"stats hotkeys\r\n");
        assert_eq!(
            reply.matches(":key ").count(),
            4,
            "a, b, AAH/ and c: {reply}"
        );
    }

    #[test]
    fn the_http_listing_needs_a_token_and_shows_only_its_prefix() {
        let file = format!(
            "reader {} read\nusers {} read users/\n",
            hex("r-token"),
            hex("u-token")
        );
        let shared = shared(Some(&file));
        for key in ["users/1", "users/1", "orders/9", "orders/9", "orders/9"] {
            let req =
                format!("GET /{key} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer r-token\r\n\r\n");
            run(&shared, Protocol::Http, 0, req.as_bytes());
        }
        let get = |token: &str| {
            let auth = format!("Authorization: Bearer {token}\r\n");
            let req = format!("GET /_hotkeys?n=5 HTTP/1.1\r\nHost: x\r\n{auth}\r\n");
            run(&shared, Protocol::Http, 1, req.as_bytes())
        };
        let anonymous = run(
            &shared,
            Protocol::Http,
            0,
            b"GET /_hotkeys HTTP/1.1\r\nHost: x\r\n\r\n",
        );
        assert!(anonymous.starts_with("HTTP/1.1 401"), "{anonymous}");
        let all = get("r-token");
        assert!(all.starts_with("HTTP/1.1 200"), "{all}");
        assert!(all.contains("Content-Type: application/json\r\n"), "{all}");
        assert!(
            all.ends_with(
                "\"keys\":[{\"rank\":1,\"key\":\"orders/9\",\"count\":3},\
                 {\"rank\":2,\"key\":\"users/1\",\"count\":2}]}\n"
            ),
            "{all}"
        );
        assert!(all.contains("{\"k\":5,\"sample_one_in\":1,"), "{all}");
        let users = get("u-token");
        assert!(
            users.ends_with("\"keys\":[{\"rank\":1,\"key\":\"users/1\",\"count\":2}]}\n"),
            "{users}"
        );
        let put = "PUT /_hotkeys HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer r-token\r\n\r\n";
        let put = run(&shared, Protocol::Http, 0, put.as_bytes());
        assert!(put.starts_with("HTTP/1.1 405"), "{put}");
    }

    /// `--hotkeys off --latency-histograms off`: nothing sampled, nothing timed, and
    /// `/metrics` lists no request histogram; on (the default) both see the same requests.
    #[test]
    fn switched_off_nothing_is_sampled_or_timed() {
        let requests = b"set a 0 0 1\r\nx\r\nget a a\r\nmg a v\r\n";
        let metrics = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
        let histogram =
            "ringstore_request_duration_seconds_count{protocol=\"memcache\",command=\"get\"} 1\n";
        let on = shared(None);
        run(&on, Protocol::Memcache, 0, requests);
        let listed = run(&on, Protocol::Memcache, 0, b"stats hotkeys\r\n");
        assert!(listed.starts_with("STAT hotkey:1:key a\r\n"), "{listed}");
        let scrape = run(&on, Protocol::Http, 1, metrics);
        assert!(scrape.contains(histogram), "{scrape}");
        let off = shared_started(crate::Started {
            hotkeys: false,
            latency_histograms: false,
            ..crate::Started::default()
        });
        off.hotkeys.set_one_in(1);
        run(&off, Protocol::Memcache, 0, requests);
        let listed = run(&off, Protocol::Memcache, 0, b"stats hotkeys\r\n");
        assert_eq!(listed, "END\r\n");
        assert_eq!(off.hotkeys.memory_bytes(), 0, "no sketch allocated");
        let scrape = run(&off, Protocol::Http, 1, metrics);
        assert!(scrape.starts_with("HTTP/1.1 200"), "{scrape}");
        assert!(scrape.contains("\nmemcached_commands_total{"), "{scrape}");
        assert!(
            !scrape.contains("ringstore_request_duration_seconds"),
            "{scrape}"
        );
    }
}
