//! The tuning verifier behind the console's `tuning`: what the topology and the placement call
//! for, what the kernel has in effect, and every difference. [`gather`] reads /sys and /proc
//! into [`Facts`]; [`verify`] compares (pure, unit-tested). A difference is something to fix; a
//! note is shown but leaves the report clean. The fast path hooks in through
//! [`Facts::xdp`] (one mode per interface; "not attached" until it lands).

pub mod isolation;
pub mod numa_maps;

use serde_json::{json, Value};

use crate::machine::Machine;

/// One interface as the verifier sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Interface {
    pub name: String,
    /// Carrier up.
    pub up: bool,
    /// The NIC's NUMA node (`None`: the kernel does not say).
    pub node: Option<u32>,
    pub rx_queues: usize,
    pub tx_queues: usize,
    /// `rps_cpus` of each RX queue (CPU lists; empty = RPS off).
    pub rps: Vec<Vec<usize>>,
    /// `xps_cpus` of each TX queue.
    pub xps: Vec<Vec<usize>>,
    /// The XDP program's mode (`native`, `generic`, ...), `None` = not attached.
    pub xdp: Option<String>,
    /// The configuration asks for the AF_XDP fast path here (`ringstore.xdp=`, `xdp` key).
    pub xdp_wanted: bool,
    /// The interface's queue IRQs (not its config/link IRQ).
    pub irqs: Vec<QueueIrq>,
}

/// One NIC queue IRQ: where PID 1 placed it and where it is in effect.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueIrq {
    pub irq: u32,
    /// The worker CPU PID 1's plan gave it (`irq::plan`).
    pub planned: Option<usize>,
    /// The affinity asked for (`smp_affinity_list`).
    pub asked: Vec<usize>,
    /// Effective affinity (else the asked-for one). It can lag `asked`: without interrupt
    /// remapping x86 moves an MSI only when that IRQ next fires, so an idle queue's IRQ shows
    /// its boot CPU until its first interrupt after PID 1 placed it.
    pub on: Vec<usize>,
}

/// Whether an IRQ description names a queue (virtio `-input.N`/`-output.N`, drivers'
/// `TxRx`/`rx`/`tx`), not a NIC's config or link interrupt.
pub fn is_queue_irq(description: &str) -> bool {
    let d = description.to_ascii_lowercase();
    d.contains("input")
        || d.contains("output")
        || d.contains("txrx")
        || d.contains("-rx")
        || d.contains("-tx")
}

/// What the verifier compares.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Facts {
    pub serving_node: u32,
    pub workers: Vec<usize>,
    /// Huge pages reserved per node (node, pages).
    pub hugepages: Vec<(u32, u64)>,
    /// Huge pages the configured memory needs on the serving node.
    pub hugepage_budget: u64,
    /// CPUs isolated by `isolcpus=` at boot (`/sys/devices/system/cpu/isolated`).
    pub isolated: Vec<usize>,
    pub nohz_full: Vec<usize>,
    pub interfaces: Vec<Interface>,
    /// The CPUs that should be isolated and `nohz_full` (`isolation::wanted`).
    pub isolate: Vec<usize>,
    /// CPUs in isolated cpuset partitions (`/sys/fs/cgroup/cpuset.cpus.isolated`).
    pub runtime_isolated: Vec<usize>,
    /// What boot did to isolate at run time and about the next boot's arguments.
    pub runtime: isolation::Runtime,
    pub boot_args: isolation::BootArgs,
    /// The config partition's file and error, when boot refused it.
    pub config_partition: Option<(String, String)>,
    /// With `sub_memory`: each item memory region's pages by node (ADR 0035).
    pub numa_pages: Vec<numa_maps::RegionPages>,
    /// The TLS certificate in use: its subject and days to expiry, or why it is unreadable.
    pub tls_cert: Option<Result<(String, i64), String>>,
}

/// One check's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    /// Stable name: `nic_node`, `hugepages`, `isolated`, `nohz_full`, `irq`, `queues`, `xdp`,
    /// `rps`, `xps`, `numa_maps`.
    pub check: &'static str,
    /// What it is about (`eth0`, `node 1`, `irq 25`, `cpus`).
    pub subject: String,
    pub wanted: String,
    pub actual: String,
    /// A difference to fix (false: as wanted, or only a note).
    pub difference: bool,
    pub note: Option<String>,
}

