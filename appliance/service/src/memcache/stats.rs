//! `stats` and its subcommands: memcached's names, plus the topology ringstore runs on.

use ringstore_proto::memcache::misc::StatsRequest;
use ringstore_proto::memcache::reply::{self, stat, stat_str};
use std::sync::atomic::Ordering::Relaxed;

use super::{Ctx, COMPAT_VERSION};
use crate::{watch, StatsTotals, StoreStats, TlsSettings};

pub(crate) fn stats(ctx: &Ctx<'_>, out: &mut Vec<u8>, req: StatsRequest) {
    match req {
        StatsRequest::General => general(ctx, out),
        StatsRequest::Reset => {
            ctx.shared.reset_stats();
            reply::line(out, "RESET");
            return;
        }
        StatsRequest::Settings => settings(ctx, out),
        StatsRequest::Items => {
            let s = ctx.shared.store.stats();
            if s.curr_items > 0 {
                stat(out, "items:1:number", s.curr_items);
                stat(out, "items:1:evicted", s.evictions);
                stat(out, "items:1:reclaimed", s.reclaimed);
                stat(out, "items:1:expired_unfetched", s.expired_unfetched);
                stat(out, "items:1:evicted_unfetched", s.evicted_unfetched);
            }
        }
        StatsRequest::Slabs => slabs(ctx, out),
        StatsRequest::Sizes => stat_str(out, "sizes_status", "disabled"),
        StatsRequest::HotKeys(k) => {
            let keys = ctx.shared.hotkeys.top(usize::from(k), b"");
            crate::hotkeys::stats_lines(out, &keys);
        }
        StatsRequest::Conns | StatsRequest::Empty => {}
    }
    reply::line(out, "END");
}

/// Item alignment in a segment: the smallest `chunk_size` `stats slabs` reports.
const CHUNK_ALIGN: u64 = 8;

/// `stats slabs`: memcached's per-class lines for class 1, the one class `stats items`
/// reports (shown while it has items), as ringstore's segment store gives them (ADR 0036):
/// a page is a segment, a chunk an item of the mean live size. So `used_chunks` is the item
/// count, `total_chunks` what the held segments fit at that size, `free_chunks_end` what
/// their never-written tails fit, and the hit counters are the whole server's.
fn slabs(ctx: &Ctx<'_>, out: &mut Vec<u8>) {
    let (t, s) = ctx.shared.totals_and_store();
    if s.curr_items > 0 {
        let chunk = s.bytes.div_ceil(s.curr_items).next_multiple_of(CHUNK_ALIGN);
        let per_page = s.segment_size / chunk;
        let pages = s.segment_bytes / s.segment_size.max(1);
        let total = pages * per_page;
        let free = total.saturating_sub(s.curr_items);
        stat(out, "1:chunk_size", chunk);
        stat(out, "1:chunks_per_page", per_page);
        stat(out, "1:total_pages", pages);
        stat(out, "1:total_chunks", total);
        stat(out, "1:used_chunks", s.curr_items);
        stat(out, "1:free_chunks", free);
        stat(
            out,
            "1:free_chunks_end",
            (s.unwritten_bytes / chunk).min(free),
        );
        stat(out, "1:get_hits", t.get_hits);
        stat(out, "1:cmd_set", t.cmd_set);
        stat(out, "1:delete_hits", t.delete_hits);
        stat(out, "1:incr_hits", t.incr_hits);
        stat(out, "1:decr_hits", t.decr_hits);
        stat(out, "1:cas_hits", t.cas_hits);
        stat(out, "1:cas_badval", t.cas_badval);
        stat(out, "1:touch_hits", t.touch_hits);
    }
    stat(out, "active_slabs", u64::from(s.curr_items > 0));
    stat(out, "total_malloced", s.segment_bytes);
}

/// `stats` with no argument: memcached's general statistics in its order, then ringstore's.
fn general(ctx: &Ctx<'_>, out: &mut Vec<u8>) {
    let (t, store) = ctx.shared.totals_and_store();
    process(ctx, out);
    connections(ctx, out, &t);
    commands(out, &t);
    traffic_and_items(ctx, out, &t, &store);
    datapath_and_placement(ctx, out, &t, &store);
    numa_sub_memory(ctx, out, &store);
    memory_file(ctx, out);
}

