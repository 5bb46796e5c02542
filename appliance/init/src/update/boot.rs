//! The slots at boot: which slot booted, which is committed, how the last trial went, and
//! whether this boot is a trial the canary has yet to decide.

use std::io::{Read, Seek, Write};
use std::path::Path;

use ringstore_bootdisk::slots::{self, Slot, Trial};
use ringstore_bootdisk::{Layout, Role};

use super::esp::{self, esp_fs, read_efi_string, read_text, write_text};
use crate::state::SlotsState;
use crate::{error, info, warn};

/// At boot (with the boot capabilities): mounts efivarfs, finds the ESP and reads which slot
/// booted, which is committed and how the last trial went; reports a failed trial.
pub fn boot_state() -> SlotsState {
    let mut st = SlotsState::default();
    if !Path::new("/sys/firmware/efi").exists() {
        return st;
    }
    if !esp::loader_var("LoaderInfo").exists() {
        mount_efivars();
    }
    let layout = Layout::builtin();
    let Some(esp) = crate::bootdisk::find(&layout, Role::Esp) else {
        return st;
    };
    // After a kexec jump the firmware's variable still names the slot it booted: the jump's
    // command line names the one running (ADR 0054).
    let running = crate::cmdline::running_or_empty();
    st.booted = crate::kexec::slot_from_cmdline(running)
        .or_else(|| read_efi_string("LoaderEntrySelected").and_then(|id| Slot::from_entry_id(&id)));
    let fs = match esp_fs(&esp) {
        Ok(fs) => fs,
        Err(why) => {
            warn!("{why}");
            return st;
        }
    };
    st.committed = read_text(&fs, slots::LOADER_CONF).and_then(|c| slots::default_slot(&c));
    st.trial = read_text(&fs, slots::TRIAL_FILE).and_then(|t| Trial::parse(&t));
    st.canary_token = read_text(&fs, esp::CANARY_TOKEN_FILE).map(|t| t.trim().to_string());
    if let (Some(booted), Some(trial)) = (st.booted, st.trial.clone()) {
        judge_last_trial(&mut st, &fs, booted, trial);
    }
    let _ = fs.unmount();
    st.esp = Some(esp);
    st
}

fn mount_efivars() {
    let _ = std::fs::create_dir_all(esp::EFIVARS);
    if let Err(err) = ringstore_sys::mount(
        "efivarfs",
        esp::EFIVARS,
        "efivarfs",
        ringstore_sys::MountFlags::NOSUID
            .union(ringstore_sys::MountFlags::NODEV)
            .union(ringstore_sys::MountFlags::NOEXEC),
        "",
    ) {
        warn!("efivarfs: {err}; A/B updates are off");
    }
}

/// What the trial record means for this boot of `booted`: a trial under way (this boot decides
/// it), a trial that never reported (recorded as failed now), or an earlier failure to report.
fn judge_last_trial<T: Read + Write + Seek>(
    st: &mut SlotsState,
    fs: &fatfs::FileSystem<T>,
    booted: Slot,
    trial: Trial,
) {
    if trial.outcome == "pending" && booted == trial.to && st.committed != Some(booted) {
        st.trying = true;
        info!(
            "update: trial boot of slot {booted} (from slot {}): the canary decides",
            trial.from
        );
    } else if trial.outcome == "pending" && booted == trial.from {
        let why = format!(
            "failed: the trial boot of slot {} never reported (hang, crash or watchdog reset); back on slot {booted}",
            trial.to
        );
        let decided = Trial {
            outcome: why.clone(),
            ..trial
        };
        let _ = write_text(fs, slots::TRIAL_FILE, &decided.render());
        st.trial = Some(decided);
        error!("update: {why}");
    } else if trial.outcome.starts_with("failed") && booted == trial.from {
        error!(
            "update: last trial of slot {}: {}; running slot {booted}",
            trial.to, trial.outcome
        );
    }
}
