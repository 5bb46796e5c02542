//! The trial's verdict, once boot is done: the canary passed, so the booted slot becomes the
//! default (commit); or it did not (or nothing became ready), so the trial record says why and
//! the machine reboots into the old slot.

use std::io::{Read, Seek, Write};

use ringstore_bootdisk::fat;
use ringstore_bootdisk::slots::{self, Slot, Trial};

use super::canary::{canary, CANARY_OP_LIMIT};
use super::esp::{self, esp_fs, write_text};
use crate::machine::Machine;
use crate::power::{self, Action};
use crate::{error, info};

/// After boot: on a trial, the verdict (commit, or record why and reboot to the old slot).
pub fn decide_trial(machine: &Machine) {
    let (trying, esp, booted, trial, token, config, ready, not_serving) = {
        let st = machine.state();
        (
            st.slots.trying,
            st.slots.esp.clone(),
            st.slots.booted,
            st.slots.trial.clone(),
            st.slots.canary_token.clone(),
            st.config.clone(),
            st.ready_line.is_some(),
            st.not_serving.clone(),
        )
    };
    let (true, Some(esp), Some(booted), Some(trial)) = (trying, esp, booted, trial) else {
        return;
    };
    let verdict = match (ready, config) {
        (true, Some(config)) => canary(&config, token.as_deref(), CANARY_OP_LIMIT),
        _ => Err(format!(
            "never became ready: {}",
            not_serving.unwrap_or_else(|| "no ready line".into())
        )),
    };
    let fs = match esp_fs(&esp) {
        Ok(fs) => fs,
        Err(why) => {
            error!("update: {why}; cannot record the trial; rebooting to the old slot");
            power::shutdown(machine, Action::Reboot);
        }
    };
    match verdict {
        Ok(note) => commit(machine, fs, booted, trial, &note),
        Err(why) => fail(machine, fs, booted, trial, &why),
    }
}

/// The canary passed: `booted` becomes the default; the trial record says so. A commit that
/// cannot be written reboots to the old slot.
fn commit<T: Read + Write + Seek>(
    machine: &Machine,
    fs: fatfs::FileSystem<T>,
    booted: Slot,
    trial: Trial,
    note: &str,
) {
    let committed = Trial {
        outcome: "committed".into(),
        ..trial
    };
    let written = write_text(&fs, slots::LOADER_CONF, &slots::loader_conf(booted))
        .and_then(|()| write_text(&fs, slots::TRIAL_FILE, &committed.render()));
    let _ = fat::remove_file(&fs, esp::CANARY_TOKEN_FILE);
    let _ = fs.unmount();
    ringstore_sys::sync();
    match written {
        Ok(()) => {
            info!("update: {note}; slot {booted} committed");
            let mut st = machine.state();
            st.slots.trying = false;
            st.slots.committed = Some(booted);
            st.slots.trial = Some(committed);
        }
        Err(why) => {
            error!("update: commit failed: {why}; rebooting to the old slot");
            power::shutdown(machine, Action::Reboot);
        }
    }
}

/// The trial failed: the record says why, and the machine goes back to the committed slot,
/// by a kexec jump when its kernel loads (the RAM tier comes along, ADR 0054), else through
/// the firmware, which boots the committed slot by itself (no one-shot entry is left: a
/// firmware trial spent it, a jump never set it).
fn fail<T: Read + Write + Seek>(
    machine: &Machine,
    fs: fatfs::FileSystem<T>,
    booted: Slot,
    trial: Trial,
    why: &str,
) -> ! {
    let outcome = format!("failed: {why}");
    let back = machine.state().slots.committed.unwrap_or(trial.from);
    let _ = write_text(
        &fs,
        slots::TRIAL_FILE,
        &Trial {
            outcome: outcome.clone(),
            ..trial
        }
        .render(),
    );
    let _ = fs.unmount();
    error!("update: trial of slot {booted} {outcome}; back to slot {back}");
    power::to_slot(machine, Some(back), "update")
}