/// How the start over `--memory-file` went (ADR 0052); nothing without one. memcached
/// (`-e`) only logs its restart; these names are ringstore's.
fn memory_file(ctx: &Ctx<'_>, out: &mut Vec<u8>) {
    let Some(r) = ctx.shared.store.restart() else {
        return;
    };
    match &r.outcome {
        ringstore_store::Outcome::Resumed {
            items,
            expired,
            down_secs,
            micros,
        } => {
            stat_str(out, "memory_file_restart", "resumed");
            stat(out, "memory_file_items_kept", *items);
            stat(out, "memory_file_items_expired", *expired);
            stat(out, "memory_file_down_seconds", *down_secs);
            stat(out, "memory_file_resume_us", *micros);
        }
        ringstore_store::Outcome::Cold { reason } => {
            stat_str(out, "memory_file_restart", "cold");
            stat(out, "memory_file_items_kept", 0);
            stat_str(out, "memory_file_cold_reason", reason);
        }
    }
}

/// The process: identity, version, uptime and CPU time.
fn process(ctx: &Ctx<'_>, out: &mut Vec<u8>) {
    let shared = ctx.shared;
    stat(out, "pid", u64::from(shared.pid()));
    stat(
        out,
        "uptime",
        ctx.now.unix.saturating_sub(shared.unix_start()),
    );
    stat(out, "time", ctx.now.unix);
    stat_str(out, "version", COMPAT_VERSION);
    stat_str(out, "ringstore_version", env!("CARGO_PKG_VERSION"));
    if !shared.topology.hostname.is_empty() {
        stat_str(out, "hostname", &shared.topology.hostname);
    }
    stat(out, "pointer_size", usize::BITS.into());
    let (user_us, system_us) = shared.started.rusage.map_or((0, 0), |f| f());
    seconds(out, "rusage_user", user_us);
    seconds(out, "rusage_system", system_us);
}

/// Connections and the connection-memory budget.
fn connections(ctx: &Ctx<'_>, out: &mut Vec<u8>, t: &StatsTotals) {
    let shared = ctx.shared;
    stat(out, "max_connections", shared.config.max_conns as u64);
    stat(out, "curr_connections", shared.curr_connections());
    stat(out, "total_connections", t.conns_opened);
    stat(out, "rejected_connections", shared.rejected_connections());
    // One session per open connection, nothing pooled beyond them.
    stat(out, "connection_structures", shared.curr_connections());
    // The connection-memory budget (`--conn-memory`): in-flight requests and replies.
    let budget = &shared.conn_memory;
    stat(out, "conn_memory_bytes", budget.used() as u64);
    stat(out, "conn_memory_peak", budget.peak() as u64);
    stat(out, "conn_memory_limit", budget.limit() as u64);
    stat(out, "conn_memory_refused", budget.refused());
}

/// Commands and their hits and misses.
fn commands(out: &mut Vec<u8>, t: &StatsTotals) {
    stat(out, "cmd_get", t.cmd_get);
    stat(out, "cmd_set", t.cmd_set);
    stat(out, "cmd_flush", t.cmd_flush);
    stat(out, "cmd_touch", t.cmd_touch);
    stat(out, "cmd_meta", t.cmd_meta);
    stat(out, "get_hits", t.get_hits);
    stat(out, "get_misses", t.get_misses);
    stat(out, "get_expired", t.get_expired);
    stat(out, "get_flushed", t.get_flushed);
    stat(out, "delete_misses", t.delete_misses);
    stat(out, "delete_hits", t.delete_hits);
    stat(out, "incr_misses", t.incr_misses);
    stat(out, "incr_hits", t.incr_hits);
    stat(out, "decr_misses", t.decr_misses);
    stat(out, "decr_hits", t.decr_hits);
    stat(out, "cas_misses", t.cas_misses);
    stat(out, "cas_hits", t.cas_hits);
    stat(out, "cas_badval", t.cas_badval);
    stat(out, "touch_hits", t.touch_hits);
    stat(out, "touch_misses", t.touch_misses);
    stat(out, "store_too_large", t.store_too_large);
    stat(out, "store_no_memory", t.store_no_memory);
    // `--auth-file`: text logins and binary SASL attempts (memcache/ascii_auth.rs).
    stat(out, "auth_cmds", t.auth_cmds);
    stat(out, "auth_errors", t.auth_errors);
    stat(out, "http_auth_failures", t.http_auth_failures);
}

