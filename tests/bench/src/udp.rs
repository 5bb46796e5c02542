//! `cargo xtask bench --only udp`: memcache UDP GET of a 100-byte value through memcached -U,
//! ringstore's kernel UDP and ringstore's AF_XDP, over a veth pair whose far end is in a
//! network namespace of its own. One client for all (the load generator's UDP mode: batches of
//! `WINDOW` GETs, a datagram each, on each of `SOCKETS` connected UDP sockets, in the
//! namespace, on the client CPU); every server on the server CPU. Reports requests/s, p50/p99 and server
//! CPU seconds per million requests: the process's CPU time plus the softirq time of the
//! server CPU (where AF_XDP's and the kernel's transmit work runs).

use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::client::{self, LoadSpec, Mode};
use super::doc::{mark, Doc};
use super::options::Options;
use super::procs::{self, SERVER_CPU};
use super::subject::Subject;
use super::WARMUP;
use ringstore_testkit::ip;

/// Client sockets (distinct source ports, so distinct flows), all on the client CPU.
const SOCKETS: usize = 4;
/// Requests in flight per client socket (one batch; a reply missing 200 ms after the batch
/// went out counts lost and the socket's next batch goes).
const WINDOW: usize = 32;
const VALUE_LEN: usize = 100;
const SERVER_IP: &str = "10.79.250.1";
const CLIENT_IP: &str = "10.79.250.2";

/// The veth pair: `a` here (the servers), `b` in the namespace (the client); removed on drop.
struct Veth {
    a: String,
    ns: String,
}

impl Veth {
    fn create() -> Result<Veth> {
        let pid = std::process::id();
        let v = Veth {
            a: format!("rsbench{}a", pid % 100_000),
            ns: format!("rs-bench-{pid}"),
        };
        let b = format!("rsbench{}b", pid % 100_000);
        ip(&["netns", "add", &v.ns])?;
        ip(&["link", "add", &v.a, "type", "veth", "peer", "name", &b])?;
        ip(&["link", "set", &b, "netns", &v.ns])?;
        ip(&["addr", "add", &format!("{SERVER_IP}/24"), "dev", &v.a])?;
        ip(&["link", "set", &v.a, "up"])?;
        ip(&[
            "-n",
            &v.ns,
            "addr",
            "add",
            &format!("{CLIENT_IP}/24"),
            "dev",
            &b,
        ])?;
        ip(&["-n", &v.ns, "link", "set", &b, "up"])?;
        // Full UDP checksums from the sender (veth would leave partial ones).
        crate::util::exec(
            Command::new("ip")
                .args(["netns", "exec", &v.ns, "ethtool", "-K", &b, "tx", "off"])
                .stdout(Stdio::null()),
        )?;
        Ok(v)
    }
}

impl Drop for Veth {
    fn drop(&mut self) {
        let _ = ip(&["link", "del", &self.a]);
        let _ = ip(&["netns", "del", &self.ns]);
    }
}

/// A server under test: its pid, UDP port, TCP port; killed on drop.
struct UdpServer {
    name: &'static str,
    pid: u32,
    udp: u16,
    tcp: u16,
    command: String,
    _child: Option<Child>,
    _ringstore: Option<procs::Pinned>,
}

