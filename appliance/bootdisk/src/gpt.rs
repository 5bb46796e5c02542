//! A disk's GUID partition table (with `gptman`): which partition numbers carry which type
//! GUID, so PID 1 can find the config and data partitions by type, and the data partition
//! grown to the end of a disk bigger than the image ([`grow_to_end`]).

use std::io::{Read, Seek, SeekFrom, Write};

use crate::guid::Guid;

/// One used GPT entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The partition number Linux gives it (1-based, as in `/dev/vda2`).
    pub number: u32,
    pub type_guid: Guid,
    pub first_lba: u64,
    pub last_lba: u64,
    pub name: String,
}

#[derive(Debug, thiserror::Error)]
#[error("no valid GUID partition table: {0}")]
pub struct GptError(pub String);

/// The used entries of the disk's GPT (512- or 4096-byte sectors).
pub fn entries<R: Read + Seek>(disk: &mut R) -> Result<(u64, Vec<Entry>), GptError> {
    let gpt = gptman::GPT::find_from(disk).map_err(|e| GptError(e.to_string()))?;
    let list = gpt
        .iter()
        .filter(|(_, e)| e.is_used())
        .map(|(number, e)| Entry {
            number,
            type_guid: Guid(e.partition_type_guid),
            first_lba: e.starting_lba,
            last_lba: e.ending_lba,
            name: e.partition_name.as_str().to_string(),
        })
        .collect();
    Ok((gpt.sector_size, list))
}

/// What [`grow_to_end`] did: partition `number` now ends at `new_last_lba` (was
/// `old_last_lba`), in sectors of `sector` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grown {
    pub number: u32,
    pub sector: u64,
    pub first_lba: u64,
    pub old_last_lba: u64,
    pub new_last_lba: u64,
}

impl Grown {
    /// The partition's new length in bytes.
    pub fn new_len(&self) -> u64 {
        (self.new_last_lba + 1 - self.first_lba) * self.sector
    }

    /// Its length before, in bytes.
    pub fn old_len(&self) -> u64 {
        (self.old_last_lba + 1 - self.first_lba) * self.sector
    }
}

/// Partitions end on this boundary (the layout's `align_mib`).
const ALIGN: u64 = 1 << 20;

/// Grows the partition of type `type_guid` to the end of `disk` when it is the disk's last
/// partition and the disk is larger than when its table was written (an image `dd`'d to a
/// bigger disk): the backup header and entry array move to the disk's new end (the old ones
/// are zeroed: they now lie inside the partition), the protective MBR covers the disk, and
/// the partition ends on a 1 MiB boundary. `Ok(None)` when there is nothing to grow.
pub fn grow_to_end<D: Read + Write + Seek>(
    disk: &mut D,
    type_guid: Guid,
) -> Result<Option<Grown>, GptError> {
    let err = |e: gptman::Error| GptError(e.to_string());
    let mut gpt = gptman::GPT::find_from(disk).map_err(err)?;
    let sector = gpt.sector_size;
    let last_end = gpt
        .iter()
        .filter(|(_, e)| e.is_used())
        .map(|(_, e)| e.ending_lba)
        .max()
        .unwrap_or(0);
    let Some((number, first_lba, old_last_lba)) = gpt
        .iter()
        .find(|(_, e)| e.is_used() && Guid(e.partition_type_guid) == type_guid)
        .map(|(n, e)| (n, e.starting_lba, e.ending_lba))
    else {
        return Ok(None);
    };
    if old_last_lba != last_end {
        return Ok(None); // not the last partition: growing it would overlap the next
    }
    let (old_backup, old_last_usable) = (gpt.header.backup_lba, gpt.header.last_usable_lba);
    gpt.header.update_from(disk, sector).map_err(err)?;
    let aligned_end = (gpt.header.last_usable_lba + 1) * sector / ALIGN * ALIGN / sector;
    let new_last_lba = aligned_end.saturating_sub(1);
    if gpt.header.backup_lba <= old_backup || new_last_lba <= old_last_lba {
        return Ok(None);
    }
    gpt[number].ending_lba = new_last_lba;
    gpt.write_into(disk).map_err(err)?;
    gptman::GPT::write_protective_mbr_into(disk, sector).map_err(err)?;
    // The old backup entry array and header (from the old last usable sector on).
    let stale = (old_backup - old_last_usable) * sector;
    disk.seek(SeekFrom::Start((old_last_usable + 1) * sector))
        .map_err(|e| GptError(e.to_string()))?;
    disk.write_all(&vec![0u8; usize::try_from(stale).unwrap_or(0)])
        .and_then(|()| disk.flush())
        .map_err(|e| GptError(e.to_string()))?;
    Ok(Some(Grown {
        number,
        sector,
        first_lba,
        old_last_lba,
        new_last_lba,
    }))
}

