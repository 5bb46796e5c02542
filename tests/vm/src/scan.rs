//! The port-scan QEMU test: the guest on a tap in a namespace of our own, scanned on every TCP
//! port over IPv4 and IPv6 link-local, opens exactly the ready line's data ports.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::console::{check_listening, data_sockets, link_local, ready_line, tcp_ports};
use super::vm::Vm;
use super::{netns, portscan, BOOT_LIMIT, COMMAND_LIMIT, PROMPT};
use crate::image::Image;

/// The peer's and the guest's address on the scan test's /30 link (inside its own namespace).
const SCAN_PEER: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);
const SCAN_GUEST: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 2);
pub(super) const SCAN_LIMITS: portscan::Limits = portscan::Limits {
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
    let ready_line = ready_line(&vm.output()).context("no ready line")?;
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