impl Drop for UdpServer {
    fn drop(&mut self) {
        if let Some(child) = &mut self._child {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn memcached() -> Result<UdpServer> {
    let port = procs::free_port()?;
    let mut cmd = Command::new("taskset");
    cmd.args(["-c", &SERVER_CPU.to_string(), "memcached", "-t", "1"])
        .args(["-U", &port.to_string(), "-p", &port.to_string()])
        .args(["-l", SERVER_IP, "-m", "64", "-u", "root"]);
    let command = procs::command_line(&cmd);
    let child = cmd
        .stdin(Stdio::null())
        .spawn()
        .context("starting memcached")?;
    let pid = child.id();
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect((SERVER_IP, port)).is_err() {
        if Instant::now() > deadline {
            bail!("memcached did not listen on {port}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    procs::raise_priority(pid);
    Ok(UdpServer {
        name: "memcached -U",
        pid,
        udp: port,
        tcp: port,
        command,
        _child: Some(child),
        _ringstore: None,
    })
}

fn ringstore(binary: &std::path::Path, name: &'static str, xdp: Option<&str>) -> Result<UdpServer> {
    let port = procs::free_port()?;
    let memcache = format!("{SERVER_IP}:0");
    let udp = format!("0.0.0.0:{port}");
    let mut more = vec!["--memcache", &memcache, "--udp", &udp];
    if let Some(interface) = xdp {
        more.extend(["--xdp", interface]);
    }
    let pinned = procs::start_ringstore_with(binary, 64, &more)?;
    Ok(UdpServer {
        name,
        pid: pinned.pid(),
        udp: port,
        tcp: pinned.port,
        command: pinned.command.clone(),
        _child: None,
        _ringstore: Some(pinned),
    })
}

/// Stores the benchmark's value over TCP.
fn preload(tcp: u16) -> Result<()> {
    use std::io::{Read, Write};
    let mut c = TcpStream::connect((SERVER_IP, tcp))?;
    c.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut req = format!("set bench 0 0 {VALUE_LEN}\r\n").into_bytes();
    req.extend(std::iter::repeat_n(b'v', VALUE_LEN));
    req.extend_from_slice(b"\r\n");
    c.write_all(&req)?;
    let mut reply = [0u8; 64];
    let n = c.read(&mut reply)?;
    if !reply[..n].starts_with(b"STORED") {
        bail!("preload: {:?}", String::from_utf8_lossy(&reply[..n]));
    }
    Ok(())
}

/// One measured server: results and its CPU use.
struct Row {
    name: &'static str,
    rps: f64,
    p50_us: f64,
    p99_us: f64,
    lost: u64,
    process_s_per_m: f64,
    softirq_s_per_m: f64,
}

fn measure(server: &UdpServer, ns: &str, seconds: u64) -> Result<Row> {
    preload(server.tcp)?;
    let to = SocketAddr::from((SERVER_IP.parse::<Ipv4Addr>()?, server.udp));
    let spec = LoadSpec {
        port: server.udp,
        mode: Mode::Udp {
            from: CLIENT_IP.parse::<Ipv4Addr>()?.into(),
            to,
        },
        depth: WINDOW,
        conns: SOCKETS,
        keyspace: 1,
        warmup: WARMUP,
        measure: Duration::from_secs(seconds),
        slices: 1,
        server_pid: server.pid,
    };
    let load = client::run_in_netns(ns, &[spec])?
        .pop()
        .context("one result")?;
    if load.requests == 0 {
        bail!("{}: no UDP replies ({} lost)", server.name, load.lost);
    }
    let per_m = 1e6 / load.requests as f64;
    // The server CPU's softirq share over the measured window (AF_XDP's and the kernel's
    // transmit work runs there).
    let softirq_s = load.server_core.softirq_percent / 100.0 * load.seconds;
    Ok(Row {
        name: server.name,
        rps: load.throughput(),
        p50_us: load.p50_us(),
        p99_us: load.p99_us(),
        lost: load.lost,
        process_s_per_m: load.server_cpu_seconds * per_m,
        softirq_s_per_m: softirq_s * per_m,
    })
}

pub(super) fn udp_part(o: &Options, subject: &Subject, doc: &mut Doc) -> Result<()> {
    let Subject::Ringstore(binary) = subject else {
        doc.note("udp: skipped under --self-check".into());
        return Ok(());
    };
    if !crate::util::is_root() || !crate::util::have("ethtool") {
        doc.note("udp: skipped (needs root, iproute2 and ethtool)".into());
        return Ok(());
    }
    let veth = Veth::create()?;
    let mut rows = Vec::new();
    let mut commands = Vec::new();
    for which in 0..3 {
        let server = match which {
            0 => memcached()?,
            1 => ringstore(binary, "ringstore kernel UDP", None)?,
            _ => ringstore(binary, "ringstore AF_XDP (veth, copy mode)", Some(&veth.a))?,
        };
        commands.push(server.command.clone());
        eprintln!("bench: udp {}", server.name);
        rows.push(measure(&server, &veth.ns, o.seconds)?);
    }
    let mut md = String::from(
        "## memcache UDP GET, 100-byte value, over veth (one server core each)\n\n\
         | server | requests/s | p50 µs | p99 µs | lost | process CPU s / 1M | + softirq of the server CPU s / 1M | total s / 1M | requests per server CPU-second |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for r in &rows {
        let total = r.process_s_per_m + r.softirq_s_per_m;
        md.push_str(&format!(
            "| {} | {:.0} | {:.1} | {:.1} | {} | {:.2} | {:.2} | {:.2} | {:.0} |\n",
            r.name,
            r.rps,
            r.p50_us,
            r.p99_us,
            r.lost,
            r.process_s_per_m,
            r.softirq_s_per_m,
            total,
            if total > 0.0 { 1e6 / total } else { 0.0 }
        ));
    }
    doc.sections.push(md);
    let per_cpu = |r: &Row| {
        let total = r.process_s_per_m + r.softirq_s_per_m;
        if total > 0.0 {
            1e6 / total
        } else {
            0.0
        }
    };
    let base = per_cpu(&rows[0]).max(1.0);
    let (kernel, xdp) = (per_cpu(&rows[1]) / base, per_cpu(&rows[2]) / base);
    doc.targets.push(format!(
        "UDP GET per server CPU-second: kernel UDP {kernel:.2}x memcached (target 1.8x: {}), AF_XDP {xdp:.2}x (target 1.8x: {})",
        mark(kernel >= 1.8),
        mark(xdp >= 1.8)
    ));
    doc.note(
        "udp: copy mode on veth understates AF_XDP on a real NIC (zero-copy, no skb on receive); \
         veth also does its receive work in softirq on the *sender's* CPU, so the server CPU's \
         softirq mostly holds transmit work (the load lines above say how busy the machine was)"
            .into(),
    );
    for c in commands {
        doc.command(&c);
    }
    doc.command(&format!(
        "(client: tests/bench/src/client/ UDP mode, {SOCKETS} UDP sockets in netns {} at {CLIENT_IP}, batches of {WINDOW} GETs in flight on each, one io_uring, nice {} on CPU {}; servers at {SERVER_IP} on veth {}, ethtool -K peer tx off)",
        veth.ns,
        procs::BENCH_NICE,
        procs::CLIENT_CPU,
        veth.a
    ));
    Ok(())
}
