//! The icount part (`cargo xtask bench --only icount`): user-space instructions per request,
//! counted by valgrind's callgrind, for ringstore and memcached on the same request stream (a
//! measure the machine's noise does not move, unlike CPU seconds).
//!
//! Each server runs under `valgrind --tool=callgrind` (ringstore with `--cores 1` and the hidden
//! key `--eventfd-wait on`: valgrind runs `io_uring_enter` holding its big lock, so a worker
//! waiting inside it would starve every other thread; memcached with `-t 1`). One client
//! connection (the load generator's counted passes, client/) sends each cell's requests in
//! batches of `depth` (all sent before any reply is read). Counts are taken by difference: `callgrind_control --dump` before a pass of
//! N requests, after it, and after a pass of 2N; (I(2N) - I(N)) / N cancels startup, the dump
//! itself and whatever idle work a pass costs once (`--separate-threads=yes`: one file per
//! thread). Counted: every user-space instruction of the worker thread, the one that parses,
//! looks up and answers, less ringstore's expiry reaper (clock-driven); beside it, all threads,
//! which adds memcached's timer-driven helper threads (they follow the wall clock, so they are
//! noisy). Not counted: the kernel (system calls, TCP, io_uring), which callgrind cannot see.

use super::client::{self, LoadSpec, Mode};
use super::doc::Doc;
use super::icount_baseline as baseline;
use super::mcwire::Op;
use super::procs::free_port;
use super::report::{format_number, Better, Table};
use super::subject::Subject;
use crate::util;
use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Value size of every icount cell.
pub(super) const VALUE_LEN: usize = 100;
/// Keys the stream cycles through (preloaded, so every GET hits).
const KEYS: usize = 1024;
/// Requests in the short pass; the long pass has twice as many. A multiple of every depth.
const N: usize = 2048;
/// Short + long pass pairs per cell (the median is reported; the spread shows the repeatability).
const PASSES: usize = 3;
/// Requests sent before a cell's first dump (connection buffers, caches, lazy setup).
const WARM: usize = 512;
/// The cells: (operation, pipeline depth).
pub(super) const CELLS: [(Op, usize); 4] =
    [(Op::Get, 1), (Op::Get, 16), (Op::Set, 1), (Op::Set, 16)];
/// How long a server under valgrind may take to listen, and a reply to come back.
const START_TIMEOUT: Duration = Duration::from_secs(60);
const REPLY_TIMEOUT: Duration = Duration::from_secs(60);
/// memcached's `-c`, and the open-files soft limit both servers run under valgrind with.
const MAX_CONNS: usize = 1024;

const NO_VALGRIND: &str = "valgrind not found: the icount part runs the servers under callgrind \
                           (apt-get install valgrind; it brings callgrind_control)";

/// A server running under callgrind; killed and reaped on drop.
struct Grind {
    name: String,
    child: Child,
    port: u16,
    /// `--callgrind-out-file`; dump k lands in `{out}.{k}`.
    out: PathBuf,
    dumps: usize,
    command: String,
    /// Only a thread whose dump names this function can be the worker (None: any thread).
    request_marker: Option<&'static str>,
    excluded: &'static [&'static str],
    profile_excluded: &'static [&'static str],
}

/// How to run one server under callgrind.
struct Spec {
    name: &'static str,
    program: Vec<String>,
    /// Extra valgrind options.
    valgrind: Vec<String>,
    request_marker: Option<&'static str>,
    /// Calls to functions whose names end with these are subtracted (clock-driven work).
    excluded: &'static [&'static str],
    /// Left out of the per-function counts, with what they call ([`baseline::self_costs`]).
    profile_excluded: &'static [&'static str],
}

