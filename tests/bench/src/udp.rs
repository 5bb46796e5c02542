//! `cargo xtask bench --only udp`: memcache UDP GET of a 100-byte value through memcached -U,
//! ringstore's kernel UDP and ringstore's AF_XDP, over a veth pair whose far end is in a
//! network namespace of its own. One client for all (a closed loop of `WINDOW` requests in
//! flight on each of `SOCKETS` UDP sockets, epoll + `recvmmsg`/`sendmmsg`, in the namespace,
//! on the client CPU); every server on the server CPU. Reports requests/s, p50/p99 and server
//! CPU seconds per million requests: the process's CPU time plus the softirq time of the
//! server CPU (where AF_XDP's and the kernel's transmit work runs).

use std::fs::File;
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::os::fd::{AsFd, AsRawFd};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use ringstore_sys::Transfer;

use super::doc::{mark, Doc};
use super::hist::Histogram;
use super::options::Options;
use super::procs::{self, CoreTicks, SERVER_CPU};
use super::subject::Subject;
use super::WARMUP;
use ringstore_testkit::ip;

/// Client sockets (distinct source ports, so distinct flows), all on the client CPU.
const SOCKETS: usize = 4;
/// Requests in flight per client socket.
const WINDOW: usize = 32;
/// How long the client waits in epoll before it looks for stalled sockets.
const LOST_CHECK_MS: u64 = 20;
/// A reply not seen within this is counted lost and its slot reused.
const LOST_AFTER: Duration = Duration::from_millis(200);
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

/// What one closed-loop run measured.
struct Load {
    done: u64,
    lost: u64,
    hist: Histogram,
    elapsed: Duration,
}

/// One client socket and when it last heard back.
struct ClientSocket {
    sock: UdpSocket,
    last_reply: Instant,
}

/// The request ids in flight: when each was sent and on which socket (by index).
struct InFlight {
    sent: Vec<Option<(Instant, usize)>>,
    next_id: u16,
}

impl InFlight {
    /// A GET of the bench key under a fresh id for socket `socket`, stamped now.
    fn request(&mut self, socket: usize) -> [u8; GET_LEN] {
        self.next_id = self.next_id.wrapping_add(1);
        let mut d = [0u8; GET_LEN];
        d[..2].copy_from_slice(&self.next_id.to_be_bytes());
        d[2..8].copy_from_slice(&[0, 0, 0, 1, 0, 0]);
        d[8..].copy_from_slice(GET);
        self.sent[usize::from(self.next_id)] = Some((Instant::now(), socket));
        d
    }
}

const GET: &[u8] = b"get bench\r\n";
/// A request datagram: the 8-byte frame header and `GET`.
const GET_LEN: usize = 8 + GET.len();

/// Sends `count` fresh GETs on socket `index` (one `sendmmsg` per [`SENDMMSG_MAX`]).
fn send_batch(
    socket: &mut ClientSocket,
    index: usize,
    count: usize,
    to: SocketAddr,
    flight: &mut InFlight,
) -> Result<()> {
    let mut left = count;
    while left > 0 {
        let n = left.min(ringstore_sys::SENDMMSG_MAX);
        let requests: Vec<[u8; GET_LEN]> = (0..n).map(|_| flight.request(index)).collect();
        let datagrams: Vec<(SocketAddr, &[u8])> =
            requests.iter().map(|r| (to, r.as_slice())).collect();
        // A full socket buffer (WouldBlock, or fewer sent): those not sent stay in flight and
        // count as lost once the socket stalls (LOST_AFTER), which refills its window.
        if ringstore_sys::sendmmsg_nowait(socket.sock.as_raw_fd(), &datagrams) == Transfer::Failed {
            bail!("sendmmsg failed: {}", std::io::Error::last_os_error());
        }
        left -= n;
    }
    Ok(())
}

/// The client: joins the namespace, pins itself, keeps `WINDOW` GETs in flight on each of
/// `SOCKETS` sockets for `warmup + measure` (epoll, `recvmmsg`, one `sendmmsg` of the
/// replacements per burst); returns what it saw after the warm-up.
fn client(ns: &str, to: SocketAddr, warmup: Duration, measure: Duration) -> Result<Load> {
    let file = File::open(format!("/run/netns/{ns}"))?;
    rustix::thread::move_into_link_name_space(
        file.as_fd(),
        Some(rustix::thread::LinkNameSpaceType::Network),
    )
    .map_err(std::io::Error::from)
    .context("setns into the bench namespace")?;
    procs::pin_current_thread(procs::CLIENT_CPU)?;
    procs::raise_own_priority();
    let mut epoll = ringstore_sys::Epoll::new(SOCKETS)?;
    let mut sockets = Vec::with_capacity(SOCKETS);
    for key in 0..SOCKETS {
        let sock = UdpSocket::bind((CLIENT_IP, 0))?;
        sock.set_nonblocking(true)?;
        epoll.add(
            sock.as_raw_fd(),
            key as u64,
            ringstore_sys::Watch::LevelRead,
        )?;
        sockets.push(ClientSocket {
            sock,
            last_reply: Instant::now(),
        });
    }
    let mut flight = InFlight {
        sent: vec![None; 1 << 16],
        next_id: 0,
    };
    for (index, socket) in sockets.iter_mut().enumerate() {
        send_batch(socket, index, WINDOW, to, &mut flight)?;
    }
    let start = Instant::now();
    let measure_from = start + warmup;
    let end = measure_from + measure;
    let mut load = Load {
        done: 0,
        lost: 0,
        hist: Histogram::default(),
        elapsed: measure,
    };
    let mut batch = ringstore_sys::RecvBatch::new(ringstore_sys::RECVMMSG_MAX, 2048);
    let mut ready = Vec::with_capacity(SOCKETS);
    while Instant::now() < end {
        ready.clear();
        epoll.wait(LOST_CHECK_MS, &mut ready)?;
        for r in &ready {
            let index = usize::try_from(r.key).unwrap_or(usize::MAX);
            let Some(socket) = sockets.get_mut(index) else {
                continue;
            };
            let answered = drain(socket, &mut batch, &mut flight, &mut load, measure_from)?;
            send_batch(socket, index, answered, to, &mut flight)?;
        }
        refill_stalled(&mut sockets, to, &mut flight, &mut load)?;
    }
    Ok(load)
}

