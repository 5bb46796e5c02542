//! `--only durable`: SET throughput and p99 of `ringstore serve --data PATH` (group commit)
//! beside RAM-only ringstore in the same alternating run, with the data file on the real disk
//! and on tmpfs; and the time to the ready line after `kill -9` and after SIGTERM with 1M
//! objects on the device.

use super::client::{self, LoadResult, LoadSpec, Mode};
use super::fill;
use super::mcwire::Op;
use super::procs::{self, Pinned};
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Concurrent clients of the throughput cells (one request in flight each).
pub const CONNS: usize = 64;
pub const VALUE_LEN: usize = 100;
/// Distinct keys the SET cells overwrite.
pub const KEYSPACE: usize = 10_000;
/// Objects on the device for the recovery measurement.
pub const RECOVERY_OBJECTS: usize = 1_000_000;
/// Connections that fill the recovery device in parallel (so group commit has company).
const FILL_CONNS: usize = 8;
/// Sparse data files: only written blocks take space, on disk and on tmpfs alike.
const DATA_FILE_BYTES: u64 = 2 << 30;
/// Longest measured load per server.
pub const LOAD_MAX: Duration = Duration::from_secs(10);
/// RAM budget of every server here: 1M objects of 100 B must stay resident.
const MEMORY_MIB: u64 = 1024;
/// Bound on a start (recovery included) and on a SIGTERM shutdown (checkpoint included).
const START_LIMIT: Duration = Duration::from_secs(120);
/// Stderr lines kept per server (they are few; the limit keeps a chatty failure bounded).
const STDERR_LINES: usize = 200;

/// A sparse file of `DATA_FILE_BYTES` for `--data`, removed when dropped.
pub struct DataFile {
    pub path: PathBuf,
}

impl DataFile {
    pub fn create(path: PathBuf) -> Result<DataFile> {
        let _ = std::fs::remove_file(&path);
        let file =
            std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?;
        file.set_len(DATA_FILE_BYTES)
            .with_context(|| format!("sizing {}", path.display()))?;
        Ok(DataFile { path })
    }

    /// Drops the file's clean pages from the page cache, so the next start reads the device
    /// (as after a reboot). Everything acknowledged was fdatasync'ed, so every page is clean.
    pub fn evict_page_cache(&self) -> Result<()> {
        let file = std::fs::File::open(&self.path)?;
        file.sync_all()?;
        // Offset 0 and no length name the whole file; the call only drops cached pages.
        rustix::fs::fadvise(&file, 0, None, rustix::fs::Advice::DontNeed)
            .map_err(std::io::Error::from)
            .with_context(|| format!("posix_fadvise on {}", self.path.display()))?;
        Ok(())
    }
}

impl Drop for DataFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The filesystem type of the directory holding `path`, from statfs(2).
pub fn filesystem_name(path: &Path) -> String {
    let dir = path.parent().unwrap_or(path);
    let Ok(st) = rustix::fs::statfs(dir) else {
        return "unknown".into();
    };
    match st.f_type {
        0xEF53 => "ext4".into(),
        0x0102_1994 => "tmpfs".into(),
        0x5846_5342 => "xfs".into(),
        0x9123_683E => "btrfs".into(),
        0x794C_7630 => "overlayfs".into(),
        other => format!("fs type {other:#x}"),
    }
}

/// One server of the throughput cell.
pub struct Config {
    pub label: &'static str,
    pub server: Pinned,
    /// Keeps the data file until the server is gone (fields drop in order).
    pub data: Option<DataFile>,
}

