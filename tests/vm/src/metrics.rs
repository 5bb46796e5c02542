//! Prometheus scraping the appliance and its log at rsyslog (issue 33, docs/METRICS.md, ADR
//! 0045), in one boot of `numa2-disk`: the host's Prometheus (Debian's `prometheus`) scrapes
//! `/metrics` through the forwarded HTTP port every second, and its HTTP API answers the hit
//! ratio as memcached dashboards compute it, `memcached_up`, a latency quantile, the durable
//! commit histograms and PID 1's own series (booted slot, data device, tuning checks, no
//! certificate), each checked against what the test did or the console says. The same boot
//! ships its log to a real rsyslog on the host (`ringstore.log_sink=tcp://10.0.2.2:PORT`):
//! PID 1's lines, the server's and the kernel's arrive, among them lines written before the
//! network was up.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};

use super::client::{exchange, tcp};
use super::durable::ScratchDisks;
use super::vm::{scratch_dir, Vm};
use super::{BOOT_LIMIT, COMMAND_LIMIT, PROMPT};
use crate::image::Image;

const PROMETHEUS: &str = "/usr/bin/prometheus";
const RSYSLOGD: &str = "/usr/sbin/rsyslogd";
/// A data disk: durable writes, and a data device for PID 1's series to report.
const PROFILE: &str = "numa2-disk";
/// How long the log lines get to reach rsyslog once the box is ready.
const LOG_LIMIT: Duration = Duration::from_secs(60);

/// Kills Prometheus when the test ends, however it ends.
struct Prometheus(Child);

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// rsyslogd in the foreground with its own configuration in a scratch folder, writing each
/// message it receives over TCP, as received, to `received.log` there; killed when dropped.
struct Rsyslog {
    child: Child,
    out: std::path::PathBuf,
}

