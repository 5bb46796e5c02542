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

#[cfg(test)]
mod tests {
    #[test]
    fn reads_and_trims() {
        let release = super::read_trim("/proc/sys/kernel/osrelease").unwrap();
        assert!(!release.is_empty() && !release.ends_with('\n'));
        assert_eq!(super::read_trim("/proc/no-such-file"), None);
    }
}
