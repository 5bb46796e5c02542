//! QEMU tests that boot the real image and talk to it through the serial console (a unix
//! socket) and the forwarded data ports. Every wait is bounded; the kernel runs with panic=-1
//! and QEMU with -no-reboot, so a kernel panic ends QEMU and fails the test that waits.

mod durable;
mod netns;
mod portscan;

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, TcpStream};
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

/// A QEMU process and its scratch directory: dropping it kills QEMU, waits for it and removes
/// the directory, on every path out of a test (errors and panics included).
struct Qemu {
    child: Child,
    dir: PathBuf,
}

impl Drop for Qemu {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A booted appliance.
pub struct Vm {
    name: String,
    qemu: Qemu,
    serial: UnixStream,
    output: Arc<Mutex<String>>,
    pub forwards: Vec<Forward>,
    /// When QEMU was started.
    started: Instant,
}

impl Vm {
    /// Boots `profile` with `append` added to the kernel command line; `name` names the log.
    pub fn boot(image: &Image, name: &str, profile: &str, append: &str) -> Result<Vm> {
        Vm::boot_in(image, name, profile, append, None, &[])
    }

    /// [`Vm::boot`] with `disks` as the files of the profile's data disks (one each; the caller
    /// creates them and keeps them across boots).
    fn boot_with_disks(
        image: &Image,
        name: &str,
        profile: &str,
        append: &str,
        disks: &[PathBuf],
    ) -> Result<Vm> {
        Vm::boot_in(image, name, profile, append, None, disks)
    }

