//! Session tests of the memcached 1.6 details issue 13 adds: `ms I` storing a stale value,
//! the `E` flag refused as 1.6.18 refuses it, the key dump and its streaming, `shutdown`,
//! `refresh_certs`' limits, and the counters memcached has. Expected bytes were taken from
//! memcached 1.6.18 for the same input where it has the feature (CAS uniques are
//! ringstore's own: a fresh store counts from 1).

use std::collections::HashMap;

use super::tests::{check, feed, shared, shared_started, NOW};
use crate::{Flow, Now, Protocol, ServiceConfig, Session, Shared, Topology};
use ringstore_store::{Store, StoreConfig};

#[test]
fn ms_invalidate_with_an_older_cas_stores_the_value_stale() {
    // memcached 1.6.18: the value is replaced, the TTL and the win-token mark are kept,
    // the item is stale (X), and the next mg sees the token already sent (Z).
    check(
        b"set k 0 0 1\r\na\r\nmd k I T30\r\nmg k v c\r\nms k 1 I T90 C1\r\nb\r\nmg k v c t\r\n",
        b"STORED\r\nHD\r\nVA 1 c2 X W\r\na\r\nHD\r\nVA 1 c3 t30 Z X\r\nb\r\n",
    );
    // Not stale before: the new value is, and the first mg wins the token.
    check(
        b"set j 0 0 1\r\na\r\nset j 0 0 1\r\na\r\nms j 1 I C1\r\nx\r\nmg j v c\r\nmg j v\r\n",
        b"STORED\r\nSTORED\r\nHD\r\nVA 1 c3 X W\r\nx\r\nVA 1 Z X\r\nx\r\n",
    );
    // A CAS of 0 or newer than the item's, or no item: as without I.
    check(
        b"set k 0 0 1\r\na\r\nms k 1 I C0\r\nb\r\nms k 1 I C9\r\nb\r\nms n 1 I C1\r\nb\r\nmg k v\r\n",
        b"STORED\r\nEX\r\nEX\r\nNF\r\nVA 1\r\na\r\n",
    );
    // The matching CAS is a plain CAS store: not stale.
    check(
        b"set k 0 0 1\r\na\r\nms k 1 I C1\r\nb\r\nmg k v c\r\n",
        b"STORED\r\nHD\r\nVA 1 c2\r\nb\r\n",
    );
}

#[test]
fn explicit_cas_is_an_invalid_flag_as_in_memcached_1_6_18() {
    // `E` came with 1.6.21; ringstore reports 1.6.18, so every meta command refuses it as
    // 1.6.18 does (ms swallows its data block), and nothing is written.
    check(
        b"mg q N30 E77 c v\r\nma q N0 J5 E88 c v\r\nset d 0 0 1\r\nx\r\nmd d I E55\r\nmg d c\r\n",
        b"CLIENT_ERROR invalid flag\r\nCLIENT_ERROR invalid or duplicate flag\r\nSTORED\r\n\
CLIENT_ERROR invalid or duplicate flag\r\nHD c1\r\n",
    );
    check(
        b"ms a 1 E40\r\nx\r\nmg a c v\r\nmg q v\r\n",
        b"CLIENT_ERROR invalid flag\r\nEN\r\nEN\r\n",
    );
}

#[test]
fn admin_commands_answer_as_memcached() {
    check(
        b"shutdown\r\nshutdown graceful\r\n",
        b"ERROR: shutdown not enabled\r\nERROR: shutdown not enabled\r\n",
    );
    check(
        b"lru_crawler metadump 2\r\nlru_crawler metadump 0\r\nlru_crawler crawl all\r\n",
        b"END\r\nBADCLASS invalid class id\r\nOK\r\n",
    );
    // memcached 1.6.18's lines for the same items (its CAS uniques differ).
    check(
        b"set a 5 0 3\r\nabc\r\nset b 0 100 1\r\nx\r\nget a\r\nlru_crawler metadump 1\r\n",
        b"STORED\r\nSTORED\r\nVALUE a 5 3\r\nabc\r\nEND\r\n\
key=a exp=-1 la=1700000100 cas=1 fetch=yes cls=1 size=67\n\
key=b exp=1700000200 la=1700000100 cas=2 fetch=no cls=1 size=61\nEND\r\n",
    );
    check(
        b"set b 0 100 1\r\nx\r\nstats cachedump 1 0\r\nstats cachedump 2 0\r\n",
        b"STORED\r\nITEM b [1 b; 1700000200 s]\r\nEND\r\nEND\r\n",
    );
    check(
        b"ms AAEC 1 b\r\ny\r\nset k%20 0 0 1\r\nz\r\nlru_crawler metadump hash\r\n",
        b"HD\r\nSTORED\r\n\
key=%00%01%02 exp=-1 la=1700000100 cas=1 fetch=no cls=1 size=63\n\
key=k%2520 exp=-1 la=1700000100 cas=2 fetch=no cls=1 size=64\nEND\r\n",
    );
}

