//! The server-hardware QEMU test: the appliance on the devices a rack server has rather than
//! virtio (profile `server-hw`: an igb NIC, the data disk behind a MegaRAID SAS controller),
//! serving through the igb NIC and keeping a write on the SAS disk across a poweroff.
//! docs/HARDWARE.md lists the drivers and which of them this exercises.

use std::time::Duration;

use anyhow::{Context, Result};

use super::client::{exchange, http_put_get, memcache_set_get, tcp};
use super::durable::{console_line_with, ScratchDisks};
use super::vm::Vm;
use super::{BOOT_LIMIT, COMMAND_LIMIT, PROMPT};
use crate::image::Image;

const PROFILE: &str = "server-hw";
/// The SAS disk as the guest names it (the profile's `ringstore.data=`).
const DATA: &str = "/dev/sda";

/// Boots `server-hw` on a blank disk: megaraid_sas finds the disk (/dev/sda), the server formats
/// it, memcache and HTTP answer through the igb NIC's forwarded ports; after `poweroff` (the
/// checkpoint) a second boot recovers from the checkpoint and the key set in the first reads back.
/// The note: both boots' QEMU start to ready, the kernel's lines for the disk and the NIC.
pub fn serves_through_igb_from_a_sas_disk(image: &Image) -> Result<String> {
    let disks = ScratchDisks::create("hardware", PROFILE)?;
    let (mut vm, first_ready) = boot_ready(image, "hardware-1", &disks)?;
    let kernel = vm.kernel_log();
    let disk_line = line_with(&kernel, &["[sda]", "MiB"])
        .context("the kernel names no SCSI disk sda with its size")?;
    let nic_line = line_with(
        &kernel,
        &["igb ", "Intel(R) Gigabit Ethernet Network Connection"],
    )
    .context("the igb driver did not attach the NIC")?;
    line_with(&kernel, &["megaraid_sas"]).context("megaraid_sas did not attach the controller")?;
    console_line_with(&vm, &format!("data device {DATA}: formatted"))?;
    let status = vm.command("status")?;
    anyhow::ensure!(
        status.contains(&format!("data {DATA}: block device, 64 MiB")),
        "status does not show the SAS data disk:\n{status}"
    );
    // eth0 is the igb NIC (the only one), its queues igb's MSI-X vectors (virtio-net's would be
    // `virtioN-input.0`): the answers below came through it.
    let irq = vm.command("irq")?;
    anyhow::ensure!(
        irq.contains("eth0-rx-0") && irq.contains("eth0-tx-0"),
        "irq shows no igb queues of eth0:\n{irq}"
    );
    memcache_set_get(vm.port("memcache", 0)?)?;
    http_put_get(vm.port("http", 0)?)?;
    vm.poweroff()?;
    console_line_with(&vm, "data device: checkpoint written")?;
    drop(vm);

    let (mut vm, second_ready) = boot_ready(image, "hardware-2", &disks)?;
    console_line_with(
        &vm,
        &format!("data device {DATA}: recovered from the shutdown checkpoint"),
    )?;
    let mut s = tcp(vm.port("memcache", 0)?)?;
    let got = exchange(&mut s, b"get vmkey\r\n", |t| t.ends_with("END\r\n"))?;
    anyhow::ensure!(
        got == "VALUE vmkey 0 5\r\nhello\r\nEND\r\n",
        "after the poweroff, get vmkey answered {got:?}"
    );
    vm.poweroff()?;
    Ok(format!(
        "ready {:.1} s and {:.1} s after QEMU started; [{disk_line}] [{nic_line}]",
        first_ready.as_secs_f64(),
        second_ready.as_secs_f64()
    ))
}

/// Boots the profile on `disks` and waits for the ready line and the prompt.
fn boot_ready(image: &Image, name: &str, disks: &ScratchDisks) -> Result<(Vm, Duration)> {
    let mut vm = Vm::boot_with_disks(image, name, PROFILE, "", &disks.files)?;
    let ready = vm.wait_for("ringstore: ready memcache=", 0, BOOT_LIMIT)?;
    let wall = vm.started.elapsed();
    vm.wait_for(PROMPT, ready, COMMAND_LIMIT)?;
    super::console::check_events_once(&vm)?;
    Ok((vm, wall))
}

/// The first line of `log` containing every one of `needles`, trimmed.
fn line_with(log: &str, needles: &[&str]) -> Option<String> {
    log.lines()
        .find(|l| needles.iter().all(|n| l.contains(n)))
        .map(|l| l.trim().to_string())
}
