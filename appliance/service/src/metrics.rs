//! `GET /metrics`: Prometheus text 0.0.4 (or OpenMetrics 1.0 when `Accept` asks for it),
//! answered by the worker holding the connection (docs/METRICS.md, ADR 0042).
//!
//! The memcached_* series are memcached_exporter's mapping applied to this server's own
//! `stats`, `stats settings` and `stats items` replies, rendered into a scratch buffer by
//! the code that answers those commands; `ringstore_*` adds latency histograms (per-worker
//! counters summed here) and what memcached has no name for. A scrape takes no lock beyond
//! what `stats` takes (the store's per-shard counters, one shard at a time) and allocates
//! in proportion to the number of series, never to the number of keys.

pub mod appliance;
mod memcached;
mod ringstore;
mod text;

pub use crate::latency::{Family, Latency, Tally, WorkerLatency, BOUNDS_NS, FAMILIES};
pub use memcached::StatLines;

use ringstore_proto::memcache::misc::StatsRequest;

use crate::device::Device;
use crate::{Now, Shared};

/// Calls back with `(worker, CPU nanoseconds)` for each worker thread (the runtime's).
pub type WorkerCpu = fn(&mut dyn FnMut(usize, u64));

/// The server's metrics state beyond the `stats` counters.
pub struct Metrics {
    pub latency: Latency,
    /// On the appliance: PID 1's series (the booted slot, tuning, certificate, data device).
    pub appliance: appliance::Appliance,
}

impl Metrics {
    /// `slots` per-worker histograms, timed by `clock` (the runtime's; `None`: 0 s each).
    pub fn new(slots: usize, clock: Option<fn() -> u64>) -> Metrics {
        Metrics {
            latency: Latency::new(slots, clock),
            appliance: appliance::Appliance::default(),
        }
    }

    /// `--latency-histograms`: `false` records none (and lists none).
    pub fn latency_histograms(self, on: bool) -> Metrics {
        if on {
            return self;
        }
        Metrics {
            latency: self.latency.switched_off(),
            ..self
        }
    }
}

/// The request path that answers metrics (exactly these bytes: an object named `metrics`
/// stays reachable as `/%6Detrics`).
pub const PATH: &[u8] = b"/metrics";

/// The content types of the two formats.
pub const TEXT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
pub const OPEN_METRICS_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// True when a request head (`head`: its raw bytes) asks for OpenMetrics in `Accept`.
pub fn wants_open_metrics(head: &[u8]) -> bool {
    head.split(|&b| b == b'\n').any(|line| {
        line.len() > 7
            && line[..7].eq_ignore_ascii_case(b"accept:")
            && line
                .windows(28)
                .any(|w| w.eq_ignore_ascii_case(b"application/openmetrics-text"))
    })
}

/// Appends the whole exposition for `shared` (as worker `worker` sees it) to `out`.
pub fn render(
    shared: &Shared,
    worker: usize,
    device: Option<&dyn Device>,
    now: Now,
    open_metrics: bool,
    out: &mut Vec<u8>,
) {
    let mut scratch = Vec::with_capacity(8 * 1024);
    let mut spans = [0usize; 4];
    for (i, req) in [
        StatsRequest::General,
        StatsRequest::Settings,
        StatsRequest::Items,
    ]
    .into_iter()
    .enumerate()
    {
        crate::memcache::stats_text(shared, worker, device, now, req, &mut scratch);
        spans[i + 1] = scratch.len();
    }
    let general = StatLines(&scratch[spans[0]..spans[1]]);
    let settings = StatLines(&scratch[spans[1]..spans[2]]);
    let items = StatLines(&scratch[spans[2]..spans[3]]);
    let mut e = text::Exposition::new(out, open_metrics);
    memcached::write(&mut e, &general, &settings, &items);
    ringstore::write(&mut e, shared, device, &general);
    appliance::write(&mut e, &shared.metrics.appliance, now.unix);
    e.finish();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_metrics_only_when_accept_names_it() {
        let om = b"GET /metrics HTTP/1.1\r\nHost: x\r\nACCEPT: application/OpenMetrics-text; version=1.0.0\r\n\r\n";
        assert!(wants_open_metrics(om));
        let plain = b"GET /metrics HTTP/1.1\r\nAccept: text/plain\r\nX-Note: application/openmetrics-text\r\n\r\n";
        assert!(!wants_open_metrics(plain));
    }

    #[test]
    fn a_scrape_maps_stats_and_counts_no_keys() {
        let store = crate::Store::new(crate::StoreConfig {
            memory_bytes: 8 << 20,
            item_size_max: 1 << 20,
            shards: 2,
            huge_pages: false,
            external_threshold: 0,
        })
        .expect("store");
        let shared = Shared::new(store, Default::default(), Default::default(), 2, 1, 0);
        shared.stats(0).get_hits.add(3);
        shared.stats(1).cmd_set.add(5);
        shared.stats(1).cas_hits.add(2);
        let mut out = Vec::new();
        let now = Now {
            store: 0,
            unix: 10,
            mono_ms: 0,
            mono_ns: 0,
        };
        render(&shared, 0, None, now, false, &mut out);
        let text = String::from_utf8(out).expect("utf-8");
        assert!(text.contains("\nmemcached_commands_total{command=\"get\",status=\"hit\"} 3\n"));
        assert!(text.contains("\nmemcached_commands_total{command=\"set\",status=\"hit\"} 3\n"));
        assert!(text.contains("\n# TYPE memcached_uptime_seconds counter\n"));
        assert!(text.contains("ringstore_request_duration_seconds_bucket{protocol=\"http\",command=\"GET\",le=\"+Inf\"} 0\n"));
        assert!(!text.contains("# EOF"));
    }
}