#[test]
fn mgdump_lists_mg_lines_then_en() {
    // memcached 1.6.19's format; a key a text command cannot carry comes base64-encoded.
    check(
        b"ms AAEC 1 b\r\ny\r\nset k1 0 0 1\r\nz\r\nlru_crawler mgdump all\r\nlru_crawler mgdump 2\r\n",
        b"HD\r\nSTORED\r\nmg AAEC b\r\nmg k1\r\nEN\r\nEN\r\n",
    );
}

fn small_high_water() -> std::sync::Arc<Shared> {
    let store = Store::new(StoreConfig {
        memory_bytes: 16 << 20,
        item_size_max: 1024,
        shards: 4,
        huge_pages: false,
        external_threshold: 0,
    })
    .expect("store");
    let config = ServiceConfig {
        out_high_water: 4096,
        ..ServiceConfig::default()
    };
    Shared::new(store, config, Topology::default(), 1, 1, 1_700_000_000)
}

#[test]
fn the_key_dump_is_produced_as_the_client_drains_it() {
    let shared = small_high_water();
    let mut load = Vec::new();
    for i in 0..3000 {
        load.extend_from_slice(format!("set key{i} 0 0 1 noreply\r\nv\r\n").as_bytes());
    }
    let (out, _) = feed(&shared, &[&load]);
    assert!(out.is_empty());
    let mut s = Session::new(Protocol::Memcache, 0);
    let mut out = Vec::new();
    let mut all = Vec::new();
    let mut flow = s.on_bytes(
        b"lru_crawler metadump all\r\nstats cachedump 1 5\r\nmn\r\n",
        NOW,
        &shared,
        None,
        &mut out,
    );
    let mut calls = 1;
    while flow == Flow::Drain {
        // Each call stops soon after the high-water mark: one step of lines past it.
        assert!(
            out.len() <= 4096 + super::dump::STEP_ITEMS * 900,
            "{}",
            out.len()
        );
        assert!(
            !s.has_partial_request(),
            "a paused dump is not a slow request"
        );
        all.append(&mut out);
        flow = s.on_bytes(&[], NOW, &shared, None, &mut out);
        calls += 1;
    }
    all.append(&mut out);
    assert_eq!(flow, Flow::Continue);
    assert!(calls > 20, "{calls} calls");
    let text = String::from_utf8(all).expect("text");
    let (dump, rest) = text.split_once("END\r\n").expect("END");
    let mut seen = HashMap::new();
    for line in dump.lines() {
        let key = line.strip_prefix("key=").expect("line").split(' ').next();
        let key = key.expect("key");
        // memcached's item size: 48-byte header, key and NUL, value and CRLF, 8-byte CAS.
        let size = 48 + key.len() + 1 + 1 + 2 + 8;
        assert!(
            line.ends_with(&format!(" fetch=no cls=1 size={size}")),
            "{line}"
        );
        *seen.entry(key.to_string()).or_insert(0) += 1;
    }
    assert_eq!(seen.len(), 3000);
    assert!(seen.values().all(|&n| n == 1));
    let (cachedump, rest) = rest.split_once("END\r\n").expect("END");
    assert_eq!(cachedump.lines().count(), 5);
    assert_eq!(rest, "MN\r\n");
    assert!(shared.totals().conn_yields >= 20);
}

