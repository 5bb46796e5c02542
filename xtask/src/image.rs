//! `cargo xtask image`: the static ringstore binary (x86_64-unknown-linux-musl, release, not PIE),
//! checked to be a static ELF, the kernel (cached), target/appliance/{bzImage,initramfs.img}
//! (what QEMU's `-kernel` boots), and the boot forms a server boots: `ringstore.efi` (a UKI,
//! `uki.rs`) and `disk.img` (GPT + ESP with the A/B slots + config + data, `disk.rs`), ADR 0024.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::util::{cargo, exec, root};

pub const MUSL_TARGET: &str = "x86_64-unknown-linux-musl";
/// Fully static, position-dependent (no PT_DYNAMIC for self-relocation), no debug info in the image.
const MUSL_RUSTFLAGS: &str =
    "-C target-feature=+crt-static -C relocation-model=static -C strip=debuginfo";

/// The artifacts QEMU boots and the boot forms, where they go (`target/appliance`), the test
/// key: the QEMU tests' (tests/vm), which boot them and log in with it.
pub use ringstore_vm::image::{appliance_dir, test_key};
pub use ringstore_vm::{BootImage, Image};

/// Where cargo puts build output (`CARGO_TARGET_DIR` or `<root>/target`).
pub fn cargo_target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target"))
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
            .and_then(|b| b.try_into().ok())
            .map(u64::from_le_bytes)
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

/// The public half of [`test_key`], authorized only in images built with `--test-keys`.
pub fn test_authorized_keys() -> PathBuf {
    test_key().with_extension("pub")
}

/// The update signing key of the tests (a secret anyone can read: `--test-keys` only).
pub fn test_signing_key() -> PathBuf {
    root().join("image/test-signing-key.hex")
}

/// TEST KEYS: the image the QEMU tests boot, in target/appliance, with the repository's
/// public test key authorized (what `--test-keys` asks for). Never for a real box.
pub fn build_test_image() -> Result<Image> {
    build_image_in(&appliance_dir(), Some(&test_authorized_keys()))
}

/// An authorized_keys file, checked (every line a key, at least one, within the console's
/// limits) as the box will read it.
pub fn read_authorized_keys(path: &Path) -> Result<Vec<u8>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    anyhow::ensure!(
        text.len() as u64 <= ringstore_init::bootdisk::AUTHORIZED_KEYS_FILE_MAX,
        "{}: over {} bytes",
        path.display(),
        ringstore_init::bootdisk::AUTHORIZED_KEYS_FILE_MAX
    );
    let parsed = ringstore_console::AuthorizedKeys::from_lines(text.lines())
        .with_context(|| format!("{}", path.display()))?;
    anyhow::ensure!(!parsed.is_empty(), "{} holds no keys", path.display());
    Ok(text.into_bytes())
}

/// Everything QEMU needs, in `dir` (`bzImage`, `initramfs.img`), with `authorized_keys` (an
/// OpenSSH authorized_keys file, checked here) in the initramfs.
pub fn build_image_in(dir: &Path, authorized_keys: Option<&Path>) -> Result<Image> {
    let keys = authorized_keys.map(read_authorized_keys).transpose()?;
    let binary = build_static_binary()?;
    let kernel = crate::kernel::build_kernel()?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let bzimage = dir.join("bzImage");
    std::fs::copy(&kernel.bzimage, &bzimage).with_context(|| {
        format!(
            "copying {} to {}",
            kernel.bzimage.display(),
            bzimage.display()
        )
    })?;
    let initramfs = dir.join("initramfs.img");
    let size = crate::initramfs::build_initramfs(
        &binary,
        &initramfs,
        crate::initramfs::console_entries(keys.clone()),
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
        binary,
        bzimage,
        initramfs,
        kernel_version: kernel.version,
        authorized_keys: keys,
    })
}

