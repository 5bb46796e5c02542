//! The image's layer and the OCI archive around it, written (and read back by the tests and
//! the podman check) with the `tar` crate: sorted ustar entries, fixed owners, one mtime, so
//! the bytes are the same for the same input.

use anyhow::{bail, Context, Result};
use std::io::Read;
use tar::{EntryType, Header};

/// What one tar entry is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
}

/// One entry. `path` has no leading `/` or `./`; a directory's ends in `/`.
pub struct Entry<'a> {
    pub path: &'a str,
    pub kind: Kind,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub data: &'a [u8],
}

impl<'a> Entry<'a> {
    /// A regular file owned by root.
    pub fn file(path: &'a str, mode: u32, data: &'a [u8]) -> Entry<'a> {
        Entry {
            path,
            kind: Kind::File,
            mode,
            uid: 0,
            gid: 0,
            data,
        }
    }

    /// A directory (`path` ends in `/`) owned by root.
    pub fn dir(path: &'a str, mode: u32) -> Entry<'a> {
        Entry {
            kind: Kind::Dir,
            ..Entry::file(path, mode, b"")
        }
    }

    /// The same entry owned by `id` (user and group).
    pub fn owned_by(self, id: u32) -> Entry<'a> {
        Entry {
            uid: id,
            gid: id,
            ..self
        }
    }
}

/// The ustar header of `e` with modification time `mtime`; no user or group names.
fn header(e: &Entry<'_>, mtime: u64) -> Result<Header> {
    // One name field (no ustar prefix, no GNU long names): every path here is short.
    if e.path.is_empty() || e.path.len() > 99 || e.path.starts_with('/') {
        bail!("tar path {:?}: empty, absolute or over 99 bytes", e.path);
    }
    if e.kind == Kind::Dir && (!e.data.is_empty() || !e.path.ends_with('/')) {
        bail!("directory {:?} must end in / and hold no data", e.path);
    }
    if mtime >= 1 << 33 {
        bail!("mtime {mtime} does not fit the 11-digit tar field");
    }
    let mut h = Header::new_ustar();
    h.as_ustar_mut()
        .context("a ustar header")?
        .name
        .get_mut(..e.path.len())
        .context("tar name field")?
        .copy_from_slice(e.path.as_bytes());
    h.set_entry_type(match e.kind {
        Kind::File => EntryType::Regular,
        Kind::Dir => EntryType::Directory,
    });
    h.set_mode(e.mode);
    h.set_uid(e.uid.into());
    h.set_gid(e.gid.into());
    h.set_size(e.data.len() as u64);
    h.set_mtime(mtime);
    // Device numbers as zero-filled octal (not blank), so every reader agrees.
    h.set_device_major(0)?;
    h.set_device_minor(0)?;
    h.set_cksum();
    Ok(h)
}

/// A tar stream of `entries` sorted by path, every one with modification time `mtime`, ended
/// by the two zero blocks. Duplicate paths are refused.
pub fn write(entries: &mut [Entry<'_>], mtime: u64) -> Result<Vec<u8>> {
    entries.sort_by(|a, b| a.path.cmp(b.path));
    if let Some(w) = entries.windows(2).find(|w| w[0].path == w[1].path) {
        bail!("tar path {:?} twice", w[0].path);
    }
    let mut out = tar::Builder::new(Vec::new());
    for e in entries.iter() {
        out.append(&header(e, mtime)?, e.data)?;
    }
    Ok(out.into_inner()?)
}

/// One entry read back: path, kind, mode, uid, gid, mtime and its bytes.
#[derive(Debug)]
#[cfg_attr(
    not(test),
    expect(
        dead_code,
        reason = "the build reads back paths and bytes only; the tests check the rest"
    )
)]
pub struct ReadEntry {
    pub path: String,
    pub kind: Kind,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub mtime: u64,
    pub data: Vec<u8>,
}

/// Reads a tar stream of regular files and directories (what [`write`] writes), checking
/// every header's checksum and that the stream ends with its zero blocks.
pub fn read(bytes: &[u8]) -> Result<Vec<ReadEntry>> {
    // The crate stops at the first zero block or at the end of the input alike.
    if bytes.len() < 1024 || bytes[bytes.len() - 1024..].iter().any(|&b| b != 0) {
        bail!("tar stream without its end blocks");
    }
    let mut archive = tar::Archive::new(bytes);
    let mut out = Vec::new();
    for entry in archive.entries()? {
        let mut entry = entry?;
        let h = entry.header().clone();
        let path = String::from_utf8(entry.path_bytes().into_owned())?;
        let kind = match h.entry_type() {
            EntryType::Regular => Kind::File,
            EntryType::Directory => Kind::Dir,
            other => bail!("tar entry {path:?}: type {other:?} not supported"),
        };
        let mut data = Vec::new();
        entry.read_to_end(&mut data)?;
        out.push(ReadEntry {
            path,
            kind,
            mode: h.mode()?,
            uid: u32::try_from(h.uid()?)?,
            gid: u32::try_from(h.gid()?)?,
            mtime: h.mtime()?,
            data,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file<'a>(path: &'a str, data: &'a [u8]) -> Entry<'a> {
        Entry::file(path, 0o644, data)
    }

    #[test]
    fn sorts_pads_and_reads_back() {
        let big = vec![7u8; 513];
        let mut entries = [
            file("b", b"hello"),
            Entry::dir("a/", 0o755).owned_by(65532),
            file("a/x", &big),
        ];
        let bytes = write(&mut entries, 1_700_000_000).unwrap();
        // a/ header; a/x header + 2 data blocks; b header + 1 block; 2 end blocks.
        assert_eq!(bytes.len(), 512 * 8);
        let back = read(&bytes).unwrap();
        let paths: Vec<&str> = back.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, ["a/", "a/x", "b"]);
        assert_eq!(
            (back[0].kind, back[0].uid, back[0].mode),
            (Kind::Dir, 65532, 0o755)
        );
        assert_eq!(back[1].data, big);
        assert_eq!(back[2].data, b"hello");
        assert!(back.iter().all(|e| e.mtime == 1_700_000_000));
    }

    #[test]
    fn refuses_what_it_cannot_write_and_a_corrupt_header() {
        assert!(write(&mut [file("x", b""), file("x", b"")], 0).is_err());
        assert!(write(&mut [file("/abs", b"")], 0).is_err());
        let long = "p".repeat(100);
        assert!(write(&mut [file(&long, b"")], 0).is_err());
        assert!(write(&mut [file("x", b"")], 1 << 40).is_err());
        let mut bytes = write(&mut [file("x", b"data")], 0).unwrap();
        bytes[0] = b'y';
        assert!(read(&bytes).is_err());
        assert!(read(&bytes[..512]).is_err());
    }
}
