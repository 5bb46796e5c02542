//! Request latency histograms: per-worker bucket counters (single writer, summed at scrape)
//! and the per-session tally that feeds them once per batch of input.
//!
//! What is measured: from the moment the worker woke with the input that carries a
//! request's first byte (the read's completion; [`crate::Now::mono_ns`], the reading the
//! runtime takes once per loop iteration anyway) to the moment `on_bytes` returns with the
//! request's reply in the output buffer, which the runtime then hands to the kernel without
//! further work. Every request finished in one `on_bytes` call gets that call's duration; a
//! request whose first bytes arrived in an earlier call is timed from that earlier call (so a
//! slow client's upload counts its transfer time). One clock read per `on_bytes` call that
//! finished a request (none for one that did not), one array increment per request, one
//! bucket search per command family used in the call.

use crate::stats::Counter;

/// Bucket upper bounds in nanoseconds: a few µs (a cached GET on a local worker) to seconds
/// (a durable write behind a slow device). 19 buckets plus `+Inf`.
pub const BOUNDS_NS: [u64; 19] = [
    5_000,
    10_000,
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
    2_500_000_000,
    5_000_000_000,
];

/// The `le` label of each bound, as Prometheus clients print seconds.
pub const BOUNDS_LABEL: [&str; 19] = [
    "5e-06", "1e-05", "2.5e-05", "5e-05", "0.0001", "0.00025", "0.0005", "0.001", "0.0025",
    "0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1", "2.5", "5",
];

const SLOTS: usize = BOUNDS_NS.len() + 1;

/// A command family: the label pair of one histogram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// get, gets, gat, gats.
    Get,
    /// set, add, replace, append, prepend, cas (and refused ones).
    Set,
    Delete,
    /// incr, decr.
    Arith,
    /// mg, ms, md, ma, mn, me.
    Meta,
    /// Every binary-protocol request.
    Binary,
    /// Any other text command (touch, stats, version, flush_all, ...).
    Other,
    /// HTTP GET and HEAD.
    HttpGet,
    HttpPut,
    HttpDelete,
}

/// Number of families.
pub const FAMILIES: usize = 10;

/// Every family with its `protocol` and `command` labels, in index order.
pub const LABELS: [(Family, &str, &str); FAMILIES] = [
    (Family::Get, "memcache", "get"),
    (Family::Set, "memcache", "set"),
    (Family::Delete, "memcache", "delete"),
    (Family::Arith, "memcache", "arith"),
    (Family::Meta, "memcache", "meta"),
    (Family::Binary, "memcache", "binary"),
    (Family::Other, "memcache", "other"),
    (Family::HttpGet, "http", "GET"),
    (Family::HttpPut, "http", "PUT"),
    (Family::HttpDelete, "http", "DELETE"),
];

/// One worker's histograms: written by that worker only.
#[derive(Debug, Default)]
#[repr(align(128))]
pub struct WorkerLatency {
    buckets: [[Counter; SLOTS]; FAMILIES],
    sum_ns: [Counter; FAMILIES],
}

/// The bucket an observation of `ns` falls in (`BOUNDS_NS.len()`: `+Inf`).
pub fn bucket(ns: u64) -> usize {
    BOUNDS_NS.partition_point(|&b| b < ns)
}

impl WorkerLatency {
    /// Counts `n` requests of `family` that took `ns` each.
    pub fn observe(&self, family: Family, ns: u64, n: u64) {
        self.observe_slot(family as usize, ns, n);
    }

    /// [`WorkerLatency::observe`] by the family's index (`f < FAMILIES`; a larger one is
    /// ignored).
    fn observe_slot(&self, f: usize, ns: u64, n: u64) {
        if let (Some(buckets), Some(sum)) = (self.buckets.get(f), self.sum_ns.get(f)) {
            buckets[bucket(ns)].add(n);
            sum.add(ns.saturating_mul(n));
        }
    }
}

