//! The icount regression check: per-function instructions per request (callgrind's exclusive
//! counts of ringstore's worker thread, cell by cell) against the recorded baseline
//! tests/bench/baseline/icount.tsv, naming every function whose count moved beyond the
//! threshold. `--icount-record` writes the baseline; `--icount-check` fails the run when a
//! function moved.
//!
//! The baseline is one line per (cell, function): `cell<TAB>function<TAB>instructions per
//! request`, the pseudo-function [`TOTAL`] holding the cell's total; functions under
//! [`RECORD_MIN`] per request are left out (they cannot move past the threshold's floor
//! without showing up as new).

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

/// The baseline's place, relative to the workspace root.
pub(super) const BASELINE: &str = "tests/bench/baseline/icount.tsv";
/// The pseudo-function of a cell's total.
pub(super) const TOTAL: &str = "(total)";
/// Functions cheaper than this per request are not recorded.
const RECORD_MIN: f64 = 2.0;
/// A function moved when its count changed by more than this many instructions per request
/// and by more than [`MOVE_REL`] of its baseline: deterministic counts move by a few
/// instructions only where a clock or the store's segment reclaim runs (SET: the pass that
/// reclaims a segment pays for it).
const MOVE_ABS: f64 = 12.0;
const MOVE_REL: f64 = 0.10;
/// The total moved beyond this share of its baseline.
const TOTAL_REL: f64 = 0.02;

/// Per cell, per function: instructions per request.
pub(super) type Profile = BTreeMap<String, BTreeMap<String, f64>>;

/// The exclusive (self) instructions of every function in one callgrind dump: each cost line
/// counts for the `fn=` block it is in, except the line after `calls=` (a call's inclusive
/// cost, which belongs to the callee). Names are spelled once per file with `(id) name` and
/// later as `(id)`.
///
/// Functions whose names end with one of `excluded` (clock-driven work) are left out, and so
/// is what they call: a callee's self count loses the inclusive cost of the calls an excluded
/// function made to it (exact for a leaf such as the item header decoder the reaper calls;
/// for a deeper callee its own callees keep their share).
pub(super) fn self_costs(text: &str, excluded: &[&str]) -> HashMap<String, u64> {
    let mut names: HashMap<&str, &str> = HashMap::new();
    let mut costs: HashMap<&str, u64> = HashMap::new();
    let mut from_excluded: HashMap<&str, u64> = HashMap::new();
    let (mut current, mut callee): (Option<&str>, Option<&str>) = (None, None);
    let mut after_calls = false;
    for line in text.lines() {
        let cost = || {
            line.split_whitespace()
                .skip(1)
                .last()
                .and_then(|n| n.parse::<u64>().ok())
        };
        if std::mem::take(&mut after_calls) {
            let in_excluded = current.is_some_and(|f| excluded.iter().any(|e| f.ends_with(e)));
            if let (true, Some(c), Some(n)) = (in_excluded, callee, cost()) {
                *from_excluded.entry(c).or_default() += n;
            }
            continue;
        }
        if let Some(rest) = line.strip_prefix("fn=") {
            current = Some(name_of(&mut names, rest));
        } else if let Some(rest) = line.strip_prefix("cfn=") {
            callee = Some(name_of(&mut names, rest));
        } else if line.starts_with("calls=") {
            after_calls = true;
        } else if line.starts_with(|c: char| c.is_ascii_digit() || "+-*".contains(c)) {
            if let (Some(f), Some(n)) = (current, cost()) {
                *costs.entry(f).or_default() += n;
            }
        }
    }
    costs
        .into_iter()
        .filter(|(f, _)| !excluded.iter().any(|e| f.ends_with(e)))
        .map(|(f, n)| {
            let less = from_excluded.get(f).copied().unwrap_or(0);
            (f.to_string(), n.saturating_sub(less))
        })
        .collect()
}

/// The function a name-compressed field names, remembering `(id) name` definitions.
fn name_of<'a>(names: &mut HashMap<&'a str, &'a str>, rest: &'a str) -> &'a str {
    match rest.strip_prefix('(').and_then(|t| t.split_once(')')) {
        Some((id, tail)) if !tail.trim().is_empty() => {
            names.insert(id, tail.trim());
            tail.trim()
        }
        Some((id, _)) => names.get(id).copied().unwrap_or(id),
        None => rest,
    }
}

