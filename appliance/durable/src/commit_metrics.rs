//! Group commit's own histograms (`/metrics` `ringstore_data_commit_*`, docs/METRICS.md): how
//! long a group took from its first record staged to durable, and how many records it held.
//!
//! Written once per group (not per record) by the worker driving the region's log, read by a
//! scrape: relaxed atomics, shared by every region of one device. The clock is read twice per
//! group (when it opens and when it is released), never per record.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Commit latency bucket bounds in nanoseconds: a local NVMe flush (tens of µs) to a stalled
/// device (seconds).
pub const COMMIT_BOUNDS_NS: [u64; 16] = [
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    5_000_000_000,
];

/// Group size bucket bounds in records: 1 to the pending-write limit (4096 by default).
pub const GROUP_BOUNDS: [u64; 13] = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096];

/// A histogram's counts per bucket (not cumulative; the last is `+Inf`) and their sum.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Histogram {
    pub buckets: Vec<u64>,
    pub sum: u64,
}

#[derive(Debug)]
struct Atomic<const N: usize> {
    buckets: [AtomicU64; N],
    sum: AtomicU64,
}

impl<const N: usize> Default for Atomic<N> {
    fn default() -> Self {
        Atomic {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            sum: AtomicU64::new(0),
        }
    }
}

impl<const N: usize> Atomic<N> {
    /// `n` observations of `v` in the bucket `bounds` places it in.
    fn observe(&self, bounds: &[u64], v: u64, n: u64) {
        let i = bounds.partition_point(|&b| b < v);
        self.buckets[i].fetch_add(n, Ordering::Relaxed);
        self.sum.fetch_add(v.saturating_mul(n), Ordering::Relaxed);
    }

    fn read(&self) -> Histogram {
        Histogram {
            buckets: self
                .buckets
                .iter()
                .map(|b| b.load(Ordering::Relaxed))
                .collect(),
            sum: self.sum.load(Ordering::Relaxed),
        }
    }
}

/// The commit histograms of one data device.
#[derive(Debug, Default)]
pub struct CommitMetrics {
    /// Per record acknowledged: its group's time from opening to durable, in nanoseconds.
    latency: Atomic<{ COMMIT_BOUNDS_NS.len() + 1 }>,
    /// Per group acknowledged with client records: how many it held.
    groups: Atomic<{ GROUP_BOUNDS.len() + 1 }>,
}

impl CommitMetrics {
    /// A group opened at `opened` was released durable with `records` records in it: each
    /// record waited (at most) from the group's opening until now.
    pub fn note_group(&self, opened: Instant, records: usize) {
        if records == 0 {
            return;
        }
        let ns = u64::try_from(opened.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let n = records as u64;
        self.latency.observe(&COMMIT_BOUNDS_NS, ns, n);
        self.groups.observe(&GROUP_BOUNDS, n, 1);
    }

    /// The latency histogram: one observation per record, in nanoseconds.
    pub fn latency(&self) -> Histogram {
        self.latency.read()
    }

    /// The group-size histogram: one observation per group, in records.
    pub fn group_sizes(&self) -> Histogram {
        self.groups.read()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_counts_each_record_once_and_itself_once() {
        let m = CommitMetrics::default();
        m.note_group(Instant::now(), 3);
        m.note_group(Instant::now(), 0);
        m.note_group(Instant::now(), 1);
        let lat = m.latency();
        assert_eq!(lat.buckets.iter().sum::<u64>(), 4);
        assert_eq!(lat.buckets.len(), COMMIT_BOUNDS_NS.len() + 1);
        let g = m.group_sizes();
        assert_eq!(g.buckets.iter().sum::<u64>(), 2);
        assert_eq!(g.sum, 4);
        assert_eq!(g.buckets[0], 1, "a group of 1 in the first bucket");
        assert_eq!(g.buckets[2], 1, "a group of 3 in the `le=4` bucket");
    }
}