/// Bytes moved, listening, threads and the store's items.
fn traffic_and_items(ctx: &Ctx<'_>, out: &mut Vec<u8>, t: &StatsTotals, store: &StoreStats) {
    let shared = ctx.shared;
    stat(out, "bytes_read", t.bytes_read);
    stat(out, "bytes_written", t.bytes_written);
    stat(out, "limit_maxbytes", store.limit_maxbytes);
    // ringstore never stops listening: past --max-conns it refuses each connection
    // (`rejected_connections`), so listening is never disabled.
    stat(out, "accepting_conns", 1);
    stat(out, "listen_disabled_num", 0);
    stat(out, "time_in_listen_disabled_us", 0);
    stat(out, "threads", shared.workers() as u64);
    stat(out, "conn_yields", t.conn_yields);
    stat(out, "hash_bytes", store.index_bytes);
    stat(out, "hash_is_expanding", 0);
    stat(out, "bytes", store.bytes);
    stat(out, "curr_items", store.curr_items);
    stat(out, "total_items", store.total_items);
    stat(out, "expired_unfetched", store.expired_unfetched);
    stat(out, "evicted_unfetched", store.evicted_unfetched);
    // RAM's evictions and the full data device's (ADR 0039; `extstore_objects_evicted`).
    let device_evictions = ctx.device.map_or(0, |d| d.evictions());
    stat(out, "evictions", store.evictions + device_evictions);
    stat(out, "reclaimed", store.reclaimed);
    // memcached extstore's names: values read back from the data device for a RAM stub
    // (`external-value-min`), and stubs the device no longer backed (dropped, read as a miss).
    stat(out, "get_extstore", store.external_reads);
    stat(out, "get_aborted_extstore", store.external_lost);
}

/// ringstore's own: HTTP, UDP, zero-copy and XDP counters, NUMA placement, the data device,
/// memory backing and the workers' capabilities.
fn datapath_and_placement(ctx: &Ctx<'_>, out: &mut Vec<u8>, t: &StatsTotals, store: &StoreStats) {
    let shared = ctx.shared;
    stat(out, "http_requests", t.http_requests);
    stat(out, "http_responses_4xx", t.http_responses_4xx);
    stat(out, "http_responses_5xx", t.http_responses_5xx);
    stat(out, "udp_rx_datagrams", t.udp_rx_datagrams);
    stat(out, "udp_tx_datagrams", t.udp_tx_datagrams);
    stat(out, "udp_dropped", t.udp_dropped);
    stat(out, "udp_held_full", t.udp_held_full);
    // Big GET values sent from the item (zero_copy.rs, ADR 0027).
    stat(out, "zero_copy_sends", t.zero_copy_sends);
    stat(out, "zero_copy_fallbacks", t.zero_copy_fallbacks);
    stat(out, "pinned_bytes", shared.pinned_bytes());
    stat(out, "pinned_segments", store.pinned_segments);
    stat(out, "orphaned_segments", store.orphaned_segments);
    let xdp_mode = shared.started.xdp_mode.as_deref().unwrap_or("off");
    stat_str(out, "xdp_mode", xdp_mode);
    stat(out, "xdp_rx", t.xdp_rx);
    stat(out, "xdp_tx", t.xdp_tx);
    stat(out, "xdp_drop", t.xdp_drop);
    if let Some(tls) = shared.started.tls.as_ref() {
        // TLS, with memcached's names where it has one (ADR 0031).
        stat(out, "tls_handshakes", t.tls_handshakes);
        stat(out, "tls_handshake_errors", t.tls_handshake_errors);
        stat(out, "ssl_handshake_errors", t.tls_handshake_errors);
        stat(out, "tls_ktls_tx", t.tls_ktls_tx);
        stat(out, "tls_ktls_rx", t.tls_ktls_rx);
        stat(out, "tls_ktls_fallbacks", t.tls_ktls_fallbacks);
        stat(
            out,
            "time_since_server_cert_refresh",
            tls.secs_since_refresh(),
        );
        let gate = &shared.refresh_certs;
        stat(out, "tls_cert_refreshes", gate.done.load(Relaxed));
        stat(
            out,
            "tls_cert_refreshes_refused",
            gate.refused.load(Relaxed),
        );
    }
    stat(out, "numa_node", u64::from(shared.topology.numa_node));
    out.extend_from_slice(b"STAT worker_cpus ");
    for (i, cpu) in shared.topology.worker_cpus.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        reply::push_u64(out, *cpu as u64);
    }
    out.extend_from_slice(b"\r\n");
    if let Some(device) = ctx.device {
        // With a data device: space held by large uploads in progress, damaged records read.
        device.stats(&mut |name, value| stat(out, name, value));
    }
    stat(out, "hugepage_bytes", store.hugepage_bytes);
    stat(out, "arena_bytes", store.arena_bytes);
    stat_str(
        out,
        "worker_capeff",
        &format!("{:016x}", shared.worker_capeff.load(Relaxed)),
    );
    // The workers' I/O runtime (`--io`, ADR 0033).
    let io_runtime = shared.started.io_runtime;
    stat_str(out, "io_runtime", io_runtime);
    // `--log-sink` (ADR 0045): lines the full queue dropped; 0 without a sink.
    let log_dropped = shared.log_lines_dropped.load(Relaxed);
    stat(out, "log_lines_dropped", log_dropped);
}

