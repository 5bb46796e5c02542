//! Session tests against the real store: the object API end to end, TTLs, flags, CAS tags.

use ringstore_store::{Store, StoreConfig, Write, NEVER};

use super::*;

const NOW: Now = Now {
    store: 100,
    unix: 1_700_000_000,
    mono_ms: 0,
    mono_ns: 0,
};

fn store() -> Store {
    Store::new(StoreConfig {
        memory_bytes: 16 << 20,
        item_size_max: 1 << 20,
        shards: 2,
        huge_pages: false,
        external_threshold: 0,
    })
    .unwrap()
}

fn backend(store: &Store) -> StoreBackend<'_> {
    StoreBackend {
        store,
        stats: None,
        item_size_max: 1 << 20,
        out_high_water: 1 << 20,
        object_size_max: 0,
        conn_memory: None,
        device: None,
        auth: None,
        uploads: None,
        shared: None,
    }
}

fn run_at(store: &Store, now: Now, input: &[u8]) -> (String, Flow) {
    let mut session = HttpSession::new(0);
    let mut out = Vec::new();
    let flow = session.on_bytes_with(input, now, &backend(store), &mut out);
    (String::from_utf8_lossy(&out).into_owned(), flow)
}

fn run(store: &Store, input: &[u8]) -> (String, Flow) {
    run_at(store, NOW, input)
}

fn item(store: &Store, key: &[u8]) -> Option<(Vec<u8>, u32, u32, u64)> {
    store.get(key, NOW.store, Default::default(), |it| {
        it.map(|it| (it.value.to_vec(), it.flags, it.exptime, it.cas))
    })
}

#[test]
fn put_then_get_through_the_store() {
    let s = store();
    let (out, flow) = run(
        &s,
        b"PUT /obj HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nX-Flags: 3\r\nX-TTL: 60\r\n\r\nhello",
    );
    let (_, flags, exptime, cas) = item(&s, b"obj").expect("stored");
    assert_eq!((flags, exptime), (3, 160));
    assert_eq!(
        (out, flow),
        (format!("HTTP/1.1 201 Created\r\nServer: ringstore\r\nContent-Length: 0\r\nETag: \"{cas}\"\r\n\r\n"), Flow::Continue)
    );

    let (out, _) = run(
        &s,
        b"PUT /obj HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nCache-Control: max-age=0\r\n\r\nbye",
    );
    let (value, flags, exptime, cas2) = item(&s, b"obj").expect("replaced");
    assert_eq!((value.as_slice(), flags, exptime), (&b"bye"[..], 0, NEVER));
    assert_ne!(cas, cas2);
    assert_eq!(
        out,
        format!("HTTP/1.1 204 No Content\r\nServer: ringstore\r\nETag: \"{cas2}\"\r\n\r\n")
    );

    let (out, _) = run(
        &s,
        b"GET /obj HTTP/1.1\r\nHost: h\r\n\r\nGET /obj HTTP/1.1\r\nHost: h\r\nRange: bytes=-1\r\n\r\n",
    );
    assert_eq!(
        out,
        format!(
            "HTTP/1.1 200 OK\r\nServer: ringstore\r\nContent-Length: 3\r\nETag: \"{cas2}\"\r\nX-Flags: 0\r\n\r\nbye\
             HTTP/1.1 206 Partial Content\r\nServer: ringstore\r\nContent-Length: 1\r\nETag: \"{cas2}\"\r\nX-Flags: 0\r\nContent-Range: bytes 2-2/3\r\n\r\ne"
        )
    );
}

#[test]
fn memcache_written_items_read_over_http() {
    let s = store();
    let cas = s
        .update(b"mc", NOW.store, |_| {
            (
                Write::Put {
                    value: b"v\r\nx",
                    meta: ringstore_store::NewMeta {
                        flags: 99,
                        exptime: NEVER,
                        cas: None,
                    },
                },
                (),
            )
        })
        .unwrap()
        .cas
        .unwrap();
    let (out, _) = run(&s, b"GET /mc HTTP/1.1\r\nHost: h\r\n\r\n");
    assert_eq!(out, format!("HTTP/1.1 200 OK\r\nServer: ringstore\r\nContent-Length: 4\r\nETag: \"{cas}\"\r\nX-Flags: 99\r\n\r\nv\r\nx"));
}

