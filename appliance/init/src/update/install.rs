//! `update URL`: fetch a signed ringstore.efi, verify it against the running image's key, write
//! the inactive slot and read it back, leave the canary token, record the pending trial and
//! jump into it with kexec (ADR 0054; else set the one-shot entry and reboot into it). Nothing is written before the signature verified and,
//! under Secure Boot, the firmware's db was found to trust the image (ADR 0051).

use std::io::{Read, Seek, Write};
use std::time::{Duration, Instant};

use ringstore_bootdisk::slots::{self, Slot, Trial};
use ringstore_bootdisk::{fat, signature};

use super::canary::{local, low_nanos, memcache_set, CANARY_KEY, CANARY_OP_LIMIT};
use super::esp::{self, esp_fs, write_one_shot, write_text};
use crate::machine::Machine;
use crate::power::{self, Action};
use crate::{error, info, warn};

/// The biggest ringstore.efi `update` accepts.
pub const IMAGE_MAX: usize = 96 << 20;
/// The whole download (image and signature) must end within this.
pub const FETCH_LIMIT: Duration = Duration::from_secs(180);

/// What `update` says on a box that did not boot from disk.img.
pub const NETWORK_BOOT_UPDATE: &str = "this box booted without disk.img (PXE or -kernel): it runs the kernel and initramfs its boot server hands it, so nothing is written here; to update it, put the new bundle on the boot server (`cargo xtask pxe --inventory ...`) and `reboot` (docs/OPERATIONS.md, \"Disk boot and PXE\")";

/// `update URL`: fetch, verify, write the inactive slot, record the trial, reboot into it once.
pub fn update(machine: &Machine, url: &str) -> Vec<String> {
    if machine.state().slots.esp.is_none() {
        // A network (or `-kernel`) boot has no slots to write: it runs what its boot server
        // hands it, so its update is a new bundle and a reboot, not a refusal.
        let line = NETWORK_BOOT_UPDATE;
        info!("update: {line}");
        return vec![format!("update: {line}")];
    }
    let target = match prepare(machine, url) {
        Ok(target) => target,
        Err(why) => {
            error!("update refused: {why}");
            return vec![format!("update refused: {why}")];
        }
    };
    // Without the firmware first (ADR 0054): the RAM tier comes along; the trial is marked by
    // the pending record and the next kernel's `ringstore_slot=`, no one-shot entry is set.
    match crate::kexec::load(machine, target) {
        Ok(what) => {
            info!("update: slot {target} written; {what}; jumping into it for a trial");
            power::kexec_or_firmware(machine, &|| firmware_trial(machine, target));
        }
        Err(why) => warn!("update: no kexec ({why}); through the firmware"),
    }
    match write_one_shot(target.entry_id()) {
        Ok(()) => {
            info!("update: slot {target} written; rebooting into it for a trial");
            power::shutdown(machine, Action::Reboot);
        }
        Err(why) => {
            let why = format!("the one-shot entry: {why}");
            record_failed(machine, target, &why);
            error!("update refused: {why}");
            vec![format!("update refused: {why}")]
        }
    }
}

/// The jump into `target` returned after the server stopped: the firmware boots the trial
/// instead, through the one-shot entry; without one, the trial is recorded as failed (with
/// why), and the firmware boots the committed slot.
fn firmware_trial(machine: &Machine, target: Slot) {
    after_failed_jump(
        target,
        || write_one_shot(target.entry_id()),
        |why| record_failed(machine, target, why),
    );
}

/// [`firmware_trial`]'s decision, with the one-shot write and the failure record given: the
/// trial still runs (the one-shot entry written) or is recorded as failed, never left
/// pending for the committed slot to misread as a trial that never reported.
fn after_failed_jump(
    target: Slot,
    one_shot: impl FnOnce() -> Result<(), String>,
    record_failed: impl FnOnce(&str),
) {
    match one_shot() {
        Ok(()) => {
            info!("update: the one-shot entry names slot {target}: the firmware boots its trial")
        }
        Err(why) => {
            let why = format!("the kexec jump failed and so did the one-shot entry: {why}");
            record_failed(&why);
            error!("update: {why}; the firmware boots the committed slot");
        }
    }
}

/// The pending trial of `target` recorded as failed: nothing will boot it.
fn record_failed(machine: &Machine, target: Slot, why: &str) {
    let (esp, booted) = {
        let st = machine.state();
        (st.slots.esp.clone(), st.slots.booted)
    };
    let (Some(esp), Some(booted)) = (esp, booted) else {
        return;
    };
    if let Ok(fs) = esp_fs(&esp) {
        let trial = Trial {
            from: booted,
            to: target,
            outcome: format!("failed: {why}"),
        };
        let _ = write_text(&fs, slots::TRIAL_FILE, &trial.render());
        let _ = fs.unmount();
    }
}