/// NUMA sub memory (issue 23, ADR 0035): where the items are, reads by region, the moves
/// and the exchange's CPU time. Listed only with `--sub-memory`.
fn numa_sub_memory(ctx: &Ctx<'_>, out: &mut Vec<u8>, store: &StoreStats) {
    if ctx.shared.store.sub_regions().is_empty() {
        return;
    }
    stat(out, "numa_local_bytes", store.numa_local_bytes);
    stat(out, "numa_foreign_bytes", store.numa_foreign_bytes);
    stat(out, "get_hits_local", store.get_hits_local);
    stat(out, "get_hits_foreign", store.get_hits_foreign);
    stat(out, "numa_promotions", store.numa_promotions);
    stat(out, "numa_demotions", store.numa_demotions);
    stat(out, "numa_exchange_cpu_usec", store.numa_exchange_cpu_usec);
}

/// `STAT <name> <s>.<µs>`, memcached's form for CPU times.
fn seconds(out: &mut Vec<u8>, name: &str, us: u64) {
    stat_str(
        out,
        name,
        &format!("{}.{:06}", us / 1_000_000, us % 1_000_000),
    );
}

/// memcached 1.6.18's `stats settings`, in its order and value formats, for every setting
/// that has a meaning in ringstore; the others (slab classes, LRU tuning, extstore, OpenSSL
/// knobs) are left out, each named with its reason in `tests/e2e/test_stats_settings.py`
/// and docs/adr/0036. Then ringstore's own.
fn settings(ctx: &Ctx<'_>, out: &mut Vec<u8>) {
    let shared = ctx.shared;
    let start = shared.started.settings.clone();
    let store = shared.store.stats();
    stat(out, "maxbytes", store.limit_maxbytes);
    stat(out, "maxconns", shared.config.max_conns as u64);
    // memcached's `-p`/`-U`/`-l`: here the bound ones (0 when off, as memcached's -p 0).
    stat(
        out,
        "tcpport",
        start.memcache.map_or(0, |a| a.port().into()),
    );
    stat(out, "udpport", start.udp.map_or(0, |a| a.port().into()));
    let inter = start.memcache.map(|a| a.ip().to_string());
    stat_str(out, "inter", inter.as_deref().unwrap_or("NULL"));
    stat(out, "verbosity", 0);
    stat_str(out, "evictions", "on");
    stat_str(out, "domain_socket", "NULL"); // no unix socket listener (memcached `-s`)
    stat_str(out, "shutdown_command", "no");
    stat(out, "num_threads", shared.workers() as u64);
    // Every worker serves UDP (one SO_REUSEPORT socket each), as every memcached thread.
    stat(out, "num_threads_per_udp", shared.workers() as u64);
    stat_str(out, "detail_enabled", "no");
    stat_str(out, "cas_enabled", "yes");
    stat(out, "tcp_backlog", start.tcp_backlog.into());
    stat_str(out, "binding_protocol", "auto-negotiate"); // text or binary by the first byte
    auth_settings(ctx, out);
    stat(out, "item_size_max", shared.config.item_size_max as u64);
    if let Some(r) = shared.store.restart() {
        stat_str(out, "memory_file", &r.source); // memcached's `-e` path
    }
    stat_str(out, "maxconns_fast", "yes");
    stat_str(out, "lru_crawler", "yes");
    stat_str(out, "flush_enabled", "yes");
    stat_str(out, "dump_enabled", "yes");
    stat_str(out, "hash_algorithm", "foldhash"); // seeded per process
    stat(out, "idle_timeout", start.idle_timeout_secs);
    // memcached's per-worker log buffer for `watch`: here a ring of lines per worker.
    stat(
        out,
        "worker_logbuf_size",
        (watch::RING_LINES * watch::LINE_MAX) as u64,
    );
    stat_str(out, "track_sizes", "no"); // `stats sizes` answers sizes_status disabled
    tls_settings(ctx, out, start.kernel_tls);
    // ringstore's own: the per-connection output high-water mark and the
    // connection-memory budget.
    stat(out, "out_high_water", shared.config.out_high_water as u64);
    stat(out, "conn_memory", shared.config.conn_memory as u64);
}

