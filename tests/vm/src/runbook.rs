//! The runbook's procedures (docs/OPERATIONS.md, "Runbook") run as written on one disk.img box
//! whose data device is a second disk: "Rotate the update signing key" with the runbook's own
//! shell commands (read from OPERATIONS.md, so the test runs what the page prints), its update
//! inside "Drain a box from twemproxy, update it and put it back" (nutcracker on the host), then
//! "Replace a failed data disk": a disk that held a partition table is refused, zeroed with the
//! runbook's `dd` from the host, and the box serves empty from it. Four boots in all.

use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;

use anyhow::{ensure, Context, Result};

use super::client::{exchange, memcache_closed, memcache_set_get, tcp};
use super::drain::Pool;
use super::durable::console_line_with;
use super::uefi::{
    on_slot_b, serve_files, test_images, test_options, vmkey_still_there, Removed, UefiMachine,
    READY,
};
use super::vm::{scratch_dir, Vm};
use super::{BOOT_LIMIT, COMMAND_LIMIT, PROMPT};
use crate::image::{BootImage, Image};

/// The runbook's placeholders and what the test puts in their place.
const OLD_KEY: &str = "~/ringstore-keys/update.key";
const NEW_KEY: &str = "~/ringstore-keys/update-2.key";
const EFI: &str = "target/appliance/ringstore.efi";
const PEM: &str = "/dev/shm/old.pem";
const DATA_DISK: &str = "/dev/nvme1n1";
/// The data disk files: the size of the durable tests' data disk.
const DATA_MIB: u32 = 64;

/// The text of section `heading` ("### ...") of docs/OPERATIONS.md.
fn runbook_section(heading: &str) -> Result<String> {
    let text = std::fs::read_to_string(crate::util::root().join("docs/OPERATIONS.md"))?;
    let start = text
        .find(&format!("\n### {heading}\n"))
        .with_context(|| format!("OPERATIONS.md has no section {heading:?}"))?;
    let body = &text[start + heading.len() + 6..];
    // The next heading (a `#` line inside a code block is a shell comment, not one).
    let end = [body.find("\n## "), body.find("\n### ")]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(body.len());
    Ok(body[..end].to_string())
}

/// The `sh` block of "Rotate the update signing key" as commands: continuation lines joined,
/// comments left out.
fn rotation_commands() -> Result<Vec<String>> {
    let section = runbook_section("Rotate the update signing key")?;
    let commands = crate::util::docs::sh_commands(&section);
    ensure!(
        !commands.is_empty(),
        "the signing key section has no sh block"
    );
    Ok(commands)
}

/// `text` with `placeholder` replaced by `value`; an error if the runbook no longer says it.
fn substitute(text: &str, placeholder: &str, value: &Path) -> Result<String> {
    ensure!(
        text.contains(placeholder),
        "the runbook's command no longer names {placeholder}: {text}"
    );
    Ok(text.replace(placeholder, &value.display().to_string()))
}

