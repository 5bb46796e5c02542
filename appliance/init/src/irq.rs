//! NIC interrupt placement: the NIC's queue IRQs go to the worker CPUs (one CPU each; both
//! IRQs of queue q to worker q mod n, others round robin), every other IRQ to the
//! housekeeping CPUs. IRQs are found in
//! /sys/class/net/IF/device/msi_irqs (or the PCI parent's, for virtio) and in /proc/interrupts
//! lines naming the interface or its virtio device.

use std::fs;
use std::path::Path;

/// One numbered line of /proc/interrupts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IrqLine {
    pub irq: u32,
    /// The text after the per-CPU counts: chip, hardware IRQ, trigger and action names.
    pub description: String,
}

/// Parses /proc/interrupts; lines without a numeric IRQ (NMI, LOC, ...) are skipped.
pub fn parse_interrupts(text: &str) -> Vec<IrqLine> {
    let mut lines = text.lines();
    let cpus = lines
        .next()
        .map(|header| header.split_whitespace().count())
        .unwrap_or(0);
    lines
        .filter_map(|line| {
            let (irq, rest) = line.split_once(':')?;
            let irq = irq.trim().parse().ok()?;
            let description = rest
                .split_whitespace()
                .skip(cpus)
                .collect::<Vec<_>>()
                .join(" ");
            Some(IrqLine { irq, description })
        })
        .collect()
}

/// The IRQs of NIC `interface`: its MSI vectors plus /proc/interrupts lines naming it.
pub fn nic_irqs(interface: &str, interrupts: &[IrqLine], sys_class_net: &Path) -> Vec<u32> {
    let device = sys_class_net.join(interface).join("device");
    let mut irqs = Vec::new();
    let mut names = vec![interface.to_string()];
    if let Ok(real) = fs::canonicalize(&device) {
        for dir in [Some(real.as_path()), real.parent()].into_iter().flatten() {
            if let Ok(entries) = fs::read_dir(dir.join("msi_irqs")) {
                irqs.extend(
                    entries
                        .flatten()
                        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<u32>().ok())),
                );
            }
        }
        if let Some(name) = real.file_name().and_then(|n| n.to_str()) {
            if name.starts_with("virtio") {
                names.push(format!("{name}-"));
            }
        }
    }
    for line in interrupts {
        let last = line.description.split_whitespace().last().unwrap_or("");
        if names.iter().any(|n| last.starts_with(n.as_str())) {
            irqs.push(line.irq);
        }
    }
    irqs.sort_unstable();
    irqs.dedup();
    irqs
}

/// The queue number in an IRQ's action name (`virtio0-input.1`, `virtio0-output.1`,
/// `eth0-TxRx-1`, `eth0-rx-1`, `eth0-tx-1`), so both IRQs of a queue pair land together.
pub fn queue_of(irq: u32, interrupts: &[IrqLine]) -> Option<u32> {
    let line = interrupts.iter().find(|l| l.irq == irq)?;
    let action = line.description.split_whitespace().last()?;
    let (head, number) = action.rsplit_once(['.', '-'])?;
    let queue_word = ["-input", "-output", "-TxRx", "-rx", "-tx"];
    if !queue_word.iter().any(|w| head.ends_with(w)) {
        return None;
    }
    number.parse().ok()
}

/// Where each IRQ should go: NIC IRQs of queue q (`queue`) to `workers[q mod n]`, the
/// others round robin over `workers`; the rest to `housekeeping` (left alone when there are
/// no housekeeping CPUs). So a queue's receive IRQ, its transmit IRQ and the AF_XDP
/// socket of that queue (the runtime reads the IRQ's CPU back) share one worker.
pub fn plan(
    all: &[u32],
    nic: &[u32],
    queue: impl Fn(u32) -> Option<u32>,
    workers: &[usize],
    housekeeping: &[usize],
) -> Vec<(u32, Vec<usize>)> {
    let mut out = Vec::new();
    if !workers.is_empty() {
        let mut other = 0;
        for irq in nic {
            let at = match queue(*irq) {
                Some(q) => q as usize,
                None => {
                    other += 1;
                    other - 1
                }
            };
            out.push((*irq, vec![workers[at % workers.len()]]));
        }
    }
    if !housekeeping.is_empty() {
        for irq in all.iter().filter(|irq| !nic.contains(irq)) {
            out.push((*irq, housekeeping.to_vec()));
        }
    }
    out
}

/// Writes the plan to /proc/irq/N/smp_affinity_list; returns (applied, refused). Some IRQs
/// (the timer, kernel-managed queues) refuse to move, which is fine.
pub fn apply(plan: &[(u32, Vec<usize>)]) -> (usize, usize) {
    let mut applied = 0;
    let mut refused = 0;
    for (irq, cpus) in plan {
        match fs::write(
            format!("/proc/irq/{irq}/smp_affinity_list"),
            ringstore_sys::format_cpus(cpus),
        ) {
            Ok(()) => applied += 1,
            Err(_) => refused += 1,
        }
    }
    (applied, refused)
}

