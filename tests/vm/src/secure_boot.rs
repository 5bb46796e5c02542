//! The QEMU test of Secure Boot (ADR 0051) under Debian's Secure Boot OVMF
//! (`OVMF_CODE_4M.secboot.fd`, q35 with SMM) with the snakeoil variable store, whose db
//! trusts only Debian's snakeoil test certificate: an unsigned disk.img and a signed one whose
//! slot image had a byte changed after signing are refused by the firmware; the image signed
//! with the snakeoil key (`cargo xtask image --test-keys`) boots, serves, the kernel and
//! `status` say Secure Boot is on, and an update to an image that carries the update key's
//! ed25519 signature but no Authenticode one is refused with nothing written.

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use ringstore_bootdisk::slots::Slot;
use ringstore_bootdisk::Role;

use super::client::memcache_set_get;
use super::uefi::{serve_files, test_options, Removed, UefiMachine, READY};
use super::vm::{scratch_dir, Vm};
use super::{BOOT_LIMIT, PROMPT};
use crate::image::{BootImage, Image};

/// The snakeoil pair Debian's OVMF trusts (a TEST key: public to anyone).
pub(super) const SNAKEOIL_KEY: &str = "/usr/share/ovmf/PkKek-1-snakeoil.key";
pub(super) const SNAKEOIL_CERT: &str = "/usr/share/ovmf/PkKek-1-snakeoil.pem";
/// What OVMF's image verification answers on the serial console (case aside) for an image
/// its db does not trust: the boot manager refused (`BdsDxe: failed to load Boot0001 ...:
/// Access Denied`), or systemd-boot refused by the firmware when it loads the slot's image.
const FIRMWARE_REFUSALS: [&str; 2] = ["access denied", "security violation"];

/// What the test saw.
#[derive(Debug)]
pub struct SecureBootReport {
    pub unsigned_refusal: String,
    pub changed_refusal: String,
    pub update_refusal: String,
    pub ready_wall: Duration,
}

