//! The worker CPUs isolated without a hand-written kernel command line. At run time PID 1
//! makes a cgroup v2 cpuset partition (`/sys/fs/cgroup/ringstore-workers`, threaded,
//! `cpuset.cpus.partition = isolated`) of the worker CPUs and moves the workers pinned there
//! into it: no load balancing, no unbound work on them from then on. What only a boot
//! argument can give (`nohz_full=`) it writes into the booted slot's tuned boot entry
//! (`loader/entries/ringstore-X.conf`, the slot's own command line plus `nohz_full=`) and makes
//! that the default, so the next boot is fully tuned; under Secure Boot systemd-stub ignores
//! an entry's options, so it writes none and `tuning` names the `--append` a signed image
//! needs (ADR 0051). A command line with `isolcpus=` is the
//! operator's own choice: PID 1 then leaves isolation to it. `tuning` says which state the box
//! is in ([`TuningState`]).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use ringstore_bootdisk::slots;

use super::{check, cpu_set_check, cpus, Check, Facts};

/// Where cgroup v2 is mounted (`mounts.rs`).
pub const CGROUP_ROOT: &str = "/sys/fs/cgroup";
/// The partition's cgroup under it.
pub const PARTITION: &str = "ringstore-workers";

// The plain data boot leaves for `tuning` lives in `state.rs`, so the state imports
// nothing above it.
pub use crate::state::{BootArgs, Isolation, Runtime};

/// The CPUs to isolate: the worker CPUs, less the lowest when the workers take every online
/// CPU, because the kernel needs one housekeeping CPU (it keeps the boot CPU out of
/// `nohz_full=` and `isolcpus=` itself, and a cpuset partition may not take the root's last
/// CPU): that worker shares its CPU with the housekeeping.
pub fn wanted(workers: &[usize], housekeeping: &[usize]) -> Vec<usize> {
    let mut out = workers.to_vec();
    out.sort_unstable();
    if housekeeping.is_empty() && !out.is_empty() {
        out.remove(0);
    }
    out
}

/// The tuning state `tuning` reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TuningState {
    /// Isolation and the boot arguments in effect (a second boot of disk.img).
    FullyTuned,
    /// Isolated at run time; the boot arguments are written for the next boot (a first boot).
    BootArgsPending,
    /// Isolated at run time; under Secure Boot the boot arguments come only from the signed
    /// image's command line, which lacks them.
    RunTimeOnly,
    /// Something the verifier lists as a difference.
    NotTuned,
}

impl TuningState {
    /// The stable JSON name.
    pub fn name(self) -> &'static str {
        match self {
            TuningState::FullyTuned => "fully-tuned",
            TuningState::BootArgsPending => "boot-arguments-pending",
            TuningState::RunTimeOnly => "run-time-isolated",
            TuningState::NotTuned => "not-tuned",
        }
    }

    /// The text form.
    pub fn describe(self) -> &'static str {
        match self {
            TuningState::FullyTuned => "fully tuned",
            TuningState::BootArgsPending => {
                "worker CPUs isolated at run time; boot arguments pending (in effect after the next boot)"
            }
            TuningState::RunTimeOnly => {
                "worker CPUs isolated at run time; Secure Boot: boot arguments only from the signed image (see nohz_full)"
            }
            TuningState::NotTuned => "not tuned (see the differences)",
        }
    }
}

/// The state of `checks` (the whole report's).
pub fn state(checks: &[Check], f: &Facts) -> TuningState {
    if checks.iter().any(|c| c.difference) {
        TuningState::NotTuned
    } else if matches!(f.boot_args, BootArgs::Pending { .. }) && f.nohz_full != f.isolate {
        TuningState::BootArgsPending
    } else if matches!(f.boot_args, BootArgs::SignedImageOnly { .. }) && f.nohz_full != f.isolate {
        TuningState::RunTimeOnly
    } else {
        TuningState::FullyTuned
    }
}

