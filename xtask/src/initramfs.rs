//! The appliance initramfs: a newc cpio archive (written with the `cpio` crate) holding `/init`
//! (the static ringstore binary), the mount points, `/dev/console`, the files of the top-level
//! `initramfs/` folder and the generated ones `cargo xtask image` adds. Entries are sorted,
//! owned by 0:0 with mtime 0 and sequential inode numbers, so the same inputs give the same bytes.

use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result};

/// What one archive entry is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    Dir,
    File(Vec<u8>),
    CharDevice { major: u32, minor: u32 },
}

/// One archive entry: a path without the leading `/`, a permission mode and a kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub path: String,
    pub mode: u32,
    pub kind: Kind,
}

impl Entry {
    pub fn dir(path: &str, mode: u32) -> Entry {
        Entry {
            path: path.into(),
            mode,
            kind: Kind::Dir,
        }
    }
    pub fn file(path: &str, mode: u32, data: Vec<u8>) -> Entry {
        Entry {
            path: path.into(),
            mode,
            kind: Kind::File(data),
        }
    }
    pub fn char_device(path: &str, mode: u32, major: u32, minor: u32) -> Entry {
        Entry {
            path: path.into(),
            mode,
            kind: Kind::CharDevice { major, minor },
        }
    }
}

const S_IFDIR: u32 = 0o040000;
const S_IFREG: u32 = 0o100000;
const S_IFCHR: u32 = 0o020000;

/// The entries of the appliance's initramfs around `init` (the ringstore binary's bytes).
pub fn appliance_entries(init: Vec<u8>) -> Vec<Entry> {
    vec![
        Entry::file("init", 0o755, init),
        Entry::dir("dev", 0o755),
        Entry::char_device("dev/console", 0o600, 5, 1),
        Entry::dir("proc", 0o555),
        Entry::dir("sys", 0o555),
        Entry::dir("tmp", 0o1777),
        Entry::dir("run", 0o755),
    ]
}

/// The files of `dir` (the repository's `initramfs/`, README.md left out) as entries, with
/// `@VERSION@` replaced by the workspace version, plus every parent folder.
pub fn tree_entries(dir: &Path) -> Result<Vec<Entry>> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(at) = stack.pop() {
        for entry in std::fs::read_dir(&at).with_context(|| format!("reading {}", at.display()))? {
            let path = entry?.path();
            let rel = path
                .strip_prefix(dir)?
                .to_str()
                .context("non-UTF-8 name under initramfs/")?
                .to_string();
            if path.is_dir() {
                out.push(Entry::dir(&rel, 0o755));
                stack.push(path);
            } else if rel != "README.md" {
                let text =
                    std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
                let text = match String::from_utf8(text) {
                    Ok(s) => s
                        .replace("@VERSION@", env!("CARGO_PKG_VERSION"))
                        .into_bytes(),
                    Err(e) => e.into_bytes(),
                };
                out.push(Entry::file(&rel, 0o644, text));
            }
        }
    }
    Ok(out)
}

/// `entries` plus a 0755 folder for every parent path none of them names.
pub fn with_parents(mut entries: Vec<Entry>) -> Vec<Entry> {
    let mut dirs: Vec<String> = Vec::new();
    for e in &entries {
        let mut path = e.path.as_str();
        while let Some((parent, _)) = path.rsplit_once('/') {
            if !entries.iter().any(|x| x.path == parent) && !dirs.iter().any(|d| d == parent) {
                dirs.push(parent.to_string());
            }
            path = parent;
        }
    }
    entries.extend(dirs.iter().map(|d| Entry::dir(d, 0o755)));
    entries
}

/// Writes `entries` as a newc archive: sorted by path (parents before children), 0:0, mtime 0.
pub fn write_newc<W: Write>(entries: &[Entry], out: W) -> Result<W> {
    let mut sorted: Vec<&Entry> = entries.iter().collect();
    sorted.sort_by(|a, b| a.path.as_bytes().cmp(b.path.as_bytes()));
    let mut out = out;
    for (index, entry) in sorted.iter().enumerate() {
        let ino = u32::try_from(index + 1).context("too many entries")?;
        let (type_bits, data, rdev, nlink) = match &entry.kind {
            Kind::Dir => (S_IFDIR, &[][..], (0, 0), 2),
            Kind::File(data) => (S_IFREG, data.as_slice(), (0, 0), 1),
            Kind::CharDevice { major, minor } => (S_IFCHR, &[][..], (*major, *minor), 1),
        };
        let size =
            u32::try_from(data.len()).with_context(|| format!("{} is over 4 GiB", entry.path))?;
        let mut writer = cpio::newc::Builder::new(&entry.path)
            .ino(ino)
            .mode(type_bits | (entry.mode & 0o7777))
            .uid(0)
            .gid(0)
            .nlink(nlink)
            .mtime(0)
            .rdev_major(rdev.0)
            .rdev_minor(rdev.1)
            .write(out, size);
        writer.write_all(data)?;
        out = writer.finish()?;
    }
    Ok(cpio::newc::trailer(out)?)
}

/// Where PID 1's console reads the image's authorized keys (ADR-0023).
pub const AUTHORIZED_KEYS: &str = "etc/ringstore/authorized_keys";

/// Where PID 1's console reads the image's argon2id password hash (`--console-password-hash`).
pub const CONSOLE_PASSWORD: &str = "etc/ringstore/console-password";

