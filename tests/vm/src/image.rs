//! What the QEMU tests boot and how they ask for more: the test image xtask built, and the
//! [`Builder`] through which a test gets a variant (a signed boot disk, a PXE bundle, …)
//! built exactly as `cargo xtask image`/`pxe`/`scaleout`/`keygen` build it (ADR 0041).

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{Context, Result};

use crate::util::root;

/// The artifacts QEMU boots (`-kernel`, `-initrd`), built by `cargo xtask image`.
#[derive(Debug, Clone)]
pub struct Image {
    /// The static PID 1 binary.
    pub binary: PathBuf,
    pub bzimage: PathBuf,
    pub initramfs: PathBuf,
    /// The kernel source package and release it was built from.
    pub kernel_version: String,
    /// The console's authorized_keys in the initramfs (ADR-0023), for the boot forms too.
    pub authorized_keys: Option<Vec<u8>>,
}

/// A server's boot forms: ringstore.efi (a UKI), its signature, and disk.img (ADR 0024).
#[derive(Debug, Clone)]
pub struct BootImage {
    pub efi: PathBuf,
    /// `ringstore.efi.sig`, when a signing key was given.
    pub signature: Option<PathBuf>,
    pub disk: PathBuf,
}

/// The `cargo xtask image` flags a test sets for a boot image; the console keys are the
/// test image's own.
#[derive(Debug, Clone, Default)]
pub struct BootRequest {
    /// `--size` in MiB.
    pub size_mib: Option<u64>,
    /// `--signing-key`.
    pub signing_key: Option<PathBuf>,
    /// `--append`.
    pub append: String,
    /// `--out`.
    pub out: PathBuf,
    /// `--config-authorized-keys`.
    pub config_authorized_keys: Option<PathBuf>,
    /// `--console-password-hash`.
    pub console_password_hash: Option<PathBuf>,
    /// `--secure-boot-key` and `--secure-boot-cert` (with `--test-keys`: the snakeoil pair
    /// is allowed).
    pub secure_boot: Option<(PathBuf, PathBuf)>,
}

/// A host of a PXE bundle, with the configuration its box must report.
#[derive(Debug, Clone)]
pub struct PxeHost {
    pub hostname: String,
    pub mac: String,
    pub static_ip: Option<Ipv4Addr>,
    pub config: ringstore_config::Config,
}

/// What the tests need built beyond the test image; xtask implements it with the code
/// behind its commands, so a test boots what an operator would build.
pub trait Builder: Sync {
    /// ringstore.efi (signed when asked) and disk.img from `image`: `cargo xtask image`.
    fn build_boot(&self, image: &Image, request: &BootRequest) -> Result<BootImage>;
    /// `cargo xtask keygen ARGS`.
    fn keygen(&self, args: &[String]) -> Result<()>;
    /// The PXE bundle of `qemu/pxe/inventory.toml` booting `image`, written to `dir` as
    /// `cargo xtask pxe` writes it; its hosts.
    fn pxe_bundle(&self, image: &Image, dir: &Path) -> Result<Vec<PxeHost>>;
    /// The scale-out files of the inventory `text` in `dir`: `cargo xtask scaleout`.
    /// Returns the twemproxy pool file's path.
    fn scaleout(&self, text: &str, dir: &Path) -> Result<PathBuf>;
    /// The release `ringstore` binary for host-side servers.
    fn release_binary(&self) -> Result<PathBuf>;
    /// Builds the default image and PXE bundle and fails if either carries a test secret;
    /// says what it scanned.
    fn default_artifacts_carry_no_test_secret(&self) -> Result<String>;
}

static BUILDER: OnceLock<&'static dyn Builder> = OnceLock::new();

/// Sets the builder the tests of this process use (the first one set stays).
pub(crate) fn set_builder(builder: &'static dyn Builder) {
    let _ = BUILDER.set(builder);
}

/// The builder [`crate::run`] was given.
pub(crate) fn builder() -> Result<&'static dyn Builder> {
    BUILDER
        .get()
        .copied()
        .context("no image builder: the QEMU tests run through `cargo xtask vm-test`")
}

/// `cargo xtask image` with `request`, from `image`.
pub fn build_boot(image: &Image, request: &BootRequest) -> Result<BootImage> {
    builder()?.build_boot(image, request)
}

/// `target/appliance` in the workspace, where the tests keep their machines' files (vm/).
pub fn appliance_dir() -> PathBuf {
    root().join("target/appliance")
}

/// The test-only key pair the QEMU tests log in with (never authorize it on a real box).
pub fn test_key() -> PathBuf {
    root().join("tests/keys/test_ed25519")
}
