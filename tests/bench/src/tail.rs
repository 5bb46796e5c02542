//! The tail part (issue 24, "Tail latency"): GET and SET 100 B at depth 1 over 64 connections,
//! each server first run closed loop for its own peak, then paced (open loop, the load
//! generator's `run_paced`) at 70% of that peak; p50/p99/p99.9 count from each request's due time.
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
use super::{client, fill};
use anyhow::{bail, Context, Result};
use std::time::Duration;

/// Connections per server, as the cells ask.
const TAIL_CONNS: usize = 64;
/// The paced load, as a fraction of each server's own closed-loop peak.
const LOAD_FRACTION: f64 = 0.7;
/// The closed-loop peak run per server: short, in alternating slices; the peak is the median
/// slice's throughput (on a shared machine one slice can be starved by other work, another
/// run while the machine was quiet: 70% of either would under- or overload the server).
const PEAK_MEASURE: Duration = Duration::from_secs(2);
const PEAK_SLICES: u32 = 5;
/// Paced slices per measured second: short slices interleave the servers finely, so a burst
/// of other work on the machine lands on each of them alike.
const PACED_SLICES_PER_SECOND: u64 = 3;
/// A paced run that achieves less than this share of its rate fell behind its schedule.
const BEHIND_SCHEDULE: f64 = 0.97;
const VALUE_LEN: usize = 100;
const DEPTH: usize = 1;

/// One server's load in the tail cells.
fn spec(o: &Options, server: &Pinned, op: Op) -> client::LoadSpec {
    client::LoadSpec {
        conns: TAIL_CONNS,
        slices: u32::try_from(o.seconds * PACED_SLICES_PER_SECOND).unwrap_or(u32::MAX),
        ..cell_spec(o, server, op, VALUE_LEN, DEPTH)
    }
}

/// What one cell measured for one server: the closed-loop peak run, the rate it was paced
/// at, and the paced run.
struct Measured {
    peak: client::LoadResult,
    rate: f64,
    paced: client::LoadResult,
}

fn all_answered(results: Vec<client::LoadResult>, count: usize) -> Result<Vec<client::LoadResult>> {
    if results.len() != count || results.iter().any(|r| r.requests == 0) {
        bail!("a server completed no request");
    }
    Ok(results)
}

/// Runs one cell against every server (alternating slices): closed-loop peaks, then each
/// paced at `LOAD_FRACTION` of its own peak. Also returns the host's steal of CPU 0 and CPU 1
/// (seconds) during the paced slices: on a VM a vCPU descheduled for tens of ms puts that
/// stall into every request due meanwhile, which a p99 of a few seconds' slices shows.
fn tail_cell(
    o: &Options,
    servers: &mut [&mut Pinned],
    op: Op,
) -> Result<(Vec<Measured>, [f64; 2])> {
    let cell = cell_name(op, VALUE_LEN, DEPTH);
    let specs: Vec<client::LoadSpec> = servers.iter().map(|s| spec(o, s, op)).collect();
    eprintln!("bench: tail: {cell}: closed-loop peaks, in alternating slices");
    let peak_specs: Vec<client::LoadSpec> = specs
        .iter()
        .map(|s| client::LoadSpec {
            measure: PEAK_MEASURE,
            slices: PEAK_SLICES,
            ..s.clone()
        })
        .collect();
    let peaks = all_answered(client::run(&peak_specs)?, specs.len())?;
    let rates: Vec<f64> = peaks
        .iter()
        .map(|p| p.median_slice_throughput() * LOAD_FRACTION)
        .collect();
    eprintln!(
        "bench: tail: {cell}: paced at {rates:.0?} req/s ({:.0}% of each peak)",
        LOAD_FRACTION * 100.0
    );
    let ticks_before = [procs::CoreTicks::read(0)?, procs::CoreTicks::read(1)?];
    let paced = all_answered(client::run_paced(&specs, &rates)?, specs.len())?;
    let ticks_after = [procs::CoreTicks::read(0)?, procs::CoreTicks::read(1)?];
    for server in servers.iter_mut() {
        server.check_alive()?;
    }
    let steal = [0, 1].map(|c| ticks_before[c].steal_seconds_until(&ticks_after[c]));
    let measured = peaks
        .into_iter()
        .zip(rates)
        .zip(paced)
        .map(|((peak, rate), paced)| Measured { peak, rate, paced })
        .collect();
    Ok((measured, steal))
}

