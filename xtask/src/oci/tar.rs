//! A minimal, deterministic ustar writer (and the reader its tests and the podman check use):
//! the image's layer and the OCI archive around it, byte for byte the same for the same input.

use anyhow::{bail, Context, Result};

const BLOCK: usize = 512;

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

/// `value` in octal, zero-padded to fill `field` but its last byte (a NUL).
fn octal(field: &mut [u8], value: u64) -> Result<()> {
    let digits = field.len() - 1;
    let text = format!("{value:0digits$o}");
    if text.len() > digits {
        bail!("{value} does not fit a {digits}-digit tar field");
    }
    field[..digits].copy_from_slice(text.as_bytes());
    field[digits] = 0;
    Ok(())
}

/// The 512-byte ustar header of `e` with modification time `mtime`.
fn header(e: &Entry<'_>, mtime: u64) -> Result<[u8; BLOCK]> {
    let mut h = [0u8; BLOCK];
    let name = e.path.as_bytes();
    if name.is_empty() || name.len() > 99 || e.path.starts_with('/') {
        bail!("tar path {:?}: empty, absolute or over 99 bytes", e.path);
    }
    h[..name.len()].copy_from_slice(name);
    octal(&mut h[100..108], u64::from(e.mode))?;
    octal(&mut h[108..116], u64::from(e.uid))?;
    octal(&mut h[116..124], u64::from(e.gid))?;
    octal(&mut h[124..136], e.data.len() as u64)?;
    octal(&mut h[136..148], mtime)?;
    h[156] = match e.kind {
        Kind::File => b'0',
        Kind::Dir => b'5',
    };
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    // Device numbers stay zero-filled octal so every reader agrees.
    octal(&mut h[329..337], 0)?;
    octal(&mut h[337..345], 0)?;
    // The checksum is summed with its own field as spaces.
    h[148..156].fill(b' ');
    let sum: u64 = h.iter().map(|&b| u64::from(b)).sum();
    octal(&mut h[148..155], sum)?;
    h[155] = b' ';
    Ok(h)
}

/// A tar stream of `entries` sorted by path, every one with modification time `mtime`, ended
/// by the two zero blocks. Duplicate paths are refused.
pub fn write(entries: &mut [Entry<'_>], mtime: u64) -> Result<Vec<u8>> {
    entries.sort_by(|a, b| a.path.cmp(b.path));
    if let Some(w) = entries.windows(2).find(|w| w[0].path == w[1].path) {
        bail!("tar path {:?} twice", w[0].path);
    }
    let mut out = Vec::new();
    for e in entries.iter() {
        if e.kind == Kind::Dir && (!e.data.is_empty() || !e.path.ends_with('/')) {
            bail!("directory {:?} must end in / and hold no data", e.path);
        }
        out.extend_from_slice(&header(e, mtime)?);
        out.extend_from_slice(e.data);
        out.resize(out.len().next_multiple_of(BLOCK), 0);
    }
    out.resize(out.len() + 2 * BLOCK, 0);
    Ok(out)
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

fn read_octal(field: &[u8]) -> Result<u64> {
    let text: String = field
        .iter()
        .take_while(|&&b| b != 0 && b != b' ')
        .map(|&b| char::from(b))
        .collect();
    u64::from_str_radix(&text, 8).with_context(|| format!("tar octal field {text:?}"))
}

/// Reads a ustar stream written by [`write`] (regular files and directories only), checking
/// every header's checksum.
pub fn read(bytes: &[u8]) -> Result<Vec<ReadEntry>> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + BLOCK <= bytes.len() {
        let h = &bytes[at..at + BLOCK];
        if h.iter().all(|&b| b == 0) {
            return Ok(out);
        }
        let mut blank = [0u8; BLOCK];
        blank.copy_from_slice(h);
        blank[148..156].fill(b' ');
        let sum: u64 = blank.iter().map(|&b| u64::from(b)).sum();
        if read_octal(&h[148..156])? != sum {
            bail!("tar header checksum mismatch at byte {at}");
        }
        let name_len = h[..100].iter().position(|&b| b == 0).unwrap_or(100);
        let path = String::from_utf8(h[..name_len].to_vec())?;
        let size = usize::try_from(read_octal(&h[124..136])?)?;
        let kind = match h[156] {
            b'0' | 0 => Kind::File,
            b'5' => Kind::Dir,
            other => bail!(
                "tar entry {path:?}: type {:?} not supported",
                char::from(other)
            ),
        };
        let start = at + BLOCK;
        let data = bytes
            .get(start..start + size)
            .with_context(|| format!("tar entry {path:?} truncated"))?
            .to_vec();
        out.push(ReadEntry {
            path,
            kind,
            mode: u32::try_from(read_octal(&h[100..108])?)?,
            uid: u32::try_from(read_octal(&h[108..116])?)?,
            gid: u32::try_from(read_octal(&h[116..124])?)?,
            mtime: read_octal(&h[136..148])?,
            data,
        });
        at = start + size.next_multiple_of(BLOCK);
    }
    bail!("tar stream without its end blocks")
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