impl Check {
    pub fn json(&self) -> Value {
        json!({"check": self.check, "subject": self.subject, "wanted": self.wanted,
               "actual": self.actual, "difference": self.difference, "note": self.note})
    }
}

fn cpus(list: &[usize]) -> String {
    if list.is_empty() {
        "none".into()
    } else {
        ringstore_sys::format_cpus(list)
    }
}

fn check(
    check: &'static str,
    subject: impl Into<String>,
    wanted: String,
    actual: String,
    difference: bool,
) -> Check {
    Check {
        check,
        subject: subject.into(),
        wanted,
        actual,
        difference,
        note: None,
    }
}

/// Isolation-style checks: `have` should be exactly the worker CPUs.
fn cpu_set_check(name: &'static str, workers: &[usize], have: &[usize]) -> Check {
    let missing: Vec<usize> = workers
        .iter()
        .copied()
        .filter(|c| !have.contains(c))
        .collect();
    let extra: Vec<usize> = have
        .iter()
        .copied()
        .filter(|c| !workers.contains(c))
        .collect();
    let mut c = check(
        name,
        "cpus",
        cpus(workers),
        cpus(have),
        !missing.is_empty() || !extra.is_empty(),
    );
    let mut why = Vec::new();
    if !missing.is_empty() {
        why.push(format!("worker CPUs {} are not {name}", cpus(&missing)));
    }
    if !extra.is_empty() {
        why.push(format!(
            "CPUs {} are {name} but serve nothing",
            cpus(&extra)
        ));
    }
    if !why.is_empty() {
        c.note = Some(why.join("; "));
    }
    c
}

/// Every check, in a stable order: each up NIC's node, huge pages per node, isolated and
/// nohz_full CPUs, then per up NIC its queue IRQs, queues, XDP, RPS and XPS.
pub fn verify(f: &Facts) -> Vec<Check> {
    let up: Vec<&Interface> = f.interfaces.iter().filter(|i| i.up).collect();
    let mut out: Vec<Check> = up.iter().map(|i| nic_node_check(f, i)).collect();
    out.extend(
        f.hugepages
            .iter()
            .map(|&(node, pages)| hugepage_check(f, node, pages)),
    );
    out.extend(numa_maps::checks(&f.numa_pages));
    out.extend(isolation::config_check(f));
    out.extend(tls_cert_check(f));
    out.extend(isolation::checks(f));
    for i in &up {
        out.extend(i.irqs.iter().map(|q| irq_check(&f.workers, i, q)));
        out.push(queues_check(f, i));
        out.push(xdp_check(i));
        out.push(rps_check(i));
        out.push(xps_check(i));
    }
    out
}

/// The TLS certificate should be readable and at least `WARN_DAYS` from expiry.
fn tls_cert_check(f: &Facts) -> Option<Check> {
    let wanted = format!("valid for {}+ days", crate::tls_files::WARN_DAYS);
    Some(match f.tls_cert.as_ref()? {
        Ok((subject, days)) => {
            let mut c = check(
                "tls_cert",
                subject,
                wanted,
                format!("{days} days left"),
                false,
            );
            c.note = crate::tls_files::warning(*days);
            c.difference = c.note.is_some();
            c
        }
        Err(why) => check(
            "tls_cert",
            "tls-cert",
            wanted,
            format!("unreadable: {why}"),
            true,
        ),
    })
}

/// The NIC should sit on the serving node.
fn nic_node_check(f: &Facts, i: &Interface) -> Check {
    let actual = i
        .node
        .map_or("unknown".to_string(), |n| format!("node {n}"));
    // A NIC whose node the kernel does not know cannot be wrong.
    let differs = i.node.is_some_and(|n| n != f.serving_node);
    check(
        "nic_node",
        &i.name,
        format!("node {}", f.serving_node),
        actual,
        differs,
    )
}

/// The serving node holds at least the budget; every other node holds none.
fn hugepage_check(f: &Facts, node: u32, pages: u64) -> Check {
    let (wanted, differs) = if node == f.serving_node {
        (f.hugepage_budget, pages < f.hugepage_budget)
    } else {
        (0, pages > 0)
    };
    check(
        "hugepages",
        format!("node {node}"),
        format!("{wanted} x 2 MiB"),
        format!("{pages} x 2 MiB"),
        differs,
    )
}

