//! Tests of GET values sent from the item: what the output and its splices hold, and that
//! the connection and worker caps fall back to copying.

use std::sync::Arc;

use crate::zero_copy::{CONN_PINNED_MAX, WORKER_PINNED_MAX, ZERO_COPY_MIN};
use crate::{Flow, Now, Protocol, ServiceConfig, Session, Shared, Topology};
use ringstore_store::{Store, StoreConfig};

const NOW: Now = Now {
    store: 100,
    unix: 1_700_000_100,
    mono_ms: 0,
};

fn shared(high_water: usize) -> Arc<Shared> {
    let store = Store::new(StoreConfig {
        memory_bytes: 64 << 20,
        item_size_max: 1 << 20,
        shards: 2,
        huge_pages: false,
        external_threshold: 0,
    })
    .expect("store");
    let config = ServiceConfig {
        item_size_max: 1 << 20,
        out_high_water: high_water,
        conn_memory: 1 << 30,
        ..ServiceConfig::default()
    };
    Shared::new(store, config, Topology::default(), 2, 1, 1)
}

fn session() -> Session {
    let mut s = Session::new(Protocol::Memcache, 0);
    s.enable_zero_copy();
    s
}

fn run(shared: &Shared, s: &mut Session, input: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut flow = s.on_bytes(input, NOW, shared, None, &mut out);
    while flow == Flow::Drain {
        flow = s.on_bytes(&[], NOW, shared, None, &mut out);
    }
    out
}

fn set(shared: &Shared, key: &str, len: usize) {
    let mut s = Session::new(Protocol::Memcache, 1);
    let mut input = format!("set {key} 0 0 {len}\r\n").into_bytes();
    input.extend(std::iter::repeat_n(b'v', len));
    input.extend_from_slice(b"\r\n");
    assert_eq!(run(shared, &mut s, &input), b"STORED\r\n");
}

#[test]
fn a_big_hit_is_spliced_and_a_small_one_copied() {
    let shared = shared(256 << 10);
    set(&shared, "big", 100 << 10);
    set(&shared, "small", ZERO_COPY_MIN - 1);
    let mut s = session();
    let out = run(&shared, &mut s, b"get small big\r\n");
    let head = format!("VALUE small 0 {}\r\n", ZERO_COPY_MIN - 1);
    assert!(out.starts_with(head.as_bytes()));
    let big_head = b"VALUE big 0 102400\r\n";
    let at = head.len() + ZERO_COPY_MIN - 1 + 2 + big_head.len();
    assert_eq!(&out[at - big_head.len()..at], big_head);
    assert_eq!(&out[at..], b"\r\nEND\r\n", "the value is not in the buffer");
    let splices = s.splices();
    assert_eq!(splices.len(), 1);
    assert_eq!((splices[0].at, splices[0].pin.len()), (at, 100 << 10));
    let st = shared.stats(0);
    assert_eq!(st.zero_copy_sends.get(), 1);
    assert_eq!(shared.pinned_bytes(), 100 << 10);
    assert_eq!(shared.store.stats().pinned_segments, 1);
    s.release_output(&shared);
    assert!(s.splices().is_empty());
    assert_eq!(shared.pinned_bytes(), 0);
    assert_eq!(shared.store.stats().pinned_segments, 0);
}

#[test]
fn a_session_without_zero_copy_copies() {
    let shared = shared(256 << 10);
    set(&shared, "big", 100 << 10);
    let mut s = Session::new(Protocol::Memcache, 0);
    let out = run(&shared, &mut s, b"get big\r\n");
    assert_eq!(out.len(), "VALUE big 0 102400\r\n".len() + (100 << 10) + 7);
    assert!(s.splices().is_empty());
}

#[test]
fn the_connection_cap_falls_back_to_copying() {
    let shared = shared(64 << 20);
    for i in 0..8 {
        set(&shared, &format!("k{i}"), 512 << 10);
    }
    let mut s = session();
    let out = run(&shared, &mut s, b"get k0 k1 k2 k3 k4 k5 k6 k7\r\n");
    let pinned: usize = s.splices().iter().map(|x| x.pin.len()).sum();
    assert!(pinned <= CONN_PINNED_MAX && pinned > 0, "{pinned}");
    assert_eq!(pinned + out.len(), 8 * (512 << 10) + 8 * 21 + 5);
    assert_eq!(shared.stats(0).zero_copy_fallbacks.get(), 4);
    s.release_output(&shared);
}

#[test]
fn the_worker_cap_holds_across_connections() {
    let shared = shared(64 << 20);
    set(&shared, "big", 1 << 20);
    let mut sessions: Vec<Session> = (0..100).map(|_| session()).collect();
    for s in &mut sessions {
        run(&shared, s, b"get big big\r\n");
    }
    assert!(usize::try_from(shared.pinned_bytes()).unwrap() <= WORKER_PINNED_MAX);
    assert_eq!(
        usize::try_from(shared.pinned_bytes()).unwrap(),
        WORKER_PINNED_MAX
    );
    assert_eq!(shared.stats(0).zero_copy_fallbacks.get(), 200 - 64);
    for s in &mut sessions {
        s.on_close(&shared, None);
    }
    assert_eq!(shared.pinned_bytes(), 0);
    assert_eq!(shared.store.stats().pinned_segments, 0);
}