/// What `cargo xtask image` (and, for the secrets, `cargo xtask pxe`) was asked for beyond
/// the defaults.
#[derive(Debug, Clone)]
pub struct BootOptions {
    /// disk.img's size; the layout's `disk_size_mib` by default.
    pub size_mib: Option<u64>,
    /// A file with the 64 hex digits of an ed25519 secret key: ringstore.efi is signed with it
    /// and carries its public half (ADR 0025). Without one, the image refuses every update.
    pub signing_key: Option<PathBuf>,
    /// Every GUID and FAT volume id derives from it.
    pub seed: String,
    /// Appended to the image's kernel command line.
    pub append: String,
    /// Where every artifact goes (target/appliance by default).
    pub out: PathBuf,
    /// The console's SSH keys (OpenSSH authorized_keys); without, nobody can log in (ADR-0023).
    pub authorized_keys: Option<PathBuf>,
    /// More console keys, written to the config partition's `/authorized_keys` (a box's
    /// own keys, changeable without a new ringstore.efi).
    pub config_authorized_keys: Option<PathBuf>,
    /// A file with the console password's argon2id PHC string, put in ringstore.efi's
    /// initramfs as /etc/ringstore/console-password (never the password, never the command line).
    pub console_password_hash: Option<PathBuf>,
    /// `--test-keys`: the repository's test key and test signing key, where no other is given.
    pub test_keys: bool,
    /// `--secure-boot-key`/`--secure-boot-cert`: systemd-boot and ringstore.efi signed for
    /// Secure Boot (ADR 0051); with `--test-keys` and neither, Debian's snakeoil test pair.
    pub secure_boot_key: Option<PathBuf>,
    pub secure_boot_cert: Option<PathBuf>,
    /// The pair that signs, once the flags are checked ([`BootOptions::parse`]).
    pub secure_boot: Option<crate::image_secure_boot::SigningPair>,
}

/// The command line every ringstore.efi starts with; `--append` adds to it.
pub const BASE_CMDLINE: &str = "console=ttyS0,115200 panic=-1 ringstore.data=auto";

impl BootOptions {
    pub fn new() -> BootOptions {
        BootOptions {
            size_mib: None,
            signing_key: None,
            seed: "ringstore".into(),
            append: String::new(),
            out: appliance_dir(),
            authorized_keys: None,
            config_authorized_keys: None,
            console_password_hash: None,
            test_keys: false,
            secure_boot_key: None,
            secure_boot_cert: None,
            secure_boot: None,
        }
    }

    /// TEST KEYS: authorize the repository's test key and sign with its test signing key,
    /// unless a key of one's own was given for either.
    pub fn use_test_keys(&mut self) {
        self.test_keys = true;
        self.authorized_keys
            .get_or_insert_with(test_authorized_keys);
        self.signing_key.get_or_insert_with(test_signing_key);
    }

    /// Takes one of the secret flags `image` and `pxe` share; false for any other flag.
    pub fn take_secret(&mut self, flag: &str, value: Option<String>) -> bool {
        let path = value.map(PathBuf::from);
        match flag {
            "--authorized-keys" => self.authorized_keys = path,
            "--console-password-hash" => self.console_password_hash = path,
            "--signing-key" => self.signing_key = path,
            "--test-keys" => self.test_keys = true,
            _ => return false,
        }
        true
    }

    pub fn parse(args: &[String]) -> Result<BootOptions> {
        let mut o = BootOptions::new();
        for (flag, value) in crate::cli::parse("image", args)?.flags {
            if o.take_secret(flag, value.clone()) {
                continue;
            }
            let value = value.unwrap_or_default();
            match flag {
                "--size" => o.size_mib = Some(parse_mib(&value)?),
                "--seed" => o.seed = value,
                "--append" => o.append = value,
                "--out" => o.out = PathBuf::from(value),
                "--secure-boot-key" => o.secure_boot_key = Some(PathBuf::from(value)),
                "--secure-boot-cert" => o.secure_boot_cert = Some(PathBuf::from(value)),
                "--config-authorized-keys" => {
                    o.config_authorized_keys = Some(PathBuf::from(value));
                }
                other => return Err(crate::cli::unhandled("image", other)),
            }
        }
        if o.test_keys {
            o.use_test_keys();
        }
        o.check_secure_boot()?;
        Ok(o)
    }

