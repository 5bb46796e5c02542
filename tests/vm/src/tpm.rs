//! The QEMU test of the TPM-sealed data key (ADR 0053) with `swtpm` as the TPM 2.0 (CRB) and
//! the Secure Boot firmware of ADR 0051: the first boot makes, seals and stores the key and
//! formats the data partition with it; keys written come back after a reboot (the key unsealed
//! again); `data rekey` (ADR 0055) switches to a new TPM-sealed key, more keys are written,
//! `data` shows the old key retired, and after another reboot every key is back under the new
//! key; the raw disk holds none of them in clear; the same disk and TPM state under plain
//! OVMF (Secure Boot off, so another PCR 7) is refused: the box serves from RAM, `status` and
//! `tuning` say why, and the data partition is unchanged. Then `data reseal` (ADR 0053) under
//! Secure Boot again; Secure Boot off: the device opens, the key resealed to that PCR 7, every
//! key back; a reboot still off opens with the new seal (the one-boot copy spent); Secure Boot
//! on again and a fresh TPM state are refused as above.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use ringstore_bootdisk::Role;
use sha2::Digest;

use super::client::{get_at, set_at};
use super::secure_boot::{SNAKEOIL_CERT, SNAKEOIL_KEY};
use super::uefi::{test_options, UefiMachine, READY};
use super::vm::{scratch_dir, Vm};
use super::{BOOT_LIMIT, PROMPT};
use crate::image::Image;

const SWTPM: &str = "/usr/bin/swtpm";
const KEYS: usize = 8;

/// What the test saw.
#[derive(Debug)]
pub struct TpmReport {
    pub sealed_line: String,
    pub secure_boot_off_line: String,
    pub resealed_line: String,
    pub secure_boot_back_line: String,
    pub other_tpm_line: String,
}

/// A `swtpm` serving one QEMU through its control socket, its state in `state`.
struct Swtpm {
    child: Child,
    ctrl: PathBuf,
}