impl Grind {
    /// `valgrind --tool=callgrind ... program args`, waiting until it listens on `port`.
    fn start(spec: &Spec, dir: &Path, port: u16) -> Result<Grind> {
        let name = spec.name;
        let out = dir.join(format!("{name}.out"));
        let log = dir.join(format!("{name}.log"));
        for stale in std::fs::read_dir(dir)?.flatten() {
            if stale
                .file_name()
                .to_string_lossy()
                .starts_with(&format!("{name}."))
            {
                let _ = std::fs::remove_file(stale.path());
            }
        }
        // valgrind reports a hard open-files limit equal to the soft one and refuses any other;
        // memcached sets both to its -c, so the soft limit must be exactly MAX_CONNS.
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "ulimit -Sn \"$0\" && exec \"$@\""])
            .arg(MAX_CONNS.to_string())
            .arg("valgrind")
            .arg("--tool=callgrind")
            .arg(format!("--callgrind-out-file={}", out.display()))
            .arg(format!("--log-file={}", log.display()))
            .arg("--separate-threads=yes")
            .args(&spec.valgrind)
            .args(&spec.program);
        let command = super::procs::command_line(&cmd);
        eprintln!("+ {command}");
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context(NO_VALGRIND)?;
        let mut grind = Grind {
            name: name.to_string(),
            child,
            port,
            out,
            dumps: 0,
            command,
            request_marker: spec.request_marker,
            excluded: spec.excluded,
            profile_excluded: spec.profile_excluded,
        };
        let deadline = Instant::now() + START_TIMEOUT;
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Some(status) = grind.child.try_wait()? {
                bail!(
                    "{name} under valgrind exited ({status}); see {}",
                    log.display()
                );
            }
            if Instant::now() > deadline {
                bail!(
                    "{name} under valgrind did not listen on port {port} within {} s; see {}",
                    START_TIMEOUT.as_secs(),
                    log.display()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(grind)
    }

    /// Dumps the counters (which also zeroes them) and returns the instructions since the last
    /// dump: of the worker thread, and of all threads.
    fn dump(&mut self) -> Result<Counts> {
        let pid = self.child.id().to_string();
        let output = Command::new("callgrind_control")
            .args(["--dump", &pid])
            .stdin(Stdio::null())
            .output()
            .context(NO_VALGRIND)?;
        if !output.status.success() {
            bail!(
                "callgrind_control --dump {pid} ({}) failed: {}",
                self.name,
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        self.dumps += 1;
        let mut counts = Counts::default();
        let files = self.dump_files(self.dumps)?;
        if files.is_empty() {
            bail!(
                "callgrind wrote no dump {}.{}-*",
                self.out.display(),
                self.dumps
            );
        }
        for path in files {
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("reading the callgrind dump {}", path.display()))?;
            let n = totals(&text)
                .with_context(|| format!("no totals: line in {}", path.display()))?
                .saturating_sub(
                    self.excluded
                        .iter()
                        .map(|e| inclusive_calls(&text, e))
                        .sum(),
                );
            counts.all += n;
            if n > counts.request && self.request_marker.is_none_or(|m| names_function(&text, m)) {
                counts.request = n;
                counts.worker = path;
            }
        }
        Ok(counts)
    }

    /// The worker's exclusive instructions per request, function by function, between two
    /// dumps `N` requests apart (the excluded clock-driven functions left out).
    fn functions(&self, short: &Path, long: &Path) -> Result<BTreeMap<String, f64>> {
        let read = |p: &Path| {
            std::fs::read_to_string(p)
                .with_context(|| format!("reading the callgrind dump {}", p.display()))
                .map(|text| baseline::self_costs(&text, self.profile_excluded))
        };
        Ok(baseline::per_request(&read(short)?, &read(long)?, N))
    }

    /// Dump `k`'s files, one per thread (`--separate-threads=yes`: `{out}.{k}-{thread}`).
    fn dump_files(&self, k: usize) -> Result<Vec<PathBuf>> {
        let dir = self.out.parent().context("dump directory")?;
        let stem = format!(
            "{}.{k}-",
            self.out.file_name().context("dump name")?.to_string_lossy()
        );
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(&stem))
            .map(|e| e.path())
            .collect();
        files.sort();
        Ok(files)
    }
}

/// What one dump counted.
#[derive(Default)]
struct Counts {
    /// The worker: the busiest thread (of memcached's, the busiest libevent thread).
    request: u64,
    /// Every thread.
    all: u64,
    /// The worker's dump file (the one to annotate).
    worker: PathBuf,
}

