//! Prometheus scraping the appliance (issue 33, docs/METRICS.md): the host's Prometheus
//! (Debian's `prometheus`) scrapes `/metrics` through the forwarded HTTP port every second,
//! and its HTTP API answers the hit ratio as memcached dashboards compute it, `memcached_up`
//! and a latency quantile, each checked against what the test did.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};

use super::client::{exchange, tcp};
use super::vm::{scratch_dir, Vm};
use super::{BOOT_LIMIT, COMMAND_LIMIT, PROMPT};
use crate::image::Image;

const PROMETHEUS: &str = "/usr/bin/prometheus";

/// Kills Prometheus when the test ends, however it ends.
struct Prometheus(Child);

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts Prometheus with its own config and data in `dir`, scraping `target` every second.
fn start_prometheus(dir: &Path, target: &str, port: u16) -> Result<Prometheus> {
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: box\n    static_configs:\n      - targets: ['{target}']\n"
        ),
    )?;
    let child = Command::new(PROMETHEUS)
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {PROMETHEUS} (cargo xtask deps installs it)"))?;
    Ok(Prometheus(child))
}

/// One instant query's single value (`None`: no result yet).
fn query(port: u16, promql: &str) -> Result<Option<f64>> {
    let encoded: String = promql
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect();
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let request = format!("GET /api/v1/query?query={encoded} HTTP/1.0\r\nHost: prometheus\r\n\r\n");
    s.write_all(request.as_bytes())?;
    let mut reply = String::new();
    s.read_to_string(&mut reply)?;
    let body = reply.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    let json: serde_json::Value = serde_json::from_str(body).context("Prometheus's answer")?;
    let value = json["data"]["result"][0]["value"][1].as_str();
    Ok(value.and_then(|v| v.parse().ok()))
}

/// Waits (bounded) until `promql` has a value satisfying `ok`; returns it.
fn wait_value(port: u16, promql: &str, ok: impl Fn(f64) -> bool) -> Result<f64> {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        if let Ok(Some(v)) = query(port, promql) {
            if ok(v) {
                return Ok(v);
            }
        }
        if Instant::now() > deadline {
            bail!(
                "Prometheus never answered {promql} as expected: {:?}",
                query(port, promql)
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// A free loopback port for Prometheus's own listener.
fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Boots the default profile, lets Prometheus scrape it, makes 30 hits and 10 misses and
/// checks what Prometheus computes from the box's own series.
pub(super) fn prometheus_scrapes_the_appliance(image: &Image) -> Result<String> {
    ensure!(
        Path::new(PROMETHEUS).exists(),
        "{PROMETHEUS} is missing (cargo xtask deps)"
    );
    let mut vm = Vm::boot(image, "metrics", "numa2", "")?;
    let ready = vm.wait_for("ringstore: ready memcache=", 0, BOOT_LIMIT)?;
    vm.wait_for(PROMPT, ready, COMMAND_LIMIT)?;
    let http = vm.port("http", 0)?;
    let dir = scratch_dir("metrics-prometheus")?;
    let prom_port = free_port()?;
    let _prom = start_prometheus(&dir, &format!("127.0.0.1:{http}"), prom_port)?;
    wait_value(prom_port, "count_over_time(memcached_up[10m])", |n| {
        n >= 2.0
    })?;
    let mut s = tcp(vm.port("memcache", 0)?)?;
    for i in 0..30 {
        let set = format!("set vm{i} 0 0 1\r\nv\r\n");
        exchange(&mut s, set.as_bytes(), |t| t.ends_with("\r\n"))?;
    }
    for i in 0..40 {
        let get = format!("get vm{i}\r\n");
        exchange(&mut s, get.as_bytes(), |t| t.ends_with("END\r\n"))?;
    }
    let ratio = wait_value(
        prom_port,
        "sum(increase(memcached_commands_total{command=\"get\",status=\"hit\"}[10m])) / sum(increase(memcached_commands_total{command=\"get\"}[10m]))",
        |r| (r - 0.75).abs() < 1e-6,
    )?;
    let p50 = wait_value(
        prom_port,
        "histogram_quantile(0.5, sum by (le) (increase(ringstore_request_duration_seconds_bucket{protocol=\"memcache\",command=\"get\"}[10m])))",
        |v| v > 0.0 && v < 1.0,
    )?;
    wait_value(prom_port, "memcached_up", |v| v == 1.0)?;
    let off = vm.poweroff()?;
    Ok(format!(
        "hit ratio {ratio:.3} (30 of 40), median GET inside the box {:.1} µs, poweroff in {:.1} s",
        p50 * 1e6,
        off.as_secs_f64()
    ))
}
