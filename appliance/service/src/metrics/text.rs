//! The exposition writer: Prometheus text format 0.0.4, or OpenMetrics 1.0 (counter families
//! named without `_total`, samples with it, `# EOF` at the end).

/// A metric family's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// Appends metric families to a buffer.
pub struct Exposition<'a> {
    out: &'a mut Vec<u8>,
    open_metrics: bool,
    /// The family last headed is a counter (its samples get `_total` under OpenMetrics).
    counter: bool,
}

impl<'a> Exposition<'a> {
    pub fn new(out: &'a mut Vec<u8>, open_metrics: bool) -> Exposition<'a> {
        Exposition {
            out,
            open_metrics,
            counter: false,
        }
    }

    /// `# HELP` and `# TYPE` of the family `name`.
    pub fn head(&mut self, name: &str, kind: Kind, help: &str) {
        self.counter = kind == Kind::Counter;
        let family = if self.open_metrics && self.counter {
            name.strip_suffix("_total").unwrap_or(name)
        } else {
            name
        };
        for (tag, text) in [("HELP", help), ("TYPE", kind.name())] {
            self.out.extend_from_slice(b"# ");
            self.out.extend_from_slice(tag.as_bytes());
            self.out.push(b' ');
            self.out.extend_from_slice(family.as_bytes());
            self.out.push(b' ');
            self.out.extend_from_slice(text.as_bytes());
            self.out.push(b'\n');
        }
    }

    /// One sample: `labels` already formatted (`a="b",c="d"`, or empty).
    pub fn sample(&mut self, name: &str, labels: &str, value: &str) {
        self.name(name);
        if !labels.is_empty() {
            self.out.push(b'{');
            self.out.extend_from_slice(labels.as_bytes());
            self.out.push(b'}');
        }
        self.value(value);
    }

    /// One sample with label pairs whose values are escaped.
    pub fn sample_labelled(&mut self, name: &str, labels: &[(&str, &str)], value: &str) {
        self.name(name);
        self.labels(labels);
        self.value(value);
    }

    /// One sample with a whole-number value.
    pub fn sample_u64(&mut self, name: &str, labels: &[(&str, &str)], value: u64) {
        self.name(name);
        self.labels(labels);
        self.out.push(b' ');
        ringstore_proto::memcache::reply::push_u64(self.out, value);
        self.out.push(b'\n');
    }

    /// Ends the exposition (`# EOF` under OpenMetrics).
    pub fn finish(self) {
        if self.open_metrics {
            self.out.extend_from_slice(b"# EOF\n");
        }
    }

    fn name(&mut self, name: &str) {
        self.out.extend_from_slice(name.as_bytes());
        if self.open_metrics && self.counter && !name.ends_with("_total") {
            self.out.extend_from_slice(b"_total");
        }
    }

    fn labels(&mut self, labels: &[(&str, &str)]) {
        if labels.is_empty() {
            return;
        }
        self.out.push(b'{');
        for (i, (k, v)) in labels.iter().enumerate() {
            if i > 0 {
                self.out.push(b',');
            }
            self.out.extend_from_slice(k.as_bytes());
            self.out.extend_from_slice(b"=\"");
            for &b in v.as_bytes() {
                match b {
                    b'\\' => self.out.extend_from_slice(b"\\\\"),
                    b'"' => self.out.extend_from_slice(b"\\\""),
                    b'\n' => self.out.extend_from_slice(b"\\n"),
                    _ => self.out.push(b),
                }
            }
            self.out.push(b'"');
        }
        self.out.push(b'}');
    }

    fn value(&mut self, value: &str) {
        self.out.push(b' ');
        self.out.extend_from_slice(value.as_bytes());
        self.out.push(b'\n');
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_follow_each_format() {
        for (open, want) in [
            (false, "# HELP up_seconds x\n# TYPE up_seconds counter\nup_seconds{a=\"q\\\"\"} 3\n"),
            (true, "# HELP up_seconds x\n# TYPE up_seconds counter\nup_seconds_total{a=\"q\\\"\"} 3\n# EOF\n"),
        ] {
            let mut out = Vec::new();
            let mut e = Exposition::new(&mut out, open);
            e.head("up_seconds", Kind::Counter, "x");
            e.sample_labelled("up_seconds", &[("a", "q\"")], "3");
            e.finish();
            assert_eq!(String::from_utf8(out).unwrap(), want);
        }
    }
}
