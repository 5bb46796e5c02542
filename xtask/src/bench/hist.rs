//! Log-linear latency histogram: 32 linear sub-buckets per power of two (about 3% error),
//! fixed size, no allocation per sample, so the load generator can record every request.

/// Linear sub-buckets per power of two (2^SUB_BITS).
const SUB_BITS: u32 = 5;
const SUB: u64 = 1 << SUB_BITS;
/// Values up to 2^40 ns (about 18 minutes) are kept exactly to bucket precision; larger clamp.
const EXP_MAX: u32 = 40;
#[expect(
    clippy::cast_possible_truncation,
    reason = "a const of (40 - SUB_BITS + 2) * 2^SUB_BITS, a few thousand"
)]
const BUCKETS: usize = ((EXP_MAX - SUB_BITS + 2) as usize) * SUB as usize;

/// A duration in nanoseconds, saturating at u64::MAX (584 years).
pub fn nanos(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Counts of nanosecond latencies.
#[derive(Clone)]
pub struct Histogram {
    counts: Vec<u64>,
    total: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: vec![0; BUCKETS],
            total: 0,
        }
    }
}

#[expect(
    clippy::cast_possible_truncation,
    reason = "the value is clamped below 2^EXP_MAX, so the index is below BUCKETS"
)]
fn index_of(value: u64) -> usize {
    let value = value.min((1u64 << EXP_MAX) - 1);
    if value < SUB {
        return value as usize;
    }
    let exp = 63 - value.leading_zeros();
    let shift = exp - SUB_BITS;
    // Values in [2^exp, 2^(exp+1)) land in row `shift + 1`, column by the next SUB_BITS bits.
    ((shift as u64 + 1) * SUB + ((value >> shift) & (SUB - 1))) as usize
}

/// The largest value that lands in bucket `index` (reported percentiles never understate).
fn upper_bound_of(index: usize) -> u64 {
    let index = index as u64;
    if index < SUB {
        return index;
    }
    let row = index / SUB;
    let col = index % SUB;
    let shift = row - 1;
    ((SUB + col) << shift) + (1u64 << shift) - 1
}

impl Histogram {
    pub fn record(&mut self, nanos: u64) {
        self.counts[index_of(nanos)] += 1;
        self.total += 1;
    }

    #[cfg(test)]
    pub fn count(&self) -> u64 {
        self.total
    }

    /// Adds every sample of `other`.
    pub fn merge(&mut self, other: &Histogram) {
        for (mine, theirs) in self.counts.iter_mut().zip(&other.counts) {
            *mine += theirs;
        }
        self.total += other.total;
    }

    pub fn clear(&mut self) {
        self.counts.iter_mut().for_each(|c| *c = 0);
        self.total = 0;
    }

    /// The value at quantile `q` (0.0..=1.0) in nanoseconds; 0 when empty.
    #[expect(
        clippy::cast_possible_truncation,
        reason = "a float-to-int cast saturates; the rank is clamped to 1..=total"
    )]
    pub fn quantile(&self, q: f64) -> u64 {
        if self.total == 0 {
            return 0;
        }
        let rank = ((q * self.total as f64).ceil() as u64).clamp(1, self.total);
        let mut seen = 0;
        for (index, &count) in self.counts.iter().enumerate() {
            seen += count;
            if seen >= rank {
                return upper_bound_of(index);
            }
        }
        upper_bound_of(BUCKETS - 1)
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
    fn buckets_cover_values_and_error_is_bounded() {
        for v in [
            32u64,
            33,
            63,
            64,
            100,
            1_000,
            12_345,
            1_000_000,
            987_654_321,
        ] {
            let i = index_of(v);
            let hi = upper_bound_of(i);
            assert!(hi >= v, "{v} above its bucket bound {hi}");
            assert!((hi - v) as f64 <= v as f64 / 16.0, "{v} -> {hi} too coarse");
            if i > 0 {
                assert!(upper_bound_of(i - 1) < v, "{v} also fits the bucket below");
            }
        }
    }

    #[test]
    fn quantiles_follow_the_distribution() {
        let mut h = Histogram::default();
        for v in 1..=10_000u64 {
            h.record(v * 1_000);
        }
        let p50 = h.quantile(0.5) as f64;
        let p99 = h.quantile(0.99) as f64;
        assert!((p50 / 5_000_000.0 - 1.0).abs() < 0.05, "p50 {p50}");
        assert!((p99 / 9_900_000.0 - 1.0).abs() < 0.05, "p99 {p99}");
        assert_eq!(h.count(), 10_000);
        let mut twice = h.clone();
        twice.merge(&h);
        assert_eq!(twice.count(), 20_000);
        assert_eq!(twice.quantile(0.5), h.quantile(0.5));
        h.clear();
        assert_eq!(h.quantile(0.99), 0);
    }

    #[test]
    fn huge_values_clamp_instead_of_panicking() {
        let mut h = Histogram::default();
        h.record(u64::MAX);
        assert!(h.quantile(1.0) >= 1 << 39);
    }
}