/// Per-request counts of one pass: (long - short) / `n`, function by function.
pub(super) fn per_request(
    short: &HashMap<String, u64>,
    long: &HashMap<String, u64>,
    n: usize,
) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for (f, l) in long {
        let s = short.get(f).copied().unwrap_or(0);
        out.insert(f.clone(), (*l as f64 - s as f64) / n as f64);
    }
    for (f, s) in short {
        out.entry(f.clone()).or_insert(-(*s as f64) / n as f64);
    }
    out
}

/// Function by function, the median over the passes (a function absent from a pass counts 0).
pub(super) fn median_profile(passes: &[BTreeMap<String, f64>]) -> BTreeMap<String, f64> {
    let mut names: Vec<&String> = passes.iter().flat_map(|p| p.keys()).collect();
    names.sort();
    names.dedup();
    names
        .into_iter()
        .map(|f| {
            let v: Vec<f64> = passes
                .iter()
                .map(|p| p.get(f).copied().unwrap_or(0.0))
                .collect();
            (f.clone(), super::icount::median(&v))
        })
        .collect()
}

/// The baseline file's text for `profile`.
pub(super) fn to_tsv(profile: &Profile) -> String {
    let mut s = String::from("# cargo xtask bench --only icount --icount-record: ringstore's worker thread, instructions per request (callgrind, exclusive per function)\n");
    for (cell, functions) in profile {
        for (f, v) in functions {
            if f == TOTAL || v.abs() >= RECORD_MIN {
                let _ = writeln!(s, "{cell}\t{f}\t{v:.1}");
            }
        }
    }
    s
}

/// Reads a baseline written by [`to_tsv`]; `#` lines are comments.
pub(super) fn from_tsv(text: &str) -> Result<Profile, String> {
    let mut profile = Profile::new();
    for (i, line) in text.lines().enumerate() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let mut fields = line.split('\t');
        let (Some(cell), Some(f), Some(v), None) =
            (fields.next(), fields.next(), fields.next(), fields.next())
        else {
            return Err(format!("line {}: expected cell, function, count", i + 1));
        };
        let v: f64 = v
            .parse()
            .map_err(|_| format!("line {}: {v:?} is not a number", i + 1))?;
        profile
            .entry(cell.to_string())
            .or_default()
            .insert(f.to_string(), v);
    }
    Ok(profile)
}

/// One function whose count moved.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Moved {
    pub cell: String,
    pub function: String,
    /// `None`: not in the baseline (or under its recording floor).
    pub before: Option<f64>,
    pub after: f64,
}

impl Moved {
    fn delta(&self) -> f64 {
        self.after - self.before.unwrap_or(0.0)
    }
}

/// Whether `before` -> `after` is beyond the threshold (the total's own, or a function's).
fn beyond(function: &str, before: f64, after: f64) -> bool {
    let delta = (after - before).abs();
    if function == TOTAL {
        return delta > TOTAL_REL * before.abs();
    }
    delta > MOVE_ABS && delta > MOVE_REL * before.abs()
}

/// Every (cell, function) of `now` or `baseline` that moved beyond the threshold, the
/// largest moves first within each cell; a cell the baseline lacks is not compared.
pub(super) fn compare(baseline: &Profile, now: &Profile) -> Vec<Moved> {
    let mut moved = Vec::new();
    for (cell, functions) in now {
        let Some(base) = baseline.get(cell) else {
            continue;
        };
        let mut here: Vec<Moved> = Vec::new();
        let names = functions
            .keys()
            .chain(base.keys().filter(|f| !functions.contains_key(*f)));
        for f in names {
            let before = base.get(f).copied();
            let after = functions.get(f).copied().unwrap_or(0.0);
            if beyond(f, before.unwrap_or(0.0), after) {
                here.push(Moved {
                    cell: cell.clone(),
                    function: f.clone(),
                    before,
                    after,
                });
            }
        }
        here.sort_by(|a, b| b.delta().abs().total_cmp(&a.delta().abs()));
        moved.extend(here);
    }
    moved
}

