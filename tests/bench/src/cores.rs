//! The cores part: memcache GET/SET at depth 16 with 1, 2, 4, 8 and 16 server workers
//! (ringstore `--cores N`, memcached `-t N`), the two servers in alternating slices at each
//! width, driven by one load generator per four server cores on CPUs of their own.
//!
//! Only the widths that fit the machine run (cores_plan.rs); the rest are named in the
//! report with the CPUs they need. Requests per server CPU-second at each width say whether
//! more workers cost extra work per request (shared store locks, cross-core cache lines, the
//! acceptor's handoff); throughput ÷ (N × one worker's) is the scaling the goal asks for.

use super::cells::{cell_name, keyspace};
use super::cores_plan::{self, Width};
use super::doc::Doc;
use super::mcwire::Op;
use super::memcache_part::cell_spec;
use super::options::Options;
use super::procs::{self, Pinned};
use super::report::format_number;
use super::subject::Subject;
use super::{client, fill};
use anyhow::{bail, Context, Result};
use std::fmt::Write as _;

/// The cells: 100-byte values at depth 16, where the server, not the round trip, is the limit.
const CELLS: [(Op, usize, usize); 2] = [(Op::Get, 100, 16), (Op::Set, 100, 16)];

fn spec(
    o: &Options,
    server: &Pinned,
    (op, value_len, depth): (Op, usize, usize),
) -> client::LoadSpec {
    cell_spec(o, server, op, value_len, depth)
}

/// One row: a server at one width in one cell.
struct Row {
    cell: String,
    server: &'static str,
    workers: usize,
    result: client::LoadResult,
}

pub(super) fn cores_part(o: &Options, subject: &Subject, doc: &mut Doc) -> Result<()> {
    let Subject::Ringstore(binary) = subject else {
        bail!("--only cores measures ringstore against memcached (no --self-check)");
    };
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    let plan = cores_plan::plan(cpus);
    let skipped: Vec<String> = plan.skipped.iter().map(|s| s.reason(cpus)).collect();
    for line in &skipped {
        eprintln!("bench: cores: {line}");
    }
    let mut rows = Vec::new();
    for width in &plan.widths {
        measure_width(o, binary, width, doc, &mut rows)?;
    }
    doc.sections.push(table(&rows, &skipped));
    Ok(())
}

/// Both servers at one width, every cell.
fn measure_width(
    o: &Options,
    binary: &std::path::Path,
    width: &Width,
    doc: &mut Doc,
    rows: &mut Vec<Row>,
) -> Result<()> {
    let workers = width.workers;
    let mut memcached = procs::start_memcached_threads(1024, workers)?;
    let mut ringstore = procs::start_ringstore_workers(binary, 1024, workers, &[])?;
    doc.command(&memcached.command);
    doc.command(&ringstore.command);
    for server in [&memcached, &ringstore] {
        fill::preload(server.port, 100, keyspace(100))?;
    }
    for cell in CELLS {
        let name = cell_name(cell.0, cell.1, cell.2);
        eprintln!(
            "bench: cores: {name} with {workers} worker(s) on CPUs {:?}, load from CPUs {:?}, memcached and ringstore in alternating slices",
            width.server_cpus, width.client_cpus
        );
        let specs = [spec(o, &memcached, cell), spec(o, &ringstore, cell)];
        let results = on_client_cpus(&width.client_cpus, &specs)?;
        memcached.check_alive()?;
        ringstore.check_alive()?;
        for (server, result) in ["memcached", "ringstore"].into_iter().zip(results) {
            if result.requests == 0 {
                bail!("{name}: {server} with {workers} worker(s) completed no request");
            }
            rows.push(Row {
                cell: name.clone(),
                server,
                workers,
                result,
            });
        }
    }
    Ok(())
}

/// Runs `specs` from one load generator per CPU in `cpus` at once (each alternates the
/// servers in slices of the same length, so they stay in step), and sums each server's
/// results over the generators.
fn on_client_cpus(cpus: &[usize], specs: &[client::LoadSpec]) -> Result<Vec<client::LoadResult>> {
    let per_cpu = std::thread::scope(|scope| {
        let handles: Vec<_> = cpus
            .iter()
            .map(|&cpu| scope.spawn(move || client::run_on(cpu, specs)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .map_err(|_| anyhow::anyhow!("load generator panicked"))?
            })
            .collect::<Result<Vec<_>>>()
    })?;
    (0..specs.len())
        .map(|i| {
            let parts: Vec<&client::LoadResult> = per_cpu.iter().filter_map(|r| r.get(i)).collect();
            combine(&parts).context("one result per load generator")
        })
        .collect()
}

/// One server's results from generators that ran side by side: requests add up, while the
/// wall time and the server's CPU time (each generator read the same process over about
/// the same slices) are their means.
fn combine(parts: &[&client::LoadResult]) -> Option<client::LoadResult> {
    let (first, rest) = parts.split_first()?;
    let mut sum = (*first).clone();
    for part in rest {
        sum.merge(part);
    }
    let n = parts.len() as f64;
    sum.seconds /= n;
    sum.server_cpu_seconds /= n;
    Some(sum)
}

/// Requests per server CPU-second.
fn efficiency(r: &client::LoadResult) -> f64 {
    1e6 / r.server_cpu_per_million()
}

fn table(rows: &[Row], skipped: &[String]) -> String {
    let mut md = String::from(
        "## Cores: 1 to 16 server workers (GET/SET 100 B, depth 16)\n\n\
         Servers on CPUs 0..N, one load generator per four workers on the CPUs after them. \
         \"vs N × 1 worker\" is the throughput (or requests per server CPU-second) over N \
         times one worker's: 1.00x is linear scaling, the goal is ≥ 0.85x.\n\n",
    );
    for line in skipped {
        let _ = writeln!(md, "- {line}");
    }
    md.push_str(
        "\n| cell | server | workers | requests/s | server CPU % | server CPU s / 1M | requests per server CPU-s | vs N × 1 worker: requests/s | vs 1 worker: per CPU-s |\n\
         | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for row in rows {
        let one = rows
            .iter()
            .find(|r| r.cell == row.cell && r.server == row.server && r.workers == 1);
        let ratio = |f: fn(&client::LoadResult) -> f64, times: usize| {
            one.map_or("-".to_string(), |one| {
                format!("{:.2}x", f(&row.result) / (times as f64 * f(&one.result)))
            })
        };
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {:.0} | {:.2} | {} | {} | {} |",
            row.cell,
            row.server,
            row.workers,
            format_number(row.result.throughput(), 0),
            row.result.server_cpu_percent(),
            row.result.server_cpu_per_million(),
            format_number(efficiency(&row.result), 0),
            ratio(client::LoadResult::throughput, row.workers),
            ratio(efficiency, 1),
        );
    }
    md
}
