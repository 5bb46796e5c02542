//! Legacy persistent memory (`memmap=SIZE!OFFSET`) as a device-DAX character device: the
//! memory the RAM tier keeps across a kexec jump (ADR 0054). The steps are the ones
//! `ndctl create-namespace -f -e namespace0.0 -m devdax -a 2M` takes, written to sysfs: the
//! namespace leaves `nd_pmem`, the region's dax seed gets a uuid, 2 MiB alignment, its struct
//! pages inside the region and the namespace, and is bound to `dax_pmem`. The info block that
//! writes lives in the reserved memory itself, so the next kernel finds the device again.

use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Where sysfs is mounted (a test passes a tree of its own).
pub const SYSFS: &str = "/sys";
/// The device-DAX alignment asked for: the arena is mapped with 2 MiB pages.
pub const DAX_ALIGN: u64 = 2 << 20;

/// A device-DAX device: its name (`dax0.0`), its node under /dev and its size in bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaxDevice {
    pub name: String,
    pub node: PathBuf,
    pub size: u64,
}

fn nd(root: &Path) -> PathBuf {
    root.join("bus/nd")
}

/// A `memmap=SIZE!OFFSET` reservation (legacy pmem): its physical start and size in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reservation {
    pub start: u64,
    pub size: u64,
}

impl Reservation {
    /// The reservation a `memmap=SIZE!OFFSET` token names (the kernel's `memparse` sizes:
    /// decimal or `0x` hex, an optional K, M, G, T, P or E), if it is one.
    pub fn parse(token: &str) -> Option<Reservation> {
        let (size, start) = token.strip_prefix("memmap=")?.split_once('!')?;
        Some(Reservation {
            start: memparse(start)?,
            size: memparse(size)?,
        })
    }

    /// Whether a region at `start` of `size` bytes holds all of this reservation.
    fn inside(&self, start: u64, size: u64) -> bool {
        start <= self.start && self.start.saturating_add(self.size) <= start.saturating_add(size)
    }
}

/// The kernel's `memparse`: a number (decimal, or hex after `0x`) and an optional binary
/// suffix (K, M, G, T, P, E).
fn memparse(text: &str) -> Option<u64> {
    let (radix, body) = match text.strip_prefix("0x") {
        Some(hex) => (16, hex),
        None => (10, text),
    };
    let end = body
        .find(|c: char| !c.is_digit(radix))
        .unwrap_or(body.len());
    let n = u64::from_str_radix(&body[..end], radix).ok()?;
    let shift = match &body[end..] {
        "" => 0,
        s if s.len() == 1 => 10 * (1 + "kmgtpe".find(s.to_ascii_lowercase().as_str())?),
        _ => return None,
    };
    n.checked_mul(1u64.checked_shl(u32::try_from(shift).ok()?)?)
}

/// The number of the nd region whose physical range holds `reservation` (adjacent
/// reservations may share one): the region the reservation made, not just the first one (an
/// operator's own `memmap=` or a real NVDIMM makes others).
pub fn region_holding(root: &Path, reservation: Reservation) -> Option<u32> {
    let devices = nd(root).join("devices");
    let mut regions: Vec<u32> = std::fs::read_dir(&devices)
        .ok()?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter_map(|n| n.strip_prefix("region")?.parse().ok())
        .collect();
    regions.sort_unstable();
    regions.into_iter().find(|n| {
        let dir = devices.join(format!("region{n}"));
        let start = crate::read_trim(dir.join("resource"))
            .and_then(|s| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok());
        let size = crate::read_trim(dir.join("size")).and_then(|s| s.parse().ok());
        matches!((start, size), (Some(start), Some(size)) if reservation.inside(start, size))
    })
}

/// The names under `dir` that start with `prefix`, sorted.
fn names_with(dir: &Path, prefix: &str) -> Vec<String> {
    let mut found: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|n| n.starts_with(prefix))
                .collect()
        })
        .unwrap_or_default();
    found.sort();
    found
}

