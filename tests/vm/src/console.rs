//! Reading the console's answers: `stats` values, the `net` socket table and addresses, the
//! ready line's data sockets, and the `threads` privilege check (ADR-0008, ADR-0015).

use std::net::Ipv6Addr;

use anyhow::Result;

use super::vm::Vm;

pub(super) fn stat<'a>(stats: &'a str, key: &str) -> Option<&'a str> {
    stats
        .lines()
        .find_map(|l| l.trim().strip_prefix(&format!("STAT {key} ")))
}

/// The sockets the console's `net` lists as listening (TCP LISTEN and bound UDP sockets from the
/// guest kernel's /proc/net/{tcp,tcp6,udp,udp6}), as sorted `tcp 0.0.0.0:11211` strings,
/// each once: a SO_REUSEPORT group (memcache UDP has one socket per worker) is one endpoint.
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
    out.dedup();
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

/// The first ready event in PID 1's console output (`ringstore: ready memcache=IP:PORT ...`), up
/// to the end of its line or the next `ringstore:` glued to it.
pub(super) fn ready_line(pid1: &str) -> Option<String> {
    const READY: &str = "ringstore: ready ";
    let start = pid1.find(READY)?;
    let rest = &pid1[start..];
    let mut end = rest.find('\n').unwrap_or(rest.len());
    if let Some(next) = rest[READY.len()..end].find("ringstore:") {
        end = READY.len() + next;
    }
    Some(rest[..end].trim_end().to_string())
}

/// Each PID 1 event is on the console once: exactly one ready line in PID 1's output, and no
/// kernel record repeats a PID 1 line (`ringstore: ...`; the kernel's copy of /dev/kmsg lines,
/// which used to be echoed and raced PID 1's own line). Call it after the ready line.
pub(super) fn check_events_once(vm: &Vm) -> Result<()> {
    check_console_events(&vm.output(), &vm.kernel_log())
}

fn check_console_events(pid1: &str, kernel: &str) -> Result<()> {
    let ready = pid1.matches("ringstore: ready ").count();
    anyhow::ensure!(
        ready == 1,
        "{ready} ready lines on the console, expected exactly 1:\n{pid1}"
    );
    let echoed: Vec<&str> = kernel
        .lines()
        .filter(|l| l.contains("] ringstore: "))
        .collect();
    anyhow::ensure!(
        echoed.is_empty(),
        "the kernel echoes PID 1's lines on the console:\n{}",
        echoed.join("\n")
    );
    Ok(())
}

/// The uptime of the first line of the console's `log` (`[    3.250] info: TEXT`) containing
/// `needle`.
pub(super) fn uptime_of(log: &str, needle: &str) -> Option<f64> {
    log.lines().find(|l| l.contains(needle)).and_then(|l| {
        let inner = l.trim_start().strip_prefix('[')?.split(']').next()?;
        inner.trim().parse().ok()
    })
}

/// CAP_SYS_BOOT (22): all PID 1's main thread and its signal thread keep once booted.
const CAP_SYS_BOOT: u64 = 1 << 22;
/// CAP_NET_ADMIN (12) and CAP_NET_RAW (13): all a DHCP lease keeper keeps.
const CAP_NET_ADMIN_RAW: u64 = (1 << 12) | (1 << 13);

/// One row of the console's `threads`: `TID NAME capeff HEX capprm HEX capbnd HEX nnp N`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ThreadRow {
    pub tid: u32,
    pub name: String,
    pub eff: u64,
    pub prm: u64,
    pub bnd: u64,
    pub nnp: bool,
}

/// The rows of a `threads` answer (the header and anything else are skipped).
pub(super) fn thread_rows(threads: &str) -> Vec<ThreadRow> {
    threads
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let [tid, name, "capeff", eff, "capprm", prm, "capbnd", bnd, "nnp", nnp] = f[..] else {
                return None;
            };
            let hex = |h: &str| u64::from_str_radix(h, 16).ok();
            Some(ThreadRow {
                tid: tid.parse().ok()?,
                name: name.to_string(),
                eff: hex(eff)?,
                prm: hex(prm)?,
                bnd: hex(bnd)?,
                nnp: match nnp {
                    "1" => true,
                    "0" => false,
                    _ => return None,
                },
            })
        })
        .collect()
}

