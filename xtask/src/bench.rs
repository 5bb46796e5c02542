//! `cargo xtask bench`: ringstore and memcached (and nginx for HTTP) side by side in one run.
//!
//! Every server runs pinned to CPU 0 with one core's worth of threads; every load generator
//! runs pinned to CPU 1. The memcache cells use our own io_uring load generator (memaslap
//! saturates its core first; the run shows that too), the HTTP cells use wrk. Results go to
//! stdout and `target/bench/results.md`.

mod durable;
mod fill;
mod hist;
mod http;
mod loadgen;
mod mcwire;
mod memaslap;
mod memory;
mod procs;
mod report;

use crate::util;
use anyhow::{bail, Context, Result};
use mcwire::Op;
use procs::Pinned;
use report::{Better, Table};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const USAGE: &str =
    "usage: cargo xtask bench [--seconds N] [--only memcache|http|memory|durable] [--binary PATH]
                         [--conns N] [--self-check] [--cells get-100-1,set-4096-16,...]
                         [--compare-binary PATH]

  --seconds N    measured seconds per cell, after 1 s of warm-up (default 5; durable: at most 10)
  --only PART    run one part: memcache (GET/SET vs memcached), http (GET vs nginx), memory,
                 durable (SET with --data on disk and tmpfs vs RAM only; recovery of 1M objects)
  --binary PATH  the ringstore binary (default: cargo build --release -p ringstore)
  --conns N      connections per load generator (default 50)
  --self-check   measure memcached (and nginx) against themselves: every ratio should be ~1.0
  --cells LIST   only these memcache cells (OP-VALUEBYTES-DEPTH), and no memaslap run
  --compare-binary PATH
                 memcache cells: this ringstore binary is the baseline instead of memcached
                 (e.g. the musl build against the glibc build)
";

/// Value sizes of every cell.
const VALUE_LENS: [usize; 2] = [100, 4096];
/// Pipeline depths of every cell.
const DEPTHS: [usize; 2] = [1, 16];
/// Keys per value size, preloaded so every GET hits.
const KEYSPACE: usize = 10_000;
/// Items for the memory-per-item measurement.
const MEMORY_ITEMS: usize = 1_000_000;
const WARMUP: Duration = Duration::from_secs(1);

#[derive(Clone, Copy, PartialEq, Eq)]
enum Part {
    Memcache,
    Http,
    Memory,
    Durable,
}

struct Options {
    seconds: u64,
    only: Option<Part>,
    binary: Option<PathBuf>,
    conns: usize,
    self_check: bool,
    /// `--cells`: (op, value length, depth) to run; empty = all.
    cells: Vec<(Op, usize, usize)>,
    /// `--compare-binary`: a second ringstore as the memcache baseline.
    compare: Option<PathBuf>,
}

/// `get-100-1` -> (Get, 100, 1).
fn parse_cell(text: &str) -> Result<(Op, usize, usize)> {
    let parts: Vec<&str> = text.split('-').collect();
    let [op, len, depth] = parts.as_slice() else {
        bail!("cell {text:?}: expected OP-VALUEBYTES-DEPTH")
    };
    let op = match op.to_ascii_lowercase().as_str() {
        "get" => Op::Get,
        "set" => Op::Set,
        _ => bail!("cell {text:?}: OP is get or set"),
    };
    let len: usize = len
        .parse()
        .with_context(|| format!("cell {text:?}: value bytes"))?;
    let depth: usize = depth
        .parse()
        .with_context(|| format!("cell {text:?}: depth"))?;
    if !VALUE_LENS.contains(&len) || !DEPTHS.contains(&depth) {
        bail!(
            "cell {text:?}: value bytes must be one of {VALUE_LENS:?} and depth one of {DEPTHS:?}"
        );
    }
    Ok((op, len, depth))
}