/// The console's credentials in the image: `etc/ringstore/authorized_keys` (OpenSSH lines).
pub fn console_entries(authorized_keys: Option<Vec<u8>>) -> Vec<Entry> {
    match authorized_keys {
        Some(keys) => vec![
            Entry::dir("etc/ringstore", 0o755),
            Entry::file(AUTHORIZED_KEYS, 0o644, keys),
        ],
        None => Vec::new(),
    }
}

/// Writes the appliance initramfs for the binary at `init` to `output`: the core entries, the
/// repository's `initramfs/` folder and `extra` (generated files).
pub fn build_initramfs(init: &Path, output: &Path, extra: Vec<Entry>) -> Result<u64> {
    let binary = std::fs::read(init).with_context(|| format!("reading {}", init.display()))?;
    let mut entries = appliance_entries(binary);
    entries.extend(tree_entries(&crate::util::root().join("initramfs"))?);
    entries.extend(extra);
    let bytes = write_newc(&with_parents(entries), Vec::new())?;
    let tmp = output.with_extension("img.tmp");
    std::fs::write(&tmp, &bytes).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, output)
        .with_context(|| format!("renaming {} to {}", tmp.display(), output.display()))?;
    Ok(bytes.len() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// name, mode, uid, mtime, rdev major, rdev minor, data
    type ReadBack = (String, u32, u32, u32, u32, u32, Vec<u8>);

    fn read_back(bytes: &[u8]) -> Vec<ReadBack> {
        let mut out = Vec::new();
        let mut cursor = std::io::Cursor::new(bytes);
        loop {
            let mut reader = cpio::NewcReader::new(cursor).unwrap();
            let e = reader.entry().clone();
            if e.is_trailer() {
                break;
            }
            let mut data = Vec::new();
            std::io::Read::read_to_end(&mut reader, &mut data).unwrap();
            out.push((
                e.name().to_string(),
                e.mode(),
                e.uid(),
                e.mtime(),
                e.rdev_major(),
                e.rdev_minor(),
                data,
            ));
            cursor = reader.finish().unwrap();
        }
        out
    }

    #[test]
    fn authorized_keys_land_in_etc_ringstore() {
        let mut entries = appliance_entries(b"b".to_vec());
        entries.extend(console_entries(Some(b"ssh-ed25519 AAAA k\n".to_vec())));
        let back = read_back(&write_newc(&entries, Vec::new()).unwrap());
        let keys = back.iter().find(|e| e.0 == AUTHORIZED_KEYS).unwrap();
        assert_eq!(
            (keys.1, keys.6.as_slice()),
            (0o100644, &b"ssh-ed25519 AAAA k\n"[..])
        );
        assert!(back
            .iter()
            .any(|e| e.0 == "etc/ringstore" && e.1 & 0o170000 == 0o040000));
        assert!(console_entries(None).is_empty());
    }

    #[test]
    fn same_inputs_give_the_same_bytes_whatever_the_order() {
        let a = write_newc(&appliance_entries(b"\x7fELF fake".to_vec()), Vec::new()).unwrap();
        let mut shuffled = appliance_entries(b"\x7fELF fake".to_vec());
        shuffled.reverse();
        let b = write_newc(&shuffled, Vec::new()).unwrap();
        assert_eq!(a, b);
        let c = write_newc(&appliance_entries(b"\x7fELF other".to_vec()), Vec::new()).unwrap();
        assert_ne!(a, c);
    }

    #[test]
    fn archive_holds_init_console_and_mount_points_owned_by_root_at_time_zero() {
        let bytes = write_newc(&appliance_entries(b"binary".to_vec()), Vec::new()).unwrap();
        let entries = read_back(&bytes);
        let names: Vec<&str> = entries.iter().map(|e| e.0.as_str()).collect();
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(names, sorted, "sorted, parents first");
        for want in ["init", "dev", "dev/console", "proc", "sys", "tmp", "run"] {
            assert!(names.contains(&want), "{want} missing from {names:?}");
        }
        for (name, mode, uid, mtime, _, _, _) in &entries {
            assert_eq!((*uid, *mtime), (0, 0), "{name}");
            assert_ne!(*mode & 0o170000, 0, "{name} has a file type");
        }
        let init = entries.iter().find(|e| e.0 == "init").unwrap();
        assert_eq!(init.1, 0o100755);
        assert_eq!(init.6, b"binary");
        let console = entries.iter().find(|e| e.0 == "dev/console").unwrap();
        assert_eq!(
            (console.1 & 0o170000, console.4, console.5),
            (0o020000, 5, 1)
        );
        assert_eq!(bytes.len() % 4, 0);
    }

    #[test]
    fn the_repository_tree_brings_etc_with_the_version_and_parents_are_added() {
        let tree = tree_entries(&crate::util::root().join("initramfs")).unwrap();
        let names: Vec<&str> = tree.iter().map(|e| e.path.as_str()).collect();
        assert!(
            names.contains(&"etc") && names.contains(&"etc/hostname"),
            "{names:?}"
        );
        assert!(!names.contains(&"README.md"));
        let osrel = tree.iter().find(|e| e.path == "etc/os-release").unwrap();
        let Kind::File(text) = &osrel.kind else {
            panic!("not a file")
        };
        let text = String::from_utf8_lossy(text);
        assert!(
            text.contains(&format!("VERSION_ID={}", env!("CARGO_PKG_VERSION"))),
            "{text}"
        );
        let all = with_parents(vec![Entry::file(
            "etc/ringstore/update-key.pub",
            0o644,
            vec![],
        )]);
        let names: Vec<&str> = all.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(
            names,
            ["etc/ringstore/update-key.pub", "etc/ringstore", "etc"]
        );
    }
}
