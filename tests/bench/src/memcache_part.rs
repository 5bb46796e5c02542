//! The memcache part: every GET/SET cell of the matrix against memcached (or `--compare-binary`),
//! the subject and the baseline measured in alternating slices; `mg` and binary GET cells
//! only when `--cells` names them.

use super::cells::{cell_name, keyspace, BIG_VALUE_LENS, DEPTHS, KEYSPACE, VALUE_LENS};
use super::cpu_table::{cpu_row, CPU_TABLE_HEAD};
use super::doc::{mark, Doc};
use super::mcwire::Op;
use super::options::Options;
use super::procs::{self, Pinned};
use super::report::{Better, Table};
use super::saturation::memaslap_section;
use super::subject::{binary_label, Subject};
use super::{client, fill, WARMUP};
use anyhow::{bail, Context, Result};
use std::path::Path;
use std::time::Duration;

/// The load of one cell against `server` (also the cores part's).
pub(super) fn cell_spec(
    o: &Options,
    server: &Pinned,
    op: Op,
    value_len: usize,
    depth: usize,
) -> client::LoadSpec {
    client::LoadSpec {
        port: server.port,
        mode: client::Mode::Memcache { op, value_len },
        depth,
        conns: o.conns,
        keyspace: keyspace(value_len),
        warmup: WARMUP,
        measure: Duration::from_secs(o.seconds),
        slices: o.seconds.clamp(1, 10) as u32,
        server_pid: server.pid(),
    }
}

/// What one cell measured: the baseline, the subject and the floor server (when up).
struct CellResults {
    base: client::LoadResult,
    subject: Option<client::LoadResult>,
    floor: Option<client::LoadResult>,
}

/// Runs one cell against memcached, the subject and the floor server (when they are up) in
/// alternating slices. The subject failing costs only its own column: memcached is then
/// measured alone.
#[expect(
    clippy::too_many_arguments,
    reason = "one cell: its spec, the three servers and the shared load settings"
)]
fn memcache_cell(
    o: &Options,
    base_name: &str,
    base: &mut Pinned,
    subj: &mut Option<Pinned>,
    op: Op,
    value_len: usize,
    depth: usize,
    doc: &mut Doc,
) -> Result<CellResults> {
    let cell = cell_name(op, value_len, depth);
    base.check_alive()?;
    if let Some(s) = subj.as_mut() {
        let floor = procs::start_floor(op, value_len)
            .map_err(|e| doc.note(format!("{cell}: the floor server did not start: {e:#}")))
            .ok();
        eprintln!(
            "bench: {cell}: {base_name}, {} and the floor in alternating slices",
            s.name
        );
        let mut specs = vec![
            cell_spec(o, base, op, value_len, depth),
            cell_spec(o, s, op, value_len, depth),
        ];
        specs.extend(floor.iter().map(|f| cell_spec(o, f, op, value_len, depth)));
        let outcome = client::run(&specs).and_then(|results| {
            s.check_alive()?;
            Ok(results)
        });
        match outcome {
            Ok(results) if results.len() >= 2 && results.iter().all(|r| r.requests > 0) => {
                let mut results = results.into_iter();
                let ours = results.next().context("three results")?;
                return Ok(CellResults {
                    base: ours,
                    subject: results.next(),
                    floor: results.next(),
                });
            }
            Ok(_) => doc.note(format!("{cell}: no request completed")),
            Err(e) => doc.note(format!("{cell}: {} failed: {e:#}", s.name)),
        }
        base.check_alive()?;
        if s.check_alive().is_err() {
            *subj = None;
        }
    }
    eprintln!("bench: {cell}: {base_name} alone");
    let mut results = client::run(&[cell_spec(o, base, op, value_len, depth)])?;
    base.check_alive()?;
    let ours = results.pop().context("one result")?;
    if ours.requests == 0 {
        bail!("{cell}: {base_name} completed no request");
    }
    Ok(CellResults {
        base: ours,
        subject: None,
        floor: None,
    })
}

/// The value sizes a run covers: the matrix's, and the big ones named in `--cells`.
fn value_lens(o: &Options) -> Vec<usize> {
    let named = |len: &usize| o.cells.iter().any(|&(_, l, _)| l == *len);
    VALUE_LENS
        .into_iter()
        .chain(BIG_VALUE_LENS.into_iter().filter(named))
        .collect()
}

fn preload_all(o: &Options, server: &Pinned) -> Result<()> {
    for len in value_lens(o) {
        fill::preload(server.port, len, keyspace(len))?;
    }
    Ok(())
}

/// The two tables a memcache cell adds rows to.
struct Tables<'a> {
    table: &'a mut Table,
    cpu: &'a mut String,
}

