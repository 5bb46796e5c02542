//! `ringstore.efi`: a unified kernel image (ADR 0024). Debian's systemd EFI stub
//! (`linuxx64.efi.stub`) with `.osrel`, `.cmdline`, `.initrd` and `.linux` sections appended
//! here, in Rust: new section headers in the stub's spare header room, data at file alignment,
//! virtual addresses page-aligned after the stub's own, the COFF symbol table dropped, the PE
//! timestamp from `SOURCE_DATE_EPOCH` and the checksum recomputed, so the same inputs give the
//! same bytes (objcopy stamps the current time).

use anyhow::{bail, ensure, Context, Result};

/// Where Debian's `systemd-boot-efi` installs the stub.
pub const STUB: &str = "/usr/lib/systemd/boot/efi/linuxx64.efi.stub";
/// Where it installs the boot manager.
pub const BOOT_MANAGER: &str = "/usr/lib/systemd/boot/efi/systemd-bootx64.efi";

/// Initialized, readable data: what every appended section is.
const DATA_SECTION: u32 = 0x4000_0040;
/// Appended sections start on a page (the stub's own alignment is 512 bytes).
const VA_ALIGN: u32 = 0x1000;
const SECTION_HEADER: usize = 40;

fn align(value: u64, to: u64) -> u64 {
    value.div_ceil(to) * to
}

fn u16_at(b: &[u8], at: usize) -> Result<u16> {
    let s = b.get(at..at + 2).context("PE header truncated")?;
    Ok(u16::from_le_bytes([s[0], s[1]]))
}

fn u32_at(b: &[u8], at: usize) -> Result<u32> {
    let s = b.get(at..at + 4).context("PE header truncated")?;
    Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
}

fn put_u16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_le_bytes());
}

fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

/// The stub with `sections` (name, bytes) appended in order; `timestamp` goes into the COFF
/// header.
pub fn build(stub: &[u8], sections: &[(&str, &[u8])], timestamp: u32) -> Result<Vec<u8>> {
    ensure!(stub.get(..2) == Some(b"MZ"), "stub: no MZ header");
    let pe = u32_at(stub, 0x3c)? as usize;
    ensure!(
        stub.get(pe..pe + 4) == Some(b"PE\0\0"),
        "stub: no PE signature"
    );
    let coff = pe + 4;
    let count = usize::from(u16_at(stub, coff + 2)?);
    let opt_size = usize::from(u16_at(stub, coff + 16)?);
    let opt = coff + 20;
    ensure!(u16_at(stub, opt)? == 0x20b, "stub: not a PE32+ image");
    let section_align = u32_at(stub, opt + 32)?;
    let file_align = u64::from(u32_at(stub, opt + 36)?);
    let headers_size = u32_at(stub, opt + 60)? as usize;
    ensure!(
        section_align.is_power_of_two() && VA_ALIGN.is_multiple_of(section_align) && file_align > 0,
        "stub: unexpected alignments {section_align:#x}/{file_align:#x}"
    );
    let table = opt + opt_size;
    let table_end = table + (count + sections.len()) * SECTION_HEADER;
    if table_end > headers_size {
        bail!(
            "stub: room for {} more section headers, {} needed",
            (headers_size.saturating_sub(table + count * SECTION_HEADER)) / SECTION_HEADER,
            sections.len()
        );
    }
    let mut next_va = 0u64;
    let mut raw_end = headers_size as u64;
    for i in 0..count {
        let h = table + i * SECTION_HEADER;
        let name = &stub[h..h + 8];
        for (new, _) in sections {
            ensure!(
                name.split(|b| *b == 0).next() != Some(new.as_bytes()),
                "stub already has a {new} section"
            );
        }
        next_va = next_va.max(u64::from(u32_at(stub, h + 12)?) + u64::from(u32_at(stub, h + 8)?));
        raw_end = raw_end.max(u64::from(u32_at(stub, h + 20)?) + u64::from(u32_at(stub, h + 16)?));
    }
    // Everything past the last section's data is the COFF symbol table: dropped.
    let mut out = stub
        .get(..usize::try_from(raw_end)?)
        .context("stub: section data past the end of the file")?
        .to_vec();
    put_u32(&mut out, coff + 8, 0);
    put_u32(&mut out, coff + 12, 0);
    let mut initialized = u64::from(u32_at(&out, opt + 8)?);
    for (i, (name, data)) in sections.iter().enumerate() {
        ensure!(name.len() <= 8, "section name {name} longer than 8 bytes");
        let va = align(next_va, u64::from(VA_ALIGN));
        let raw_at = align(out.len() as u64, file_align);
        let raw_size = align(data.len() as u64, file_align);
        out.resize(usize::try_from(raw_at)?, 0);
        out.extend_from_slice(data);
        out.resize(usize::try_from(raw_at + raw_size)?, 0);
        let h = table + (count + i) * SECTION_HEADER;
        let mut header = [0u8; SECTION_HEADER];
        header[..name.len()].copy_from_slice(name.as_bytes());
        put_u32(&mut header, 8, u32::try_from(data.len())?);
        put_u32(&mut header, 12, u32::try_from(va)?);
        put_u32(&mut header, 16, u32::try_from(raw_size)?);
        put_u32(&mut header, 20, u32::try_from(raw_at)?);
        put_u32(&mut header, 36, DATA_SECTION);
        out[h..h + SECTION_HEADER].copy_from_slice(&header);
        next_va = va + data.len() as u64;
        initialized += raw_size;
    }
    put_u16(&mut out, coff + 2, u16::try_from(count + sections.len())?);
    put_u32(&mut out, coff + 4, timestamp);
    put_u32(&mut out, opt + 8, u32::try_from(initialized)?);
    put_u32(
        &mut out,
        opt + 56,
        u32::try_from(align(next_va, u64::from(section_align)))?,
    );
    let sum = checksum(&out, opt + 64);
    put_u32(&mut out, opt + 64, sum);
    Ok(out)
}

