//! Replays a memcache byte stream from stdin through one session against a fresh store and
//! writes the replies to stdout; used to compare ringstore with memcached byte for byte.

use std::io::{Read, Write};

use ringstore_service::{Flow, Now, Protocol, ServiceConfig, Session, Shared, Topology};
use ringstore_store::{Store, StoreConfig};

fn main() -> std::io::Result<()> {
    let mut input = Vec::new();
    std::io::stdin().read_to_end(&mut input)?;
    let store = Store::new(StoreConfig {
        memory_bytes: 64 << 20,
        item_size_max: 1 << 20,
        shards: 4,
        huge_pages: false,
        external_threshold: 0,
    })
    .map_err(std::io::Error::other)?;
    let shared = Shared::new(
        store,
        ServiceConfig::default(),
        Topology::default(),
        1,
        std::process::id(),
        1_700_000_000,
    );
    let now = Now {
        store: 100,
        unix: 1_700_000_100,
        mono_ms: 0,
        mono_ns: 0,
    };
    let mut session = Session::new(Protocol::Memcache, 0);
    let mut out = Vec::new();
    let mut flow = session.on_bytes(&input, now, &shared, None, &mut out);
    while flow == Flow::Drain {
        flow = session.on_bytes(&[], now, &shared, None, &mut out);
    }
    if flow == Flow::Close {
        out.extend_from_slice(b"<CLOSED>");
    }
    std::io::stdout().write_all(&out)
}
