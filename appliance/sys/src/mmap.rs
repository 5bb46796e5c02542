//! Memory mappings shared with the kernel: an anonymous or fd-backed region owned by one
//! value and unmapped when it drops. The runtime's provided-buffer rings and the AF_XDP
//! UMEM and rings (`xsk.rs`) are made of these.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// A mapping of `len` bytes at an address the kernel chose, read-write, unmapped on drop.
/// It aliases no Rust object; what is written through [`Mapping::as_ptr`] is the owner's
/// business (the kernel may read or write it too, as the owner registered it).
#[derive(Debug)]
pub struct Mapping {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is owned by exactly one value; moving that owner to another thread
// moves the only handle to it (no thread-local state, nothing borrowed from it survives).
unsafe impl Send for Mapping {}

impl Mapping {
    /// A private anonymous mapping (zero-filled); `populate` faults every page in now
    /// (MAP_POPULATE) rather than on first touch.
    pub fn anonymous(len: usize, populate: bool) -> io::Result<Mapping> {
        let populate = if populate { libc::MAP_POPULATE } else { 0 };
        map(
            len,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | populate,
            -1,
            0,
        )
    }

    /// `len` bytes of `fd` from byte `offset`, shared with the kernel (MAP_SHARED,
    /// MAP_POPULATE): how the AF_XDP rings are mapped.
    pub fn shared(fd: BorrowedFd<'_>, offset: u64, len: usize) -> io::Result<Mapping> {
        let offset = libc::off_t::try_from(offset)
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        map(
            len,
            libc::MAP_SHARED | libc::MAP_POPULATE,
            fd.as_raw_fd(),
            offset,
        )
    }

    /// The first byte of the mapping (page aligned).
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Bytes mapped.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the mapping is empty (never: mmap refuses a zero length).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

fn map(
    len: usize,
    flags: libc::c_int,
    fd: libc::c_int,
    offset: libc::off_t,
) -> io::Result<Mapping> {
    // rustix's mmap is as unsafe as libc's; the raw call keeps the flags in one place.
    // SAFETY: a fresh mapping at an address the kernel picks (no MAP_FIXED): it aliases no
    // Rust object; `fd`, when not -1, is borrowed by the caller for the call.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            flags,
            fd,
            offset,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(Mapping {
        ptr: ptr.cast(),
        len,
    })
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly what mmap returned; nothing borrows the mapping
        // past its owner's drop.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// Filesystem magic of hugetlbfs (`statfs.f_type`).
const HUGETLBFS_MAGIC: u64 = 0x9584_58f6;

/// `len` bytes of `file` mapped shared (MAP_SHARED) for the rest of the process, as the
/// only slice of them: the item arena kept across restarts (`--memory-file`, ADR 0052),
/// and whether the file is on hugetlbfs. The file is locked first (`flock` LOCK_EX |
/// LOCK_NB; a second server on the same file is refused) and its descriptor is kept open
/// with the lock until the process exits, so no cooperating process writes these bytes
/// behind the slice's back.
pub fn map_file_for_process(
    file: std::fs::File,
    len: usize,
) -> io::Result<(&'static mut [u8], bool)> {
    let fd = file.as_raw_fd();
    // SAFETY: flock and fstatfs only read the descriptor `file` owns for the call.
    if unsafe { libc::flock(fd, libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above; `fs` is a plain struct the kernel fills.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `fs` is a valid, writable statfs for the call.
    let huge = unsafe { libc::fstatfs(fd, &mut fs) } == 0
        && u64::try_from(fs.f_type).ok() == Some(HUGETLBFS_MAGIC);
    let map = map(len, libc::MAP_SHARED, fd, 0)?;
    let ptr = map.ptr;
    // Never unmapped and the descriptor never closed: the slice lives as long as the process.
    std::mem::forget(map);
    std::mem::forget(file);
    // SAFETY: `ptr` is a fresh read-write mapping of `len` bytes that nothing else in this
    // process refers to (the `Mapping` was forgotten, not dropped), valid until exit.
    Ok((unsafe { std::slice::from_raw_parts_mut(ptr, len) }, huge))
}