impl Swtpm {
    fn start(state: &Path) -> Result<Swtpm> {
        ensure!(
            Path::new(SWTPM).exists(),
            "swtpm is not installed (apt-get install swtpm; cargo xtask deps)"
        );
        let ctrl = state.join("ctrl.sock");
        let _ = std::fs::remove_file(&ctrl);
        let child = Command::new(SWTPM)
            .arg("socket")
            .arg("--tpm2")
            .arg("--tpmstate")
            .arg(format!("dir={}", state.display()))
            .arg("--ctrl")
            .arg(format!("type=unixio,path={}", ctrl.display()))
            .arg("--log")
            .arg(format!(
                "file={},level=1",
                state.join("swtpm.log").display()
            ))
            .spawn()
            .context("starting swtpm")?;
        let limit = std::time::Instant::now() + Duration::from_secs(10);
        while !ctrl.exists() {
            ensure!(std::time::Instant::now() < limit, "swtpm made no socket");
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(Swtpm { child, ctrl })
    }
}

impl Drop for Swtpm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn key(i: usize) -> String {
    format!("tpmkey-{i}")
}

fn value(i: usize) -> String {
    format!("tpm-secret-value-{i}-").repeat(4)
}

/// Boots with `tpm`, waits for the ready line and the prompt, and returns `status`.
fn boot(machine: &UefiMachine, name: &str, tpm: &Swtpm) -> Result<(Vm, String)> {
    let mut vm = machine.boot_with_tpm(name, &tpm.ctrl)?;
    let ready = vm.wait_for(READY, 0, BOOT_LIMIT)?;
    vm.wait_for(PROMPT, ready, Duration::from_secs(20))?;
    let status = vm.command("status")?;
    Ok((vm, status))
}

/// The `status` line that starts with `data at rest`.
fn at_rest_line(status: &str) -> Result<String> {
    status
        .lines()
        .find(|l| l.contains("data at rest"))
        .map(|l| l.trim().to_string())
        .with_context(|| format!("no `data at rest` line in status:\n{status}"))
}

fn data_partition_digest(machine: &UefiMachine) -> Result<Vec<u8>> {
    let (start, len) = machine.partition(Role::Data)?;
    let disk = std::fs::read(&machine.disk)?;
    let end = usize::try_from(start + len)?.min(disk.len());
    Ok(sha2::Sha256::digest(&disk[usize::try_from(start)?..end]).to_vec())
}

/// A boot the TPM refuses: RAM only, `status` and `tuning` say why (`why`), the data
/// partition byte for byte as before.
fn refused_boot(machine: &UefiMachine, name: &str, tpm: &Swtpm, why: &str) -> Result<String> {
    let before = data_partition_digest(machine)?;
    let (mut vm, status) = boot(machine, name, tpm)?;
    let line = at_rest_line(&status)?;
    ensure!(
        line.contains("refused") && line.contains(why) && status.contains("data none (RAM only)"),
        "{name}: status:\n{status}"
    );
    let tuning = vm.command("tuning")?;
    ensure!(
        tuning.contains("WARN data at rest refused"),
        "{name}: tuning:\n{tuning}"
    );
    let port = vm.port("memcache", 0)?;
    ensure!(
        get_at(port, &key(0))?.is_none(),
        "{name}: a durable key served"
    );
    set_at(port, "ram-only", "still serves")?;
    vm.poweroff()?;
    ensure!(
        data_partition_digest(machine)? == before,
        "{name}: the data partition changed"
    );
    Ok(line)
}

/// `data rekey`, keys `KEYS..2*KEYS` written under the new key, `data` polled until the old
/// key is retired (traffic wakes the workers' compaction), then a reboot: the new key
/// unsealed, every key back.
fn rekey_and_reboot(vm: &mut Vm) -> Result<()> {
    let out = vm.command("data rekey")?;
    ensure!(out.contains("rekeyed"), "data rekey:\n{out}\n{}", vm.tail());
    let port = vm.port("memcache", 0)?;
    for i in KEYS..2 * KEYS {
        set_at(port, &key(i), &value(i))?;
    }
    let limit = std::time::Instant::now() + Duration::from_secs(180);
    loop {
        let data = vm.command("data")?;
        if data.contains("1 old keys retired") {
            break;
        }
        ensure!(
            std::time::Instant::now() < limit,
            "the old key was not retired:\n{data}"
        );
        get_at(port, &key(0))?;
        std::thread::sleep(Duration::from_secs(1));
    }
    let before_reboot = vm.output().len();
    vm.command_no_wait("reboot")?;
    let ready = vm.wait_for(READY, before_reboot, BOOT_LIMIT)?;
    vm.wait_for(PROMPT, ready, Duration::from_secs(20))?;
    let status = vm.command("status")?;
    ensure!(
        at_rest_line(&status)?.contains("unsealed at this boot"),
        "after the rekey and a reboot:\n{status}"
    );
    let port = vm.port("memcache", 0)?;
    for i in 0..2 * KEYS {
        ensure!(
            get_at(port, &key(i))?.as_deref() == Some(value(i).as_str()),
            "{} lost after the rekey and a reboot",
            key(i)
        );
    }
    Ok(())
}

/// Every key `0..2 * KEYS` served from the data device.
fn keys_back(vm: &mut Vm, when: &str) -> Result<()> {
    let port = vm.port("memcache", 0)?;
    for i in 0..2 * KEYS {
        ensure!(
            get_at(port, &key(i))?.as_deref() == Some(value(i).as_str()),
            "{} lost {when}",
            key(i)
        );
    }
    Ok(())
}

/// `data reseal` under Secure Boot (the device as the refused boot left it), then two boots
/// with Secure Boot off: the first reseals the key to that PCR 7 and spends the one-boot copy,
/// the second opens with the new seal alone. Returns the first one's `data at rest` line.
fn reseal_to_secure_boot_off(machine: &mut UefiMachine, state: &Path) -> Result<String> {
    machine.set_secure_boot(true)?;
    let tpm = Swtpm::start(state)?;
    let (mut vm, status) = boot(machine, "tpm_reseal", &tpm)?;
    ensure!(
        at_rest_line(&status)?.contains("unsealed at this boot"),
        "Secure Boot back on:\n{status}"
    );
    keys_back(&mut vm, "after the refused boot")?;
    let out = vm.command("data reseal")?;
    ensure!(
        out.contains("resealing: the next boot"),
        "data reseal:\n{out}\n{}",
        vm.tail()
    );
    let data = vm.command("data")?;
    ensure!(
        data.contains("waits for the next boot"),
        "data after data reseal:\n{data}"
    );
    vm.poweroff()?;
    drop(tpm);

    machine.set_secure_boot(false)?;
    let tpm = Swtpm::start(state)?;
    let (mut vm, status) = boot(machine, "tpm_resealed", &tpm)?;
    let line = at_rest_line(&status)?;
    ensure!(
        line.contains("resealed to the present PCR 7 at this boot (data reseal)")
            && line.contains("Secure Boot is off"),
        "Secure Boot off after data reseal:\n{status}\n{}",
        vm.tail()
    );
    keys_back(&mut vm, "after data reseal and Secure Boot off")?;
    let data = vm.command("data")?;
    ensure!(
        !data.contains("waits for the next boot"),
        "the one-boot copy is left:\n{data}"
    );
    let before_reboot = vm.output().len();
    vm.command_no_wait("reboot")?;
    let ready = vm.wait_for(READY, before_reboot, BOOT_LIMIT)?;
    vm.wait_for(PROMPT, ready, Duration::from_secs(20))?;
    let status = vm.command("status")?;
    ensure!(
        at_rest_line(&status)?.contains("sealed to PCR 7 and unsealed at this boot"),
        "the boot after the reseal:\n{status}"
    );
    keys_back(&mut vm, "the boot after the reseal")?;
    vm.poweroff()?;
    Ok(line)
}

/// The boots described in the module's comment.
pub fn tpm_seals_the_data_key(image: &Image) -> Result<TpmReport> {
    let mut opts = test_options("tpm", "");
    opts.secure_boot = Some((SNAKEOIL_KEY.into(), SNAKEOIL_CERT.into()));
    let images = crate::image::build_boot(image, &opts)?;
    let mut machine = UefiMachine::new_secure_boot("tpm", &images)?;
    let state = scratch_dir("tpm-state")?;
    let tpm = Swtpm::start(&state)?;

    let (mut vm, status) = boot(&machine, "tpm_first", &tpm)?;
    let sealed_line = at_rest_line(&status)?;
    ensure!(
        sealed_line.contains("key made and sealed to PCR 7"),
        "first boot: {sealed_line}\n{}",
        vm.tail()
    );
    let tuning = vm.command("tuning")?;
    ensure!(!tuning.contains("WARN data at rest"), "tuning:\n{tuning}");
    let port = vm.port("memcache", 0)?;
    for i in 0..KEYS {
        set_at(port, &key(i), &value(i))?;
    }
    let before_reboot = vm.output().len();
    vm.command_no_wait("reboot")?;
    let ready = vm.wait_for(READY, before_reboot, BOOT_LIMIT)?;
    vm.wait_for(PROMPT, ready, Duration::from_secs(20))?;
    let status = vm.command("status")?;
    ensure!(
        at_rest_line(&status)?.contains("unsealed at this boot"),
        "after the reboot:\n{status}"
    );
    let port = vm.port("memcache", 0)?;
    for i in 0..KEYS {
        ensure!(
            get_at(port, &key(i))?.as_deref() == Some(value(i).as_str()),
            "{} lost after the reboot",
            key(i)
        );
    }
    rekey_and_reboot(&mut vm)?;
    vm.poweroff()?;
    drop(tpm);

    let disk = std::fs::read(&machine.disk)?;
    for i in 0..2 * KEYS {
        for needle in [key(i), value(i)] {
            if disk.windows(needle.len()).any(|w| w == needle.as_bytes()) {
                bail!("{needle:?} in clear on the disk");
            }
        }
    }

    machine.set_secure_boot(false)?;
    let tpm = Swtpm::start(&state)?;
    let secure_boot_off_line = refused_boot(&machine, "tpm_secure_boot_off", &tpm, "PCR 7")?;
    drop(tpm);

    let resealed_line = reseal_to_secure_boot_off(&mut machine, &state)?;
    machine.set_secure_boot(true)?;
    let tpm = Swtpm::start(&state)?;
    let secure_boot_back_line = refused_boot(&machine, "tpm_secure_boot_back", &tpm, "PCR 7")?;
    drop(tpm);

    let fresh = scratch_dir("tpm-state-fresh")?;
    let tpm = Swtpm::start(&fresh)?;
    let other_tpm_line = refused_boot(&machine, "tpm_other", &tpm, "another TPM")?;
    drop(tpm);
    let _ = std::fs::remove_dir_all(&state);
    let _ = std::fs::remove_dir_all(&fresh);
    Ok(TpmReport {
        sealed_line,
        secure_boot_off_line,
        resealed_line,
        secure_boot_back_line,
        other_tpm_line,
    })
}
