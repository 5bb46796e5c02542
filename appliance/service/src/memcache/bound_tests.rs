//! The memory bounds of a memcache session: multi-key replies produced as the client drains
//! them, values in flight reserved in the connection-memory budget, refusals as memcached
//! words them.

use std::sync::Arc;

use crate::budget::IN_FREE;
use crate::{Flow, Now, Protocol, ServiceConfig, Session, Shared, Topology};
use ringstore_store::{Store, StoreConfig};

const NOW: Now = Now {
    store: 100,
    unix: 1_700_000_100,
    mono_ms: 0,
    mono_ns: 0,
};
const ITEM_MAX: usize = 512 << 10;
const HIGH_WATER: usize = 64 << 10;

pub(super) fn shared(conn_memory: usize) -> Arc<Shared> {
    shared_started(conn_memory, crate::Started::default())
}

/// [`shared`] as a runtime that knew `started` built it.
pub(super) fn shared_started(conn_memory: usize, started: crate::Started) -> Arc<Shared> {
    let store = Store::new(StoreConfig {
        memory_bytes: 16 << 20,
        item_size_max: ITEM_MAX,
        shards: 2,
        huge_pages: false,
        external_threshold: 0,
    })
    .expect("store");
    let config = ServiceConfig {
        item_size_max: ITEM_MAX,
        max_line: 2048,
        out_high_water: HIGH_WATER,
        max_conns: 10,
        object_size_max: 0,
        conn_memory,
    };
    Shared::with(store, config, Topology::default(), 1, 1, 0, started)
}

fn set(shared: &Shared, key: &str, value: &[u8]) {
    let mut s = Session::new(Protocol::Memcache, 0);
    let mut out = Vec::new();
    let mut input = format!("set {key} 0 0 {}\r\n", value.len()).into_bytes();
    input.extend_from_slice(value);
    input.extend_from_slice(b"\r\n");
    assert_eq!(
        s.on_bytes(&input, NOW, shared, None, &mut out),
        Flow::Continue
    );
    assert_eq!(out, b"STORED\r\n");
}

/// Feeds `input`, then plays the runtime: sends (takes) the output after every call and
/// resumes while the session asks to drain. Returns everything sent and the largest output
/// any one call left pending.
pub(super) fn drain_all(shared: &Shared, s: &mut Session, input: &[u8]) -> (Vec<u8>, usize) {
    let mut out = Vec::new();
    let mut sent = Vec::new();
    let mut most = 0;
    let mut flow = s.on_bytes(input, NOW, shared, None, &mut out);
    loop {
        most = most.max(out.len());
        sent.append(&mut out);
        s.on_output_flushed();
        if flow != Flow::Drain {
            return (sent, most);
        }
        flow = s.on_bytes(&[], NOW, shared, None, &mut out);
    }
}

#[test]
fn a_multiget_naming_one_big_value_many_times_is_produced_as_it_drains() {
    let shared = shared(64 << 20);
    let value = vec![b'v'; 300 << 10];
    set(&shared, "b", &value);
    let mut line = b"get".to_vec();
    for _ in 0..200 {
        line.extend_from_slice(b" b");
    }
    line.extend_from_slice(b"\r\nversion\r\n");
    let mut s = Session::new(Protocol::Memcache, 0);
    let (sent, most) = drain_all(&shared, &mut s, &line);
    let one = [b"VALUE b 0 307200\r\n".as_slice(), &value, b"\r\n"].concat();
    let expected = [one.repeat(200), b"END\r\nVERSION 1.6.18\r\n".to_vec()].concat();
    assert!(
        sent == expected,
        "reply differs ({} vs {} bytes)",
        sent.len(),
        expected.len()
    );
    // Before: one call built all 200 values (60 MB).
    assert!(
        most <= HIGH_WATER + 2 * one.len(),
        "one call left {most} bytes pending"
    );
    assert_eq!(shared.conn_memory.used(), 0, "everything was given back");
}

#[test]
fn a_paused_get_resumes_in_order_with_pipelined_requests_behind_it() {
    let shared = shared(64 << 20);
    for i in 0..10 {
        set(
            &shared,
            &format!("k{i}"),
            &vec![b'a' + u8::try_from(i).unwrap(); 20 << 10],
        );
    }
    let line = b"get k0 k1 k2 k3 k4 k5 k6 k7 k8 k9 nope\r\nget k9\r\nmn\r\n";
    let mut s = Session::new(Protocol::Memcache, 0);
    let (paused, _) = drain_all(&shared, &mut s, line);
    // The same requests against a session that never pauses (output far below its mark).
    let roomy = {
        let store = Store::new(StoreConfig {
            memory_bytes: 16 << 20,
            item_size_max: ITEM_MAX,
            shards: 2,
            huge_pages: false,
            external_threshold: 0,
        })
        .expect("store");
        let mut config = shared.config.clone();
        config.out_high_water = 16 << 20;
        Shared::new(store, config, Topology::default(), 1, 1, 0)
    };
    for i in 0..10 {
        set(
            &roomy,
            &format!("k{i}"),
            &vec![b'a' + u8::try_from(i).unwrap(); 20 << 10],
        );
    }
    let mut whole = Vec::new();
    let mut s2 = Session::new(Protocol::Memcache, 0);
    assert_eq!(
        s2.on_bytes(line, NOW, &roomy, None, &mut whole),
        Flow::Continue
    );
    assert!(paused == whole, "a paused get changed the reply");
    // Fed a byte at a time, with drains in between, it is still the same.
    let mut s3 = Session::new(Protocol::Memcache, 0);
    let mut bytewise = Vec::new();
    for b in line.iter() {
        bytewise.extend(drain_all(&shared, &mut s3, std::slice::from_ref(b)).0);
    }
    assert!(bytewise == whole, "byte-at-a-time reply differs");
}