#[cfg(test)]
mod grow_tests {
    use super::*;
    use std::io::Cursor;

    const MIB: u64 = 1 << 20;
    const DATA: [u8; 16] = [7; 16];

    fn us(n: u64) -> usize {
        usize::try_from(n).unwrap()
    }

    /// A disk of `mib` MiB with two partitions, the data one last.
    fn disk(mib: u64) -> Cursor<Vec<u8>> {
        let mut disk = Cursor::new(vec![0u8; us(mib * MIB)]);
        let mut gpt = gptman::GPT::new_from(&mut disk, 512, [1; 16]).unwrap();
        gpt.align = 2048;
        gpt[1] = gptman::GPTPartitionEntry {
            partition_type_guid: [9; 16],
            unique_partition_guid: [2; 16],
            starting_lba: 2048,
            ending_lba: 4095,
            attribute_bits: 0,
            partition_name: "esp".into(),
        };
        gpt[2] = gptman::GPTPartitionEntry {
            partition_type_guid: DATA,
            unique_partition_guid: [3; 16],
            starting_lba: 4096,
            ending_lba: (mib - 1) * MIB / 512 - 1,
            attribute_bits: 0,
            partition_name: "data".into(),
        };
        gpt.write_into(&mut disk).unwrap();
        gptman::GPT::write_protective_mbr_into(&mut disk, 512).unwrap();
        disk
    }

    #[test]
    fn the_last_partition_grows_to_a_bigger_disk() {
        let mut d = disk(8);
        assert_eq!(grow_to_end(&mut d, Guid(DATA)).unwrap(), None, "same disk");
        d.get_mut().resize(us(32 * MIB), 0);
        let grown = grow_to_end(&mut d, Guid(DATA)).unwrap().expect("grown");
        assert_eq!(grown.number, 2);
        assert_eq!(grown.old_len(), 5 * MIB);
        // To the last 1 MiB boundary before the backup array: 32 MiB - 1 MiB - 2 MiB.
        assert_eq!(grown.new_len(), 29 * MIB);
        let (_, entries) = entries(&mut d).unwrap();
        assert_eq!(entries[1].last_lba, grown.new_last_lba);
        // The backup header is at the new last sector; the old one is gone.
        let bytes = d.get_ref();
        let at = |lba: u64| &bytes[us(lba * 512)..us(lba * 512 + 8)];
        assert_eq!(at(32 * MIB / 512 - 1), b"EFI PART");
        assert_eq!(at(8 * MIB / 512 - 1), [0u8; 8]);
        // Idempotent: nothing more to grow.
        assert_eq!(grow_to_end(&mut d, Guid(DATA)).unwrap(), None);
        // The primary table still reads back whole (gptman checks both CRCs).
        gptman::GPT::find_from(&mut d).expect("a valid table");
    }

    #[test]
    fn a_partition_that_is_not_last_does_not_grow() {
        let mut d = disk(8);
        d.get_mut().resize(us(16 * MIB), 0);
        assert_eq!(grow_to_end(&mut d, Guid([9; 16])).unwrap(), None);
        assert_eq!(
            grow_to_end(&mut d, Guid([5; 16])).unwrap(),
            None,
            "no such type"
        );
    }
}
