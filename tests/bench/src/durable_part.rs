//! The durable part: `--data` SET throughput on disk and tmpfs against RAM only, then the time to
//! recover 1M objects after kill -9 and after SIGTERM, then SET against Redis `appendfsync
//! always` and the disk's flush bound (redis.rs).

use super::client::LoadResult;
use super::doc::{mark, Doc};
use super::options::{Options, Part};
use super::subject::Subject;
use super::{durable, report, WARMUP};
use anyhow::{Context, Result};
use std::fmt::Write as _;
use std::path::Path;

/// `--data` SET throughput on disk and tmpfs against RAM only, then recovery of 1M objects.
pub(super) fn durable_part(
    o: &Options,
    subject: &Subject,
    out_dir: &Path,
    doc: &mut Doc,
) -> Result<()> {
    let Subject::Ringstore(binary) = subject else {
        doc.note("durable: skipped under --self-check (memcached has no data device)".into());
        return Ok(());
    };
    if o.only == Some(Part::Encryption) {
        return encryption_part(o, binary, out_dir, doc);
    }
    let mut configs = start_configs(binary, out_dir, doc)?;
    let mut section = set_section(o, &mut configs, doc)?;
    drop(configs);
    recovery_section(binary, out_dir, doc, &mut section)?;
    doc.sections.push(section);
    if let Err(e) = super::redis::redis_section(o, binary, out_dir, doc) {
        doc.note(format!("durable vs Redis: failed: {e:#}"));
    }
    Ok(())
}

/// `--only encryption`: issue 39's cell alone (the disk with and without `--data-key`), so
/// its medians of three cost a minute, not three runs of the whole durable part.
fn encryption_part(o: &Options, binary: &Path, out_dir: &Path, doc: &mut Doc) -> Result<()> {
    let configs = start_configs(binary, out_dir, doc)?;
    let seconds = o.seconds.min(durable::LOAD_MAX.as_secs());
    let mut section = "## Durable SET with and without `--data-key`\n".to_string();
    sealed_section(&configs, seconds, doc, &mut section)?;
    doc.sections.push(section);
    Ok(())
}

const DISK_LABEL: &str = "--data on disk";
const SEALED_LABEL: &str = "--data on disk, --data-key";

/// RAM only, `--data` on disk, and `--data` on tmpfs when /dev/shm is one; a configuration
/// that does not start is a note.
fn start_configs(binary: &Path, out_dir: &Path, doc: &mut Doc) -> Result<Vec<durable::Config>> {
    let disk_path = out_dir.join("durable-disk.data");
    let shm = Path::new("/dev/shm");
    let tmpfs_path = shm.join(format!("ringstore-bench-{}.data", std::process::id()));
    let mut configs = vec![durable::start_ram_only(binary).context("durable: RAM-only ringstore")?];
    let tmpfs_fs = durable::filesystem_name(&tmpfs_path);
    let disk_label = DISK_LABEL;
    let tmpfs_label = "--data on tmpfs";
    match durable::start_durable(binary, disk_label, disk_path, None) {
        Ok(c) => configs.push(c),
        Err(e) => doc.note(format!("durable: {disk_label} did not start: {e:#}")),
    }
    // The same disk with every record sealed (AES-256-GCM, ADR 0050): encryption on vs off.
    let sealed_label = SEALED_LABEL;
    let key = out_dir.join("durable-bench.key");
    let sealed = durable::write_data_key(&key).and_then(|()| {
        durable::start_durable(
            binary,
            sealed_label,
            out_dir.join("durable-sealed.data"),
            Some(&key),
        )
    });
    match sealed {
        Ok(c) => configs.push(c),
        Err(e) => doc.note(format!("durable: {sealed_label} did not start: {e:#}")),
    }
    if tmpfs_fs == "tmpfs" {
        match durable::start_durable(binary, tmpfs_label, tmpfs_path, None) {
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
    Ok(configs)
}

/// Measures SET on every configuration in alternating slices; the section with its table.
fn set_section(o: &Options, configs: &mut [durable::Config], doc: &mut Doc) -> Result<String> {
    let seconds = o.seconds.min(durable::LOAD_MAX.as_secs());
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
    let all: Vec<&durable::Config> = configs.iter().collect();
    let results = durable::measure_sets(&all, durable::VALUE_LEN, seconds, WARMUP)?;
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
    sealed_section(configs, seconds, doc, &mut section)?;
    Ok(section)
}

/// Issue 39's cell: durable SET 4 KiB with `--data-key` against the same disk without, per
/// server CPU-second, in alternating slices (a missing configuration is a note).
fn sealed_section(
    configs: &[durable::Config],
    seconds: u64,
    doc: &mut Doc,
    section: &mut String,
) -> Result<()> {
    const LEN: usize = 4096;
    let (Some(plain), Some(sealed)) = (
        configs.iter().find(|c| c.label == DISK_LABEL),
        configs.iter().find(|c| c.label == SEALED_LABEL),
    ) else {
        doc.note("durable: the encryption cell needs both disk configurations".into());
        return Ok(());
    };
    let r = durable::measure_sets(&[plain, sealed], LEN, seconds, WARMUP)?;
    let per_cpu = |r: &LoadResult| 1.0 / r.server_cpu_per_million().max(f64::MIN_POSITIVE);
    let ratio = per_cpu(&r[1]) / per_cpu(&r[0]);
    let _ = writeln!(
        section,
        "\n### Encryption at rest: SET {LEN} B, depth 1, {} connections, `{SEALED_LABEL}` ÷ `{DISK_LABEL}`\n\n| metric | {DISK_LABEL} | {SEALED_LABEL} | ratio |\n| --- | ---: | ---: | ---: |\n| SET/s | {} | {} | {:.2}× |\n| server CPU s / M req | {:.2} | {:.2} | {:.2}× |\n| SETs per server CPU-s | {:.0} | {:.0} | {ratio:.2}× |",
        durable::CONNS,
        report::format_number(r[0].throughput(), 0),
        report::format_number(r[1].throughput(), 0),
        r[1].throughput() / r[0].throughput(),
        r[0].server_cpu_per_million(),
        r[1].server_cpu_per_million(),
        r[1].server_cpu_per_million() / r[0].server_cpu_per_million(),
        per_cpu(&r[0]) * 1e6,
        per_cpu(&r[1]) * 1e6,
    );
    doc.targets.push(format!(
        "durable SET {LEN} B with --data-key: {ratio:.2}× the SETs per server CPU-s without (aim ≥ 0.9×) {}",
        mark(ratio >= 0.9)
    ));
    Ok(())
}

/// Recovery of [`durable::RECOVERY_OBJECTS`] after kill -9 and after SIGTERM, appended to
/// `section` (a failure is a note).
fn recovery_section(
    binary: &Path,
    out_dir: &Path,
    doc: &mut Doc,
    section: &mut String,
) -> Result<()> {
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
    Ok(())
}