    /// Resolves the Secure Boot pair from the flags: both or neither, the snakeoil test pair
    /// only with `--test-keys` (and by default there).
    pub fn check_secure_boot(&mut self) -> Result<()> {
        use crate::image_secure_boot::SigningPair;
        self.secure_boot = SigningPair::from_flags(
            self.secure_boot_key.as_deref(),
            self.secure_boot_cert.as_deref(),
            self.test_keys,
        )?;
        if self.test_keys && self.secure_boot.is_none() {
            self.secure_boot = Some(SigningPair::snakeoil());
        }
        Ok(())
    }

    pub fn cmdline(&self) -> String {
        format!("{BASE_CMDLINE} {}", self.append).trim().to_string()
    }

    /// Whether nobody could log in on the console of what these options build.
    pub fn locked(&self) -> bool {
        self.authorized_keys.is_none()
            && self.config_authorized_keys.is_none()
            && self.console_password_hash.is_none()
    }
}

/// The loud end of a build whose console nobody can log in on.
pub fn warn_locked(what: &str) {
    let bar = "!".repeat(78);
    eprintln!("\n{bar}");
    eprintln!("!! {what}: NO CONSOLE KEY AND NO PASSWORD: THE BOX WILL BE LOCKED.");
    eprintln!("!! Nobody can log in on its console (status, update, poweroff, ...).");
    eprintln!("!! Give --authorized-keys FILE (your OpenSSH public keys) or");
    eprintln!("!! --console-password-hash FILE; for a QEMU test box only, --test-keys.");
    eprintln!("{bar}\n");
}

/// `256M`, `2G`, `512` (MiB) → MiB.
fn parse_mib(text: &str) -> Result<u64> {
    let t = text.trim();
    let (num, mult) = match t.char_indices().last() {
        Some((i, 'M' | 'm')) => (&t[..i], 1),
        Some((i, 'G' | 'g')) => (&t[..i], 1024),
        _ => (t, 1),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .filter(|n| *n > 0 && *n <= 16 << 20)
        .with_context(|| format!("size {text:?}: expected MiB like 256M or 2G"))
}

/// `SOURCE_DATE_EPOCH`, or 0.
pub fn source_date_epoch() -> Result<u64> {
    match std::env::var("SOURCE_DATE_EPOCH") {
        Ok(v) => v
            .trim()
            .parse()
            .with_context(|| format!("SOURCE_DATE_EPOCH={v:?} is not a number of seconds")),
        Err(_) => Ok(0),
    }
}

/// The signing key file (ADR 0025): the 32-byte ed25519 secret key (the seed) as 64 hex
/// digits; lines starting with `#` are comments. `cargo xtask keygen` writes one.
pub fn read_signing_key(path: &Path) -> Result<ed25519_dalek::SigningKey> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let hex: String = text
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect::<String>()
        .trim()
        .to_string();
    let mut seed = [0u8; 32];
    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        bail!(
            "{}: expected 64 hex digits (an ed25519 secret key)",
            path.display()
        );
    }
    for (i, b) in seed.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16)?;
    }
    Ok(ed25519_dalek::SigningKey::from_bytes(&seed))
}

/// `std::fs::read` that names the file when it fails.
pub fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("reading {}", path.display()))
}

/// `std::fs::write` that names the file when it fails.
pub fn write(path: &Path, bytes: impl AsRef<[u8]>) -> Result<()> {
    std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))
}

