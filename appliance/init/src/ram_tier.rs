//! The RAM tier kept across a kexec jump (ADR 0054): with a `memmap=SIZE!OFFSET` reservation on
//! the command line, the legacy pmem namespace it makes becomes a device-DAX device (once: its
//! info block lives in the reserved memory and the next kernel finds it) and the server's
//! `--memory-file`. The store seals the arena at the stop and resumes it at the next start.

use std::path::{Path, PathBuf};
use std::time::Duration;

use ringstore_config::Config;
use ringstore_sys::{DaxDevice, Reservation, SYSFS};

use crate::machine::Machine;
use crate::{info, warn};

/// How long boot waits for the kernel's probing of the reserved memory.
const PROBE_WAIT: Duration = Duration::from_secs(3);
/// Bytes at the device's start that hold the store's seal (its footer, ADR 0052): zeroed to
/// spend a seal no start may trust.
const SEAL_LEN: usize = 4096;

/// Where the kernel's view lives: sysfs and the device nodes (a test passes trees of its own).
struct Host {
    sys: PathBuf,
    dev: PathBuf,
}

/// `config` with the device-DAX device as its memory file, when this boot has a reservation
/// that holds the arena; records in `machine` what the RAM tier is kept in, or why not.
pub fn attach(machine: &Machine, config: &Config) -> Option<Config> {
    let running = crate::cmdline::running_or_empty();
    let host = Host {
        sys: PathBuf::from(SYSFS),
        dev: PathBuf::from("/dev"),
    };
    let found = host.find(running, config.memory_file.as_deref(), config.memory);
    let (line, attached) = match found {
        Ok(dev) => (
            format!(
                "kept across kexec reboots in {} ({} MiB, {})",
                dev.node.display(),
                dev.size >> 20,
                crate::kexec::memmap_token(running).unwrap_or("")
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

impl Host {
    /// The device the arena lives in this run (seal spent when placed afresh), or why none.
    fn find(
        &self,
        running: &str,
        memory_file: Option<&Path>,
        memory: u64,
    ) -> Result<DaxDevice, String> {
        let token = crate::kexec::memmap_token(running);
        match (memory_file, token) {
            (Some(file), token) => {
                // The arena lives elsewhere this run: a seal an earlier run left in the
                // reserved memory would outlive every change made here, and a later run
                // without `memory_file` would resume it.
                let spent = token.and_then(|t| self.spend_stale(t));
                Err(format!(
                    "in {} (memory_file set){}",
                    file.display(),
                    spent.map(|d| format!("; the seal in {d} spent")).unwrap_or_default()
                ))
            }
            (None, None) => Err(
                "not kept across a reboot: no memmap= reservation on this boot (a kexec reboot adds one)"
                    .to_string(),
            ),
            (None, Some(token)) => self.device(token, memory).and_then(|dev| {
                if running.split_whitespace().any(|t| t == crate::kexec::FRESH_TOKEN) {
                    spend_seal(&dev, "the reservation was placed afresh at the last jump")?;
                }
                Ok(dev)
            }),
        }
    }

    /// Spends the seal in the reservation's device-DAX device when there is one (without one
    /// the memory holds no arena to resume); the device's node when it did.
    fn spend_stale(&self, token: &str) -> Option<String> {
        let reservation = Reservation::parse(token)?;
        let probed = ringstore_sys::wait_for_pmem(&self.sys, &self.dev, reservation, PROBE_WAIT);
        let dax = probed.dax?;
        match spend_seal(&dax, "memory_file is set: this run's items live there") {
            Ok(()) => Some(dax.node.display().to_string()),
            Err(why) => {
                warn!("ram tier: {why}");
                None
            }
        }
    }

    /// The device-DAX device of the reservation `token`, configured now if the reserved
    /// memory holds none yet; refused when it cannot hold `memory`.
    fn device(&self, token: &str, memory: u64) -> Result<DaxDevice, String> {
        let reservation = Reservation::parse(token).ok_or(format!("not kept: {token} unread"))?;
        let probed = ringstore_sys::wait_for_pmem(&self.sys, &self.dev, reservation, PROBE_WAIT);
        let region = probed
            .region
            .ok_or(format!("not kept: {token} made no pmem region"))?;
        let dax = match (probed.dax, probed.namespaces.first()) {
            (Some(dax), _) => dax,
            (None, None) => return Err(format!("not kept: {token} made no pmem namespace")),
            (None, Some(ns)) => self.make_device(region, ns)?,
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

    /// Namespace `ns` of region `region` made device-DAX (nothing kept from before).
    fn make_device(&self, region: u32, ns: &str) -> Result<DaxDevice, String> {
        let uuid = ringstore_sys::read_trim("/proc/sys/kernel/random/uuid")
            .ok_or("no uuid from /proc/sys/kernel/random/uuid")?;
        ringstore_sys::make_device_dax(&self.sys, &format!("region{region}"), ns, &uuid)
            .map_err(|e| format!("not kept: {ns} as device-DAX: {e}"))?;
        warn!("ram tier: {ns} made device-DAX afresh (nothing kept from before)");
        wait_for(|| ringstore_sys::find_device_dax(&self.sys, &self.dev, region)).ok_or(format!(
            "not kept: {ns} bound, but no device-DAX device appeared"
        ))
    }
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

    fn file(root: &Path, rel: &str, bytes: &[u8]) {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, bytes).unwrap();
    }

    /// Two pmem regions with a device-DAX device each, both "sealed" (their first bytes not
    /// zero): at 1 GiB (256 MiB) and at 4 GiB (512 MiB).
    fn two_regions() -> (tempfile::TempDir, Host) {
        let t = tempfile::tempdir().unwrap();
        let sys = t.path().join("sys");
        let dev = t.path().join("dev");
        for (n, at, size) in [
            (0, "0x40000000", 256u64 << 20),
            (1, "0x100000000", 512 << 20),
        ] {
            file(
                &sys,
                &format!("bus/nd/devices/region{n}/resource"),
                at.as_bytes(),
            );
            file(
                &sys,
                &format!("bus/nd/devices/region{n}/size"),
                size.to_string().as_bytes(),
            );
            file(
                &sys,
                &format!("bus/nd/devices/namespace{n}.0/driver/x"),
                b"",
            );
            let dax_size = (size - size / 60 - (2 << 20)).to_string();
            file(
                &sys,
                &format!("bus/dax/devices/dax{n}.0/size"),
                dax_size.as_bytes(),
            );
            file(&dev, &format!("dax{n}.0"), &vec![0xa5; 2 << 20]);
        }
        (t, Host { sys, dev })
    }

    fn sealed(host: &Host, name: &str) -> bool {
        std::fs::read(host.dev.join(name)).unwrap()[..SEAL_LEN]
            .iter()
            .any(|&b| b != 0)
    }

    #[test]
    fn the_arena_is_the_device_of_the_reserved_region() {
        let (_t, host) = two_regions();
        // The first region (an NVDIMM or another reservation) is not ours.
        let dev = host
            .find("console=ttyS0 memmap=512M!4G", None, 128 << 20)
            .unwrap();
        assert_eq!(dev.node, host.dev.join("dax1.0"));
        let dev = host.find("memmap=256M!1G quiet", None, 128 << 20).unwrap();
        assert_eq!(dev.node, host.dev.join("dax0.0"));
        assert!(
            sealed(&host, "dax0.0") && sealed(&host, "dax1.0"),
            "nothing spent"
        );
        // Placed afresh: the seal of that device only is spent.
        let fresh = format!("memmap=512M!4G {}", crate::kexec::FRESH_TOKEN);
        let dev = host.find(&fresh, None, 128 << 20).unwrap();
        assert_eq!(dev.node, host.dev.join("dax1.0"));
        assert!(sealed(&host, "dax0.0") && !sealed(&host, "dax1.0"));
        let err = host.find("memmap=256M!2G", None, 128 << 20).unwrap_err();
        assert!(err.contains("made no pmem region"), "{err}");
    }

    #[test]
    fn a_memory_file_run_spends_the_seal_in_the_reservation() {
        let (_t, host) = two_regions();
        let elsewhere = Path::new("/run/arena");
        let err = host
            .find("memmap=512M!4G", Some(elsewhere), 128 << 20)
            .unwrap_err();
        assert!(
            err.starts_with("in /run/arena (memory_file set); the seal in "),
            "{err}"
        );
        assert!(err.ends_with("dax1.0 spent"), "{err}");
        assert!(!sealed(&host, "dax1.0"), "the stale seal survived");
        assert!(sealed(&host, "dax0.0"), "another region's device touched");
        // Without a reservation there is nothing to spend.
        let err = host
            .find("console=ttyS0", Some(elsewhere), 128 << 20)
            .unwrap_err();
        assert_eq!(err, "in /run/arena (memory_file set)");
    }
}