    /// [`Vm::boot`] with QEMU running inside `netns` (its taps live there).
    fn boot_in(
        image: &Image,
        name: &str,
        profile: &str,
        append: &str,
        netns: Option<&netns::Netns>,
        disks: &[PathBuf],
    ) -> Result<Vm> {
        let profile_name = profile;
        let profile = qemu::load_profile(profile)?;
        anyhow::ensure!(
            disks.len() == profile.disks.len(),
            "profile {profile_name} has {} data disks, {} files given",
            profile.disks.len(),
            disks.len()
        );
        let forwards = qemu::choose_forwards(&profile)?;
        let dir = appliance_dir()
            .join("vm")
            .join(format!("{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let socket = dir.join("serial.sock");
        let accel = qemu::accel(&image.bzimage);
        let args = qemu::machine_args(
            &profile,
            image,
            &Serial::Socket(socket.clone()),
            append,
            accel,
            &forwards,
            disks,
        );
        let stderr = std::fs::File::create(dir.join("qemu.stderr"))?;
        let mut command = match netns {
            Some(ns) => ns.command("qemu-system-x86_64"),
            None => Command::new("qemu-system-x86_64"),
        };
        let mut log =
            std::fs::File::create(appliance_dir().join("vm").join(format!("{name}.log")))?;
        let started = Instant::now();
        let child = command
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .context("starting qemu-system-x86_64")?;
        let mut qemu = Qemu { child, dir };
        let deadline = Instant::now() + Duration::from_secs(15);
        let serial = loop {
            match UnixStream::connect(&socket) {
                Ok(stream) => break stream,
                Err(_) if Instant::now() < deadline && qemu.child.try_wait()?.is_none() => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                Err(err) => {
                    let why =
                        std::fs::read_to_string(qemu.dir.join("qemu.stderr")).unwrap_or_default();
                    bail!(
                        "QEMU serial socket {}: {err}; QEMU said: {why}",
                        socket.display()
                    );
                }
            }
        };
        let output = Arc::new(Mutex::new(String::new()));
        let mut reader = serial.try_clone()?;
        let sink = Arc::clone(&output);
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
                    let cut = (cut..out.len())
                        .find(|i| out.is_char_boundary(*i))
                        .unwrap_or(out.len());
                    out.replace_range(..cut, "");
                }
            }
        });
        Ok(Vm {
            name: name.to_string(),
            qemu,
            serial,
            output,
            forwards,
            started,
        })
    }

    /// Everything the console printed so far.
    pub fn output(&self) -> String {
        self.output
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
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
            if let Some(status) = self.qemu.child.try_wait()? {
                let stderr =
                    std::fs::read_to_string(self.qemu.dir.join("qemu.stderr")).unwrap_or_default();
                bail!("{}: QEMU exited ({status}) before {needle:?} appeared; QEMU said: {}; last lines:\n{}", self.name, stderr.trim(), self.tail());
            }
            if Instant::now() > deadline {
                bail!(
                    "{}: {needle:?} did not appear within {} s; last lines:\n{}",
                    self.name,
                    limit.as_secs(),
                    self.tail()
                );
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
        self.forwards
            .iter()
            .find(|f| f.name == name && f.nic == nic)
            .map(|f| f.host_port)
            .with_context(|| format!("no forward {name} on NIC {nic}"))
    }

    /// Types `poweroff` and waits for QEMU to end.
    pub fn poweroff(&mut self) -> Result<Duration> {
        let started = Instant::now();
        self.serial.write_all(b"poweroff\n")?;
        while started.elapsed() < POWEROFF_LIMIT {
            if let Some(status) = self.qemu.child.try_wait()? {
                if !status.success() {
                    bail!("{}: QEMU ended with {status} after poweroff", self.name);
                }
                return Ok(started.elapsed());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        bail!(
            "{}: QEMU still running {} s after poweroff; last lines:\n{}",
            self.name,
            POWEROFF_LIMIT.as_secs(),
            self.tail()
        )
    }

    /// Pulls the plug: SIGKILL to QEMU, as a power cut is to the guest (whatever the guest had
    /// not yet written to its virtual disk is gone: its page cache, queued requests). Returns
    /// once QEMU is gone.
    pub fn power_cut(mut self) -> Result<()> {
        self.qemu.child.kill().context("killing QEMU")?;
        self.qemu
            .child
            .wait()
            .context("waiting for the killed QEMU")?;
        Ok(())
    }

    /// Kernel timestamp (seconds) of the first console line containing `needle`.
    pub fn kernel_time_of(&self, needle: &str) -> Option<f64> {
        self.output()
            .lines()
            .find(|l| l.contains(needle))
            .and_then(|l| {
                let inner = l.trim_start().strip_prefix('[')?.split(']').next()?;
                inner.trim().parse().ok()
            })
    }
}

fn tcp(port: u16) -> Result<TcpStream> {
    let stream =
        TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_secs(5))?;
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
    let stored = exchange(&mut s, b"set vmkey 0 0 5\r\nhello\r\n", |t| {
        t.ends_with("\r\n")
    })?;
    anyhow::ensure!(stored == "STORED\r\n", "set answered {stored:?}");
    let got = exchange(&mut s, b"get vmkey\r\n", |t| t.ends_with("END\r\n"))?;
    anyhow::ensure!(
        got == "VALUE vmkey 0 5\r\nhello\r\nEND\r\n",
        "get answered {got:?}"
    );
    Ok(())
}

fn http_put_get(port: u16) -> Result<()> {
    let mut s = tcp(port)?;
    let put = exchange(
        &mut s,
        b"PUT /vmobject HTTP/1.1\r\nHost: vm\r\nContent-Length: 5\r\n\r\nworld",
        |t| t.contains("\r\n\r\n"),
    )?;
    anyhow::ensure!(put.starts_with("HTTP/1.1 20"), "PUT answered {put:?}");
    let mut s = tcp(port)?;
    let get = exchange(&mut s, b"GET /vmobject HTTP/1.1\r\nHost: vm\r\n\r\n", |t| {
        t.contains("\r\n\r\n") && t.ends_with("world")
    })?;
    anyhow::ensure!(
        get.starts_with("HTTP/1.1 200") && get.ends_with("world"),
        "GET answered {get:?}"
    );
    Ok(())
}

/// The port answers nothing: the connection closes or times out without a memcache reply.
fn memcache_closed(port: u16) -> Result<()> {
    let Ok(mut s) = tcp(port) else { return Ok(()) };
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    match exchange(&mut s, b"version\r\n", |t| t.ends_with("\r\n")) {
        Ok(answer) if answer.starts_with("VERSION") => {
            bail!("port {port} serves memcache: {answer:?}")
        }
        _ => Ok(()),
    }
}

fn stat<'a>(stats: &'a str, key: &str) -> Option<&'a str> {
    stats
        .lines()
        .find_map(|l| l.trim().strip_prefix(&format!("STAT {key} ")))
}