/// Whether function `name` ran during a callgrind dump's interval (has an `fn=` block). With
/// name compression a name is spelled once, `(id) name`, on whichever `fn=`/`cfn=` line uses
/// the id first, and later lines give only `(id)`.
fn names_function(text: &str, name: &str) -> bool {
    let ids: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("fn=").or_else(|| l.strip_prefix("cfn=")))
        .filter_map(|rest| match split_id(rest) {
            (Some(id), n) if n == name => Some(id),
            _ => None,
        })
        .collect();
    text.lines()
        .filter_map(|l| l.strip_prefix("fn="))
        .any(|rest| match split_id(rest) {
            (Some(id), _) => ids.contains(&id),
            (None, n) => n == name,
        })
}

impl Drop for Grind {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `(id) name` -> (Some(id), name); `name` -> (None, name): a name-compressed callgrind field.
fn split_id(rest: &str) -> (Option<&str>, &str) {
    match rest.strip_prefix('(').and_then(|t| t.split_once(')')) {
        Some((id, tail)) => (Some(id), tail.trim_start()),
        None => (None, rest),
    }
}

/// The inclusive instructions of every call, in a callgrind dump, to a function whose name ends
/// with `suffix`: each `calls=` line after a `cfn=` naming it is followed by a `position cost`
/// line whose cost includes everything the call ran.
fn inclusive_calls(text: &str, suffix: &str) -> u64 {
    let mut ids: Vec<&str> = Vec::new();
    let (mut target, mut take_next, mut sum) = (false, false, 0u64);
    for line in text.lines() {
        if take_next {
            take_next = false;
            sum += line
                .split_whitespace()
                .last()
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or(0);
            continue;
        }
        if let Some(rest) = line.strip_prefix("cfn=") {
            let (id, name) = split_id(rest);
            if !name.is_empty() && name.ends_with(suffix) {
                ids.extend(id);
                target = true;
            } else {
                target = id.is_some_and(|id| ids.contains(&id)) && name.is_empty();
            }
        } else if line.starts_with("calls=") {
            take_next = target;
            target = false;
        } else if let Some(rest) = line.strip_prefix("fn=") {
            target = false;
            if let (Some(id), name) = split_id(rest) {
                if !name.is_empty() && name.ends_with(suffix) {
                    ids.push(id);
                }
            }
        }
    }
    sum
}

/// The instruction total of a callgrind dump (its `totals:` line, else `summary:`).
fn totals(text: &str) -> Option<u64> {
    let field = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse().ok())
    };
    field("totals:").or_else(|| field("summary:"))
}

/// One pass of `count` requests of `op` at `depth` on the session's connection; fails unless
/// every reply is the expected one (a hit, `STORED`).
fn pass(client: &mut client::Session, op: Op, depth: usize, count: usize) -> Result<()> {
    let mode = Mode::Memcache {
        op,
        value_len: VALUE_LEN,
    };
    let r = client.pass(&mode, depth, count, REPLY_TIMEOUT)?;
    if r.misses + r.errors > 0 {
        bail!(
            "{}: {} misses and {} errors in {} replies",
            op.name(),
            r.misses,
            r.errors,
            r.requests
        );
    }
    Ok(())
}

/// One server's instructions per request for one cell, pass by pass.
struct Counted {
    /// The worker thread.
    passes: Vec<f64>,
    /// All threads.
    all: Vec<f64>,
    /// The heaviest thread's file of the last long pass (for callgrind_annotate).
    profile: PathBuf,
    /// The worker's exclusive instructions per request, function by function (median of
    /// the passes).
    functions: BTreeMap<String, f64>,
}