fn parse(args: &[String]) -> Result<Options> {
    let mut o = Options {
        seconds: 5,
        only: None,
        binary: None,
        conns: 50,
        self_check: false,
        cells: Vec::new(),
        compare: None,
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = || {
            it.next()
                .with_context(|| format!("{arg} needs a value\n\n{USAGE}"))
        };
        match arg.as_str() {
            "--seconds" => o.seconds = value()?.parse().context("--seconds")?,
            "--conns" => o.conns = value()?.parse().context("--conns")?,
            "--binary" => o.binary = Some(PathBuf::from(value()?)),
            "--compare-binary" => o.compare = Some(PathBuf::from(value()?)),
            "--only" => {
                o.only = Some(match value()?.as_str() {
                    "memcache" => Part::Memcache,
                    "http" => Part::Http,
                    "memory" => Part::Memory,
                    "durable" => Part::Durable,
                    other => bail!("--only {other:?}: expected memcache, http, memory or durable"),
                })
            }
            "--self-check" => o.self_check = true,
            "--cells" => {
                o.cells = value()?.split(',').map(parse_cell).collect::<Result<_>>()?;
            }
            "-h" | "--help" => {
                print!("{USAGE}");
                std::process::exit(0);
            }
            other => bail!("unknown argument {other:?}\n\n{USAGE}"),
        }
    }
    if !(1..=60).contains(&o.seconds) || !(1..=1000).contains(&o.conns) {
        bail!("--seconds must be 1..=60 and --conns 1..=1000");
    }
    if o.compare.is_some() {
        if o.self_check {
            bail!("--compare-binary and --self-check exclude each other");
        }
        match o.only {
            None => o.only = Some(Part::Memcache),
            Some(Part::Memcache) => {}
            Some(_) => bail!("--compare-binary applies to the memcache cells only"),
        }
    }
    Ok(o)
}

/// The server measured against the baselines.
enum Subject {
    Ringstore(PathBuf),
    /// `--self-check`: the baseline again.
    Baseline,
}

impl Subject {
    fn memcache_name(&self) -> &'static str {
        match self {
            Subject::Ringstore(_) => "ringstore",
            Subject::Baseline => "memcached (again)",
        }
    }

    fn http_name(&self) -> &'static str {
        match self {
            Subject::Ringstore(_) => "ringstore",
            Subject::Baseline => "nginx (again)",
        }
    }

    fn start_memcache(&self, memory_mib: u64) -> Result<Pinned> {
        match self {
            Subject::Ringstore(binary) => procs::start_ringstore(binary, memory_mib),
            Subject::Baseline => procs::start_memcached(memory_mib),
        }
    }
}

/// What goes into results.md besides the tables.
#[derive(Default)]
struct Doc {
    sections: Vec<String>,
    commands: Vec<String>,
    notes: Vec<String>,
    targets: Vec<String>,
}

impl Doc {
    fn command(&mut self, line: &str) {
        if !self.commands.iter().any(|c| c == line) {
            self.commands.push(line.to_string());
        }
    }

    fn note(&mut self, line: String) {
        eprintln!("bench: {line}");
        self.notes.push(line);
    }
}

pub fn run(args: &[String]) -> Result<()> {
    let o = parse(args)?;
    crate::deps::apt()?;
    let out_dir = util::root().join("target/bench");
    std::fs::create_dir_all(&out_dir)?;
    let subject = if o.self_check {
        Subject::Baseline
    } else {
        Subject::Ringstore(ringstore_binary(&o)?)
    };
    let started = Instant::now();
    let load_before = load_summary();
    let mut doc = Doc::default();
    doc.command(&format!(
        "(every server thread gets nice {n} with setpriority after it starts; clients run as nice -n {n} taskset -c {c} ...)",
        n = procs::BENCH_NICE,
        c = procs::CLIENT_CPU
    ));
    let wants = |part| o.only.is_none_or(|only| only == part);
    if wants(Part::Memcache) {
        memcache_part(&o, &subject, &out_dir, &mut doc)?;
    }
    if wants(Part::Http) {
        http_part(&o, &subject, &out_dir, &mut doc)?;
    }
    if wants(Part::Memory) {
        memory_part(&subject, &mut doc)?;
    }
    if wants(Part::Durable) {
        durable_part(&o, &subject, &out_dir, &mut doc)?;
    }
    let mut md = String::new();
    let _ = writeln!(md, "# ringstore benchmark results\n");
    let _ = writeln!(md, "{}\n", machine_summary());
    let _ = writeln!(
        md,
        "- load before: {load_before}\n- load after: {}",
        load_summary()
    );
    let _ = writeln!(
        md,
        "- total time: {:.0} s, {} s measured per cell after {} s warm-up\n",
        started.elapsed().as_secs_f64(),
        o.seconds,
        WARMUP.as_secs()
    );
    if let Subject::Ringstore(binary) = &subject {
        let _ = writeln!(md, "ringstore binary: `{}`\n", binary.display());
    }
    for section in &doc.sections {
        let _ = writeln!(md, "{section}");
    }
    if !doc.targets.is_empty() {
        let _ = writeln!(md, "## Targets\n");
        for line in &doc.targets {
            let _ = writeln!(md, "- {line}");
        }
        md.push('\n');
    }
    if !doc.notes.is_empty() {
        let _ = writeln!(md, "## Notes\n");
        for line in &doc.notes {
            let _ = writeln!(md, "- {line}");
        }
        md.push('\n');
    }
    let _ = writeln!(md, "## Commands\n\n```");
    for line in &doc.commands {
        let _ = writeln!(md, "{line}");
    }
    let _ = writeln!(md, "```");
    print!("{md}");
    let path = out_dir.join("results.md");
    std::fs::write(&path, &md)?;
    eprintln!("bench: wrote {}", path.display());
    Ok(())
}