/// Starts ringstore with `--data` on a fresh sparse file at `path`, and with `--data-key`
/// (ADR 0050: every record sealed) when `key` names a key file.
pub fn start_durable(
    binary: &Path,
    label: &'static str,
    path: PathBuf,
    key: Option<&Path>,
) -> Result<Config> {
    let data = DataFile::create(path)?;
    let path_text = data.path.to_string_lossy().into_owned();
    let mut args = vec!["--data".to_string(), path_text];
    if let Some(key) = key {
        args.extend(["--data-key".to_string(), key.to_string_lossy().into_owned()]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let server = procs::start_ringstore_with(binary, MEMORY_MIB, &args)?;
    Ok(Config {
        label,
        server,
        data: Some(data),
    })
}

pub fn start_ram_only(binary: &Path) -> Result<Config> {
    Ok(Config {
        label: "RAM only",
        server: procs::start_ringstore(binary, MEMORY_MIB)?,
        data: None,
    })
}

/// SET of `value_len` bytes, depth 1, `CONNS` connections against every config in
/// alternating slices.
pub fn measure_sets(
    configs: &[&Config],
    value_len: usize,
    seconds: u64,
    warmup: Duration,
) -> Result<Vec<LoadResult>> {
    let measure = Duration::from_secs(seconds).min(LOAD_MAX);
    let specs: Vec<LoadSpec> = configs
        .iter()
        .map(|c| LoadSpec {
            port: c.server.port,
            mode: Mode::Memcache {
                op: Op::Set,
                value_len,
            },
            depth: 1,
            conns: CONNS,
            keyspace: KEYSPACE,
            warmup,
            measure,
            slices: measure.as_secs().clamp(1, 10) as u32,
            server_pid: c.server.pid(),
        })
        .collect();
    client::run(&specs)
}

/// A ringstore on loopback whose stderr (recovery times) is kept, so it can be sent SIGTERM
/// and its start read; killed and reaped on drop.
struct Direct {
    server: crate::util::Server,
    port: u16,
}

impl std::ops::Deref for Direct {
    type Target = crate::util::Server;
    fn deref(&self) -> &crate::util::Server {
        &self.server
    }
}

impl std::ops::DerefMut for Direct {
    fn deref_mut(&mut self) -> &mut crate::util::Server {
        &mut self.server
    }
}

/// One start of a server on an existing device.
#[derive(Clone, Debug, Default)]
pub struct Start {
    /// From spawn to the ready line.
    pub ready_seconds: f64,
    /// The recovery step's own time (checkpoint or scan), from its stderr line.
    pub recover_ms: Option<u64>,
    /// Loading every live value into RAM, from its stderr line.
    pub load_ms: Option<u64>,
    pub from_checkpoint: bool,
    pub objects: u64,
}

/// What the recovery measurement found.
#[derive(Clone, Debug, Default)]
pub struct Recovery {
    pub fill_seconds: f64,
    pub after_kill: Start,
    /// From SIGTERM to exit (the checkpoint is written in there).
    pub shutdown_seconds: f64,
    pub after_term: Start,
}

fn spawn_direct(binary: &Path, data: &Path) -> Result<(Direct, f64)> {
    let memory = format!("{MEMORY_MIB}MiB");
    let data = data.to_string_lossy();
    let server = crate::util::Server::start_keeping_stderr(
        binary,
        &["--cores", "1", "--memory", &memory, "--data", &data],
        STDERR_LINES,
        START_LIMIT,
    )?;
    let port = server.memcache_host_port()?.1;
    let ready_seconds = server.ready_after.as_secs_f64();
    Ok((Direct { server, port }, ready_seconds))
}

/// The first `in N ms` of a line.
pub fn millis_after_in(line: &str) -> Option<u64> {
    let words: Vec<&str> = line.split_whitespace().collect();
    words
        .windows(3)
        .find(|w| w[0] == "in" && w[2].starts_with("ms"))
        .and_then(|w| w[1].parse().ok())
}

/// Reads a start's stderr lines: the recovery line and the RAM load line.
fn parse_start(lines: &[String], ready_seconds: f64) -> Start {
    let mut start = Start {
        ready_seconds,
        ..Start::default()
    };
    for line in lines {
        if line.contains(": recovered ") {
            start.recover_ms = millis_after_in(line);
            start.from_checkpoint = line.contains("checkpoint");
        } else if let Some(rest) = line.split("data device: loaded ").nth(1) {
            start.load_ms = millis_after_in(line);
            start.objects = rest
                .split_whitespace()
                .next()
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
        }
    }
    start
}

/// Starts on `data`, checks that all `RECOVERY_OBJECTS` came back, and reads the start times.
fn restart_and_check(binary: &Path, data: &DataFile) -> Result<(Direct, Start)> {
    data.evict_page_cache()?;
    let (server, ready) = spawn_direct(binary, &data.path)?;
    // The RAM-load line comes before the ready line; give the stderr reader a moment.
    std::thread::sleep(Duration::from_millis(100));
    let lines = server.stderr_lines();
    let start = parse_start(&lines, ready);
    let items = fill::stat_u64(server.port, "curr_items")?;
    if items != RECOVERY_OBJECTS as u64 {
        bail!("{items} objects resident after the restart, expected {RECOVERY_OBJECTS}; stderr: {lines:?}");
    }
    for index in [0, RECOVERY_OBJECTS - 1] {
        if !fill::check_hit(server.port, VALUE_LEN, index)? {
            bail!("key {index} missing after the restart");
        }
    }
    Ok((server, start))
}

/// Fills `RECOVERY_OBJECTS` with `--data` on `data`, kill -9, restart (timed), SIGTERM
/// (timed: the checkpoint), restart (timed).
pub fn measure_recovery(binary: &Path, data: &DataFile) -> Result<Recovery> {
    let mut out = Recovery::default();
    let (server, _) = spawn_direct(binary, &data.path)?;
    eprintln!("bench: durable: filling {RECOVERY_OBJECTS} objects of {VALUE_LEN} B on {FILL_CONNS} connections");
    let started = Instant::now();
    let per_conn = RECOVERY_OBJECTS.div_ceil(FILL_CONNS);
    let port = server.port;
    std::thread::scope(|scope| {
        let fills: Vec<_> = (0..FILL_CONNS)
            .map(|i| {
                let first = i * per_conn;
                let count = per_conn.min(RECOVERY_OBJECTS.saturating_sub(first));
                scope.spawn(move || fill::preload_range(port, VALUE_LEN, first, count))
            })
            .collect();
        fills.into_iter().try_for_each(|f| {
            f.join()
                .map_err(|_| anyhow::anyhow!("fill thread panicked"))?
        })
    })?;
    out.fill_seconds = started.elapsed().as_secs_f64();
    let items = fill::stat_u64(port, "curr_items")?;
    if items != RECOVERY_OBJECTS as u64 {
        bail!("{items} objects after filling {RECOVERY_OBJECTS}");
    }
    drop(server); // SIGKILL and reap
    eprintln!("bench: durable: killed with SIGKILL; restarting");
    let (mut server, after_kill) = restart_and_check(binary, data)?;
    out.after_kill = after_kill;
    let term = Instant::now();
    // Our own child, not yet reaped (still owned).
    ringstore_sys::kill(server.child.id(), libc::SIGTERM).context("SIGTERM")?;
    loop {
        if let Some(status) = server.child.try_wait()? {
            if !status.success() {
                bail!("SIGTERM shutdown exited with {status}");
            }
            break;
        }
        if term.elapsed() > START_LIMIT {
            bail!("no exit within {} s of SIGTERM", START_LIMIT.as_secs());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    out.shutdown_seconds = term.elapsed().as_secs_f64();
    drop(server);
    eprintln!("bench: durable: stopped with SIGTERM; restarting");
    let (server, after_term) = restart_and_check(binary, data)?;
    out.after_term = after_term;
    if !out.after_term.from_checkpoint {
        eprintln!("bench: durable: the start after SIGTERM did not report a checkpoint");
    }
    drop(server);
    Ok(out)
}

/// Writes a random 32-byte data key, mode 0600, at `path` (for the `--data-key` cell).
pub fn write_data_key(path: &Path) -> Result<()> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut key = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut key)?;
    let _ = std::fs::remove_file(path);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    std::io::Write::write_all(&mut f, &key)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_recovery_lines() {
        let lines = vec![
            "ringstore: data device /x: recovered by scanning the logs: 1000000 objects, 1000000 records scanned, 1 regions x 256 segments of 8192 KiB, 0 compactions, in 539 ms".to_string(),
            "ringstore: data device: loaded 1000000 objects into RAM in 1060 ms (1000000 resident, 0 refused, 0 unreadable); misses read through".to_string(),
        ];
        let s = parse_start(&lines, 1.75);
        assert_eq!(s.recover_ms, Some(539));
        assert_eq!(s.load_ms, Some(1060));
        assert_eq!(s.objects, 1_000_000);
        assert!(!s.from_checkpoint);
        assert_eq!(s.ready_seconds, 1.75);
        let s = parse_start(&["ringstore: data device /x: recovered from the shutdown checkpoint: 5 objects, in 12 ms".into()], 0.1);
        assert!(s.from_checkpoint);
        assert_eq!(s.recover_ms, Some(12));
        assert_eq!(s.load_ms, None);
        assert_eq!(millis_after_in("no timing here"), None);
    }

    #[test]
    fn data_file_is_sparse_and_removed_on_drop() {
        let path =
            std::env::temp_dir().join(format!("ringstore-bench-test-{}.data", std::process::id()));
        {
            let f = DataFile::create(path.clone()).unwrap();
            assert_eq!(std::fs::metadata(&f.path).unwrap().len(), DATA_FILE_BYTES);
            f.evict_page_cache().unwrap();
        }
        assert!(!path.exists());
        if Path::new("/dev/shm").is_dir() {
            assert_eq!(filesystem_name(Path::new("/dev/shm/x")), "tmpfs");
        }
    }
}
