//! Shared by the session fuzz targets: one small real store, and a stream fed to a fresh
//! memcache session in chunks, played the way the runtime does (drain, send, resume).

use std::sync::{Arc, OnceLock};

use ringstore_service::{Flow, Now, Protocol, ServiceConfig, Session, Shared, Topology};
use ringstore_store::{Store, StoreConfig};

/// `item_size_max` of the store and the sessions.
pub const ITEM_MAX: usize = 4096;
/// The sessions' output high-water mark.
pub const HIGH_WATER: usize = 8192;

pub fn shared() -> &'static Arc<Shared> {
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
            out_high_water: HIGH_WATER,
            max_conns: 4,
            object_size_max: 0,
            // Small, so fuzzed inputs reach the refusals too.
            conn_memory: 1 << 20,
        };
        Shared::new(store, config, Topology::default(), 1, 1, 0)
    })
}

/// Feeds `stream` in pieces of `chunk` bytes to a fresh session; `sent` sees the output of
/// each call before it is "sent". Never more than 100 000 drains per piece.
pub fn feed(stream: &[u8], chunk: usize, mut sent: impl FnMut(&[u8])) {
    let shared = shared();
    let mut session = Session::new(Protocol::Memcache, 0);
    let mut out = Vec::new();
    let now = Now {
        store: 10,
        unix: 1_700_000_000,
        mono_ms: 0,
        mono_ns: 0,
    };
    for piece in stream.chunks(chunk) {
        let mut flow = session.on_bytes(piece, now, shared, None, &mut out);
        let mut drains = 0;
        while flow == Flow::Drain {
            sent(&out);
            out.clear();
            session.on_output_flushed();
            drains += 1;
            assert!(drains < 100_000);
            flow = session.on_bytes(&[], now, shared, None, &mut out);
        }
        sent(&out);
        out.clear();
        session.on_output_flushed();
        if flow == Flow::Close {
            break;
        }
    }
}