/// The generated initramfs files every boot form adds beyond /init and `initramfs/`: the
/// console's keys and password hash, the update key's public half and, for a UKI, the
/// image's command line.
pub fn initramfs_extras(
    keys: Option<Vec<u8>>,
    opts: &BootOptions,
    signing_key: Option<&ed25519_dalek::SigningKey>,
    cmdline: Option<&str>,
) -> Result<Vec<crate::initramfs::Entry>> {
    use crate::initramfs::Entry;
    let mut extra = crate::initramfs::console_entries(keys);
    if let Some(path) = &opts.console_password_hash {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        ringstore_console::PasswordHash::parse(&text).map_err(|e| {
            anyhow::anyhow!(
                "{}: {e} (make one with e.g. `argon2 SALT -id -e`)",
                path.display()
            )
        })?;
        extra.push(Entry::file(
            crate::initramfs::CONSOLE_PASSWORD,
            0o600,
            format!("{}\n", text.trim()).into_bytes(),
        ));
    }
    if let Some(cmdline) = cmdline {
        extra.push(Entry::file(
            "etc/ringstore/image-cmdline",
            0o644,
            format!("{cmdline}\n").into_bytes(),
        ));
    }
    if let Some(key) = signing_key {
        extra.push(Entry::file(
            "etc/ringstore/update-key.pub",
            0o644,
            format!(
                "{}\n",
                ringstore_bootdisk::signature::to_hex(key.verifying_key().as_bytes())
            )
            .into_bytes(),
        ));
    }
    Ok(extra)
}

/// ringstore.efi's bytes: systemd's stub with os-release, the command line, `initrd` and the
/// kernel.
fn build_uki(image: &Image, cmdline: &str, initrd: &[u8], epoch: u64) -> Result<Vec<u8>> {
    let osrel = crate::initramfs::tree_entries(&root().join("initramfs"))?
        .into_iter()
        .find_map(|e| match (e.path.as_str(), e.kind) {
            ("etc/os-release", crate::initramfs::Kind::File(b)) => Some(b),
            _ => None,
        })
        .context("initramfs/etc/os-release missing")?;
    let stub = std::fs::read(crate::uki::STUB).with_context(|| {
        format!(
            "reading {} (apt-get install systemd-boot-efi)",
            crate::uki::STUB
        )
    })?;
    let linux = read(&image.bzimage)?;
    crate::uki::build(
        &stub,
        &[
            (".osrel", &osrel),
            (".cmdline", cmdline.as_bytes()),
            (".initrd", initrd),
            (".linux", &linux),
        ],
        u32::try_from(epoch).unwrap_or(u32::MAX),
    )
}

/// disk.img: the ESP with systemd-boot and `efi` in slot A, the config partition with the
/// image's ringstore.toml (and `--config-authorized-keys`), the data partition. Returns its
/// size in bytes.
fn build_disk(disk: &Path, opts: &BootOptions, efi: Vec<u8>, epoch: u64) -> Result<u64> {
    use ringstore_bootdisk::slots::{self, Slot};
    use ringstore_bootdisk::Role;
    let mut boot_manager = std::fs::read(crate::uki::BOOT_MANAGER)
        .with_context(|| format!("reading {}", crate::uki::BOOT_MANAGER))?;
    if let Some(pair) = &opts.secure_boot {
        boot_manager =
            crate::image_secure_boot::sign(&boot_manager, pair, "systemd-bootx64.efi", &opts.out)?;
    }
    let mut esp: crate::disk::Files = slots::BOOT_MANAGER_PATHS
        .iter()
        .map(|p| (p.to_string(), boot_manager.clone()))
        .collect();
    esp.push((
        slots::LOADER_CONF.into(),
        slots::loader_conf(Slot::A).into_bytes(),
    ));
    esp.push((Slot::A.path(), efi));
    let mut config = vec![(
        ringstore_init::bootdisk::CONFIG_FILE.to_string(),
        read(&root().join("image/ringstore.toml"))?,
    )];
    if let Some(path) = &opts.config_authorized_keys {
        config.push((
            ringstore_init::bootdisk::AUTHORIZED_KEYS_FILE.to_string(),
            read_authorized_keys(path)?,
        ));
    }
    let layout = ringstore_bootdisk::Layout::builtin();
    let size = opts.size_mib.unwrap_or(layout.disk_size_mib) << 20;
    let time: &'static ringstore_bootdisk::fat::FixedTime = Box::leak(Box::new(
        ringstore_bootdisk::fat::FixedTime::from_unix(epoch),
    ));
    crate::disk::write(
        disk,
        &layout,
        size,
        &opts.seed,
        time,
        &[(Role::Esp, esp), (Role::Config, config)],
    )
    .with_context(|| format!("writing {}", disk.display()))?;
    Ok(size)
}