fn prepare(machine: &Machine, url: &str) -> Result<Slot, String> {
    let (st, config) = {
        let state = machine.state();
        (state.slots.clone(), state.config.clone())
    };
    let (Some(esp), Some(booted)) = (st.esp.clone(), st.booted) else {
        return Err(
            "not booted from disk.img through systemd-boot (no ESP or no LoaderEntrySelected)"
                .into(),
        );
    };
    if st.trying {
        return Err("this boot is an uncommitted trial".into());
    }
    let started = Instant::now();
    let image = fetch_verified(url, started)?;
    let target = booted.other();
    let fs = esp_fs(&esp)?;
    write_slot(&fs, target, &image)?;
    let token = format!(
        "{:016x}",
        low_nanos(started.elapsed()) ^ u64::from(std::process::id()) ^ 0x9e37_79b9_7f4a_7c15
    );
    // With a data device the old system leaves a key the trial must read back after recovery.
    let mut wrote_token = false;
    if let Some(config) = config.filter(|c| c.data.is_some()) {
        if let Some(addr) = config.memcache.map(local) {
            let set = format!("set {CANARY_KEY} 0 0 {}\r\n{token}\r\n", token.len());
            wrote_token = memcache_set(CANARY_OP_LIMIT, addr, "canary key", &set)?;
            if !wrote_token {
                // A full `refuse` device takes no new key, this one included (ADR 0039):
                // the trial then runs its canary without a key to read back.
                info!("update: the data device is full (refuse): no canary key to read back");
            }
        }
    }
    if wrote_token {
        write_text(&fs, esp::CANARY_TOKEN_FILE, &token)?;
    } else {
        let _ = fat::remove_file(&fs, esp::CANARY_TOKEN_FILE);
    }
    if let Err(why) = record_trial(&fs, booted, target) {
        let _ = fs.unmount();
        return Err(why);
    }
    fs.unmount().map_err(|e| format!("ESP: {e}"))?;
    ringstore_sys::sync();
    Ok(target)
}

/// The image at `url`, its signature at `url.sig` verified against the running image's key,
/// and an EFI application; both downloads end within [`FETCH_LIMIT`] of `started`.
fn fetch_verified(url: &str, started: Instant) -> Result<Vec<u8>, String> {
    let key_text = std::fs::read_to_string(signature::PUBLIC_KEY_PATH).map_err(|e| {
        format!(
            "{}: {e} (image built without --signing-key: it takes no updates)",
            signature::PUBLIC_KEY_PATH
        )
    })?;
    let key = signature::public_key(&key_text).map_err(|e| e.to_string())?;
    let image = crate::fetch::get(url, IMAGE_MAX, FETCH_LIMIT).map_err(|e| e.to_string())?;
    let left = FETCH_LIMIT
        .saturating_sub(started.elapsed())
        .max(Duration::from_secs(5));
    let sig = crate::fetch::get(&format!("{url}.sig"), 1024, left).map_err(|e| e.to_string())?;
    let sig = String::from_utf8(sig).map_err(|_| "signature file is not text".to_string())?;
    signature::verify(&key, &image, &sig).map_err(|e| format!("{e}; nothing written"))?;
    if image.get(..2) != Some(b"MZ") {
        return Err("signed, but not an EFI application (no MZ header); nothing written".into());
    }
    info!(
        "update: {} bytes from {url}, signature verified",
        image.len()
    );
    // Under Secure Boot the firmware would refuse an image its db does not trust: writing one
    // would only turn the trial into a rollback (or, committed by hand, a box that never boots).
    match crate::secure_boot::check_image(&image) {
        Ok(Some(how)) => info!("update: Secure Boot on: the image is {how}"),
        Ok(None) => {}
        Err(why) => return Err(format!("{why}; nothing written")),
    }
    Ok(image)
}

/// Writes `image` to `target`'s file and reads it back: what boots must be what was verified.
fn write_slot<T: Read + Write + Seek>(
    fs: &fatfs::FileSystem<T>,
    target: Slot,
    image: &[u8],
) -> Result<(), String> {
    fat::write_file(fs, &target.path(), image).map_err(|e| format!("ESP: {e}"))?;
    let back =
        fat::read_file(fs, &target.path(), IMAGE_MAX as u64).map_err(|e| format!("ESP: {e}"))?;
    if back.as_deref() != Some(image) {
        return Err(format!("slot {target} reads back different bytes"));
    }
    // The slot's tuned entry carried the old image's command line: its new image's first
    // committed boot writes its own (`tuning/isolation.rs`).
    fat::remove_file(fs, &target.tuned_entry_path()).map_err(|e| format!("ESP: {e}"))
}

/// Records the pending trial of `target`; [`update`] then jumps into it or sets the one-shot
/// entry for the firmware.
fn record_trial<T: Read + Write + Seek>(
    fs: &fatfs::FileSystem<T>,
    booted: Slot,
    target: Slot,
) -> Result<(), String> {
    let trial = Trial {
        from: booted,
        to: target,
        outcome: "pending".into(),
    };
    write_text(fs, slots::TRIAL_FILE, &trial.render())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_jump_leaves_the_trial_to_the_firmware_or_records_why() {
        let recorded = std::cell::RefCell::new(Vec::<String>::new());
        after_failed_jump(
            Slot::B,
            || Ok(()),
            |why| recorded.borrow_mut().push(why.into()),
        );
        assert!(
            recorded.borrow().is_empty(),
            "a one-shot trial is still pending"
        );
        after_failed_jump(
            Slot::B,
            || Err("efivarfs: read-only".into()),
            |why| recorded.borrow_mut().push(why.into()),
        );
        assert_eq!(
            recorded.borrow().as_slice(),
            ["the kexec jump failed and so did the one-shot entry: efivarfs: read-only"]
        );
    }
}