/// The sockets the console's `net` lists as listening (TCP LISTEN and bound UDP sockets from the
/// guest kernel's /proc/net/{tcp,tcp6,udp,udp6}), as sorted `tcp 0.0.0.0:11211` strings.
fn listening_sockets(net: &str) -> Vec<String> {
    let mut out: Vec<String> = net
        .lines()
        .skip_while(|l| l.trim() != "listening:")
        .skip(1)
        .take_while(|l| l.trim() != "addresses:")
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|l| !l.is_empty())
        .collect();
    out.sort();
    out
}

/// `net` lists exactly `expected` listening sockets; returns the `net` output.
fn check_listening(vm: &mut Vm, expected: &[String]) -> Result<String> {
    let net = vm.command("net")?;
    anyhow::ensure!(
        net.contains("listening:") && net.contains("addresses:"),
        "`net` printed no socket table:\n{net}"
    );
    let got = listening_sockets(&net);
    let mut want = expected.to_vec();
    want.sort();
    anyhow::ensure!(
        got == want,
        "listening sockets are {got:?}, expected exactly {want:?}:\n{net}"
    );
    Ok(net)
}

/// The data ports of a `ringstore: ready memcache=IP:PORT http=IP:PORT` line, as the `net`
/// lines that must listen (`tcp IP:PORT`).
fn data_sockets(ready_line: &str) -> Vec<String> {
    ready_line
        .split_whitespace()
        .filter_map(|w| w.split_once('='))
        .filter(|(k, _)| matches!(*k, "memcache" | "http" | "udp"))
        .map(|(k, addr)| format!("{} {addr}", if k == "udp" { "udp" } else { "tcp" }))
        .collect()
}

/// The first console line that starts with `prefix`.
fn line_starting(vm: &Vm, prefix: &str) -> Option<String> {
    vm.output()
        .lines()
        .find(|l| l.starts_with(prefix))
        .map(str::to_string)
}

/// Every serving thread (named `ringstore-*`: workers, acceptors, UDP) shows CapEff and CapPrm 0
/// and no_new_privs 1 in the console's `threads` (the guest's /proc/self/task/*/status), there is
/// one worker per worker CPU, and PID 1's main thread still has capabilities (the reading is
/// real). Returns how many serving threads were checked.
fn check_serving_threads_unprivileged(vm: &mut Vm, workers: usize) -> Result<usize> {
    const NONE: &str = "0000000000000000";
    let out = vm.command("threads")?;
    // tid name capeff HEX capprm HEX nnp N
    let rows: Vec<Vec<&str>> = out
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|f| f.len() == 8 && f[2] == "capeff" && f[0].parse::<u32>().is_ok())
        .collect();
    let serving: Vec<&Vec<&str>> = rows
        .iter()
        .filter(|f| f[1].starts_with("ringstore-"))
        .collect();
    let worker_threads = serving
        .iter()
        .filter(|f| f[1].starts_with("ringstore-w"))
        .count();
    anyhow::ensure!(
        worker_threads == workers,
        "{worker_threads} worker threads for {workers} worker CPUs:\n{out}"
    );
    for f in &serving {
        anyhow::ensure!(
            f[3] == NONE && f[5] == NONE && f[7] == "1",
            "serving thread {} {} keeps privileges (capeff {}, capprm {}, nnp {}):\n{out}",
            f[0],
            f[1],
            f[3],
            f[5],
            f[7]
        );
    }
    let pid1 = rows.iter().find(|f| f[0] == "1");
    anyhow::ensure!(
        pid1.is_some_and(|f| f[3] != NONE),
        "PID 1's own thread shows no capabilities, so 0 proves nothing:\n{out}"
    );
    Ok(serving.len())
}