/// Boots `machine` and waits for the firmware's refusal, on a line that names `what`; fails
/// if a kernel starts. Returns the refusal's line without its colour codes.
fn firmware_refuses(machine: &UefiMachine, name: &str, what: &str) -> Result<String> {
    let vm = machine.boot(name)?;
    let limit = std::time::Instant::now() + BOOT_LIMIT;
    loop {
        let out = vm.output();
        let kernel = out.contains("EFI stub:") || !vm.kernel_log().is_empty();
        ensure!(!kernel, "{name}: a kernel started:\n{}", vm.tail());
        if let Some(line) = out.lines().find(|l| {
            let l = l.to_ascii_lowercase();
            FIRMWARE_REFUSALS.iter().any(|r| l.contains(r))
        }) {
            ensure!(
                line.contains(what),
                "{name}: refused, but not {what:?}: {line:?}"
            );
            let plain: String = line
                .split('\u{1b}')
                .map(|p| {
                    p.trim_start_matches(|c: char| {
                        c == '[' || c.is_ascii_digit() || c == ';' || c == 'm'
                    })
                })
                .collect();
            return Ok(plain.trim().to_string());
        }
        ensure!(
            std::time::Instant::now() < limit,
            "{name}: no firmware refusal ({FIRMWARE_REFUSALS:?}) of {what:?} within {} s:\n{}",
            BOOT_LIMIT.as_secs(),
            vm.tail()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The signed image boots: the kernel reports Secure Boot, `status` and `tuning` say it is
/// on, the box serves.
fn signed_boots_and_says_so(vm: &mut Vm) -> Result<()> {
    let kernel = vm.kernel_log();
    ensure!(
        kernel.contains("Secure boot enabled"),
        "the kernel does not report Secure Boot:\n{}",
        vm.tail()
    );
    let status = vm.command("status")?;
    ensure!(
        status.contains("secure boot on"),
        "`status` under Secure Boot:\n{status}"
    );
    let json = vm.json("status")?;
    let sb = json
        .first()
        .map(|s| s["secure_boot"].clone())
        .unwrap_or_default();
    ensure!(
        sb["enabled"] == true && sb["setup_mode"] == false,
        "`status --json` secure_boot: {sb}"
    );
    // The tuned entry's options would be ignored: the box isolates at run time only and
    // says how a signed image gets `nohz_full=`.
    vm.wait_for(
        "only from the signed image's command line",
        0,
        Duration::from_secs(30),
    )?;
    let tuning = vm.command("tuning")?;
    ensure!(
        tuning.contains("secure boot on")
            && !tuning.contains("WARN secure boot")
            && tuning.contains("--append nohz_full=1"),
        "`tuning` under Secure Boot:\n{tuning}"
    );
    let state = vm.json("tuning")?;
    ensure!(
        state
            .first()
            .is_some_and(|t| t["state"] == "run-time-isolated"
                && t["clean"] == true
                && t["secure_boot"]["enabled"] == true),
        "`tuning --json` under Secure Boot: {state:?}"
    );
    memcache_set_get(vm.port("memcache", 0)?)
}

/// `update` to `unsigned` (the update key's ed25519 signature, no Authenticode one) is
/// refused before anything is written: slot B stays empty.
fn unsigned_update_refused(vm: &mut Vm, unsigned: &BootImage) -> Result<String> {
    let site = scratch_dir("secure-boot-site")?;
    let _removed = Removed(site.clone());
    std::fs::copy(&unsigned.efi, site.join("unsigned.efi"))?;
    let sig = unsigned
        .signature
        .as_deref()
        .context("no ed25519 signature")?;
    std::fs::copy(sig, site.join("unsigned.efi.sig"))?;
    let port = serve_files(site.clone())?;
    let refused = vm.command(&format!("update http://10.0.2.2:{port}/unsigned.efi"))?;
    ensure!(
        refused.contains("signature verified") || vm.output().contains("signature verified"),
        "the ed25519 signature was not checked first:\n{refused}"
    );
    ensure!(
        refused
            .contains("update refused: Secure Boot is on and the firmware would refuse this image")
            && refused.contains("unsigned")
            && refused.contains("nothing written"),
        "an update without an Authenticode signature:\n{refused}"
    );
    let slots = vm.command("slots")?;
    ensure!(
        slots.contains("slot B empty"),
        "the refused image reached slot B:\n{slots}"
    );
    Ok(refused
        .lines()
        .find(|l| l.contains("update refused"))
        .unwrap_or_default()
        .to_string())
}

/// The three disks under the Secure Boot firmware (see the module's comment).
pub fn secure_boot_boots_only_signed_images(image: &Image) -> Result<SecureBootReport> {
    let mut signed = test_options("secure-boot-signed", "");
    signed.secure_boot = Some((SNAKEOIL_KEY.into(), SNAKEOIL_CERT.into()));
    let signed = crate::image::build_boot(image, &signed)?;
    let unsigned = crate::image::build_boot(image, &test_options("secure-boot-unsigned", ""))?;

    let machine = UefiMachine::new_secure_boot("secure-boot-unsigned", &unsigned)?;
    // The boot manager itself is refused: `BdsDxe: failed to load Boot0001 ...: Access Denied`.
    let unsigned_refusal = firmware_refuses(&machine, "secure_boot_unsigned", "failed to load")?;
    drop(machine);

    let machine = UefiMachine::new_secure_boot("secure-boot-changed", &signed)?;
    let slot = Slot::A.path();
    let mut efi = machine
        .read_file(Role::Esp, &slot)?
        .context("no slot A image")?;
    let at = efi.len() / 2;
    efi[at] ^= 0x01;
    machine.write_file(Role::Esp, &slot, &efi)?;
    // systemd-boot starts and the firmware refuses the slot's image it loads:
    // `Error loading \EFI\Linux\ringstore-a.efi: Access Denied`.
    let changed_refusal = firmware_refuses(&machine, "secure_boot_changed", "ringstore-a.efi")?;
    drop(machine);

    let machine = UefiMachine::new_secure_boot("secure-boot", &signed)?;
    let mut vm = machine.boot("secure_boot_signed")?;
    let ready = vm.wait_for(READY, 0, BOOT_LIMIT)?;
    let ready_wall = vm.started.elapsed();
    vm.wait_for(PROMPT, ready, Duration::from_secs(20))?;
    signed_boots_and_says_so(&mut vm)?;
    let update_refusal = unsigned_update_refused(&mut vm, &unsigned)?;
    vm.poweroff()?;
    Ok(SecureBootReport {
        unsigned_refusal,
        changed_refusal,
        update_refusal,
        ready_wall,
    })
}
