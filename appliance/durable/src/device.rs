//! The storage backend seam: positional reads and writes plus flush, and the real file/block-device backend.
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

/// A device addressed by byte offset. Writes are durable only after a successful [`BlockDevice::flush`].
///
/// Implementations: [`FileDevice`] (a regular file or a block device) and
/// [`crate::sim::SimDevice`] (in memory, crashes and tears on demand).
pub trait BlockDevice: Send + Sync {
    /// Fill `buf` from `offset`. Reading past the end is an error.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()>;
    /// Write all of `buf` at `offset`. Not durable until the next successful flush.
    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()>;
    /// Make every completed write durable (fdatasync).
    fn flush(&self) -> io::Result<()>;
    /// Usable length in bytes.
    fn len(&self) -> u64;
    /// Call before a synchronous write-then-[`BlockDevice::flush`] sequence while other
    /// flushers may have run: takes the writeback errors they already reported (on their own
    /// descriptions) off this handle, so the coming flush reports only errors since now.
    /// Linux reports a writeback error once per open file description, and the serving
    /// runtime flushes through descriptions of its own (runtime `FlushFiles`), never this
    /// one: without it a checkpoint or a rekey would fail for a write long settled.
    fn settle_errors(&self) {}
    /// True when the device has no bytes.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A regular file or block device used through pread/pwrite and `sync_data`.
///
/// One process at a time: opening takes an exclusive `flock` on the file (held as long as
/// any handle from [`FileDevice::try_clone`] is open, released by the kernel when the process
/// dies), and a block device is also opened with `O_EXCL`, which the kernel refuses while it
/// is mounted or opened exclusively elsewhere. A second opener gets
/// [`io::ErrorKind::WouldBlock`] (or `EBUSY`) with a message naming the holder's pid when
/// `/proc/locks` shows it.
///
/// O_DIRECT is not used yet; every write the log emits is block-aligned in offset and
/// length so switching to O_DIRECT (or io_uring with registered buffers) needs no format change.
#[derive(Debug)]
pub struct FileDevice {
    file: File,
    len: u64,
}

impl FileDevice {
    /// Open an existing file or block device read-write, exclusively (see the type's
    /// documentation). Its current length is the device length.
    pub fn open(path: &Path) -> io::Result<Self> {
        let block = std::fs::metadata(path).is_ok_and(|m| m.file_type().is_block_device());
        let mut opts = OpenOptions::new();
        opts.read(true).write(true);
        if block {
            // Without O_CREAT, O_EXCL on a block device means "nobody else has it exclusively".
            opts.custom_flags(libc::O_EXCL);
        }
        let file = opts.open(path).map_err(|e| {
            if e.raw_os_error() == Some(libc::EBUSY) {
                io::Error::new(
                    e.kind(),
                    "the block device is in use (mounted, or opened exclusively by another process)",
                )
            } else {
                e
            }
        })?;
        lock(&file)?;
        Self::from_file(file)
    }

    /// Create (or open) a regular file and size it to `len` bytes (sparse; new bytes read as zero).
    pub fn create(path: &Path, len: u64) -> io::Result<Self> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        lock(&file)?;
        if file.metadata()?.len() < len {
            file.set_len(len)?;
        }
        Self::from_file(file)
    }

    fn from_file(mut file: File) -> io::Result<Self> {
        // A block device reports length 0 in metadata; seeking to the end gives its size.
        let meta_len = file.metadata()?.len();
        let len = if meta_len > 0 {
            meta_len
        } else {
            use std::io::Seek;
            file.seek(io::SeekFrom::End(0))?
        };
        Ok(FileDevice { file, len })
    }
}

impl FileDevice {
    /// Another handle on the same open file (for a driver that submits its own I/O).
    pub fn try_clone(&self) -> io::Result<FileDevice> {
        Ok(FileDevice {
            file: self.file.try_clone()?,
            len: self.len,
        })
    }
}

impl FileDevice {
    /// A second open file description of the same file, read-only, for flushes on their own
    /// lane (see `group_commit::Action::Flush`: Linux reports a writeback error once per open
    /// file description). Reopened through `/proc/self/fd`, so it is the same inode whatever
    /// happened to the path since; checked by device and inode number.
    pub fn open_flush_lane(&self) -> io::Result<File> {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::MetadataExt;
        let lane = OpenOptions::new()
            .read(true)
            .open(format!("/proc/self/fd/{}", self.file.as_raw_fd()))?;
        let (a, b) = (self.file.metadata()?, lane.metadata()?);
        if (a.dev(), a.ino(), a.rdev()) != (b.dev(), b.ino(), b.rdev()) {
            return Err(io::Error::other("the reopened data device is another file"));
        }
        Ok(lane)
    }
}

impl std::os::fd::AsRawFd for FileDevice {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.file.as_raw_fd()
    }
}

impl<D: BlockDevice> BlockDevice for std::sync::Arc<D> {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        (**self).read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        (**self).write_at(offset, buf)
    }
    fn flush(&self) -> io::Result<()> {
        (**self).flush()
    }
    fn len(&self) -> u64 {
        (**self).len()
    }
    fn settle_errors(&self) {
        (**self).settle_errors()
    }
}

impl BlockDevice for FileDevice {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        check_range(offset, buf.len(), self.len)?;
        self.file.read_exact_at(buf, offset)
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        check_range(offset, buf.len(), self.len)?;
        self.file.write_all_at(buf, offset)
    }

    fn flush(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn settle_errors(&self) {
        // Its result is what other flushers already reported (see the trait); nothing this
        // caller wrote is pending yet.
        let _ = self.file.sync_data();
    }

    fn len(&self) -> u64 {
        self.len
    }
}