/// The PE checksum: 16-bit one's-complement-style sum of the file with the checksum field taken
/// as zero, plus the file length.
#[expect(
    clippy::cast_possible_truncation,
    reason = "the sum is folded to 16 bits; the PE checksum adds the file length modulo 2^32"
)]
pub fn checksum(bytes: &[u8], field: usize) -> u32 {
    let mut sum: u64 = 0;
    for (i, pair) in bytes.chunks(2).enumerate() {
        if i * 2 == field || i * 2 == field + 2 {
            continue;
        }
        let word = u64::from(pair[0]) | (u64::from(*pair.get(1).unwrap_or(&0)) << 8);
        sum += word;
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum = (sum & 0xffff) + (sum >> 16);
    (sum as u32).wrapping_add(bytes.len() as u32)
}

/// A section: name, virtual address, virtual size, file offset, raw size.
pub type Section = (String, u32, u32, u32, u32);

/// The section table of a PE image.
pub fn sections(image: &[u8]) -> Result<Vec<Section>> {
    let pe = u32_at(image, 0x3c)? as usize;
    let coff = pe + 4;
    let count = usize::from(u16_at(image, coff + 2)?);
    let table = coff + 20 + usize::from(u16_at(image, coff + 16)?);
    (0..count)
        .map(|i| {
            let h = table + i * SECTION_HEADER;
            let name = image.get(h..h + 8).context("section table truncated")?;
            let name: String = name
                .iter()
                .take_while(|b| **b != 0)
                .map(|b| char::from(*b))
                .collect();
            Ok((
                name,
                u32_at(image, h + 12)?,
                u32_at(image, h + 8)?,
                u32_at(image, h + 20)?,
                u32_at(image, h + 16)?,
            ))
        })
        .collect()
}

#[cfg(test)]
pub mod tests {
    use super::*;

    /// A PE32+ header with one `.text` section, shaped like the systemd stub (512-byte
    /// alignments, 0x400 bytes of headers) and a trailing "symbol table".
    pub fn fake_stub() -> Vec<u8> {
        let mut b = vec![0u8; 0x600];
        b[..2].copy_from_slice(b"MZ");
        put_u32(&mut b, 0x3c, 0x80);
        b[0x80..0x84].copy_from_slice(b"PE\0\0");
        let coff = 0x84;
        put_u16(&mut b, coff, 0x8664);
        put_u16(&mut b, coff + 2, 1);
        put_u32(&mut b, coff + 4, 0x1234_5678);
        put_u32(&mut b, coff + 8, 0x600);
        put_u16(&mut b, coff + 16, 240);
        let opt = coff + 20;
        put_u16(&mut b, opt, 0x20b);
        put_u32(&mut b, opt + 32, 0x200);
        put_u32(&mut b, opt + 36, 0x200);
        put_u32(&mut b, opt + 56, 0x1200);
        put_u32(&mut b, opt + 60, 0x400);
        let h = opt + 240;
        b[h..h + 5].copy_from_slice(b".text");
        put_u32(&mut b, h + 8, 0x10);
        put_u32(&mut b, h + 12, 0x1000);
        put_u32(&mut b, h + 16, 0x200);
        put_u32(&mut b, h + 20, 0x400);
        b.extend_from_slice(b"symbols");
        b
    }

    #[test]
    fn sections_are_appended_aligned_and_the_header_follows() {
        let stub = fake_stub();
        let linux = vec![0xaau8; 5000];
        let out = build(
            &stub,
            &[
                (".osrel", b"ID=ringstore\n"),
                (".cmdline", b"console=ttyS0"),
                (".linux", &linux),
            ],
            42,
        )
        .unwrap();
        let s = sections(&out).unwrap();
        assert_eq!(s.len(), 4);
        assert_eq!(s[0].0, ".text");
        assert_eq!(s[1], (".osrel".into(), 0x2000, 13, 0x600, 0x200));
        assert_eq!(s[2], (".cmdline".into(), 0x3000, 13, 0x800, 0x200));
        assert_eq!(s[3].0, ".linux");
        assert_eq!(s[3].1, 0x4000);
        let (at, len) = (s[3].3 as usize, s[3].2 as usize);
        assert_eq!(&out[at..at + len], &linux[..]);
        assert_eq!(out.len() % 0x200, 0);
        assert!(
            !out.windows(7).any(|w| w == b"symbols"),
            "symbol table kept"
        );
        // TimeDateStamp, symbol table pointer, SizeOfImage, checksum.
        assert_eq!(u32_at(&out, 0x84 + 4).unwrap(), 42);
        assert_eq!(u32_at(&out, 0x84 + 8).unwrap(), 0);
        assert_eq!(
            u32_at(&out, 0x98 + 56).unwrap(),
            0x4000 + 5000u32.div_ceil(0x200) * 0x200
        );
        assert_eq!(u32_at(&out, 0x98 + 64).unwrap(), checksum(&out, 0x98 + 64));
        assert_eq!(
            out,
            build(
                &stub,
                &[
                    (".osrel", b"ID=ringstore\n"),
                    (".cmdline", b"console=ttyS0"),
                    (".linux", &linux)
                ],
                42
            )
            .unwrap()
        );
    }

    #[test]
    fn too_many_sections_or_a_duplicate_is_refused() {
        let stub = fake_stub();
        let many: Vec<(&str, &[u8])> = (0..20).map(|_| (".x", &b""[..])).collect();
        assert!(build(&stub, &many, 0)
            .unwrap_err()
            .to_string()
            .contains("more section headers"));
        assert!(build(&stub, &[(".text", b"")], 0)
            .unwrap_err()
            .to_string()
            .contains("already has"));
        assert!(build(b"not a PE", &[], 0).is_err());
    }

    #[test]
    fn the_checksum_matches_a_known_stub_when_installed() {
        // Debian's stub carries a correct checksum: ours must reproduce it.
        let Ok(stub) = std::fs::read(STUB) else {
            return;
        };
        let pe = u32_at(&stub, 0x3c).unwrap() as usize;
        let field = pe + 24 + 64;
        assert_eq!(checksum(&stub, field), u32_at(&stub, field).unwrap());
    }
}
