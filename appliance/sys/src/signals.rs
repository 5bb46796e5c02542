//! Signals: sets and masks, signalfd, sigwait, no-op handlers for PID 1, reaping children,
//! sending signals. Raw libc for sigset_t, pthread_sigmask, sigaction, signal, signalfd,
//! sigwait and pthread_kill: rustix has safe wrappers for none of them (its signal calls
//! live in the `runtime` feature, unsafe, meant for a libc replacement).

use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

use rustix::process::{Pid, Signal, WaitOptions};

fn cvt(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

fn empty_set() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; all-zero is a valid value, emptied again by sigemptyset.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid, writable sigset_t.
    unsafe { libc::sigemptyset(&mut set) };
    set
}

/// A signal set holding `signals`; numbers that are not signals are left out.
pub fn signal_set(signals: &[libc::c_int]) -> libc::sigset_t {
    let mut set = empty_set();
    for &sig in signals {
        // SAFETY: `set` is a valid sigset_t; an invalid number only makes sigaddset fail (EINVAL).
        unsafe { libc::sigaddset(&mut set, sig) };
    }
    set
}

/// A signal set of SIGTERM and SIGINT.
pub fn termination_set() -> libc::sigset_t {
    signal_set(&[libc::SIGTERM, libc::SIGINT])
}

/// Blocks `set` in the calling thread, returning the previous mask.
pub fn block_signals(set: &libc::sigset_t) -> libc::sigset_t {
    let mut old = empty_set();
    // SAFETY: both pointers are valid sigset_t for the duration of the call.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, set, &mut old) };
    old
}

/// Restores a mask saved by [`block_signals`].
pub fn set_signal_mask(mask: &libc::sigset_t) {
    // SAFETY: `mask` is a valid sigset_t; a null old-mask pointer is allowed.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, mask, std::ptr::null_mut()) };
}

/// A signalfd for `set` (close-on-exec).
pub fn signalfd(set: &libc::sigset_t) -> io::Result<OwnedFd> {
    // SAFETY: -1 asks for a new fd; `set` is a valid sigset_t.
    let fd = cvt(unsafe { libc::signalfd(-1, set, libc::SFD_CLOEXEC) })?;
    // SAFETY: a fresh descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Reads one siginfo from a blocking signalfd; returns the signal number.
pub fn read_signal(fd: RawFd) -> io::Result<i32> {
    let mut info = [0u8; std::mem::size_of::<libc::signalfd_siginfo>()];
    loop {
        match crate::net::with_fd(fd, |fd| rustix::io::read(fd, &mut info)) {
            // ssi_signo, a u32, is the first field of signalfd_siginfo.
            Ok(n) if n == info.len() => {
                return Ok(u32::from_ne_bytes([info[0], info[1], info[2], info[3]]) as i32)
            }
            Ok(_) => return Err(io::Error::from(io::ErrorKind::UnexpectedEof)),
            Err(rustix::io::Errno::INTR) => continue,
            Err(err) => return Err(err.into()),
        }
    }
}

/// Ignores SIGPIPE process-wide (sends also pass MSG_NOSIGNAL; this covers any other write).
pub fn ignore_sigpipe() {
    // SAFETY: installing SIG_IGN for SIGPIPE has no memory-safety preconditions.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
}

extern "C" fn ignore(_: libc::c_int) {}

/// Installs a handler that does nothing (SA_RESTART) for each of `signals`: the kernel drops
/// default-action signals sent to PID 1, so a signal that is to reach sigwait needs one.
pub fn install_noop_handlers(signals: &[libc::c_int]) {
    for &sig in signals {
        // SAFETY: sigaction is plain data; zeroed is a valid initial value.
        let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
        action.sa_sigaction = ignore as extern "C" fn(libc::c_int) as usize;
        action.sa_flags = libc::SA_RESTART;
        // SAFETY: action is initialised; `ignore` is async-signal-safe (it does nothing).
        unsafe { libc::sigaction(sig, &action, std::ptr::null_mut()) };
    }
}

/// Waits (sigwait) for one of `set`, which the calling thread must have blocked; `None` if the
/// wait failed.
pub fn wait_signal(set: &libc::sigset_t) -> Option<libc::c_int> {
    let mut sig: libc::c_int = 0;
    // SAFETY: `set` is a valid sigset_t and `sig` a valid out pointer.
    (unsafe { libc::sigwait(set, &mut sig) } == 0).then_some(sig)
}

/// Collects every exited child without blocking (orphans re-parented to PID 1 included).
pub fn reap_children() {
    while let Ok(Some(_)) = rustix::process::waitpid(None, WaitOptions::NOHANG) {}
}

/// Sends `sig` to process `pid`.
pub fn kill(pid: u32, sig: libc::c_int) -> io::Result<()> {
    let invalid = || io::Error::from(io::ErrorKind::InvalidInput);
    let pid = i32::try_from(pid)
        .ok()
        .and_then(Pid::from_raw)
        .ok_or_else(invalid)?;
    let sig = Signal::from_named_raw(sig).ok_or_else(invalid)?;
    Ok(rustix::process::kill_process(pid, sig)?)
}

/// Sends `sig` to the calling thread (pthread_kill): tests of signal handling.
pub fn signal_this_thread(sig: libc::c_int) -> io::Result<()> {
    // SAFETY: pthread_self() is the live calling thread; pthread_kill takes no pointers.
    match unsafe { libc::pthread_kill(libc::pthread_self(), sig) } {
        0 => Ok(()),
        err => Err(io::Error::from_raw_os_error(err)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_blocked_signal_is_read_from_the_signalfd() {
        // Its own thread, so the block does not leak into other tests' threads.
        std::thread::spawn(|| {
            let set = termination_set();
            let old = block_signals(&set);
            let fd = signalfd(&set).unwrap();
            signal_this_thread(libc::SIGINT).unwrap();
            let sig = read_signal(std::os::fd::AsRawFd::as_raw_fd(&fd)).unwrap();
            set_signal_mask(&old);
            assert_eq!(sig, libc::SIGINT);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn sigwait_takes_a_blocked_signal() {
        std::thread::spawn(|| {
            let set = signal_set(&[libc::SIGUSR1]);
            let old = block_signals(&set);
            signal_this_thread(libc::SIGUSR1).unwrap();
            assert_eq!(wait_signal(&set), Some(libc::SIGUSR1));
            set_signal_mask(&old);
        })
        .join()
        .unwrap();
    }

    #[test]
    // reap_children, not Child::wait, collects it: that is what is tested.
    #[allow(
        clippy::zombie_processes,
        reason = "reap_children, not Child::wait, collects the child: that is what is tested"
    )]
    fn kill_and_reap_a_child() {
        let child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        kill(child.id(), libc::SIGKILL).unwrap();
        assert!(kill(0, libc::SIGTERM).is_err(), "pid 0 is not a process");
        // The test harness is not PID 1: reaping here collects exactly this child.
        let started = std::time::Instant::now();
        while std::fs::metadata(format!("/proc/{}/stat", child.id()))
            .is_ok_and(|_| started.elapsed() < std::time::Duration::from_secs(5))
        {
            reap_children();
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(std::fs::metadata(format!("/proc/{}", child.id())).is_err());
    }
}