/// The console's `irq` table: IRQ, CPUs asked, CPUs in effect, description.
pub fn table(irqs: &[u32], interrupts: &[IrqLine]) -> Vec<String> {
    let mut out = vec![format!(
        "{:>5}  {:<10} {:<10} {}",
        "IRQ", "AFFINITY", "EFFECTIVE", "DESCRIPTION"
    )];
    for irq in irqs {
        let read = |file: &str| {
            ringstore_sys::read_trim(format!("/proc/irq/{irq}/{file}"))
                .unwrap_or_else(|| "-".into())
        };
        let description = interrupts
            .iter()
            .find(|l| l.irq == *irq)
            .map(|l| l.description.as_str())
            .unwrap_or("");
        out.push(format!(
            "{irq:>5}  {:<10} {:<10} {description}",
            read("smp_affinity_list"),
            read("effective_affinity_list")
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const INTERRUPTS: &str = "           CPU0       CPU1       CPU2       CPU3
  0:         45          0          0          0   IO-APIC   2-edge      timer
  4:        312          0          0          0   IO-APIC   4-edge      ttyS0
 24:          0          0          0          0  PCI-MSIX-0000:81:00.0   0-edge      virtio0-config
 25:         10          0          0          0  PCI-MSIX-0000:81:00.0   1-edge      virtio0-input.0
 26:          1          0          0          0  PCI-MSIX-0000:81:00.0   2-edge      virtio0-output.0
 27:          0          0          0          0  PCI-MSIX-0000:82:00.0   0-edge      eth1-TxRx-0
NMI:          0          0          0          0   Non-maskable interrupts
LOC:       1234       1234       1234       1234   Local timer interrupts
";

    #[test]
    fn parses_numbered_lines_only() {
        let lines = parse_interrupts(INTERRUPTS);
        assert_eq!(lines.len(), 6);
        assert_eq!(
            lines[2],
            IrqLine {
                irq: 24,
                description: "PCI-MSIX-0000:81:00.0 0-edge virtio0-config".into()
            }
        );
    }

    #[test]
    fn finds_nic_irqs_by_name_and_virtio_device() {
        let root = std::env::temp_dir().join(format!("ringstore-irq-{}", std::process::id()));
        let pci = root.join("devices/pci0000:80/0000:81:00.0");
        fs::create_dir_all(pci.join("virtio0")).unwrap();
        fs::create_dir_all(pci.join("msi_irqs")).unwrap();
        for n in ["24", "25", "26"] {
            fs::write(pci.join("msi_irqs").join(n), "msix").unwrap();
        }
        let net = root.join("class/net/eth0");
        fs::create_dir_all(&net).unwrap();
        std::os::unix::fs::symlink(pci.join("virtio0"), net.join("device")).unwrap();
        fs::create_dir_all(root.join("class/net/eth1")).unwrap();
        let lines = parse_interrupts(INTERRUPTS);
        assert_eq!(
            nic_irqs("eth0", &lines, &root.join("class/net")),
            vec![24, 25, 26]
        );
        assert_eq!(
            nic_irqs("eth1", &lines, &root.join("class/net")),
            vec![27],
            "by /proc/interrupts name only"
        );
        fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn both_irqs_of_a_queue_go_to_its_worker() {
        let text = "           CPU0       CPU1\n\
            24:  1  0  PCI-MSIX-0000:00:02.0   0-edge      virtio0-config\n\
            25:  1  0  PCI-MSIX-0000:00:02.0   1-edge      virtio0-input.0\n\
            26:  1  0  PCI-MSIX-0000:00:02.0   2-edge      virtio0-output.0\n\
            27:  1  0  PCI-MSIX-0000:00:02.0   3-edge      virtio0-input.1\n\
            28:  1  0  PCI-MSIX-0000:00:02.0   4-edge      virtio0-output.1\n\
            29:  1  0  PCI-MSI  5-edge      eth1-TxRx-3\n\
            30:  1  0  PCI-MSI  6-edge      eth1-rxbad\n";
        let lines = parse_interrupts(text);
        let q = |irq| queue_of(irq, &lines);
        assert_eq!(
            (q(24), q(25), q(26), q(27), q(28), q(29), q(30)),
            (None, Some(0), Some(0), Some(1), Some(1), Some(3), None)
        );
        assert_eq!(q(99), None, "an IRQ not listed");
        let nic = [24, 25, 26, 27, 28];
        let got = plan(&nic, &nic, q, &[0, 1], &[]);
        assert_eq!(
            got,
            vec![
                (24, vec![0]),
                (25, vec![0]),
                (26, vec![0]),
                (27, vec![1]),
                (28, vec![1])
            ]
        );
    }

    #[test]
    fn nic_irqs_go_round_robin_to_workers_and_the_rest_to_housekeeping() {
        let plan = plan(
            &[0, 4, 24, 25, 26],
            &[24, 25, 26],
            |_| None,
            &[2, 3],
            &[0, 1],
        );
        assert_eq!(
            plan,
            vec![
                (24, vec![2]),
                (25, vec![3]),
                (26, vec![2]),
                (0, vec![0, 1]),
                (4, vec![0, 1])
            ]
        );
        assert_eq!(
            super::plan(&[0, 24], &[24], |_| None, &[2], &[]),
            vec![(24, vec![2])]
        );
    }
}