/// The sets a thread of the booted appliance may hold, by its name: PID 1's main thread (tid 1)
/// and `signals` CAP_SYS_BOOT, `dhcp-*` CAP_NET_ADMIN and CAP_NET_RAW, every other thread (the
/// serving `ringstore-*` ones and whatever else runs) nothing.
fn allowed(row: &ThreadRow) -> (&'static str, u64) {
    if row.tid == 1 {
        ("PID 1", CAP_SYS_BOOT)
    } else if row.name == "signals" {
        ("the signal thread", CAP_SYS_BOOT)
    } else if row.name.starts_with("dhcp-") {
        ("a DHCP thread", CAP_NET_ADMIN_RAW)
    } else {
        ("a serving or other thread", 0)
    }
}

/// Checks a `threads` answer: every thread holds exactly its role's capabilities in its
/// effective, permitted and bounding sets (see [`allowed`]) and has no_new_privs; PID 1, the
/// signal thread and `dhcp_threads` DHCP threads are there (so the sets read are real), and
/// `workers` worker threads. Returns how many serving (`ringstore-*`) threads were checked.
pub(super) fn check_thread_rows(
    threads: &str,
    workers: usize,
    dhcp_threads: usize,
) -> Result<usize> {
    let rows = thread_rows(threads);
    for row in &rows {
        let (role, mask) = allowed(row);
        anyhow::ensure!(
            row.eff == mask && row.prm == mask && row.bnd == mask && row.nnp,
            "thread {} {} ({role}) holds capeff {:016x} capprm {:016x} capbnd {:016x} nnp {}, \
             expected {mask:016x} in each and nnp 1:\n{threads}",
            row.tid,
            row.name,
            row.eff,
            row.prm,
            row.bnd,
            u8::from(row.nnp)
        );
    }
    let count = |pred: &dyn Fn(&ThreadRow) -> bool| rows.iter().filter(|r| pred(r)).count();
    anyhow::ensure!(
        count(&|r| r.tid == 1) == 1 && count(&|r| r.name == "signals") == 1,
        "PID 1 or its signal thread is missing from `threads`:\n{threads}"
    );
    let dhcp = count(&|r| r.name.starts_with("dhcp-"));
    anyhow::ensure!(
        dhcp == dhcp_threads,
        "{dhcp} DHCP threads, expected {dhcp_threads}:\n{threads}"
    );
    let worker_threads = count(&|r| r.name.starts_with("ringstore-w"));
    anyhow::ensure!(
        worker_threads == workers,
        "{worker_threads} worker threads for {workers} worker CPUs:\n{threads}"
    );
    Ok(count(&|r| r.name.starts_with("ringstore-")))
}

