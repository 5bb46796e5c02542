//! The PXE QEMU test: VMs network-boot the bundle `cargo xtask pxe` writes, through QEMU's
//! user-net TFTP and its iPXE ROM (BIOS), each into the configuration its MAC has in
//! `qemu/pxe/inventory.toml`, one under SeaBIOS and one under OVMF; a MAC the inventory does
//! not list is refused by `boot.ipxe` (its message, on OVMF's serial console) and gets no kernel.
//!
//! The boot file is the script `boot.ipxe`, never an iPXE binary: user-net's DHCP cannot tell
//! a chain-loaded iPXE from the ROM (option 175), and a binary boot file loops for ever.

use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context, Result};

use super::client::{exchange, memcache_set_get, tcp};
use super::console::stat;
use super::vm::Vm;
use super::{BOOT_LIMIT, COMMAND_LIMIT, PROMPT};
use crate::image::Image;
use crate::image::PxeHost as Host;
use crate::qemu::{self, Serial};

/// The entry script of the bundle (xtask's pxe.rs writes it; the test fails if it is absent).
const BOOT_SCRIPT: &str = "boot.ipxe";
/// The MAC of the VM that must be refused.
const UNKNOWN_MAC: &str = "52:54:00:fe:00:99";
/// OVMF's code and the template of its variable store (Debian's `ovmf`).
const OVMF_CODE: &str = "/usr/share/OVMF/OVMF_CODE_4M.fd";
const OVMF_VARS: &str = "/usr/share/OVMF/OVMF_VARS_4M.fd";

/// Which firmware runs the NIC's iPXE ROM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Firmware {
    /// SeaBIOS: `-boot n`; iPXE writes to VGA only, so its messages are not on the serial port.
    Bios,
    /// OVMF with this copy of its variable store: the NIC is the first boot option
    /// (`bootindex=1`) and iPXE's messages reach the serial port.
    Uefi { vars: std::path::PathBuf },
}

/// What the PXE test saw.
pub struct PxeReport {
    /// Per host: name and seconds from QEMU's start to the ready line.
    pub ready: Vec<(String, f64)>,
}

/// Turns a `-kernel` machine's arguments into a network boot of `mac` from `tftp`: drops
/// `-kernel`/`-initrd`/`-append`, gives the first user network QEMU's TFTP server with
/// `boot.ipxe` as the DHCP boot file, sets the first NIC's MAC and boots from the network.
pub fn pxe_args(
    args: &[String],
    tftp: &Path,
    mac: &str,
    firmware: &Firmware,
) -> Result<Vec<String>> {
    let mut out = Vec::with_capacity(args.len());
    let (mut netdev, mut nic) = (false, false);
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "-kernel" | "-initrd" | "-append" => {
                it.next();
                continue;
            }
            _ => {}
        }
        let mut arg = arg.clone();
        if !netdev && arg.starts_with("user,id=n0") {
            let dir = tftp.display().to_string().replace(',', ",,");
            arg.push_str(&format!(",tftp={dir},bootfile={}", BOOT_SCRIPT));
            netdev = true;
        } else if let Some(at) = arg
            .find("mac=")
            .filter(|_| !nic && arg.contains("netdev=n0,"))
        {
            let at = at + 4;
            arg.replace_range(at..(at + 17).min(arg.len()), mac);
            if matches!(firmware, Firmware::Uefi { .. }) {
                arg.push_str(",bootindex=1");
            }
            nic = true;
        }
        out.push(arg);
    }
    if !netdev || !nic {
        bail!("the profile has no user network n0 with a NIC to boot from");
    }
    match firmware {
        Firmware::Bios => out.extend(["-boot".to_string(), "n".to_string()]),
        Firmware::Uefi { vars } => {
            let vars = vars.display().to_string().replace(',', ",,");
            out.extend([
                "-drive".to_string(),
                format!("if=pflash,format=raw,unit=0,readonly=on,file={OVMF_CODE}"),
                "-drive".to_string(),
                format!("if=pflash,format=raw,unit=1,file={vars}"),
            ]);
        }
    }
    Ok(out)
}

/// Boots the `single` profile from the network as `mac`, under SeaBIOS or OVMF.
fn boot_pxe(image: &Image, name: &str, tftp: &Path, mac: &str, uefi: bool) -> Result<Vm> {
    let profile = qemu::load_profile("single")?;
    let forwards = qemu::choose_forwards(&profile)?;
    let dir = super::vm::scratch_dir(name)?;
    let firmware = if uefi {
        let vars = dir.join("vars.fd");
        std::fs::copy(OVMF_VARS, &vars).with_context(|| format!("copying {OVMF_VARS}"))?;
        Firmware::Uefi { vars }
    } else {
        Firmware::Bios
    };
    let args = qemu::machine_args(
        &profile,
        image,
        &Serial::Socket(dir.join("serial.sock")),
        "",
        qemu::accel(&image.bzimage),
        &forwards,
        &[],
    );
    let socket = dir.join("serial.sock");
    let args = pxe_args(&args, tftp, mac, &firmware)?;
    Vm::start(name, dir, &socket, &args, forwards, None)
}

