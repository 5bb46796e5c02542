//! What a load run measured, per server: counts, the latency histogram, CPU.

use crate::hist::Histogram;
use crate::procs;

/// What one cell measured, over the measurement window only.
#[derive(Clone)]
pub struct LoadResult {
    pub requests: u64,
    pub seconds: f64,
    pub hist: Histogram,
    pub server_cpu_seconds: f64,
    pub client_cpu_seconds: f64,
    pub misses: u64,
    pub errors: u64,
    /// UDP: requests given up on (no reply within the loss timeout).
    pub lost: u64,
    /// The server's and the client's CPU as a whole (every task, softirq included).
    pub server_core: procs::CoreUse,
    pub client_core: procs::CoreUse,
    /// Each slice's throughput, in order (one per slice, so bounded by the slice count).
    pub slice_throughputs: Vec<f64>,
}

impl LoadResult {
    pub fn throughput(&self) -> f64 {
        self.requests as f64 / self.seconds
    }

    /// Requests per second of the server process's CPU time (NaN without any).
    pub fn per_cpu_second(&self) -> f64 {
        if self.server_cpu_seconds > 0.0 {
            self.requests as f64 / self.server_cpu_seconds
        } else {
            f64::NAN
        }
    }

    /// Server CPU seconds spent per million requests.
    pub fn server_cpu_per_million(&self) -> f64 {
        self.server_cpu_seconds / (self.requests as f64 / 1e6)
    }

    pub fn server_cpu_percent(&self) -> f64 {
        100.0 * self.server_cpu_seconds / self.seconds
    }

    pub fn client_cpu_percent(&self) -> f64 {
        100.0 * self.client_cpu_seconds / self.seconds
    }

    pub fn p50_us(&self) -> f64 {
        self.hist.quantile(0.50) as f64 / 1e3
    }

    pub fn p99_us(&self) -> f64 {
        self.hist.quantile(0.99) as f64 / 1e3
    }

    /// The median slice's throughput: neither a slice starved by other work on a shared
    /// machine nor one that ran while the machine was quiet sets it.
    pub fn median_slice_throughput(&self) -> f64 {
        let mut sorted = self.slice_throughputs.clone();
        sorted.sort_by(f64::total_cmp);
        match sorted.len() {
            0 => 0.0,
            n if n % 2 == 1 => sorted[n / 2],
            n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
        }
    }

    pub fn p999_us(&self) -> f64 {
        self.hist.quantile(0.999) as f64 / 1e3
    }
}

impl LoadResult {
    pub(crate) fn empty() -> Self {
        LoadResult {
            requests: 0,
            seconds: 0.0,
            hist: Histogram::default(),
            server_cpu_seconds: 0.0,
            client_cpu_seconds: 0.0,
            misses: 0,
            errors: 0,
            lost: 0,
            server_core: procs::CoreUse::default(),
            client_core: procs::CoreUse::default(),
            slice_throughputs: Vec::new(),
        }
    }

    /// Adds another slice of the same cell.
    pub(crate) fn merge(&mut self, other: &LoadResult) {
        let total = self.seconds + other.seconds;
        let weigh = |a: f64, b: f64| {
            if total > 0.0 {
                (a * self.seconds + b * other.seconds) / total
            } else {
                0.0
            }
        };
        let weigh_core = |a: procs::CoreUse, b: procs::CoreUse| procs::CoreUse {
            busy_percent: weigh(a.busy_percent, b.busy_percent),
            softirq_percent: weigh(a.softirq_percent, b.softirq_percent),
        };
        self.server_core = weigh_core(self.server_core, other.server_core);
        self.client_core = weigh_core(self.client_core, other.client_core);
        self.slice_throughputs
            .extend_from_slice(&other.slice_throughputs);
        self.requests += other.requests;
        self.seconds = total;
        self.hist.merge(&other.hist);
        self.server_cpu_seconds += other.server_cpu_seconds;
        self.client_cpu_seconds += other.client_cpu_seconds;
        self.misses += other.misses;
        self.errors += other.errors;
        self.lost += other.lost;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merged_slices_keep_the_mean_and_each_slice() {
        let slice = |requests, seconds| LoadResult {
            requests,
            seconds,
            slice_throughputs: vec![requests as f64 / seconds],
            ..LoadResult::empty()
        };
        let mut total = LoadResult::empty();
        assert!(total.median_slice_throughput().abs() < 1e-9);
        for requests in [1000, 10, 900] {
            total.merge(&slice(requests, 1.0));
        }
        assert_eq!(total.requests, 1910);
        assert!((total.throughput() - 1910.0 / 3.0).abs() < 1e-9);
        assert!(
            (total.median_slice_throughput() - 900.0).abs() < 1e-9,
            "the starved slice does not pull it down"
        );
        total.merge(&slice(800, 1.0));
        assert!((total.median_slice_throughput() - 850.0).abs() < 1e-9);
    }
}
