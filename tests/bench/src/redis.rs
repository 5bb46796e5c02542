//! The durable SET cell against its real peer and its real bound (issue 24): ringstore
//! `--data` beside Redis 7 with `appendonly yes` + `appendfsync always`, both writing to the
//! same filesystem, 64 clients at depth 1 and 8, SET 100 B and 4 KiB, in alternating slices;
//! and the disk's own bound measured in the same run: the median latency of a 4 KiB write +
//! fdatasync there, so `clients × depth ÷ latency` is what waiting for the flush allows.

use super::client::{self, LoadResult, LoadSpec, Mode};
use super::doc::{mark, Doc};
use super::durable::{self, DataFile};
use super::mcwire::Op;
use super::options::Options;
use super::{procs, report, WARMUP};
use anyhow::{Context, Result};
use std::fmt::Write as _;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// (value bytes, requests in flight per connection) of the cells.
const CELLS: [(usize, usize); 4] = [(100, 1), (4096, 1), (100, 8), (4096, 8)];
/// The probe's writes: 4 KiB each, over a preallocated 4 MiB so no write allocates blocks.
const PROBE_WRITE: usize = 4096;
const PROBE_FILE: u64 = 4 << 20;
/// At most this many probe writes, and at most this long.
const PROBE_COUNT: usize = 400;
const PROBE_LIMIT: Duration = Duration::from_secs(2);

/// Median and p99 (µs) of a 4 KiB `pwrite` + `fdatasync` to a preallocated file in `dir`.
pub fn flush_latency(dir: &Path) -> Result<(f64, f64, usize)> {
    let path = dir.join("disk-bound.probe");
    let file =
        std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?;
    let zeros = vec![0u8; usize::try_from(PROBE_FILE)?];
    file.write_all_at(&zeros, 0)?;
    file.sync_all()?;
    let block = vec![0x5Au8; PROBE_WRITE];
    let blocks = PROBE_FILE / PROBE_WRITE as u64;
    let mut took = Vec::with_capacity(PROBE_COUNT);
    let started = Instant::now();
    for i in 0..PROBE_COUNT as u64 {
        let t = Instant::now();
        file.write_all_at(&block, (i % blocks) * PROBE_WRITE as u64)?;
        file.sync_data()?;
        took.push(t.elapsed().as_secs_f64() * 1e6);
        if started.elapsed() > PROBE_LIMIT {
            break;
        }
    }
    drop(file);
    let _ = std::fs::remove_file(&path);
    took.sort_by(f64::total_cmp);
    let at = |percent: usize| took[(took.len() - 1) * percent / 100];
    Ok((at(50), at(99), took.len()))
}

fn spec(port: u16, pid: u32, op: Op, value_len: usize, depth: usize, seconds: u64) -> LoadSpec {
    let measure = Duration::from_secs(seconds);
    LoadSpec {
        port,
        mode: Mode::Memcache { op, value_len },
        depth,
        conns: durable::CONNS,
        keyspace: durable::KEYSPACE,
        warmup: WARMUP,
        measure,
        slices: measure.as_secs().clamp(1, 10) as u32,
        server_pid: pid,
    }
}

fn per_cpu_second(r: &LoadResult) -> f64 {
    r.requests as f64 / r.server_cpu_seconds.max(1e-9)
}

/// The disk's flush latency around one cell: probes just before and just after it, because the
/// shared virtio disk's latency moves by 20× within minutes and one probe before all cells
/// judged later cells against a different disk.
struct Around {
    before: f64,
    after: f64,
}

impl Around {
    /// The latency the cell ran against: the mean of the two medians around it.
    fn latency_us(&self) -> f64 {
        (self.before + self.after) / 2.0
    }
}