/// `isolated` (by `isolcpus=` at boot or the cpuset partition at run time) and `nohz_full`
/// (a boot argument: pending is not a difference when this boot wrote it for the next).
pub fn checks(f: &Facts) -> Vec<Check> {
    let mut isolated: Vec<usize> = f.isolated.clone();
    isolated.extend(f.runtime_isolated.iter().copied());
    isolated.sort_unstable();
    isolated.dedup();
    let mut iso = cpu_set_check("isolated", &f.isolate, &isolated);
    let how = match (&f.runtime, f.runtime_isolated.is_empty()) {
        (_, false) => Some(format!(
            "cpuset partition {PARTITION} (run time) holds {}",
            cpus(&f.runtime_isolated)
        )),
        (Runtime::Failed(why), true) => Some(format!("run-time isolation failed: {why}")),
        (Runtime::LeftToIsolcpus, true) => Some("isolcpus= on the command line".into()),
        _ => None,
    };
    append_note(&mut iso, how);
    let mut nohz = cpu_set_check("nohz_full", &f.isolate, &f.nohz_full);
    if nohz.difference {
        match &f.boot_args {
            BootArgs::Pending { entry, options } if gives(options, &f.isolate) => {
                nohz.difference = false;
                nohz.actual = format!("{} (pending: {entry}, next boot)", nohz.actual);
                append_note(
                    &mut nohz,
                    Some(format!("written to {entry}: in effect after the next boot")),
                );
            }
            BootArgs::NotWritten(why) => append_note(&mut nohz, Some(why.clone())),
            BootArgs::SignedImageOnly { token } => {
                // The box cannot sign a boot entry: the operator's build can (ADR 0051).
                nohz.difference = false;
                append_note(
                    &mut nohz,
                    Some(format!(
                        "Secure Boot: a boot entry's options are ignored; build the image with `--append {token}` to have it"
                    )),
                );
            }
            _ => {}
        }
    }
    vec![iso, nohz]
}

/// Whether boot `options` give `isolate` its `nohz_full=`.
fn gives(options: &str, isolate: &[usize]) -> bool {
    match nohz_token(isolate) {
        None => true,
        Some(token) => options.split_whitespace().any(|o| o == token),
    }
}

fn append_note(c: &mut Check, more: Option<String>) {
    if let Some(more) = more {
        c.note = Some(match c.note.take() {
            Some(n) => format!("{n}; {more}"),
            None => more,
        });
    }
}

/// The config partition check: a file that was refused is a difference.
pub fn config_check(f: &Facts) -> Option<Check> {
    let (file, error) = f.config_partition.as_ref()?;
    let mut c = check(
        "config",
        file.clone(),
        "parses and resolves".into(),
        format!("FAILED: {error}"),
        true,
    );
    c.note = Some(crate::config_partition::IGNORED.into());
    Some(c)
}

/// `nohz_full=LIST` for `cpus` (`None`: nothing to give).
pub fn nohz_token(cpus: &[usize]) -> Option<String> {
    (!cpus.is_empty()).then(|| format!("nohz_full={}", ringstore_sys::format_cpus(cpus)))
}

/// The tuned entry's options: the image's command line without any `nohz_full=`, then the
/// one `isolate` needs.
pub fn boot_options(image_cmdline: &str, isolate: &[usize]) -> String {
    image_cmdline
        .split_whitespace()
        .filter(|t| !t.starts_with("nohz_full="))
        .map(str::to_string)
        .chain(nohz_token(isolate))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Isolates `cpus` at run time unless the command line has `isolcpus=`.
pub fn isolate_at_run_time(cpus: &[usize], cmdline: &str) -> Runtime {
    if cpus.is_empty() {
        return Runtime::NotNeeded;
    }
    if cmdline
        .split_whitespace()
        .any(|t| t.starts_with("isolcpus="))
    {
        return Runtime::LeftToIsolcpus;
    }
    match make_partition(Path::new(CGROUP_ROOT), cpus) {
        Ok(()) => Runtime::Partition,
        Err(why) => Runtime::Failed(why),
    }
}

/// After the server started: isolates the workers' CPUs of `placement` at run time and
/// records what was done (boot calls it; failures are logged, never fatal).
pub fn at_start(machine: &crate::machine::Machine, placement: &crate::plane::Placement) {
    let isolate = wanted(&placement.workers, &placement.housekeeping);
    let running = crate::cmdline::running_or_empty();
    let runtime = isolate_at_run_time(&isolate, running);
    if let Runtime::Failed(why) = &runtime {
        crate::warn!("run-time isolation of CPUs {}: {why}", cpus(&isolate));
    }
    let mut state = machine.state();
    state.isolation.wanted = isolate;
    state.isolation.runtime = runtime;
}

/// After the trial decision (a trial writes nothing): the next boot's arguments, if this boot
/// lacks them.
pub fn after_trial(machine: &crate::machine::Machine) {
    // A copy: the ESP is written without the machine's lock.
    let (placed, slots, isolate) = {
        let state = machine.state();
        (
            state.placement.is_some(),
            state.slots.clone(),
            state.isolation.wanted.clone(),
        )
    };
    if !placed {
        return;
    }
    let nohz_full = ringstore_sys::read_trim("/sys/devices/system/cpu/nohz_full")
        .map(|s| ringstore_sys::parse_cpulist(&s))
        .unwrap_or_default();
    let running = crate::cmdline::running_or_empty();
    let boot_args = match nohz_token(&isolate) {
        // Under Secure Boot systemd-stub ignores the tuned entry's options: writing one would
        // only leave `tuning` saying "pending" after every boot.
        Some(token) if nohz_full != isolate && crate::secure_boot::SecureBoot::read().on() => {
            crate::info!(
                "tuning: Secure Boot on: {token} only from the signed image's command line"
            );
            BootArgs::SignedImageOnly { token }
        }
        _ => persist_boot_args(&isolate, &nohz_full, running, &slots),
    };
    if let BootArgs::NotWritten(why) = &boot_args {
        crate::warn!("tuning: boot arguments for the next boot not written: {why}");
    }
    machine.state().isolation.boot_args = boot_args;
}

fn write(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("{} <- {text:?}: {e}", path.display()))
}