/// The subject against the floor server: throughput and CPU per request, and at depth 1 the
/// CPU goal.
fn floor_rows(
    floor_table: &mut Table,
    doc: &mut Doc,
    cell: &str,
    depth: usize,
    f: Option<&client::LoadResult>,
    s: Option<&client::LoadResult>,
) {
    let (Some(f), Some(s)) = (f, s) else {
        return;
    };
    floor_table.row(
        &format!("{cell}: throughput (req/s)"),
        f.throughput(),
        Some(s.throughput()),
        Better::Higher,
        0,
    );
    floor_table.row(
        &format!("{cell}: server CPU s / M req"),
        f.server_cpu_per_million(),
        Some(s.server_cpu_per_million()),
        Better::Lower,
        2,
    );
    if depth == 1 {
        let cost = s.server_cpu_per_million() / f.server_cpu_per_million();
        doc.targets.push(format!(
            "{cell}: server CPU per request {cost:.2}× the floor's (goal ≤ 1.15×) {}",
            mark(cost <= 1.15)
        ));
    }
}

/// One cell against the baseline: misses and errors as notes, the rows, CPU use, and the
/// targets (not against another ringstore binary).
fn record_cell(
    o: &Options,
    tables: &mut Tables<'_>,
    doc: &mut Doc,
    (cell, depth): (&str, usize),
    (base_name, name): (&str, &str),
    b: &client::LoadResult,
    s: Option<&client::LoadResult>,
) {
    for (who, r) in [(base_name, Some(b)), (name, s)] {
        if let Some(r) = r.filter(|r| r.misses + r.errors > 0) {
            doc.note(format!(
                "{cell}: {who} answered {} misses and {} errors",
                r.misses, r.errors
            ));
        }
    }
    let rows: [(&str, f64, Option<f64>, Better, usize); 4] = [
        (
            "throughput (req/s)",
            b.throughput(),
            s.map(|r| r.throughput()),
            Better::Higher,
            0,
        ),
        (
            "p50 latency (µs)",
            b.p50_us(),
            s.map(|r| r.p50_us()),
            Better::Lower,
            1,
        ),
        (
            "p99 latency (µs)",
            b.p99_us(),
            s.map(|r| r.p99_us()),
            Better::Lower,
            1,
        ),
        (
            "server CPU s / M req",
            b.server_cpu_per_million(),
            s.map(|r| r.server_cpu_per_million()),
            Better::Lower,
            2,
        ),
    ];
    for (what, base, subject, better, digits) in rows {
        tables
            .table
            .row(&format!("{cell}: {what}"), base, subject, better, digits);
    }
    for (who, r) in [(base_name, Some(b)), (name, s)] {
        if let Some(r) = r {
            cpu_row(
                tables.cpu,
                cell,
                who,
                r.server_cpu_percent(),
                r.server_core,
                r.client_cpu_percent(),
                r.client_core,
            );
        }
    }
    if let Some(s) = s.filter(|_| o.sub_memory) {
        let cost = s.server_cpu_per_million() / b.server_cpu_per_million();
        doc.targets.push(format!(
            "{cell}: server CPU per request with sub memory {cost:.2}× without (goal ≤ 1.03×) {}",
            mark(cost <= 1.03)
        ));
        return;
    }
    if let Some(s) = s.filter(|_| o.compare.is_none()) {
        let goal = if depth == 1 { 1.5 } else { 2.0 };
        let tput = s.throughput() / b.throughput();
        let p99 = s.p99_us() / b.p99_us();
        doc.targets.push(format!(
            "{cell}: throughput {tput:.2}× (target ≥ {goal}×) {}; p99 {p99:.2}× (target ≤ 1.0×) {}",
            mark(tput >= goal),
            mark(p99 <= 1.0)
        ));
    }
}

/// `--sub-memory`: the subject's flags (issue 23: 256 MiB simulated sub memory on node 0;
/// the preloaded keys all fit the local region, so every GET is a local hit that keeps score).
const SUB_MEMORY_ARGS: [&str; 6] = [
    "--numa",
    "0",
    "--sub-memory",
    "256MiB",
    "--sub-memory-simulated",
    "on",
];
const SUB_MEMORY_NAME: &str = "ringstore --numa 0 --sub-memory 256MiB (simulated)";

/// The baseline server and its name: memcached, `--compare-binary`, or (`--sub-memory`) the
/// subject without sub memory. A `--compare-binary` baseline runs with the subject's `--io`.
fn start_baseline(o: &Options, subject: &Subject) -> Result<(Pinned, String)> {
    Ok(match (&o.compare, subject) {
        (None, Subject::Ringstore(path)) if o.sub_memory => (
            procs::start_ringstore_with(path, 1024, &["--numa", "0"])?,
            "ringstore --numa 0".to_string(),
        ),
        (Some(path), _) => {
            if !path.exists() {
                bail!("--compare-binary {} does not exist", path.display());
            }
            // The same --io as the subject: a runtime's before/after, not one runtime
            // against the other.
            let baseline =
                Subject::Ringstore(path.clone()).start_memcache(1024, o.io.as_deref())?;
            (baseline, binary_label(path))
        }
        _ => (procs::start_memcached(1024)?, "memcached".to_string()),
    })
}

