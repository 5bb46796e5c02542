//! Signals of PID 1: SIGCHLD reaps, SIGTERM/SIGPWR power off, SIGINT (ctrl-alt-del) reboots.
//! The signals are blocked in every thread and taken by one thread with sigwait; a no-op
//! handler is installed too, because the kernel drops default-action signals sent to PID 1.

use std::sync::Arc;

use crate::machine::Machine;
use crate::power::{self, Action};
use crate::{info, warn};

const HANDLED: [libc::c_int; 5] = [
    libc::SIGCHLD,
    libc::SIGTERM,
    libc::SIGINT,
    libc::SIGPWR,
    libc::SIGHUP,
];

fn handled_set() -> libc::sigset_t {
    ringstore_sys::signal_set(&HANDLED)
}

/// Installs the handlers and blocks the signals in the calling thread. Call it before any
/// other thread starts, so every thread inherits the mask.
pub fn block() {
    ringstore_sys::install_noop_handlers(&HANDLED);
    ringstore_sys::block_signals(&handled_set());
}

/// How long [`spawn_waiter`] waits for the new thread to narrow its capabilities.
const NARROW_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Starts the thread that waits for the signals and shuts `machine` down on SIGTERM, SIGPWR and
/// SIGINT; it keeps only CAP_SYS_BOOT (reboot(2)), and this returns once it has narrowed its sets.
pub fn spawn_waiter(machine: Arc<Machine>) {
    let (narrowed, wait) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            crate::privs::restrict_thread_or_log(crate::privs::Role::Console);
            let _ = narrowed.send(());
            let set = handled_set();
            loop {
                let Some(sig) = ringstore_sys::wait_signal(&set) else {
                    continue;
                };
                match sig {
                    libc::SIGCHLD => reap(),
                    libc::SIGTERM | libc::SIGPWR => {
                        info!("signal {sig}: power off");
                        power::shutdown(&machine, Action::PowerOff);
                    }
                    libc::SIGINT => {
                        info!("SIGINT (ctrl-alt-del): reboot");
                        power::shutdown(&machine, Action::Reboot);
                    }
                    _ => info!("signal {sig} ignored"),
                }
            }
        });
    match spawned {
        Ok(_) => {
            if wait.recv_timeout(NARROW_WAIT).is_err() {
                warn!(
                    "the signal thread has not started within {} s",
                    NARROW_WAIT.as_secs()
                );
            }
        }
        Err(err) => warn!("cannot start the signal thread: {err}"),
    }
}

/// Collects every exited child (orphans re-parented to PID 1 included).
pub fn reap() {
    ringstore_sys::reap_children();
}