/// The host's configuration, as the console and `stats` must show it.
fn check_host(vm: &mut Vm, host: &Host, cpus: usize) -> Result<()> {
    let name = &host.hostname;
    let status = vm.command("status")?;
    anyhow::ensure!(
        status
            .lines()
            .any(|l| l.trim() == format!("hostname {name}")),
        "{name}: status shows no hostname {name}:\n{status}"
    );
    if let Some(ip) = host.static_ip {
        anyhow::ensure!(
            status.contains(&format!("address eth0 {ip}/24 via 10.0.2.2")),
            "{name}: status does not show the static address {ip}:\n{status}"
        );
    }
    let workers = if host.config.cores == 0 {
        cpus
    } else {
        host.config.cores
    };
    let console_stats = vm.command("stats")?;
    let mut s = tcp(vm.port("memcache", 0)?)?;
    let net_stats = exchange(&mut s, b"stats\r\n", |t| t.ends_with("END\r\n"))?;
    for (view, stats) in [("console", &console_stats), ("memcache", &net_stats)] {
        for (key, want) in [
            ("hostname", name.clone()),
            ("limit_maxbytes", host.config.memory.to_string()),
            ("threads", workers.to_string()),
            ("max_connections", host.config.max_conns.to_string()),
        ] {
            anyhow::ensure!(
                stat(stats, key) == Some(want.as_str()),
                "{name}: {view} stats {key} is {:?}, the inventory says {want}:\n{stats}",
                stat(stats, key)
            );
        }
    }
    memcache_set_get(vm.port("memcache", 0)?)?;
    // No slots to write: `update` says how a network-booted box is updated (issue 36).
    let update = vm.command("update http://10.0.2.2:1/ringstore.efi")?;
    anyhow::ensure!(
        update.contains(ringstore_init::update::NETWORK_BOOT_UPDATE),
        "{name}: update on a PXE box:\n{update}"
    );
    Ok(())
}

/// Two listed MACs boot their own configuration; an unlisted one gets no kernel.
pub fn pxe_boots_each_host_from_its_mac(image: &Image) -> Result<PxeReport> {
    let tftp = crate::image::appliance_dir()
        .join("vm")
        .join(format!("pxe-tftp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tftp);
    let hosts = crate::image::builder()?.pxe_bundle(image, &tftp)?;
    anyhow::ensure!(
        tftp.join(BOOT_SCRIPT).is_file(),
        "the PXE bundle in {} has no {BOOT_SCRIPT}",
        tftp.display()
    );
    let outcome = (|| {
        // One VM at a time: three TCG guests at once on a loaded 2-core host starved QEMU's
        // serial output (the kernel's 8250 driver then overwrites characters) and once failed
        // the kernel's timer check. The first host boots under SeaBIOS, the second and the
        // unlisted MAC under OVMF, where iPXE's messages reach the serial port.
        let profile = qemu::load_profile("single")?;
        let cpus = (profile.sockets * profile.cores_per_socket) as usize;
        let mut ready = Vec::new();
        for (k, host) in hosts.iter().enumerate() {
            let name = format!("pxe-{}", host.hostname);
            let mut vm = boot_pxe(image, &name, &tftp, &host.mac, k > 0)?;
            let at = vm.wait_for("ringstore: ready memcache=", 0, BOOT_LIMIT)?;
            ready.push((host.hostname.clone(), vm.started.elapsed().as_secs_f64()));
            vm.wait_for(PROMPT, at, COMMAND_LIMIT)?;
            check_host(&mut vm, host, cpus)?;
            vm.poweroff()?;
        }
        let mut unknown = boot_pxe(image, "pxe-unknown", &tftp, UNKNOWN_MAC, true)?;
        let refusal = format!("no bootable inventory entry for {UNKNOWN_MAC}: refusing to boot");
        let at = unknown.wait_for(&refusal, 0, BOOT_LIMIT)?;
        // Some seconds more: iPXE sleeps, then exits to the firmware; no kernel starts.
        std::thread::sleep(Duration::from_secs(3));
        anyhow::ensure!(
            !unknown.kernel_log().contains("Linux version")
                && !unknown.output()[at..].contains("ringstore-init"),
            "{UNKNOWN_MAC} is not in the inventory but booted:\n{}",
            unknown.tail()
        );
        Ok(PxeReport { ready })
    })();
    let _ = std::fs::remove_dir_all(&tftp);
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_boot_arguments_become_a_network_boot() {
        let args: Vec<String> = [
            "-m",
            "1024",
            "-netdev",
            "user,id=n0,hostfwd=tcp:127.0.0.1:1-:11211",
            "-device",
            "virtio-net-pci,netdev=n0,bus=pcie.0,mac=52:54:00:12:34:56",
            "-kernel",
            "bz",
            "-initrd",
            "ird",
            "-append",
            "console=ttyS0",
            "-no-reboot",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let out = pxe_args(
            &args,
            Path::new("/t,x"),
            "52:54:00:fe:00:01",
            &Firmware::Bios,
        )
        .unwrap();
        assert_eq!(
            out,
            [
                "-m",
                "1024",
                "-netdev",
                "user,id=n0,hostfwd=tcp:127.0.0.1:1-:11211,tftp=/t,,x,bootfile=boot.ipxe",
                "-device",
                "virtio-net-pci,netdev=n0,bus=pcie.0,mac=52:54:00:fe:00:01",
                "-no-reboot",
                "-boot",
                "n",
            ]
        );
        let no_nic: Vec<String> = args
            .iter()
            .filter(|a| !a.contains("netdev=n0,"))
            .cloned()
            .collect();
        assert!(pxe_args(
            &no_nic,
            Path::new("/t"),
            "52:54:00:fe:00:01",
            &Firmware::Bios
        )
        .is_err());
        let uefi = Firmware::Uefi {
            vars: "/v/vars.fd".into(),
        };
        let out = pxe_args(&args, Path::new("/t"), "52:54:00:fe:00:02", &uefi).unwrap();
        let has = |s: &str| out.iter().any(|a| a == s);
        assert!(has(
            "virtio-net-pci,netdev=n0,bus=pcie.0,mac=52:54:00:fe:00:02,bootindex=1"
        ));
        assert!(has("if=pflash,format=raw,unit=1,file=/v/vars.fd"));
        assert!(!has("-boot"));
    }
}
