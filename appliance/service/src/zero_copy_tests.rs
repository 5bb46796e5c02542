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
    mono_ns: 0,
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

/// The byte stream a client of `s` receives: `out` with each splice's value (all `v`, as
/// [`set`] writes them) where it goes out.
fn received(s: &Session, out: &[u8]) -> Vec<u8> {
    let mut stream = Vec::new();
    let mut prev = 0;
    for splice in s.splices() {
        stream.extend_from_slice(&out[prev..splice.at]);
        stream.extend(std::iter::repeat_n(b'v', splice.pin.len()));
        prev = splice.at;
    }
    stream.extend_from_slice(&out[prev..]);
    stream
}

/// Runs `input` on a zero-copy session and on a copying one: the client sees the same bytes;
/// returns the zero-copy session's splice count.
fn spliced_as_copied(shared: &Shared, input: &[u8]) -> usize {
    let mut zc = session();
    let out = run(shared, &mut zc, input);
    let mut copying = Session::new(Protocol::Memcache, 0);
    let copied = run(shared, &mut copying, input);
    assert_eq!(
        received(&zc, &out),
        copied,
        "{:?}",
        String::from_utf8_lossy(input)
    );
    let n = zc.splices().len();
    zc.release_output(shared);
    n
}

#[test]
fn mg_with_v_sends_a_big_value_from_the_item() {
    let shared = shared(256 << 10);
    set(&shared, "big", 100 << 10);
    set(&shared, "small", 100);
    assert_eq!(spliced_as_copied(&shared, b"mg big v f s c k\r\n"), 1);
    assert_eq!(
        spliced_as_copied(&shared, b"mg big v\r\nmg small v\r\nmg big v q\r\nmn\r\n"),
        2
    );
    // Without `v` there is no value to send; a miss is a miss.
    assert_eq!(
        spliced_as_copied(&shared, b"mg big s f\r\nmg nope v\r\n"),
        0
    );
    // A TTL change is a read that touches: sent from the item. A recache token is a
    // read-decide-write: copied.
    assert_eq!(spliced_as_copied(&shared, b"mg big v T30\r\n"), 1);
    assert_eq!(spliced_as_copied(&shared, b"mg big v R30\r\n"), 0);
    assert_eq!(shared.pinned_bytes(), 0);
    assert_eq!(shared.store.stats().pinned_segments, 0);
}

/// A binary request frame: `opcode` on `key`, with `extras`.
fn binary_request(opcode: u8, key: &[u8], extras: &[u8]) -> Vec<u8> {
    let mut f = vec![0x80, opcode];
    f.extend_from_slice(&u16::try_from(key.len()).unwrap().to_be_bytes());
    f.push(u8::try_from(extras.len()).unwrap());
    f.extend_from_slice(&[0, 0, 0]);
    let body = u32::try_from(extras.len() + key.len()).unwrap();
    f.extend_from_slice(&body.to_be_bytes());
    f.extend_from_slice(&[0xab, 0xcd, 0, 1]); // opaque
    f.extend_from_slice(&[0; 8]); // cas
    f.extend_from_slice(extras);
    f.extend_from_slice(key);
    f
}

#[test]
fn binary_gets_send_a_big_value_from_the_item() {
    const GET: u8 = 0x00;
    const GETQ: u8 = 0x09;
    const GETK: u8 = 0x0c;
    const TOUCH: u8 = 0x1c;
    const GAT: u8 = 0x1d;
    const NOOP: u8 = 0x0a;
    // Above the pinned bytes of one call: `run` cannot drain between requests.
    let shared = shared(64 << 20);
    set(&shared, "big", 100 << 10);
    set(&shared, "small", 100);
    let mut input = binary_request(GET, b"big", &[]);
    input.extend(binary_request(GETK, b"big", &[]));
    input.extend(binary_request(GETQ, b"small", &[]));
    input.extend(binary_request(GETQ, b"big", &[]));
    input.extend(binary_request(GAT, b"big", &600u32.to_be_bytes()));
    input.extend(binary_request(NOOP, b"", &[]));
    assert_eq!(spliced_as_copied(&shared, &input), 4);
    // A touch answers without the value; a miss has none.
    let mut input = binary_request(TOUCH, b"big", &600u32.to_be_bytes());
    input.extend(binary_request(GET, b"nope", &[]));
    assert_eq!(spliced_as_copied(&shared, &input), 0);
    assert_eq!(shared.pinned_bytes(), 0);
}
