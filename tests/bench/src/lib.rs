//! The benchmarks (`cargo xtask bench` runs this crate's binary with its arguments):
//! ringstore and memcached (and nginx for HTTP) side by side in one run.
//!
//! Every server runs pinned to CPU 0 with one core's worth of threads; every load generator
//! runs pinned to CPU 1. Every part that drives memcache load (and the TLS part's HTTPS
//! cells) uses the one io_uring load generator in client/, in its text, meta, binary, TLS or
//! UDP mode (memaslap saturates its core first; the run shows that too); the HTTP cells use
//! wrk. Results go to stdout and `target/bench/results.md`.

// `unsafe` only where the load generator and the floor server push io_uring SQEs
// (client/engine.rs, floor.rs): the buffers they point into outlive the operations, which
// only that code can show.
#![deny(unsafe_code)]

mod budget_fill;
mod cells;
mod client;
mod cores;
mod cores_plan;
mod cpu_table;
mod doc;
mod durable;
mod durable_part;
mod fill;
#[allow(
    unsafe_code,
    reason = "io_uring SQEs pointing into connection buffers, as in the load generator"
)]
pub mod floor;
mod hist;
mod http;
mod http_part;
mod icount;
mod icount_baseline;
pub mod load;
mod machine;
mod mcwire;
mod memaslap;
mod memcache_part;
mod memory;
mod memory_part;
mod metrics_part;
mod options;
mod procs;
mod redis;
mod report;
mod saturation;
mod subject;
mod tail;
mod tls_handshake;
mod tls_part;
mod tls_wire;
mod udp;

use anyhow::Result;
use doc::Doc;
use durable_part::durable_part;
use http_part::http_part;
use machine::{load_summary, machine_summary};
use memcache_part::memcache_part;
use memory_part::memory_part;
use options::{parse, Options, Part};
use ringstore_testkit as util;
use std::fmt::Write as _;
use std::time::{Duration, Instant};
use subject::{ringstore_binary, Subject};

/// Warm-up before every measured cell.
const WARMUP: Duration = Duration::from_secs(1);

/// The runtimes the memcache part measures: each of `--io`'s list, or the server's default.
fn runtimes(o: &Options) -> Vec<Option<String>> {
    match &o.io {
        Some(list) => list.split(',').map(|io| Some(io.to_string())).collect(),
        None => vec![None],
    }
}

/// The icount part: alone with `--only icount`; in the full run where valgrind is installed
/// (the bench never installs it), a failure costing only this part.
fn icount_step(
    o: &Options,
    subject: &Subject,
    out_dir: &std::path::Path,
    doc: &mut Doc,
) -> Result<()> {
    if o.only == Some(Part::Icount) {
        icount::icount_part(subject, out_dir, doc, o.icount, &o.icount_args)?;
    } else if o.only.is_none() {
        if let Err(e) = icount::icount_part(subject, out_dir, doc, o.icount, &o.icount_args) {
            doc.note(format!("icount part skipped: {e:#}"));
        }
    }
    Ok(())
}

/// The whole run: parses `args` (the flags of `cargo xtask bench`), writes target/bench/.
pub fn run(args: &[String]) -> Result<()> {
    let o = parse(args)?;
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
        // `--io io_uring,epoll`: both runtimes in one run, each section beside memcached.
        for io in runtimes(&o) {
            let one = Options { io, ..o.clone() };
            memcache_part(&one, &subject, &out_dir, &mut doc)?;
        }
    }
    tail::tail_step(&o, &subject, &mut doc)?;
    if wants(Part::Http) {
        http_part(&o, &subject, &out_dir, &mut doc)?;
    }
    if wants(Part::Memory) {
        memory_part(&subject, &mut doc)?;
    }
    if wants(Part::Durable) || o.only == Some(Part::Encryption) {
        durable_part(&o, &subject, &out_dir, &mut doc)?;
    }
    if o.only == Some(Part::Tls) {
        tls_part::tls_part(&o, &subject, &out_dir, &mut doc)?;
    } else if o.only.is_none() {
        // In the full run a missing TLS piece (openssl, memcached -Z) costs only this part.
        if let Err(e) = tls_part::tls_part(&o, &subject, &out_dir, &mut doc) {
            doc.note(format!("TLS part failed: {e:#}"));
        }
    }
    if wants(Part::Udp) {
        udp::udp_part(&o, &subject, &mut doc)?;
    }
    if o.only == Some(Part::Cores) {
        cores::cores_part(&o, &subject, &mut doc)?;
    }
    if o.only == Some(Part::Metrics) {
        metrics_part::metrics_part(&o, &subject, &mut doc)?;
    }
    icount_step(&o, &subject, &out_dir, &mut doc)?;
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
    if !doc.failures.is_empty() {
        anyhow::bail!("{}", doc.failures.join("; "));
    }
    Ok(())
}