/// The section: ringstore `--data` vs Redis `appendfsync always` and both against the bound.
pub(super) fn redis_section(
    o: &Options,
    binary: &Path,
    out_dir: &Path,
    doc: &mut Doc,
) -> Result<()> {
    if !crate::util::have("redis-server") {
        doc.note("durable vs Redis: skipped: redis-server is not installed (apt install redis-server; `cargo xtask bench` installs it as root)".into());
        return Ok(());
    }
    let seconds = o.seconds.min(durable::LOAD_MAX.as_secs());
    let aof_dir = out_dir.join("redis-aof");
    let _ = std::fs::remove_dir_all(&aof_dir);
    std::fs::create_dir_all(&aof_dir)?;
    let (first, p99, probes) = flush_latency(out_dir)?;
    let fs = durable::filesystem_name(&aof_dir.join("x"));
    let data = DataFile::create(out_dir.join("durable-redis-cell.data"))?;
    let data_text = data.path.to_string_lossy().into_owned();
    let mut ringstore = procs::start_ringstore_with(binary, 1024, &["--data", &data_text])?;
    let mut redis = procs::start_redis(&aof_dir)?;
    doc.command(&format!("{} (data file on {fs})", ringstore.command));
    doc.command(&format!(
        "{} (AOF in target/bench/redis-aof, on {fs}; removed afterwards)",
        redis.command
    ));
    doc.command(&format!("disk bound: before every cell and after the last, up to {PROBE_COUNT} (at most {} s) × (pwrite 4 KiB into a preallocated 4 MiB file + fdatasync) in target/bench ({fs}), one after another; the first probe took {probes} writes, median {first:.0} µs, p99 {p99:.0} µs", PROBE_LIMIT.as_secs()));
    let mut section = format!("## Durable SET against Redis 7 (`appendfsync always`) and the disk's bound ({} clients, one server core each, both on {fs})\n\nDisk bound: 4 KiB write + fdatasync on that filesystem, probed just before and just after each cell (median µs of each probe in the table); bound = clients × depth ÷ the mean of the two.\n\n", durable::CONNS);
    section.push_str("| cell | ringstore SET/s | Redis SET/s | × Redis | ringstore SET / CPU-s | Redis SET / CPU-s | × Redis | flush µs before / after | bound SET/s | ringstore ÷ bound | Redis ÷ bound |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    let mut before = first;
    for (value_len, depth) in CELLS {
        eprintln!(
            "bench: durable vs Redis: SET {value_len} B, depth {depth}, {} clients",
            durable::CONNS
        );
        let specs = [
            spec(
                ringstore.port,
                ringstore.pid(),
                Op::Set,
                value_len,
                depth,
                seconds,
            ),
            spec(
                redis.port,
                redis.pid(),
                Op::RespSet,
                value_len,
                depth,
                seconds,
            ),
        ];
        let results = client::run(&specs)?;
        ringstore.check_alive()?;
        redis.check_alive()?;
        let (after, _, _) = flush_latency(out_dir)?;
        let around = Around { before, after };
        before = after;
        row(
            &mut section,
            doc,
            (value_len, depth),
            (&results[0], &results[1]),
            &around,
        );
    }
    drop((ringstore, redis, data));
    let _ = std::fs::remove_dir_all(&aof_dir);
    doc.command(&format!("durable vs Redis cells: load generator (RESP SET for Redis, memcache set for ringstore), {} connections per server, {} keys, {} s warm-up, {seconds} s measured per server in alternating slices", durable::CONNS, durable::KEYSPACE, WARMUP.as_secs()));
    doc.sections.push(section);
    Ok(())
}

/// One cell's row and its targets: ringstore `r` beside Redis `s`, both against the bound.
fn row(
    section: &mut String,
    doc: &mut Doc,
    (value_len, depth): (usize, usize),
    (r, s): (&LoadResult, &LoadResult),
    around: &Around,
) {
    for (who, x) in [("ringstore", r), ("Redis", s)] {
        if x.misses + x.errors > 0 {
            doc.note(format!(
                "durable vs Redis, {who} SET {value_len} B depth {depth}: {} errors",
                x.misses + x.errors
            ));
        }
    }
    let bound = (durable::CONNS * depth) as f64 / (around.latency_us() / 1e6);
    let cell = super::cells::cell_name(Op::Set, value_len, depth);
    let (x_tput, x_cpu) = (
        r.throughput() / s.throughput(),
        per_cpu_second(r) / per_cpu_second(s),
    );
    let _ = writeln!(
        section,
        "| {cell} | {} | {} | {x_tput:.2}× | {} | {} | {x_cpu:.2}× | {:.0} / {:.0} | {} | {:.2} | {:.2} |",
        report::format_number(r.throughput(), 0),
        report::format_number(s.throughput(), 0),
        report::format_number(per_cpu_second(r), 0),
        report::format_number(per_cpu_second(s), 0),
        around.before,
        around.after,
        report::format_number(bound, 0),
        r.throughput() / bound,
        s.throughput() / bound,
    );
    doc.targets.push(format!("durable {cell} vs Redis appendfsync always: {x_tput:.2}× SET/s (aim ≥ 2×) {}, {x_cpu:.2}× per server CPU-second (aim ≥ 1.5×) {}", mark(x_tput >= 2.0), mark(x_cpu >= 1.5)));
    if depth == 1 {
        let of_bound = r.throughput() / bound;
        doc.targets.push(format!("durable {cell}: {of_bound:.2} of the disk's bound (clients ÷ flush latency around the cell; aim ≥ 0.9) {}", mark(of_bound >= 0.9)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bound_uses_the_latency_on_both_sides_of_the_cell() {
        let around = Around {
            before: 200.0,
            after: 4000.0,
        };
        assert!((around.latency_us() - 2100.0).abs() < 1e-9);
    }

    #[test]
    fn the_flush_probe_measures_and_cleans_up() {
        let dir = std::env::temp_dir().join(format!("ringstore-probe-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (median, p99, n) = flush_latency(&dir).unwrap();
        assert!(n > 0 && median > 0.0 && p99 >= median, "{median} {p99} {n}");
        assert!(!dir.join("disk-bound.probe").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