/// One family's histogram summed over the workers: per-bucket (not cumulative) counts and
/// the sum in nanoseconds.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Summed {
    pub buckets: [u64; SLOTS],
    pub sum_ns: u64,
}

/// The histograms of every worker, and the clock the runtime lends them.
pub struct Latency {
    workers: Box<[WorkerLatency]>,
    /// Monotonic nanoseconds, the runtime's (the service reads no clock of its own); `None`:
    /// every request counts as taking 0 ns.
    clock: Option<fn() -> u64>,
    /// `--latency-histograms`: false records nothing (the bench's "without").
    on: bool,
}

impl Latency {
    pub fn new(slots: usize, clock: Option<fn() -> u64>) -> Latency {
        Latency {
            workers: (0..slots).map(|_| WorkerLatency::default()).collect(),
            clock,
            on: true,
        }
    }

    /// `--latency-histograms off`: no clock read, no histogram written; a session's
    /// [`Tally::end`] costs one predictable branch.
    pub fn switched_off(self) -> Latency {
        Latency { on: false, ..self }
    }

    /// Whether requests are recorded (`/metrics` lists the histograms only then).
    pub fn on(&self) -> bool {
        self.on
    }

    /// Monotonic nanoseconds (0 without a clock).
    pub fn now_ns(&self) -> u64 {
        self.clock.map_or(0, |f| f())
    }

    pub fn worker(&self, worker: usize) -> &WorkerLatency {
        &self.workers[worker.min(self.workers.len() - 1)]
    }

    /// `family`'s histogram summed over every worker.
    pub fn summed(&self, family: Family) -> Summed {
        let f = family as usize;
        let mut s = Summed::default();
        for w in self.workers.iter() {
            for (total, c) in s.buckets.iter_mut().zip(&w.buckets[f]) {
                *total = total.wrapping_add(c.get());
            }
            s.sum_ns = s.sum_ns.wrapping_add(w.sum_ns[f].get());
        }
        s
    }
}

/// A session's requests finished in the current `on_bytes` call, by family, and when the
/// oldest of them started.
#[derive(Debug, Default)]
pub struct Tally {
    counts: [u32; FAMILIES],
    /// Bit per family with a count.
    used: u16,
    /// When the current call started.
    batch_start: u64,
    /// When the call that brought a still-partial request's first bytes started.
    partial_since: Option<u64>,
}

impl Tally {
    /// The start of an `on_bytes` call whose input the worker woke with at `now`: that
    /// reading is the start, so a call costs no clock read of its own until [`Tally::end`].
    #[inline]
    pub fn begin(&mut self, latency: &Latency, now: crate::Now) {
        self.batch_start = if latency.clock.is_some() {
            now.mono_ns
        } else {
            0
        };
    }

    /// One request of `family` was answered.
    #[inline]
    pub fn note(&mut self, family: Family) {
        let f = family as usize;
        // Wrapping: with the histograms off nothing resets the counts (see `end`).
        self.counts[f] = self.counts[f].wrapping_add(1);
        self.used |= 1 << f;
    }

    /// The end of an `on_bytes` call: the requests answered in it go to `worker`'s
    /// histograms; `partial`: part of a request is buffered for the next call.
    #[inline]
    pub fn end(&mut self, latency: &Latency, worker: usize, partial: bool) {
        // Off: the one branch per call (`note` still counts, two instructions per request:
        // branching there instead would cost as much).
        if latency.on {
            self.record(latency, worker, partial);
        }
    }