#[test]
fn delete_and_expiry() {
    let s = store();
    run(
        &s,
        b"PUT /t HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\nX-TTL: 10\r\n\r\nx",
    );
    assert!(run_at(
        &s,
        Now { store: 109, ..NOW },
        b"GET /t HTTP/1.1\r\nHost: h\r\n\r\n"
    )
    .0
    .starts_with("HTTP/1.1 200 OK"));
    assert!(run_at(
        &s,
        Now { store: 111, ..NOW },
        b"GET /t HTTP/1.1\r\nHost: h\r\n\r\n"
    )
    .0
    .starts_with("HTTP/1.1 404 "));

    run(
        &s,
        b"PUT /d HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\n\r\nx",
    );
    let (out, _) = run(
        &s,
        b"DELETE /d HTTP/1.1\r\nHost: h\r\n\r\nDELETE /d HTTP/1.1\r\nHost: h\r\n\r\n",
    );
    assert_eq!(out, "HTTP/1.1 204 No Content\r\nServer: ringstore\r\n\r\nHTTP/1.1 404 Not Found\r\nServer: ringstore\r\nContent-Length: 0\r\n\r\n");
    assert_eq!(item(&s, b"d"), None);

    // A negative TTL stores nothing and removes what was there.
    run(
        &s,
        b"PUT /n HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\n\r\nx",
    );
    let (out, _) = run(
        &s,
        b"PUT /n HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\nX-TTL: -1\r\n\r\ny",
    );
    assert_eq!(out, "HTTP/1.1 204 No Content\r\nServer: ringstore\r\n\r\n");
    assert_eq!(item(&s, b"n"), None);
}

#[test]
fn large_bodies_in_pieces() {
    let s = store();
    let value: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 251) as u8).collect();
    let mut input = format!(
        "PUT /big HTTP/1.1\r\nHost: h\r\nContent-Length: {}\r\n\r\n",
        value.len()
    )
    .into_bytes();
    input.extend_from_slice(&value);
    input.extend_from_slice(b"GET /big HTTP/1.1\r\nHost: h\r\nRange: bytes=1000-1003\r\n\r\n");
    let mut session = HttpSession::new(0);
    let mut out = Vec::new();
    for piece in input.chunks(64 * 1024 - 3) {
        assert_eq!(
            session.on_bytes_with(piece, NOW, &backend(&s), &mut out),
            Flow::Continue
        );
    }
    assert_eq!(item(&s, b"big").map(|it| it.0), Some(value.clone()));
    assert!(out.ends_with(&value[1000..1004]));
    assert!(!session.has_partial_request());

    let too_big = format!(
        "PUT /big HTTP/1.1\r\nHost: h\r\nContent-Length: {}\r\n\r\n",
        (1 << 20) + 1
    );
    assert_eq!(run(&s, too_big.as_bytes()).1, Flow::Close);
}

#[test]
fn shared_path_counts_requests() {
    let shared = crate::Shared::new(
        store(),
        crate::ServiceConfig::default(),
        crate::Topology::default(),
        2,
        1,
        0,
    );
    let mut session = HttpSession::new(1);
    let mut out = Vec::new();
    let input = b"PUT /c HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\n\r\nxGET /c HTTP/1.1\r\nHost: h\r\n\r\nGET /d HTTP/1.1\r\nHost: h\r\n\r\nDELETE /d HTTP/1.1\r\nHost: h\r\n\r\nGET / HTTP/1.1\r\nHost: h\r\n\r\n";
    assert_eq!(
        session.on_bytes(input, NOW, &shared, None, &mut out),
        Flow::Close
    );
    let stats = shared.stats(1);
    let counts = [
        stats.cmd_set.get(),
        stats.cmd_get.get(),
        stats.get_hits.get(),
        stats.get_misses.get(),
        stats.delete_misses.get(),
        stats.http_requests.get(),
        stats.http_responses_4xx.get(),
    ];
    assert_eq!(counts, [1, 2, 1, 1, 1, 5, 3]);
    assert_eq!(
        (stats.bytes_read.get(), stats.bytes_written.get()),
        (input.len() as u64, out.len() as u64)
    );
    assert_eq!(shared.stats(0).cmd_get.get(), 0);
}
