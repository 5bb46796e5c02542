//! The numa2 QEMU test: boots, serves memcache and HTTP, shows node 1's CPUs, huge pages,
//! serving threads without capabilities (PID 1's own with only theirs) and NIC IRQs on worker CPUs, and powers off.

use std::time::Duration;

use anyhow::{Context, Result};

use super::client::{http_put_get, memcache_set_get};
use super::console::{
    check_events_once, check_listening, check_thread_privileges, data_sockets, ready_line, stat,
    uptime_of,
};
use super::vm::Vm;
use super::{BOOT_LIMIT, COMMAND_LIMIT, PROMPT};
use crate::image::Image;

/// What the numa2 test measured.
#[derive(Debug, Clone)]
pub struct BootReport {
    /// Kernel timestamp of `Run /init as init process`.
    pub init_secs: Option<f64>,
    /// Wall time from starting QEMU to the ready line (firmware and QEMU start included).
    pub ready_wall: Duration,
    /// Uptime PID 1 logged the ready line at (`log`: `[    3.250] info: ready ...`; kernel start = 0).
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
    check_events_once(&vm)?;
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
    // DHCP on eth0 (the default): one lease keeper.
    check_thread_privileges(&mut vm, cpus.len(), 1)?;
    // DHCP (the default): the lease keeper holds its UDP socket on port 68 (bound to eth0) to
    // renew at T1 (ADR-0006); nothing else but the data ports may listen.
    let ready_line = ready_line(&vm.output()).context("no ready line")?;
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
    let ready_secs = uptime_of(&vm.command("log")?, "info: ready memcache=");
    let init_secs = vm.kernel_time_of("Run /init as init process");
    let poweroff = vm.poweroff()?;
    Ok(BootReport {
        init_secs,
        ready_wall,
        ready_secs,
        poweroff,
    })
}
