//! `cargo xtask vm-test [NAME…]`: builds the test image and runs the QEMU tests (the
//! `ringstore-vm` crate, tests/vm) on it, building the variants they ask for with the code
//! behind `cargo xtask image`/`pxe`/`scaleout`/`keygen` (ADR 0041).

use std::path::{Path, PathBuf};

use anyhow::Result;
use ringstore_vm::{BootImage, BootRequest, Builder, Image, PxeHost};

use crate::image::BootOptions;

/// `cargo xtask vm-test`: with `--help`, the tests' names; else every test whose name
/// contains one of the names given (all when none).
pub fn run(args: &[String]) -> Result<()> {
    let parsed = crate::cli::parse("vm-test", args)?;
    if parsed.flags.iter().any(|(flag, _)| *flag == "--help") {
        for name in ringstore_vm::names() {
            println!("{name}");
        }
        return Ok(());
    }
    // TEST KEYS: every QEMU test logs in with tests/keys/test_ed25519.
    let image = crate::image::build_test_image()?;
    ringstore_vm::run(&XTASK, &image, &parsed.positional)
}

/// The QEMU tests' [`Builder`]: xtask's own commands.
struct Xtask;

static XTASK: Xtask = Xtask;

impl Builder for Xtask {
    fn build_boot(&self, image: &Image, request: &BootRequest) -> Result<BootImage> {
        let mut opts = BootOptions::new();
        opts.size_mib = request.size_mib;
        opts.signing_key.clone_from(&request.signing_key);
        opts.append.clone_from(&request.append);
        opts.out.clone_from(&request.out);
        opts.config_authorized_keys
            .clone_from(&request.config_authorized_keys);
        opts.console_password_hash
            .clone_from(&request.console_password_hash);
        // The tests' keys are test keys: the snakeoil pair may sign.
        opts.test_keys = request.secure_boot.is_some();
        if let Some((key, cert)) = &request.secure_boot {
            opts.secure_boot_key = Some(key.clone());
            opts.secure_boot_cert = Some(cert.clone());
        }
        opts.check_secure_boot()?;
        crate::image::build_boot(image, &opts)
    }

    fn keygen(&self, args: &[String]) -> Result<()> {
        crate::keygen::run(args)
    }

    fn pxe_bundle(&self, image: &Image, dir: &Path) -> Result<Vec<PxeHost>> {
        let path = crate::util::root().join(crate::pxe::MINIMAL_INVENTORY);
        let inv = crate::inventory::Inventory::load(&path)?;
        crate::pxe::write_bundle(&inv, &image.bzimage, &image.initramfs, dir)?;
        let hosts = inv.hosts.into_iter().map(|host| PxeHost {
            hostname: host.hostname,
            mac: host.mac.to_string(),
            static_ip: host.static_ip,
            config: host.config,
        });
        Ok(hosts.collect())
    }

    fn scaleout(&self, text: &str, dir: &Path) -> Result<PathBuf> {
        let inv = crate::inventory::Inventory::parse(text)?;
        crate::scaleout::write(&inv, dir)?;
        Ok(dir.join(crate::scaleout::NUTCRACKER_YML))
    }

    fn release_binary(&self) -> Result<PathBuf> {
        crate::test::release_binary()
    }

    fn default_artifacts_carry_no_test_secret(&self) -> Result<String> {
        crate::keyscan::default_artifacts_carry_no_test_secret()
    }
}