/// `auth_enabled_sasl` and `auth_enabled_ascii`: `--auth-file` turns on both text logins
/// and binary SASL PLAIN (memcached's -Y and -S); memcached prints the -Y file's path, or `no`.
fn auth_settings(ctx: &Ctx<'_>, out: &mut Vec<u8>) {
    let users = ctx
        .shared
        .started
        .auth
        .as_ref()
        .filter(|a| a.users.is_some());
    let sasl = if users.is_some() { "yes" } else { "no" };
    stat_str(out, "auth_enabled_sasl", sasl);
    let ascii = users.map_or("no", |a| a.users_file.as_deref().unwrap_or("yes"));
    stat_str(out, "auth_enabled_ascii", ascii);
}

/// memcached -Z's lines, in its order and forms (with TLS off, as memcached built with TLS
/// prints them: `(null)` files, verify 0, `tlsv1.2`), for the settings ringstore has.
fn tls_settings(ctx: &Ctx<'_>, out: &mut Vec<u8>, kernel_tls: bool) {
    let tls = ctx.shared.started.tls.as_ref().map(|t| t.settings());
    let on = if tls.is_some() { "yes" } else { "no" };
    stat_str(out, "ssl_enabled", on); // a TLS listener is on (`--memcache-tls` or `--https`)
    let t = tls.unwrap_or(TlsSettings {
        chain_cert: "(null)".into(),
        key: "(null)".into(),
        ca_cert: None,
        verify_mode: 0,
        min_version: "tlsv1.2",
    });
    stat_str(out, "ssl_chain_cert", &t.chain_cert);
    stat_str(out, "ssl_key", &t.key);
    stat(out, "ssl_verify_mode", u64::from(t.verify_mode));
    stat(out, "ssl_keyformat", 1); // SSL_FILETYPE_PEM: keys are read as PEM only
    stat_str(out, "ssl_ca_cert", t.ca_cert.as_deref().unwrap_or("NULL"));
    // rustls' in-memory session cache (256 sessions) resumes sessions whenever TLS is on.
    stat_str(out, "ssl_session_cache", on);
    let ktls = if on == "yes" && kernel_tls {
        "yes"
    } else {
        "no"
    };
    stat_str(out, "ssl_kernel_tls", ktls);
    stat_str(out, "ssl_min_version", t.min_version);
}
