//! The HTTP side: an nginx configuration serving the same bytes from files, storing those
//! bytes in ringstore with PUT, and wrk (pinned to the client CPU) driving GETs at both.

use super::procs::{self, Pinned};
use anyhow::{bail, Context, Result};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// The object path for values of `value_len` bytes (same key on both servers).
pub fn object_path(value_len: usize) -> String {
    format!("/h{value_len}")
}

/// Writes `dir/nginx.conf` and `dir/www/h<len>` files: one process, no access log, files
/// served with sendfile and an open-file cache (nginx at its best for small static objects).
pub fn write_nginx_site(dir: &Path, port: u16, value_lens: &[usize]) -> Result<std::path::PathBuf> {
    write_nginx_site_tls(dir, port, value_lens, None)
}

/// [`write_nginx_site`], listening with TLS on `(certificate, key)` when given: TLS 1.3 only,
/// TLS_AES_128_GCM_SHA256 preferred, session cache and tickets on (nginx's resumption).
pub fn write_nginx_site_tls(
    dir: &Path,
    port: u16,
    value_lens: &[usize],
    tls: Option<(&Path, &Path)>,
) -> Result<std::path::PathBuf> {
    let (ssl, tls_lines) = match tls {
        Some((cert, key)) => (
            " ssl",
            format!(
                "        ssl_certificate {};\n        ssl_certificate_key {};\n        ssl_protocols TLSv1.3;\n        ssl_conf_command Ciphersuites TLS_AES_128_GCM_SHA256;\n        ssl_session_cache shared:bench:1m;\n        ssl_session_tickets on;\n",
                cert.display(),
                key.display()
            ),
        ),
        None => ("", String::new()),
    };
    let www = dir.join("www");
    std::fs::create_dir_all(&www)?;
    std::fs::create_dir_all(dir.join("logs"))?;
    for &len in value_lens {
        std::fs::write(www.join(&object_path(len)[1..]), vec![b'v'; len])?;
    }
    let user = if crate::util::is_root() {
        "user root;\n"
    } else {
        ""
    };
    let conf = format!(
        "{user}daemon off;
master_process off;
worker_processes 1;
error_log {dir}/logs/error.log warn;
pid {dir}/nginx.pid;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    default_type application/octet-stream;
    sendfile on;
    tcp_nodelay on;
    open_file_cache max=100 inactive=600s;
    open_file_cache_valid 600s;
    keepalive_requests 1000000000;
    keepalive_timeout 600s;
    client_body_temp_path {dir}/tmp;
    server {{
        listen 127.0.0.1:{port}{ssl} backlog=4096;
{tls_lines}        root {www};
        location / {{ }}
    }}
}}
",
        dir = dir.display(),
        www = www.display(),
    );
    std::fs::create_dir_all(dir.join("tmp"))?;
    let path = dir.join("nginx.conf");
    std::fs::write(&path, conf)?;
    Ok(path)
}

/// Stores `value_len` bytes under `object_path(value_len)` with an HTTP PUT.
pub fn put_object(port: u16, value_len: usize) -> Result<()> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).context("connecting for PUT")?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut request = format!(
        "PUT {} HTTP/1.1\r\nHost: bench\r\nContent-Length: {value_len}\r\n\r\n",
        object_path(value_len)
    )
    .into_bytes();
    request.resize(request.len() + value_len, b'v');
    stream.write_all(&request)?;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if stream.read(&mut byte)? == 0 || head.len() > 16 * 1024 {
            break;
        }
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head);
    if !head.starts_with("HTTP/1.1 2") {
        bail!(
            "PUT {} answered {:?}",
            object_path(value_len),
            head.lines().next().unwrap_or("")
        );
    }
    Ok(())
}

/// What one wrk run showed.
pub struct WrkRun {
    pub requests_per_second: f64,
    pub p50_us: f64,
    /// NaN when wrk printed no usable 99th percentile (it prints `0.00us` at some rates).
    pub p99_us: f64,
    pub server_cpu_seconds: f64,
    pub requests: f64,
    /// wrk's own run time.
    pub seconds: f64,
    pub client_cpu_percent: f64,
    pub server_cpu_percent: f64,
    /// The server's and the client's CPU as a whole (every task, softirq included).
    pub server_core: procs::CoreUse,
    pub client_core: procs::CoreUse,
    pub command: String,
}

impl WrkRun {
    pub fn server_cpu_per_million(&self) -> f64 {
        self.server_cpu_seconds / (self.requests / 1e6)
    }

