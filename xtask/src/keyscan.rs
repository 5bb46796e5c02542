//! The test-key scan: unpacks build artifacts (newc cpio initramfs, PE sections of
//! ringstore.efi, disk.img's GPT partitions and their FAT files, folders of them) and finds
//! every trace of the repository's test secrets (`tests/keys/*`, `image/test-signing-key.hex`):
//! what `cargo xtask image` and `cargo xtask pxe` write by default must hold none.

use std::io::{Read, Seek};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::util::root;

/// How deep archives inside archives are opened (disk.img → ESP → ringstore.efi → .initrd).
const MAX_DEPTH: usize = 6;
/// The largest file read whole from a FAT partition.
const FAT_FILE_MAX: u64 = 256 << 20;

/// One test secret in the forms an artifact could carry it: a label and the bytes.
pub type Needle = (String, Vec<u8>);

/// Every test secret of the repository: each public key's base64 blob and `SHA256:`
/// fingerprint (the private keys hold the same blob), the console password hash, and the test
/// update key's secret and public halves in hex.
pub fn test_secrets() -> Result<Vec<Needle>> {
    let keys = root().join("tests/keys");
    let mut needles = Vec::new();
    let mut names: Vec<PathBuf> = std::fs::read_dir(&keys)
        .with_context(|| format!("reading {}", keys.display()))?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<_>>()?;
    names.sort();
    for path in names
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "pub"))
    {
        let text = String::from_utf8(crate::image::read(path)?)?;
        let name = path.strip_prefix(root()).unwrap_or(path).display();
        let blob = text
            .split_whitespace()
            .nth(1)
            .with_context(|| format!("{name}: no key blob"))?;
        needles.push((format!("{name} key blob"), blob.as_bytes().to_vec()));
        let parsed = ringstore_console::AuthorizedKeys::from_lines(text.lines())
            .with_context(|| format!("{name}"))?;
        for info in parsed.list() {
            needles.push((
                format!("{name} fingerprint {}", info.fingerprint),
                info.fingerprint.into_bytes(),
            ));
        }
    }
    let password = keys.join("console-password.argon2id");
    let phc = String::from_utf8(crate::image::read(&password)?)?;
    needles.push((
        "tests/keys/console-password.argon2id hash".to_string(),
        phc.trim().as_bytes().to_vec(),
    ));
    let signing = crate::image::test_signing_key();
    let key = crate::image::read_signing_key(&signing)?;
    let hex = ringstore_bootdisk::signature::to_hex;
    needles.push((
        "image/test-signing-key.hex secret".to_string(),
        hex(key.as_bytes()).into_bytes(),
    ));
    needles.push((
        "image/test-signing-key.hex public half".to_string(),
        hex(key.verifying_key().as_bytes()).into_bytes(),
    ));
    // A Secure Boot signature embeds its signer's certificate: the snakeoil one marks an
    // image signed with a test key (ADR 0051).
    needles.push((
        "Debian's snakeoil Secure Boot certificate".to_string(),
        crate::image_secure_boot::pem_cert_der(Path::new(crate::image_secure_boot::SNAKEOIL_CERT))
            .context("apt-get install ovmf")?,
    ));
    Ok(needles)
}

/// Every place under `path` (a file or a folder, unpacked as far as [`MAX_DEPTH`]) where a
/// needle occurs: `where: label` lines.
pub fn scan_path(path: &Path, needles: &[Needle]) -> Result<Vec<String>> {
    let mut found = Vec::new();
    if path.is_dir() {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(path)
            .with_context(|| format!("reading {}", path.display()))?
            .map(|e| e.map(|e| e.path()))
            .collect::<std::io::Result<_>>()?;
        entries.sort();
        for entry in entries {
            found.extend(scan_path(&entry, needles)?);
        }
    } else if is_gpt_disk(path)? {
        scan_disk(path, needles, &mut found)?;
    } else {
        let bytes = crate::image::read(path)?;
        scan_bytes(&path.display().to_string(), &bytes, needles, 0, &mut found)?;
    }
    Ok(found)
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}

/// Looks for the needles in `bytes` and, when they are a cpio archive or a PE image, in each
/// of their files or sections.
fn scan_bytes(
    at: &str,
    bytes: &[u8],
    needles: &[Needle],
    depth: usize,
    found: &mut Vec<String>,
) -> Result<()> {
    for (label, needle) in needles {
        if contains(bytes, needle) {
            found.push(format!("{at}: {label}"));
        }
    }
    if depth >= MAX_DEPTH {
        return Ok(());
    }
    if bytes.starts_with(b"070701") {
        for (name, data) in cpio_files(bytes).with_context(|| format!("{at}: newc cpio"))? {
            scan_bytes(&format!("{at}!{name}"), &data, needles, depth + 1, found)?;
        }
    } else if bytes.starts_with(b"MZ") {
        if let Ok(sections) = crate::uki::sections(bytes) {
            for (name, _, _, offset, size) in sections {
                let range = usize::try_from(offset)?..usize::try_from(offset + size)?;
                if let Some(data) = bytes.get(range) {
                    scan_bytes(&format!("{at}!{name}"), data, needles, depth + 1, found)?;
                }
            }
        }
    }
    Ok(())
}

