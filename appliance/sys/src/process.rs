//! Per-process and per-thread settings: resource limits, allocator tunables, no_new_privs and
//! the capability bounding set, PID 1's console descriptors, thread CPU time.

use std::io;
use std::os::fd::{AsRawFd, IntoRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::time::Duration;

use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
use rustix::thread::CapabilitySet;

/// Raises the soft RLIMIT_NOFILE to the hard limit (more connections before EMFILE); returns
/// the soft limit asked for (`u64::MAX` for unlimited).
pub fn raise_nofile_limit() -> u64 {
    let lim = getrlimit(Resource::Nofile);
    // None is RLIM_INFINITY.
    let (cur, max) = (
        lim.current.unwrap_or(u64::MAX),
        lim.maximum.unwrap_or(u64::MAX),
    );
    if cur < max {
        let raised = Rlimit {
            current: lim.maximum,
            maximum: lim.maximum,
        };
        let _ = setrlimit(Resource::Nofile, raised);
    }
    cur.max(max)
}

/// Sets RLIMIT_MEMLOCK (soft and hard) to unlimited.
pub fn set_memlock_unlimited() -> io::Result<()> {
    let unlimited = Rlimit {
        current: None,
        maximum: None,
    };
    Ok(setrlimit(Resource::Memlock, unlimited)?)
}

/// Sets RLIMIT_NOFILE (soft and hard) to `files`.
pub fn set_nofile_limit(files: u64) -> io::Result<()> {
    let limit = Rlimit {
        current: Some(files),
        maximum: Some(files),
    };
    Ok(setrlimit(Resource::Nofile, limit)?)
}

/// Allocations at least this large get their own mapping, returned to the kernel on free.
pub const MALLOC_MMAP_THRESHOLD: usize = 64 << 10;
/// [`MALLOC_MMAP_THRESHOLD`] as mallopt's `int` (64 KiB fits).
const MMAP_THRESHOLD: libc::c_int = 64 << 10;
const _: () = assert!(MMAP_THRESHOLD as usize == MALLOC_MMAP_THRESHOLD);

/// Makes memory freed by finished requests go back to the kernel (ADR 0012).
///
/// glibc (the host build) otherwise raises its mmap threshold dynamically up to 32 MiB after
/// the first large free and keeps freed buffers in per-thread arenas: after 1000 stalled
/// 1 MiB uploads were cut, RSS stayed at ~700 MiB. With a fixed threshold every buffer of a
/// value-sized request is its own mapping and the arenas hold only small blocks. musl (the
/// appliance) already maps and unmaps large blocks on its own and has no `mallopt`.
/// Raw: mallopt is a glibc function, not a syscall; rustix has nothing for it.
pub fn return_freed_memory_promptly() {
    #[cfg(target_env = "gnu")]
    {
        // SAFETY: mallopt only changes allocator tunables; called before the workers start.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
            libc::mallopt(libc::M_TRIM_THRESHOLD, 2 * MMAP_THRESHOLD);
        }
    }
}

/// Sets no_new_privs on the calling thread (prctl PR_SET_NO_NEW_PRIVS).
pub fn set_no_new_privs() -> io::Result<()> {
    Ok(rustix::thread::set_no_new_privs(true)?)
}

/// Whether the calling thread has no_new_privs set.
pub fn no_new_privs() -> io::Result<bool> {
    Ok(rustix::thread::no_new_privs()?)
}

/// The capability numbered `cap` as a one-bit set: rustix's `Capability` enum stops at the
/// capabilities it knows, and PID 1 also drops newer ones by number.
fn one_capability(cap: u32) -> io::Result<CapabilitySet> {
    if cap >= 64 {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    }
    Ok(CapabilitySet::from_bits_retain(1 << cap))
}

/// Whether capability number `cap` is in the calling thread's bounding set; an error
/// (EINVAL) past the kernel's last capability.
pub fn bounding_set_has(cap: u32) -> io::Result<bool> {
    Ok(rustix::thread::capability_is_in_bounding_set(
        one_capability(cap)?,
    )?)
}

/// Drops capability number `cap` from the calling thread's bounding set.
pub fn bounding_set_drop(cap: u32) -> io::Result<()> {
    Ok(rustix::thread::remove_capability_from_bounding_set(
        one_capability(cap)?,
    )?)
}

/// Makes `to` the process's stderr (fd 2) and returns a new descriptor of what fd 2 was: the
/// log sink's tee reads what every `eprintln!` writes and passes it on (ADR 0045).
pub fn replace_stderr(to: &OwnedFd) -> std::io::Result<OwnedFd> {
    use std::os::fd::AsFd;
    let stderr = std::io::stderr();
    let old = rustix::io::fcntl_dupfd_cloexec(stderr.as_fd(), 3)?;
    rustix::stdio::dup2_stderr(to)?;
    Ok(old)
}

