//! Host-side helpers xtask, the benchmarks (tests/bench) and the QEMU tests share: running
//! commands with clear errors, locating the workspace, a `ringstore serve` child on loopback,
//! the commands and flags the pages print.

pub mod docs;
pub mod tls;

use anyhow::{bail, Context, Result};
use std::path::PathBuf;
use std::process::Command;

/// The workspace root (two levels above this crate's `tests/support/`).
#[expect(
    clippy::expect_used,
    reason = "CARGO_MANIFEST_DIR is tests/support/, which always lies inside the workspace"
)]
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("tests/support lives inside the workspace")
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

/// `ip ARGS...`; its stderr in the error when it fails.
pub fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip")
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .context("running ip (apt-get install iproute2)")?;
    if !out.status.success() {
        bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// A `cargo` command using the same toolchain that runs xtask.
pub fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(root());
    cmd
}

/// The arguments every host-side start of `ringstore serve` begins with: memcache on
/// 127.0.0.1:`memcache_port` (0 = a free port), HTTP on a free loopback port or off.
pub fn serve_on_loopback(memcache_port: u16, http: bool) -> Vec<String> {
    let mut args = vec![
        "serve".to_string(),
        "--memcache".to_string(),
        format!("127.0.0.1:{memcache_port}"),
    ];
    if http {
        args.extend(["--http".to_string(), "127.0.0.1:0".to_string()]);
    } else {
        args.push("--http=off".to_string());
    }
    args
}

/// How long a server has to print its ready line.
const READY_LIMIT: std::time::Duration = std::time::Duration::from_secs(20);

/// A `ringstore serve` child on loopback with free ports; killed and reaped when dropped.
pub struct Server {
    pub child: std::process::Child,
    /// The `ready ...` line the server printed.
    pub ready: String,
    /// From the spawn to the ready line.
    pub ready_after: std::time::Duration,
    /// Its first stderr lines, when [`Server::start_keeping_stderr`] started it.
    pub stderr: Option<std::sync::Arc<std::sync::Mutex<Vec<String>>>>,
}

impl Server {
    /// Starts `binary serve` on 127.0.0.1 port 0 for memcache and HTTP plus `extra` flags and
    /// waits (bounded) for its ready line; stderr is inherited.
    pub fn start(binary: &std::path::Path, extra: &[&str]) -> Result<Server> {
        Server::spawn(binary, extra, None, READY_LIMIT)
    }

    /// [`Server::start`], with the first `lines` stderr lines kept in [`Server::stderr`]
    /// (the rest read and dropped) and `limit` for the ready line (a recovery takes longer).
    pub fn start_keeping_stderr(
        binary: &std::path::Path,
        extra: &[&str],
        lines: usize,
        limit: std::time::Duration,
    ) -> Result<Server> {
        Server::spawn(binary, extra, Some(lines), limit)
    }

    fn spawn(
        binary: &std::path::Path,
        extra: &[&str],
        keep: Option<usize>,
        limit: std::time::Duration,
    ) -> Result<Server> {
        use std::io::BufRead;
        let started = std::time::Instant::now();
        let mut child = Command::new(binary)
            .args(serve_on_loopback(0, true))
            .args(extra)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(match keep {
                Some(_) => std::process::Stdio::piped(),
                None => std::process::Stdio::inherit(),
            })
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let stderr = match (keep, child.stderr.take()) {
            (Some(limit), Some(pipe)) => Some(keep_lines(pipe, limit)),
            _ => None,
        };
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
        let mut server = Server {
            child,
            ready: String::new(),
            ready_after: std::time::Duration::ZERO,
            stderr,
        };
        match rx.recv_timeout(limit) {
            Ok(line) if line.starts_with("ready ") => server.ready = line.trim().to_string(),
            Ok(line) => bail!(
                "server printed {line:?} instead of a ready line; stderr: {:?}",
                server.stderr_lines()
            ),
            Err(_) => bail!(
                "server did not print its ready line within {} s",
                limit.as_secs()
            ),
        }
        server.ready_after = started.elapsed();
        Ok(server)
    }

    /// The stderr lines kept so far (none unless started keeping them).
    pub fn stderr_lines(&self) -> Vec<String> {
        self.stderr
            .as_ref()
            .and_then(|l| l.lock().ok().map(|l| l.clone()))
            .unwrap_or_default()
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

/// Reads `pipe` line by line on a thread, keeping the first `limit` lines.
fn keep_lines(
    pipe: std::process::ChildStderr,
    limit: usize,
) -> std::sync::Arc<std::sync::Mutex<Vec<String>>> {
    use std::io::BufRead;
    let kept = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let lines = std::sync::Arc::clone(&kept);
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(pipe).lines().map_while(Result::ok) {
            let mut kept = lines.lock().unwrap_or_else(|e| e.into_inner());
            if kept.len() < limit {
                kept.push(line);
            }
        }
    });
    kept
}