/// What the numa2 test measured.
#[derive(Debug, Clone)]
pub struct BootReport {
    /// Kernel timestamp of `Run /init as init process`.
    pub init_secs: Option<f64>,
    /// Wall time from starting QEMU to the ready line (firmware and QEMU start included).
    pub ready_wall: Duration,
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
    let ready_wall = vm.started.elapsed();
    vm.wait_for(PROMPT, ready, COMMAND_LIMIT)?;
    memcache_set_get(vm.port("memcache", 0)?)?;
    http_put_get(vm.port("http", 0)?)?;
    let stats = vm.command("stats")?;
    anyhow::ensure!(
        stat(&stats, "numa_node") == Some("1"),
        "stats numa_node is not 1:\n{stats}"
    );
    let mut cpus: Vec<&str> = stat(&stats, "worker_cpus")
        .unwrap_or("")
        .split(',')
        .collect();
    cpus.sort_unstable();
    anyhow::ensure!(
        cpus == ["2", "3"],
        "stats worker_cpus is not node 1's CPUs 2,3:\n{stats}"
    );
    let huge: u64 = stat(&stats, "hugepage_bytes")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    anyhow::ensure!(huge > 0, "stats hugepage_bytes is not positive:\n{stats}");
    anyhow::ensure!(
        stat(&stats, "worker_capeff") == Some("0000000000000000"),
        "stats worker_capeff is not 0:\n{stats}"
    );
    check_serving_threads_unprivileged(&mut vm, cpus.len())?;
    // DHCP (the default): the lease keeper holds its UDP socket on port 68 (bound to eth0) to
    // renew at T1 (ADR-0006); nothing else but the data ports may listen.
    let ready_line = line_starting(&vm, "ringstore: ready ").context("no ready line")?;
    let mut expected = data_sockets(&ready_line);
    expected.push("udp 0.0.0.0:68".into());
    check_listening(&mut vm, &expected)?;
    let irq = vm.command("irq")?;
    let rows: Vec<Vec<&str>> = irq
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|f| f.first().is_some_and(|n| n.parse::<u32>().is_ok()))
        .collect();
    let queues: Vec<&Vec<&str>> = rows
        .iter()
        .filter(|f| {
            f.iter()
                .any(|w| w.contains("input") || w.contains("output"))
        })
        .collect();
    anyhow::ensure!(!queues.is_empty(), "irq shows no NIC queue IRQs:\n{irq}");
    for row in &queues {
        anyhow::ensure!(
            row.get(1)
                .is_some_and(|cpus| cpus.split(',').all(|c| c == "2" || c == "3")),
            "NIC queue IRQ not on a worker CPU: {row:?}\n{irq}"
        );
    }
    let ready_secs = vm.kernel_time_of("ringstore: serving:");
    let init_secs = vm.kernel_time_of("Run /init as init process");
    let poweroff = vm.poweroff()?;
    Ok(BootReport {
        init_secs,
        ready_wall,
        ready_secs,
        poweroff,
    })
}

/// The peer's and the guest's address on the scan test's /30 link (inside its own namespace).
const SCAN_PEER: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);
const SCAN_GUEST: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 2);
const SCAN_LIMITS: portscan::Limits = portscan::Limits {
    threads: 64,
    connect: Duration::from_secs(3),
    retry_connect: Duration::from_secs(5),
    total: Duration::from_secs(60),
};