/// A queue IRQ should be asked onto worker CPUs (ideally the planned one).
fn irq_check(workers: &[usize], i: &Interface, q: &QueueIrq) -> Check {
    let QueueIrq {
        irq,
        planned,
        asked,
        on,
    } = q;
    let planned = *planned;
    let serves = |set: &[usize]| !set.is_empty() && set.iter().all(|c| workers.contains(c));
    // The difference is in what was asked: an effective affinity still on the boot CPU
    // while the asked one serves is a move the kernel finishes at the next interrupt.
    let off_workers = !serves(asked);
    let pending = !off_workers && !serves(on);
    let actual = if pending {
        format!("{} (moving to {})", cpus(on), cpus(asked))
    } else {
        cpus(on)
    };
    let mut c = check(
        "irq",
        format!("{} irq {irq}", i.name),
        planned.map_or("a worker CPU".into(), |p| format!("cpu {p}")),
        actual,
        off_workers,
    );
    if off_workers {
        c.note = Some("asked for CPUs that do not serve".into());
    } else if pending {
        c.note =
            Some("asked for a worker CPU; the kernel moves it when this IRQ next fires".into());
    } else if planned.is_some_and(|p| on[..] != [p]) {
        c.note = Some("on another worker CPU than planned".into());
    }
    c
}

/// One RX queue per worker is what RSS needs; fewer is a note, not a difference.
fn queues_check(f: &Facts, i: &Interface) -> Check {
    let mut q = check(
        "queues",
        &i.name,
        format!("{} rx queues (one per worker)", f.workers.len()),
        format!("{} rx, {} tx", i.rx_queues, i.tx_queues),
        false,
    );
    if i.rx_queues < f.workers.len() {
        q.note = Some(
            "fewer RX queues than workers: the acceptor spreads connections, RSS cannot".into(),
        );
    }
    q
}

/// The fast path is attached where the configuration asked for it (`xdp`), and nowhere
/// else: a program nobody asked for, or a missing one, is a difference.
fn xdp_check(i: &Interface) -> Check {
    let wanted = if i.xdp_wanted {
        "attached (the xdp key names it)"
    } else {
        "not attached (the xdp key does not name it)"
    };
    check(
        "xdp",
        &i.name,
        wanted.into(),
        i.xdp.clone().unwrap_or_else(|| "not attached".into()),
        i.xdp.is_some() != i.xdp_wanted,
    )
}

/// RPS should be off on every RX queue: the queue's IRQ CPU serves it.
fn rps_check(i: &Interface) -> Check {
    let rps_on: Vec<String> = i
        .rps
        .iter()
        .enumerate()
        .filter(|(_, c)| !c.is_empty())
        .map(|(q, c)| format!("rx-{q} {}", cpus(c)))
        .collect();
    check(
        "rps",
        &i.name,
        "off".into(),
        if rps_on.is_empty() {
            "off".into()
        } else {
            rps_on.join(", ")
        },
        !rps_on.is_empty(),
    )
}

/// XPS is shown, never a difference: ringstore does not set it.
fn xps_check(i: &Interface) -> Check {
    let xps: Vec<String> = i
        .xps
        .iter()
        .enumerate()
        .map(|(q, c)| format!("tx-{q} {}", cpus(c)))
        .collect();
    let mut x = check(
        "xps",
        &i.name,
        "any (not used)".into(),
        if xps.is_empty() {
            "none".into()
        } else {
            xps.join(", ")
        },
        false,
    );
    x.note = Some("shown only: ringstore does not set XPS".into());
    x
}

fn read_cpus(path: &str) -> Vec<usize> {
    ringstore_sys::read_trim(path)
        .map(|s| ringstore_sys::parse_cpulist(&s))
        .unwrap_or_default()
}

/// A hex CPU mask from sysfs (`00000000,0000000c`) as CPU numbers.
pub fn parse_mask(text: &str) -> Vec<usize> {
    let mut out = Vec::new();
    let mut bit = 0usize;
    for word in text.trim().split(',').rev() {
        let value = u32::from_str_radix(word.trim(), 16).unwrap_or(0);
        for b in 0..32 {
            if value & (1 << b) != 0 {
                out.push(bit + b);
            }
        }
        bit += 32;
    }
    out
}

