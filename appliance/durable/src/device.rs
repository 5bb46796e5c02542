//! The storage backend seam: positional reads and writes plus flush, and the real file/block-device backend.
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
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
    /// True when the device has no bytes.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A regular file or block device used through pread/pwrite and `sync_data`.
///
/// O_DIRECT is not used yet; every write the log emits is block-aligned in offset and
/// length so switching to O_DIRECT (or io_uring with registered buffers) needs no format change.
#[derive(Debug)]
pub struct FileDevice {
    file: File,
    len: u64,
}

impl FileDevice {
    /// Open an existing file or block device read-write. Its current length is the device length.
    pub fn open(path: &Path) -> io::Result<Self> {
        let file = OpenOptions::new().read(true).write(true).open(path)?;
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

    fn len(&self) -> u64 {
        self.len
    }
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
        let reopened = FileDevice::open(&dir.path().join("dev")).unwrap();
        assert_eq!(reopened.len(), 8192);
    }
}
