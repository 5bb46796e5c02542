//! Small helpers for running commands with clear errors and locating the workspace.

use anyhow::{bail, Context, Result};
use std::path::PathBuf;
use std::process::Command;

/// The workspace root (the parent of `xtask/`).
#[expect(
    clippy::expect_used,
    reason = "CARGO_MANIFEST_DIR is xtask/, which always has a parent: the workspace"
)]
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives inside the workspace")
        .to_path_buf()
}

/// Runs `cmd` with inherited stdio; fails with the command line when it exits non-zero.
pub fn exec(cmd: &mut Command) -> Result<()> {
    let line = format!("{cmd:?}");
    eprintln!("+ {line}");
    let status = cmd.status().with_context(|| format!("starting {line}"))?;
    if !status.success() {
        bail!("{line} failed: {status}");
    }
    Ok(())
}

/// Whether `program` is on PATH.
pub fn have(program: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {program} >/dev/null 2>&1")])
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// Whether we run as root (apt and namespaces need it).
pub fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// A `cargo` command using the same toolchain that runs xtask.
pub fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(root());
    cmd
}

/// A `ringstore serve` child on loopback with free ports; killed when dropped.
pub struct Server {
    child: std::process::Child,
    /// The `ready ...` line the server printed.
    pub ready: String,
}

impl Server {
    /// Starts `binary serve` on 127.0.0.1 port 0 for memcache and HTTP plus `extra` flags and
    /// waits (bounded) for its ready line.
    pub fn start(binary: &std::path::Path, extra: &[&str]) -> Result<Server> {
        use std::io::BufRead;
        let mut child = Command::new(binary)
            .args([
                "serve",
                "--memcache",
                "127.0.0.1:0",
                "--http",
                "127.0.0.1:0",
            ])
            .args(extra)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let stdout = child.stdout.take().context("server stdout")?;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut reader = std::io::BufReader::new(stdout);
            let mut line = String::new();
            let _ = reader.read_line(&mut line);
            let _ = tx.send(line);
            // Keep draining so a later write to stdout never meets a closed pipe.
            let _ = std::io::copy(&mut reader, &mut std::io::sink());
        });
        let ready = match rx.recv_timeout(std::time::Duration::from_secs(20)) {
            Ok(line) if line.starts_with("ready ") => line.trim().to_string(),
            Ok(line) => {
                let _ = child.kill();
                bail!("server printed {line:?} instead of a ready line");
            }
            Err(_) => {
                let _ = child.kill();
                bail!("server did not print its ready line within 20 s");
            }
        };
        Ok(Server { child, ready })
    }

    /// The memcache endpoint from the ready line.
    pub fn memcache_host_port(&self) -> Result<(String, u16)> {
        self.endpoint("memcache")
    }

    /// The `name=IP:PORT` endpoint from the ready line.
    pub fn endpoint(&self, name: &str) -> Result<(String, u16)> {
        let prefix = format!("{name}=");
        let addr = self
            .ready
            .split_whitespace()
            .find_map(|field| field.strip_prefix(&prefix))
            .with_context(|| format!("no {name}= in {:?}", self.ready))?;
        let (host, port) = addr.rsplit_once(':').context("endpoint without a port")?;
        Ok((host.to_string(), port.parse().context("endpoint port")?))
    }

    /// The server's process id (for CPU time and RSS readings).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
