//! Signals of PID 1: SIGCHLD reaps, SIGTERM/SIGPWR power off, SIGINT (ctrl-alt-del) reboots.
//! The signals are blocked in every thread and taken by one thread with sigwait; a no-op
//! handler is installed too, because the kernel drops default-action signals sent to PID 1.

use crate::power::{self, Action};
use crate::{info, warn};

const HANDLED: [libc::c_int; 5] = [
    libc::SIGCHLD,
    libc::SIGTERM,
    libc::SIGINT,
    libc::SIGPWR,
    libc::SIGHUP,
];

extern "C" fn ignore(_: libc::c_int) {}

fn handled_set() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; sigemptyset/sigaddset initialise it.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: set is a valid sigset_t.
    unsafe { libc::sigemptyset(&mut set) };
    for sig in HANDLED {
        // SAFETY: set is a valid sigset_t and sig a valid signal number.
        unsafe { libc::sigaddset(&mut set, sig) };
    }
    set
}

/// Installs the handlers and blocks the signals in the calling thread. Call it before any
/// other thread starts, so every thread inherits the mask.
pub fn block() {
    for sig in HANDLED {
        // SAFETY: sigaction is plain data; zeroed is a valid initial value.
        let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
        action.sa_sigaction = ignore as extern "C" fn(libc::c_int) as usize;
        action.sa_flags = libc::SA_RESTART;
        // SAFETY: action is initialised; `ignore` is async-signal-safe (it does nothing).
        unsafe { libc::sigaction(sig, &action, std::ptr::null_mut()) };
    }
    let set = handled_set();
    // SAFETY: set is a valid sigset_t; the old mask is not needed.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
}

/// How long [`spawn_waiter`] waits for the new thread to narrow its capabilities.
const NARROW_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Starts the thread that waits for the signals; it keeps only CAP_SYS_BOOT (reboot(2)), and
/// this returns once it has narrowed its sets.
pub fn spawn_waiter() {
    let (narrowed, wait) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            crate::privs::restrict_thread_or_log(crate::privs::Role::Console);
            let _ = narrowed.send(());
            let set = handled_set();
            loop {
                let mut sig: libc::c_int = 0;
                // SAFETY: set is a valid sigset_t and sig a valid out pointer.
                if unsafe { libc::sigwait(&set, &mut sig) } != 0 {
                    continue;
                }
                match sig {
                    libc::SIGCHLD => reap(),
                    libc::SIGTERM | libc::SIGPWR => {
                        info!("signal {sig}: power off");
                        power::shutdown(Action::PowerOff);
                    }
                    libc::SIGINT => {
                        info!("SIGINT (ctrl-alt-del): reboot");
                        power::shutdown(Action::Reboot);
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
    loop {
        let mut status = 0;
        // SAFETY: waitpid with a valid out pointer and WNOHANG never blocks.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if pid <= 0 {
            return;
        }
    }
}