/// `--binary`, or a fresh release build in the target dir cargo uses.
fn ringstore_binary(o: &Options) -> Result<PathBuf> {
    if let Some(binary) = &o.binary {
        if !binary.exists() {
            bail!("--binary {} does not exist", binary.display());
        }
        return Ok(binary.clone());
    }
    util::exec(util::cargo().args(["build", "--release", "-p", "ringstore"]))?;
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .map(|p| {
            if p.is_relative() {
                util::root().join(p)
            } else {
                p
            }
        })
        .unwrap_or_else(|| util::root().join("target"));
    Ok(target.join("release/ringstore"))
}

/// `ringstore (x86_64-unknown-linux-musl)` for `.../x86_64-unknown-linux-musl/release/ringstore`,
/// `ringstore (host)` for a build for the host target.
fn binary_label(path: &Path) -> String {
    let parts: Vec<String> = path
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let triple = parts
        .windows(2)
        .rev()
        .find(|w| w[1] == "release" || w[1] == "debug")
        .map(|w| w[0].clone())
        .filter(|t| t.contains("-linux-"));
    format!("ringstore ({})", triple.as_deref().unwrap_or("host"))
}

fn cell_name(op: Op, value_len: usize, depth: usize) -> String {
    let size = if value_len >= 1024 {
        format!("{} KiB", value_len / 1024)
    } else {
        format!("{value_len} B")
    };
    format!("{} {size}, depth {depth}", op.name())
}

fn cell_spec(
    o: &Options,
    server: &Pinned,
    op: Op,
    value_len: usize,
    depth: usize,
) -> loadgen::LoadSpec {
    loadgen::LoadSpec {
        port: server.port,
        op,
        value_len,
        depth,
        conns: o.conns,
        keyspace: KEYSPACE,
        warmup: WARMUP,
        measure: Duration::from_secs(o.seconds),
        slices: o.seconds.clamp(1, 10) as u32,
        server_pid: server.pid(),
    }
}

