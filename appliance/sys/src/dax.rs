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

/// The first device-DAX device under `root` with a size, if any.
pub fn find_device_dax(root: &Path) -> Option<DaxDevice> {
    let dir = root.join("bus/dax/devices");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .ok()?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("dax"))
        .collect();
    names.sort();
    names.into_iter().find_map(|name| {
        let size = crate::read_trim(dir.join(&name).join("size"))?
            .parse()
            .ok()?;
        (size > 0).then(|| DaxDevice {
            node: Path::new("/dev").join(&name),
            name,
            size,
        })
    })
}

/// The legacy (e820) pmem namespaces under `root`, by name (`namespace0.0`).
pub fn pmem_namespaces(root: &Path) -> Vec<String> {
    let mut found: Vec<String> = std::fs::read_dir(nd(root).join("devices"))
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|n| n.starts_with("namespace"))
                .collect()
        })
        .unwrap_or_default();
    found.sort();
    found
}

/// Waits up to `limit` for the kernel's probing to settle: a device-DAX device, or pmem
/// namespaces all bound to a driver (`nd_pmem`: no info block found, so none to keep);
/// returns what it found. A namespace still unbound may be probing its info block.
pub fn wait_for_pmem(root: &Path, limit: Duration) -> (Option<DaxDevice>, Vec<String>) {
    let start = Instant::now();
    loop {
        let dax = find_device_dax(root);
        let namespaces = pmem_namespaces(root);
        let settled = !namespaces.is_empty()
            && namespaces
                .iter()
                .all(|n| nd(root).join("devices").join(n).join("driver").exists());
        if dax.is_some() || settled || start.elapsed() >= limit {
            return (dax, namespaces);
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

/// The region a namespace belongs to (`namespace0.0` → `region0`).
pub fn region_of(namespace: &str) -> Option<String> {
    let n = namespace.strip_prefix("namespace")?.split('.').next()?;
    n.parse::<u32>().ok().map(|n| format!("region{n}"))
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
        assert_eq!(pmem_namespaces(r), vec!["namespace0.0".to_string()]);
        assert_eq!(region_of("namespace0.0").as_deref(), Some("region0"));
        let seed = make_device_dax(r, "region0", "namespace0.0", "u-u-i-d").unwrap();
        assert_eq!(seed, "dax0.0");
        let read = |rel: &str| std::fs::read_to_string(r.join(rel)).unwrap();
        assert_eq!(read("bus/nd/drivers/nd_pmem/unbind"), "namespace0.0");
        assert_eq!(read("bus/nd/devices/dax0.0/align"), "2097152");
        assert_eq!(read("bus/nd/devices/dax0.0/mode"), "pmem");
        assert_eq!(read("bus/nd/devices/dax0.0/namespace"), "namespace0.0");
        assert_eq!(read("bus/nd/drivers/dax_pmem/bind"), "dax0.0");
        assert!(find_device_dax(r).is_none());
        file(r, "bus/dax/devices/dax0.0/size", "264241152\n");
        let dax = find_device_dax(r).unwrap();
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
        assert!(find_device_dax(t.path()).is_none());
        assert!(pmem_namespaces(t.path()).is_empty());
        assert_eq!(region_of("namespaceX"), None);
    }
}