pub(super) fn median(v: &[f64]) -> f64 {
    let mut sorted = v.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// (max - min) / median.
fn spread(v: &[f64]) -> f64 {
    let max = v.iter().copied().fold(f64::MIN, f64::max);
    let min = v.iter().copied().fold(f64::MAX, f64::min);
    (max - min) / median(v)
}

/// Instructions per request of every cell on `server`.
fn measure(server: &mut Grind) -> Result<Vec<Counted>> {
    let mut client = client::Session::open(&LoadSpec {
        port: server.port,
        mode: Mode::Memcache {
            op: Op::Set,
            value_len: VALUE_LEN,
        },
        depth: 16,
        conns: 1,
        keyspace: KEYS,
        warmup: Duration::ZERO,
        measure: Duration::ZERO,
        slices: 1,
        server_pid: server.child.id(),
    })?;
    pass(&mut client, Op::Set, 16, KEYS)?;
    let mut out = Vec::new();
    for (op, depth) in CELLS {
        eprintln!("bench: icount: {} {} depth {depth}", server.name, op.name());
        pass(&mut client, op, depth, WARM)?;
        server.dump()?;
        let (mut passes, mut all) = (Vec::new(), Vec::new());
        let mut profile = PathBuf::new();
        let mut functions = Vec::new();
        for _ in 0..PASSES {
            pass(&mut client, op, depth, N)?;
            let short = server.dump()?;
            pass(&mut client, op, depth, 2 * N)?;
            let long = server.dump()?;
            passes.push(long.request.saturating_sub(short.request) as f64 / N as f64);
            all.push(long.all.saturating_sub(short.all) as f64 / N as f64);
            functions.push(server.functions(&short.worker, &long.worker)?);
            profile = long.worker;
        }
        out.push(Counted {
            passes,
            all,
            profile,
            functions: baseline::median_profile(&functions),
        });
    }
    Ok(out)
}

/// ringstore under callgrind; `extra`: `--icount-args` (e.g. `--latency-histograms off`).
fn ringstore_spec(binary: &Path, port: u16, extra: &[String]) -> Spec {
    let mut program = vec![binary.to_string_lossy().into_owned()];
    program.extend(util::serve_on_loopback(port, false));
    program.extend(["--cores", "1", "--memory", "64MiB", "--eventfd-wait", "on"].map(String::from));
    program.extend(extra.iter().cloned());
    Spec {
        name: "ringstore",
        program,
        valgrind: Vec::new(),
        request_marker: None,
        // The expiry reaper runs on the clock (every tick), not per request; the eventfd wait
        // exists only for valgrind, and how often it loops follows the timing. (Not
        // callgrind's --toggle-collect: its on/off state is global, so a toggle on one
        // thread stops the count of the others.)
        excluded: &["::reclaim_expired", "::wait_in_eventfd"],
        // The per-function counts also leave out what those call: the reaper's item walk
        // (the item headers it decodes) moved them by up to 200 instructions per request
        // between passes.
        profile_excluded: &["::reclaim_expired", "::wait_in_eventfd", "::reap"],
    }
}

fn memcached_spec(name: &'static str, port: u16) -> Spec {
    let (port, conns) = (port.to_string(), MAX_CONNS.to_string());
    let mut program: Vec<String> = [
        "memcached",
        "-t",
        "1",
        "-U",
        "0",
        "-l",
        "127.0.0.1",
        "-p",
        &port,
        "-m",
        "64",
        "-c",
        &conns,
    ]
    .map(String::from)
    .to_vec();
    if util::is_root() {
        program.extend(["-u", "root"].map(String::from));
    }
    Spec {
        name,
        program,
        valgrind: Vec::new(),
        // The worker runs a libevent loop (so does the listener, which after the accept only
        // runs memcached's clock); the LRU maintainer, LRU crawler, logger, hash-expansion and
        // slab-rebalance threads wake on timers instead.
        request_marker: Some("event_base_loop"),
        excluded: &[],
        profile_excluded: &[],
    }
}

/// What the icount part does with the baseline besides comparing with it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum BaselineUse {
    /// Compare and report.
    Report,
    /// Compare; a function that moved fails the run (`--icount-check`).
    Check,
    /// Write the baseline from this run (`--icount-record`).
    Record,
}