/// The queue files (`rps_cpus`, `xps_cpus`) of `prefix` queues of `iface`, in queue order.
fn queue_masks(iface: &str, prefix: &str, file: &str) -> Vec<Vec<usize>> {
    let dir = format!("/sys/class/net/{iface}/queues");
    let mut queues: Vec<(usize, Vec<usize>)> = std::fs::read_dir(&dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let n = name.strip_prefix(prefix)?.parse().ok()?;
            let mask = ringstore_sys::read_trim(format!("{dir}/{name}/{file}")).unwrap_or_default();
            Some((n, parse_mask(&mask)))
        })
        .take(1024)
        .collect();
    queues.sort();
    queues.into_iter().map(|(_, m)| m).collect()
}

/// The fast path's report of an interface's XDP mode (`IF: MODE, N queue(s)` in the server's
/// AF_XDP lines, `plane::xdp_lines`); `None` when `ringstore.xdp` did not attach to it.
pub fn xdp_mode(iface: &str, xdp_lines: &[String]) -> Option<String> {
    let prefix = format!("{iface}: ");
    xdp_lines
        .iter()
        .find_map(|l| l.trim().strip_prefix(&prefix).map(str::to_string))
}

/// Reads the facts of `machine` (`None` while nothing was placed).
pub fn gather(machine: &Machine) -> Option<Facts> {
    // A copy of what PID 1 recorded: the /sys and /proc reads below run without the lock.
    let xdp_wanted: Vec<String> = machine
        .state()
        .config
        .as_ref()
        .map(|c| c.xdp.clone())
        .unwrap_or_default();
    let (placement, memory, nic_irqs, xdp_lines, isolation, config_partition, regions) = {
        let state = machine.state();
        (
            state.placement.clone()?,
            state.config.as_ref().map_or(0, |c| c.memory),
            state.nic_irqs.clone(),
            crate::plane::xdp_lines(state.server.as_deref()),
            state.isolation.clone(),
            state
                .partition_file
                .refused()
                .map(|(file, error)| (file.to_string(), error.to_string())),
            state
                .server
                .as_ref()
                .map(|s| s.memory_regions())
                .unwrap_or_default(),
        )
    };
    let tls_cert = machine
        .state()
        .config
        .as_ref()
        .and_then(|c| c.tls.cert.clone())
        .map(|path| {
            crate::tls_files::summary_of(&path)
                .map(|s| (s.subject.clone(), s.days_left(crate::tls_files::unix_now())))
        });
    let numa_pages = match regions.is_empty() {
        true => Vec::new(),
        false => numa_maps::count(
            &std::fs::read_to_string("/proc/self/numa_maps").unwrap_or_default(),
            &std::fs::read_to_string("/proc/self/maps").unwrap_or_default(),
            &regions,
        ),
    };
    let hugepages = hugepages_per_node();
    let interrupts = crate::irq::parse_interrupts(
        &std::fs::read_to_string("/proc/interrupts").unwrap_or_default(),
    );
    // PID 1's plan, recomputed over the same NIC IRQ list in the same order (`place_irqs`).
    let all_nic: Vec<u32> = nic_irqs
        .iter()
        .flat_map(|(_, irqs)| irqs.iter().copied())
        .collect();
    let plan = crate::irq::plan(
        &[],
        &all_nic,
        |irq| crate::irq::queue_of(irq, &interrupts),
        &placement.workers,
        &[],
    );
    let interfaces = crate::net::link::ethernet_nics()
        .into_iter()
        .map(|name| {
            let placed = nic_irqs
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, irqs)| irqs.as_slice())
                .unwrap_or_default();
            let irqs = queue_irqs(placed, &interrupts, &plan);
            let xdp = xdp_mode(&name, &xdp_lines);
            let wanted = xdp_wanted.contains(&name);
            read_interface(name, irqs, xdp, wanted)
        })
        .collect();
    Some(Facts {
        serving_node: placement.node,
        isolate: isolation::wanted(&placement.workers, &placement.housekeeping),
        workers: placement.workers,
        hugepages,
        hugepage_budget: crate::hugepages::pages_for(memory),
        isolated: read_cpus("/sys/devices/system/cpu/isolated"),
        nohz_full: read_cpus("/sys/devices/system/cpu/nohz_full"),
        interfaces,
        runtime_isolated: read_cpus(&format!("{}/cpuset.cpus.isolated", isolation::CGROUP_ROOT)),
        runtime: isolation.runtime,
        boot_args: isolation.boot_args,
        config_partition,
        numa_pages,
        tls_cert,
    })
}