/// One stats value from a `stats` reply.
fn stat(out: &[u8], name: &str) -> String {
    let text = String::from_utf8_lossy(out);
    let prefix = format!("STAT {name} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix).map(str::to_string))
        .unwrap_or_else(|| panic!("no {name} in {text}"))
}

#[test]
fn counters_memcached_has() {
    let shared = shared();
    let mut s = Session::new(Protocol::Memcache, 0);
    let mut out = Vec::new();
    let at = |secs: u32| Now {
        store: NOW.store + secs,
        unix: NOW.unix + u64::from(secs),
        ..NOW
    };
    let input: &[u8] = b"set e 0 1 1\r\na\r\nset f 0 0 1\r\nb\r\nset big 0 0 2000\r\n";
    s.on_bytes(input, NOW, &shared, None, &mut out);
    s.on_bytes(&[b'x'; 2002], NOW, &shared, None, &mut out);
    let input: &[u8] = b"get e\r\nflush_all\r\nget f\r\nget f\r\nme f\r\nstats\r\n";
    out.clear();
    s.on_bytes(input, at(5), &shared, None, &mut out);
    assert_eq!(stat(&out, "get_expired"), "1");
    assert_eq!(stat(&out, "get_flushed"), "1");
    assert_eq!(stat(&out, "get_misses"), "3");
    assert_eq!(stat(&out, "store_too_large"), "1");
    assert_eq!(stat(&out, "store_no_memory"), "0");
    assert_eq!(stat(&out, "cmd_meta"), "1");
    assert_eq!(stat(&out, "accepting_conns"), "1");
    assert_eq!(stat(&out, "listen_disabled_num"), "0");
    assert_eq!(
        stat(&out, "rusage_user"),
        "0.000000",
        "no runtime: no rusage"
    );
    out.clear();
    s.on_bytes(b"stats reset\r\nstats\r\n", at(5), &shared, None, &mut out);
    assert_eq!(stat(&out, "get_expired"), "0");
    assert_eq!(stat(&out, "get_flushed"), "0");
    let timed = shared_started(crate::Started {
        rusage: Some(|| (1_500_002, 3)),
        ..crate::Started::default()
    });
    out.clear();
    s.on_bytes(b"stats\r\n", at(5), &timed, None, &mut out);
    assert_eq!(stat(&out, "rusage_user"), "1.500002");
    assert_eq!(stat(&out, "rusage_system"), "0.000003");
    out.clear();
    s.on_bytes(b"stats settings\r\n", at(5), &shared, None, &mut out);
    assert_eq!(stat(&out, "shutdown_command"), "no");
    assert_eq!(stat(&out, "dump_enabled"), "yes");
    assert_eq!(stat(&out, "domain_socket"), "NULL");
    assert_eq!(stat(&out, "ssl_enabled"), "no");
    assert_eq!(stat(&out, "auth_enabled_ascii"), "no");
    assert_eq!(stat(&out, "auth_enabled_sasl"), "no");
    // Without TLS, memcached (built with TLS) still lists its TLS settings, unset.
    assert_eq!(stat(&out, "ssl_chain_cert"), "(null)");
    assert_eq!(stat(&out, "ssl_ca_cert"), "NULL");
    assert_eq!(stat(&out, "ssl_session_cache"), "no");
    assert_eq!(stat(&out, "ssl_kernel_tls"), "no");
    struct Certs;
    impl crate::TlsControl for Certs {
        fn refresh(&self) -> Result<(), String> {
            Ok(())
        }
        fn secs_since_refresh(&self) -> u64 {
            0
        }
        fn settings(&self) -> crate::TlsSettings {
            crate::TlsSettings {
                chain_cert: "/tls/cert.pem".into(),
                key: "/tls/key.pem".into(),
                ca_cert: None,
                verify_mode: 3,
                min_version: "tlsv1.3",
            }
        }
    }
    let shared = shared_started(crate::Started {
        tls: Some(std::sync::Arc::new(Certs)),
        ..crate::Started::default()
    });
    out.clear();
    s.on_bytes(b"stats settings\r\n", at(5), &shared, None, &mut out);
    // memcached 1.6.18 -Z -o ssl_chain_cert=...,ssl_key=...,ssl_verify_mode=2,ssl_min_version=3
    assert_eq!(stat(&out, "ssl_enabled"), "yes");
    assert_eq!(stat(&out, "ssl_chain_cert"), "/tls/cert.pem");
    assert_eq!(stat(&out, "ssl_key"), "/tls/key.pem");
    assert_eq!(stat(&out, "ssl_verify_mode"), "3");
    assert_eq!(stat(&out, "ssl_ca_cert"), "NULL");
    assert_eq!(stat(&out, "ssl_min_version"), "tlsv1.3");
    assert_eq!(stat(&out, "ssl_session_cache"), "yes");
    assert_eq!(
        stat(&out, "ssl_kernel_tls"),
        "no",
        "the runtime set no kernel TLS"
    );
}

/// memcached's `tcpport`, `udpport`, `inter`, `idle_timeout`, `tcp_backlog` (issue 35): what
/// the runtime bound and was given; without it, memcached's `-p 0 -U 0` form.
#[test]
fn stats_settings_lists_the_listeners_and_timeouts() {
    let shared = shared();
    let mut s = Session::new(Protocol::Memcache, 0);
    let mut out = Vec::new();
    let at = |_| NOW;
    s.on_bytes(b"stats settings\r\n", at(0), &shared, None, &mut out);
    // No runtime set the listeners: memcached's -p 0 -U 0 form.
    assert_eq!(stat(&out, "tcpport"), "0");
    assert_eq!(stat(&out, "udpport"), "0");
    assert_eq!(stat(&out, "inter"), "NULL");
    let shared = shared_started(crate::Started {
        settings: crate::StartSettings {
            memcache: Some("127.0.0.1:11211".parse().expect("addr")),
            udp: Some("127.0.0.1:11212".parse().expect("addr")),
            idle_timeout_secs: 30,
            tcp_backlog: 1024,
            kernel_tls: true,
        },
        ..crate::Started::default()
    });
    out.clear();
    s.on_bytes(b"stats settings\r\n", at(5), &shared, None, &mut out);
    assert_eq!(stat(&out, "tcpport"), "11211");
    assert_eq!(stat(&out, "udpport"), "11212");
    assert_eq!(stat(&out, "inter"), "127.0.0.1");
    assert_eq!(stat(&out, "idle_timeout"), "30");
    assert_eq!(stat(&out, "tcp_backlog"), "1024");
    assert_eq!(
        stat(&out, "ssl_kernel_tls"),
        "no",
        "no TLS listener: no kernel TLS"
    );
}

/// A TLS layer that counts its reloads.
#[derive(Default)]
struct CountingCerts(std::sync::atomic::AtomicU64);

impl crate::TlsControl for CountingCerts {
    fn refresh(&self) -> Result<(), String> {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }
    fn secs_since_refresh(&self) -> u64 {
        0
    }
    fn settings(&self) -> crate::TlsSettings {
        crate::TlsSettings {
            chain_cert: String::new(),
            key: String::new(),
            ca_cert: None,
            verify_mode: 0,
            min_version: "tlsv1.2",
        }
    }
}

#[test]
fn refresh_certs_is_refused_over_udp_and_runs_once_a_second() {
    let certs = std::sync::Arc::new(CountingCerts::default());
    let shared = shared_started(crate::Started {
        tls: Some(certs.clone()),
        ..crate::Started::default()
    });
    let reloads = || certs.0.load(std::sync::atomic::Ordering::Relaxed);
    // A datagram (the UDP path marks responses): refused, nothing read.
    let mut udp = Session::new(Protocol::Memcache, 0);
    udp.mark_responses();
    let mut out = Vec::new();
    udp.on_bytes(b"refresh_certs\r\n", NOW, &shared, None, &mut out);
    assert_eq!(
        out,
        b"CLIENT_ERROR refresh_certs is not accepted over UDP\r\n"
    );
    assert_eq!(reloads(), 0);
    // TCP: the first reloads; the next ones within the second do nothing (noreply: silent).
    let (out, _) = feed(
        &shared,
        &[b"refresh_certs\r\nrefresh_certs\r\nrefresh_certs noreply\r\nmn\r\n"],
    );
    assert_eq!(
        String::from_utf8_lossy(&out),
        "OK\r\nError refreshing certificates: too soon, at most one refresh a second\r\nMN\r\n"
    );
    assert_eq!(reloads(), 1);
    let (stats, _) = feed(&shared, &[b"stats\r\n"]);
    assert_eq!(stat(&stats, "tls_cert_refreshes"), "1");
    assert_eq!(stat(&stats, "tls_cert_refreshes_refused"), "3");
}
