//! The kernel-panic QEMU test: a guest without an init panics, QEMU ends, and the wait fails
//! quickly instead of hanging.

use std::time::{Duration, Instant};

use anyhow::{bail, Result};

use super::vm::Vm;
use super::BOOT_LIMIT;
use crate::image::Image;

/// A kernel panic (no init) ends QEMU and the wait fails quickly instead of hanging.
pub fn kernel_panic_fails_the_wait(image: &Image) -> Result<()> {
    let mut vm = Vm::boot(
        image,
        "panic",
        "single",
        "rdinit=/nonexistent init=/nonexistent",
    )?;
    let started = Instant::now();
    match vm.wait_for("ringstore: ready", 0, BOOT_LIMIT) {
        Ok(_) => bail!("booted without an init?"),
        Err(err) if err.to_string().contains("QEMU exited") => {
            anyhow::ensure!(
                vm.kernel_log().contains("Kernel panic"),
                "QEMU exited without a kernel panic"
            );
            anyhow::ensure!(
                started.elapsed() < Duration::from_secs(120),
                "took {:?}",
                started.elapsed()
            );
            Ok(())
        }
        Err(err) => Err(err),
    }
}
