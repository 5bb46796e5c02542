//! Block device ioctls: telling the kernel a partition changed size (`BLKPG`).

use std::io;
use std::os::fd::AsRawFd;

/// `BLKPG`: `_IO(0x12, 105)`.
const BLKPG: libc::Ioctl = 0x1269;
/// `BLKPG_RESIZE_PARTITION`.
const RESIZE_PARTITION: libc::c_int = 3;

/// `struct blkpg_partition` (linux/blkpg.h).
#[repr(C)]
struct BlkpgPartition {
    start: libc::c_longlong,
    length: libc::c_longlong,
    pno: libc::c_int,
    devname: [libc::c_char; 64],
    volname: [libc::c_char; 64],
}

/// `struct blkpg_ioctl_arg`.
#[repr(C)]
struct BlkpgArg {
    op: libc::c_int,
    flags: libc::c_int,
    datalen: libc::c_int,
    data: *mut libc::c_void,
}

/// Tells the kernel that partition `number` of the whole disk `disk` now spans `len` bytes
/// from `start` (after its table was rewritten): works while other partitions are in use,
/// which re-reading the whole table (`BLKRRPART`) does not.
pub fn resize_partition(disk: &std::fs::File, number: u32, start: u64, len: u64) -> io::Result<()> {
    let invalid = |_| io::Error::from(io::ErrorKind::InvalidInput);
    let mut part = BlkpgPartition {
        start: libc::c_longlong::try_from(start).map_err(invalid)?,
        length: libc::c_longlong::try_from(len).map_err(invalid)?,
        pno: libc::c_int::try_from(number).map_err(invalid)?,
        devname: [0; 64],
        volname: [0; 64],
    };
    let mut arg = BlkpgArg {
        op: RESIZE_PARTITION,
        flags: 0,
        datalen: libc::c_int::try_from(std::mem::size_of::<BlkpgPartition>()).map_err(invalid)?,
        data: std::ptr::from_mut(&mut part).cast(),
    };
    // SAFETY: `arg` and the `part` it points to are live, initialised and laid out as the
    // kernel's blkpg structs; the kernel only reads them during the call.
    let rc = unsafe { libc::ioctl(disk.as_raw_fd(), BLKPG, std::ptr::from_mut(&mut arg)) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_regular_file_is_refused() {
        let file = tempfile::tempfile().expect("a temporary file");
        let err = super::resize_partition(&file, 1, 0, 1 << 20).expect_err("not a block device");
        assert_eq!(err.raw_os_error(), Some(libc::ENOTTY), "{err}");
    }

    #[test]
    fn the_structs_have_the_kernels_sizes() {
        assert_eq!(
            std::mem::size_of::<super::BlkpgPartition>(),
            8 + 8 + 4 + 64 + 64 + 4
        );
        assert_eq!(std::mem::size_of::<super::BlkpgArg>(), 4 + 4 + 4 + 4 + 8);
    }
}
