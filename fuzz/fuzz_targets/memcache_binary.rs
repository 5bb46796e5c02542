//! Fuzzes the memcache binary protocol: the parser on arbitrary bytes (never panics, never
//! claims more than it was given, never asks to buffer more than its bound), and a whole
//! binary session against a small real store, fed in arbitrary chunks.
#![no_main]

use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use ringstore_proto::memcache::binary::{max_buffered, parse, Parse, Request, HEADER_LEN};
use ringstore_proto::memcache::{Limits, KEY_LEN_MAX};
use ringstore_service::{Flow, Now, Protocol, ServiceConfig, Session, Shared, Topology};
use ringstore_store::{Store, StoreConfig};

const ITEM_MAX: usize = 4096;

fn shared() -> &'static Arc<Shared> {
    static SHARED: OnceLock<Arc<Shared>> = OnceLock::new();
    SHARED.get_or_init(|| {
        let store = Store::new(StoreConfig {
            memory_bytes: 16 << 20,
            item_size_max: ITEM_MAX,
            shards: 4,
            huge_pages: false,
            external_threshold: 0,
        })
        .expect("store");
        let config = ServiceConfig {
            item_size_max: ITEM_MAX,
            max_line: 512,
            out_high_water: 8192,
            max_conns: 4,
            object_size_max: 0,
            // Small, so fuzzed inputs reach the refusals too.
            conn_memory: 1 << 20,
        };
        Shared::new(store, config, Topology::default(), 1, 1, 0)
    })
}

fn check_parser(data: &[u8]) {
    let limits = Limits {
        item_size_max: ITEM_MAX,
        max_line: 512,
    };
    let bound = max_buffered(&limits);
    let mut rest = data;
    // Each step consumes at least a header, so this ends.
    loop {
        match parse(rest, &limits) {
            Parse::Incomplete => {
                assert!(rest.len() < bound);
                break;
            }
            Parse::AwaitingValue {
                request_len,
                head_len,
                ..
            } => {
                assert!(head_len <= rest.len() && rest.len() < request_len);
                assert!(request_len <= bound);
                break;
            }
            Parse::Close => break,
            Parse::Done {
                request, consumed, ..
            } => {
                assert!(consumed >= HEADER_LEN && consumed <= rest.len());
                match request {
                    Request::Get(g) => assert!(!g.key.is_empty() && g.key.len() <= KEY_LEN_MAX),
                    Request::Store(s) => assert!(s.data.len() <= ITEM_MAX),
                    Request::TooLarge { swallow, .. } => assert!(swallow > ITEM_MAX),
                    _ => {}
                }
                rest = &rest[consumed..];
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    check_parser(data);
    // The first byte picks the chunk size; a noop first makes the session speak binary.
    let Some((&chunk, stream)) = data.split_first() else {
        return;
    };
    let chunk = usize::from(chunk % 64) + 1;
    let mut noop = [0u8; HEADER_LEN];
    noop[0] = 0x80;
    noop[1] = 0x0a;
    let input: Vec<u8> = noop.iter().chain(stream).copied().collect();
    let shared = shared();
    let mut session = Session::new(Protocol::Memcache, 0);
    let mut out = Vec::new();
    let now = Now {
        store: 10,
        unix: 1_700_000_000,
        mono_ms: 0,
    };
    for piece in input.chunks(chunk) {
        let mut flow = session.on_bytes(piece, now, shared, None, &mut out);
        let mut drains = 0;
        while flow == Flow::Drain {
            assert!(out.len() <= 8192 + ITEM_MAX + 512);
            out.clear();
            session.on_output_flushed();
            drains += 1;
            assert!(drains < 100_000);
            flow = session.on_bytes(&[], now, shared, None, &mut out);
        }
        assert!(out.is_empty() || out[0] == 0x81, "binary replies only");
        out.clear();
        session.on_output_flushed();
        if flow == Flow::Close {
            break;
        }
    }
});