/// The regular files of a newc cpio archive (uncompressed, as initramfs.rs writes it).
fn cpio_files(bytes: &[u8]) -> Result<Vec<(String, Vec<u8>)>> {
    let mut files = Vec::new();
    let mut cursor = std::io::Cursor::new(bytes);
    loop {
        let mut reader = cpio::NewcReader::new(cursor)?;
        let entry = reader.entry().clone();
        if entry.is_trailer() {
            break;
        }
        let mut data = Vec::new();
        reader.read_to_end(&mut data)?;
        files.push((entry.name().to_string(), data));
        cursor = reader.finish()?;
    }
    Ok(files)
}

fn is_gpt_disk(path: &Path) -> Result<bool> {
    let mut head = [0u8; 520];
    let mut file =
        std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let got = file.read(&mut head)?;
    Ok(got == head.len() && &head[512..520] == b"EFI PART")
}

/// Each partition of a GPT disk: its raw bytes are searched; a FAT partition's files are
/// unpacked and scanned too.
fn scan_disk(path: &Path, needles: &[Needle], found: &mut Vec<String>) -> Result<()> {
    let mut disk = std::fs::File::options()
        .read(true)
        .write(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    let (sector, entries) = ringstore_bootdisk::gpt::entries(&mut disk)
        .with_context(|| format!("{}: GPT", path.display()))?;
    for entry in entries {
        let at = format!("{}!{}", path.display(), entry.name);
        let start = entry.first_lba * sector;
        let len = (entry.last_lba + 1 - entry.first_lba) * sector;
        // The data partition is mostly unwritten (sparse): only its first MiB is read.
        let mut raw = Vec::new();
        disk.seek(std::io::SeekFrom::Start(start))?;
        (&mut disk).take(len.min(64 << 20)).read_to_end(&mut raw)?;
        for (label, needle) in needles {
            if contains(&raw, needle) {
                found.push(format!("{at} (raw): {label}"));
            }
        }
        let slice = ringstore_bootdisk::Slice::new(&mut disk, start, len);
        let Ok(fs) = ringstore_bootdisk::fat::open(slice, &ringstore_bootdisk::fat::DOS_EPOCH)
        else {
            continue;
        };
        for (name, data) in fat_files(&fs.root_dir(), "")? {
            scan_bytes(&format!("{at}!{name}"), &data, needles, 1, found)?;
        }
    }
    Ok(())
}

/// Every file under `dir`, with its path.
fn fat_files<IO: fatfs::ReadWriteSeek>(
    dir: &fatfs::Dir<'_, IO>,
    prefix: &str,
) -> Result<Vec<(String, Vec<u8>)>> {
    let mut files = Vec::new();
    for entry in dir.iter() {
        let entry = entry?;
        let name = entry.file_name();
        if name == "." || name == ".." {
            continue;
        }
        let path = format!("{prefix}/{name}");
        if entry.is_dir() {
            files.extend(fat_files(&entry.to_dir(), &path)?);
        } else {
            let mut data = Vec::new();
            entry.to_file().take(FAT_FILE_MAX).read_to_end(&mut data)?;
            files.push((path, data));
        }
    }
    Ok(files)
}

/// Builds what `cargo xtask image` and `cargo xtask pxe --inventory qemu/pxe/minimal.toml`
/// write by default (no flags) into `target/appliance/keyscan/`, and fails if any test secret
/// is in any of it; then builds the same with `--test-keys` and fails unless the scan finds
/// the test key there (the scan can fail). Neither build may touch a file directly in
/// target/appliance (`--out` means only there).
pub fn default_artifacts_carry_no_test_secret() -> Result<String> {
    let needles = test_secrets()?;
    let base = crate::image::appliance_dir().join("keyscan");
    let _ = std::fs::remove_dir_all(&base);
    let mut report = Vec::new();
    let before = top_level_files(&crate::image::appliance_dir())?;
    for test_keys in [false, true] {
        let dir = base.join(if test_keys { "test-keys" } else { "default" });
        let mut args = vec!["--out".to_string(), dir.join("image").display().to_string()];
        let mut pxe_args = vec![
            "--inventory".to_string(),
            root()
                .join(crate::pxe::MINIMAL_INVENTORY)
                .display()
                .to_string(),
            "--out".to_string(),
            dir.join("pxe").display().to_string(),
        ];
        if test_keys {
            args.push("--test-keys".into());
            pxe_args.push("--test-keys".into());
        }
        crate::image::run(&args)?;
        crate::pxe::run(&pxe_args)?;
        let after = top_level_files(&crate::image::appliance_dir())?;
        anyhow::ensure!(
            after == before,
            "cargo xtask image/pxe --out changed files outside --out in target/appliance:\nbefore {before:?}\nafter {after:?}"
        );
        let found = scan_path(&dir, &needles)?;
        let files = count_files(&dir)?;
        if test_keys {
            let test_key_blob = &needles
                .iter()
                .find(|(label, _)| label.contains("test_ed25519.pub key blob"))
                .context("no test_ed25519.pub needle")?
                .0;
            anyhow::ensure!(
                found.iter().any(|f| f.contains("image/ringstore.efi")
                    && f.ends_with("snakeoil Secure Boot certificate")),
                "ringstore.efi built with --test-keys is not Secure Boot signed with the snakeoil key:\n{}",
                found.join("\n")
            );
            for artifact in [
                "image/initramfs.img",
                "image/ringstore.efi",
                "image/disk.img",
                "pxe/initramfs.img",
            ] {
                let want = format!("{}!", dir.join(artifact).display());
                anyhow::ensure!(
                    found
                        .iter()
                        .any(|f| f.starts_with(&want) && f.ends_with(test_key_blob)),
                    "the scan did not find the test key inside {artifact} built with --test-keys:\n{}",
                    found.join("\n")
                );
            }
            report.push(format!(
                "--test-keys: {} finds in {files} files",
                found.len()
            ));
        } else {
            anyhow::ensure!(
                found.is_empty(),
                "default artifacts carry test secrets:\n{}",
                found.join("\n")
            );
            report.push(format!("default: {files} files clean"));
        }
    }
    Ok(report.join("; "))
}

/// The plain files directly in `dir`, with their size and modification time.
fn top_level_files(dir: &Path) -> Result<Vec<(String, u64, std::time::SystemTime)>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let entry = entry?;
        let meta = entry.metadata()?;
        if meta.is_file() {
            let name = entry.file_name().to_string_lossy().into_owned();
            files.push((name, meta.len(), meta.modified()?));
        }
    }
    files.sort();
    Ok(files)
}

