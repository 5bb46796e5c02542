//! `ringstore_*`: what memcached has no series for. Latency histograms from the workers'
//! counters; the rest from the same `stats` lines the memcached_* series come from.

use super::memcached::StatLines;
use super::text::{Exposition, Kind};
use crate::latency::{Latency, BOUNDS_LABEL, LABELS};
use crate::Shared;

/// Series read from `stats` lines: metric, type, help, and its (stat key, labels) samples.
/// A sample whose stat is absent (TLS off, no `--sub-memory`, no data device) is left out,
/// and a family with none is left out whole.
type FromStats = (
    &'static str,
    Kind,
    &'static str,
    &'static [(&'static str, &'static [(&'static str, &'static str)])],
);

const FROM_STATS: &[FromStats] = &[
    (
        "ringstore_tls_handshakes_total",
        Kind::Counter,
        "TLS handshakes completed.",
        &[("tls_handshakes", &[])],
    ),
    (
        "ringstore_tls_handshake_errors_total",
        Kind::Counter,
        "TLS handshakes failed or refused.",
        &[("tls_handshake_errors", &[])],
    ),
    (
        "ringstore_tls_kernel_offload_total",
        Kind::Counter,
        "TLS sessions whose sending or receiving the kernel took over (kTLS).",
        &[
            ("tls_ktls_tx", &[("direction", "tx")]),
            ("tls_ktls_rx", &[("direction", "rx")]),
        ],
    ),
    (
        "ringstore_tls_kernel_offload_fallbacks_total",
        Kind::Counter,
        "Finished TLS sessions the kernel refused to take.",
        &[("tls_ktls_fallbacks", &[])],
    ),
    (
        "ringstore_auth_failures_total",
        Kind::Counter,
        "Refused authentications: memcache logins and SASL, HTTP bearer tokens.",
        &[
            ("auth_errors", &[("protocol", "memcache")]),
            ("http_auth_failures", &[("protocol", "http")]),
        ],
    ),
    (
        "ringstore_http_requests_total",
        Kind::Counter,
        "HTTP requests answered.",
        &[("http_requests", &[])],
    ),
    (
        "ringstore_http_error_responses_total",
        Kind::Counter,
        "HTTP responses with a 4xx or 5xx status.",
        &[
            ("http_responses_4xx", &[("class", "4xx")]),
            ("http_responses_5xx", &[("class", "5xx")]),
        ],
    ),
    (
        "ringstore_numa_bytes",
        Kind::Gauge,
        "Item bytes by NUMA tier (--sub-memory).",
        &[
            ("numa_local_bytes", &[("tier", "local")]),
            ("numa_foreign_bytes", &[("tier", "foreign")]),
        ],
    ),
    (
        "ringstore_numa_moves_total",
        Kind::Counter,
        "Items moved between NUMA tiers.",
        &[
            ("numa_promotions", &[("direction", "promotion")]),
            ("numa_demotions", &[("direction", "demotion")]),
        ],
    ),
    (
        "ringstore_numa_hits_total",
        Kind::Counter,
        "GET hits by the NUMA tier that held the item.",
        &[
            ("get_hits_local", &[("tier", "local")]),
            ("get_hits_foreign", &[("tier", "foreign")]),
        ],
    ),
    (
        "ringstore_conn_memory_bytes",
        Kind::Gauge,
        "Connection memory in use (--conn-memory).",
        &[("conn_memory_bytes", &[])],
    ),
    (
        "ringstore_conn_memory_limit_bytes",
        Kind::Gauge,
        "The connection-memory budget.",
        &[("conn_memory_limit", &[])],
    ),
    (
        "ringstore_udp_dropped_total",
        Kind::Counter,
        "memcache UDP datagrams dropped unanswered.",
        &[("udp_dropped", &[])],
    ),
    (
        "ringstore_data_corrupt_records_total",
        Kind::Counter,
        "Damaged records read from the data device.",
        &[("data_corrupt_records", &[])],
    ),
    (
        "ringstore_data_reserved_bytes",
        Kind::Gauge,
        "Data-device space held by large uploads in progress.",
        &[("data_reserved_bytes", &[])],
    ),
];

/// Writes every `ringstore_*` family.
pub fn write(e: &mut Exposition<'_>, shared: &Shared, general: &StatLines<'_>) {
    histograms(e, &shared.metrics.latency);
    for &(metric, kind, help, samples) in FROM_STATS {
        let mut headed = false;
        for &(key, labels) in samples {
            let Some(v) = general.get(key) else { continue };
            if !headed {
                e.head(metric, kind, help);
                headed = true;
            }
            e.sample_labelled(metric, labels, v);
        }
    }
    if let Some(runtime) = general.get("io_runtime") {
        e.head(
            "ringstore_io_runtime_info",
            Kind::Gauge,
            "The workers' I/O runtime (--io).",
        );
        e.sample_labelled("ringstore_io_runtime_info", &[("runtime", runtime)], "1");
    }
    workers(e, shared);
}

/// `ringstore_request_duration_seconds{protocol,command}`.
fn histograms(e: &mut Exposition<'_>, latency: &Latency) {
    let name = "ringstore_request_duration_seconds";
    e.head(
        name,
        Kind::Histogram,
        "Request latency: from the start of the worker's work on the input holding the request's first byte to its reply queued for the kernel.",
    );
    let bucket = "ringstore_request_duration_seconds_bucket";
    for (family, protocol, command) in LABELS {
        let s = latency.summed(family);
        let mut cumulative = 0u64;
        for (i, n) in s.buckets.iter().enumerate() {
            cumulative = cumulative.wrapping_add(*n);
            let le = BOUNDS_LABEL.get(i).copied().unwrap_or("+Inf");
            e.sample_u64(
                bucket,
                &[("protocol", protocol), ("command", command), ("le", le)],
                cumulative,
            );
        }
        let labels = [("protocol", protocol), ("command", command)];
        let sum = format!(
            "{}.{:09}",
            s.sum_ns / 1_000_000_000,
            s.sum_ns % 1_000_000_000
        );
        e.sample_labelled("ringstore_request_duration_seconds_sum", &labels, &sum);
        e.sample_u64(
            "ringstore_request_duration_seconds_count",
            &labels,
            cumulative,
        );
    }
}

/// Per-worker series (the label is bounded by the worker count).
fn workers(e: &mut Exposition<'_>, shared: &Shared) {
    let name = "ringstore_worker_connections";
    e.head(name, Kind::Gauge, "Open connections per worker.");
    let mut label = String::new();
    for w in 0..shared.workers() {
        let s = shared.stats(w);
        label.clear();
        label.push_str(&w.to_string());
        let open = s.conns_opened.get().saturating_sub(s.conns_closed.get());
        e.sample_u64(name, &[("worker", &label)], open);
    }
    if let Some(cpu) = shared.started.worker_cpu {
        let name = "ringstore_worker_cpu_seconds_total";
        e.head(name, Kind::Counter, "CPU time of each worker thread.");
        let mut ns = vec![None; shared.workers()];
        cpu(&mut |w, t| {
            if let Some(slot) = ns.get_mut(w) {
                *slot = Some(t);
            }
        });
        for (w, t) in ns.iter().enumerate() {
            if let Some(t) = t {
                let v = format!("{}.{:09}", t / 1_000_000_000, t % 1_000_000_000);
                e.sample_labelled(name, &[("worker", &w.to_string())], &v);
            }
        }
    }
}
