//! The two-NIC QEMU tests: without `ringstore.numa` nothing serves and the error names the
//! interfaces; with `ringstore.numa=1` it serves through node 1's NIC.

use anyhow::Result;

use super::client::{memcache_closed, memcache_set_get};
use super::console::{check_thread_privileges, stat};
use super::vm::Vm;
use super::{BOOT_LIMIT, COMMAND_LIMIT, PROMPT};
use crate::image::Image;

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
    // DHCP on both NICs: two lease keepers, each with only its own capabilities.
    let workers = stat(&stats, "worker_cpus").unwrap_or("").split(',').count();
    check_thread_privileges(&mut vm, workers, 2)?;
    vm.poweroff()?;
    Ok(())
}
