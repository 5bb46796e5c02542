//! The load generator's latency histogram: the `hdrhistogram` crate (3 significant digits,
//! fixed size, no allocation per sample) behind the four calls the generator makes.

/// Values up to 2^40 ns (about 18 minutes) keep full precision; larger ones saturate.
const MAX_NANOS: u64 = 1 << 40;
/// Significant decimal digits kept: a reported percentile is within 0.1% of the sample.
const SIGNIFICANT: u8 = 3;

/// A duration in nanoseconds, saturating at u64::MAX (584 years).
pub fn nanos(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Counts of nanosecond latencies.
#[derive(Clone)]
pub struct Histogram(hdrhistogram::Histogram<u64>);

impl Default for Histogram {
    #[expect(
        clippy::expect_used,
        reason = "constant bounds that hdrhistogram accepts (max >= 2, 3 digits <= 5)"
    )]
    fn default() -> Self {
        Histogram(
            hdrhistogram::Histogram::new_with_max(MAX_NANOS, SIGNIFICANT)
                .expect("valid histogram bounds"),
        )
    }
}

impl Histogram {
    pub fn record(&mut self, nanos: u64) {
        self.0.saturating_record(nanos);
    }

    #[cfg(test)]
    pub fn count(&self) -> u64 {
        self.0.len()
    }

    /// Adds every sample of `other`.
    #[expect(
        clippy::expect_used,
        reason = "both sides have the same bounds, so every count fits"
    )]
    pub fn merge(&mut self, other: &Histogram) {
        self.0.add(&other.0).expect("histograms of the same bounds");
    }

    pub fn clear(&mut self) {
        self.0.reset();
    }

    /// The value at quantile `q` (0.0..=1.0) in nanoseconds, the top of its bucket (reported
    /// percentiles never understate); 0 when empty.
    pub fn quantile(&self, q: f64) -> u64 {
        if self.0.is_empty() {
            return 0;
        }
        self.0.highest_equivalent(self.0.value_at_quantile(q))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_values_are_exact() {
        let mut h = Histogram::default();
        for v in 0..32 {
            h.record(v);
        }
        assert_eq!(h.quantile(0.5), 15);
        assert_eq!(h.quantile(1.0), 31);
    }

    #[test]
    fn quantiles_follow_the_distribution() {
        let mut h = Histogram::default();
        for v in 1..=10_000u64 {
            h.record(v * 1_000);
        }
        let p50 = h.quantile(0.5) as f64;
        let p99 = h.quantile(0.99) as f64;
        assert!((p50 / 5_000_000.0 - 1.0).abs() < 0.002, "p50 {p50}");
        assert!((p99 / 9_900_000.0 - 1.0).abs() < 0.002, "p99 {p99}");
        assert!(p99 >= 9_900_000.0, "a percentile never understates: {p99}");
        assert_eq!(h.count(), 10_000);
        let mut twice = h.clone();
        twice.merge(&h);
        assert_eq!(twice.count(), 20_000);
        assert_eq!(twice.quantile(0.5), h.quantile(0.5));
        h.clear();
        assert_eq!(h.quantile(0.99), 0);
    }

    #[test]
    fn huge_values_saturate_instead_of_panicking() {
        let mut h = Histogram::default();
        h.record(u64::MAX);
        assert!(h.quantile(1.0) >= 1 << 39);
    }
}