/// The threaded cgroup `PARTITION` with `cpus`, the threads pinned to one of them moved in,
/// then made an isolated partition (moved first, so no worker is pushed off its CPU).
fn make_partition(root: &Path, cpus: &[usize]) -> Result<(), String> {
    let controllers = std::fs::read_to_string(root.join("cgroup.controllers"))
        .map_err(|e| format!("no cgroup2 at {}: {e}", root.display()))?;
    if !controllers.split_whitespace().any(|c| c == "cpuset") {
        return Err("the kernel has no cpuset controller (CONFIG_CPUSETS)".into());
    }
    write(&root.join("cgroup.subtree_control"), "+cpuset")?;
    // The cgroup2 root directory is 0555: without CAP_DAC_OVERRIDE (PID 1's boot set has
    // none) its owner may mkdir in it only after making it 0755.
    std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| format!("chmod 0755 {}: {e}", root.display()))?;
    let dir = root.join(PARTITION);
    if let Err(err) = std::fs::create_dir(&dir) {
        if err.kind() != std::io::ErrorKind::AlreadyExists {
            return Err(format!("{}: {err}", dir.display()));
        }
    }
    write(&dir.join("cgroup.type"), "threaded")?;
    write(&dir.join("cpuset.cpus"), &ringstore_sys::format_cpus(cpus))?;
    // A worker that cannot be moved is pushed off its CPU by the partition but keeps serving
    // (from the housekeeping CPU): worth a warning, not a failed isolation.
    for tid in pinned_threads(cpus) {
        if let Err(why) = write(&dir.join("cgroup.threads"), &tid.to_string()) {
            crate::warn!("run-time isolation: {why}");
        }
    }
    write(&dir.join("cpuset.cpus.partition"), "isolated")?;
    let partition = std::fs::read_to_string(dir.join("cpuset.cpus.partition")).unwrap_or_default();
    if partition.trim() != "isolated" {
        return Err(format!("cpuset.cpus.partition is {:?}", partition.trim()));
    }
    crate::info!(
        "CPUs {} isolated at run time (cpuset partition {PARTITION})",
        ringstore_sys::format_cpus(cpus)
    );
    Ok(())
}

/// The server's workers (`ringstore-wN`, `ringstore_runtime::plane`) pinned to exactly one of
/// `cpus`; not io_uring's own helper threads, which follow their ring's owner.
fn pinned_threads(cpus: &[usize]) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .take(4096)
        .filter(|tid| {
            std::fs::read_to_string(format!("/proc/self/task/{tid}/status"))
                .ok()
                .filter(|s| is_worker(s))
                .and_then(|s| pinned_cpu(&s))
                .is_some_and(|cpu| cpus.contains(&cpu))
        })
        .collect()
}

/// Whether a thread's status names a server worker (`Name:\tringstore-w3`).
pub fn is_worker(status: &str) -> bool {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Name:"))
        .is_some_and(|n| n.trim().starts_with("ringstore-w"))
}

/// The one CPU a thread's status allows (`Cpus_allowed_list:\t3`), if it is one.
pub fn pinned_cpu(status: &str) -> Option<usize> {
    let list = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))?;
    match ringstore_sys::parse_cpulist(list.trim()).as_slice() {
        [cpu] => Some(*cpu),
        _ => None,
    }
}

