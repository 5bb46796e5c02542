//! The tail part (issue 24, "Tail latency"): GET and SET 100 B at depth 1 over 64 connections,
//! each server first run closed loop for its own peak, then paced (open loop, loadgen's
//! `run_paced`) at 70% of that peak; p50/p99/p99.9 count from each request's due time.
//!
//! Both servers are pinned as in the memcache cells (CPU 0, one worker; memcached `-t 1`) and
//! measured in alternating slices, so a loaded machine hits both alike.

use super::cells::{cell_name, keyspace};
use super::doc::{mark, Doc};
use super::mcwire::Op;
use super::memcache_part::cell_spec;
use super::options::{Options, Part};
use super::procs::{self, Pinned};
use super::report::{Better, Table};
use super::subject::Subject;
use super::{fill, loadgen};
use anyhow::{bail, Context, Result};
use std::time::Duration;

/// Connections per server, as the cells ask.
const TAIL_CONNS: usize = 64;
/// The paced load, as a fraction of each server's own closed-loop peak.
const LOAD_FRACTION: f64 = 0.7;
/// The closed-loop peak run per server: short, in two alternating slices.
const PEAK_MEASURE: Duration = Duration::from_secs(2);
const PEAK_SLICES: u32 = 2;
/// A paced run that achieves less than this share of its rate fell behind its schedule.
const BEHIND_SCHEDULE: f64 = 0.97;
const VALUE_LEN: usize = 100;
const DEPTH: usize = 1;

/// One server's load in the tail cells.
fn spec(o: &Options, server: &Pinned, op: Op) -> loadgen::LoadSpec {
    loadgen::LoadSpec {
        conns: TAIL_CONNS,
        ..cell_spec(o, server, op, VALUE_LEN, DEPTH)
    }
}

/// What one cell measured for both servers: closed-loop peaks, then the paced runs.
struct TailCell {
    peaks: [f64; 2],
    rates: [f64; 2],
    paced: [loadgen::LoadResult; 2],
}

fn pair(results: Vec<loadgen::LoadResult>) -> Result<[loadgen::LoadResult; 2]> {
    let [a, b]: [loadgen::LoadResult; 2] = results
        .try_into()
        .map_err(|_| anyhow::anyhow!("expected two results"))?;
    if a.requests == 0 || b.requests == 0 {
        bail!("a server completed no request");
    }
    Ok([a, b])
}

fn tail_cell(o: &Options, servers: [&mut Pinned; 2], op: Op) -> Result<TailCell> {
    let cell = cell_name(op, VALUE_LEN, DEPTH);
    let specs = [spec(o, servers[0], op), spec(o, servers[1], op)];
    eprintln!("bench: tail: {cell}: closed-loop peaks, in alternating slices");
    let peak_specs: Vec<loadgen::LoadSpec> = specs
        .iter()
        .map(|s| loadgen::LoadSpec {
            measure: PEAK_MEASURE,
            slices: PEAK_SLICES,
            ..s.clone()
        })
        .collect();
    let peak = pair(loadgen::run(&peak_specs)?)?;
    let peaks = [peak[0].throughput(), peak[1].throughput()];
    let rates = peaks.map(|p| p * LOAD_FRACTION);
    eprintln!(
        "bench: tail: {cell}: paced at {:.0} and {:.0} req/s ({:.0}% of each peak)",
        rates[0],
        rates[1],
        LOAD_FRACTION * 100.0
    );
    let paced = pair(loadgen::run_paced(&specs, &rates)?)?;
    for server in servers {
        server.check_alive()?;
    }
    Ok(TailCell {
        peaks,
        rates,
        paced,
    })
}