/// What the scan test measured.
#[derive(Debug, Clone)]
pub struct ScanReport {
    pub open: Vec<u16>,
    pub scan: Duration,
    /// The guest's IPv6 link-local address, scanned too.
    pub link_local: Ipv6Addr,
    pub open_v6: Vec<u16>,
    pub scan_v6: Duration,
}

/// TCP ports of the `tcp IP:PORT` entries in `sockets` with an IPv6 (`v6`) or IPv4 address.
fn tcp_ports(sockets: &[String], v6: bool) -> Vec<u16> {
    let mut ports: Vec<u16> = sockets
        .iter()
        .filter_map(|s| s.strip_prefix("tcp "))
        .filter_map(|a| a.parse::<std::net::SocketAddr>().ok())
        .filter(|a| a.is_ipv6() == v6)
        .map(|a| a.port())
        .collect();
    ports.sort_unstable();
    ports.dedup();
    ports
}

/// The first IPv6 link-local address `net` lists for `interface`.
fn link_local(net: &str, interface: &str) -> Option<Ipv6Addr> {
    net.lines()
        .filter_map(|l| {
            l.trim()
                .strip_prefix(interface)?
                .trim()
                .parse::<Ipv6Addr>()
                .ok()
        })
        .find(|a| a.segments()[0] & 0xffc0 == 0xfe80)
}

/// numa2 layout with its NIC on a tap in a namespace of our own and a static `ip=`: a TCP connect
/// scan of every port 1-65535 from the peer finds exactly the data ports of the ready line open
/// on the guest's IPv4 address (every other port refuses) and none but IPv6 data ports on its
/// IPv6 link-local address, and `net` lists only the data sockets (no DHCP socket with ip=).
pub fn scan_finds_only_data_ports(image: &Image) -> Result<ScanReport> {
    let mut ns = netns::Netns::create()?;
    let tap_index = ns.add_tap("rstap0", SCAN_PEER, 30)?;
    let append = format!("ip={SCAN_GUEST}::{SCAN_PEER}:255.255.255.252::eth0:off");
    // Declared after `ns`: dropped (QEMU killed) before the namespace and tap are deleted.
    let mut vm = Vm::boot_in(image, "scan", "numa2-tap", &append, Some(&ns), &[])?;
    let ready = vm.wait_for("ringstore: ready memcache=", 0, BOOT_LIMIT)?;
    vm.wait_for(PROMPT, ready, COMMAND_LIMIT)?;
    let status = vm.command("status")?;
    let address = format!("address eth0 {SCAN_GUEST}/30 via {SCAN_PEER}");
    anyhow::ensure!(
        status.contains(&address) && status.contains("numa_node 1"),
        "status lacks {address:?} or numa_node 1:\n{status}"
    );
    let ready_line = line_starting(&vm, "ringstore: ready ").context("no ready line")?;
    let data = data_sockets(&ready_line);
    let data_ports = tcp_ports(&data, false);
    anyhow::ensure!(data_ports == [8080, 11211], "the ready line's IPv4 TCP ports are {data_ports:?}, not the defaults 8080 and 11211: {ready_line}");
    // Only the data sockets, and no DHCP client socket: ip= is static.
    let net = check_listening(&mut vm, &data)?;
    let link_local = link_local(&net, "eth0")
        .with_context(|| format!("`net` shows no IPv6 link-local address on eth0:\n{net}"))?;

    let scan_from_peer = |target: IpAddr, scope: u32| -> Result<(portscan::Scan, Duration)> {
        let started = Instant::now();
        let scan = portscan::scan_tcp(Some(&ns.path()), target, scope, 1..=65535, SCAN_LIMITS)
            .with_context(|| format!("scanning {target} from namespace {}", ns.name()))?;
        anyhow::ensure!(
            scan.scanned == 65535,
            "{target}: scanned {} ports, not 65535",
            scan.scanned
        );
        anyhow::ensure!(
            scan.unanswered.is_empty(),
            "{target}: ports neither open nor refused: {:?}",
            scan.unanswered
        );
        Ok((scan, started.elapsed()))
    };
    let (v4, scan) = scan_from_peer(SCAN_GUEST.into(), 0)?;
    anyhow::ensure!(
        v4.open == data_ports,
        "open TCP ports on {SCAN_GUEST}: {:?}, expected exactly the data ports {data_ports:?}",
        v4.open
    );
    let (v6, scan_v6) = scan_from_peer(link_local.into(), tap_index)?;
    let data_ports_v6 = tcp_ports(&data, true);
    anyhow::ensure!(v6.open == data_ports_v6, "open TCP ports on {link_local}: {:?}, expected exactly the IPv6 data ports {data_ports_v6:?}", v6.open);

    check_listening(&mut vm, &data)?;
    let status = vm.command("status")?;
    anyhow::ensure!(
        status
            .lines()
            .any(|l| l.trim_start().starts_with("serving ")),
        "not serving after the scan:\n{status}"
    );
    vm.poweroff()?;
    Ok(ScanReport {
        open: v4.open,
        scan,
        link_local,
        open_v6: v6.open,
        scan_v6,
    })
}