/// Huge pages reserved on each NUMA node (node 0 up to the first missing node after it).
fn hugepages_per_node() -> Vec<(u32, u64)> {
    let mut hugepages = Vec::new();
    for node in 0..64u32 {
        if !std::path::Path::new(&format!("/sys/devices/system/node/node{node}")).exists() {
            if node > 0 {
                break;
            }
            continue;
        }
        hugepages.push((
            node,
            crate::hugepages::count(node, "nr_hugepages").unwrap_or(0),
        ));
    }
    hugepages
}

/// The queue IRQs among a NIC's `placed` IRQs, each with its planned CPU (`plan`) and the
/// affinity asked for and in effect.
fn queue_irqs(
    placed: &[u32],
    interrupts: &[crate::irq::IrqLine],
    plan: &[(u32, Vec<usize>)],
) -> Vec<QueueIrq> {
    placed
        .iter()
        .copied()
        .filter(|irq| {
            interrupts
                .iter()
                .any(|l| l.irq == *irq && is_queue_irq(&l.description))
        })
        .map(|irq| {
            let asked = read_cpus(&format!("/proc/irq/{irq}/smp_affinity_list"));
            let effective = read_cpus(&format!("/proc/irq/{irq}/effective_affinity_list"));
            let on = if effective.is_empty() {
                asked.clone()
            } else {
                effective
            };
            let planned = plan
                .iter()
                .find(|(i, _)| *i == irq)
                .and_then(|(_, c)| c.first().copied());
            QueueIrq {
                irq,
                planned,
                asked,
                on,
            }
        })
        .collect()
}