/// The kernel opens /dev/console as fds 0-2 for init when the initramfs has that node; if it
/// did not, opens it and makes it fds 0, 1 and 2 (call once devtmpfs is mounted).
pub fn ensure_console_fds() {
    if rustix::io::fcntl_getfd(rustix::stdio::stdin()).is_ok() {
        return;
    }
    let Ok(console) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOCTTY)
        .open("/dev/console")
    else {
        return;
    };
    // std opens it close-on-exec; the copies dup2 makes are not (and PID 1 never executes a
    // program anyway).
    let fd = OwnedFd::from(console);
    let raw = fd.as_raw_fd();
    // dup2 onto itself would fail (it is dup3 underneath): skip the number it already has.
    if raw != 0 {
        let _ = rustix::stdio::dup2_stdin(&fd);
    }
    if raw != 1 {
        let _ = rustix::stdio::dup2_stdout(&fd);
    }
    if raw != 2 {
        let _ = rustix::stdio::dup2_stderr(&fd);
    }
    if raw <= 2 {
        // The console was opened as one of 0..2 itself: keep it open.
        let _ = fd.into_raw_fd();
    }
}

/// CLOCK_MONOTONIC (the clock `std::time::Instant` reads) in nanoseconds: u64 lasts 584
/// years of uptime. For the workers' loop clock, read several times per request at depth 1:
/// an `Instant` and a subtraction of two cost about 50 instructions more per reading
/// (callgrind), in the normalising and checking of each `Timespec`. Raw libc, as `Instant`
/// reads it: rustix's own vDSO look-up faults under valgrind (the icount bench).
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one `struct timespec` through the pointer, which points at
    // `ts`, valid writable memory of that type; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}

/// CPU time the calling thread has used (CLOCK_THREAD_CPUTIME_ID).
pub fn thread_cpu_time() -> Duration {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(ts.tv_sec as u64, u32::try_from(ts.tv_nsec).unwrap_or(0))
}

/// The process's CPU time, user and system, in microseconds (memcache `stats rusage_*`).
/// Raw libc: rustix has no getrusage.
pub fn process_cpu_time() -> (u64, u64) {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    let ptr = usage.as_mut_ptr();
    // SAFETY: getrusage writes one `struct rusage` through `ptr`, valid writable memory of it.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, ptr) };
    if rc != 0 {
        return (0, 0);
    }
    // SAFETY: zeroed is a valid `rusage` (plain integers), and getrusage filled it in.
    let usage = unsafe { usage.assume_init() };
    let us = |t: libc::timeval| (t.tv_sec.max(0) as u64) * 1_000_000 + t.tv_usec.max(0) as u64;
    (us(usage.ru_utime), us(usage.ru_stime))
}

/// Sets the host name of the UTS namespace (sethostname(2); needs CAP_SYS_ADMIN).
pub fn set_hostname(name: &str) -> io::Result<()> {
    Ok(rustix::system::sethostname(name.as_bytes())?)
}

/// The host name of the UTS namespace (uname(2)'s nodename).
pub fn hostname() -> String {
    rustix::system::uname()
        .nodename()
        .to_string_lossy()
        .into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounding_set_reads_and_capability_numbers_are_bounded() {
        // CAP_CHOWN (0) exists on every kernel; 64 and above are refused here.
        assert!(bounding_set_has(0).is_ok());
        assert!(bounding_set_has(64).is_err());
        assert!(bounding_set_drop(64).is_err());
    }

    #[test]
    fn no_new_privs_is_per_thread() {
        std::thread::spawn(|| {
            set_no_new_privs().unwrap();
            assert!(no_new_privs().unwrap());
        })
        .join()
        .unwrap();
        assert!(
            !no_new_privs().unwrap(),
            "the test thread itself is untouched"
        );
    }

    #[test]
    fn limits_and_clocks() {
        assert!(raise_nofile_limit() > 0);
        let before = thread_cpu_time();
        let mut x = 0u64;
        for i in 0..1_000_000u64 {
            x = x.wrapping_add(std::hint::black_box(i));
        }
        std::hint::black_box(x);
        assert!(thread_cpu_time() > before);
    }

    #[test]
    fn hostname_is_the_kernels() {
        let name = hostname();
        assert!(!name.is_empty() && name.len() <= 64, "{name:?}");
        assert_eq!(
            Some(name),
            crate::read_trim("/proc/sys/kernel/hostname"),
            "uname's nodename is /proc's hostname"
        );
    }
}
