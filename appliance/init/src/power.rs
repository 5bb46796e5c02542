//! Orderly shutdown of the [`Machine`] it is given (stop accepting, drain, sync, reboot(2)) and
//! the fatal-error path.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ringstore_bootdisk::slots::Slot;

use crate::cmdline::OnFatal;
use crate::machine::Machine;
use crate::{error, info, warn};

/// How long draining may take before the machine goes down anyway.
const DRAIN_LIMIT: Duration = Duration::from_secs(10);
/// Pause before a fatal error reboots, so the message can be read.
const FATAL_REBOOT_DELAY: Duration = Duration::from_secs(10);

/// What happens at the end of a shutdown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    PowerOff,
    /// Through the firmware.
    Reboot,
    /// Into the kernel [`crate::kexec::load`] loaded (the firmware if the jump fails).
    Kexec,
}

impl Action {
    fn verb(self) -> &'static str {
        match self {
            Action::PowerOff => "poweroff",
            Action::Reboot => "reboot",
            Action::Kexec => "kexec reboot",
        }
    }
}

static SHUTTING_DOWN: AtomicBool = AtomicBool::new(false);

/// Stops `machine`'s server, syncs and powers off or reboots. Only the first caller proceeds;
/// later callers (a second signal, a console command) wait for the machine to go down.
pub fn shutdown(machine: &Machine, action: Action) -> ! {
    go_down(machine, action, &|| {})
}

/// [`shutdown`] with [`Action::Kexec`]; if the jump returns, `before_firmware` runs before the
/// reboot through the firmware: what that path needs and the jump did not (`update`'s
/// one-shot entry, without which the firmware would boot the committed slot and the pending
/// trial would read as one that never reported).
pub fn kexec_or_firmware(machine: &Machine, before_firmware: &dyn Fn()) -> ! {
    go_down(machine, Action::Kexec, before_firmware)
}

fn go_down(machine: &Machine, action: Action, before_firmware: &dyn Fn()) -> ! {
    if SHUTTING_DOWN.swap(true, Ordering::SeqCst) {
        park_forever();
    }
    info!("{}: stopping the server", action.verb());
    let server = machine.take_server();
    if let Some(server) = server {
        let (tx, rx) = std::sync::mpsc::channel();
        let drained = std::thread::Builder::new()
            .name("drain".into())
            .spawn(move || {
                server.shutdown();
                let _ = tx.send(());
            });
        if drained.is_err() || rx.recv_timeout(DRAIN_LIMIT).is_err() {
            error!(
                "draining did not finish within {} s; going down anyway",
                DRAIN_LIMIT.as_secs()
            );
        }
    }
    ringstore_sys::sync();
    if action == Action::Kexec {
        // A trial's watchdog would keep running in the next kernel, which does not feed it.
        crate::hw_watchdog::disarm();
        info!("synced; jumping into the loaded kernel (no firmware)");
        // reboot(2) with LINUX_REBOOT_CMD_KEXEC only returns on failure.
        if let Err(err) = ringstore_sys::reboot_kexec() {
            error!("kexec jump failed: {err}; rebooting through the firmware");
            before_firmware();
        }
    }
    let cmd = match action {
        Action::PowerOff => ringstore_sys::RebootCommand::PowerOff,
        Action::Reboot | Action::Kexec => ringstore_sys::RebootCommand::Restart,
    };
    info!(
        "synced; {}",
        if action == Action::PowerOff {
            "powering off (the RAM tier is lost)"
        } else {
            "rebooting through the firmware (the RAM tier is lost)"
        }
    );
    // reboot(2) only returns on failure.
    if let Err(err) = ringstore_sys::reboot(cmd) {
        error!("reboot(2) failed: {err}");
    }
    park_forever()
}

fn park_forever() -> ! {
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

/// A fatal error: logged, then a reboot after a delay; with `ringstore.on_fatal=halt` this returns
/// and the caller keeps the console running instead.
pub fn fatal(machine: &Machine, on_fatal: OnFatal, what: &str) {
    error!("fatal: {what}");
    match on_fatal {
        OnFatal::Halt => error!(
            "ringstore.on_fatal=halt: staying at the console; `reboot` or `poweroff` to leave"
        ),
        OnFatal::Reboot => {
            error!(
                "rebooting in {} s (ringstore.on_fatal=halt keeps the console instead)",
                FATAL_REBOOT_DELAY.as_secs()
            );
            std::thread::sleep(FATAL_REBOOT_DELAY);
            shutdown(machine, Action::Reboot);
        }
    }
}

/// `reboot`: a kexec jump into the slot the firmware would boot (the committed one), keeping
/// the RAM tier; through the firmware when `firmware` is asked or nothing could be loaded.
pub fn reboot(machine: &Machine, firmware: bool) -> ! {
    if firmware {
        shutdown(machine, Action::Reboot);
    }
    let target = {
        let st = machine.state();
        st.slots.committed.or(st.slots.booted)
    };
    to_slot(machine, target, "reboot")
}

/// A kexec jump into `target` (the slot the firmware boots by itself: no one-shot entry is
/// needed if the jump fails), else through the firmware; `who` names the caller in the log.
pub fn to_slot(machine: &Machine, target: Option<Slot>, who: &str) -> ! {
    let loaded = match target {
        Some(slot) => crate::kexec::load(machine, slot),
        None => Err("no slot known (not booted from disk.img)".into()),
    };
    match loaded {
        Ok(what) => {
            info!("{who}: {what}");
            shutdown(machine, Action::Kexec)
        }
        Err(why) => {
            warn!("{who}: no kexec ({why}); through the firmware");
            shutdown(machine, Action::Reboot)
        }
    }
}

/// Makes ctrl-alt-del send SIGINT to PID 1 instead of rebooting at once.
pub fn disable_ctrl_alt_del() {
    // Best effort, as before: without it ctrl-alt-del reboots at once.
    let _ = ringstore_sys::disable_ctrl_alt_del();
}