    /// Adds a second run of the same cell: counts add up, percentiles are averaged (wrk
    /// prints no histogram to merge exactly).
    pub fn merge(&mut self, other: &WrkRun) {
        let total = self.seconds + other.seconds;
        let weigh = |a: f64, b: f64| (a * self.seconds + b * other.seconds) / total;
        let mean = |a: f64, b: f64| match (a.is_nan(), b.is_nan()) {
            (false, false) => (a + b) / 2.0,
            (true, _) => b,
            (_, true) => a,
        };
        self.p50_us = mean(self.p50_us, other.p50_us);
        self.p99_us = mean(self.p99_us, other.p99_us);
        self.client_cpu_percent = weigh(self.client_cpu_percent, other.client_cpu_percent);
        self.server_cpu_percent = weigh(self.server_cpu_percent, other.server_cpu_percent);
        let weigh_core = |a: procs::CoreUse, b: procs::CoreUse| procs::CoreUse {
            busy_percent: weigh(a.busy_percent, b.busy_percent),
            softirq_percent: weigh(a.softirq_percent, b.softirq_percent),
        };
        self.server_core = weigh_core(self.server_core, other.server_core);
        self.client_core = weigh_core(self.client_core, other.client_core);
        self.requests += other.requests;
        self.server_cpu_seconds += other.server_cpu_seconds;
        self.seconds = total;
        self.requests_per_second = self.requests / total;
    }
}

/// A wrk script that sends `depth` GETs of the URL's path in one write.
fn pipeline_script(dir: &Path, depth: usize) -> Result<std::path::PathBuf> {
    let path = dir.join(format!("pipeline{depth}.lua"));
    let script = format!(
        "init = function(args)\n  local r = {{}}\n  for i = 1, {depth} do r[i] = wrk.format(nil, nil) end\n  req = table.concat(r)\nend\nrequest = function() return req end\n"
    );
    std::fs::write(&path, script)?;
    Ok(path)
}

/// Runs `wrk -t1 -c conns -d seconds --latency` pinned to the client CPU against `port`.
pub fn run_wrk(
    server: &mut Pinned,
    port: u16,
    value_len: usize,
    depth: usize,
    conns: usize,
    seconds: u64,
    dir: &Path,
) -> Result<WrkRun> {
    let mut cmd = procs::pinned_client("wrk");
    cmd.arg("-t1").args([
        "-c",
        &conns.to_string(),
        "-d",
        &format!("{seconds}s"),
        "--latency",
    ]);
    if depth > 1 {
        cmd.arg("-s").arg(pipeline_script(dir, depth)?);
    }
    cmd.arg(format!("http://127.0.0.1:{port}{}", object_path(value_len)));
    let command = procs::command_line(&cmd);
    eprintln!("+ {command}");
    let children0 = procs::children_cpu_seconds()?;
    let server0 = procs::process_cpu_seconds(server.pid())?;
    let cores0 = procs::core_ticks()?;
    let started = Instant::now();
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting wrk (apt install wrk)")?;
    let output = wait_bounded(child, Duration::from_secs(seconds + 10))?;
    let wall = started.elapsed().as_secs_f64();
    let cores1 = procs::core_ticks()?;
    let server_cpu = procs::process_cpu_seconds(server.pid())? - server0;
    let client_cpu = procs::children_cpu_seconds()? - children0;
    server.check_alive()?;
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    // Kept for reading the full distribution later.
    let _ = std::fs::write(
        dir.join(format!("wrk-{}-{value_len}-depth{depth}.txt", server.name)),
        &text,
    );
    if !output.status.success() {
        bail!(
            "wrk failed: {}\n{text}{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let parsed = parse_wrk(&text).with_context(|| format!("unexpected wrk output:\n{text}"))?;
    if parsed.errors > 0 {
        bail!(
            "wrk saw {} non-2xx responses or socket errors:\n{text}",
            parsed.errors
        );
    }
    Ok(WrkRun {
        requests_per_second: parsed.rps,
        p50_us: parsed.p50_us,
        p99_us: parsed.p99_us,
        server_cpu_seconds: server_cpu,
        requests: parsed.requests,
        seconds: parsed.seconds,
        client_cpu_percent: 100.0 * client_cpu / wall,
        server_cpu_percent: 100.0 * server_cpu / wall,
        server_core: procs::CoreUse::between(&cores0.0, &cores1.0),
        client_core: procs::CoreUse::between(&cores0.1, &cores1.1),
        command,
    })
}

fn wait_bounded(mut child: std::process::Child, limit: Duration) -> Result<std::process::Output> {
    let deadline = Instant::now() + limit;
    let mut stdout = child.stdout.take().context("stdout")?;
    let mut stderr = child.stderr.take().context("stderr")?;
    let out = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = stdout.read_to_end(&mut v);
        v
    });
    let err = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = stderr.read_to_end(&mut v);
        v
    });
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("wrk ran past {} s", limit.as_secs());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Ok(std::process::Output {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    })
}