impl Drop for Rsyslog {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Rsyslog {
    /// Starts it on 127.0.0.1:`port` (the guest reaches it as 10.0.2.2) and waits until it
    /// listens.
    fn start(dir: &Path, port: u16) -> Result<Rsyslog> {
        let out = dir.join("received.log");
        let config = dir.join("rsyslog.conf");
        std::fs::write(
            &config,
            format!(
                "global(workDirectory=\"{d}\" net.enableDNS=\"off\")\n\
                 template(name=\"raw\" type=\"string\" string=\"%rawmsg%\\n\")\n\
                 module(load=\"imtcp\")\n\
                 input(type=\"imtcp\" address=\"127.0.0.1\" port=\"{port}\")\n\
                 action(type=\"omfile\" file=\"{o}\" template=\"raw\" flushOnTXEnd=\"on\" asyncWriting=\"off\")\n",
                d = dir.display(),
                o = out.display(),
            ),
        )?;
        let child = Command::new(RSYSLOGD)
            .arg("-n")
            .arg("-f")
            .arg(&config)
            .arg("-i")
            .arg(dir.join("rsyslogd.pid"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("rsyslogd.stderr"))?)
            .spawn()
            .with_context(|| format!("starting {RSYSLOGD} (cargo xtask deps installs it)"))?;
        let mut me = Rsyslog { child, out };
        let deadline = Instant::now() + Duration::from_secs(15);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Some(status) = me.child.try_wait()? {
                bail!(
                    "rsyslogd exited ({status}): {}",
                    std::fs::read_to_string(dir.join("rsyslogd.stderr")).unwrap_or_default()
                );
            }
            ensure!(
                Instant::now() < deadline,
                "rsyslogd never listened on {port}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(me)
    }

    /// The ringstore lines received so far.
    fn lines(&self) -> Vec<String> {
        std::fs::read_to_string(&self.out)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains(" ringstore "))
            .map(str::to_string)
            .collect()
    }
}

/// The component of an RFC 5424 line as ringstore writes it (`<PRI>1 TIME HOST ringstore PID
/// MSGID [ringstore@32473 boot="…" component="…"] MSG`), and its message.
fn component_of(line: &str) -> Option<(&str, &str)> {
    let rest = line.strip_prefix('<')?;
    let (pri, rest) = rest.split_once(">1 ")?;
    pri.parse::<u8>().ok()?;
    let (_, rest) = rest.split_once(" [ringstore@32473 boot=\"")?;
    let (_, rest) = rest.split_once("\" component=\"")?;
    rest.split_once("\"] ")
}

/// Waits (bounded) until rsyslog holds a line of `component` containing one of `needles`.
fn wait_line(rsyslog: &Rsyslog, component: &str, needles: &[&str]) -> Result<String> {
    let deadline = Instant::now() + LOG_LIMIT;
    loop {
        let found = rsyslog.lines().into_iter().find(|l| {
            component_of(l)
                .is_some_and(|(c, m)| c == component && needles.iter().any(|n| m.contains(n)))
        });
        if let Some(line) = found {
            return Ok(line);
        }
        if Instant::now() > deadline {
            let got = rsyslog.lines();
            bail!(
                "no {component} line with {needles:?} at rsyslog; {} lines arrived, the last: {:?}",
                got.len(),
                got.iter().rev().take(5).collect::<Vec<_>>()
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// PID 1's lines, the server's and the kernel's at rsyslog, lines from before the network
/// was up among them: PID 1's first line and the kernel's boot lines (shipped from the
/// backlog and /dev/kmsg once the sink started). Returns a summary.
fn check_log_at_rsyslog(rsyslog: &Rsyslog) -> Result<String> {
    // Queued first when the sink starts (the ring's backlog), so never the one dropped: the
    // kernel's backlog behind it may fill the bounded queue for a moment (ADR 0045).
    let first = wait_line(rsyslog, "init", &["ringstore-init ", " starting (kernel "])?;
    let ready = wait_line(rsyslog, "init", &["ready memcache="])?;
    wait_line(rsyslog, "server", &["workers on CPUs"])?;
    // Printed before PID 1 ran: only the /dev/kmsg backlog can have brought them.
    let kernel = wait_line(
        rsyslog,
        "kernel",
        &["Linux version", "Command line:", "as init process"],
    )?;
    let lines = rsyslog.lines();
    for l in &lines {
        ensure!(
            component_of(l).is_some(),
            "not an RFC 5424 line as ringstore writes it: {l:?}"
        );
    }
    let at = |wanted: &str| lines.iter().position(|l| l == wanted);
    ensure!(
        at(&first) < at(&ready),
        "PID 1's first line arrived after its ready line"
    );
    let count = |c: &str| {
        lines
            .iter()
            .filter(|l| component_of(l).is_some_and(|(x, _)| x == c))
            .count()
    };
    Ok(format!(
        "rsyslog got {} lines (init {}, server {}, kernel {}, drop reports {}; early kernel line {:?})",
        lines.len(),
        count("init"),
        count("server"),
        count("kernel"),
        count("log-sink"),
        component_of(&kernel).map_or("", |(_, m)| m)
    ))
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

/// PID 1's series as Prometheus sees them, against what the boot was and the console says.
fn check_appliance_series(vm: &mut Vm, prom_port: u16) -> Result<String> {
    wait_value(
        prom_port,
        "ringstore_appliance_booted_slot_info{slot=\"none\"}",
        |v| v == 1.0,
    )?;
    wait_value(
        prom_port,
        "ringstore_appliance_data_device_state{state=\"serving\"}",
        |v| v == 1.0,
    )?;
    wait_value(
        prom_port,
        "ringstore_appliance_data_device_state{state=\"absent\"}",
        |v| v == 0.0,
    )?;
    // No TLS on this boot: no certificate, so no days left.
    wait_value(
        prom_port,
        "absent(ringstore_appliance_certificate_days_left)",
        |v| v == 1.0,
    )?;
    // The console verifies again and hands its checks over: the scrape then agrees with it.
    let tuning = vm.command("tuning")?;
    let clean = tuning.contains(": clean");
    ensure!(
        clean || tuning.contains(" differences"),
        "tuning said neither clean nor differences: {tuning}"
    );
    let checks = wait_value(prom_port, "count(ringstore_appliance_tuning_check)", |n| {
        n >= 1.0
    })?;
    let zeros = wait_value(
        prom_port,
        "count(ringstore_appliance_tuning_check == 0) or vector(0)",
        |n| (n == 0.0) == clean,
    )?;
    Ok(format!("{checks} tuning checks, {zeros} differences"))
}

/// Boots `numa2-disk` shipping its log to rsyslog, lets Prometheus scrape it, makes 30 hits
/// and 10 misses and checks what Prometheus computes from the box's own series, PID 1's
/// series and the log at rsyslog.
pub(super) fn prometheus_scrapes_the_appliance(image: &Image) -> Result<String> {
    for tool in [PROMETHEUS, RSYSLOGD] {
        ensure!(
            Path::new(tool).exists(),
            "{tool} is missing (cargo xtask deps)"
        );
    }
    let dir = scratch_dir("metrics-prometheus")?;
    let log_port = free_port()?;
    let rsyslog = Rsyslog::start(&dir, log_port)?;
    let disks = ScratchDisks::create("metrics", PROFILE)?;
    let sink = format!("ringstore.log_sink=tcp://10.0.2.2:{log_port}");
    let mut vm = Vm::boot_with_disks(image, "metrics", PROFILE, &sink, &disks.files)?;
    let ready = vm.wait_for("ringstore: ready memcache=", 0, BOOT_LIMIT)?;
    vm.wait_for(PROMPT, ready, COMMAND_LIMIT)?;
    let http = vm.port("http", 0)?;
    let prom_port = free_port()?;
    let _prom = start_prometheus(&dir, &format!("127.0.0.1:{http}"), prom_port)?;
    wait_value(prom_port, "count_over_time(memcached_up[10m])", |n| {
        n >= 2.0
    })?;
    let mut s = tcp(vm.port("memcache", 0)?)?;
    for i in 0..30 {
        let set = format!("set vm{i} 0 0 1\r\nv\r\n");
        let got = exchange(&mut s, set.as_bytes(), |t| t.ends_with("\r\n"))?;
        ensure!(got == "STORED\r\n", "set vm{i} answered {got:?}");
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
    // Each of the 30 acknowledged sets was one durable record of one group.
    wait_value(
        prom_port,
        "ringstore_data_commit_duration_seconds_count",
        |n| n == 30.0,
    )?;
    wait_value(prom_port, "ringstore_data_commit_group_records_sum", |n| {
        n == 30.0
    })?;
    let commit_p50 = wait_value(
        prom_port,
        "histogram_quantile(0.5, ringstore_data_commit_duration_seconds_bucket)",
        |v| v > 0.0 && v < 5.0,
    )?;
    wait_value(prom_port, "memcached_up", |v| v == 1.0)?;
    let appliance = check_appliance_series(&mut vm, prom_port)?;
    let log = check_log_at_rsyslog(&rsyslog)?;
    let off = vm.poweroff()?;
    Ok(format!(
        "hit ratio {ratio:.3} (30 of 40), median GET inside the box {:.1} µs, median commit {:.1} ms, {appliance}; {log}; poweroff in {:.1} s",
        p50 * 1e6,
        commit_p50 * 1e3,
        off.as_secs_f64()
    ))
}
