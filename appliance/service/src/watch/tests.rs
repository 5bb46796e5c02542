//! The watch rings: lines in memcached's format, bounds, laps and lost lines.

use super::*;

const NOW: Now = Now {
    store: 10,
    unix: 1_700_000_010,
    mono_ms: 10_250,
    mono_ns: 10_250 * 1_000_000,
};

fn get_line(hub: &Hub, worker: usize, key: &[u8]) {
    hub.log(worker, WatchKinds::FETCHERS, NOW, |l| {
        item_get(l, key, true, 7, 3)
    });
}

#[test]
fn lines_have_memcacheds_shape() {
    let hub = Hub::new(2);
    let mut w = hub.join(WatchKinds(WatchKinds::FETCHERS)).expect("room");
    get_line(&hub, 0, b"a b%");
    hub.log(1, WatchKinds::MUTATIONS, NOW, |l| {
        let line = StoreLine {
            key: b"k",
            status: "stored",
            cmd: "set",
            ttl: 0,
            size: 3,
        };
        item_store(l, line, 7)
    });
    let mut out = Vec::new();
    assert!(hub.poll(&mut w, &mut out));
    assert_eq!(
        out,
        b"ts=1700000010.250000 gid=1 type=item_get key=a%20b%25 status=found clsid=1 cfd=7 size=3\n"
    );
    out.clear();
    assert!(!hub.poll(&mut w, &mut out), "the mutation is not watched");
    drop(w);
    assert!(!hub.wants(WatchKinds::FETCHERS));
}

#[test]
fn a_lapped_watcher_is_told_how_many_lines_it_lost() {
    let hub = Hub::new(1);
    let mut w = hub.join(WatchKinds(WatchKinds::FETCHERS)).expect("room");
    let extra = 300;
    for _ in 0..RING_LINES + extra {
        get_line(&hub, 0, b"k");
    }
    let mut out = Vec::new();
    while hub.poll(&mut w, &mut out) {}
    let text = String::from_utf8(out).expect("ascii");
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some(format!("skipped={extra}").as_str()));
    assert_eq!(lines.count(), RING_LINES);
}

#[test]
fn a_line_that_finds_the_ring_locked_is_lost_and_counted() {
    let hub = Hub::new(1);
    let mut w = hub.join(WatchKinds(WatchKinds::FETCHERS)).expect("room");
    {
        let _reader = hub.rings[0].lines.lock().expect("lock");
        get_line(&hub, 0, b"k"); // must not wait
    }
    get_line(&hub, 0, b"k");
    let mut out = Vec::new();
    hub.poll(&mut w, &mut out);
    let text = String::from_utf8(out).expect("ascii");
    assert!(text.starts_with("skipped=1\n"), "{text}");
    assert_eq!(text.lines().count(), 2);
}

#[test]
fn one_poll_is_bounded_and_the_rest_follows() {
    let hub = Hub::new(1);
    let mut w = hub.join(WatchKinds(WatchKinds::FETCHERS)).expect("room");
    let key = [b'k'; 250];
    for _ in 0..RING_LINES {
        get_line(&hub, 0, &key);
    }
    let mut out = Vec::new();
    hub.poll(&mut w, &mut out);
    assert!(out.len() <= POLL_BYTES + LINE_MAX, "{}", out.len());
    let first = out.len();
    out.clear();
    hub.poll(&mut w, &mut out);
    assert!(first > 0 && !out.is_empty());
}

#[test]
fn at_most_20_watchers() {
    let hub = Hub::new(1);
    let all: Vec<_> = (0..WATCHERS_MAX)
        .map(|_| hub.join(WatchKinds(1)).expect("room"))
        .collect();
    assert!(hub.join(WatchKinds(1)).is_none());
    drop(all);
    assert!(hub.join(WatchKinds(1)).is_some());
}

#[test]
fn nothing_is_kept_for_kinds_nobody_watches() {
    let hub = Hub::new(1);
    assert!(!hub.wants(WatchKinds::FETCHERS));
    let _w = hub.join(WatchKinds(WatchKinds::MUTATIONS)).expect("room");
    assert!(!hub.wants(WatchKinds::FETCHERS) && hub.wants(WatchKinds::MUTATIONS));
}

#[test]
fn evictions_go_to_the_store_ring_only_while_watched() {
    use ringstore_store::EvictionLog as _;
    let hub = Hub::new(1);
    assert!(!hub.wanted(), "nobody watches evictions");
    let mut w = hub.join(WatchKinds(WatchKinds::EVICTIONS)).expect("room");
    assert!(hub.wanted());
    let item = Evicted {
        key: b"k 1",
        fetched: true,
        ttl: None,
        idle: 3,
        size: 5,
    };
    hub.evicted(&item);
    hub.evicted(&Evicted {
        fetched: false,
        ttl: Some(9),
        ..item
    });
    let mut out = Vec::new();
    assert!(hub.poll(&mut w, &mut out));
    let text = String::from_utf8(out).expect("utf-8");
    let bodies: Vec<&str> = text
        .lines()
        .map(|l| l.split_once(" type=").expect("type").1)
        .collect();
    assert_eq!(
        bodies,
        [
            "eviction key=k%201 fetch=yes ttl=-1 la=3 clsid=1 size=5",
            "eviction key=k%201 fetch=no ttl=9 la=3 clsid=1 size=5"
        ]
    );
    assert!(text.starts_with("ts=1"), "{text}");
    let mut stamp = Vec::new();
    timestamp(&mut stamp, 1_700_000_000_008_858);
    assert_eq!(
        stamp, b"ts=1700000000.8858",
        "unpadded, as memcached's %d.%d"
    );
    drop(w);
    assert!(!hub.wanted());
}

#[test]
fn connection_lines_have_memcacheds_fields() {
    let peer: std::net::SocketAddr = "127.0.0.1:5000".parse().expect("addr");
    let mut out = Vec::new();
    conn_event(&mut out, peer, false, 4);
    conn_event(&mut out, peer, true, 4);
    assert_eq!(
        out,
        b"type=conn_new rip=127.0.0.1 rport=5000 transport=tcp cfd=4\n\
          type=conn_close rip=127.0.0.1 rport=5000 transport=tcp reason=normal cfd=4\n"
    );
}
