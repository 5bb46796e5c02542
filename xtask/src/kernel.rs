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
pub const SOURCE_PACKAGE: &str = "linux-source-6.12";
/// Packages the build needs besides the source.
const BUILD_PACKAGES: &[&str] = &["bc", "flex", "bison", "libelf-dev", "libssl-dev"];
/// Lines of build output kept for the error message when the build fails.
const TAIL_LINES: usize = 40;

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
        "apt-get install -y {SOURCE_PACKAGE} {}",
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
        &std::fs::read(&script).context("reading build-kernel.sh")?,
    );
    let appliance = root().join("target/appliance");
    let cache = cache_dir();
    let out = cache.join(&key);
    let bzimage = out.join("bzImage");
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
    run_with_progress(cmd, &cache.join(format!("{key}.log")))?;
    let version = std::fs::read_to_string(out.join("version"))
        .unwrap_or_default()
        .trim()
        .to_string();
    Ok(Kernel { bzimage, version })
}

/// Runs the build, printing its own lines and a running count of make's lines; the full output
/// goes to `log`, the tail into the error.
fn run_with_progress(mut cmd: Command, log: &Path) -> Result<()> {
    if let Some(dir) = log.parent() {
        std::fs::create_dir_all(dir)?;
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
    let mut since_report = 0u32;
    for line in rx {
        let _ = writeln!(log_file, "{line}");
        count += 1;
        since_report += 1;
        if line.starts_with("build-kernel.sh") {
            eprintln!("kernel: {line}");
        } else if since_report >= 200 {
            since_report = 0;
            eprintln!("kernel: {count} lines, now: {}", line.trim());
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
    fn the_repository_fragments_cover_every_concern() {
        let names: Vec<String> = fragments(&root().join("kernel-config"))
            .unwrap()
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        for want in [
            "base.config",
            "numa-cpu.config",
            "io_uring-bpf-xdp.config",
            "hugepages.config",
            "virtio.config",
            "nics.config",
            "storage.config",
        ] {
            assert!(
                names.iter().any(|n| n == want),
                "{want} missing from {names:?}"
            );
        }
    }
}