/// ringstore.efi (and its signature) and disk.img from a built [`Image`].
pub fn build_boot(image: &Image, opts: &BootOptions) -> Result<BootImage> {
    use ed25519_dalek::Signer;
    let epoch = source_date_epoch()?;
    let cmdline = opts.cmdline();
    let key = opts
        .signing_key
        .as_deref()
        .map(read_signing_key)
        .transpose()?;
    let extra = initramfs_extras(
        image.authorized_keys.clone(),
        opts,
        key.as_ref(),
        Some(&cmdline),
    )?;
    std::fs::create_dir_all(&opts.out)
        .with_context(|| format!("creating {}", opts.out.display()))?;
    let initrd = opts.out.join("initramfs-uki.img");
    crate::initramfs::build_initramfs(&image.binary, &initrd, extra)?;
    let mut efi_bytes = build_uki(image, &cmdline, &read(&initrd)?, epoch)?;
    if let Some(pair) = &opts.secure_boot {
        // Authenticode first: the ed25519 signature below covers the signed bytes, which are
        // what the slot holds and the firmware checks.
        efi_bytes = crate::image_secure_boot::sign(&efi_bytes, pair, "ringstore.efi", &opts.out)?;
    }
    let efi = opts.out.join("ringstore.efi");
    write(&efi, &efi_bytes)?;
    let signature = match &key {
        Some(key) => {
            let sig = opts.out.join("ringstore.efi.sig");
            let hex = ringstore_bootdisk::signature::to_hex(&key.sign(&efi_bytes).to_bytes());
            write(&sig, format!("{hex}\n"))?;
            Some(sig)
        }
        None => None,
    };
    let disk = opts.out.join("disk.img");
    let size = build_disk(&disk, opts, efi_bytes, epoch)?;
    eprintln!(
        "image: {} ({} KiB, command line {cmdline:?}{}{}), {} ({} MiB, sparse)",
        efi.display(),
        file_kib(&efi),
        if key.is_some() {
            ", signed"
        } else {
            ", unsigned: refuses updates"
        },
        match &opts.secure_boot {
            Some(pair) => format!(", Secure Boot signed with {}", pair.cert.display()),
            None => ", not Secure Boot signed".into(),
        },
        disk.display(),
        size >> 20
    );
    Ok(BootImage {
        efi,
        signature,
        disk,
    })
}

