//! `cargo xtask image`: the static ringstore binary (x86_64-unknown-linux-musl, release, not PIE),
//! checked to be a static ELF, the kernel (cached), and target/appliance/{bzImage,initramfs.img}.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::util::{cargo, exec, root};

pub const MUSL_TARGET: &str = "x86_64-unknown-linux-musl";
/// Fully static, position-dependent (no PT_DYNAMIC for self-relocation), no debug info in the image.
const MUSL_RUSTFLAGS: &str =
    "-C target-feature=+crt-static -C relocation-model=static -C strip=debuginfo";

/// The artifacts QEMU boots.
#[derive(Debug, Clone)]
pub struct Image {
    pub bzimage: PathBuf,
    pub initramfs: PathBuf,
    /// The kernel source package and release it was built from.
    pub kernel_version: String,
}

/// Where cargo puts build output (`CARGO_TARGET_DIR` or `<root>/target`).
pub fn cargo_target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target"))
}

/// `target/appliance` in the workspace.
pub fn appliance_dir() -> PathBuf {
    root().join("target/appliance")
}

/// Builds the static PID 1 binary and returns its path.
pub fn build_static_binary() -> Result<PathBuf> {
    crate::deps::musl_target()?;
    exec(
        cargo()
            .args([
                "build",
                "--release",
                "--target",
                MUSL_TARGET,
                "-p",
                "ringstore",
            ])
            .env(
                "CARGO_TARGET_X86_64_UNKNOWN_LINUX_MUSL_RUSTFLAGS",
                MUSL_RUSTFLAGS,
            ),
    )?;
    let binary = cargo_target_dir()
        .join(MUSL_TARGET)
        .join("release/ringstore");
    let bytes = std::fs::read(&binary).with_context(|| format!("reading {}", binary.display()))?;
    check_static_elf(&bytes)
        .with_context(|| format!("{} is not a static executable", binary.display()))?;
    Ok(binary)
}

/// Fails unless `bytes` is a 64-bit little-endian ELF executable without PT_INTERP or PT_DYNAMIC:
/// the kernel must run it as /init with nothing else in the image.
pub fn check_static_elf(bytes: &[u8]) -> Result<()> {
    if bytes.get(..4) != Some(b"\x7fELF") {
        bail!("no ELF magic");
    }
    if bytes.get(4) != Some(&2) || bytes.get(5) != Some(&1) {
        bail!("not a 64-bit little-endian ELF");
    }
    let u16_at = |off: usize| {
        bytes
            .get(off..off + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
    };
    let u32_at = |off: usize| {
        bytes
            .get(off..off + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let u64_at = |off: usize| {
        bytes
            .get(off..off + 8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
    };
    let e_type = u16_at(16).context("truncated header")?;
    if e_type != 2 {
        bail!("ELF type {e_type} is not ET_EXEC (2); a static-pie has a dynamic section");
    }
    let phoff = usize::try_from(u64_at(32).context("truncated header")?)?;
    let phentsize = usize::from(u16_at(54).context("truncated header")?);
    let phnum = usize::from(u16_at(56).context("truncated header")?);
    for i in 0..phnum {
        let at = phoff + i * phentsize;
        match u32_at(at).context("truncated program headers")? {
            3 => bail!("has PT_INTERP (dynamically linked)"),
            2 => bail!("has PT_DYNAMIC (a dynamic section)"),
            _ => {}
        }
    }
    Ok(())
}

/// The test-only key pair the QEMU tests log in with (never authorize it on a real box).
pub fn test_key() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/keys/test_ed25519")
}

/// `cargo xtask image [--authorized-keys FILE]`: without the flag the console cannot be logged
/// into (only `help` and `login` answer).
pub fn image_command(args: &[String]) -> Result<()> {
    let keys = match args {
        [] => {
            eprintln!("image: no --authorized-keys FILE: nobody can log in on the console");
            None
        }
        [flag, file] if flag == "--authorized-keys" => Some(PathBuf::from(file)),
        _ => anyhow::bail!("usage: cargo xtask image [--authorized-keys FILE]"),
    };
    build_image_with(keys.as_deref()).map(|_| ())
}

/// The image the QEMU tests and `cargo xtask run` boot: the test key authorized.
pub fn build_image() -> Result<Image> {
    build_image_with(Some(&test_key().with_extension("pub")))
}

/// Everything QEMU needs, in target/appliance, with `authorized_keys` (an OpenSSH
/// authorized_keys file, checked here) in the initramfs.
pub fn build_image_with(authorized_keys: Option<&Path>) -> Result<Image> {
    let keys = match authorized_keys {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            let parsed = ringstore_console::AuthorizedKeys::from_lines(text.lines())
                .with_context(|| format!("{}", path.display()))?;
            anyhow::ensure!(!parsed.is_empty(), "{} holds no keys", path.display());
            Some(text.into_bytes())
        }
        None => None,
    };
    let binary = build_static_binary()?;
    let kernel = crate::kernel::build_kernel()?;
    let dir = appliance_dir();
    std::fs::create_dir_all(&dir)?;
    let bzimage = dir.join("bzImage");
    std::fs::copy(&kernel.bzimage, &bzimage)
        .with_context(|| format!("copying {}", kernel.bzimage.display()))?;
    let initramfs = dir.join("initramfs.img");
    let size = crate::initramfs::build_initramfs(
        &binary,
        &initramfs,
        crate::initramfs::console_entries(keys),
    )?;
    eprintln!(
        "image: {} ({} KiB, {}), {} ({} KiB)",
        bzimage.display(),
        file_kib(&bzimage),
        kernel.version,
        initramfs.display(),
        size / 1024
    );
    Ok(Image {
        bzimage,
        initramfs,
        kernel_version: kernel.version,
    })
}

fn file_kib(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len() / 1024).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn elf(e_type: u16, phdr_types: &[u32]) -> Vec<u8> {
        let mut b = vec![0u8; 64 + 56 * phdr_types.len()];
        b[..4].copy_from_slice(b"\x7fELF");
        b[4] = 2;
        b[5] = 1;
        b[16..18].copy_from_slice(&e_type.to_le_bytes());
        b[32..40].copy_from_slice(&64u64.to_le_bytes());
        b[54..56].copy_from_slice(&56u16.to_le_bytes());
        b[56..58].copy_from_slice(&(phdr_types.len() as u16).to_le_bytes());
        for (i, t) in phdr_types.iter().enumerate() {
            b[64 + i * 56..68 + i * 56].copy_from_slice(&t.to_le_bytes());
        }
        b
    }

    #[test]
    fn static_executables_pass_and_dynamic_ones_fail() {
        assert!(check_static_elf(&elf(2, &[1, 1, 4])).is_ok());
        assert!(check_static_elf(&elf(2, &[1, 3, 1]))
            .unwrap_err()
            .to_string()
            .contains("PT_INTERP"));
        assert!(check_static_elf(&elf(2, &[1, 2]))
            .unwrap_err()
            .to_string()
            .contains("PT_DYNAMIC"));
        assert!(check_static_elf(&elf(3, &[1]))
            .unwrap_err()
            .to_string()
            .contains("ET_EXEC"));
        assert!(check_static_elf(b"#!/bin/sh\n").is_err());
        let truncated = &elf(2, &[1, 1])[..80];
        assert!(check_static_elf(truncated).is_err());
    }

    #[test]
    fn a_host_shell_is_rejected() {
        if let Ok(sh) = std::fs::read("/bin/sh") {
            assert!(
                check_static_elf(&sh).is_err(),
                "/bin/sh is dynamically linked on Debian"
            );
        }
    }
}
