//! QEMU tests that boot the real image and talk to it through the serial console (a unix
//! socket) and the forwarded data ports. Every wait is bounded; the kernel runs with panic=-1
//! and QEMU with -no-reboot, so a kernel panic ends QEMU and fails the test that waits.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::image::{appliance_dir, Image};
use crate::qemu::{self, Forward, Serial};

/// Serial output kept per VM; older bytes are dropped past this.
const MAX_SERIAL: usize = 4 << 20;
/// Boot to the ready line under TCG on a loaded 2-core machine.
const BOOT_LIMIT: Duration = Duration::from_secs(180);
const COMMAND_LIMIT: Duration = Duration::from_secs(20);
const POWEROFF_LIMIT: Duration = Duration::from_secs(30);
const PROMPT: &str = "ringstore> ";

/// A booted appliance.
pub struct Vm {
    name: String,
    child: Child,
    serial: UnixStream,
    output: Arc<Mutex<String>>,
    pub forwards: Vec<Forward>,
    dir: PathBuf,
}

impl Vm {
    /// Boots `profile` with `append` added to the kernel command line; `name` names the log.
    pub fn boot(image: &Image, name: &str, profile: &str, append: &str) -> Result<Vm> {
        let profile = qemu::load_profile(profile)?;
        let forwards = qemu::choose_forwards(&profile)?;
        let dir = appliance_dir().join("vm").join(format!("{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let socket = dir.join("serial.sock");
        let accel = qemu::accel(&image.bzimage);
        let args = qemu::machine_args(&profile, image, &Serial::Socket(socket.clone()), append, accel, &forwards);
        let stderr = std::fs::File::create(dir.join("qemu.stderr"))?;
        let mut child = Command::new("qemu-system-x86_64")
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .context("starting qemu-system-x86_64")?;
        let deadline = Instant::now() + Duration::from_secs(15);
        let serial = loop {
            match UnixStream::connect(&socket) {
                Ok(stream) => break stream,
                Err(_) if Instant::now() < deadline && child.try_wait()?.is_none() => std::thread::sleep(Duration::from_millis(50)),
                Err(err) => {
                    let _ = child.kill();
                    let why = std::fs::read_to_string(dir.join("qemu.stderr")).unwrap_or_default();
                    bail!("QEMU serial socket {}: {err}; QEMU said: {why}", socket.display());
                }
            }
        };
        let output = Arc::new(Mutex::new(String::new()));
        let mut reader = serial.try_clone()?;
        let sink = Arc::clone(&output);
        let mut log = std::fs::File::create(appliance_dir().join("vm").join(format!("{name}.log")))?;
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = reader.read(&mut buf) {
                if n == 0 {
                    break;
                }
                let _ = log.write_all(&buf[..n]);
                let mut out = sink.lock().unwrap_or_else(|p| p.into_inner());
                out.push_str(&String::from_utf8_lossy(&buf[..n]).replace('\r', ""));
                if out.len() > MAX_SERIAL {
                    let cut = out.len() - MAX_SERIAL / 2;
                    let cut = (cut..out.len()).find(|i| out.is_char_boundary(*i)).unwrap_or(out.len());
                    out.replace_range(..cut, "");
                }
            }
        });
        Ok(Vm { name: name.to_string(), child, serial, output, forwards, dir })
    }