struct WrkSummary {
    rps: f64,
    requests: f64,
    seconds: f64,
    p50_us: f64,
    p99_us: f64,
    errors: u64,
}

/// `340.00us`, `1.20ms`, `2.00s` -> microseconds.
fn duration_us(text: &str) -> Option<f64> {
    let (number, scale) = if let Some(n) = text.strip_suffix("us") {
        (n, 1.0)
    } else if let Some(n) = text.strip_suffix("ms") {
        (n, 1e3)
    } else if let Some(n) = text.strip_suffix('s') {
        (n, 1e6)
    } else {
        return None;
    };
    Some(number.parse::<f64>().ok()? * scale)
}

fn parse_wrk(text: &str) -> Option<WrkSummary> {
    let mut summary = WrkSummary {
        rps: 0.0,
        requests: 0.0,
        seconds: 0.0,
        p50_us: 0.0,
        p99_us: f64::NAN,
        errors: 0,
    };
    for line in text.lines().map(str::trim) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        match fields.as_slice() {
            ["50%", d] => summary.p50_us = duration_us(d)?,
            ["99%", d] => summary.p99_us = duration_us(d).filter(|&v| v > 0.0).unwrap_or(f64::NAN),
            ["Requests/sec:", n] => summary.rps = n.parse().ok()?,
            [n, "requests", "in", t, ..] => {
                summary.requests = n.parse().ok()?;
                summary.seconds = duration_us(t.trim_end_matches(','))? / 1e6;
            }
            ["Non-2xx", "or", "3xx", "responses:", n] => summary.errors += n.parse::<u64>().ok()?,
            ["Socket", "errors:", rest @ ..] => {
                summary.errors += rest
                    .iter()
                    .filter_map(|f| f.trim_end_matches(',').parse::<u64>().ok())
                    .sum::<u64>()
            }
            _ => {}
        }
    }
    (summary.rps > 0.0 && summary.requests > 0.0 && summary.seconds > 0.0 && summary.p50_us > 0.0)
        .then_some(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "Running 5s test @ http://127.0.0.1:8080/h100
  1 threads and 50 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency   410.21us  100.00us   3.00ms   90.00%
  Latency Distribution
     50%  340.00us
     75%  400.00us
     90%  500.00us
     99%    1.20ms
  123456 requests in 5.00s, 40.00MB read
Requests/sec:  24690.00
Transfer/sec:      8.00MB
";

    #[test]
    fn parses_wrk_summary() {
        let s = parse_wrk(SAMPLE).unwrap();
        assert_eq!(s.rps, 24690.0);
        assert_eq!(s.requests, 123456.0);
        assert_eq!(s.seconds, 5.0);
        assert_eq!(s.p50_us, 340.0);
        assert!((s.p99_us - 1200.0).abs() < 1e-9);
        assert_eq!(s.errors, 0);
    }

    #[test]
    fn counts_errors_and_rejects_garbage() {
        let bad = format!("{SAMPLE}  Socket errors: connect 0, read 3, write 0, timeout 2\n  Non-2xx or 3xx responses: 7\n");
        assert_eq!(parse_wrk(&bad).unwrap().errors, 12);
        assert!(parse_wrk("wrk: command not found").is_none());
        let quirk = SAMPLE.replace("99%    1.20ms", "99%    0.00us");
        assert!(parse_wrk(&quirk).unwrap().p99_us.is_nan());
    }

    #[test]
    fn nginx_conf_serves_the_same_bytes() {
        let dir = std::env::temp_dir().join(format!("xtask-bench-test-{}", std::process::id()));
        let conf = write_nginx_site(&dir, 12345, &[100, 4096]).unwrap();
        let text = std::fs::read_to_string(conf).unwrap();
        assert!(text.contains("listen 127.0.0.1:12345"));
        assert!(text.contains("master_process off;"));
        assert!(!text.contains("ssl"));
        let tls = write_nginx_site_tls(
            &dir,
            1,
            &[1],
            Some((Path::new("/c.pem"), Path::new("/k.pem"))),
        )
        .unwrap();
        let text = std::fs::read_to_string(tls).unwrap();
        assert!(text.contains("listen 127.0.0.1:1 ssl backlog=4096;"));
        assert!(text.contains("ssl_certificate /c.pem;\n        ssl_certificate_key /k.pem;"));
        assert_eq!(std::fs::read(dir.join("www/h4096")).unwrap().len(), 4096);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
