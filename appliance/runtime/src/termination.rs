//! SIGTERM/SIGINT (and, for `ringstore serve`, SIGHUP) as a readable fd (signalfd): the
//! binary blocks them before any thread starts, waits on the fd, and stops the server
//! gracefully, or on SIGHUP reloads the TLS certificates and the users and tokens files.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use crate::RuntimeError;

/// The termination signals, blocked in the calling thread and readable from a signalfd.
#[derive(Debug)]
pub struct TerminationSignals {
    fd: OwnedFd,
}

impl TerminationSignals {
    /// Blocks SIGTERM and SIGINT in the calling thread (threads spawned later inherit the
    /// block) and opens a signalfd for them. Call before [`crate::Server::start`].
    pub fn install() -> Result<TerminationSignals, RuntimeError> {
        let set = crate::sys::termination_set();
        crate::sys::block_signals(&set);
        let fd = crate::sys::signalfd(&set)
            .map_err(|e| RuntimeError::io("signalfd(SIGTERM, SIGINT)", e))?;
        Ok(TerminationSignals { fd })
    }

    /// [`TerminationSignals::install`] with SIGHUP too (`ringstore serve`: reload the TLS
    /// certificates, [`crate::Server::reload_certs`], and the users and tokens files,
    /// [`crate::Server::reload_auth`]); [`TerminationSignals::wait`] then returns it as well.
    pub fn install_with_hangup() -> Result<TerminationSignals, RuntimeError> {
        let set = crate::sys::signal_set(&[libc::SIGTERM, libc::SIGINT, libc::SIGHUP]);
        crate::sys::block_signals(&set);
        let fd = crate::sys::signalfd(&set)
            .map_err(|e| RuntimeError::io("signalfd(SIGTERM, SIGINT, SIGHUP)", e))?;
        Ok(TerminationSignals { fd })
    }

    /// Blocks until SIGTERM or SIGINT (or SIGHUP, when installed) arrives; returns the
    /// signal number.
    pub fn wait(&self) -> Result<i32, RuntimeError> {
        crate::sys::read_signal(self.fd.as_raw_fd())
            .map_err(|e| RuntimeError::io("reading the signalfd", e))
    }

    /// The signalfd, for callers (PID 1) that poll it alongside other fds.
    pub fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_raised_sigterm_is_read_not_fatal() {
        // Runs on its own thread so the block does not leak into other tests' threads.
        std::thread::spawn(|| {
            let signals = TerminationSignals::install().unwrap();
            // SIGTERM is blocked in this very thread: it stays pending for the signalfd.
            crate::sys::signal_this_thread(libc::SIGTERM).unwrap();
            assert_eq!(signals.wait().unwrap(), libc::SIGTERM);
        })
        .join()
        .unwrap();
    }
}
