//! The cores part: memcache GET/SET at depth 16 with 1 and 2 server workers (ringstore
//! `--cores N`, memcached `-t N`), the two servers in alternating slices at each width.
//!
//! On a 2-CPU machine the second worker shares CPU 1 with the load generator, so the
//! throughput ratio 2 workers / 1 worker says little about scaling; requests per server
//! CPU-second at each width say whether a second worker costs extra work per request (shared
//! store locks, cross-core cache lines, the acceptor's handoff). The device machine's 16 cores
//! are where the 1, 2, 4, 8, 16 curve belongs.

use super::cells::{cell_name, keyspace};
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

/// The widths measured: what a 2-CPU machine can hold.
const WIDTHS: [usize; 2] = [1, 2];
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
    let mut rows = Vec::new();
    for workers in WIDTHS {
        let mut memcached = procs::start_memcached_threads(1024, workers)?;
        let mut ringstore = procs::start_ringstore_workers(binary, 1024, workers, &[])?;
        doc.command(&memcached.command);
        doc.command(&ringstore.command);
        for server in [&memcached, &ringstore] {
            fill::preload(server.port, 100, keyspace(100))?;
        }
        for cell in CELLS {
            let name = cell_name(cell.0, cell.1, cell.2);
            eprintln!("bench: cores: {name} with {workers} worker(s), memcached and ringstore in alternating slices");
            let results = client::run(&[spec(o, &memcached, cell), spec(o, &ringstore, cell)])?;
            memcached.check_alive()?;
            ringstore.check_alive()?;
            let mut results = results.into_iter();
            for server in ["memcached", "ringstore"] {
                let result = results.next().context("two results")?;
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
    }
    doc.sections.push(table(&rows));
    Ok(())
}

/// Requests per server CPU-second.
fn efficiency(r: &client::LoadResult) -> f64 {
    1e6 / r.server_cpu_per_million()
}

fn table(rows: &[Row]) -> String {
    let mut md = String::from(
        "## Cores: 1 and 2 server workers (GET/SET 100 B, depth 16)\n\n\
         The load generator runs on CPU 1, so with 2 workers it shares a CPU with the second \
         worker: read the per-CPU-second column, not the throughput ratio, as the cost of a \
         second worker.\n\n\
         | cell | server | workers | requests/s | server CPU % | server CPU s / 1M | requests per server CPU-s | vs 1 worker: requests/s | vs 1 worker: per CPU-s |\n\
         | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for row in rows {
        let one = rows
            .iter()
            .find(|r| r.cell == row.cell && r.server == row.server && r.workers == 1);
        let ratio = |f: fn(&client::LoadResult) -> f64| {
            one.map_or("-".to_string(), |one| {
                format!("{:.2}x", f(&row.result) / f(&one.result))
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
            ratio(client::LoadResult::throughput),
            ratio(efficiency),
        );
    }
    md
}
