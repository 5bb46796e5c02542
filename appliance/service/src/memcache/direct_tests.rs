//! Tests of values received into the item (`direct.rs`) at the session: however the input
//! is split, a session that receives big values into their items answers byte for byte as
//! one that buffers them, stores the same values, and gives a reservation back when its
//! connection closes mid-value.

use std::sync::Arc;

use proptest::prelude::*;
use ringstore_store::{ReadOpts, Store, StoreConfig};

use super::tests::NOW;
use crate::{Flow, Protocol, ServiceConfig, Session, Shared, Topology};

fn shared() -> Arc<Shared> {
    let store = Store::new(StoreConfig {
        memory_bytes: 16 << 20,
        item_size_max: 1 << 20,
        shards: 2,
        huge_pages: false,
        external_threshold: 0,
    })
    .expect("store");
    let config = ServiceConfig {
        item_size_max: 1 << 20,
        max_line: 2048,
        out_high_water: 1 << 20,
        max_conns: 10,
        object_size_max: 0,
        conn_memory: 64 << 20,
    };
    let topology = Topology {
        numa_node: 0,
        worker_cpus: vec![0],
        hostname: "t".into(),
    };
    Shared::with(
        store,
        config,
        topology,
        1,
        42,
        1_700_000_000,
        crate::Started::default(),
    )
}

/// A request stream with big values of every storage kind the item receives, good and bad
/// trailers, noreply, and the reads that show what was stored.
fn stream(len: usize, seed: u8) -> Vec<u8> {
    let v = |s: u8| -> Vec<u8> {
        (0..len)
            .map(|i| i.to_le_bytes()[0].wrapping_mul(13) ^ s)
            .collect()
    };
    let mut all = Vec::new();
    let mut req = |line: String, value: Vec<u8>, trailer: &[u8]| {
        all.extend_from_slice(line.as_bytes());
        all.extend_from_slice(&value);
        all.extend_from_slice(trailer);
    };
    req(format!("set a 1 0 {len}\r\n"), v(seed), b"\r\n");
    req(format!("add a 0 0 {len}\r\n"), v(seed ^ 1), b"\r\n");
    req(format!("add b 2 0 {len}\r\n"), v(seed ^ 2), b"\r\n");
    req(format!("replace c 0 0 {len}\r\n"), v(seed ^ 3), b"\r\n");
    req(
        format!("replace b 3 0 {len} noreply\r\n"),
        v(seed ^ 4),
        b"\r\n",
    );
    req(format!("cas a 0 0 {len} 12345\r\n"), v(seed ^ 5), b"\r\n");
    req(format!("set bad 0 0 {len}\r\n"), v(seed ^ 6), b"XY\r\n");
    req(format!("append a 0 0 {len}\r\n"), v(seed ^ 7), b"\r\n");
    req("get a b c bad\r\n".into(), Vec::new(), b"");
    // Meta sets: the modes and flags a value received into its item takes (S, E, R, C,
    // q, k, O, c, b, T, F) and those it leaves buffered (I, A, P).
    req(format!("ms ma {len} T0 F5\r\n"), v(seed ^ 8), b"\r\n");
    req(format!("ms ma {len} c k O9\r\n"), v(seed ^ 9), b"\r\n");
    req(format!("ms ma {len} ME\r\n"), v(seed ^ 10), b"\r\n");
    req(format!("ms mb {len} MR q\r\n"), v(seed ^ 11), b"\r\n");
    req(format!("ms bWM= {len} b ME k c\r\n"), v(seed ^ 12), b"\r\n");
    req(format!("ms ma {len} C1\r\n"), v(seed ^ 13), b"\r\n");
    req(format!("ms mz {len} C1 q\r\n"), v(seed ^ 14), b"\r\n");
    req(format!("ms ma {len} I C1 c\r\n"), v(seed ^ 15), b"\r\n");
    req(format!("ms mc {len} MA\r\n"), v(seed ^ 16), b"\r\n");
    req(format!("ms mbad {len}\r\n"), v(seed ^ 17), b"XY\r\n");
    req(format!("ms mt {len} T-1\r\n"), v(seed ^ 18), b"\r\n");
    req(format!("ms mq {len} q\r\n"), v(seed ^ 19), b"\r\n");
    let reads = "mg ma v c f t\r\nmg mc v\r\nmg mbad v\r\nmg mt v\r\nmg mq v\r\nmn\r\n";
    req(reads.into(), Vec::new(), b"");
    all
}