/// The cell's rows, the behind-schedule notes, and the p99 target.
fn record(table: &mut Table, doc: &mut Doc, names: [&str; 2], cell: &str, t: &TailCell) {
    let [b, s] = &t.paced;
    let rows: [(&str, f64, f64, Better, usize); 6] = [
        (
            "closed-loop peak (req/s)",
            t.peaks[0],
            t.peaks[1],
            Better::Higher,
            0,
        ),
        (
            "paced rate asked, 70% of peak (req/s)",
            t.rates[0],
            t.rates[1],
            Better::Neither,
            0,
        ),
        (
            "paced rate achieved (req/s)",
            b.throughput(),
            s.throughput(),
            Better::Neither,
            0,
        ),
        ("p50 latency (µs)", b.p50_us(), s.p50_us(), Better::Lower, 1),
        ("p99 latency (µs)", b.p99_us(), s.p99_us(), Better::Lower, 1),
        (
            "p99.9 latency (µs)",
            b.p999_us(),
            s.p999_us(),
            Better::Lower,
            1,
        ),
    ];
    for (what, base, subject, better, digits) in rows {
        table.row(
            &format!("{cell}: {what}"),
            base,
            Some(subject),
            better,
            digits,
        );
    }
    for ((name, r), rate) in names.iter().zip(&t.paced).zip(t.rates) {
        if r.throughput() < BEHIND_SCHEDULE * rate {
            doc.note(format!(
                "tail {cell}: {name} achieved {:.0} of {rate:.0} req/s asked: behind its schedule",
                r.throughput()
            ));
        }
        if r.misses + r.errors > 0 {
            doc.note(format!(
                "tail {cell}: {name} answered {} misses and {} errors",
                r.misses, r.errors
            ));
        }
    }
    let p99 = s.p99_us() / b.p99_us();
    doc.targets.push(format!(
        "tail {cell}, 64 connections at 70% of each server's peak: p99 {p99:.2}× {}'s (goal ≤ 1.0×) {}",
        names[0],
        mark(p99 <= 1.0)
    ));
}

fn tail_part(o: &Options, subject: &Subject, doc: &mut Doc) -> Result<()> {
    let mut base = procs::start_memcached(1024)?;
    let mut subj = subject
        .start_memcache(1024, o.io.as_deref())
        .context("starting the subject for the tail cells")?;
    doc.command(&base.command);
    doc.command(&subj.command);
    for server in [&base, &subj] {
        fill::preload(server.port, VALUE_LEN, keyspace(VALUE_LEN))?;
    }
    doc.command(&format!(
        "tail cells (xtask/src/bench/tail.rs): per cell, each server closed loop for {} s in {PEAK_SLICES} alternating slices (its peak), then paced open loop at {:.0}% of its own peak: {TAIL_CONNS} connections per server at depth {DEPTH}, each sending on a fixed schedule, latency from the due time; {} s measured per server after {} s warm-up, in alternating slices",
        PEAK_MEASURE.as_secs(),
        LOAD_FRACTION * 100.0,
        o.seconds,
        super::WARMUP.as_secs()
    ));
    let names = ["memcached", subject.memcache_name()];
    let mut table = Table::new(names[0], names[1]);
    for op in [Op::Get, Op::Set] {
        let cell = cell_name(op, VALUE_LEN, DEPTH);
        let t = tail_cell(o, [&mut base, &mut subj], op).with_context(|| format!("tail {cell}"))?;
        record(&mut table, doc, names, &cell, &t);
    }
    let mut section = format!(
        "## Tail latency: {TAIL_CONNS} connections at depth {DEPTH}, paced at {:.0}% of each server's own peak (one server core each)\n\n",
        LOAD_FRACTION * 100.0
    );
    section.push_str(&table.markdown());
    doc.sections.push(section);
    Ok(())
}

/// The tail part in a bench run: `--only tail` stops on its error; in the full run an error
/// costs only this part (a note).
pub(super) fn tail_step(o: &Options, subject: &Subject, doc: &mut Doc) -> Result<()> {
    match o.only {
        Some(Part::Tail) => tail_part(o, subject, doc),
        None => {
            if let Err(e) = tail_part(o, subject, doc) {
                doc.note(format!("tail part failed: {e:#}"));
            }
            Ok(())
        }
        Some(_) => Ok(()),
    }
}