/// The console's `threads` passes [`check_thread_rows`]: serving threads hold nothing, PID 1 and
/// its signal thread only CAP_SYS_BOOT, DHCP threads only CAP_NET_ADMIN and CAP_NET_RAW (from the
/// guest's /proc/self/task/*/status). Returns how many serving threads were checked.
pub(super) fn check_thread_privileges(
    vm: &mut Vm,
    workers: usize,
    dhcp_threads: usize,
) -> Result<usize> {
    let out = vm.command("threads")?;
    check_thread_rows(&out, workers, dhcp_threads)
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

    /// One `threads` row as PID 1 formats it (appliance/init/src/threads.rs).
    fn row(tid: u32, name: &str, eff: u64, bnd: u64) -> String {
        format!("{tid:>6} {name:<15} capeff {eff:016x} capprm {eff:016x} capbnd {bnd:016x} nnp 1")
    }

    /// `threads` of a booted numa2 guest with `changed` rows in place of the expected ones.
    fn threads(changed: &[(&str, u64, u64)]) -> String {
        let mut out = vec!["threads".to_string(), "   tid name            capeff                  capprm                  capbnd                  nnp".to_string()];
        for (tid, name, mask) in [
            (1, "init", CAP_SYS_BOOT),
            (52, "signals", CAP_SYS_BOOT),
            (53, "dhcp-eth0", CAP_NET_ADMIN_RAW),
            (55, "ringstore-w0", 0),
            (56, "ringstore-w1", 0),
            (57, "ringstore-accep", 0),
        ] {
            let (eff, bnd) = changed
                .iter()
                .find(|(n, _, _)| *n == name)
                .map_or((mask, mask), |&(_, eff, bnd)| (eff, bnd));
            out.push(row(tid, name, eff, bnd));
        }
        out.join("\n") + "\n"
    }

    #[test]
    fn threads_hold_only_their_roles_capabilities() {
        let good = threads(&[]);
        assert!(good.contains("     1 init            capeff 0000000000400000 capprm 0000000000400000 capbnd 0000000000400000 nnp 1"));
        assert_eq!(thread_rows(&good).len(), 6);
        assert_eq!(check_thread_rows(&good, 2, 1).unwrap(), 3);
        // What the console showed before: PID 1, its signal and DHCP threads with every
        // capability (41 in 6.12).
        const ALL: u64 = 0x1ff_ffff_ffff;
        for name in ["init", "signals", "dhcp-eth0"] {
            let err = check_thread_rows(&threads(&[(name, ALL, ALL)]), 2, 1)
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(name) && err.contains("000001ffffffffff"),
                "{err}"
            );
            // Effective narrowed but the bounding set left whole is still wrong.
            let (_, mask) = allowed(
                &thread_rows(&good)
                    .into_iter()
                    .find(|r| r.name == name)
                    .unwrap(),
            );
            assert!(check_thread_rows(&threads(&[(name, mask, ALL)]), 2, 1).is_err());
        }
        assert!(check_thread_rows(&threads(&[("ringstore-w1", CAP_SYS_BOOT, 0)]), 2, 1).is_err());
        assert!(
            check_thread_rows(&good.replacen("nnp 1", "nnp 0", 1), 2, 1).is_err(),
            "no_new_privs"
        );
        assert!(check_thread_rows(&good, 3, 1).is_err(), "worker count");
        assert!(check_thread_rows(&good, 2, 2).is_err(), "DHCP thread count");
        assert!(check_thread_rows(&good.replace("signals", "other"), 2, 1).is_err());
        // An unknown thread may hold nothing.
        let extra = format!("{good}{}\n", row(60, "drain", CAP_SYS_BOOT, CAP_SYS_BOOT));
        assert!(check_thread_rows(&extra, 2, 1).is_err());
        // The old 8-field rows (no capbnd) are not read as rows at all.
        assert!(thread_rows(
            "     1 init            capeff 000001ffffffffff capprm 000001ffffffffff nnp 0"
        )
        .is_empty());
    }

    #[test]
    fn each_event_once() {
        let pid1 = "ringstore: ringstore-init 0.1.0 starting\nringstore: ready memcache=0.0.0.0:11211 http=0.0.0.0:8080\nringstore> ";
        let kernel = "[    2.300000] Run /init as init process\n[    2.400000] Kernel command line: console=ttyS0 ringstore.numa=1\n";
        check_console_events(pid1, kernel).unwrap();
        // Before: the kernel's copy of PID 1's kmsg lines.
        let echo =
            format!("{kernel}[    4.418821] ringstore: serving: ready memcache=0.0.0.0:11211\n");
        assert!(check_console_events(pid1, &echo).is_err());
        let twice = pid1.replace(
            "ringstore> ",
            "ringstore: ready memcache=0.0.0.0:11211 http=0.0.0.0:8080\n",
        );
        assert!(check_console_events(&twice, kernel).is_err());
        assert!(check_console_events("ringstore> ", kernel).is_err());
    }

    #[test]
    fn uptime_from_the_log() {
        let log = "log\n[    2.100] info: eth0: 10.0.2.15/24\n[    3.250] info: ready memcache=0.0.0.0:11211 http=0.0.0.0:8080\n";
        assert_eq!(uptime_of(log, "info: ready memcache="), Some(3.25));
        assert_eq!(uptime_of(log, "nothing"), None);
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