/// The first device-DAX device of nd region `region` under `root` with a size, its node
/// under `dev` (`/dev`): device-DAX names its devices `dax{region}.{id}`.
pub fn find_device_dax(root: &Path, dev: &Path, region: u32) -> Option<DaxDevice> {
    let dir = root.join("bus/dax/devices");
    names_with(&dir, &format!("dax{region}."))
        .into_iter()
        .find_map(|name| {
            let size = crate::read_trim(dir.join(&name).join("size"))?
                .parse()
                .ok()?;
            (size > 0).then(|| DaxDevice {
                node: dev.join(&name),
                name,
                size,
            })
        })
}

/// The pmem namespaces of nd region `region` under `root`, by name (`namespace0.0`).
pub fn pmem_namespaces(root: &Path, region: u32) -> Vec<String> {
    names_with(&nd(root).join("devices"), &format!("namespace{region}."))
}

/// What the kernel made of a reservation once its probing settled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probed {
    /// The nd region holding the reservation, if one appeared.
    pub region: Option<u32>,
    /// Its device-DAX device, if the reserved memory held an info block (or got one).
    pub dax: Option<DaxDevice>,
    /// Its namespaces.
    pub namespaces: Vec<String>,
}

/// Waits up to `limit` for the kernel's probing of `reservation` to settle: a device-DAX
/// device in its region, or the region's namespaces all bound to a driver (`nd_pmem`: no info
/// block found, so none to keep). A namespace still unbound may be probing its info block.
pub fn wait_for_pmem(root: &Path, dev: &Path, reservation: Reservation, limit: Duration) -> Probed {
    let start = Instant::now();
    loop {
        let region = region_holding(root, reservation);
        let dax = region.and_then(|r| find_device_dax(root, dev, r));
        let namespaces = region.map(|r| pmem_namespaces(root, r)).unwrap_or_default();
        let settled = !namespaces.is_empty()
            && namespaces
                .iter()
                .all(|n| nd(root).join("devices").join(n).join("driver").exists());
        if dax.is_some() || settled || start.elapsed() >= limit {
            return Probed {
                region,
                dax,
                namespaces,
            };
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The first [`DAX_ALIGN`] bytes of `node`, mapped shared for reading and writing.
fn map_head(node: &Path) -> io::Result<crate::Mapping> {
    use std::os::fd::AsFd;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(node)?;
    let len = usize::try_from(DAX_ALIGN).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    crate::Mapping::shared(file.as_fd(), 0, len)
}

/// Whether `node` maps shared in [`DAX_ALIGN`] pieces (a kernel without FS_DAX binds the
/// device but refuses every mapping of it); the probe mapping is gone on return.
pub fn probe_map(node: &Path) -> io::Result<()> {
    map_head(node).map(drop)
}

/// Zeroes the first `len` bytes (at most [`DAX_ALIGN`]) of the device-DAX device `node`,
/// through a shared mapping (the device has no `write`): how PID 1 spends a seal the next
/// start must not trust.
pub fn zero_head(node: &Path, len: usize) -> io::Result<()> {
    let mapping = map_head(node)?;
    if len > mapping.len() {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: `mapping` is a fresh shared mapping that this function owns and no Rust
    // reference covers; `len <= mapping.len()` was checked above.
    unsafe { std::ptr::write_bytes(mapping.as_ptr(), 0, len) };
    Ok(())
}

fn write(path: PathBuf, value: &str) -> io::Result<()> {
    std::fs::write(&path, value)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))
}

/// Turns `namespace` (of region `region`, e.g. `region0`) into a device-DAX device with
/// 2 MiB alignment and a fresh `uuid`; returns the dax seed it configured. What the region
/// held before is gone (a new info block is written at its start).
pub fn make_device_dax(
    root: &Path,
    region: &str,
    namespace: &str,
    uuid: &str,
) -> io::Result<String> {
    let nd = nd(root);
    let seed = crate::read_trim(nd.join("devices").join(region).join("dax_seed"))
        .filter(|s| !s.is_empty())
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("{region}: no dax_seed")))?;
    if nd.join("devices").join(namespace).join("driver").exists() {
        write(nd.join("drivers/nd_pmem/unbind"), namespace)?;
    }
    let dev = nd.join("devices").join(&seed);
    write(dev.join("uuid"), uuid)?;
    write(dev.join("align"), &DAX_ALIGN.to_string())?;
    // The struct pages live in the region (ndctl's `--map=dev`), not in the kernel's RAM.
    write(dev.join("mode"), "pmem")?;
    write(dev.join("namespace"), namespace)?;
    let bind = nd.join("drivers/dax_pmem/bind");
    if bind.exists() {
        write(bind, &seed)?;
    } else {
        write(nd.join("drivers_probe"), &seed)?;
    }
    Ok(seed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_head_zeroes_only_the_head() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("region");
        let len = usize::try_from(DAX_ALIGN).unwrap();
        std::fs::write(&path, vec![0xa5u8; len]).unwrap();
        zero_head(&path, 4096).unwrap();
        let got = std::fs::read(&path).unwrap();
        assert!(got[..4096].iter().all(|&b| b == 0));
        assert!(got[4096..].iter().all(|&b| b == 0xa5));
        assert!(zero_head(&path, len + 1).is_err(), "past the mapping");
    }

    fn file(root: &Path, rel: &str, text: &str) {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    #[test]
    fn a_namespace_becomes_device_dax_through_its_region_seed() {
        let t = tempfile::tempdir().unwrap();
        let r = t.path();
        file(r, "bus/nd/devices/region0/dax_seed", "dax0.0\n");
        file(r, "bus/nd/devices/namespace0.0/driver/x", "");
        for f in ["uuid", "align", "mode", "namespace"] {
            file(r, &format!("bus/nd/devices/dax0.0/{f}"), "");
        }
        file(r, "bus/nd/drivers/nd_pmem/unbind", "");
        file(r, "bus/nd/drivers/dax_pmem/bind", "");
        assert_eq!(pmem_namespaces(r, 0), vec!["namespace0.0".to_string()]);
        let seed = make_device_dax(r, "region0", "namespace0.0", "u-u-i-d").unwrap();
        assert_eq!(seed, "dax0.0");
        let read = |rel: &str| std::fs::read_to_string(r.join(rel)).unwrap();
        assert_eq!(read("bus/nd/drivers/nd_pmem/unbind"), "namespace0.0");
        assert_eq!(read("bus/nd/devices/dax0.0/align"), "2097152");
        assert_eq!(read("bus/nd/devices/dax0.0/mode"), "pmem");
        assert_eq!(read("bus/nd/devices/dax0.0/namespace"), "namespace0.0");
        assert_eq!(read("bus/nd/drivers/dax_pmem/bind"), "dax0.0");
        let dev = Path::new("/dev");
        assert!(find_device_dax(r, dev, 0).is_none());
        file(r, "bus/dax/devices/dax0.0/size", "264241152\n");
        let dax = find_device_dax(r, dev, 0).unwrap();
        assert_eq!((dax.name.as_str(), dax.size), ("dax0.0", 264_241_152));
        assert_eq!(dax.node, Path::new("/dev/dax0.0"));
    }

    #[test]
    fn a_probe_maps_what_maps_and_says_why_not() {
        let t = tempfile::tempdir().unwrap();
        let f = t.path().join("arena");
        std::fs::write(&f, vec![0u8; 2 << 20]).unwrap();
        probe_map(&f).unwrap();
        assert!(probe_map(&t.path().join("missing")).is_err());
        // A directory opens for writing nowhere: refused before any mapping.
        assert!(probe_map(t.path()).is_err());
    }

    #[test]
    fn no_seed_is_an_error_and_no_tree_finds_nothing() {
        let t = tempfile::tempdir().unwrap();
        assert!(make_device_dax(t.path(), "region0", "namespace0.0", "u").is_err());
        assert!(find_device_dax(t.path(), Path::new("/dev"), 0).is_none());
        assert!(pmem_namespaces(t.path(), 0).is_empty());
        let r = Reservation::parse("memmap=256M!1G").unwrap();
        assert_eq!(region_holding(t.path(), r), None);
    }

    #[test]
    fn memmap_tokens_parse_as_the_kernel_reads_them() {
        let r = Reservation::parse("memmap=256M!1G").unwrap();
        assert_eq!((r.start, r.size), (1 << 30, 256 << 20));
        let r = Reservation::parse("memmap=0x10000000!0x140000000").unwrap();
        assert_eq!((r.start, r.size), (0x1_4000_0000, 0x1000_0000));
        let r = Reservation::parse("memmap=0x1e00000!0x1eM").unwrap();
        assert_eq!((r.start, r.size), (0x1e << 20, 0x1e0_0000));
        let r = Reservation::parse("memmap=2g!4096m").unwrap();
        assert_eq!((r.start, r.size), (4 << 30, 2 << 30));
        for bad in [
            "memmap=256M$1G",
            "memmap=256M!",
            "memmap=256X!1G",
            "mem=1G",
            "memmap=16E!1E",
            "memmap=!1G",
        ] {
            assert_eq!(Reservation::parse(bad), None, "{bad}");
        }
    }

    /// Two pmem regions (an operator's own `memmap=` below ours): the device, namespaces
    /// and region are the ones whose physical range holds the reservation, not the first.
    #[test]
    fn the_device_is_the_one_in_the_reservations_region() {
        let t = tempfile::tempdir().unwrap();
        let r = t.path();
        file(r, "bus/nd/devices/region0/resource", "0x40000000\n");
        file(r, "bus/nd/devices/region0/size", "268435456\n");
        file(r, "bus/nd/devices/region1/resource", "0x100000000\n");
        file(r, "bus/nd/devices/region1/size", "536870912\n");
        for n in ["namespace0.0", "namespace1.0"] {
            file(r, &format!("bus/nd/devices/{n}/driver/x"), "");
        }
        file(r, "bus/dax/devices/dax0.0/size", "264241152\n");
        file(r, "bus/dax/devices/dax1.0/size", "528482304\n");
        let ours = Reservation::parse("memmap=512M!4G").unwrap();
        assert_eq!(region_holding(r, ours), Some(1));
        // A reservation inside a region (adjacent ones merge) finds it; one across regions
        // or outside any finds none.
        assert_eq!(
            region_holding(r, Reservation::parse("memmap=128M!4224M").unwrap()),
            Some(1)
        );
        assert_eq!(
            region_holding(r, Reservation::parse("memmap=512M!1G").unwrap()),
            None
        );
        assert_eq!(
            region_holding(r, Reservation::parse("memmap=256M!2G").unwrap()),
            None
        );
        let dev = Path::new("/dev");
        let probed = wait_for_pmem(r, dev, ours, Duration::ZERO);
        assert_eq!(probed.region, Some(1));
        assert_eq!(probed.namespaces, vec!["namespace1.0".to_string()]);
        let dax = probed.dax.unwrap();
        assert_eq!((dax.name.as_str(), dax.size), ("dax1.0", 528_482_304));
        assert_eq!(dax.node, Path::new("/dev/dax1.0"));
        // The region without its device yet: its namespace, not the other region's device.
        std::fs::remove_dir_all(r.join("bus/dax/devices/dax1.0")).unwrap();
        let probed = wait_for_pmem(r, dev, ours, Duration::ZERO);
        assert_eq!((probed.region, probed.dax), (Some(1), None));
        assert_eq!(probed.namespaces, vec!["namespace1.0".to_string()]);
    }
}