/// A binary request: `opcode`, `key`, `extras`, `value`, `cas`, and opaque `opaque`.
fn binary(opcode: u8, key: &[u8], extras: &[u8], value: &[u8], cas: u64) -> Vec<u8> {
    let body = u32::try_from(extras.len() + key.len() + value.len()).expect("a test value");
    let mut r = vec![0x80, opcode];
    r.extend_from_slice(&u16::try_from(key.len()).expect("a test key").to_be_bytes());
    r.extend_from_slice(&[u8::try_from(extras.len()).expect("8 or 0"), 0, 0, 0]);
    r.extend_from_slice(&body.to_be_bytes());
    r.extend_from_slice(&u32::from(opcode).to_be_bytes());
    r.extend_from_slice(&cas.to_be_bytes());
    r.extend_from_slice(extras);
    r.extend_from_slice(key);
    r.extend_from_slice(value);
    r
}

/// A binary request stream with big values for SET, ADD, REPLACE and their quiet forms,
/// with and without a CAS, an APPEND (buffered), and the GETs that show what was stored.
fn binary_stream(len: usize, seed: u8) -> Vec<u8> {
    let v = |s: u8| -> Vec<u8> {
        (0..len)
            .map(|i| i.to_le_bytes()[0].wrapping_mul(7) ^ s)
            .collect()
    };
    let extras = |flags: u32| {
        let mut e = flags.to_be_bytes().to_vec();
        e.extend_from_slice(&0u32.to_be_bytes());
        e
    };
    let (set, add, replace, append, setq, get) = (0x01, 0x02, 0x03, 0x0e, 0x11, 0x00);
    let mut all = Vec::new();
    all.extend(binary(set, b"a", &extras(1), &v(seed), 0));
    all.extend(binary(add, b"a", &extras(2), &v(seed ^ 1), 0));
    all.extend(binary(add, b"b", &extras(3), &v(seed ^ 2), 0));
    all.extend(binary(replace, b"c", &extras(4), &v(seed ^ 3), 0));
    all.extend(binary(setq, b"b", &extras(5), &v(seed ^ 4), 0));
    all.extend(binary(set, b"a", &extras(6), &v(seed ^ 5), 99_999));
    all.extend(binary(replace, b"a", &extras(7), &v(seed ^ 6), 1));
    all.extend(binary(append, b"b", &[], &v(seed ^ 7), 0));
    for key in [&b"a"[..], b"b", b"c"] {
        all.extend(binary(get, key, &[], &[], 0));
    }
    all
}

/// Feeds `input` cut at `cuts` to `session`; returns the output.
fn run(shared: &Shared, mut session: Session, input: &[u8], cuts: &[usize]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut at = 0;
    for &cut in cuts.iter().chain(std::iter::once(&input.len())) {
        let cut = cut.clamp(at, input.len());
        let mut flow = session.on_bytes(&input[at..cut], NOW, shared, None, &mut out);
        while flow == Flow::Drain {
            flow = session.on_bytes(&[], NOW, shared, None, &mut out);
        }
        assert_ne!(flow, Flow::Close);
        at = cut;
    }
    session.on_close(shared, None);
    out
}

