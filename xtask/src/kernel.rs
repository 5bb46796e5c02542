//! The appliance kernel: Debian's linux-source-6.12 configured from `kernel-config/*.config`
//! and built by `kernel-config/build-kernel.sh`. The bzImage is cached under
//! `~/.cache/ringstore/kernel/<hash>/` (see [`cache_dir`]), where the hash covers the fragments, the source package
//! version and the build script, so an unchanged kernel costs nothing on the next `image`.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};

use crate::util::{exec, is_root, root};

/// The Debian package holding the kernel source tarball.
/// apt-get waiting up to ten minutes for another apt or dpkg run (an unattended upgrade, a
/// second job on the machine) to let go of its locks, instead of failing at once. Here, not
/// in deps.rs, because deps already imports this module.
pub const APT_GET: &str = "apt-get -o DPkg::Lock::Timeout=600";

pub const SOURCE_PACKAGE: &str = "linux-source-6.12";
/// Packages the build needs besides the source.
const BUILD_PACKAGES: &[&str] = &["bc", "flex", "bison", "libelf-dev", "libssl-dev"];
/// Lines of build output kept for the error message when the build fails.
const TAIL_LINES: usize = 40;
/// Lines a full build prints when no earlier build's log says otherwise (6.12, our fragments).
const EXPECTED_LINES: u64 = 2500;

/// A built kernel.
#[derive(Debug, Clone)]
pub struct Kernel {
    pub bzimage: PathBuf,
    /// `linux-source-6.12 <package version> <kernel release>` as the build recorded it.
    pub version: String,
}

/// The installed version of the kernel source package, installing it (as root) when missing.
pub fn source_version() -> Result<String> {
    if let Some(version) = dpkg_version(SOURCE_PACKAGE) {
        return Ok(version);
    }
    let install = format!(
        "{} install -y {SOURCE_PACKAGE} {}",
        APT_GET,
        BUILD_PACKAGES.join(" ")
    );
    if !is_root() {
        bail!("{SOURCE_PACKAGE} is not installed; as root run: {install}");
    }
    exec(Command::new("sh").args(["-c", &format!("DEBIAN_FRONTEND=noninteractive {install}")]))?;
    dpkg_version(SOURCE_PACKAGE)
        .with_context(|| format!("{SOURCE_PACKAGE} still not installed after apt-get"))
}

fn dpkg_version(package: &str) -> Option<String> {
    let out = Command::new("dpkg-query")
        .args(["-W", "-f", "${Status} ${Version}", package])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let version = text.strip_prefix("install ok installed ")?.trim();
    (out.status.success() && !version.is_empty()).then(|| version.to_string())
}

/// The fragments, sorted by name (the order merge_config.sh applies them in).
pub fn fragments(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "config"))
        .collect();
    found.sort();
    if found.is_empty() {
        bail!("no *.config fragments in {}", dir.display());
    }
    Ok(found)
}

/// The cache key: every fragment's name and bytes, the source version and the build script.
pub fn cache_key(fragments: &[(String, Vec<u8>)], source_version: &str, script: &[u8]) -> String {
    let mut hash = Sha256::new();
    let mut field = |bytes: &[u8]| {
        hash.update((bytes.len() as u64).to_le_bytes());
        hash.update(bytes);
    };
    field(source_version.as_bytes());
    field(script);
    for (name, bytes) in fragments {
        field(name.as_bytes());
        field(bytes);
    }
    hash.finalize()
        .iter()
        .take(12)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Where built kernels are kept: `$RINGSTORE_CACHE_DIR/kernel`, else `~/.cache/ringstore/kernel`.
///
/// Outside the work tree on purpose: entries are addressed by the hash of every input, so a
/// fresh clone on the same machine (CI) reuses a kernel built from identical inputs.
fn cache_dir() -> PathBuf {
    let base = std::env::var_os("RINGSTORE_CACHE_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/ringstore")))
        .unwrap_or_else(|| root().join("target/cache"));
    base.join("kernel")
}

