//! The memory part: RSS empty and with 1M items, and bytes per item, against memcached; then
//! the items each keeps in a 64 MiB budget over three fresh servers (budget_fill.rs).

use super::budget_fill::{self, FillCount};
use super::doc::{mark, Doc};
use super::memory;
use super::procs;
use super::report::{Better, Table};
use super::subject::Subject;
use anyhow::Result;
use std::fmt::Write as _;

/// Items for the memory-per-item measurement.
const MEMORY_ITEMS: usize = 1_000_000;

/// memcached against the subject, each with a 512 MiB budget.
pub(super) fn memory_part(subject: &Subject, doc: &mut Doc) -> Result<()> {
    let base = {
        let mut server = procs::start_memcached(512)?;
        doc.command(&server.command);
        memory::measure(&mut server, MEMORY_ITEMS)?
    };
    let name = subject.memcache_name();
    let subj = match subject.start_memcache(512, None) {
        Ok(mut server) => {
            doc.command(&server.command);
            memory::measure(&mut server, MEMORY_ITEMS)
        }
        Err(e) => Err(e),
    };
    let subj = subj
        .map_err(|e| doc.note(format!("memory: {name}: {e:#}")))
        .ok();
    let mib = |v: u64| v as f64 / (1024.0 * 1024.0);
    let mut table = Table::new("memcached", name);
    table.row(
        "RSS empty (MiB)",
        mib(base.rss_empty),
        subj.as_ref().map(|r| mib(r.rss_empty)),
        Better::Neither,
        1,
    );
    table.row(
        "RSS with 1M items (MiB)",
        mib(base.rss_full),
        subj.as_ref().map(|r| mib(r.rss_full)),
        Better::Neither,
        1,
    );
    table.row(
        "bytes per item (100 B values, 13 B keys)",
        base.bytes_per_item(),
        subj.as_ref().map(|r| r.bytes_per_item()),
        Better::Lower,
        1,
    );
    if let Some(s) = &subj {
        let ratio = s.bytes_per_item() / base.bytes_per_item();
        doc.targets.push(format!(
            "memory per item {ratio:.2}× memcached (target ≤ 1.0×) {}",
            mark(ratio <= 1.0)
        ));
    }
    doc.command(&format!("memory: {MEMORY_ITEMS} pipelined sets of {} B values; RSS from /proc/PID/status VmRSS before and after; curr_items checked", memory::VALUE_LEN));
    doc.sections.push(format!(
        "## Memory per item ({MEMORY_ITEMS} items, both with a 512 MiB budget)\n\n{}",
        table.markdown()
    ));
    if let Err(e) = budget_fill_part(subject, doc) {
        doc.note(format!("budget fill: failed: {e:#}"));
    }
    Ok(())
}

/// Three fresh servers of each kind filled past a 64 MiB budget; the kept count per run.
fn budget_fill_part(subject: &Subject, doc: &mut Doc) -> Result<()> {
    let name = subject.memcache_name();
    let mut runs: [Vec<FillCount>; 2] = [Vec::new(), Vec::new()];
    for run in 0..budget_fill::RUNS {
        eprintln!(
            "bench: memory: budget fill, run {} of {}",
            run + 1,
            budget_fill::RUNS
        );
        let mut base = procs::start_memcached(budget_fill::BUDGET_MIB)?;
        doc.command(&base.command);
        runs[0].push(budget_fill::measure(&mut base)?);
        drop(base);
        match subject.start_memcache(budget_fill::BUDGET_MIB, None) {
            Ok(mut server) => {
                doc.command(&server.command);
                match budget_fill::measure(&mut server) {
                    Ok(r) => runs[1].push(r),
                    Err(e) => doc.note(format!("budget fill: {name}: {e:#}")),
                }
            }
            Err(e) => doc.note(format!("budget fill: {name} did not start: {e:#}")),
        }
    }
    doc.command(&format!("budget fill: {} runs, each a fresh server with {} MiB: {} sets `set key:NNNNNNNNN 0 0 {} noreply` on one connection, {} per write, then `version`; then every key asked for with gets of 100 keys; hits = full values back", budget_fill::RUNS, budget_fill::BUDGET_MIB, budget_fill::SETS, budget_fill::VALUE_LEN, 1000));
    let mut section = format!("## Items kept in a {} MiB budget ({} noreply sets of {} B values, keys key:000000000..key:{:09}; {} fresh servers each)\n\n| server | run | items read back | curr_items | evictions | hits in the first tenth | hits in the last tenth |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n", budget_fill::BUDGET_MIB, budget_fill::SETS, budget_fill::VALUE_LEN, budget_fill::SETS - 1, budget_fill::RUNS);
    for (who, list) in [("memcached", &runs[0]), (name, &runs[1])] {
        for (i, r) in list.iter().enumerate() {
            let evictions = r.evictions.map_or("n/a".to_string(), |e| e.to_string());
            let _ = writeln!(
                section,
                "| {who} | {} | {} | {} | {evictions} | {} | {} |",
                i + 1,
                r.hits,
                r.curr_items,
                r.hits_first_tenth,
                r.hits_last_tenth
            );
        }
    }
    let medians = runs.each_ref().map(|list| median_hits(list));
    if let [Some((b, b_lo, b_hi)), Some((s, s_lo, s_hi))] = medians {
        let ratio = s as f64 / b.max(1) as f64;
        let _ = writeln!(section, "\nMedian items: memcached {b} ({b_lo}–{b_hi}), {name} {s} ({s_lo}–{s_hi}); {ratio:.2}×.");
        doc.targets.push(format!(
            "items kept in {} MiB: {ratio:.2}× memcached (aim ≥ 1.4×) {}; {name} count stable over {} runs: {}",
            budget_fill::BUDGET_MIB,
            mark(ratio >= 1.4),
            budget_fill::RUNS,
            mark(s_lo == s_hi)
        ));
    }
    doc.sections.push(section);
    Ok(())
}

/// Median, min and max of the hit counts.
fn median_hits(list: &[FillCount]) -> Option<(u64, u64, u64)> {
    let mut hits: Vec<u64> = list.iter().map(|r| r.hits).collect();
    hits.sort_unstable();
    Some((*hits.get(hits.len() / 2)?, *hits.first()?, *hits.last()?))
}