/// The boot arguments `isolate` needs, written for the next boot when the running kernel
/// lacks them: the booted slot's tuned entry and `loader.conf` naming it. `running` is the
/// running kernel's command line, `nohz_full` what it has in effect.
pub fn persist_boot_args(
    isolate: &[usize],
    nohz_full: &[usize],
    running: &str,
    slots: &crate::state::SlotsState,
) -> BootArgs {
    if nohz_full == isolate {
        return BootArgs::InEffect;
    }
    let token = nohz_token(isolate);
    if let Some(t) = &token {
        if running.split_whitespace().any(|o| o == t) {
            return BootArgs::NotWritten(format!(
                "{t} is on the command line but the kernel did not apply it"
            ));
        }
    }
    let want = token.unwrap_or_else(|| "no nohz_full=".into());
    let (Some(esp), Some(booted)) = (&slots.esp, slots.booted) else {
        return BootArgs::NotWritten(format!(
            "not booted from disk.img: put {want} on the kernel command line"
        ));
    };
    if slots.trying {
        return BootArgs::NotWritten("an uncommitted trial boot writes no boot entry".into());
    }
    if slots.committed != Some(booted) {
        return BootArgs::NotWritten(format!("slot {booted} booted but is not the committed one"));
    }
    let image = std::fs::read_to_string(crate::layers::IMAGE_CMDLINE).unwrap_or_default();
    if image.trim().is_empty() {
        return BootArgs::NotWritten(format!("{}: empty", crate::layers::IMAGE_CMDLINE));
    }
    let options = boot_options(&image, isolate);
    match write_entry(esp, booted, &options) {
        Ok(entry) => {
            crate::info!("tuning: {want} written to {entry} for the next boot");
            BootArgs::Pending { entry, options }
        }
        Err(why) => BootArgs::NotWritten(format!("writing the boot entry: {why}")),
    }
}