/// Runs one cell against memcached and (when it is up) the subject in alternating slices.
/// The subject failing costs only its own column: memcached is then measured alone.
#[allow(clippy::too_many_arguments)]
fn memcache_cell(
    o: &Options,
    base_name: &str,
    base: &mut Pinned,
    subj: &mut Option<Pinned>,
    op: Op,
    value_len: usize,
    depth: usize,
    doc: &mut Doc,
) -> Result<(loadgen::LoadResult, Option<loadgen::LoadResult>)> {
    let cell = cell_name(op, value_len, depth);
    base.check_alive()?;
    if let Some(s) = subj.as_mut() {
        eprintln!(
            "bench: {cell}: {base_name} and {} in alternating slices",
            s.name
        );
        let specs = [
            cell_spec(o, base, op, value_len, depth),
            cell_spec(o, s, op, value_len, depth),
        ];
        let outcome = loadgen::run(&specs).and_then(|results| {
            s.check_alive()?;
            Ok(results)
        });
        match outcome {
            Ok(mut results) if results.len() == 2 && results.iter().all(|r| r.requests > 0) => {
                let theirs = results.pop();
                let ours = results.pop().context("two results")?;
                return Ok((ours, theirs));
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
    let mut results = loadgen::run(&[cell_spec(o, base, op, value_len, depth)])?;
    base.check_alive()?;
    let ours = results.pop().context("one result")?;
    if ours.requests == 0 {
        bail!("{cell}: {base_name} completed no request");
    }
    Ok((ours, None))
}

fn preload_all(server: &Pinned) -> Result<()> {
    for len in VALUE_LENS {
        fill::preload(server.port, len, KEYSPACE)?;
    }
    Ok(())
}

fn memcache_part(o: &Options, subject: &Subject, out_dir: &Path, doc: &mut Doc) -> Result<()> {
    let (mut base, base_name) = match &o.compare {
        Some(path) => {
            if !path.exists() {
                bail!("--compare-binary {} does not exist", path.display());
            }
            (procs::start_ringstore(path, 1024)?, binary_label(path))
        }
        None => (procs::start_memcached(1024)?, "memcached".to_string()),
    };
    doc.command(&base.command);
    preload_all(&base)?;
    let name = match (&o.compare, subject) {
        (Some(_), Subject::Ringstore(path)) => binary_label(path),
        _ => subject.memcache_name().to_string(),
    };
    let name = name.as_str();
    let base_name = base_name.as_str();
    let mut subj = match subject
        .start_memcache(1024)
        .and_then(|s| preload_all(&s).map(|()| s))
    {
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
        "load generator (xtask/src/bench/loadgen.rs): 1 thread pinned to CPU {}, one io_uring, {} connections per server, {KEYSPACE} keys per value size preloaded, {} s warm-up, then {} s measured per server and cell in {} alternating slices",
        procs::CLIENT_CPU, o.conns, WARMUP.as_secs(), o.seconds, o.seconds.clamp(1, 10)
    ));

    let mut table = Table::new(base_name, name);
    let mut cpu = String::from(CPU_TABLE_HEAD);
    let mut first_cell = None;
    for op in [Op::Get, Op::Set] {
        for depth in DEPTHS {
            for value_len in VALUE_LENS {
                if !o.cells.is_empty() && !o.cells.contains(&(op, value_len, depth)) {
                    continue;
                }
                let cell = cell_name(op, value_len, depth);
                let (b, s) = memcache_cell(
                    o, base_name, &mut base, &mut subj, op, value_len, depth, doc,
                )
                .with_context(|| format!("{cell} against {base_name}"))?;
                for (who, r) in [(base_name, Some(&b)), (name, s.as_ref())] {
                    if let Some(r) = r.filter(|r| r.misses + r.errors > 0) {
                        doc.note(format!(
                            "{cell}: {who} answered {} misses and {} errors",
                            r.misses, r.errors
                        ));
                    }
                }
                table.row(
                    &format!("{cell}: throughput (req/s)"),
                    b.throughput(),
                    s.as_ref().map(|r| r.throughput()),
                    Better::Higher,
                    0,
                );
                table.row(
                    &format!("{cell}: p50 latency (µs)"),
                    b.p50_us(),
                    s.as_ref().map(|r| r.p50_us()),
                    Better::Lower,
                    1,
                );
                table.row(
                    &format!("{cell}: p99 latency (µs)"),
                    b.p99_us(),
                    s.as_ref().map(|r| r.p99_us()),
                    Better::Lower,
                    1,
                );
                table.row(
                    &format!("{cell}: server CPU s / M req"),
                    b.server_cpu_per_million(),
                    s.as_ref().map(|r| r.server_cpu_per_million()),
                    Better::Lower,
                    2,
                );
                for (who, r) in [(base_name, Some(&b)), (name, s.as_ref())] {
                    if let Some(r) = r {
                        cpu_row(
                            &mut cpu,
                            &cell,
                            who,
                            r.server_cpu_percent(),
                            r.server_core,
                            r.client_cpu_percent(),
                            r.client_core,
                        );
                    }
                }
                if let Some(s) = s.as_ref().filter(|_| o.compare.is_none()) {
                    let goal = if depth == 1 { 1.5 } else { 2.0 };
                    let tput = s.throughput() / b.throughput();
                    let p99 = s.p99_us() / b.p99_us();
                    doc.targets.push(format!(
                        "{cell}: throughput {tput:.2}× (target ≥ {goal}×) {}; p99 {p99:.2}× (target ≤ 1.0×) {}",
                        mark(tput >= goal),
                        mark(p99 <= 1.0)
                    ));
                }
                if op == Op::Get && depth == 1 && value_len == 100 {
                    first_cell = Some((b.clone(), s.clone()));
                }
            }
        }
    }
    let mut section = if o.compare.is_some() {
        format!("## memcache: {name} against {base_name} (one server core each)\n\n")
    } else {
        String::from("## memcache: GET and SET (one server core each)\n\n")
    };
    section.push_str(&table.markdown());
    section.push('\n');
    section.push_str(&cpu);
    doc.sections.push(section);
    if o.cells.is_empty() && o.compare.is_none() {
        let saturation =
            memaslap_section(o, &mut base, subj.as_mut(), name, first_cell, out_dir, doc);
        doc.sections.push(saturation);
    }
    Ok(())
}

/// Header of the CPU tables: process CPU (utime + stime) and whole-core busy time, which also
/// holds the softirq time of loopback TCP that no process is charged for.
const CPU_TABLE_HEAD: &str = "### CPU use (server on CPU 0, client on CPU 1)

| run | server | server process % | CPU 0 softirq % | CPU 0 busy % | client process % | CPU 1 softirq % | CPU 1 busy % |
| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |
";

fn cpu_row(
    out: &mut String,
    run: &str,
    server: &str,
    server_process: f64,
    server_core: procs::CoreUse,
    client_process: f64,
    client_core: procs::CoreUse,
) {
    let _ = writeln!(
        out,
        "| {run} | {server} | {server_process:.0} | {:.0} | {:.0} | {client_process:.0} | {:.0} | {:.0} |",
        server_core.softirq_percent, server_core.busy_percent, client_core.softirq_percent, client_core.busy_percent
    );
}

fn mark(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "NOT met"
    }
}

/// memaslap against each server, beside our generator's own GET 100 B depth-1 cell.
fn memaslap_section(
    o: &Options,
    base: &mut Pinned,
    subj: Option<&mut Pinned>,
    name: &str,
    ours: Option<(loadgen::LoadResult, Option<loadgen::LoadResult>)>,
    out_dir: &Path,
    doc: &mut Doc,
) -> String {
    let mut out = String::from("### Does the load generator saturate before the server?\n\n");
    out.push_str(
        &CPU_TABLE_HEAD
            .replace("### CPU use (server on CPU 0, client on CPU 1)\n\n", "")
            .replace("| run |", "| client (ops/s) |"),
    );
    let Some(program) = memaslap::binary() else {
        doc.note("memaslap not installed (libmemcached-tools): saturation check skipped".into());
        return out;
    };
    let seconds = o.seconds.min(5);
    let mut servers = vec![(base, "memcached")];
    if let Some(s) = subj {
        servers.push((s, name));
    }
    for (server, who) in servers {
        match memaslap::run(program, server, o.conns, seconds, out_dir) {
            Ok(r) => {
                doc.command(&r.command);
                let run = format!(
                    "memaslap, 90% get / 10% set, 100 B ({:.0})",
                    r.ops_per_second
                );
                cpu_row(
                    &mut out,
                    &run,
                    who,
                    r.server_cpu_percent,
                    r.server_core,
                    r.client_cpu_percent,
                    r.client_core,
                );
            }
            Err(e) => doc.note(format!("memaslap against {who}: {e:#}")),
        }
    }
    if let Some((b, s)) = ours {
        for (who, r) in [("memcached", Some(b)), (name, s)] {
            if let Some(r) = r {
                let run = format!("loadgen, GET 100 B, depth 1 ({:.0})", r.throughput());
                cpu_row(
                    &mut out,
                    &run,
                    who,
                    r.server_cpu_percent(),
                    r.server_core,
                    r.client_cpu_percent(),
                    r.client_core,
                );
            }
        }
    }
    out
}

fn http_part(o: &Options, subject: &Subject, out_dir: &Path, doc: &mut Doc) -> Result<()> {
    let dir = out_dir.join("nginx");
    let port = procs::free_port()?;
    let conf = http::write_nginx_site(&dir, port, &VALUE_LENS)?;
    let mut nginx = procs::start_nginx(&conf, &dir, port)?;
    doc.command(&nginx.command);
    doc.command(&format!("(nginx.conf: {})", conf.display()));
    let name = subject.http_name();
    let started = match subject {
        Subject::Ringstore(binary) => procs::start_ringstore(binary, 256).and_then(|s| {
            let http_port = s.http_port.context("no http port")?;
            for len in VALUE_LENS {
                http::put_object(http_port, len)?;
            }
            Ok((s, http_port))
        }),
        Subject::Baseline => (|| {
            let dir2 = out_dir.join("nginx2");
            let port2 = procs::free_port()?;
            let conf2 = http::write_nginx_site(&dir2, port2, &VALUE_LENS)?;
            Ok((procs::start_nginx(&conf2, &dir2, port2)?, port2))
        })(),
    };
    let mut subj = match started {
        Ok((s, port)) => {
            doc.command(&s.command);
            Some((s, port))
        }
        Err(e) => {
            doc.note(format!(
                "{name} (HTTP) did not start or take the PUTs: {e:#}"
            ));
            None
        }
    };
    let mut table = Table::new("nginx", name);
    let mut cpu = String::from(CPU_TABLE_HEAD);
    for depth in DEPTHS {
        for value_len in VALUE_LENS {
            let cell = format!("HTTP {}", cell_name(Op::Get, value_len, depth));
            eprintln!("bench: {cell}");
            // A B B A halves, so background load hits both servers alike.
            let half = o.seconds.div_ceil(2);
            let mut b = http::run_wrk(&mut nginx, port, value_len, depth, o.conns, half, out_dir)
                .with_context(|| format!("{cell} against nginx"))?;
            doc.command(&b.command);
            let mut s = None;
            if let Some((server, p)) = subj.as_mut() {
                let p = *p;
                let both = http::run_wrk(server, p, value_len, depth, o.conns, half, out_dir)
                    .and_then(|mut first| {
                        first.merge(&http::run_wrk(
                            server, p, value_len, depth, o.conns, half, out_dir,
                        )?);
                        Ok(first)
                    });
                match both {
                    Ok(r) => s = Some(r),
                    Err(e) => {
                        doc.note(format!("{cell}: {name} failed: {e:#}"));
                        if server.check_alive().is_err() {
                            subj = None;
                        }
                    }
                }
            }
            b.merge(
                &http::run_wrk(&mut nginx, port, value_len, depth, o.conns, half, out_dir)
                    .with_context(|| format!("{cell} against nginx"))?,
            );
            table.row(
                &format!("{cell}: throughput (req/s)"),
                b.requests_per_second,
                s.as_ref().map(|r| r.requests_per_second),
                Better::Higher,
                0,
            );
            table.row(
                &format!("{cell}: p50 latency (µs)"),
                b.p50_us,
                s.as_ref().map(|r| r.p50_us),
                Better::Lower,
                1,
            );
            table.row(
                &format!("{cell}: p99 latency (µs)"),
                b.p99_us,
                s.as_ref().map(|r| r.p99_us),
                Better::Lower,
                1,
            );
            table.row(
                &format!("{cell}: server CPU s / M req"),
                b.server_cpu_per_million(),
                s.as_ref().map(|r| r.server_cpu_per_million()),
                Better::Lower,
                2,
            );
            for (who, r) in [("nginx", Some(&b)), (name, s.as_ref())] {
                if let Some(r) = r {
                    cpu_row(
                        &mut cpu,
                        &cell,
                        who,
                        r.server_cpu_percent,
                        r.server_core,
                        r.client_cpu_percent,
                        r.client_core,
                    );
                }
            }
            if let Some(s) = &s {
                let tput = s.requests_per_second / b.requests_per_second;
                let p99 = s.p99_us / b.p99_us;
                let p99_text = if p99.is_finite() {
                    format!("{p99:.2}× {}", mark(p99 <= 1.0))
                } else {
                    "n/a".to_string()
                };
                doc.targets.push(format!(
                    "{cell}: throughput {tput:.2}× nginx (target ≥ 1.0×) {}; p99 {p99_text} (target ≤ 1.0×)",
                    mark(tput >= 1.0)
                ));
            }
        }
    }
    let mut section =
        String::from("## HTTP GET (one server core each, wrk -t1 on the other core)\n\n");
    section.push_str(&table.markdown());
    section.push('\n');
    section.push_str(&cpu);
    section.push_str("\nEach server ran twice for half the time, in the order nginx, ringstore, ringstore, nginx; percentiles are the mean of the two runs. wrk measures latency per pipelined batch (from its send to its last response).\n");
    doc.sections.push(section);
    Ok(())
}

fn memory_part(subject: &Subject, doc: &mut Doc) -> Result<()> {
    let base = {
        let mut server = procs::start_memcached(512)?;
        doc.command(&server.command);
        memory::measure(&mut server, MEMORY_ITEMS)?
    };
    let name = subject.memcache_name();
    let subj = match subject.start_memcache(512) {
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
    Ok(())
}

/// `--data` SET throughput on disk and tmpfs against RAM only, then recovery of 1M objects.
fn durable_part(o: &Options, subject: &Subject, out_dir: &Path, doc: &mut Doc) -> Result<()> {
    let Subject::Ringstore(binary) = subject else {
        doc.note("durable: skipped under --self-check (memcached has no data device)".into());
        return Ok(());
    };
    let disk_path = out_dir.join("durable-disk.data");
    let shm = Path::new("/dev/shm");
    let tmpfs_path = shm.join(format!("ringstore-bench-{}.data", std::process::id()));
    let mut configs = vec![durable::start_ram_only(binary).context("durable: RAM-only ringstore")?];
    let tmpfs_fs = durable::filesystem_name(&tmpfs_path);
    let disk_label = "--data on disk";
    let tmpfs_label = "--data on tmpfs";
    match durable::start_durable(binary, disk_label, disk_path.clone()) {
        Ok(c) => configs.push(c),
        Err(e) => doc.note(format!("durable: {disk_label} did not start: {e:#}")),
    }
    if tmpfs_fs == "tmpfs" {
        match durable::start_durable(binary, tmpfs_label, tmpfs_path.clone()) {
            Ok(c) => configs.push(c),
            Err(e) => doc.note(format!("durable: {tmpfs_label} did not start: {e:#}")),
        }
    } else {
        doc.note(format!(
            "durable: /dev/shm is {tmpfs_fs}, not tmpfs: tmpfs cell skipped"
        ));
    }
    for c in &configs {
        doc.command(&match &c.data {
            Some(d) => format!(
                "{} (data file: 2 GiB sparse, on {}; removed afterwards)",
                c.server.command,
                durable::filesystem_name(&d.path)
            ),
            None => c.server.command.clone(),
        });
    }
    let seconds = o.seconds.min(durable::MAX_LOAD.as_secs());
    eprintln!(
        "bench: durable: SET {} B, depth 1, {} connections: {} in alternating slices",
        durable::VALUE_LEN,
        durable::CONNS,
        configs
            .iter()
            .map(|c| c.label)
            .collect::<Vec<_>>()
            .join(", ")
    );
    let results = durable::measure_sets(&configs, seconds, WARMUP)?;
    for c in configs.iter_mut() {
        if let Err(e) = c.server.check_alive() {
            doc.note(format!("durable: {} exited during the run: {e:#}", c.label));
        }
    }
    doc.command(&format!(
        "durable SET cell: load generator, {} connections per server, depth 1, {} B values over {} keys, {} s warm-up, {seconds} s measured per server in {} alternating slices",
        durable::CONNS, durable::VALUE_LEN, durable::KEYSPACE, WARMUP.as_secs(), seconds.clamp(1, 10)
    ));
    let ram = results.first().context("RAM-only result")?.clone();
    let mut section = format!(
        "## Durable SET: `--data` with group commit vs RAM only ({} connections, depth 1, {} B values, one server core each)\n\n",
        durable::CONNS, durable::VALUE_LEN
    );
    section.push_str("| configuration | SET/s | × RAM only | p50 (µs) | p99 (µs) | p99 × RAM only | server CPU s / M req | CPU 0 busy % |\n");
    section.push_str("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    for (c, r) in configs.iter().zip(&results) {
        let label = match &c.data {
            Some(d) => format!("{} ({})", c.label, durable::filesystem_name(&d.path)),
            None => c.label.to_string(),
        };
        let _ = writeln!(
            section,
            "| {label} | {} | {:.2}× | {:.1} | {:.1} | {:.2}× | {:.2} | {:.0} |",
            report::format_number(r.throughput(), 0),
            r.throughput() / ram.throughput(),
            r.p50_us(),
            r.p99_us(),
            r.p99_us() / ram.p99_us(),
            r.server_cpu_per_million(),
            r.server_core.busy_percent
        );
        if r.misses + r.errors > 0 {
            doc.note(format!(
                "durable: {label}: {} misses and {} errors",
                r.misses, r.errors
            ));
        }
        if c.data.is_some() {
            let ratio = r.throughput() / ram.throughput();
            doc.targets.push(format!("durable SET, {label}: {ratio:.2}× RAM-only throughput under {} clients (aim ≥ 0.5×) {}", durable::CONNS, mark(ratio >= 0.5)));
        }
    }
    drop(configs);

    eprintln!(
        "bench: durable: recovery of {} objects",
        durable::RECOVERY_OBJECTS
    );
    let data = durable::DataFile::create(out_dir.join("durable-recovery.data"))?;
    let fs = durable::filesystem_name(&data.path);
    let recovery = durable::measure_recovery(binary, &data);
    drop(data);
    doc.command(&format!(
        "recovery: ringstore serve --cores 1 --memory 1024MiB --data target/bench/durable-recovery.data (2 GiB sparse, {fs}); {} sets of {} B on 8 connections; kill -9; restart; SIGTERM; restart. Before each restart the file's page cache is dropped with posix_fadvise(DONTNEED); time = spawn to the ready line; curr_items and the first and last key checked",
        durable::RECOVERY_OBJECTS, durable::VALUE_LEN
    ));
    match recovery {
        Ok(r) => {
            let ms = |v: Option<u64>| v.map_or("n/a".to_string(), |v| v.to_string());
            let _ = writeln!(section, "\n### Recovery of {} objects ({} B values, data file on the disk, {fs}, page cache dropped before each start)\n", report::format_number(durable::RECOVERY_OBJECTS as f64, 0), durable::VALUE_LEN);
            section.push_str("| start | to the ready line (ms) | recovery step (ms) | load into RAM (ms) | objects loaded |\n| --- | ---: | ---: | ---: | ---: |\n");
            for (what, st) in [
                ("after kill -9 (scan)", &r.after_kill),
                ("after SIGTERM (checkpoint)", &r.after_term),
            ] {
                let how = if st.from_checkpoint {
                    " [from checkpoint]"
                } else {
                    " [log scan]"
                };
                let _ = writeln!(
                    section,
                    "| {what}{how} | {:.0} | {} | {} | {} |",
                    st.ready_seconds * 1e3,
                    ms(st.recover_ms),
                    ms(st.load_ms),
                    st.objects
                );
            }
            let _ = writeln!(section, "\nFill: {:.1} s ({} sets/s over 8 connections). SIGTERM to exit (checkpoint written): {:.0} ms.", r.fill_seconds, report::format_number(durable::RECOVERY_OBJECTS as f64 / r.fill_seconds, 0), r.shutdown_seconds * 1e3);
        }
        Err(e) => doc.note(format!("durable: recovery measurement failed: {e:#}")),
    }
    doc.sections.push(section);
    Ok(())
}

/// CPU model, CPU count, kernel, memory.
fn machine_summary() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|m| m.trim_start_matches([' ', '\t', ':']))
        .unwrap_or("unknown CPU");
    let cpus = cpuinfo
        .lines()
        .filter(|l| l.starts_with("processor"))
        .count();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mem_kb: u64 = std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0);
    format!(
        "- machine: {cpus} × {model}, {:.0} GiB RAM, Linux {}",
        mem_kb as f64 / 1048576.0,
        kernel.trim()
    )
}

