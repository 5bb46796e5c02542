//! The AF_XDP QEMU test: the guest's two-queue virtio-net on a tap in a namespace of our own,
//! `ringstore.xdp=eth0`: the appliance attaches the steering program natively, the console's
//! `net` shows the mode and the queue→worker map, memcache UDP from the peer is answered
//! through it, and a TCP scan of every port still finds only the data ports.

use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::console::{check_listening, data_sockets, ready_line, tcp_ports};
use super::scan::SCAN_LIMITS;
use super::vm::Vm;
use super::{netns, portscan, BOOT_LIMIT, COMMAND_LIMIT, PROMPT};
use crate::image::Image;

const PEER: Ipv4Addr = Ipv4Addr::new(10, 78, 0, 1);
const GUEST: Ipv4Addr = Ipv4Addr::new(10, 78, 0, 2);

/// What the test saw.
#[derive(Debug, Clone)]
pub struct XdpReport {
    /// The console's `xdp:` lines.
    pub xdp_lines: Vec<String>,
    pub open: Vec<u16>,
    pub udp_round_trip: Duration,
}

/// One memcache UDP request (frame header: id, sequence 0, count 1) and its whole reply,
/// reassembled from its datagrams; bounded by `limit`.
fn udp_request(sock: &UdpSocket, to: SocketAddr, id: u16, request: &[u8]) -> Result<Vec<u8>> {
    let mut datagram = Vec::with_capacity(8 + request.len());
    datagram.extend_from_slice(&id.to_be_bytes());
    datagram.extend_from_slice(&[0, 0, 0, 1, 0, 0]);
    datagram.extend_from_slice(request);
    sock.send_to(&datagram, to)
        .context("sending a UDP request")?;
    let mut parts: Vec<Option<Vec<u8>>> = Vec::new();
    let mut buf = [0u8; 2048];
    while parts.is_empty() || parts.iter().any(Option::is_none) {
        let (n, _) = sock.recv_from(&mut buf).context("no UDP reply")?;
        if n < 8 || u16::from_be_bytes([buf[0], buf[1]]) != id {
            continue;
        }
        let seq = usize::from(u16::from_be_bytes([buf[2], buf[3]]));
        let count = usize::from(u16::from_be_bytes([buf[4], buf[5]]));
        if count == 0 || seq >= count || count > 64 {
            bail!("a reply datagram numbered {seq} of {count}");
        }
        parts.resize(count, None);
        parts[seq] = Some(buf[8..n].to_vec());
    }
    Ok(parts.into_iter().flatten().flatten().collect())
}

pub fn xdp_serves_udp_on_virtio_mq(image: &Image) -> Result<XdpReport> {
    let mut ns = netns::Netns::create()?;
    ns.add_tap_with("rsxdp0", PEER, 30, true)?;
    // The peer sends full checksums (no partial ones a frame backend would refuse).
    let _ = ns
        .command("ethtool")
        .args(["-K", "rsxdp0", "tx", "off"])
        .output();
    let append = format!(
        "ip={GUEST}::{PEER}:255.255.255.252::eth0:off ringstore.udp=0.0.0.0:11211 ringstore.xdp=eth0"
    );
    // Declared after `ns`: dropped (QEMU killed) before the namespace and tap are deleted.
    let mut vm = Vm::boot_in(image, "xdp", "xdp-mq", &append, Some(&ns), &[])?;
    let ready = vm.wait_for("ringstore: ready memcache=", 0, BOOT_LIMIT)?;
    vm.wait_for(PROMPT, ready, COMMAND_LIMIT)?;
    let ready_line = ready_line(&vm.output()).context("no ready line")?;
    let data = data_sockets(&ready_line);
    let net = check_listening(&mut vm, &data)?;
    let xdp_lines: Vec<String> = net
        .lines()
        .skip_while(|l| l.trim() != "xdp:")
        .map(|l| l.trim().to_string())
        .collect();
    let mode_ok = xdp_lines
        .iter()
        .any(|l| l.starts_with("eth0: xdp-") && l.contains("2 queue(s)"));
    let map_ok = (0..2).all(|q| {
        xdp_lines
            .iter()
            .any(|l| l.starts_with(&format!("eth0 queue {q} -> worker ")))
    });
    if !mode_ok || !map_ok {
        bail!("`net` lacks the XDP mode or the queue map for eth0's two queues:\n{net}");
    }
    // PID 1 pins queue q's IRQs to worker q mod 2, and each socket follows its IRQ.
    for q in 0..2 {
        let want = format!("eth0 queue {q} -> worker {q} (cpu {q}, irq)");
        if !xdp_lines.contains(&want) {
            bail!("`net` lacks {want:?}:\n{net}");
        }
    }

    // memcache UDP from the peer, on a thread inside the namespace.
    let to = SocketAddr::from((GUEST, 11211));
    let ns_path = ns.path();
    let udp = std::thread::scope(|s| {
        s.spawn(|| -> Result<Duration> {
            portscan::enter(Some(&ns_path))?;
            let sock = UdpSocket::bind((PEER, 0)).context("binding the UDP client")?;
            sock.set_read_timeout(Some(Duration::from_secs(10)))?;
            let set = udp_request(&sock, to, 1, b"set xdpkey 0 0 5\r\nhello\r\n")?;
            anyhow::ensure!(set == b"STORED\r\n", "set over UDP: {set:?}");
            let started = Instant::now();
            let got = udp_request(&sock, to, 2, b"get xdpkey\r\n")?;
            let took = started.elapsed();
            anyhow::ensure!(
                got == b"VALUE xdpkey 0 5\r\nhello\r\nEND\r\n",
                "get over UDP: {:?}",
                String::from_utf8_lossy(&got)
            );
            Ok(took)
        })
        .join()
        .unwrap_or_else(|_| Err(anyhow::anyhow!("the UDP client thread panicked")))
    })?;
    let stats = vm.command("stats")?;
    let counted = stats.lines().any(|l| {
        l.split_whitespace()
            .collect::<Vec<_>>()
            .windows(2)
            .any(|w| w[0] == "xdp_rx" && w[1].parse::<u64>().is_ok_and(|n| n >= 2))
    });
    if !counted {
        bail!("stats do not count the two requests in xdp_rx:\n{stats}");
    }

    let data_ports = tcp_ports(&data, false);
    let scan = portscan::scan_tcp(Some(&ns.path()), GUEST.into(), 0, 1..=65535, SCAN_LIMITS)?;
    anyhow::ensure!(
        scan.unanswered.is_empty() && scan.open == data_ports,
        "open TCP ports with XDP attached: {:?} (unanswered {:?}), expected {data_ports:?}",
        scan.open,
        scan.unanswered
    );
    vm.poweroff()?;
    Ok(XdpReport {
        xdp_lines,
        open: scan.open,
        udp_round_trip: udp,
    })
}