#[test]
fn a_value_that_does_not_fit_the_budget_is_refused_before_it_is_read_and_swallowed() {
    let shared = shared(1 << 20);
    let vlen = 400 << 10;
    let header = format!("set a 0 0 {vlen}\r\n");
    // Two connections start 400 KiB values; the third finds no room.
    let mut sessions: Vec<Session> = (0..3)
        .map(|_| Session::new(Protocol::Memcache, 0))
        .collect();
    let mut outs = vec![Vec::new(); 3];
    for (s, out) in sessions.iter_mut().zip(outs.iter_mut()) {
        assert_eq!(
            s.on_bytes(header.as_bytes(), NOW, &shared, None, out),
            Flow::Continue
        );
    }
    assert!(outs[0].is_empty() && outs[1].is_empty());
    assert_eq!(outs[2], b"SERVER_ERROR out of memory storing object\r\n");
    assert!(shared.conn_memory.used() <= 1 << 20);
    assert_eq!(
        shared.conn_memory.used(),
        2 * (vlen + header.len() + 2 - IN_FREE)
    );
    // The refused one swallows its block and stays in step.
    let mut rest = vec![b'x'; vlen];
    rest.extend_from_slice(b"\r\nversion\r\n");
    let mut out = Vec::new();
    assert_eq!(
        sessions[2].on_bytes(&rest, NOW, &shared, None, &mut out),
        Flow::Continue
    );
    assert_eq!(out, b"VERSION 1.6.18\r\n");
    // An accepted one completes and gives its reservation back.
    out.clear();
    assert_eq!(
        sessions[0].on_bytes(&rest, NOW, &shared, None, &mut out),
        Flow::Continue
    );
    assert_eq!(out, b"STORED\r\nVERSION 1.6.18\r\n");
    assert_eq!(shared.conn_memory.used(), vlen + header.len() + 2 - IN_FREE);
    drop(sessions);
    assert_eq!(
        shared.conn_memory.used(),
        0,
        "a closed session gives everything back"
    );
    assert_eq!(shared.conn_memory.refused(), 1);
}

#[test]
fn a_set_refused_for_room_removes_the_old_value_as_memcached_does() {
    let shared = shared(768 << 10);
    set(&shared, "a", b"old");
    let mut hog = Session::new(Protocol::Memcache, 0);
    let mut out = Vec::new();
    assert_eq!(
        hog.on_bytes(b"set h 0 0 500000\r\n", NOW, &shared, None, &mut out),
        Flow::Continue
    );
    assert!(out.is_empty());
    // The line arrives before its block (as from a client writing header and value apart).
    let mut s = Session::new(Protocol::Memcache, 0);
    let (sent, _) = drain_all(&shared, &mut s, b"set a 0 0 400000\r\n");
    assert_eq!(sent, b"SERVER_ERROR out of memory storing object\r\n");
    let mut rest = vec![b'n'; 400_000];
    rest.extend_from_slice(b"\r\nget a\r\n");
    let (sent, _) = drain_all(&shared, &mut s, &rest);
    assert_eq!(
        String::from_utf8_lossy(&sent[..sent.len().min(200)]),
        "END\r\n"
    );
}

#[test]
fn a_get_line_growing_without_room_is_answered_and_closed() {
    let shared = shared(768 << 10);
    let mut hog = Session::new(Protocol::Memcache, 0);
    let mut out = Vec::new();
    assert_eq!(
        hog.on_bytes(b"set h 0 0 500000\r\n", NOW, &shared, None, &mut out),
        Flow::Continue
    );
    let mut line = b"get".to_vec();
    while line.len() < 400_000 {
        line.extend_from_slice(b" k");
    }
    let mut s = Session::new(Protocol::Memcache, 0);
    let mut flow = Flow::Continue;
    for piece in line.chunks(16 << 10) {
        flow = s.on_bytes(piece, NOW, &shared, None, &mut out);
        if flow == Flow::Close {
            break;
        }
    }
    assert_eq!(flow, Flow::Close);
    assert_eq!(out, b"SERVER_ERROR out of memory reading request\r\n");
    assert!(shared.conn_memory.used() <= 768 << 10);
}

#[test]
fn a_get_whose_values_do_not_fit_the_budget_ends_with_memcacheds_error() {
    let shared = shared(768 << 10);
    let value = vec![b'v'; 500 << 10];
    set(&shared, "b", &value);
    // Another connection holds most of the budget with a value in flight.
    let mut hog = Session::new(Protocol::Memcache, 0);
    let mut out = Vec::new();
    assert_eq!(
        hog.on_bytes(b"set h 0 0 500000\r\n", NOW, &shared, None, &mut out),
        Flow::Continue
    );
    let mut s = Session::new(Protocol::Memcache, 0);
    let (sent, _) = drain_all(&shared, &mut s, b"get b b\r\nmn\r\n");
    let text = String::from_utf8_lossy(&sent[..sent.len().min(200)]);
    assert_eq!(
        text,
        "SERVER_ERROR out of memory writing get response\r\nMN\r\n"
    );
    drop(hog);
    // With the budget free, the same request is answered; small replies never need it.
    let (sent, _) = drain_all(&shared, &mut s, b"get b b\r\n");
    assert_eq!(sent.len(), 2 * (value.len() + 20) + 5);
}
