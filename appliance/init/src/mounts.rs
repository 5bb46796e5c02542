//! The filesystems PID 1 mounts before anything else runs.

use std::io;

use ringstore_sys::MountFlags;

/// One mount PID 1 makes: `source` of `fstype` on `target` with `data` options.
#[derive(Debug, Clone, Copy)]
pub struct Mount {
    pub target: &'static str,
    pub fstype: &'static str,
    pub data: &'static str,
    pub flags: MountFlags,
    /// A missing optional filesystem (no kernel support) is logged, not fatal.
    pub required: bool,
}

const NOSUID_NODEV_NOEXEC: MountFlags = MountFlags::NOSUID
    .union(MountFlags::NODEV)
    .union(MountFlags::NOEXEC);

/// In order: later targets live inside earlier ones (/dev/hugepages in devtmpfs, /sys/fs/bpf in sysfs).
pub const MOUNTS: &[Mount] = &[
    Mount {
        target: "/proc",
        fstype: "proc",
        data: "",
        flags: NOSUID_NODEV_NOEXEC,
        required: true,
    },
    Mount {
        target: "/sys",
        fstype: "sysfs",
        data: "",
        flags: NOSUID_NODEV_NOEXEC,
        required: true,
    },
    Mount {
        target: "/dev",
        fstype: "devtmpfs",
        data: "mode=0755",
        flags: MountFlags::NOSUID.union(MountFlags::NOEXEC),
        required: true,
    },
    Mount {
        target: "/tmp",
        fstype: "tmpfs",
        data: "mode=1777,size=64m",
        flags: MountFlags::NOSUID.union(MountFlags::NODEV),
        required: true,
    },
    Mount {
        target: "/run",
        fstype: "tmpfs",
        data: "mode=0755,size=16m",
        flags: NOSUID_NODEV_NOEXEC,
        required: true,
    },
    Mount {
        target: "/dev/hugepages",
        fstype: "hugetlbfs",
        data: "mode=1770",
        flags: MountFlags::NOSUID.union(MountFlags::NODEV),
        required: false,
    },
    Mount {
        target: "/sys/fs/cgroup",
        fstype: "cgroup2",
        data: "",
        flags: NOSUID_NODEV_NOEXEC,
        required: false,
    },
    Mount {
        target: "/sys/fs/bpf",
        fstype: "bpf",
        data: "mode=0700",
        flags: NOSUID_NODEV_NOEXEC,
        required: false,
    },
];

/// Why a required mount failed.
#[derive(Debug, thiserror::Error)]
#[error("mount {fstype} on {target}: {source}")]
pub struct MountError {
    pub target: &'static str,
    pub fstype: &'static str,
    pub source: io::Error,
}

/// Mounts everything in [`MOUNTS`]; returns the optional mounts that failed (with why).
pub fn mount_all() -> Result<Vec<MountError>, MountError> {
    let mut skipped = Vec::new();
    for m in MOUNTS {
        match mount_one(m) {
            Ok(()) => {}
            Err(source) if !m.required => skipped.push(MountError {
                target: m.target,
                fstype: m.fstype,
                source,
            }),
            Err(source) => {
                return Err(MountError {
                    target: m.target,
                    fstype: m.fstype,
                    source,
                })
            }
        }
    }
    Ok(skipped)
}

fn mount_one(m: &Mount) -> io::Result<()> {
    if let Err(err) = std::fs::create_dir_all(m.target) {
        if err.kind() != io::ErrorKind::AlreadyExists {
            return Err(err);
        }
    }
    // The source of a virtual filesystem is its type's name, as mount(8) shows it.
    let Err(err) = ringstore_sys::mount(m.fstype, m.target, m.fstype, m.flags, m.data) else {
        return Ok(());
    };
    // The kernel may have mounted devtmpfs already (CONFIG_DEVTMPFS_MOUNT with a root fs).
    if err.raw_os_error() == Some(libc::EBUSY) {
        return Ok(());
    }
    Err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parents_are_mounted_before_children() {
        for (i, m) in MOUNTS.iter().enumerate() {
            for later in &MOUNTS[i + 1..] {
                assert!(
                    !m.target.starts_with(&format!("{}/", later.target)),
                    "{} mounted before its parent {}",
                    m.target,
                    later.target
                );
            }
        }
        let required: Vec<_> = MOUNTS
            .iter()
            .filter(|m| m.required)
            .map(|m| m.target)
            .collect();
        assert_eq!(required, ["/proc", "/sys", "/dev", "/tmp", "/run"]);
    }
}
