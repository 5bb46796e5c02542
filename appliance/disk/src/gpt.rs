//! Reading a disk's GUID partition table (with `gptman`): which partition numbers carry which
//! type GUID, so PID 1 can find the config and data partitions by type.

use std::io::{Read, Seek};

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
