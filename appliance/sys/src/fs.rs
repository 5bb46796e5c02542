//! Readers of sysfs and procfs files: one copy for the runtime and PID 1.

use std::path::Path;

/// Reads a sysfs/procfs file as one trimmed string; `None` if it cannot be read.
pub fn read_trim(path: impl AsRef<Path>) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

/// Drops the clean cached pages of `file` (a block device: what PID 1 reads of a partition
/// again must come from the disk, where something else may have written it).
pub fn drop_cached(file: &std::fs::File) -> std::io::Result<()> {
    rustix::fs::fadvise(file, 0, None, rustix::fs::Advice::DontNeed).map_err(std::io::Error::from)
}

/// True when `file` lives on tmpfs (its pages are memory: preallocating them takes RAM, and
/// `O_DIRECT` there is a buffered write under another name).
pub fn on_tmpfs(file: &std::fs::File) -> std::io::Result<bool> {
    const TMPFS_MAGIC: i128 = 0x0102_1994;
    let st = rustix::fs::fstatfs(file).map_err(std::io::Error::from)?;
    Ok(i128::from(st.f_type) == TMPFS_MAGIC)
}

/// Allocates every hole of the regular file `file` in `0..len` (fallocate mode 0: unwritten
/// extents, size unchanged). Returns false, allocating nothing, when the filesystem has fewer
/// free bytes than the holes need.
pub fn preallocate(file: &std::fs::File, len: u64) -> std::io::Result<bool> {
    use std::os::unix::fs::MetadataExt;
    let meta = file.metadata()?;
    let holes = len.saturating_sub(meta.blocks().saturating_mul(512));
    if holes == 0 {
        return Ok(true);
    }
    let st = rustix::fs::fstatvfs(file).map_err(std::io::Error::from)?;
    if st.f_bavail.saturating_mul(st.f_frsize) < holes {
        return Ok(false);
    }
    rustix::fs::fallocate(file, rustix::fs::FallocateFlags::empty(), 0, len)
        .map_err(std::io::Error::from)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_and_trims() {
        let release = super::read_trim("/proc/sys/kernel/osrelease").unwrap();
        assert!(!release.is_empty() && !release.ends_with('\n'));
        assert_eq!(super::read_trim("/proc/no-such-file"), None);
    }

    #[test]
    fn preallocates_the_holes_of_a_sparse_file() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.path().join("f"))
            .unwrap();
        file.set_len(1 << 20).unwrap();
        if super::on_tmpfs(&file).unwrap() {
            return; // tmpfs allocates too, but nobody calls it there
        }
        assert!(file.metadata().unwrap().blocks() * 512 < 1 << 20);
        assert!(super::preallocate(&file, 1 << 20).unwrap());
        let meta = file.metadata().unwrap();
        assert_eq!(meta.len(), 1 << 20);
        assert!(meta.blocks() * 512 >= 1 << 20);
        // Allocated blocks read as zeros still.
        let mut buf = vec![1u8; 4096];
        std::os::unix::fs::FileExt::read_exact_at(&file, &mut buf, 8192).unwrap();
        assert!(buf.iter().all(|&b| b == 0));
    }
}