/// twonic without ringstore.numa: the NUMA error names the interfaces, nothing listens.
pub fn twonic_refuses_without_numa(image: &Image) -> Result<()> {
    let mut vm = Vm::boot(image, "twonic-auto", "twonic", "")?;
    let at = vm.wait_for("cannot choose a NUMA node", 0, BOOT_LIMIT)?;
    let line_end = vm.wait_for("\n", at, COMMAND_LIMIT)?;
    let out = vm.output();
    let line = &out[out[..at].rfind('\n').map_or(0, |i| i + 1)..line_end];
    anyhow::ensure!(
        line.contains("eth0") && line.contains("eth1") && line.contains("numa"),
        "the error does not list the interfaces: {line}"
    );
    vm.wait_for(PROMPT, at, COMMAND_LIMIT)?;
    for nic in 0..2 {
        memcache_closed(vm.port("memcache", nic)?)?;
    }
    let status = vm.command("status")?;
    anyhow::ensure!(
        status.contains("not serving"),
        "status does not say it is not serving:\n{status}"
    );
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
    anyhow::ensure!(
        stat(&stats, "numa_node") == Some("1"),
        "stats numa_node is not 1:\n{stats}"
    );
    vm.poweroff()?;
    Ok(())
}

/// A kernel panic (no init) ends QEMU and the wait fails quickly instead of hanging.
pub fn kernel_panic_fails_the_wait(image: &Image) -> Result<()> {
    let mut vm = Vm::boot(
        image,
        "panic",
        "single",
        "rdinit=/nonexistent init=/nonexistent",
    )?;
    let started = Instant::now();
    match vm.wait_for("ringstore: ready", 0, BOOT_LIMIT) {
        Ok(_) => bail!("booted without an init?"),
        Err(err) if err.to_string().contains("QEMU exited") => {
            anyhow::ensure!(
                vm.output().contains("Kernel panic"),
                "QEMU exited without a kernel panic"
            );
            anyhow::ensure!(
                started.elapsed() < Duration::from_secs(120),
                "took {:?}",
                started.elapsed()
            );
            Ok(())
        }
        Err(err) => Err(err),
    }
}

type TestFn = fn(&Image) -> Result<String>;

