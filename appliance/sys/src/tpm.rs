//! The TPM 2.0 character device (`/dev/tpmrm0`, the kernel's resource manager): one command
//! written in one `write`, its response read in one `read`, with a bound on the response size
//! and on the wait, so a wedged or hostile TPM can stall the boot for at most the timeout.
//!
//! The node is opened `O_NONBLOCK`: a blocking `write` runs the whole command inside the
//! driver, under its own per-command durations (minutes for a key generation), which no
//! `poll` afterwards could bound. Nonblocking, the write queues the command and the `poll`
//! is the wait. A command that times out leaves the file open for good: the driver's release
//! waits for the queued command, so closing it would stall PID 1 after all.
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::Duration;

/// The largest response read (TPM 2.0 PC Client TPMs answer at most 4096 bytes).
pub const TPM_RESPONSE_MAX: usize = 4096;
/// Bytes of the response header (tag, size, response code).
const HEADER_LEN: usize = 10;

/// An open TPM device node.
#[derive(Debug)]
pub struct TpmDevice {
    /// `None` once a command timed out (its file is leaked: see the module doc).
    file: Option<File>,
}

impl TpmDevice {
    /// Opens `path` (`/dev/tpmrm0`) for reading and writing.
    pub fn open(path: &Path) -> std::io::Result<TpmDevice> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)?;
        Ok(TpmDevice { file: Some(file) })
    }

    /// Sends one marshalled command and returns its response. The kernel driver takes a
    /// command in one `write` and hands the whole response to one `read`; a response that does
    /// not come within `timeout`, is shorter than a header or longer than
    /// [`TPM_RESPONSE_MAX`] is an error.
    pub fn transact(&mut self, command: &[u8], timeout: Duration) -> std::io::Result<Vec<u8>> {
        let Some(file) = self.file.as_mut() else {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "TPM did not answer an earlier command: not used again",
            ));
        };
        let wrote = file.write(command)?;
        if wrote != command.len() {
            return Err(std::io::Error::other(format!(
                "TPM took {wrote} of {} command bytes",
                command.len()
            )));
        }
        if let Err(err) = wait_readable(file, timeout) {
            std::mem::forget(self.file.take());
            return Err(err);
        }
        let mut response = vec![0u8; TPM_RESPONSE_MAX];
        let got = file.read(&mut response)?;
        response.truncate(got);
        if got < HEADER_LEN {
            return Err(std::io::Error::other(format!(
                "TPM response of {got} bytes is shorter than its header"
            )));
        }
        Ok(response)
    }
}

/// Waits until `file` has a response to read, at most `timeout`.
fn wait_readable(file: &impl AsFd, timeout: Duration) -> std::io::Result<()> {
    use rustix::event::{PollFd, PollFlags, Timespec};
    let fd = file.as_fd();
    let mut fds = [PollFd::new(&fd, PollFlags::IN)];
    let limit = Timespec {
        tv_sec: i64::try_from(timeout.as_secs()).unwrap_or(i64::MAX),
        tv_nsec: i64::from(timeout.subsec_nanos()),
    };
    match rustix::event::poll(&mut fds, Some(&limit)) {
        Ok(0) => Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("TPM did not answer within {} ms", timeout.as_millis()),
        )),
        Ok(_) => Ok(()),
        Err(err) => Err(err.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_device_is_an_error_not_a_panic() {
        let err = TpmDevice::open(Path::new("/nonexistent/tpmrm0")).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::NotFound);
    }

    #[test]
    fn a_command_that_times_out_is_the_last_one_sent() {
        // A pipe's write end: the command is taken, an answer never becomes readable.
        let (_read, write) = std::io::pipe().unwrap();
        let mut tpm = TpmDevice {
            file: Some(File::from(std::os::fd::OwnedFd::from(write))),
        };
        let err = tpm
            .transact(&[0u8; 12], Duration::from_millis(20))
            .unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::TimedOut);
        let started = std::time::Instant::now();
        let err = tpm
            .transact(&[0u8; 12], Duration::from_secs(5))
            .unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::TimedOut);
        assert!(started.elapsed() < Duration::from_secs(1), "no second wait");
    }

    #[test]
    fn a_silent_device_times_out() {
        // A pipe's read end never becomes readable while nobody writes: the bounded wait.
        let (read, _write) = std::io::pipe().unwrap();
        let started = std::time::Instant::now();
        let err = wait_readable(&read, Duration::from_millis(50)).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::TimedOut);
        assert!(started.elapsed() >= Duration::from_millis(50));
    }
}
