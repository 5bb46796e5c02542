//! Reading the console's answers: `stats` values, the `net` socket table and addresses, the
//! ready line's data sockets, and the `threads` privilege check.

use std::net::Ipv6Addr;

use anyhow::Result;

use super::vm::Vm;

pub(super) fn stat<'a>(stats: &'a str, key: &str) -> Option<&'a str> {
    stats
        .lines()
        .find_map(|l| l.trim().strip_prefix(&format!("STAT {key} ")))
}

/// The sockets the console's `net` lists as listening (TCP LISTEN and bound UDP sockets from the
/// guest kernel's /proc/net/{tcp,tcp6,udp,udp6}), as sorted `tcp 0.0.0.0:11211` strings.
pub(super) fn listening_sockets(net: &str) -> Vec<String> {
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
pub(super) fn check_listening(vm: &mut Vm, expected: &[String]) -> Result<String> {
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
/// lines that must listen (`tcp IP:PORT`), sorted, each once.
///
/// The serial console interleaves the kernel's log with PID 1's output: the ready line can
/// arrive twice on one console line (PID 1's and its kmsg copy) with a kernel timestamp glued
/// to the last address (`http=0.0.0.0:8080[    2.6]`). Only whole socket addresses count.
pub(super) fn data_sockets(ready_line: &str) -> Vec<String> {
    let mut out: Vec<String> = ready_line
        .split_whitespace()
        .filter_map(|w| w.split_once('='))
        .filter(|(k, _)| matches!(*k, "memcache" | "http" | "udp"))
        .filter_map(|(k, addr)| {
            let addr = addr.trim_end_matches(|c: char| !c.is_ascii_digit());
            addr.parse::<std::net::SocketAddr>().ok()?;
            Some(format!("{} {addr}", if k == "udp" { "udp" } else { "tcp" }))
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The first console line that starts with `prefix`.
pub(super) fn line_starting(vm: &Vm, prefix: &str) -> Option<String> {
    vm.output()
        .lines()
        .find(|l| l.starts_with(prefix))
        .map(str::to_string)
}

/// Every serving thread (named `ringstore-*`: workers, acceptors, UDP) shows CapEff and CapPrm 0
/// and no_new_privs 1 in the console's `threads` (the guest's /proc/self/task/*/status), there is
/// one worker per worker CPU, and PID 1's main thread still has capabilities (the reading is
/// real). Returns how many serving threads were checked.
pub(super) fn check_serving_threads_unprivileged(vm: &mut Vm, workers: usize) -> Result<usize> {
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

/// TCP ports of the `tcp IP:PORT` entries in `sockets` with an IPv6 (`v6`) or IPv4 address.
pub(super) fn tcp_ports(sockets: &[String], v6: bool) -> Vec<u16> {
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
pub(super) fn link_local(net: &str, interface: &str) -> Option<Ipv6Addr> {
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
        // Seen in a CI run: the line twice on one console line, a kernel timestamp glued on.
        assert_eq!(
            data_sockets(
                "ringstore: ready memcache=0.0.0.0:11211 http=0.0.0.0:8080ringstore: ready memcache=0.0.0.0:11211 http=0.0.0.0:8080[    2.605666] x"
            ),
            ["tcp 0.0.0.0:11211", "tcp 0.0.0.0:8080"]
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