/// Every QEMU test by name.
pub fn tests() -> Vec<(&'static str, TestFn)> {
    vec![
        ("numa2_serves", |i| {
            numa2_serves(i).map(|r| format!(
                "/init at {:?} s, ready at {:?} s kernel time ({:.1} s after QEMU started), poweroff in {:.1} s",
                r.init_secs,
                r.ready_secs,
                r.ready_wall.as_secs_f64(),
                r.poweroff.as_secs_f64()
            ))
        }),
        ("scan_finds_only_data_ports", |i| {
            scan_finds_only_data_ports(i).map(|r| {
                format!(
                    "IPv4 open {:?} (65535 ports in {:.1} s), {} open {:?} (in {:.1} s)",
                    r.open,
                    r.scan.as_secs_f64(),
                    r.link_local,
                    r.open_v6,
                    r.scan_v6.as_secs_f64()
                )
            })
        }),
        ("twonic_refuses_without_numa", |i| {
            twonic_refuses_without_numa(i).map(|()| String::new())
        }),
        ("twonic_serves_with_numa1", |i| {
            twonic_serves_with_numa1(i).map(|()| String::new())
        }),
        ("kernel_panic_fails_the_wait", |i| {
            kernel_panic_fails_the_wait(i).map(|()| String::new())
        }),
        ("durable_writes_survive_power_cut", |i| {
            durable::acknowledged_writes_survive_power_cut_and_poweroff(i).map(|r| format!(
                "{} sets acknowledged in {:.1} s before the cut, {} live keys checked after the third boot; [{}] [{}] [{}]",
                r.acked_before_cut,
                r.load.as_secs_f64(),
                r.live_keys,
                r.scan_line,
                r.checkpoint_line,
                r.from_checkpoint_line
            ))
        }),
        ("foreign_data_device_is_refused", |i| {
            durable::foreign_data_device_is_refused(i)
        }),
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
            Ok(note) => eprintln!(
                "vm test {name}: ok in {:.1} s {note}",
                started.elapsed().as_secs_f64()
            ),
            Err(err) => {
                eprintln!(
                    "vm test {name}: FAILED in {:.1} s: {err:#}",
                    started.elapsed().as_secs_f64()
                );
                failed.push(name);
            }
        }
    }
    if !failed.is_empty() {
        bail!("QEMU tests failed: {}", failed.join(", "));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn net_output_gives_the_listening_sockets() {
        let net = "net\nlistening:\n  tcp  0.0.0.0:8080\n  tcp  0.0.0.0:11211\n  udp  0.0.0.0:68\naddresses:\n  lo 127.0.0.1\n  eth0 10.0.2.15\n";
        assert_eq!(
            listening_sockets(net),
            ["tcp 0.0.0.0:11211", "tcp 0.0.0.0:8080", "udp 0.0.0.0:68"]
        );
        assert!(listening_sockets("addresses:\n  lo 127.0.0.1\n").is_empty());
    }

    #[test]
    fn ready_line_gives_the_data_sockets() {
        assert_eq!(
            data_sockets("ringstore: ready memcache=0.0.0.0:11211 http=0.0.0.0:8080"),
            ["tcp 0.0.0.0:11211", "tcp 0.0.0.0:8080"]
        );
        assert_eq!(
            data_sockets("ringstore: ready memcache=10.0.0.1:1 udp=10.0.0.1:2"),
            ["tcp 10.0.0.1:1", "udp 10.0.0.1:2"]
        );
        let sockets = data_sockets(
            "ringstore: ready memcache=0.0.0.0:11211 http=[::]:8080 udp=0.0.0.0:11211",
        );
        assert_eq!(tcp_ports(&sockets, false), [11211]);
        assert_eq!(tcp_ports(&sockets, true), [8080]);
    }

    #[test]
    fn link_local_address_from_net() {
        let net = "addresses:\n  lo ::1\n  eth0 10.77.0.2\n  eth0 2001:db8::2\n  eth0 fe80::5054:ff:fe12:3456\n";
        assert_eq!(
            link_local(net, "eth0"),
            Some("fe80::5054:ff:fe12:3456".parse().unwrap())
        );
        assert_eq!(link_local(net, "lo"), None);
    }
}