/// `input` cut at `cuts` (taken modulo its length) gets the same answers and leaves the same
/// items from a session that receives values into their items as from one that buffers
/// them, and no reservation behind.
fn answers_as_buffered(input: &[u8], mut cuts: Vec<usize>) -> Result<(), TestCaseError> {
    cuts.iter_mut().for_each(|c| *c %= input.len());
    cuts.sort_unstable();
    let theirs = shared();
    let buffered = run(&theirs, Session::new(Protocol::Memcache, 0), input, &cuts);
    let ours = shared();
    let direct = run(
        &ours,
        Session::for_connection(Protocol::Memcache, 0, &ours),
        input,
        &cuts,
    );
    prop_assert_eq!(&direct, &buffered);
    prop_assert_eq!(ours.store.stats().pinned_segments, 0);
    prop_assert_eq!(
        ours.store.stats().curr_items,
        theirs.store.stats().curr_items
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn a_session_receiving_into_items_answers_as_one_that_buffers(
        len in prop::sample::select(vec![4096usize, 4097, 9000, 70_000]),
        seed in any::<u8>(),
        cuts in prop::collection::vec(0usize..700_000, 0..24),
    ) {
        answers_as_buffered(&stream(len, seed), cuts)?;
    }

    #[test]
    fn a_binary_session_receiving_into_items_answers_as_one_that_buffers(
        len in prop::sample::select(vec![4096usize, 4097, 9000, 70_000]),
        seed in any::<u8>(),
        cuts in prop::collection::vec(0usize..700_000, 0..24),
    ) {
        answers_as_buffered(&binary_stream(len, seed), cuts)?;
    }
}

/// A binary value received into its item whole has the session called again to answer it
/// (nothing follows a binary value to bring it in).
#[test]
fn a_binary_value_made_whole_by_a_receive_is_answered_at_once() {
    let shared = shared();
    let mut s = Session::for_connection(Protocol::Memcache, 0, &shared);
    let mut out = Vec::new();
    let request = binary(0x01, b"k", &[0; 8], &[9u8; 5000], 0);
    let head = 24 + 8 + 1;
    s.on_bytes(&request[..head + 10], NOW, &shared, None, &mut out);
    let (_, left) = s.recv_target().expect("the value goes into its item");
    assert_eq!(left, 4990);
    assert_eq!(s.received_into(100, &shared), Flow::Continue);
    // The bytes themselves are the runtime's to write (this crate has no unsafe code): the
    // test checks that the count makes the request whole and answered, not what it stored.
    assert_eq!(
        s.received_into(4890, &shared),
        Flow::Drain,
        "whole: answer now"
    );
    assert!(out.is_empty());
    assert_eq!(
        s.on_bytes(&[], NOW, &shared, None, &mut out),
        Flow::Continue
    );
    assert_eq!(&out[..2], &[0x81, 0x01], "a SET response");
    assert_eq!(&out[6..8], &[0, 0], "stored");
    let len = shared
        .store
        .get(b"k", NOW.store, ReadOpts::default(), |it| {
            it.map(|it| it.value.len())
        });
    assert_eq!(len, Some(5000));
    assert_eq!(shared.store.stats().pinned_segments, 0);
}

#[test]
fn a_value_under_way_is_reserved_and_a_close_gives_it_back() {
    let shared = shared();
    let mut s = Session::for_connection(Protocol::Memcache, 0, &shared);
    let mut out = Vec::new();
    let head = b"set k 0 0 5000\r\n";
    assert_eq!(
        s.on_bytes(head, NOW, &shared, None, &mut out),
        Flow::Continue
    );
    let (_, left) = s.recv_target().expect("the value goes into its item");
    assert_eq!(left, 5000);
    assert!(s.has_partial_request(), "the request timeout runs");
    s.on_bytes(&[7u8; 1000], NOW, &shared, None, &mut out);
    assert_eq!(s.recv_target().map(|t| t.1), Some(4000));
    s.received_into(4000, &shared);
    assert!(
        s.recv_target().is_none(),
        "the value is whole; the trailer comes as input"
    );
    assert!(s.has_partial_request());
    assert_eq!(shared.store.stats().pinned_segments, 1);
    s.on_close(&shared, None);
    assert!(out.is_empty());
    let st = shared.store.stats();
    assert_eq!((st.pinned_segments, st.curr_items), (0, 0));
    let found = shared
        .store
        .get(b"k", NOW.store, ReadOpts::default(), |it| it.is_some());
    assert!(!found, "a value never completed is never seen");
}

#[test]
fn an_ms_value_under_way_is_reserved_and_a_close_gives_it_back() {
    let shared = shared();
    let mut s = Session::for_connection(Protocol::Memcache, 0, &shared);
    let mut out = Vec::new();
    s.on_bytes(b"ms k 5000 T0 c\r\nab", NOW, &shared, None, &mut out);
    assert_eq!(s.recv_target().map(|t| t.1), Some(4998));
    assert_eq!(shared.store.stats().pinned_segments, 1);
    s.on_close(&shared, None);
    let st = shared.store.stats();
    assert_eq!((st.pinned_segments, st.curr_items), (0, 0));
    for buffered in [
        &b"ms k 5000 MA\r\n"[..],
        b"ms k 5000 MP\r\n",
        b"ms k 5000 I\r\n",
    ] {
        let mut s = Session::for_connection(Protocol::Memcache, 0, &shared);
        s.on_bytes(buffered, NOW, &shared, None, &mut out);
        assert!(s.recv_target().is_none(), "{buffered:?} went into an item");
    }
}

#[test]
fn values_under_the_threshold_are_buffered() {
    let shared = shared();
    let mut s = Session::for_connection(Protocol::Memcache, 0, &shared);
    let mut out = Vec::new();
    s.on_bytes(b"set k 0 0 4095\r\nab", NOW, &shared, None, &mut out);
    assert!(s.recv_target().is_none());
    assert_eq!(shared.store.stats().pinned_segments, 0);
}

/// An HTTP PUT body below the item limit is received into its item too: reserved once the
/// head is read, answered when the receive completes it, given back at a close mid-body.
#[test]
fn an_http_put_body_goes_into_its_item_and_a_close_gives_it_back() {
    let shared = shared();
    let mut s = Session::for_connection(Protocol::Http, 0, &shared);
    let mut out = Vec::new();
    let head = b"PUT /k HTTP/1.1\r\nHost: h\r\nContent-Length: 6000\r\n\r\nabc";
    assert_eq!(
        s.on_bytes(head, NOW, &shared, None, &mut out),
        Flow::Continue
    );
    assert_eq!(s.recv_target().map(|t| t.1), Some(5997));
    assert!(s.has_partial_request(), "the request timeout runs");
    assert_eq!(shared.store.stats().pinned_segments, 1);
    s.on_bytes(&[1u8; 997], NOW, &shared, None, &mut out);
    assert_eq!(s.recv_target().map(|t| t.1), Some(5000));
    assert_eq!(
        s.received_into(5000, &shared),
        Flow::Drain,
        "whole: answer now"
    );
    assert_eq!(
        s.on_bytes(&[], NOW, &shared, None, &mut out),
        Flow::Continue
    );
    assert!(
        out.starts_with(b"HTTP/1.1 201 "),
        "{}",
        String::from_utf8_lossy(&out)
    );
    let len = shared
        .store
        .get(b"k", NOW.store, ReadOpts::default(), |it| {
            it.map(|it| it.value.len())
        });
    assert_eq!(len, Some(6000));
    let st = shared.store.stats();
    assert_eq!((st.pinned_segments, st.curr_items), (0, 1));
    let mut s = Session::for_connection(Protocol::Http, 0, &shared);
    s.on_bytes(head, NOW, &shared, None, &mut out);
    assert!(s.recv_target().is_some());
    s.on_close(&shared, None);
    let st = shared.store.stats();
    assert_eq!(
        (st.pinned_segments, st.curr_items),
        (0, 1),
        "abandoned, the old one kept"
    );
}