/// Reads every reply waiting on `socket`; returns how many answered a request in flight.
fn drain(
    socket: &mut ClientSocket,
    batch: &mut ringstore_sys::RecvBatch,
    flight: &mut InFlight,
    load: &mut Load,
    measure_from: Instant,
) -> Result<usize> {
    let mut answered = 0;
    loop {
        match ringstore_sys::recvmmsg_nowait(socket.sock.as_raw_fd(), batch) {
            Transfer::Done(_) => {}
            Transfer::WouldBlock => return Ok(answered),
            Transfer::Failed => bail!("recvmmsg failed: {}", std::io::Error::last_os_error()),
        }
        let now = Instant::now();
        for (_, d) in batch.datagrams() {
            if d.len() < 8 {
                continue;
            }
            let id = usize::from(u16::from_be_bytes([d[0], d[1]]));
            if let Some((at, _)) = flight.sent[id].take() {
                socket.last_reply = now;
                answered += 1;
                if now >= measure_from {
                    load.done += 1;
                    load.hist.record(super::hist::nanos(now.duration_since(at)));
                }
            }
        }
    }
}

/// A socket that heard nothing for `LOST_AFTER` has lost what it had in flight: counted,
/// forgotten, and its window sent afresh.
fn refill_stalled(
    sockets: &mut [ClientSocket],
    to: SocketAddr,
    flight: &mut InFlight,
    load: &mut Load,
) -> Result<()> {
    for (index, socket) in sockets.iter_mut().enumerate() {
        if socket.last_reply.elapsed() <= LOST_AFTER {
            continue;
        }
        for entry in flight.sent.iter_mut() {
            if entry.is_some_and(|(_, owner)| owner == index) {
                *entry = None;
                load.lost += 1;
            }
        }
        socket.last_reply = Instant::now();
        send_batch(socket, index, WINDOW, to, flight)?;
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
    let to = SocketAddr::from((SERVER_IP.parse::<std::net::Ipv4Addr>()?, server.udp));
    let ns = ns.to_string();
    let measure = Duration::from_secs(seconds);
    let pid = server.pid;
    // CPU readings at the start and end of the measured window (after the warm-up).
    let handle = std::thread::spawn(move || client(&ns, to, WARMUP, measure));
    std::thread::sleep(WARMUP);
    let (cpu0, ticks0) = (
        procs::process_cpu_seconds(pid)?,
        CoreTicks::read(SERVER_CPU)?,
    );
    let t0 = Instant::now();
    std::thread::sleep(measure);
    let (cpu1, ticks1) = (
        procs::process_cpu_seconds(pid)?,
        CoreTicks::read(SERVER_CPU)?,
    );
    let wall = t0.elapsed().as_secs_f64();
    let load = handle
        .join()
        .map_err(|_| anyhow::anyhow!("the UDP client panicked"))??;
    if load.done == 0 {
        bail!("{}: no UDP replies ({} lost)", server.name, load.lost);
    }
    let per_m = 1e6 / load.done as f64;
    let softirq_s = ticks0.softirq_percent_until(&ticks1) / 100.0 * wall;
    Ok(Row {
        name: server.name,
        rps: load.done as f64 / load.elapsed.as_secs_f64(),
        p50_us: load.hist.quantile(0.5) as f64 / 1e3,
        p99_us: load.hist.quantile(0.99) as f64 / 1e3,
        lost: load.lost,
        process_s_per_m: (cpu1 - cpu0) * per_m,
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
        "(client: {SOCKETS} UDP sockets in netns {} at {CLIENT_IP}, {WINDOW} GETs in flight on each, epoll + recvmmsg/sendmmsg, nice {} on CPU {}; servers at {SERVER_IP} on veth {}, ethtool -K peer tx off)",
        veth.ns,
        procs::BENCH_NICE,
        procs::CLIENT_CPU,
        veth.a
    ));
    Ok(())
}
