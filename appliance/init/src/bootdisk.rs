//! The appliance disk (`disk.img`, ADR 0024) as PID 1 finds it: each whole disk's GPT is read
//! (`ringstore_bootdisk::gpt`) and a partition is known by its type GUID from `image/layout.toml`,
//! never by its name or number. The FAT partitions (ESP, config) are read through a byte-range
//! view of the whole disk, so PID 1 needs neither a kernel FAT driver nor a mount; the data
//! partition is handed to the server as its partition node (`/dev/vda3`).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ringstore_bootdisk::{fat, Layout, Role, Slice};

/// How long block devices may take to show their partition tables at boot.
pub const DISK_WAIT: Duration = Duration::from_secs(5);
const POLL: Duration = Duration::from_millis(50);
/// The config partition's file and its bound (the same as `ringstore serve --config`).
pub const CONFIG_FILE: &str = "ringstore.toml";
pub const CONFIG_FILE_MAX: u64 = 1 << 20;
/// The config partition's console keys (OpenSSH authorized_keys lines, ADR-0023) and their
/// bound: [`ringstore_console::login::KEYS_MAX`] lines of at most
/// [`ringstore_console::login::KEY_LINE_MAX`] bytes, and room for comments.
pub const AUTHORIZED_KEYS_FILE: &str = "authorized_keys";
pub const AUTHORIZED_KEYS_FILE_MAX: u64 = 64 << 10;

/// A partition found by type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// The whole disk (`/dev/vda`).
    pub disk: PathBuf,
    /// The partition number (`3` for `/dev/vda3`).
    pub number: u32,
    /// Its byte range on the disk.
    pub start: u64,
    pub len: u64,
}

impl Found {
    /// A read/write view of the partition's bytes.
    pub fn open(&self, write: bool) -> std::io::Result<Slice<File>> {
        let file = File::options().read(true).write(write).open(&self.disk)?;
        Ok(Slice::new(file, self.start, self.len))
    }

    /// The partition's own device node, waiting up to `limit` for devtmpfs to create it.
    pub fn node(&self, limit: Duration) -> Result<PathBuf, String> {
        let deadline = Instant::now() + limit;
        let disk = self
            .disk
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_string();
        loop {
            if let Some(name) = partition_name(&disk, self.number) {
                let node = PathBuf::from("/dev").join(name);
                if node.exists() {
                    return Ok(node);
                }
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "partition {} of {}: no device node after {} s",
                    self.number,
                    self.disk.display(),
                    limit.as_secs()
                ));
            }
            std::thread::sleep(POLL);
        }
    }
}

/// The name of partition `number` of `disk` in sysfs (`vda3`, `nvme0n1p3`).
fn partition_name(disk: &str, number: u32) -> Option<String> {
    let dir = std::fs::read_dir(Path::new("/sys/class/block").join(disk)).ok()?;
    dir.flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|name| {
            ringstore_sys::read_trim(format!("/sys/class/block/{disk}/{name}/partition"))
                .and_then(|n| n.parse::<u32>().ok())
                == Some(number)
        })
}

/// The whole disks the kernel knows (no partitions, no ram/loop devices), sorted.
fn whole_disks() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir("/sys/class/block")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with("ram") && !n.starts_with("loop"))
        .filter(|n| {
            !Path::new("/sys/class/block")
                .join(n)
                .join("partition")
                .exists()
        })
        .collect();
    names.sort();
    names
}

/// The first partition of `role`'s type on any disk.
pub fn find(layout: &Layout, role: Role) -> Option<Found> {
    let want = layout.by_role(role)?.type_guid;
    for disk in whole_disks() {
        let path = PathBuf::from("/dev").join(&disk);
        let Ok(mut file) = File::open(&path) else {
            continue;
        };
        let Ok((sector, entries)) = ringstore_bootdisk::gpt::entries(&mut file) else {
            continue;
        };
        if let Some(e) = entries.iter().find(|e| e.type_guid == want) {
            return Some(Found {
                disk: path,
                number: e.number,
                start: e.first_lba * sector,
                len: (e.last_lba + 1 - e.first_lba) * sector,
            });
        }
    }
    None
}

/// [`find`], retried until `limit` has passed.
pub fn wait_for(layout: &Layout, role: Role, limit: Duration) -> Option<Found> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(found) = find(layout, role) {
            return Some(found);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(POLL);
    }
}

/// `/ringstore.toml` of the config partition: `Ok(None)` when the partition or the file is absent.
pub fn read_config(found: &Found) -> Result<Option<String>, String> {
    read_text(found, CONFIG_FILE, CONFIG_FILE_MAX)
}

/// `/authorized_keys` of the config partition: `Ok(None)` when absent; over
/// [`AUTHORIZED_KEYS_FILE_MAX`] bytes or not UTF-8 it is refused with the reason.
pub fn read_authorized_keys(found: &Found) -> Result<Option<String>, String> {
    read_text(found, AUTHORIZED_KEYS_FILE, AUTHORIZED_KEYS_FILE_MAX)
}

