//! Result tables as markdown: one row per metric with the baseline, ringstore, and their ratio.

use std::fmt::Write;

/// Which way a metric is better (shown beside the ratio so the table reads on its own).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Better {
    Higher,
    Lower,
    /// Context, not a goal (e.g. a load generator's CPU use).
    Neither,
}

struct Row {
    metric: String,
    baseline: f64,
    ringstore: Option<f64>,
    better: Better,
    decimals: usize,
}

/// A markdown table: metric | baseline | subject (ringstore) | ratio.
pub struct Table {
    baseline_name: String,
    subject_name: String,
    rows: Vec<Row>,
}

impl Table {
    pub fn new(baseline_name: &str, subject_name: &str) -> Self {
        Table {
            baseline_name: baseline_name.to_string(),
            subject_name: subject_name.to_string(),
            rows: Vec::new(),
        }
    }

    /// Adds a row; `ringstore` is `None` when it could not be measured.
    pub fn row(
        &mut self,
        metric: &str,
        baseline: f64,
        ringstore: Option<f64>,
        better: Better,
        decimals: usize,
    ) {
        self.rows.push(Row {
            metric: metric.to_string(),
            baseline,
            ringstore,
            better,
            decimals,
        });
    }

    pub fn markdown(&self) -> String {
        let mut out = String::new();
        let (base, subject) = (&self.baseline_name, &self.subject_name);
        let _ = writeln!(
            out,
            "| metric | {base} | {subject} | ratio ({subject} / {base}) |"
        );
        out.push_str("| --- | ---: | ---: | ---: |\n");
        for row in &self.rows {
            let ring = row
                .ringstore
                .map_or("n/a".to_string(), |v| format_number(v, row.decimals));
            let ratio = match row.ringstore {
                Some(v) if row.baseline > 0.0 && v.is_finite() => {
                    let hint = match row.better {
                        Better::Higher => " (higher is better)",
                        Better::Lower => " (lower is better)",
                        Better::Neither => "",
                    };
                    format!("{:.2}×{hint}", v / row.baseline)
                }
                _ => "n/a".to_string(),
            };
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} |",
                row.metric,
                format_number(row.baseline, row.decimals),
                ring,
                ratio
            );
        }
        out
    }
}

/// `1234567.8` with 0 decimals -> `1 234 568` (thin groups keep wide numbers readable).
pub fn format_number(value: f64, decimals: usize) -> String {
    if !value.is_finite() {
        return "n/a".to_string();
    }
    let text = format!("{value:.decimals$}");
    let (int, frac) = match text.split_once('.') {
        Some((i, f)) => (i.to_string(), Some(f.to_string())),
        None => (text.clone(), None),
    };
    let (sign, digits) = int
        .strip_prefix('-')
        .map_or(("", int.as_str()), |d| ("-", d));
    let mut grouped = String::new();
    for (i, ch) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            grouped.push(' ');
        }
        grouped.push(ch);
    }
    match frac {
        Some(f) => format!("{sign}{grouped}.{f}"),
        None => format!("{sign}{grouped}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_thousands() {
        assert_eq!(format_number(1_234_567.8, 0), "1 234 568");
        assert_eq!(format_number(12.345, 1), "12.3");
        assert_eq!(format_number(-1000.0, 0), "-1 000");
        assert_eq!(format_number(999.0, 0), "999");
        assert_eq!(format_number(f64::NAN, 1), "n/a");
    }

    #[test]
    fn table_has_ratio_and_handles_missing_values() {
        let mut t = Table::new("memcached", "ringstore");
        t.row(
            "GET throughput",
            100_000.0,
            Some(150_000.0),
            Better::Higher,
            0,
        );
        t.row("SET p99 (µs)", 80.0, None, Better::Lower, 1);
        let md = t.markdown();
        assert!(
            md.starts_with("| metric | memcached | ringstore | ratio (ringstore / memcached) |"),
            "{md}"
        );
        assert!(
            md.contains("| GET throughput | 100 000 | 150 000 | 1.50× (higher is better) |"),
            "{md}"
        );
        assert!(md.contains("| SET p99 (µs) | 80.0 | n/a | n/a |"), "{md}");
    }
}
