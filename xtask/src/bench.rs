//! `cargo xtask bench`: ringstore and memcached (and nginx for HTTP) side by side in one run.

use anyhow::Result;

pub fn run(_args: &[String]) -> Result<()> {
    anyhow::bail!("bench: not written yet")
}