/// `cargo xtask image [--authorized-keys FILE] [--config-authorized-keys FILE]
/// [--console-password-hash FILE] [--signing-key FILE] [--test-keys] [--secure-boot-key FILE
/// --secure-boot-cert FILE] [--size SIZE] [--seed TEXT] [--append ARGS] [--out DIR]`:
/// everything under `--out` only.
pub fn run(args: &[String]) -> Result<()> {
    let opts = BootOptions::parse(args)?;
    let image = build_image_in(&opts.out, opts.authorized_keys.as_deref())?;
    build_boot(&image, &opts)?;
    if opts.test_keys {
        eprintln!("image: TEST KEYS (--test-keys): anyone with this repository can log in and sign updates");
        if opts.secure_boot == Some(crate::image_secure_boot::SigningPair::snakeoil()) {
            eprintln!("image: TEST KEYS: Secure Boot signed with Debian's snakeoil key (trusted only by OVMF_VARS_4M.snakeoil.fd)");
        }
    }
    if opts.locked() {
        warn_locked("image");
    }
    Ok(())
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
        b[56..58].copy_from_slice(&u16::try_from(phdr_types.len()).unwrap().to_le_bytes());
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
    fn image_options_parse_and_bad_ones_are_named() {
        let parse = |args: &[&str]| {
            BootOptions::parse(&args.iter().map(|s| s.to_string()).collect::<Vec<_>>())
        };
        let o = parse(&[
            "--size",
            "1G",
            "--seed",
            "s",
            "--append",
            "ringstore.memory=64M",
        ])
        .unwrap();
        assert_eq!((o.size_mib, o.seed.as_str()), (Some(1024), "s"));
        assert!(o
            .cmdline()
            .ends_with("ringstore.data=auto ringstore.memory=64M"));
        for bad in [
            &["--size", "0"][..],
            &["--size", "big"],
            &["--size"],
            &["--nope"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
        assert_eq!(parse_mib("256").unwrap(), 256);
        let o = parse(&[
            "--config-authorized-keys",
            "k.pub",
            "--console-password-hash",
            "p.phc",
        ])
        .unwrap();
        assert_eq!(
            (o.config_authorized_keys, o.console_password_hash),
            (Some("k.pub".into()), Some("p.phc".into()))
        );
    }

    #[test]
    fn authorized_keys_files_are_checked_before_they_go_in() {
        let keys = root().join("tests/keys");
        assert!(read_authorized_keys(&keys.join("partition_ed25519.pub")).is_ok());
        let path = std::env::temp_dir().join(format!("ringstore-keys-{}", std::process::id()));
        let bad = [
            "# only a comment\n".to_string(),
            "ssh-ed25519 garbage\n".to_string(),
            "#".repeat(
                usize::try_from(ringstore_init::bootdisk::AUTHORIZED_KEYS_FILE_MAX).unwrap() + 1,
            ),
        ];
        for text in bad {
            std::fs::write(&path, &text).unwrap();
            assert!(read_authorized_keys(&path).is_err(), "{:.40}", text);
        }
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn the_test_key_reads_and_garbage_does_not() {
        let key = read_signing_key(&root().join("image/test-signing-key.hex")).unwrap();
        assert_eq!(key.verifying_key().as_bytes().len(), 32);
        let path = std::env::temp_dir().join(format!("ringstore-badkey-{}", std::process::id()));
        std::fs::write(&path, "# comment\nzz\n").unwrap();
        assert!(read_signing_key(&path).is_err());
        std::fs::remove_file(&path).unwrap();
    }

    /// The template with every commented `# key = value` line uncommented.
    fn uncommented_template() -> (String, usize) {
        let text = std::fs::read_to_string(root().join("image/ringstore.toml")).unwrap();
        let mut keys = 0;
        let out: Vec<String> = text
            .lines()
            .map(|line| match line.strip_prefix("# ") {
                Some(rest)
                    if rest.split_once(" = ").is_some_and(|(k, _)| {
                        !k.is_empty()
                            && k.bytes()
                                .all(|b| b.is_ascii_lowercase() || b"_-".contains(&b))
                    }) =>
                {
                    keys += 1;
                    rest.to_string()
                }
                _ => line.to_string(),
            })
            .collect();
        (out.join("\n"), keys)
    }

    /// What PID 1 does with the config partition's file: its layers, the server's keys
    /// resolved by ringstore_config, PID 1's own (`ip`) by its command-line parser.
    fn parse_as_the_box_does(text: &str) -> anyhow::Result<()> {
        let layers = ringstore_init::layers::Layers::build("", "", Some(text))?;
        ringstore_config::origin::resolve(&layers.config_layers())?;
        ringstore_init::cmdline::split(&layers.effective(""))?;
        Ok(())
    }

    #[test]
    fn every_key_the_config_template_suggests_parses() {
        let (text, keys) = uncommented_template();
        assert!(keys >= 3, "the template suggests {keys} keys:\n{text}");
        parse_as_the_box_does(&text).unwrap_or_else(|e| panic!("{e:#}\n{text}"));
        let bad = format!("{text}\nlisten = \"0.0.0.0\"\n");
        assert!(parse_as_the_box_does(&bad).is_err(), "the check can fail");
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