/// Interface `name` as sysfs shows it: carrier, NUMA node, queues with their RPS/XPS masks.
fn read_interface(
    name: String,
    irqs: Vec<QueueIrq>,
    xdp: Option<String>,
    xdp_wanted: bool,
) -> Interface {
    let base = format!("/sys/class/net/{name}");
    let rps = queue_masks(&name, "rx-", "rps_cpus");
    let xps = queue_masks(&name, "tx-", "xps_cpus");
    Interface {
        up: ringstore_sys::read_trim(format!("{base}/carrier")).as_deref() == Some("1"),
        // A virtio NIC's `device` is the virtio device; its PCI function has the node.
        node: ringstore_sys::read_trim(format!("{base}/device/numa_node"))
            .or_else(|| ringstore_sys::read_trim(format!("{base}/device/../numa_node")))
            .and_then(|s| s.parse().ok()),
        rx_queues: rps.len(),
        tx_queues: xps.len(),
        rps,
        xps,
        xdp,
        xdp_wanted,
        irqs,
        name,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The numa2 profile as tuned: NIC on node 1, workers 2-3 isolated and nohz_full.
    fn numa2() -> Facts {
        Facts {
            serving_node: 1,
            workers: vec![2, 3],
            hugepages: vec![(0, 0), (1, 32)],
            hugepage_budget: 32,
            isolated: vec![2, 3],
            nohz_full: vec![2, 3],
            isolate: vec![2, 3],
            interfaces: vec![Interface {
                name: "eth0".into(),
                up: true,
                node: Some(1),
                rx_queues: 1,
                tx_queues: 1,
                rps: vec![vec![]],
                xps: vec![vec![2, 3]],
                xdp: None,
                xdp_wanted: false,
                irqs: vec![
                    QueueIrq {
                        irq: 25,
                        planned: Some(3),
                        asked: vec![3],
                        on: vec![3],
                    },
                    QueueIrq {
                        irq: 26,
                        planned: Some(2),
                        asked: vec![2],
                        on: vec![2],
                    },
                ],
            }],
            ..Facts::default()
        }
    }

    fn differences(f: &Facts) -> Vec<(&'static str, String)> {
        verify(f)
            .into_iter()
            .filter(|c| c.difference)
            .map(|c| (c.check, c.subject))
            .collect()
    }

    #[test]
    fn numa2_is_clean_and_each_mistuning_is_named() {
        assert_eq!(differences(&numa2()), []);
        let mut f = numa2();
        f.isolated = vec![2];
        f.nohz_full = vec![0, 2, 3];
        let checks = verify(&f);
        let iso = checks.iter().find(|c| c.check == "isolated").unwrap();
        assert!(
            iso.difference
                && iso
                    .note
                    .as_deref()
                    .unwrap()
                    .contains("worker CPUs 3 are not isolated"),
            "{iso:?}"
        );
        let nohz = checks.iter().find(|c| c.check == "nohz_full").unwrap();
        assert!(nohz
            .note
            .as_deref()
            .unwrap()
            .contains("CPUs 0 are nohz_full but serve nothing"));
        let mut f = numa2();
        f.interfaces[0].node = Some(0);
        f.hugepages = vec![(0, 4), (1, 10)];
        f.interfaces[0].irqs[0].asked = vec![0];
        f.interfaces[0].irqs[0].on = vec![0];
        f.interfaces[0].rps[0] = vec![0, 1];
        f.interfaces[0].xdp = Some("generic".into());
        assert_eq!(
            differences(&f),
            [
                ("nic_node", "eth0".to_string()),
                ("hugepages", "node 0".to_string()),
                ("hugepages", "node 1".to_string()),
                ("irq", "eth0 irq 25".to_string()),
                ("xdp", "eth0".to_string()),
                ("rps", "eth0".to_string()),
            ]
        );
        // The fast path the configuration asked for is what tuning expects (issue 36).
        let mut f = numa2();
        f.interfaces[0].xdp_wanted = true;
        f.interfaces[0].xdp = Some("native, 2 queues".into());
        assert!(!differences(&f).iter().any(|(c, _)| *c == "xdp"));
        f.interfaces[0].xdp = None;
        assert!(differences(&f).contains(&("xdp", "eth0".to_string())));
        // A down interface is not checked; an unknown node is not a difference.
        let mut f = numa2();
        f.interfaces[0].up = false;
        assert!(verify(&f)
            .iter()
            .all(|c| c.check != "irq" && c.check != "nic_node"));
        let mut f = numa2();
        f.interfaces[0].node = None;
        assert_eq!(differences(&f), []);
    }

    #[test]
    fn only_queue_irqs_count() {
        assert!(is_queue_irq(
            "PCI-MSIX-0000:01:00.0   1-edge      virtio0-input.0"
        ));
        assert!(is_queue_irq("IR-PCI-MSI 524289-edge      eth0-TxRx-0"));
        assert!(!is_queue_irq(
            "PCI-MSIX-0000:01:00.0   0-edge      virtio0-config"
        ));
        // Asked for a worker but still in effect on the boot CPU (the move waits for the next
        // interrupt): a note, not a difference. Asked for CPU 0: a difference, wherever it is.
        let mut f = numa2();
        f.interfaces[0].irqs[0].on = vec![0];
        let c = verify(&f)
            .into_iter()
            .find(|c| c.subject == "eth0 irq 25")
            .unwrap();
        assert!(
            !c.difference && c.actual == "0 (moving to 3)" && c.note.is_some(),
            "{c:?}"
        );
        f.interfaces[0].irqs[0].asked = vec![0, 3];
        f.interfaces[0].irqs[0].on = vec![3];
        assert!(differences(&f).contains(&("irq", "eth0 irq 25".to_string())));
        // Another worker than planned is a note, not a difference.
        let mut f = numa2();
        f.interfaces[0].irqs[0].asked = vec![2];
        f.interfaces[0].irqs[0].on = vec![2];
        let c = verify(&f)
            .into_iter()
            .find(|c| c.subject == "eth0 irq 25")
            .unwrap();
        assert!(!c.difference && c.note.is_some(), "{c:?}");
    }

    #[test]
    fn masks_parse() {
        assert_eq!(parse_mask("0"), Vec::<usize>::new());
        assert_eq!(parse_mask("c\n"), [2, 3]);
        assert_eq!(parse_mask("00000001,00000003"), [0, 1, 32]);
        assert_eq!(parse_mask("zz"), Vec::<usize>::new());
    }
}
