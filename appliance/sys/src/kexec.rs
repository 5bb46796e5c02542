//! kexec_file_load(2) from memory (the kernel and initrd carried in memfds) and the jump
//! (reboot(2) with LINUX_REBOOT_CMD_KEXEC): PID 1's reboot and update without the firmware
//! (ADR 0054). rustix has neither memfd-backed loading nor kexec_file_load, hence libc.

use std::ffi::CString;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// The longest command line handed to the next kernel (x86's COMMAND_LINE_SIZE).
pub const KEXEC_CMDLINE_MAX: usize = 2048;

/// `bytes` in an anonymous memory file, for a syscall that wants a file descriptor.
fn memfd_with(name: &str, bytes: &[u8]) -> io::Result<OwnedFd> {
    let name = CString::new(name).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: memfd_create reads the NUL-terminated `name` for the call only.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor this function alone owns.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut file = std::fs::File::from(owned);
    file.write_all(bytes)?;
    Ok(OwnedFd::from(file))
}

/// Loads `kernel` (a bzImage), `initrd` and `cmdline` as the kernel the next
/// [`reboot_kexec`] starts. Nothing runs yet; a second load replaces the first.
pub fn kexec_file_load(kernel: &[u8], initrd: &[u8], cmdline: &str) -> io::Result<()> {
    if cmdline.len() >= KEXEC_CMDLINE_MAX {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "command line of {} bytes (limit {KEXEC_CMDLINE_MAX})",
                cmdline.len()
            ),
        ));
    }
    let line = CString::new(cmdline).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let kernel = memfd_with("kexec-kernel", kernel)?;
    let initrd = memfd_with("kexec-initrd", initrd)?;
    let len = line.as_bytes_with_nul().len();
    // SAFETY: two descriptors owned above, a NUL-terminated line of `len` bytes; the kernel
    // copies all three during the call and keeps no pointer into this process.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_kexec_file_load,
            kernel.as_raw_fd(),
            initrd.as_raw_fd(),
            len,
            line.as_ptr(),
            0_u64,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Starts the kernel [`kexec_file_load`] loaded; returns only on failure.
pub fn reboot_kexec() -> io::Result<()> {
    crate::reboot(rustix::system::RebootCommand::Kexec)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_overlong_command_line_is_refused_before_the_syscall() {
        let err = kexec_file_load(b"", b"", &"x".repeat(KEXEC_CMDLINE_MAX)).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn a_memfd_holds_its_bytes() {
        use std::io::{Read, Seek};
        let fd = memfd_with("t", b"bzImage").unwrap();
        let mut f = std::fs::File::from(fd);
        f.rewind().unwrap();
        let mut back = Vec::new();
        f.read_to_end(&mut back).unwrap();
        assert_eq!(back, b"bzImage");
    }
}