pub(super) fn memcache_part(
    o: &Options,
    subject: &Subject,
    out_dir: &Path,
    doc: &mut Doc,
) -> Result<()> {
    let (mut base, base_name) = start_baseline(o, subject)?;
    doc.command(&base.command);
    preload_all(o, &base)?;
    let name = match (&o.compare, subject) {
        (None, Subject::Ringstore(_)) if o.sub_memory => SUB_MEMORY_NAME.to_string(),
        (Some(_), Subject::Ringstore(path)) => binary_label(path),
        (None, Subject::Ringstore(_)) if o.io.is_some() => {
            format!(
                "{} ({})",
                subject.memcache_name(),
                o.io.as_deref().unwrap_or_default()
            )
        }
        _ => subject.memcache_name().to_string(),
    };
    let name = name.as_str();
    let base_name = base_name.as_str();
    let started = match subject {
        Subject::Ringstore(path) if o.sub_memory => {
            procs::start_ringstore_with(path, 1024, &SUB_MEMORY_ARGS)
        }
        _ => subject.start_memcache(1024, o.io.as_deref()),
    };
    let mut subj = match started.and_then(|s| preload_all(o, &s).map(|()| s)) {
        Ok(s) => {
            doc.command(&s.command);
            Some(s)
        }
        Err(e) => {
            doc.note(format!("{name} did not start or take the preload: {e:#}"));
            None
        }
    };
    doc.command(&format!(
        "load generator (tests/bench/src/client/): 1 thread pinned to CPU {}, one io_uring, {} connections per server, {KEYSPACE} keys per value size preloaded (at most 256 MiB of them per size, so fewer for big values), {} s warm-up, then {} s measured per server and cell in {} alternating slices",
        procs::CLIENT_CPU, o.conns, WARMUP.as_secs(), o.seconds, o.seconds.clamp(1, 10)
    ));

    doc.command("floor server (tests/bench/src/floor.rs), one per cell, started before it and stopped after: taskset -c 0 target/debug/ringstore-bench floor --port P --op get|set|mg|bget|bgetk --value-len N");
    let mut table = Table::new(base_name, name);
    let mut floor_table = Table::new("floor", name);
    let mut cpu = String::from(CPU_TABLE_HEAD);
    let mut first_cell = None;
    for op in [Op::Get, Op::Set, Op::MetaGet, Op::BinGet, Op::BinGetK] {
        for depth in DEPTHS {
            for value_len in value_lens(o) {
                let named = o.cells.contains(&(op, value_len, depth));
                if !named && (!o.cells.is_empty() || op.is_extra_get()) {
                    continue;
                }
                let cell = cell_name(op, value_len, depth);
                let CellResults {
                    base: b,
                    subject: s,
                    floor: f,
                } = memcache_cell(
                    o, base_name, &mut base, &mut subj, op, value_len, depth, doc,
                )
                .with_context(|| format!("{cell} against {base_name}"))?;
                floor_rows(&mut floor_table, doc, &cell, depth, f.as_ref(), s.as_ref());
                let names = (base_name, name);
                let cell_id = (cell.as_str(), depth);
                let mut tables = Tables {
                    table: &mut table,
                    cpu: &mut cpu,
                };
                record_cell(o, &mut tables, doc, cell_id, names, &b, s.as_ref());
                if op == Op::Get && depth == 1 && value_len == 100 {
                    first_cell = Some((b.clone(), s.clone()));
                }
            }
        }
    }
    let mut section = if o.compare.is_some() || o.sub_memory {
        format!("## memcache: {name} against {base_name} (one server core each)\n\n")
    } else {
        match &o.io {
            Some(io) => {
                format!("## memcache: GET and SET, ringstore --io {io} (one server core each)\n\n")
            }
            None => String::from("## memcache: GET and SET (one server core each)\n\n"),
        }
    };
    section.push_str(&table.markdown());
    section.push('\n');
    section.push_str(&cpu);
    section.push_str(&format!(
        "\n### {name} against the floor (tests/bench/src/floor.rs: an io_uring responder that answers each request with a fixed reply of the right size, no parsing, no store)\n\n"
    ));
    section.push_str(&floor_table.markdown());
    doc.sections.push(section);
    if o.cells.is_empty() && o.compare.is_none() && !o.sub_memory {
        let saturation =
            memaslap_section(o, &mut base, subj.as_mut(), name, first_cell, out_dir, doc);
        doc.sections.push(saturation);
    }
    Ok(())
}
