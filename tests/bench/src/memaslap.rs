//! The saturation check for libmemcached's memaslap: run it against a pinned server and
//! compare its own CPU use to the server's. A load generator at 100% of its core while the
//! server idles measures the generator, not the server.

use super::procs::{self, Pinned};
use anyhow::{Context, Result};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// What one memaslap run showed.
pub struct MemaslapRun {
    pub ops_per_second: f64,
    pub client_cpu_percent: f64,
    pub server_cpu_percent: f64,
    /// The server's and the client's CPU as a whole (every task, softirq included).
    pub server_core: procs::CoreUse,
    pub client_core: procs::CoreUse,
    pub command: String,
}

/// memaslap's installed name (Debian calls it memcaslap).
pub fn binary() -> Option<&'static str> {
    ["/usr/bin/memcaslap", "/usr/bin/memaslap"]
        .into_iter()
        .find(|p| Path::new(p).exists())
}

/// Runs memaslap (1 thread, `conns` connections, 90% get / 10% set of 100-byte values) pinned
/// to the client CPU for `seconds`.
pub fn run(
    program: &str,
    server: &mut Pinned,
    conns: usize,
    seconds: u64,
    dir: &Path,
) -> Result<MemaslapRun> {
    let cfg = dir.join("memaslap.cfg");
    // key: 20 bytes (memaslap wants more than 16); value: 100 bytes; cmd 0 = set, 1 = get.
    std::fs::write(&cfg, "key\n20 20 1\nvalue\n100 100 1\ncmd\n0 0.1\n1 0.9\n")?;
    let mut cmd = procs::pinned_client(program);
    cmd.args([
        "-s",
        &format!("127.0.0.1:{}", server.port),
        "-T",
        "1",
        "-c",
        &conns.to_string(),
    ])
    .args(["-t", &format!("{seconds}s"), "-F"])
    .arg(&cfg);
    let command = procs::command_line(&cmd);
    eprintln!("+ {command}");
    let children0 = procs::children_cpu_seconds()?;
    let server0 = procs::process_cpu_seconds(server.pid())?;
    let cores0 = procs::core_ticks()?;
    let started = Instant::now();
    let mut child = cmd
        .stdout(Stdio::piped())
        .spawn()
        .context("starting memaslap")?;
    let stdout = child.stdout.take().context("memaslap stdout")?;
    let reader = std::thread::spawn(move || std::io::read_to_string(stdout).unwrap_or_default());
    let deadline = started + Duration::from_secs(seconds + 10);
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            anyhow::bail!("memaslap ran past {} s", seconds + 10);
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let wall = started.elapsed().as_secs_f64();
    let cores1 = procs::core_ticks()?;
    let server_cpu = procs::process_cpu_seconds(server.pid())? - server0;
    let client_cpu = procs::children_cpu_seconds()? - children0;
    let output = reader.join().unwrap_or_default();
    server.check_alive()?;
    if !status.success() {
        anyhow::bail!("memaslap failed: {status}\n{output}");
    }
    Ok(MemaslapRun {
        ops_per_second: parse_tps(&output)
            .with_context(|| format!("no TPS in memaslap output:\n{output}"))?,
        client_cpu_percent: 100.0 * client_cpu / wall,
        server_cpu_percent: 100.0 * server_cpu / wall,
        server_core: procs::CoreUse::between(&cores0.0, &cores1.0),
        client_core: procs::CoreUse::between(&cores0.1, &cores1.1),
        command,
    })
}

/// The `TPS: N` figure of memaslap's summary line.
fn parse_tps(output: &str) -> Option<f64> {
    let line = output.lines().rev().find(|l| l.contains("TPS:"))?;
    line.split("TPS:")
        .nth(1)?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    #[test]
    fn parses_summary_line() {
        let out = "cmd_get: 536487\n\nRun time: 5.0s Ops: 596124 TPS: 119129 Net_rate: 28.2M/s\n";
        assert_eq!(super::parse_tps(out), Some(119129.0));
        assert_eq!(super::parse_tps("nothing"), None);
    }
}
