//! The RAM tier kept across a kexec jump (ADR 0054): with a `memmap=SIZE!OFFSET` reservation on
//! the command line, the legacy pmem namespace it makes becomes a device-DAX device (once: its
//! info block lives in the reserved memory and the next kernel finds it) and the server's
//! `--memory-file`. The store seals the arena at the stop and resumes it at the next start.

use std::time::Duration;

use ringstore_config::Config;
use ringstore_sys::{DaxDevice, SYSFS};

use crate::machine::Machine;
use crate::{info, warn};

/// How long boot waits for the kernel's probing of the reserved memory.
const PROBE_WAIT: Duration = Duration::from_secs(3);
/// Bytes at the device's start that hold the store's seal (its footer, ADR 0052): zeroed to
/// spend a seal no start may trust.
const SEAL_LEN: usize = 4096;

/// `config` with the device-DAX device as its memory file, when this boot has a reservation
/// that holds the arena; records in `machine` what the RAM tier is kept in, or why not.
pub fn attach(machine: &Machine, config: &Config) -> Option<Config> {
    let running = std::fs::read_to_string("/proc/cmdline").unwrap_or_default();
    let found = match (&config.memory_file, crate::kexec::memmap_token(&running)) {
        (Some(file), _) => Err(format!("in {} (memory_file set)", file.display())),
        (None, None) => Err(
            "not kept across a reboot: no memmap= reservation on this boot (a kexec reboot adds one)"
                .to_string(),
        ),
        (None, Some(token)) => device(token, config.memory).and_then(|dev| {
            if running.split_whitespace().any(|t| t == crate::kexec::FRESH_TOKEN) {
                spend_seal(&dev, "the reservation was placed afresh at the last jump")?;
            }
            Ok(dev)
        }),
    };
    let (line, attached) = match found {
        Ok(dev) => (
            format!(
                "kept across kexec reboots in {} ({} MiB, {})",
                dev.node.display(),
                dev.size >> 20,
                crate::kexec::memmap_token(&running).unwrap_or("")
            ),
            Some(Config {
                memory_file: Some(dev.node),
                ..config.clone()
            }),
        ),
        Err(why) => (why, None),
    };
    info!("ram tier: {line}");
    machine.state().ram_tier = Some(line);
    attached
}

/// The device-DAX device of the reservation `token`, configured now if the reserved memory
/// holds none yet; refused when it cannot hold `memory`.
fn device(token: &str, memory: u64) -> Result<DaxDevice, String> {
    let root = std::path::Path::new(SYSFS);
    let (dax, namespaces) = ringstore_sys::wait_for_pmem(root, PROBE_WAIT);
    let dax = match (dax, namespaces.first()) {
        (Some(dax), _) => dax,
        (None, None) => return Err(format!("not kept: {token} made no pmem namespace")),
        (None, Some(ns)) => {
            let region = ringstore_sys::region_of(ns).ok_or(format!("{ns}: no region"))?;
            let uuid = ringstore_sys::read_trim("/proc/sys/kernel/random/uuid")
                .ok_or("no uuid from /proc/sys/kernel/random/uuid")?;
            ringstore_sys::make_device_dax(root, &region, ns, &uuid)
                .map_err(|e| format!("not kept: {ns} as device-DAX: {e}"))?;
            warn!("ram tier: {ns} made device-DAX afresh (nothing kept from before)");
            wait_for(|| ringstore_sys::find_device_dax(root)).ok_or(format!(
                "not kept: {ns} bound, but no device-DAX device appeared"
            ))?
        }
    };
    wait_for(|| dax.node.exists().then_some(()))
        .ok_or(format!("not kept: no {}", dax.node.display()))?;
    ringstore_sys::probe_map(&dax.node).map_err(|e| {
        format!(
            "not kept: {} does not map ({e}; a kernel without CONFIG_FS_DAX refuses it)",
            dax.node.display()
        )
    })?;
    if !crate::kexec::device_fits(dax.size, memory) {
        // Not used this run: a seal in it would outlive this run's writes.
        let _ = spend_seal(&dax, "it is too small for this run");
        return Err(format!(
            "not kept: {} holds {} MiB, memory {} MiB needs more ({token} is too small)",
            dax.node.display(),
            dax.size >> 20,
            memory >> 20
        ));
    }
    Ok(dax)
}

/// Zeroes the seal at `dev`'s start, so no later start resumes what an earlier run left:
/// items this run (or the firmware-booted runs before it) deleted or replaced would return.
fn spend_seal(dev: &DaxDevice, why: &str) -> Result<(), String> {
    ringstore_sys::zero_head(&dev.node, SEAL_LEN).map_err(|e| {
        format!(
            "not kept: cannot spend the seal in {}: {e}",
            dev.node.display()
        )
    })?;
    warn!("ram tier: any seal in {} spent: {why}", dev.node.display());
    Ok(())
}

fn wait_for<T>(mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let start = std::time::Instant::now();
    loop {
        if let Some(t) = f() {
            return Some(t);
        }
        if start.elapsed() > PROBE_WAIT {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The store's start as `stats` reports it: resumed (items kept) or cold and why.
pub fn restart_line(stats: &str) -> Option<String> {
    let stat = |name: &str| {
        stats.lines().find_map(|l| {
            l.trim()
                .strip_prefix("STAT ")?
                .strip_prefix(name)?
                .strip_prefix(' ')
                .map(str::to_string)
        })
    };
    match stat("memory_file_restart")?.as_str() {
        "resumed" => Some(format!(
            "resumed {} items",
            stat("memory_file_items_kept").unwrap_or_default()
        )),
        _ => Some(format!(
            "cold start: {}",
            stat("memory_file_cold_reason").unwrap_or_default()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_restart_is_read_from_stats() {
        let resumed = "STAT pid 1\r\nSTAT memory_file_restart resumed\r\nSTAT memory_file_items_kept 20000\r\nEND\r\n";
        assert_eq!(
            restart_line(resumed).as_deref(),
            Some("resumed 20000 items")
        );
        let cold = "STAT memory_file_restart cold\r\nSTAT memory_file_items_kept 0\r\nSTAT memory_file_cold_reason the seal does not verify\r\n";
        assert_eq!(
            restart_line(cold).as_deref(),
            Some("cold start: the seal does not verify")
        );
        assert_eq!(restart_line("STAT pid 1\r\n"), None);
    }
}