/// How long an open waits for a lock whose holder is gone: a process killed with `kill -9`
/// keeps its lock until the kernel has torn down its io_uring, which holds the file, a few
/// milliseconds after the process is reaped.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Takes the exclusive lock, or says who holds it. A live holder is refused at once; a holder
/// that is no longer a live process (or cannot be named) is waited for up to [`LOCK_WAIT`].
fn lock(file: &File) -> io::Result<()> {
    let deadline = std::time::Instant::now() + LOCK_WAIT;
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(()),
            Err(std::fs::TryLockError::WouldBlock) => {
                let holder = file
                    .metadata()
                    .ok()
                    .and_then(|m| lock_holder(&std::fs::read_to_string("/proc/locks").ok()?, &m));
                let alive = holder.is_some_and(|pid| Path::new(&format!("/proc/{pid}")).exists());
                if alive || std::time::Instant::now() >= deadline {
                    let who = holder.map_or("another process".to_string(), |pid| {
                        format!("process {pid}")
                    });
                    return Err(io::Error::new(
                        io::ErrorKind::WouldBlock,
                        format!("in use: {who} holds its lock (one server per data device)"),
                    ));
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(e),
        }
    }
}

/// The pid `/proc/locks` (`text`) names for a lock on the file of `meta`: lines like
/// `1: FLOCK  ADVISORY  WRITE 4242 00:2f:1234567 0 EOF`, device numbers in hex.
fn lock_holder(text: &str, meta: &std::fs::Metadata) -> Option<u32> {
    let dev = meta.dev();
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    let want = format!("{major:02x}:{minor:02x}:{}", meta.ino());
    text.lines().find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        let at = f.iter().position(|x| *x == want)?;
        (f.get(1) == Some(&"FLOCK")).then_some(())?;
        f.get(at.checked_sub(1)?)?.parse().ok()
    })
}

/// Reject an access outside `0..len` (a device never grows).
pub(crate) fn check_range(offset: u64, n: usize, len: u64) -> io::Result<()> {
    match offset.checked_add(n as u64) {
        Some(end) if end <= len => Ok(()),
        _ => Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "access past the end of the device",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flush_lane_is_the_same_file_on_its_own_description() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dev");
        let dev = FileDevice::create(&path, 8192).unwrap();
        let lane = dev.open_flush_lane().unwrap();
        // Renaming the path away does not change what the lane is.
        std::fs::rename(&path, dir.path().join("moved")).unwrap();
        std::fs::write(&path, b"another file").unwrap();
        let (a, b) = (dev.file.metadata().unwrap(), lane.metadata().unwrap());
        assert_eq!((a.dev(), a.ino()), (b.dev(), b.ino()));
        dev.write_at(0, b"covered").unwrap();
        lane.sync_data().unwrap();
        // Reads through the lane see the device's writes: it is the same file.
        use std::io::{Read, Seek};
        let mut lane = lane;
        lane.seek(io::SeekFrom::Start(0)).unwrap();
        let mut head = [0u8; 7];
        lane.read_exact(&mut head).unwrap();
        assert_eq!(&head, b"covered");
    }

    #[test]
    fn file_device_roundtrip_and_bounds() {
        let dir = tempfile::tempdir().unwrap();
        let dev = FileDevice::create(&dir.path().join("dev"), 8192).unwrap();
        assert_eq!(dev.len(), 8192);
        dev.write_at(4096, b"hello").unwrap();
        dev.flush().unwrap();
        let mut buf = [0u8; 5];
        dev.read_at(4096, &mut buf).unwrap();
        assert_eq!(&buf, b"hello");
        assert!(dev.write_at(8190, b"abc").is_err());
        assert!(dev.read_at(u64::MAX - 1, &mut buf).is_err());
        drop(dev);
        let reopened = FileDevice::open(&dir.path().join("dev")).unwrap();
        assert_eq!(reopened.len(), 8192);
    }

    #[test]
    fn a_second_open_is_refused_and_names_the_holder() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dev");
        let dev = FileDevice::create(&path, 8192).unwrap();
        let clone = dev.try_clone().unwrap();
        let err = FileDevice::open(&path).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::WouldBlock);
        let msg = err.to_string();
        assert!(
            msg.contains(&format!("process {}", std::process::id())),
            "{msg}"
        );
        assert!(FileDevice::create(&path, 8192).is_err());
        drop(dev);
        assert!(FileDevice::open(&path).is_err(), "a clone keeps the lock");
        drop(clone);
        FileDevice::open(&path).unwrap();
    }

    #[test]
    fn proc_locks_lines_are_matched_by_device_and_inode() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dev");
        std::fs::write(&path, b"x").unwrap();
        let m = std::fs::metadata(&path).unwrap();
        let dev = m.dev();
        let (major, minor) = (
            ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff),
            (dev & 0xff) | ((dev >> 12) & !0xff),
        );
        let id = format!("{major:02x}:{minor:02x}:{}", m.ino());
        let text = format!(
            "1: POSIX  ADVISORY  WRITE 11 {id} 0 EOF\n2: FLOCK  ADVISORY  WRITE 22 00:01:{} 0 EOF\n3: FLOCK  ADVISORY  WRITE 33 {id} 0 EOF\n",
            m.ino() + 1
        );
        assert_eq!(lock_holder(&text, &m), Some(33));
        assert_eq!(lock_holder("", &m), None);
    }
}