    fn record(&mut self, latency: &Latency, worker: usize, partial: bool) {
        let start = self.partial_since.unwrap_or(self.batch_start);
        if self.used != 0 {
            let ns = latency.now_ns().saturating_sub(start);
            let slot = latency.worker(worker);
            // Only the families used (one, mostly): a walk over all ten cost 160 instructions
            // per call under callgrind.
            while self.used != 0 {
                let f = self.used.trailing_zeros() as usize;
                self.used &= self.used - 1;
                slot.observe_slot(f, ns, u64::from(self.counts[f]));
                self.counts[f] = 0;
            }
            // The partial request (if any) is a new one, begun in this call.
            self.partial_since = None;
        }
        self.partial_since = match (partial, self.partial_since) {
            (false, _) => None,
            (true, Some(t)) => Some(t),
            (true, None) => Some(self.batch_start),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: crate::Now = crate::Now {
        store: 0,
        unix: 0,
        mono_ms: 0,
        mono_ns: 0,
    };

    /// A clock that counts its readings: 1 ms apart, from 1 s.
    fn counting_clock() -> u64 {
        use std::sync::atomic::{AtomicU64, Ordering};
        static READS: AtomicU64 = AtomicU64::new(0);
        1_000_000_000 + 1_000_000 * READS.fetch_add(1, Ordering::Relaxed)
    }

    #[test]
    fn a_call_reads_the_clock_once_and_starts_at_the_wakeup() {
        let latency = Latency::new(1, Some(counting_clock));
        let woke = crate::Now {
            mono_ns: counting_clock() - 250_000,
            ..NOW
        };
        let mut t = Tally::default();
        t.begin(&latency, woke);
        t.note(Family::Get);
        t.end(&latency, 0, false);
        // The end read the clock once, 1 ms after the reading above: 1.25 ms from the wakeup.
        // Were `begin` to read the clock too, the request would take 1 ms (the 1ms bucket).
        let s = latency.summed(Family::Get);
        assert_eq!(s.sum_ns, 1_250_000);
        assert_eq!(s.buckets[bucket(1_250_000)], 1);
        // A call that finished no request reads no clock at all.
        let before = counting_clock();
        t.begin(&latency, woke);
        t.end(&latency, 0, true);
        assert_eq!(counting_clock(), before + 1_000_000);
    }

    #[test]
    fn switched_off_it_reads_no_clock_and_records_nothing() {
        use std::sync::atomic::{AtomicU64, Ordering};
        // Its own counter: the other clock's is shared with a test running beside this one.
        static READS: AtomicU64 = AtomicU64::new(0);
        fn clock() -> u64 {
            READS.fetch_add(1, Ordering::Relaxed)
        }
        let latency = Latency::new(1, Some(clock)).switched_off();
        assert!(!latency.on());
        let mut t = Tally::default();
        for _ in 0..3 {
            t.begin(&latency, NOW);
            t.note(Family::Get);
            t.note(Family::Set);
            t.end(&latency, 0, true);
        }
        assert_eq!(READS.load(Ordering::Relaxed), 0, "no clock read");
        for (family, _, _) in LABELS {
            assert_eq!(latency.summed(family), Summed::default());
        }
    }

    #[test]
    fn buckets_bound_inclusively() {
        assert_eq!(bucket(0), 0);
        assert_eq!(bucket(5_000), 0);
        assert_eq!(bucket(5_001), 1);
        assert_eq!(bucket(5_000_000_000), 18);
        assert_eq!(bucket(5_000_000_001), 19);
        for (b, label) in BOUNDS_NS.iter().zip(BOUNDS_LABEL) {
            let secs: f64 = label.parse().expect("a number");
            assert!((secs * 1e9 - *b as f64).abs() < 1.0, "{label}");
        }
    }

    #[test]
    fn tally_counts_each_request_once() {
        let latency = Latency::new(2, None);
        let mut t = Tally::default();
        t.begin(&latency, NOW);
        t.note(Family::Get);
        t.note(Family::Get);
        t.note(Family::HttpPut);
        t.end(&latency, 1, false);
        t.begin(&latency, NOW);
        t.end(&latency, 1, false);
        assert_eq!(latency.summed(Family::Get).buckets[0], 2);
        assert_eq!(
            latency.summed(Family::HttpPut).buckets.iter().sum::<u64>(),
            1
        );
        assert_eq!(latency.summed(Family::Set), Summed::default());
    }
}