pub(super) fn icount_part(
    subject: &Subject,
    out_dir: &Path,
    doc: &mut Doc,
    use_baseline: BaselineUse,
    extra: &[String],
) -> Result<()> {
    if !util::have("valgrind") || !util::have("callgrind_control") {
        bail!("{NO_VALGRIND}");
    }
    let dir = out_dir.join("icount");
    std::fs::create_dir_all(&dir)?;
    let mut results = Vec::new();
    for which in 0..2 {
        let port = free_port()?;
        let spec = match (which, subject) {
            (0, _) => memcached_spec("memcached", port),
            (_, Subject::Ringstore(binary)) => ringstore_spec(binary, port, extra),
            (_, Subject::Baseline) => memcached_spec("memcached-again", port),
        };
        let mut server = Grind::start(&spec, &dir, port)?;
        doc.command(&server.command);
        let counted =
            measure(&mut server).with_context(|| format!("{} under callgrind", spec.name))?;
        results.push((spec.name, counted));
    }
    doc.command(&format!(
        "icount client (tests/bench/src/client/, counted passes): 1 connection, {KEYS} keys preloaded with {VALUE_LEN}-byte values; per cell {WARM} requests, then {PASSES}× (callgrind_control --dump, {N} requests, dump, {} requests, dump); instructions/request = (I(2N) - I(N)) / N",
        2 * N
    ));
    for (name, counted) in &results {
        for ((op, depth), c) in CELLS.iter().zip(counted) {
            doc.note(format!(
                "icount: {name} {} depth {depth}, the worker thread in the last {}-request pass: callgrind_annotate {}",
                op.name(),
                2 * N,
                c.profile.display()
            ));
        }
    }
    doc.sections.push(render(&results));
    if let (Subject::Ringstore(_), Some((_, counted))) = (subject, results.last()) {
        against_baseline(counted, doc, use_baseline)?;
    }
    Ok(())
}

/// The cell's name in the baseline.
fn cell_name(op: Op, depth: usize) -> String {
    format!("{} {VALUE_LEN} B, depth {depth}", op.name())
}

/// Compares ringstore's per-function counts with the recorded baseline (or records them).
fn against_baseline(counted: &[Counted], doc: &mut Doc, use_baseline: BaselineUse) -> Result<()> {
    let mut now = baseline::Profile::new();
    for ((op, depth), c) in CELLS.iter().zip(counted) {
        let mut functions = c.functions.clone();
        functions.insert(baseline::TOTAL.to_string(), median(&c.passes));
        now.insert(cell_name(*op, *depth), functions);
    }
    let path = util::root().join(baseline::BASELINE);
    if use_baseline == BaselineUse::Record {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(&path, baseline::to_tsv(&now))?;
        doc.note(format!("icount: recorded the baseline {}", path.display()));
        return Ok(());
    }
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e)
            if e.kind() == std::io::ErrorKind::NotFound && use_baseline == BaselineUse::Report =>
        {
            doc.note(format!(
                "icount: no baseline {} to compare with (--icount-record writes it)",
                path.display()
            ));
            return Ok(());
        }
        Err(e) => {
            return Err(e)
                .with_context(|| format!("reading the icount baseline {}", path.display()))
        }
    };
    let recorded =
        baseline::from_tsv(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let compared = now.keys().filter(|c| recorded.contains_key(*c)).count();
    let moved = baseline::compare(&recorded, &now);
    doc.sections.push(baseline::render(&moved, compared));
    if !moved.is_empty() {
        let line = format!(
            "icount: {} function counts moved against {} (see its section)",
            moved.len(),
            baseline::BASELINE
        );
        if use_baseline == BaselineUse::Check {
            doc.failures.push(line.clone());
        }
        doc.note(line);
    }
    Ok(())
}