/// Runs `script` with `sh -c` (`set -e` first); its stderr on failure.
fn sh(script: &str) -> Result<()> {
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!("set -e\n{script}"))
        .output()
        .context("running sh")?;
    ensure!(
        out.status.success(),
        "sh -c {script:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// The keys and images of the rotation, in `dir`: the runbook's keygen makes `update-2.key`;
/// the image built with it (`max_conns=777`, to tell it running) goes on the site as `new-only`
/// (its own signature) and as `rotated`, re-signed with the old key by the runbook's commands.
fn rotation_images(image: &Image, dir: &Path, site: &Path) -> Result<BootImage> {
    let commands = rotation_commands()?;
    let new_key = dir.join("update-2.key");
    let keygen = commands
        .iter()
        .find(|c| c.starts_with("cargo xtask keygen "))
        .context("no keygen command")?;
    let keygen = substitute(keygen, NEW_KEY, &new_key)?;
    let args: Vec<String> = keygen
        .split_whitespace()
        .skip(3)
        .map(String::from)
        .collect();
    crate::image::builder()?.keygen(&args)?;
    let build = commands
        .iter()
        .position(|c| c.starts_with("cargo xtask image "))
        .context("no image command")?;
    ensure!(
        commands[build].contains(&format!("--signing-key {NEW_KEY}")),
        "the image is not built with the new key: {}",
        commands[build]
    );
    // `cargo xtask image --signing-key update-2.key`, built as the other UEFI tests build.
    let mut opts = test_options("runbook-new", "ringstore.max_conns=777");
    opts.signing_key = Some(new_key);
    let new = crate::image::build_boot(image, &opts)?;
    std::fs::copy(&new.efi, site.join("new-only.efi"))?;
    let sig = new.signature.as_deref().context("no signature")?;
    std::fs::copy(sig, site.join("new-only.efi.sig"))?;
    std::fs::copy(&new.efi, site.join("rotated.efi"))?;
    let old_key = crate::util::root().join("image/test-signing-key.hex");
    let mut script = commands[build + 1..].join("\n");
    script = substitute(&script, OLD_KEY, &old_key)?;
    script = substitute(&script, EFI, &site.join("rotated.efi"))?;
    script = substitute(&script, PEM, &dir.join("old.pem"))?;
    sh(&script)?;
    Ok(new)
}

/// The runbook's command that zeroes a disk's start, run on `disk` (an image file).
fn zero_disk_start(disk: &Path) -> Result<()> {
    let section = runbook_section("Replace a failed data disk")?;
    let dd = section
        .split('`')
        .find(|c| c.starts_with("dd if=/dev/zero"))
        .context("the disk section has no dd command")?;
    sh(&substitute(dd, DATA_DISK, disk)?)
}

/// Boots `machine` with `data` as its data disk, to the prompt after the ready line.
fn boot_ready(machine: &UefiMachine, name: &str, data: &Path) -> Result<Vm> {
    let mut vm = machine.boot_with_data_disk(name, data)?;
    let ready = vm.wait_for(READY, 0, BOOT_LIMIT)?;
    vm.wait_for(PROMPT, ready, COMMAND_LIMIT)?;
    Ok(vm)
}

/// `update URL` is refused for a signature that does not match, nothing written.
fn update_refused(vm: &mut Vm, url: &str, when: &str) -> Result<()> {
    let refused = vm.command(&format!("update {url}"))?;
    ensure!(
        refused.contains("update refused: signature does not match")
            && refused.contains("nothing written"),
        "{when}:\n{refused}"
    );
    Ok(())
}

/// What the runbook test saw.
#[derive(Debug)]
pub struct RunbookReport {
    pub commit_line: String,
    pub drain_line: String,
    pub refusal_line: String,
    pub replaced_line: String,
}

/// "Rotate the update signing key" then "Replace a failed data disk", on one box (slot A signed
/// with the test key as the old key; `data = "/dev/vdb"` in its config partition).
pub fn rotate_signing_key_and_replace_data_disk(image: &Image) -> Result<RunbookReport> {
    let dir = scratch_dir("runbook")?;
    let _removed = Removed(dir.clone());
    let site = dir.join("site");
    std::fs::create_dir(&site)?;
    let a = test_images(image, "runbook-a", "")?;
    // The drain's host server, built before any boot.
    let binary = crate::image::builder()?.release_binary()?;
    rotation_images(image, &dir, &site)?;
    // An image signed only with the old key: slot A's own.
    std::fs::copy(&a.efi, site.join("old-only.efi"))?;
    std::fs::copy(
        a.signature.as_deref().context("no signature")?,
        site.join("old-only.efi.sig"),
    )?;
    let port = serve_files(site)?;
    let url = |name: &str| format!("http://10.0.2.2:{port}/{name}.efi");

    let machine = UefiMachine::new("runbook", &a)?;
    machine.write_config("data = \"/dev/vdb\"\n")?;
    let first = dir.join("data-1.raw");
    ensure!(
        crate::qemu::ensure_disk(&first, DATA_MIB)?,
        "{} was there before the test",
        first.display()
    );
    let mut vm = boot_ready(&machine, "runbook_rotate", &first)?;
    console_line_with(&vm, "data device /dev/vdb: formatted")?;
    memcache_set_get(vm.port("memcache", 0)?)?;
    // "Drain a box from twemproxy, update it and put it back" around the rotation's update.
    let mut pool = Pool::start(&binary, &dir, vm.port("memcache", 0)?)?;
    let moved = pool.drain()?;
    let commit_line = rotate(&mut vm, &url)?;
    pool.flush_box(&moved)?;
    let drain_line = pool.rejoin(&moved)?;
    drop(pool);
    vm.poweroff()?;
    drop(vm);

    // The data disk failed: a used disk (a GPT, as `dd` of disk.img leaves) goes in.
    let second = dir.join("data-2.raw");
    let mut head = Vec::new();
    std::fs::File::open(&a.disk)?
        .take(1 << 20)
        .read_to_end(&mut head)?;
    std::fs::write(&second, &head)?;
    std::fs::File::options()
        .write(true)
        .open(&second)?
        .set_len(u64::from(DATA_MIB) << 20)?;
    let refusal_line = refused_disk(&machine, &second)?;
    zero_disk_start(&second)?;
    ensure!(
        std::fs::metadata(&second)?.len() == u64::from(DATA_MIB) << 20,
        "the runbook's dd changed the disk's size"
    );
    let replaced_line = serves_empty(&machine, &second)?;
    Ok(RunbookReport {
        commit_line,
        drain_line,
        refusal_line,
        replaced_line,
    })
}

/// On the running old-key box: the new key's image with only its own signature is refused; the
/// one the runbook re-signed with the old key commits; the data disk kept its key; then an image
/// signed only with the old key is refused. The commit line.
fn rotate(vm: &mut Vm, url: &dyn Fn(&str) -> String) -> Result<String> {
    update_refused(
        vm,
        &url("new-only"),
        "the new key's own signature on the old box",
    )?;
    let at = vm.output().len();
    vm.command_no_wait(&format!("update {}", url("rotated")))?;
    let committed = vm.wait_for("slot B committed", at, BOOT_LIMIT * 2)?;
    vm.wait_for(PROMPT, committed, COMMAND_LIMIT)?;
    let out = vm.output();
    let commit_line = out[at..committed].lines().last().unwrap_or("").to_string();
    on_slot_b(vm, "last trial A -> B: committed", "after the rotation")?;
    vmkey_still_there(vm, "after the rotation")?;
    update_refused(
        vm,
        &url("old-only"),
        "the old key's image on the rotated box",
    )?;
    let slots = vm.command("slots")?;
    ensure!(
        slots.contains("booted B") && slots.contains("committed B"),
        "after the refused old-key image:\n{slots}"
    );
    Ok(commit_line)
}

/// PID 1's line for a data device it cannot use.
const FATAL: &str = "ringstore: fatal: data device /dev/vdb:";

/// A data disk holding a GPT: PID 1 refuses it in one line naming the signature and the key
/// that would format it, nothing serves, and the box reboots after 10 s (the default
/// `on_fatal`) into the same refusal. The disk's first sector is untouched. The refusal line.
fn refused_disk(machine: &UefiMachine, disk: &Path) -> Result<String> {
    let mut vm = machine.boot_with_data_disk("runbook_refused", disk)?;
    let at = vm.wait_for(FATAL, 0, BOOT_LIMIT)?;
    let line_end = vm.wait_for("\n", at, COMMAND_LIMIT)?;
    let out = vm.output();
    let line = out[out[..at].rfind('\n').map_or(0, |i| i + 1)..line_end]
        .trim()
        .to_string();
    ensure!(
        line.contains("GPT") && line.contains("ringstore.data_format=force"),
        "the refusal does not name the partition table and the key: {line}"
    );
    vm.wait_for("rebooting in 10 s", at, COMMAND_LIMIT)?;
    // The reboot comes up on the same slot and refuses the disk again: a loop, never serving.
    let again = vm.wait_for(FATAL, line_end, BOOT_LIMIT)?;
    vm.wait_for("\n", again, COMMAND_LIMIT)?;
    ensure!(
        !vm.output().contains("ringstore: ready"),
        "served although the data disk was refused"
    );
    memcache_closed(vm.port("memcache", 0)?)?;
    vm.power_cut()?;
    let mut signature = [0u8; 8];
    std::fs::File::open(disk)?.read_exact_at(&mut signature, 512)?;
    ensure!(&signature == b"EFI PART", "the refused disk was written to");
    Ok(line)
}

/// The zeroed disk: formatted at boot, the box serves empty (`status` names the device,
/// `data` counts no records, the key of the old disk is a miss) and stores again.
fn serves_empty(machine: &UefiMachine, disk: &Path) -> Result<String> {
    let mut vm = boot_ready(machine, "runbook_replaced", disk)?;
    let line = console_line_with(&vm, "data device /dev/vdb: formatted: 0 objects")?;
    let status = vm.command("status")?;
    ensure!(
        status.contains("data /dev/vdb: block device"),
        "status after the swap:\n{status}"
    );
    let data = vm.json("data")?;
    let state = data.first().map(|d| d["state"].clone()).unwrap_or_default();
    ensure!(
        state["records"] == 0 && state["live_bytes"] == 0,
        "`data` on the new disk: {data:?}"
    );
    let port = vm.port("memcache", 0)?;
    let got = exchange(&mut tcp(port)?, b"get vmkey\r\n", |t| {
        t.ends_with("END\r\n")
    })?;
    ensure!(got == "END\r\n", "the new disk answered {got:?}");
    memcache_set_get(port)?;
    vm.poweroff()?;
    Ok(line)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runbook_commands_are_found() {
        let commands = rotation_commands().unwrap();
        assert!(commands[0].starts_with("cargo xtask keygen "));
        assert!(commands.iter().any(|c| c.starts_with("cargo xtask image ")));
        assert!(commands.iter().any(|c| c.contains("openssl pkeyutl -sign")));
        assert!(commands.iter().all(|c| !c.contains('\\')));
        let section = runbook_section("Replace a failed data disk").unwrap();
        assert!(section.contains("dd if=/dev/zero"));
        // What the drain test does (drain.rs), as the page says it.
        let drain =
            runbook_section("Drain a box from twemproxy, update it and put it back").unwrap();
        for step in [
            "Remove the box's server line (`- IP:PORT:1`) from `nutcracker.yml`",
            "restart `nutcracker`",
            "Run `flush_all` on it (memcache port)",
            "Put its line back and restart `nutcracker`",
            "QEMU: `runbook_rotates_signing_key_and_replaces_data_disk` runs steps 1 to 4",
        ] {
            assert!(drain.contains(step), "{step:?} not in\n{drain}");
        }
    }
}