/// File `name` of the FAT partition `found`, as text of at most `max` bytes.
fn read_text(found: &Found, name: &str, max: u64) -> Result<Option<String>, String> {
    let what = |e: &dyn std::fmt::Display| {
        format!(
            "config partition ({} partition {}): {e}",
            found.disk.display(),
            found.number
        )
    };
    let volume = found.open(false).map_err(|e| what(&e))?;
    let fs = fat::open(volume, &fat::DOS_EPOCH).map_err(|e| what(&e))?;
    match fat::read_file(&fs, name, max).map_err(|e| what(&e))? {
        None => Ok(None),
        Some(bytes) => String::from_utf8(bytes)
            .map(Some)
            .map_err(|_| what(&format!("{name}: not UTF-8 text"))),
    }
}

/// At first boot on a disk bigger than the image: the data partition, last on the disk and
/// never written (its first 4 KiB all zero, so the server will format it at its new size),
/// grows to the disk's end (`ringstore_bootdisk::gpt::grow_to_end`: the backup table moved)
/// and the kernel is told its new size. `Ok(None)` when there was nothing to grow or the
/// partition holds data already (a format does not grow with its partition).
pub fn grow_data_partition(layout: &Layout, found: &Found) -> Result<Option<String>, String> {
    use std::io::Read;
    let mut first = vec![0u8; 4096];
    found
        .open(false)
        .and_then(|mut p| p.read_exact(&mut first))
        .map_err(|e| format!("reading the data partition: {e}"))?;
    if first.iter().any(|&b| b != 0) {
        return Ok(None);
    }
    let want = layout
        .by_role(Role::Data)
        .map(|p| p.type_guid)
        .ok_or("the layout has no data partition")?;
    let mut disk = File::options()
        .read(true)
        .write(true)
        .open(&found.disk)
        .map_err(|e| format!("{}: {e}", found.disk.display()))?;
    let Some(grown) =
        ringstore_bootdisk::gpt::grow_to_end(&mut disk, want).map_err(|e| e.to_string())?
    else {
        return Ok(None);
    };
    disk.sync_all()
        .map_err(|e| format!("{}: {e}", found.disk.display()))?;
    let start = grown.first_lba * grown.sector;
    ringstore_sys::resize_partition(&disk, grown.number, start, grown.new_len())
        .map_err(|e| format!("telling the kernel partition {} grew: {e}", grown.number))?;
    Ok(Some(format!(
        "partition {} of {} grown from {} to {} (the disk's end) at first boot",
        grown.number,
        found.disk.display(),
        crate::data_device::size_text(grown.old_len()),
        crate::data_device::size_text(grown.new_len()),
    )))
}

/// `ringstore.data=auto`: the data partition (its node: [`Found::node`]), or why there is none.
pub fn find_data_partition(layout: &Layout) -> Result<Found, String> {
    wait_for(layout, Role::Data, DISK_WAIT).ok_or_else(|| {
        let want = layout
            .by_role(Role::Data)
            .map(|p| p.type_guid.to_string())
            .unwrap_or_default();
        format!(
            "data device auto: no partition of type {want} (ringstore-data) on any disk after {} s (disks: {})",
            DISK_WAIT.as_secs(),
            whole_disks().join(" ")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringstore_bootdisk::layout::FatKind;

    /// A config partition (FAT12 in a plain file) holding `files`; its [`Found`].
    fn partition(name: &str, files: &[(&str, &[u8])]) -> Found {
        let path =
            std::env::temp_dir().join(format!("ringstore-cfg-{name}-{}", std::process::id()));
        let len = 4u64 << 20;
        let file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        file.set_len(len).unwrap();
        fat::format(Slice::new(&file, 0, len), FatKind::Fat12, "RS-CONFIG", 1).unwrap();
        let fs = fat::open(Slice::new(&file, 0, len), &fat::DOS_EPOCH).unwrap();
        for (name, bytes) in files {
            fat::write_file(&fs, name, bytes).unwrap();
        }
        fs.unmount().unwrap();
        Found {
            disk: path,
            number: 2,
            start: 0,
            len,
        }
    }

    #[test]
    fn authorized_keys_are_read_within_their_bound() {
        let keys = b"ssh-ed25519 AAAA k\n";
        let found = partition("keys", &[(AUTHORIZED_KEYS_FILE, keys)]);
        assert_eq!(
            read_authorized_keys(&found).unwrap().as_deref(),
            Some("ssh-ed25519 AAAA k\n")
        );
        assert_eq!(read_config(&found).unwrap(), None, "no ringstore.toml");
        let _ = std::fs::remove_file(&found.disk);
        let big = vec![b'#'; usize::try_from(AUTHORIZED_KEYS_FILE_MAX).unwrap() + 1];
        let found = partition("big", &[(AUTHORIZED_KEYS_FILE, &big)]);
        let err = read_authorized_keys(&found).unwrap_err();
        assert!(err.contains("more than the 65536 allowed"), "{err}");
        let _ = std::fs::remove_file(&found.disk);
        let found = partition("binary", &[(AUTHORIZED_KEYS_FILE, &[0xff, 0xfe])]);
        assert!(read_authorized_keys(&found)
            .unwrap_err()
            .contains("not UTF-8"));
        let _ = std::fs::remove_file(&found.disk);
        let found = partition("none", &[]);
        assert_eq!(read_authorized_keys(&found).unwrap(), None);
        let _ = std::fs::remove_file(&found.disk);
    }
}