fn render(results: &[(&str, Vec<Counted>)]) -> String {
    let mut s = format!(
        "## icount: user-space instructions per request (callgrind; {VALUE_LEN}-byte values, one connection)\n\n\
         Counted: the worker thread, the one that parses, looks up and answers (memcached's: the busiest of its libevent threads); left out of ringstore's: its expiry reaper (it runs on the clock, not per request) and its wait for completions (`--eventfd-wait on`, which exists for valgrind: a zero-timeout io_uring_enter and a poll(2) of at most 1 ms). All threads adds the listener, ringstore's main thread, and memcached's timer-driven LRU maintainer, LRU crawler, logger and hash/slab threads, whose work follows the wall clock, not the requests. The kernel's share (system calls, TCP, io_uring) is not counted.\n\n"
    );
    let cell = |op: Op, depth: usize| format!("{} {VALUE_LEN} B, depth {depth}", op.name());
    if let [(base_name, base), (subj_name, subj)] = results {
        let mut table = Table::new(base_name, subj_name);
        type Pick = fn(&Counted) -> &[f64];
        let rows: [(&str, Pick, Better); 2] = [
            ("instructions / request", |c| &c.passes, Better::Lower),
            ("all threads (+ timers)", |c| &c.all, Better::Neither),
        ];
        for (label, pick, better) in rows {
            for (((op, depth), b), r) in CELLS.iter().zip(base).zip(subj) {
                table.row(
                    &format!("{}: {label}", cell(*op, *depth)),
                    median(pick(b)),
                    Some(median(pick(r))),
                    better,
                    0,
                );
            }
        }
        s.push_str(&table.markdown());
    }
    s.push_str("\n| server | depth | GET instr/req | SET instr/req | SET / GET |\n| --- | ---: | ---: | ---: | ---: |\n");
    for (name, counted) in results {
        for depth in [1, 16] {
            let find = |want: Op| {
                CELLS
                    .iter()
                    .zip(counted)
                    .find(|((op, d), _)| *op == want && *d == depth)
                    .map(|(_, c)| median(&c.passes))
            };
            if let (Some(get), Some(set)) = (find(Op::Get), find(Op::Set)) {
                let _ = writeln!(
                    s,
                    "| {name} | {depth} | {} | {} | {:.2}× |",
                    format_number(get, 0),
                    format_number(set, 0),
                    set / get
                );
            }
        }
    }
    s.push_str("\nRepeatability, pass by pass (each pass: (I(2N) - I(N)) / N; the worker thread; the tables above give the median):\n\n| cell | server | passes | spread | all threads: passes | spread |\n| --- | --- | --- | ---: | --- | ---: |\n");
    let list = |v: &[f64]| {
        v.iter()
            .map(|p| format_number(*p, 0))
            .collect::<Vec<_>>()
            .join(" / ")
    };
    for (name, counted) in results {
        for ((op, depth), c) in CELLS.iter().zip(counted) {
            let _ = writeln!(
                s,
                "| {} | {name} | {} | {:.2}% | {} | {:.2}% |",
                cell(*op, *depth),
                list(&c.passes),
                100.0 * spread(&c.passes),
                list(&c.all),
                100.0 * spread(&c.all)
            );
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_read_the_totals_line_then_summary() {
        assert_eq!(
            totals("events: Ir\nfl=x\n0 5\ntotals: 123456\n"),
            Some(123456)
        );
        assert_eq!(totals("events: Ir\nsummary: 77\n"), Some(77));
        assert_eq!(totals("events: Ir\n"), None);
        assert_eq!(totals("totals: abc\n"), None);
    }

    #[test]
    fn function_names_in_compressed_and_plain_form() {
        let text = "fn=(12) event_base_loop\ncfn=(13) epoll_wait\nfn=plain_one\ncfn=(14) later\n";
        assert!(names_function(text, "event_base_loop"));
        assert!(names_function(text, "plain_one"));
        assert!(
            !names_function(text, "epoll_wait"),
            "a callee only is not a function that ran"
        );
        assert!(!names_function(text, "event_base"));
        let defined_as_callee_first = "fn=(1) main\ncfn=(14) later\nfn=(14)\n";
        assert!(names_function(defined_as_callee_first, "later"));
    }

    #[test]
    fn inclusive_calls_sum_the_cost_lines_after_calls_to_the_function() {
        let text = "fn=(1) main\n5 100\ncfn=(2) a::b::reclaim_expired\ncalls=1 10\n6 4000\n\
                    cfn=(3) other\ncalls=2 20\n7 999\nfn=(4) tick\ncfn=(2)\ncalls=1 10\n+2 500\n\
                    fn=(2)\n10 4400\n";
        assert_eq!(inclusive_calls(text, "::reclaim_expired"), 4500);
        assert_eq!(inclusive_calls(text, "::absent"), 0);
    }

    #[test]
    fn spread_and_median() {
        let v = [990.0, 1010.0];
        assert_eq!(median(&v), 1000.0);
        assert!((spread(&v) - 0.02).abs() < 1e-9);
        assert_eq!(
            median(&[5.0, 1.0, 3.0]),
            3.0,
            "an outlier pass does not move the median"
        );
        assert!(median(&[]).is_nan());
    }

    #[test]
    fn every_cell_divides_the_passes_into_whole_batches() {
        for (_, depth) in CELLS {
            assert_eq!(N % depth, 0);
            assert_eq!(WARM % depth, 0);
            assert_eq!(KEYS % 16, 0);
        }
    }
}
