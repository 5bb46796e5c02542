//! `ringstore_*`: what memcached has no series for. Latency histograms from the workers'
//! counters; the rest from the same `stats` lines the memcached_* series come from.

use super::memcached::StatLines;
use super::text::{Exposition, Kind};
use crate::device::Device;
use crate::latency::{Latency, BOUNDS_LABEL, LABELS};
use crate::Shared;
use ringstore_durable::commit_metrics::{Histogram, COMMIT_BOUNDS_NS, GROUP_BOUNDS};

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
pub fn write(
    e: &mut Exposition<'_>,
    shared: &Shared,
    device: Option<&dyn Device>,
    general: &StatLines<'_>,
) {
    // `--latency-histograms off`: no series at all, rather than histograms that stay empty.
    if shared.metrics.latency.on() {
        histograms(e, &shared.metrics.latency);
    }
    if let Some(commit) = device.and_then(|d| d.commit_metrics()) {
        commit_histograms(e, commit);
    }
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
    for (family, protocol, command) in LABELS {
        let s = latency.summed(family);
        let labels = [("protocol", protocol), ("command", command)];
        let les = |i: usize| BOUNDS_LABEL.get(i).copied().unwrap_or("+Inf").to_string();
        samples(e, name, &labels, les, &s.buckets, &seconds(s.sum_ns));
    }
}

/// `ringstore_data_commit_duration_seconds` and `ringstore_data_commit_group_records`: the
/// data device's group commit (`ringstore_durable::CommitMetrics`).
fn commit_histograms(e: &mut Exposition<'_>, commit: &ringstore_durable::CommitMetrics) {
    type Family = (
        &'static str,
        &'static str,
        Histogram,
        &'static [u64],
        fn(u64) -> String,
    );
    let families: [Family; 2] = [
        (
            "ringstore_data_commit_duration_seconds",
            "Durable writes: from their group's first record staged to the group's flush completed, one observation per record.",
            commit.latency(),
            &COMMIT_BOUNDS_NS,
            seconds,
        ),
        (
            "ringstore_data_commit_group_records",
            "Records per group made durable by one flush.",
            commit.group_sizes(),
            &GROUP_BOUNDS,
            |n| n.to_string(),
        ),
    ];
    for (name, help, h, bounds, text) in families {
        e.head(name, Kind::Histogram, help);
        let les = |i: usize| bounds.get(i).map_or("+Inf".into(), |&b| text(b));
        samples(e, name, &[], les, &h.buckets, &text(h.sum));
    }
}

/// One histogram's `_bucket` (cumulative), `_sum` and `_count` samples: `buckets` per
/// bucket, `le(i)` the label of bucket `i`.
fn samples(
    e: &mut Exposition<'_>,
    name: &str,
    labels: &[(&str, &str)],
    le: impl Fn(usize) -> String,
    buckets: &[u64],
    sum: &str,
) {
    let bucket = format!("{name}_bucket");
    let mut cumulative = 0u64;
    for (i, n) in buckets.iter().enumerate() {
        cumulative = cumulative.wrapping_add(*n);
        let le = le(i);
        // At most two labels of its own (protocol, command), then `le`.
        let mut with_le = [("", ""); 3];
        let k = labels.len().min(2);
        with_le[..k].copy_from_slice(&labels[..k]);
        with_le[k] = ("le", &le);
        e.sample_u64(&bucket, &with_le[..=k], cumulative);
    }
    e.sample_labelled(&format!("{name}_sum"), labels, sum);
    e.sample_u64(&format!("{name}_count"), labels, cumulative);
}

/// Nanoseconds as decimal seconds (`0.000025`, `1`, `2.5`).
fn seconds(ns: u64) -> String {
    let frac = ns % 1_000_000_000;
    if frac == 0 {
        return (ns / 1_000_000_000).to_string();
    }
    let text = format!("{}.{frac:09}", ns / 1_000_000_000);
    text.trim_end_matches('0').to_string()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_are_exact_decimals() {
        assert_eq!(seconds(25_000), "0.000025");
        assert_eq!(seconds(2_500_000_000), "2.5");
        assert_eq!(seconds(1_000_000_000), "1");
        assert_eq!(seconds(0), "0");
    }

    #[test]
    fn commit_histograms_are_cumulative_with_sum_and_count() {
        let commit = ringstore_durable::CommitMetrics::default();
        let opened = std::time::Instant::now();
        commit.note_group(opened, 3);
        commit.note_group(opened, 1);
        let mut out = Vec::new();
        let mut e = Exposition::new(&mut out, false);
        commit_histograms(&mut e, &commit);
        let text = String::from_utf8(out).expect("utf-8");
        let group = "ringstore_data_commit_group_records";
        assert!(text.contains(&format!("\n{group}_bucket{{le=\"1\"}} 1\n")));
        assert!(text.contains(&format!("\n{group}_bucket{{le=\"2\"}} 1\n")));
        assert!(text.contains(&format!("\n{group}_bucket{{le=\"4\"}} 2\n")));
        assert!(text.contains(&format!("\n{group}_bucket{{le=\"+Inf\"}} 2\n")));
        assert!(text.contains(&format!("\n{group}_sum 4\n{group}_count 2\n")));
        let latency = "ringstore_data_commit_duration_seconds";
        assert!(text.contains(&format!("\n{latency}_bucket{{le=\"0.000025\"}} ")));
        assert!(text.contains(&format!("\n{latency}_bucket{{le=\"+Inf\"}} 4\n")));
        assert!(text.contains(&format!("\n{latency}_count 4\n")));
    }
}