fn count_files(dir: &Path) -> Result<usize> {
    let mut n = 0;
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        n += if path.is_dir() {
            count_files(&path)?
        } else {
            1
        };
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::initramfs::{write_newc, Entry};

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("keyscan-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn archive(key: Option<&str>) -> Vec<u8> {
        let mut entries = vec![Entry::file("init", 0o755, b"\x7fELF".to_vec())];
        if let Some(key) = key {
            entries.push(Entry::file(
                "etc/ringstore/authorized_keys",
                0o644,
                key.into(),
            ));
        }
        write_newc(&entries, Vec::new()).unwrap()
    }

    #[test]
    fn the_test_key_is_found_inside_a_cpio_inside_a_uki_inside_a_disk() {
        let needles = test_secrets().unwrap();
        assert!(needles.len() >= 8, "{needles:?}");
        let key = std::fs::read_to_string(crate::image::test_authorized_keys()).unwrap();
        let dir = scratch("disk");
        for (name, key) in [("clean", None), ("keyed", Some(key.as_str()))] {
            let stub = crate::uki::tests::fake_stub();
            let initrd = archive(key);
            let efi = crate::uki::build(&stub, &[(".initrd", &initrd)], 0).unwrap();
            let disk = dir.join(format!("{name}.img"));
            let layout = ringstore_bootdisk::Layout::builtin();
            crate::disk::write(
                &disk,
                &layout,
                layout.disk_size_mib << 20,
                "s",
                &ringstore_bootdisk::fat::DOS_EPOCH,
                &[(
                    ringstore_bootdisk::Role::Esp,
                    vec![("EFI/x.efi".into(), efi)],
                )],
            )
            .unwrap();
            let found = scan_path(&disk, &needles).unwrap();
            if key.is_none() {
                assert!(found.is_empty(), "{found:?}");
            } else {
                assert!(
                    found.iter().any(|f| f
                        .contains("!/EFI/x.efi!.initrd!etc/ringstore/authorized_keys: ")
                        && f.contains("test_ed25519.pub key blob")),
                    "{found:?}"
                );
                assert!(needles
                    .iter()
                    .any(|(l, n)| l.contains("test_ed25519.pub fingerprint")
                        && n.starts_with(b"SHA256:")));
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_test_update_key_is_found_in_a_folder() {
        let needles = test_secrets().unwrap();
        let dir = scratch("folder");
        std::fs::write(dir.join("clean"), b"nothing here").unwrap();
        assert!(scan_path(&dir, &needles).unwrap().is_empty());
        let key = crate::image::read_signing_key(&crate::image::test_signing_key()).unwrap();
        let public = ringstore_bootdisk::signature::to_hex(key.verifying_key().as_bytes());
        std::fs::write(dir.join("sub.img"), archive(Some(&public))).unwrap();
        let found = scan_path(&dir, &needles).unwrap();
        assert!(
            found
                .iter()
                .any(|f| f.contains("sub.img!etc/ringstore/authorized_keys")
                    && f.ends_with("public half")),
            "{found:?}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
