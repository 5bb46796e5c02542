//! Fuzzes a whole memcache session against a small real store: arbitrary bytes, delivered
//! in arbitrary chunks, never panic, and the session's buffer stays bounded.
#![no_main]

use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use ringstore_service::{Flow, Now, Protocol, ServiceConfig, Session, Shared, Topology};
use ringstore_store::{Store, StoreConfig};

fn shared() -> &'static Arc<Shared> {
    static SHARED: OnceLock<Arc<Shared>> = OnceLock::new();
    SHARED.get_or_init(|| {
        let store = Store::new(StoreConfig {
            memory_bytes: 16 << 20,
            item_size_max: 4096,
            shards: 4,
            huge_pages: false,
            external_threshold: 0,
        })
        .expect("store");
        let config = ServiceConfig {
            item_size_max: 4096,
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

fuzz_target!(|data: &[u8]| {
    let shared = shared();
    let mut session = Session::new(Protocol::Memcache, 0);
    let mut out = Vec::new();
    // The first byte picks the chunk size, the rest is the stream.
    let Some((&chunk, stream)) = data.split_first() else {
        return;
    };
    let chunk = usize::from(chunk % 64) + 1;
    let now = Now {
        store: 10,
        unix: 1_700_000_000,
        mono_ms: 0,
    };
    for piece in stream.chunks(chunk) {
        let mut flow = session.on_bytes(piece, now, shared, None, &mut out);
        let mut drains = 0;
        while flow == Flow::Drain {
            out.clear();
            drains += 1;
            assert!(drains < 100_000);
            flow = session.on_bytes(&[], now, shared, None, &mut out);
        }
        out.clear();
        if flow == Flow::Close {
            break;
        }
    }
});
