//! The console terminal's line discipline, for PID 1's console commands that wait for a single
//! key (`watch`). libc's termios calls: the workspace builds rustix without its `termios`
//! feature.

use std::os::fd::{AsRawFd, BorrowedFd, RawFd};

/// While it lives, the terminal delivers each key at once (no line editing, no echo, Ctrl-C a
/// byte instead of a signal); dropped, it restores what was set before.
pub struct KeysAtOnce {
    fd: RawFd,
    saved: libc::termios,
}

impl KeysAtOnce {
    /// `None` when `fd` is not a terminal (a pipe or /dev/null: nothing to change).
    pub fn start(fd: BorrowedFd<'_>) -> Option<KeysAtOnce> {
        let raw = fd.as_raw_fd();
        let saved = get(raw)?;
        let mut keys = saved;
        keys.c_lflag &= !(libc::ICANON | libc::ECHO | libc::ISIG);
        keys.c_cc[libc::VMIN] = 0;
        keys.c_cc[libc::VTIME] = 0;
        set(raw, &keys)?;
        Some(KeysAtOnce { fd: raw, saved })
    }
}

impl Drop for KeysAtOnce {
    fn drop(&mut self) {
        let _ = set(self.fd, &self.saved);
    }
}

fn get(fd: RawFd) -> Option<libc::termios> {
    // SAFETY: termios is a plain C struct of integers and arrays: all-zero is a valid value,
    // and tcgetattr writes it whole on success.
    let mut t: libc::termios = unsafe { std::mem::zeroed() };
    // SAFETY: `t` is a live termios the call may write; a stale fd only fails (EBADF).
    (unsafe { libc::tcgetattr(fd, &mut t) } == 0).then_some(t)
}

fn set(fd: RawFd, t: &libc::termios) -> Option<()> {
    // SAFETY: `t` is a valid termios read by the call; a stale fd only fails (EBADF).
    (unsafe { libc::tcsetattr(fd, libc::TCSANOW, t) } == 0).then_some(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd as _;

    #[test]
    fn a_file_that_is_not_a_terminal_is_left_alone() {
        let f = std::fs::File::open("/dev/null").expect("/dev/null");
        assert!(KeysAtOnce::start(f.as_fd()).is_none());
    }
}