/// Builds (or finds in the cache) the appliance bzImage.
pub fn build_kernel() -> Result<Kernel> {
    let config_dir = root().join("kernel-config");
    let script = config_dir.join("build-kernel.sh");
    let version = source_version()?;
    let fragments = fragments(&config_dir)?;
    let mut named = Vec::new();
    for path in &fragments {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        named.push((
            name,
            std::fs::read(path).with_context(|| format!("reading {}", path.display()))?,
        ));
    }
    let key = cache_key(
        &named,
        &version,
        &std::fs::read(&script).with_context(|| format!("reading {}", script.display()))?,
    );
    let appliance = root().join("target/appliance");
    let cache = cache_dir();
    let out = cache.join(&key);
    let bzimage = out.join("bzImage");
    // Held until this function returns: a second job (a helper's worktree beside a CI clone)
    // waits here instead of building into the same `OUT.build` and breaking both builds.
    let _lock = lock_entry(&cache, &key)?;
    if bzimage.exists() {
        let version = std::fs::read_to_string(out.join("version"))
            .unwrap_or_default()
            .trim()
            .to_string();
        eprintln!("kernel: cached {} ({version})", bzimage.display());
        return Ok(Kernel { bzimage, version });
    }
    eprintln!(
        "kernel: building {SOURCE_PACKAGE} {version} into {} (about 7 minutes on 2 cores)",
        out.display()
    );
    let mut cmd = Command::new("sh");
    cmd.arg(&script)
        .arg(&out)
        .arg(appliance.join("kernel-src"))
        .args(&fragments);
    let expected = expected_lines(&cache, &key);
    run_with_progress(cmd, &cache.join(format!("{key}.log")), expected)?;
    let version = std::fs::read_to_string(out.join("version"))
        .unwrap_or_default()
        .trim()
        .to_string();
    Ok(Kernel { bzimage, version })
}

/// Takes the cache entry `key`'s build lock (an exclusive `flock` on `CACHE/KEY.lock`), saying
/// so when another job holds it; the lock goes with the returned file.
fn lock_entry(cache: &Path, key: &str) -> Result<std::fs::File> {
    use rustix::fs::{flock, FlockOperation};
    std::fs::create_dir_all(cache).with_context(|| format!("creating {}", cache.display()))?;
    let path = cache.join(format!("{key}.lock"));
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    if flock(&file, FlockOperation::NonBlockingLockExclusive).is_err() {
        eprintln!(
            "kernel: another job is building this kernel; waiting for it ({})",
            path.display()
        );
        flock(&file, FlockOperation::LockExclusive)
            .with_context(|| format!("locking {}", path.display()))?;
    }
    Ok(file)
}

/// How many lines this build will print: the most recent finished build's log in the cache
/// (builds differ by a few fragments, so their line counts are close), else [`EXPECTED_LINES`].
fn expected_lines(cache: &Path, key: &str) -> u64 {
    let newest = std::fs::read_dir(cache)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.ends_with(".log") && name != format!("{key}.log")
                // finished: its kernel is there
                && cache.join(name.trim_end_matches(".log")).join("bzImage").exists()
        })
        .max_by_key(|e| e.metadata().and_then(|m| m.modified()).ok());
    newest
        .and_then(|e| std::fs::read_to_string(e.path()).ok())
        .map(|text| text.lines().count() as u64)
        .filter(|n| *n > 100)
        .unwrap_or(EXPECTED_LINES)
}

/// Progress as a percentage of the expected lines with an estimate of the time left, from the
/// rate since the compile started.
#[derive(Debug)]
struct Progress {
    expected: u64,
    started: std::time::Instant,
    last_percent: u64,
    last_report: std::time::Instant,
}

impl Progress {
    fn new(expected: u64) -> Progress {
        let now = std::time::Instant::now();
        Progress {
            expected: expected.max(1),
            started: now,
            last_percent: 0,
            last_report: now,
        }
    }

    /// The line to print after `done` lines at `elapsed`, when a 5% step or 30 s have passed.
    fn report(&mut self, done: u64, now: std::time::Instant) -> Option<String> {
        let percent = (done * 100 / self.expected).min(99);
        if percent < self.last_percent + 5 && now.duration_since(self.last_report).as_secs() < 30 {
            return None;
        }
        self.last_percent = percent;
        self.last_report = now;
        Some(format_progress(
            done,
            self.expected,
            now.duration_since(self.started),
        ))
    }
}

/// `kernel: 40% (1000/2500 lines), about 6 min 0 s left`.
#[expect(
    clippy::cast_possible_truncation,
    reason = "a float-to-int cast saturates: seconds left, for a progress line"
)]
fn format_progress(done: u64, expected: u64, elapsed: std::time::Duration) -> String {
    let percent = (done * 100 / expected.max(1)).min(99);
    let left = if done == 0 {
        "time left unknown".to_string()
    } else {
        let secs = elapsed.as_secs_f64() * expected.saturating_sub(done) as f64 / done as f64;
        let secs = secs.round() as u64;
        format!("about {} min {} s left", secs / 60, secs % 60)
    };
    format!("kernel: {percent}% ({done}/{expected} lines), {left}")
}