/// Writes `slot`'s tuned entry with `options`, then `loader.conf` booting it.
fn write_entry(
    esp: &crate::bootdisk::Found,
    slot: slots::Slot,
    options: &str,
) -> Result<String, String> {
    let fs = crate::update::esp_fs(esp)?;
    let entry = slot.tuned_entry_path();
    let fat = |e: ringstore_bootdisk::fat::FatError| format!("ESP: {e}");
    ringstore_bootdisk::fat::write_file(&fs, &entry, slots::tuned_entry(slot, options).as_bytes())
        .map_err(fat)?;
    ringstore_bootdisk::fat::write_file(
        &fs,
        slots::LOADER_CONF,
        slots::loader_conf_booting(slot.tuned_entry_id()).as_bytes(),
    )
    .map_err(fat)?;
    fs.unmount().map_err(|e| format!("ESP: {e}"))?;
    ringstore_sys::sync();
    Ok(entry)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tuning::verify;

    /// The default disk.img under OVMF: one node, CPUs 0-1, both serve.
    fn two_cpus(boot_args: BootArgs, nohz_full: Vec<usize>) -> Facts {
        Facts {
            serving_node: 0,
            workers: vec![0, 1],
            isolate: wanted(&[0, 1], &[]),
            runtime_isolated: vec![1],
            runtime: Runtime::Partition,
            nohz_full,
            boot_args,
            hugepages: vec![(0, 32)],
            hugepage_budget: 32,
            ..Facts::default()
        }
    }

    fn differences(f: &Facts) -> Vec<&'static str> {
        verify(f)
            .into_iter()
            .filter(|c| c.difference)
            .map(|c| c.check)
            .collect()
    }

    #[test]
    fn the_lowest_worker_keeps_house_when_the_workers_take_every_cpu() {
        assert_eq!(wanted(&[1, 0], &[]), [1]);
        assert_eq!(wanted(&[2, 3], &[0, 1]), [2, 3]);
        assert_eq!(wanted(&[0], &[]), Vec::<usize>::new());
        assert_eq!(wanted(&[], &[]), Vec::<usize>::new());
    }

    #[test]
    fn a_first_boot_is_clean_with_boot_arguments_pending_and_a_second_fully_tuned() {
        let pending = BootArgs::Pending {
            entry: "loader/entries/ringstore-a.conf".into(),
            options: "console=ttyS0 nohz_full=1".into(),
        };
        let first = two_cpus(pending, vec![]);
        assert_eq!(differences(&first), Vec::<&str>::new());
        let checks = verify(&first);
        assert_eq!(state(&checks, &first), TuningState::BootArgsPending);
        let nohz = checks.iter().find(|c| c.check == "nohz_full").unwrap();
        assert!(nohz.actual.contains("pending"), "{nohz:?}");
        let iso = checks.iter().find(|c| c.check == "isolated").unwrap();
        assert!(
            iso.note.as_deref().unwrap().contains("run time") && iso.wanted == "1",
            "{iso:?}"
        );
        let second = two_cpus(BootArgs::InEffect, vec![1]);
        let checks = verify(&second);
        assert_eq!(differences(&second), Vec::<&str>::new());
        assert_eq!(state(&checks, &second), TuningState::FullyTuned);
        // Not written (no ESP): a difference that says why.
        let pxe = two_cpus(
            BootArgs::NotWritten("not booted from disk.img".into()),
            vec![],
        );
        assert_eq!(differences(&pxe), ["nohz_full"]);
        assert_eq!(state(&verify(&pxe), &pxe), TuningState::NotTuned);
        // Pending with another list than wanted is still a difference.
        let stale = two_cpus(
            BootArgs::Pending {
                entry: "e".into(),
                options: "nohz_full=0-1".into(),
            },
            vec![],
        );
        assert_eq!(differences(&stale), ["nohz_full"]);
        // A failed partition names why.
        let mut failed = two_cpus(BootArgs::InEffect, vec![1]);
        failed.runtime_isolated.clear();
        failed.runtime = Runtime::Failed("no cpuset".into());
        let checks = verify(&failed);
        let iso = checks.iter().find(|c| c.check == "isolated").unwrap();
        assert!(
            iso.difference && iso.note.as_deref().unwrap().contains("no cpuset"),
            "{iso:?}"
        );
    }

    #[test]
    fn under_secure_boot_the_box_is_run_time_isolated_and_says_how_to_get_nohz_full() {
        let token = "nohz_full=1".to_string();
        let f = two_cpus(BootArgs::SignedImageOnly { token }, vec![]);
        assert_eq!(differences(&f), Vec::<&str>::new());
        let checks = verify(&f);
        assert_eq!(state(&checks, &f), TuningState::RunTimeOnly);
        let nohz = checks.iter().find(|c| c.check == "nohz_full").unwrap();
        assert!(
            nohz.note
                .as_deref()
                .is_some_and(|n| n.contains("--append nohz_full=1")),
            "{nohz:?}"
        );
        // A signed image built with the argument: fully tuned.
        let built = two_cpus(
            BootArgs::SignedImageOnly {
                token: "nohz_full=1".into(),
            },
            vec![1],
        );
        assert_eq!(state(&verify(&built), &built), TuningState::FullyTuned);
    }

    #[test]
    fn a_refused_config_partition_is_a_difference() {
        let mut f = two_cpus(BootArgs::InEffect, vec![1]);
        f.config_partition = Some(("/dev/vda partition 2: ringstore.toml".into(), "bad".into()));
        let checks = verify(&f);
        let c = checks.iter().find(|c| c.check == "config").unwrap();
        assert!(c.difference && c.actual.contains("bad"), "{c:?}");
        assert_eq!(state(&checks, &f), TuningState::NotTuned);
    }

    #[test]
    fn boot_options_replace_nohz_full_and_threads_parse() {
        assert_eq!(
            boot_options("console=ttyS0 nohz_full=0-3 ringstore.data=auto", &[1]),
            "console=ttyS0 ringstore.data=auto nohz_full=1"
        );
        assert_eq!(boot_options("console=ttyS0", &[]), "console=ttyS0");
        assert_eq!(pinned_cpu("Name:\tw\nCpus_allowed_list:\t3\n"), Some(3));
        assert_eq!(pinned_cpu("Cpus_allowed_list:\t0-1\n"), None);
        assert_eq!(pinned_cpu("Name:\tw\n"), None);
        assert!(is_worker("Name:\tringstore-w1\nCpus_allowed_list:\t1\n"));
        assert!(!is_worker("Name:\tiou-wrk-77\n") && !is_worker(""));
        assert_eq!(
            isolate_at_run_time(&[1], "console=ttyS0 isolcpus=1"),
            Runtime::LeftToIsolcpus
        );
        assert_eq!(isolate_at_run_time(&[], ""), Runtime::NotNeeded);
        let slots = crate::state::SlotsState::default();
        assert_eq!(
            persist_boot_args(&[1], &[1], "", &slots),
            BootArgs::InEffect
        );
        assert!(matches!(
            persist_boot_args(&[1], &[], "console=ttyS0", &slots),
            BootArgs::NotWritten(why) if why.contains("nohz_full=1")
        ));
        assert!(matches!(
            persist_boot_args(&[1], &[], "nohz_full=1", &slots),
            BootArgs::NotWritten(why) if why.contains("did not apply")
        ));
    }
}