/// The results.md section of the comparison.
pub(super) fn render(moved: &[Moved], compared: usize) -> String {
    let mut s = format!(
        "### icount against the baseline ({BASELINE})\n\nThreshold: a function moved when its instructions per request changed by more than {MOVE_ABS} and by more than {:.0}% of its baseline; a cell's total, by more than {:.0}%. Cells compared: {compared}.\n\n",
        MOVE_REL * 100.0,
        TOTAL_REL * 100.0
    );
    if moved.is_empty() {
        s.push_str("Nothing moved.\n");
        return s;
    }
    s.push_str(
        "| cell | function | baseline | now | change |\n| --- | --- | ---: | ---: | ---: |\n",
    );
    for m in moved {
        let before = m.before.map_or("—".to_string(), |b| format!("{b:.1}"));
        let _ = writeln!(
            s,
            "| {} | `{}` | {before} | {:.1} | {:+.1} |",
            m.cell,
            m.function,
            m.after,
            m.delta()
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile(rows: &[(&str, &str, f64)]) -> Profile {
        let mut p = Profile::new();
        for (c, f, v) in rows {
            p.entry(c.to_string())
                .or_default()
                .insert(f.to_string(), *v);
        }
        p
    }

    #[test]
    fn self_costs_leave_each_call_to_its_callee() {
        let text = "events: Ir\nfn=(1) main\n5 100\n+1 20\ncfn=(2) work\ncalls=3 10\n6 4000\n\
                    fn=(2)\n10 3900\n* 100\nfn=(3) other\n-2 7\ncfn=(2)\ncalls=1 10\n+2 500\n";
        let c = self_costs(text, &[]);
        assert_eq!(c["main"], 120, "the call's 4000 is work's, not main's");
        assert_eq!(c["work"], 4000);
        assert_eq!(c["other"], 7);
        assert_eq!(c.len(), 3);
        let c = self_costs(text, &["::other"]);
        assert_eq!(c["work"], 4000, "other is not ::other");
        let c = self_costs(text, &["other"]);
        assert_eq!(
            c["work"], 3500,
            "what the excluded function called is left out"
        );
        assert!(!c.contains_key("other"));
        assert_eq!(c["main"], 120);
    }

    #[test]
    fn per_request_and_median_take_the_difference_of_the_passes() {
        let short: HashMap<String, u64> = [("a".into(), 1000), ("gone".into(), 50)].into();
        let long: HashMap<String, u64> = [("a".into(), 3000), ("new".into(), 400)].into();
        let p = per_request(&short, &long, 100);
        assert_eq!(p["a"], 20.0);
        assert_eq!(p["new"], 4.0);
        assert_eq!(p["gone"], -0.5);
        let passes = [p.clone(), [("a".to_string(), 99.0)].into(), p];
        let m = median_profile(&passes);
        assert_eq!(m["a"], 20.0, "one odd pass does not move the median");
        assert_eq!(m["new"], 4.0);
    }

    #[test]
    fn the_baseline_round_trips_without_the_small_functions() {
        let p = profile(&[
            ("GET 100 B, depth 1", TOTAL, 4392.0),
            ("GET 100 B, depth 1", "a::b<H>::c", 310.5),
            ("GET 100 B, depth 1", "tiny", 0.5),
            ("SET 100 B, depth 16", "x", -12.0),
        ]);
        let back = from_tsv(&to_tsv(&p)).unwrap();
        assert_eq!(back["GET 100 B, depth 1"].len(), 2);
        assert_eq!(back["GET 100 B, depth 1"]["a::b<H>::c"], 310.5);
        assert_eq!(back["SET 100 B, depth 16"]["x"], -12.0);
        assert!(from_tsv("a\tb\n").is_err());
        assert!(from_tsv("a\tb\tc\n").is_err());
        assert!(from_tsv("a\tb\t1\t2\n").is_err());
    }

    #[test]
    fn compare_names_what_moved_beyond_the_threshold() {
        let cell = "GET 100 B, depth 1";
        let base = profile(&[
            (cell, TOTAL, 4000.0),
            (cell, "steady", 300.0),
            (cell, "small_wobble", 30.0),
            (cell, "grew", 100.0),
            (cell, "removed", 160.0),
            ("other cell", "x", 1.0),
        ]);
        let now = profile(&[
            (cell, TOTAL, 4100.0),
            (cell, "steady", 325.0),      // +25 but under 10%
            (cell, "small_wobble", 40.0), // +33% but under 12 instructions
            (cell, "grew", 140.0),
            (cell, "added", 50.0),
            ("not in the baseline", "y", 900.0),
        ]);
        let moved = compare(&base, &now);
        let names: Vec<&str> = moved.iter().map(|m| m.function.as_str()).collect();
        assert_eq!(names, ["removed", TOTAL, "added", "grew"]);
        assert_eq!(moved[0].before, Some(160.0));
        assert_eq!(moved[0].after, 0.0);
        assert_eq!(moved[2].before, None);
        assert!(compare(&base, &base).is_empty());
        let table = render(&moved, 1);
        assert!(table.contains("| GET 100 B, depth 1 | `grew` | 100.0 | 140.0 | +40.0 |"));
        assert!(render(&[], 1).contains("Nothing moved."));
    }
}