    /// Everything the console printed so far.
    pub fn output(&self) -> String {
        self.output.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn tail(&self) -> String {
        let out = self.output();
        let lines: Vec<&str> = out.lines().collect();
        lines[lines.len().saturating_sub(25)..].join("\n")
    }

    /// Waits until `needle` appears after byte `from` of the output; returns where it ends.
    pub fn wait_for(&mut self, needle: &str, from: usize, limit: Duration) -> Result<usize> {
        let deadline = Instant::now() + limit;
        loop {
            let out = self.output();
            if let Some(at) = out.get(from.min(out.len())..).and_then(|s| s.find(needle)) {
                return Ok(from + at + needle.len());
            }
            if let Some(status) = self.child.try_wait()? {
                let stderr = std::fs::read_to_string(self.dir.join("qemu.stderr")).unwrap_or_default();
                bail!("{}: QEMU exited ({status}) before {needle:?} appeared; QEMU said: {}; last lines:\n{}", self.name, stderr.trim(), self.tail());
            }
            if Instant::now() > deadline {
                bail!("{}: {needle:?} did not appear within {} s; last lines:\n{}", self.name, limit.as_secs(), self.tail());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Sends a console command and returns its output (up to the next prompt).
    pub fn command(&mut self, command: &str) -> Result<String> {
        let start = self.output().len();
        self.serial.write_all(format!("{command}\n").as_bytes())?;
        let end = self.wait_for(PROMPT, start + command.len(), COMMAND_LIMIT)?;
        let out = self.output();
        Ok(out.get(start..end - PROMPT.len()).unwrap_or("").to_string())
    }

    /// The host port forwarded to `name` on NIC `nic`.
    pub fn port(&self, name: &str, nic: usize) -> Result<u16> {
        self.forwards.iter().find(|f| f.name == name && f.nic == nic).map(|f| f.host_port).with_context(|| format!("no forward {name} on NIC {nic}"))
    }

    /// Types `poweroff` and waits for QEMU to end.
    pub fn poweroff(&mut self) -> Result<Duration> {
        let started = Instant::now();
        self.serial.write_all(b"poweroff\n")?;
        while started.elapsed() < POWEROFF_LIMIT {
            if let Some(status) = self.child.try_wait()? {
                if !status.success() {
                    bail!("{}: QEMU ended with {status} after poweroff", self.name);
                }
                return Ok(started.elapsed());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        bail!("{}: QEMU still running {} s after poweroff; last lines:\n{}", self.name, POWEROFF_LIMIT.as_secs(), self.tail())
    }

    /// Kernel timestamp (seconds) of the first console line containing `needle`.
    pub fn kernel_time_of(&self, needle: &str) -> Option<f64> {
        self.output().lines().find(|l| l.contains(needle)).and_then(|l| {
            let inner = l.trim_start().strip_prefix('[')?.split(']').next()?;
            inner.trim().parse().ok()
        })
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn tcp(port: u16) -> Result<TcpStream> {
    let stream = TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_secs(5))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    Ok(stream)
}

/// Writes `request` and reads until `done` says the answer is whole (bounded in size and time).
fn exchange(stream: &mut TcpStream, request: &[u8], done: impl Fn(&str) -> bool) -> Result<String> {
    stream.write_all(request)?;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !done(&String::from_utf8_lossy(&got)) && got.len() < 1 << 20 {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
    }
    Ok(String::from_utf8_lossy(&got).into_owned())
}

fn memcache_set_get(port: u16) -> Result<()> {
    let mut s = tcp(port)?;
    let stored = exchange(&mut s, b"set vmkey 0 0 5\r\nhello\r\n", |t| t.ends_with("\r\n"))?;
    anyhow::ensure!(stored == "STORED\r\n", "set answered {stored:?}");
    let got = exchange(&mut s, b"get vmkey\r\n", |t| t.ends_with("END\r\n"))?;
    anyhow::ensure!(got == "VALUE vmkey 0 5\r\nhello\r\nEND\r\n", "get answered {got:?}");
    Ok(())
}

fn http_put_get(port: u16) -> Result<()> {
    let mut s = tcp(port)?;
    let put = exchange(&mut s, b"PUT /vmobject HTTP/1.1\r\nHost: vm\r\nContent-Length: 5\r\n\r\nworld", |t| t.contains("\r\n\r\n"))?;
    anyhow::ensure!(put.starts_with("HTTP/1.1 20"), "PUT answered {put:?}");
    let mut s = tcp(port)?;
    let get = exchange(&mut s, b"GET /vmobject HTTP/1.1\r\nHost: vm\r\n\r\n", |t| t.contains("\r\n\r\n") && t.ends_with("world"))?;
    anyhow::ensure!(get.starts_with("HTTP/1.1 200") && get.ends_with("world"), "GET answered {get:?}");
    Ok(())
}

/// The port answers nothing: the connection closes or times out without a memcache reply.
fn memcache_closed(port: u16) -> Result<()> {
    let Ok(mut s) = tcp(port) else { return Ok(()) };
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    match exchange(&mut s, b"version\r\n", |t| t.ends_with("\r\n")) {
        Ok(answer) if answer.starts_with("VERSION") => bail!("port {port} serves memcache: {answer:?}"),
        _ => Ok(()),
    }
}

fn stat<'a>(stats: &'a str, key: &str) -> Option<&'a str> {
    stats.lines().find_map(|l| l.trim().strip_prefix(&format!("STAT {key} ")))
}

/// What the numa2 test measured.
#[derive(Debug, Clone)]
pub struct BootReport {
    /// Kernel timestamp of the `serving:` log line (kernel start = 0).
    pub ready_secs: Option<f64>,
    pub poweroff: Duration,
}

/// numa2: boots to the ready line, serves memcache and HTTP through the forwarded ports,
/// `stats` shows node 1 with its CPUs and huge pages, `irq` shows the NIC queues on worker
/// CPUs, and `poweroff` ends QEMU.
pub fn numa2_serves(image: &Image) -> Result<BootReport> {
    let mut vm = Vm::boot(image, "numa2", "numa2", "")?;
    let ready = vm.wait_for("ringstore: ready memcache=", 0, BOOT_LIMIT)?;
    vm.wait_for(PROMPT, ready, COMMAND_LIMIT)?;
    memcache_set_get(vm.port("memcache", 0)?)?;
    http_put_get(vm.port("http", 0)?)?;
    let stats = vm.command("stats")?;
    anyhow::ensure!(stat(&stats, "numa_node") == Some("1"), "stats numa_node is not 1:\n{stats}");
    let mut cpus: Vec<&str> = stat(&stats, "worker_cpus").unwrap_or("").split(',').collect();
    cpus.sort_unstable();
    anyhow::ensure!(cpus == ["2", "3"], "stats worker_cpus is not node 1's CPUs 2,3:\n{stats}");
    let huge: u64 = stat(&stats, "hugepage_bytes").and_then(|v| v.parse().ok()).unwrap_or(0);
    anyhow::ensure!(huge > 0, "stats hugepage_bytes is not positive:\n{stats}");
    let irq = vm.command("irq")?;
    let rows: Vec<Vec<&str>> = irq.lines().map(|l| l.split_whitespace().collect::<Vec<_>>()).filter(|f| f.first().is_some_and(|n| n.parse::<u32>().is_ok())).collect();
    let queues: Vec<&Vec<&str>> = rows.iter().filter(|f| f.iter().any(|w| w.contains("input") || w.contains("output"))).collect();
    anyhow::ensure!(!queues.is_empty(), "irq shows no NIC queue IRQs:\n{irq}");
    for row in &queues {
        anyhow::ensure!(row.get(1).is_some_and(|cpus| cpus.split(',').all(|c| c == "2" || c == "3")), "NIC queue IRQ not on a worker CPU: {row:?}\n{irq}");
    }
    let ready_secs = vm.kernel_time_of("ringstore: serving:");
    let poweroff = vm.poweroff()?;
    Ok(BootReport { ready_secs, poweroff })
}

/// twonic without ringstore.numa: the NUMA error names the interfaces, nothing listens.
pub fn twonic_refuses_without_numa(image: &Image) -> Result<()> {
    let mut vm = Vm::boot(image, "twonic-auto", "twonic", "")?;
    let at = vm.wait_for("cannot choose a NUMA node", 0, BOOT_LIMIT)?;
    let line_end = vm.wait_for("\n", at, COMMAND_LIMIT)?;
    let out = vm.output();
    let line = &out[out[..at].rfind('\n').map_or(0, |i| i + 1)..line_end];
    anyhow::ensure!(line.contains("eth0") && line.contains("eth1") && line.contains("numa"), "the error does not list the interfaces: {line}");
    vm.wait_for(PROMPT, at, COMMAND_LIMIT)?;
    for nic in 0..2 {
        memcache_closed(vm.port("memcache", nic)?)?;
    }
    let status = vm.command("status")?;
    anyhow::ensure!(status.contains("not serving"), "status does not say it is not serving:\n{status}");
    vm.poweroff()?;
    Ok(())
}

/// twonic with ringstore.numa=1: serves through node 1's NIC.
pub fn twonic_serves_with_numa1(image: &Image) -> Result<()> {
    let mut vm = Vm::boot(image, "twonic-numa1", "twonic", "ringstore.numa=1")?;
    let ready = vm.wait_for("ringstore: ready memcache=", 0, BOOT_LIMIT)?;
    vm.wait_for(PROMPT, ready, COMMAND_LIMIT)?;
    memcache_set_get(vm.port("memcache", 1)?)?;
    let stats = vm.command("stats")?;
    anyhow::ensure!(stat(&stats, "numa_node") == Some("1"), "stats numa_node is not 1:\n{stats}");
    vm.poweroff()?;
    Ok(())
}

/// A kernel panic (no init) ends QEMU and the wait fails quickly instead of hanging.
pub fn kernel_panic_fails_the_wait(image: &Image) -> Result<()> {
    let mut vm = Vm::boot(image, "panic", "single", "rdinit=/nonexistent init=/nonexistent")?;
    let started = Instant::now();
    match vm.wait_for("ringstore: ready", 0, BOOT_LIMIT) {
        Ok(_) => bail!("booted without an init?"),
        Err(err) if err.to_string().contains("QEMU exited") => {
            anyhow::ensure!(vm.output().contains("Kernel panic"), "QEMU exited without a kernel panic");
            anyhow::ensure!(started.elapsed() < Duration::from_secs(120), "took {:?}", started.elapsed());
            Ok(())
        }
        Err(err) => Err(err),
    }
}

type TestFn = fn(&Image) -> Result<String>;

/// Every QEMU test by name.
pub fn tests() -> Vec<(&'static str, TestFn)> {
    vec![
        ("numa2_serves", |i| numa2_serves(i).map(|r| format!("ready at {:?} s kernel time, poweroff in {:.1} s", r.ready_secs, r.poweroff.as_secs_f64()))),
        ("twonic_refuses_without_numa", |i| twonic_refuses_without_numa(i).map(|()| String::new())),
        ("twonic_serves_with_numa1", |i| twonic_serves_with_numa1(i).map(|()| String::new())),
        ("kernel_panic_fails_the_wait", |i| kernel_panic_fails_the_wait(i).map(|()| String::new())),
    ]
}

/// `cargo xtask test` runs this: builds the image, then every QEMU test whose name contains one
/// of `filters` (all when empty). Console logs go to target/appliance/vm/NAME.log.
pub fn run(filters: &[String]) -> Result<()> {
    let image = crate::image::build_image()?;
    let mut failed = Vec::new();
    for (name, test) in tests() {
        if !filters.is_empty() && !filters.iter().any(|f| name.contains(f.as_str())) {
            continue;
        }
        let started = Instant::now();
        match test(&image) {
            Ok(note) => eprintln!("vm test {name}: ok in {:.1} s {note}", started.elapsed().as_secs_f64()),
            Err(err) => {
                eprintln!("vm test {name}: FAILED in {:.1} s: {err:#}", started.elapsed().as_secs_f64());
                failed.push(name);
            }
        }
    }
    if !failed.is_empty() {
        bail!("QEMU tests failed: {}", failed.join(", "));
    }
    Ok(())
}