/// Load average and how many compilers run beside us (the machine is shared).
fn load_summary() -> String {
    let loadavg = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load: Vec<&str> = loadavg.split_whitespace().take(3).collect();
    let mut compilers = 0;
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let comm = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
            if matches!(
                comm.trim(),
                "rustc" | "cc1" | "cc1plus" | "ld" | "clippy-driver"
            ) {
                compilers += 1;
            }
        }
    }
    format!(
        "load average {} (1/5/15 min), {compilers} compiler processes running",
        load.join(" ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn parses_arguments() {
        let o = parse(&args(&[
            "--seconds",
            "3",
            "--only",
            "http",
            "--binary",
            "/x/ringstore",
        ]))
        .unwrap();
        assert_eq!(o.seconds, 3);
        assert!(o.only == Some(Part::Http));
        assert_eq!(o.binary.as_deref(), Some(Path::new("/x/ringstore")));
        assert_eq!(o.conns, 50);
        assert!(parse(&args(&["--only", "disk"])).is_err());
        assert!(parse(&args(&["--seconds"])).is_err());
        assert!(parse(&args(&["--seconds", "0"])).is_err());
        assert!(parse(&args(&["--bogus"])).is_err());
        let o = parse(&args(&["--cells", "get-100-1,SET-4096-16"])).unwrap();
        assert!(o.cells == [(Op::Get, 100, 1), (Op::Set, 4096, 16)]);
        assert!(parse(&args(&["--cells", "get-100-2"])).is_err());
        assert!(parse(&args(&["--cells", "del-100-1"])).is_err());
    }

    #[test]
    fn parses_durable_and_compare_binary() {
        assert!(parse(&args(&["--only", "durable"])).unwrap().only == Some(Part::Durable));
        let o = parse(&args(&[
            "--compare-binary",
            "/t/x86_64-unknown-linux-musl/release/ringstore",
        ]))
        .unwrap();
        assert!(
            o.only == Some(Part::Memcache),
            "--compare-binary runs the memcache cells"
        );
        assert_eq!(
            o.compare.as_deref(),
            Some(Path::new("/t/x86_64-unknown-linux-musl/release/ringstore"))
        );
        assert!(parse(&args(&["--compare-binary", "/x", "--only", "http"])).is_err());
        assert!(parse(&args(&["--compare-binary", "/x", "--self-check"])).is_err());
    }

    #[test]
    fn binary_labels_name_the_target() {
        assert_eq!(
            binary_label(Path::new("/t/x86_64-unknown-linux-musl/release/ringstore")),
            "ringstore (x86_64-unknown-linux-musl)"
        );
        assert_eq!(
            binary_label(Path::new("/work/target-bench2/release/ringstore")),
            "ringstore (host)"
        );
    }

    #[test]
    fn cell_names_read_well() {
        assert_eq!(cell_name(Op::Get, 100, 1), "GET 100 B, depth 1");
        assert_eq!(cell_name(Op::Set, 4096, 16), "SET 4 KiB, depth 16");
    }
}