/// Runs the build, printing its own lines and the progress of make's (percentage and time left,
/// [`Progress`]); the full output goes to `log`, the tail into the error.
fn run_with_progress(mut cmd: Command, log: &Path, expected: u64) -> Result<()> {
    if let Some(dir) = log.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let mut log_file =
        std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting build-kernel.sh")?;
    let stderr = child.stderr.take().context("stderr")?;
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let tx_err = tx.clone();
    let err_thread = std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx_err.send(line);
        }
    });
    let stdout = child.stdout.take().context("stdout")?;
    let out_thread = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut tail = std::collections::VecDeque::with_capacity(TAIL_LINES);
    let mut count = 0u64;
    let mut progress = Progress::new(expected);
    for line in rx {
        let _ = writeln!(log_file, "{line}");
        count += 1;
        if line.starts_with("build-kernel.sh") {
            eprintln!("kernel: {line}");
        } else if let Some(report) = progress.report(count, std::time::Instant::now()) {
            eprintln!("{report}");
        }
        if tail.len() == TAIL_LINES {
            tail.pop_front();
        }
        tail.push_back(line);
    }
    let _ = out_thread.join();
    let _ = err_thread.join();
    let status = child.wait()?;
    if !status.success() {
        let tail: Vec<String> = tail.into_iter().collect();
        bail!(
            "kernel build failed ({status}); full log {}:\n{}",
            log.display(),
            tail.join("\n")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_job_cannot_take_an_entry_being_built() {
        use rustix::fs::{flock, FlockOperation};
        let dir =
            std::env::temp_dir().join(format!("ringstore-kernel-lock-{}", std::process::id()));
        let held = lock_entry(&dir, "k").unwrap();
        let other = std::fs::File::open(dir.join("k.lock")).unwrap();
        assert!(flock(&other, FlockOperation::NonBlockingLockExclusive).is_err());
        drop(held);
        assert!(flock(&other, FlockOperation::NonBlockingLockExclusive).is_ok());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn cache_key_changes_with_every_input() {
        let frags = vec![("base.config".to_string(), b"CONFIG_A=y\n".to_vec())];
        let key = cache_key(&frags, "6.12.1", b"script");
        assert_eq!(key.len(), 24);
        assert_eq!(key, cache_key(&frags, "6.12.1", b"script"));
        assert_ne!(key, cache_key(&frags, "6.12.2", b"script"));
        assert_ne!(key, cache_key(&frags, "6.12.1", b"script2"));
        let other = vec![("base.config".to_string(), b"CONFIG_A=n\n".to_vec())];
        assert_ne!(key, cache_key(&other, "6.12.1", b"script"));
        // Moving bytes between fields must not collide.
        let split = vec![("base.confi".to_string(), b"gCONFIG_A=y\n".to_vec())];
        assert_ne!(key, cache_key(&split, "6.12.1", b"script"));
    }

    #[test]
    fn progress_is_a_percentage_with_the_time_left() {
        let t = std::time::Duration::from_secs(60);
        assert_eq!(
            format_progress(500, 2000, t),
            "kernel: 25% (500/2000 lines), about 3 min 0 s left"
        );
        assert_eq!(
            format_progress(0, 2000, t),
            "kernel: 0% (0/2000 lines), time left unknown"
        );
        // A build that prints more than expected stays under 100% and never goes negative.
        assert_eq!(
            format_progress(3000, 2000, t),
            "kernel: 99% (3000/2000 lines), about 0 min 0 s left"
        );
        let mut p = Progress::new(1000);
        let now = p.started;
        assert!(p.report(10, now).is_none(), "under a 5% step and 30 s");
        assert!(p.report(60, now).is_some());
        assert!(p.report(70, now).is_none());
        assert!(p
            .report(70, now + std::time::Duration::from_secs(31))
            .is_some());
    }

    #[test]
    fn expected_lines_come_from_a_finished_build_log() {
        let dir = std::env::temp_dir().join(format!("ringstore-kcache-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("done")).unwrap();
        assert_eq!(expected_lines(&dir, "new"), EXPECTED_LINES);
        std::fs::write(dir.join("done.log"), "x\n".repeat(1234)).unwrap();
        std::fs::write(dir.join("unfinished.log"), "x\n".repeat(999)).unwrap();
        assert_eq!(
            expected_lines(&dir, "new"),
            EXPECTED_LINES,
            "no bzImage yet"
        );
        std::fs::write(dir.join("done/bzImage"), b"").unwrap();
        assert_eq!(expected_lines(&dir, "new"), 1234);
        assert_eq!(
            expected_lines(&dir, "done"),
            EXPECTED_LINES,
            "its own log is not a guide"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_repository_fragments_cover_every_concern() {
        let names: Vec<String> = fragments(&root().join("kernel-config"))
            .unwrap()
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        for want in [
            "base.config",
            "boot.config",
            "numa-cpu.config",
            "io_uring-bpf-xdp.config",
            "hugepages.config",
            "virtio.config",
            "nics.config",
            "storage.config",
            "uefi-watchdog.config",
        ] {
            assert!(
                names.iter().any(|n| n == want),
                "{want} missing from {names:?}"
            );
        }
    }
}
