//! The ESP and systemd-boot's EFI variables as the update code uses them: the FAT file system
//! on the ESP partition, small text files on it, `LoaderEntrySelected` and `LoaderEntryOneShot`.

use std::io::{Read, Seek, Write};
use std::path::Path;

use ringstore_bootdisk::fat;

use crate::bootdisk::Found;

const LOADER_GUID: &str = "4a67b082-0a4c-41cf-b6c7-440b29bb8c4f";
pub(super) const EFIVARS: &str = crate::secure_boot::EFIVARS;
/// Where the old system leaves the canary token for the trial boot.
pub(super) const CANARY_TOKEN_FILE: &str = "loader/ringstore-canary.txt";

/// The path of systemd-boot's EFI variable `name`.
pub(super) fn loader_var(name: &str) -> std::path::PathBuf {
    Path::new(EFIVARS).join(format!("{name}-{LOADER_GUID}"))
}

/// The ESP's FAT file system, opened for writing.
pub(crate) fn esp_fs(
    found: &Found,
) -> Result<fatfs::FileSystem<ringstore_bootdisk::Slice<std::fs::File>>, String> {
    let volume = found.open(true).map_err(|e| format!("ESP: {e}"))?;
    fat::open(volume, &fat::DOS_EPOCH).map_err(|e| format!("ESP: {e}"))
}

/// A text file of at most 64 KiB on the ESP (`None`: missing, unreadable or not UTF-8).
pub(super) fn read_text<T: Read + Write + Seek>(
    fs: &fatfs::FileSystem<T>,
    path: &str,
) -> Option<String> {
    fat::read_file(fs, path, 64 << 10)
        .ok()
        .flatten()
        .and_then(|b| String::from_utf8(b).ok())
}

pub(super) fn write_text<T: Read + Write + Seek>(
    fs: &fatfs::FileSystem<T>,
    path: &str,
    text: &str,
) -> Result<(), String> {
    fat::write_file(fs, path, text.as_bytes()).map_err(|e| format!("ESP: {e}"))
}

/// An EFI variable's value without its 4 attribute bytes, as UTF-16 text.
pub(super) fn read_efi_string(name: &str) -> Option<String> {
    let bytes = std::fs::read(loader_var(name)).ok()?;
    let units: Vec<u16> = bytes
        .get(4..)?
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .take_while(|u| *u != 0)
        .collect();
    String::from_utf16(&units).ok()
}

/// Sets systemd-boot's one-shot entry (non-volatile, boot and runtime access).
pub(super) fn write_one_shot(entry: &str) -> Result<(), String> {
    let bytes = one_shot_bytes(entry);
    let path = loader_var("LoaderEntryOneShot");
    std::fs::write(&path, &bytes).map_err(|e| format!("{}: {e}", path.display()))
}

/// An efivarfs write: the attributes (NV | BS | RT), then the UTF-16LE text with its NUL.
fn one_shot_bytes(entry: &str) -> Vec<u8> {
    let mut bytes = 7u32.to_le_bytes().to_vec();
    for unit in entry.encode_utf16().chain([0]) {
        bytes.extend_from_slice(&unit.to_le_bytes());
    }
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_shot_bytes_are_attributes_then_utf16() {
        let bytes = one_shot_bytes("ringstore-b.efi");
        assert_eq!(&bytes[..4], &[7, 0, 0, 0]);
        assert_eq!(bytes.len(), 4 + 2 * 16);
        assert_eq!(&bytes[4..6], &[b'r', 0]);
        assert_eq!(&bytes[bytes.len() - 2..], &[0, 0]);
    }
}
