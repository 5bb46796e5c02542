//! `disk.img`: GPT (gptman) with the partitions of `image/layout.toml`, the ESP and the config
//! partition formatted as FAT (fatfs) and filled, the data partition left zeroed (sparse), all
//! written into a plain file without root or loop devices. GUIDs and volume ids come from a
//! seed, FAT times from `SOURCE_DATE_EPOCH`, so the same inputs give the same bytes (ADR 0024).

use std::fs::OpenOptions;
use std::path::Path;

use anyhow::{Context, Result};
use ringstore_bootdisk::fat::{self, FixedTime};
use ringstore_bootdisk::layout::Layout;
use ringstore_bootdisk::{Guid, Role, Slice};
use sha2::{Digest, Sha256};

/// What goes on one FAT partition: (path, bytes).
pub type Files = Vec<(String, Vec<u8>)>;

/// 16 bytes derived from the seed for one purpose.
fn derived(seed: &str, purpose: &str) -> [u8; 16] {
    let mut h = Sha256::new();
    h.update(seed.as_bytes());
    h.update([0]);
    h.update(purpose.as_bytes());
    let digest = h.finalize();
    let mut out = [0u8; 16];
    out.copy_from_slice(&digest[..16]);
    out
}

/// Writes `path` (`size` bytes) from `layout`; `files` gives each FAT partition's contents by role.
pub fn write(
    path: &Path,
    layout: &Layout,
    size: u64,
    seed: &str,
    time: &'static FixedTime,
    files: &[(Role, Files)],
) -> Result<()> {
    let placed = layout.place(size)?;
    let tmp = path.with_extension("img.tmp");
    let mut disk = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&tmp)
        .with_context(|| format!("creating {}", tmp.display()))?;
    disk.set_len(size)
        .with_context(|| format!("sizing {}", tmp.display()))?;
    let sector = layout.sector_size;
    let mut gpt = gptman::GPT::new_from(&mut disk, sector, Guid::v4_from(derived(seed, "disk")).0)
        .context("creating the GPT")?;
    for (i, (part, at)) in layout.partitions.iter().zip(&placed).enumerate() {
        gpt[u32::try_from(i + 1)?] = gptman::GPTPartitionEntry {
            partition_type_guid: part.type_guid.0,
            unique_partition_guid: Guid::v4_from(derived(
                seed,
                &format!("partition {}", part.name),
            ))
            .0,
            starting_lba: at.first,
            ending_lba: at.last,
            attribute_bits: 0,
            partition_name: part.name.as_str().into(),
        };
    }
    gpt.write_into(&mut disk).context("writing the GPT")?;
    gptman::GPT::write_protective_mbr_into(&mut disk, sector)
        .context("writing the protective MBR")?;
    for (part, at) in layout.partitions.iter().zip(&placed) {
        let Some((kind, label)) = &part.fat else {
            continue;
        };
        let (start, len) = at.byte_range(sector);
        let id = derived(seed, &format!("volume {}", part.name));
        let volume_id = u32::from_le_bytes([id[0], id[1], id[2], id[3]]);
        fat::format(Slice::new(&mut disk, start, len), *kind, label, volume_id)
            .with_context(|| format!("formatting {}", part.name))?;
        let fs = fat::open(Slice::new(&mut disk, start, len), time)?;
        for (role, list) in files {
            if *role != part.role {
                continue;
            }
            for (name, bytes) in list {
                fat::write_file(&fs, name, bytes)
                    .with_context(|| format!("{}: {name}", part.name))?;
            }
        }
        fs.unmount()?;
    }
    disk.sync_all()
        .with_context(|| format!("syncing {}", tmp.display()))?;
    drop(disk);
    std::fs::rename(&tmp, path)
        .with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;

    /// Reads one file back from a FAT partition of an image (tests, and the size report).
    pub fn read_back(
        image: &Path,
        layout: &Layout,
        role: Role,
        name: &str,
    ) -> Result<Option<Vec<u8>>> {
        let mut disk = File::options().read(true).write(true).open(image)?;
        let (sector, entries) = ringstore_bootdisk::gpt::entries(&mut disk)?;
        let part = layout.by_role(role).context("role not in the layout")?;
        let entry = entries
            .iter()
            .find(|e| e.type_guid == part.type_guid)
            .context("partition not in the GPT")?;
        let start = entry.first_lba * sector;
        let len = (entry.last_lba + 1 - entry.first_lba) * sector;
        let fs = fat::open(Slice::new(&mut disk, start, len), &fat::DOS_EPOCH)?;
        Ok(fat::read_file(&fs, name, 64 << 20)?)
    }

    #[test]
    fn same_inputs_same_bytes_and_the_partitions_are_found_by_type() {
        let layout = Layout::builtin();
        let dir =
            std::env::temp_dir().join(format!("ringstore-bootdisk-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let time: &'static FixedTime = Box::leak(Box::new(FixedTime::from_unix(1_700_000_000)));
        let files = vec![
            (
                Role::Esp,
                vec![("EFI/BOOT/BOOTX64.EFI".to_string(), b"MZ boot".to_vec())],
            ),
            (
                Role::Config,
                vec![("ringstore.toml".to_string(), b"memory = \"64M\"\n".to_vec())],
            ),
        ];
        let one = dir.join("one.img");
        let two = dir.join("two.img");
        let other = dir.join("other.img");
        write(&one, &layout, 100 << 20, "seed", time, &files).unwrap();
        write(&two, &layout, 100 << 20, "seed", time, &files).unwrap();
        write(&other, &layout, 100 << 20, "other seed", time, &files).unwrap();
        let (a, b, c) = (
            std::fs::read(&one).unwrap(),
            std::fs::read(&two).unwrap(),
            std::fs::read(&other).unwrap(),
        );
        assert_eq!(a.len(), 100 << 20);
        assert!(a == b, "two builds from the same inputs differ");
        assert!(a != c, "the seed changes nothing");
        assert_eq!(
            read_back(&one, &layout, Role::Config, "ringstore.toml")
                .unwrap()
                .unwrap(),
            b"memory = \"64M\"\n"
        );
        assert_eq!(
            read_back(&one, &layout, Role::Esp, "EFI/BOOT/BOOTX64.EFI")
                .unwrap()
                .unwrap(),
            b"MZ boot"
        );
        let mut f = File::open(&one).unwrap();
        let (_, entries) = ringstore_bootdisk::gpt::entries(&mut f).unwrap();
        let data = layout.by_role(Role::Data).unwrap();
        let found = entries
            .iter()
            .find(|e| e.type_guid == data.type_guid)
            .unwrap();
        assert_eq!((found.number, found.name.as_str()), (3, "ringstore-data"));
        // The protective MBR's signature, and the GPT header at LBA 1.
        assert_eq!(&a[510..512], &[0x55, 0xaa]);
        assert_eq!(&a[512..520], b"EFI PART");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
