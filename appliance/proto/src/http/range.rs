//! `Range: bytes=...` on GET: one range is served as 206; several ranges fall back to the
//! whole value (200), which RFC 9110 §14.2 allows and which spares us multipart bodies.

use super::head::{parse_u64_saturating, trim_ows};

/// What to send for a `Range` header against a value of a given length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RangeOutcome {
    /// Send the whole value (no usable range: malformed, several ranges, or a unit other than bytes).
    Full,
    /// Send bytes `first..=last` as 206.
    Partial { first: u64, last: u64 },
    /// 416 with `Content-Range: bytes */len`.
    Unsatisfiable,
}

/// Resolves a `Range` field value against a value of `len` bytes.
pub fn resolve_range(header: &[u8], len: u64) -> RangeOutcome {
    let header = trim_ows(header);
    let Some(unit) = header.get(..5) else {
        return RangeOutcome::Full;
    };
    if !unit.eq_ignore_ascii_case(b"bytes") {
        return RangeOutcome::Full;
    }
    let Some(set) = trim_ows(&header[5..]).strip_prefix(b"=") else {
        return RangeOutcome::Full;
    };
    let mut specs = set
        .split(|&b| b == b',')
        .map(trim_ows)
        .filter(|s| !s.is_empty());
    let Some(spec) = specs.next() else {
        return RangeOutcome::Full;
    };
    if specs.next().is_some() {
        return RangeOutcome::Full;
    }
    let Some(dash) = spec.iter().position(|&b| b == b'-') else {
        return RangeOutcome::Full;
    };
    let (first, last) = (trim_ows(&spec[..dash]), trim_ows(&spec[dash + 1..]));
    if first.is_empty() {
        // Suffix range: the last n bytes.
        let Some(n) = parse_u64_saturating(last) else {
            return RangeOutcome::Full;
        };
        if n == 0 || len == 0 {
            return RangeOutcome::Unsatisfiable;
        }
        return RangeOutcome::Partial {
            first: len.saturating_sub(n),
            last: len - 1,
        };
    }
    let Some(first) = parse_u64_saturating(first) else {
        return RangeOutcome::Full;
    };
    let last = if last.is_empty() {
        u64::MAX
    } else {
        match parse_u64_saturating(last) {
            Some(last) if last >= first => last,
            _ => return RangeOutcome::Full,
        }
    };
    if first >= len {
        return RangeOutcome::Unsatisfiable;
    }
    RangeOutcome::Partial {
        first,
        last: last.min(len - 1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use RangeOutcome::*;

    #[test]
    fn single_ranges() {
        assert_eq!(
            resolve_range(b"bytes=0-0", 10),
            Partial { first: 0, last: 0 }
        );
        assert_eq!(
            resolve_range(b"bytes=2-5", 10),
            Partial { first: 2, last: 5 }
        );
        assert_eq!(
            resolve_range(b"bytes=2-50", 10),
            Partial { first: 2, last: 9 }
        );
        assert_eq!(
            resolve_range(b"bytes=7-", 10),
            Partial { first: 7, last: 9 }
        );
        assert_eq!(
            resolve_range(b"bytes=-3", 10),
            Partial { first: 7, last: 9 }
        );
        assert_eq!(
            resolve_range(b"bytes=-30", 10),
            Partial { first: 0, last: 9 }
        );
        assert_eq!(
            resolve_range(b"Bytes = 1-2 ", 10),
            Partial { first: 1, last: 2 }
        );
        assert_eq!(
            resolve_range(b"bytes=1-99999999999999999999999", 10),
            Partial { first: 1, last: 9 }
        );
    }

    #[test]
    fn unsatisfiable() {
        assert_eq!(resolve_range(b"bytes=10-", 10), Unsatisfiable);
        assert_eq!(resolve_range(b"bytes=10-20", 10), Unsatisfiable);
        assert_eq!(resolve_range(b"bytes=-0", 10), Unsatisfiable);
        assert_eq!(resolve_range(b"bytes=-5", 0), Unsatisfiable);
        assert_eq!(resolve_range(b"bytes=0-", 0), Unsatisfiable);
        assert_eq!(
            resolve_range(b"bytes=99999999999999999999999-", 10),
            Unsatisfiable
        );
    }

    #[test]
    fn ignored_ranges_serve_everything() {
        for h in [
            &b"bytes=0-1,3-4"[..],
            b"items=0-1",
            b"bytes=5-2",
            b"bytes=a-b",
            b"bytes=",
            b"bytes 0-1",
            b"bytes=1",
            b"",
            b"bytes=--1",
        ] {
            assert_eq!(
                resolve_range(h, 10),
                Full,
                "{:?}",
                String::from_utf8_lossy(h)
            );
        }
    }
}