/// A row's metric, its reading of a server's results, which way is better, and its decimals.
type Metric = (&'static str, fn(&Measured) -> f64, Better, usize);

const METRICS: [Metric; 9] = [
    (
        "closed-loop peak, median slice (req/s)",
        |m| m.peak.median_slice_throughput(),
        Better::Higher,
        0,
    ),
    (
        "closed loop: server CPU (%)",
        |m| m.peak.server_cpu_percent(),
        Better::Neither,
        0,
    ),
    (
        "paced rate asked, 70% of peak (req/s)",
        |m| m.rate,
        Better::Neither,
        0,
    ),
    (
        "paced rate achieved (req/s)",
        |m| m.paced.throughput(),
        Better::Neither,
        0,
    ),
    (
        "paced: server CPU (%)",
        |m| m.paced.server_cpu_percent(),
        Better::Neither,
        0,
    ),
    (
        "paced: client CPU (%)",
        |m| m.paced.client_cpu_percent(),
        Better::Neither,
        0,
    ),
    ("p50 latency (µs)", |m| m.paced.p50_us(), Better::Lower, 1),
    ("p99 latency (µs)", |m| m.paced.p99_us(), Better::Lower, 1),
    (
        "p99.9 latency (µs)",
        |m| m.paced.p999_us(),
        Better::Lower,
        1,
    ),
];

/// One table's rows for a cell: `b` in the baseline column, `s` in the subject's.
fn rows(table: &mut Table, cell: &str, b: &Measured, s: &Measured) {
    for (what, read, better, digits) in METRICS {
        table.row(
            &format!("{cell}: {what}"),
            read(b),
            Some(read(s)),
            better,
            digits,
        );
    }
}

/// The behind-schedule and miss notes of every server in a cell.
fn notes(doc: &mut Doc, names: &[&str], cell: &str, measured: &[Measured]) {
    for (name, m) in names.iter().zip(measured) {
        let r = &m.paced;
        if r.throughput() < BEHIND_SCHEDULE * m.rate {
            doc.note(format!(
                "tail {cell}: {name} achieved {:.0} of {:.0} req/s asked: behind its schedule",
                r.throughput(),
                m.rate
            ));
        }
        if r.misses + r.errors > 0 {
            doc.note(format!(
                "tail {cell}: {name} answered {} misses and {} errors",
                r.misses, r.errors
            ));
        }
    }
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
        "tail cells (tests/bench/src/tail.rs): per cell, each server closed loop for {} s in {PEAK_SLICES} alternating slices (its peak: the median slice), then paced open loop at {:.0}% of its own peak: {TAIL_CONNS} connections per server at depth {DEPTH}, each sending on a fixed schedule, latency from the due time; {} s measured per server after {} s warm-up, in {} alternating slices; the floor server (bench/floor.rs) in the same slices",
        PEAK_MEASURE.as_secs(),
        LOAD_FRACTION * 100.0,
        o.seconds,
        o.seconds * PACED_SLICES_PER_SECOND,
        super::WARMUP.as_secs()
    ));
    let names = ["memcached", subject.memcache_name(), "floor"];
    let mut table = Table::new(names[0], names[1]);
    let mut floor_table = Table::new(names[2], names[1]);
    for op in [Op::Get, Op::Set] {
        let cell = cell_name(op, VALUE_LEN, DEPTH);
        let mut floor = procs::start_floor(op, VALUE_LEN)?;
        let (measured, steal) = tail_cell(o, &mut [&mut base, &mut subj, &mut floor], op)
            .with_context(|| format!("tail {cell}"))?;
        doc.note(format!(
            "tail {cell}: the host's steal during the paced slices (all servers'): CPU 0 (servers) {:.0} ms, CPU 1 (client) {:.0} ms",
            steal[0] * 1e3,
            steal[1] * 1e3
        ));
        let [b, s, f] = measured.as_slice() else {
            bail!("tail {cell}: expected three results");
        };
        rows(&mut table, &cell, b, s);
        rows(&mut floor_table, &cell, f, s);
        notes(doc, &names, &cell, &measured);
        let p99 = s.paced.p99_us() / b.paced.p99_us();
        doc.targets.push(format!(
            "tail {cell}, {TAIL_CONNS} connections at 70% of each server's peak: p99 {p99:.2}× memcached's (goal ≤ 1.0×) {}; the floor server's p99 is {:.2}× memcached's",
            mark(p99 <= 1.0),
            f.paced.p99_us() / b.paced.p99_us()
        ));
    }
    let mut section = format!(
        "## Tail latency: {TAIL_CONNS} connections at depth {DEPTH}, paced at {:.0}% of each server's own peak (one server core each)\n\n",
        LOAD_FRACTION * 100.0
    );
    section.push_str(&table.markdown());
    section.push_str(&format!(
        "\n### {} against the floor server, each at 70% of its own peak (the kernel's TCP path and the machine alone)\n\n",
        names[1]
    ));
    section.push_str(&floor_table.markdown());
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
