//! `--memory-file` (ADR 0052): the store's arena in a file mapped shared (tmpfs or
//! hugetlbfs, or a device-DAX device on the appliance, ADR 0054), resumed from its seal at
//! start and sealed again at a clean stop.
//!
//! The store does the format, the checks and the seal; this module opens and maps the file,
//! tells the store why it must start cold when it must (a data device is authoritative),
//! and logs one line at start and one at the stop.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

use ringstore_store::{Backing, Outcome, Region, Store, StoreConfig, WallTime};

use crate::clock::Clock;
use crate::RuntimeError;

/// Size of a hugetlbfs page: a file there is sized in whole ones.
const HUGE_PAGE: usize = 1 << 21;

/// Why the RAM tier starts cold whatever the file holds, when a data device is attached.
const DATA_IS_AUTHORITATIVE: &str =
    "a data device is attached: its recovery is authoritative, the RAM tier starts cold";

/// The store over `path`, resumed from its seal or cold; logs which and why.
pub(crate) fn build(
    path: &Path,
    store_config: StoreConfig,
    data_attached: bool,
    clock: Clock,
) -> Result<Store, RuntimeError> {
    let region = map(path, &store_config)?;
    let now = clock.now();
    let at = WallTime {
        unix_secs: now.unix,
        now: now.store,
    };
    let cold = data_attached.then(|| DATA_IS_AUTHORITATIVE.to_string());
    let store = Store::open_region(store_config, region, at, cold)?;
    if let Some(r) = store.restart() {
        match &r.outcome {
            Outcome::Resumed {
                items,
                expired,
                down_secs,
                micros,
            } => eprintln!(
                "ringstore: memory-file {}: resumed {items} items ({expired} expired while down {down_secs} s) in {} ms",
                r.source,
                micros / 1000
            ),
            Outcome::Cold { reason } => {
                eprintln!("ringstore: memory-file {}: cold start: {reason}", r.source);
            }
        }
    }
    Ok(store)
}

/// Opens (or creates) `path`, sizes it to what `config` needs and maps it shared.
fn map(path: &Path, config: &StoreConfig) -> Result<Region, RuntimeError> {
    let io = |what: &str| {
        let what = format!("memory-file {}: {what}", path.display());
        move |source| RuntimeError::Io { what, source }
    };
    let need = Store::region_len(config)?.next_multiple_of(HUGE_PAGE);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(io("cannot open"))?;
    let meta = file.metadata().map_err(io("cannot stat"))?;
    if meta.file_type().is_char_device() {
        // A device-DAX device (ADR 0054): a fixed size, its pages 2 MiB by the device's own
        // alignment; the arena takes its first `need` bytes.
        let size = device_size(meta.rdev()).map_err(io("cannot read its size in sysfs"))?;
        if size < need as u64 {
            return Err(RuntimeError::Io {
                what: format!(
                    "memory-file {}: the device holds {size} bytes, the store needs {need}",
                    path.display()
                ),
                source: std::io::ErrorKind::InvalidInput.into(),
            });
        }
        let (bytes, _) = crate::sys::map_file_for_process(file, need)
            .map_err(io("cannot lock and map it (is another server using it?)"))?;
        return Ok(Region {
            bytes,
            backing: Backing::HugeTlb,
            source: path.display().to_string(),
        });
    }
    let len = meta.len();
    if len != need as u64 {
        // Another size is another layout: the store starts cold and says so.
        file.set_len(need as u64).map_err(io(
            "cannot size it (is it on tmpfs or hugetlbfs with room?)",
        ))?;
    }
    let (bytes, huge) = crate::sys::map_file_for_process(file, need)
        .map_err(io("cannot lock and map it (is another server using it?)"))?;
    Ok(Region {
        bytes,
        backing: if huge {
            Backing::HugeTlb
        } else {
            Backing::Normal
        },
        source: path.display().to_string(),
    })
}

/// A character device's size in bytes, from `/sys/dev/char/MAJOR:MINOR/size`.
fn device_size(rdev: u64) -> std::io::Result<u64> {
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    let path = format!("/sys/dev/char/{major}:{minor}/size");
    crate::sys::read_trim(&path)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, path))
}

/// Seals the store's arena into its file (the workers have stopped); logs what it kept.
pub(crate) fn seal(store: &Store, clock: Clock) {
    if store.restart().is_none() {
        return;
    }
    let now = clock.now();
    let at = WallTime {
        unix_secs: now.unix,
        now: now.store,
    };
    match store.seal(at) {
        Ok(r) => eprintln!(
            "ringstore: memory-file: sealed {} items ({} segments, {} bytes checksummed) in {} ms",
            r.items,
            r.segments,
            r.checked_bytes,
            r.micros / 1000
        ),
        Err(err) => eprintln!("ringstore: memory-file: not sealed ({err}); the next start is cold"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> StoreConfig {
        StoreConfig {
            memory_bytes: 8 << 20,
            item_size_max: 1 << 20,
            shards: 64,
            huge_pages: false,
            external_threshold: 0,
        }
    }

    #[test]
    fn a_character_device_is_sized_from_sysfs_never_truncated() {
        // /dev/null is a character device without a `size` in sysfs: the device path reads
        // the size (and fails here) where a file would be resized.
        let Err(err) = map(Path::new("/dev/null"), &config()) else {
            panic!("/dev/null mapped as a memory file");
        };
        assert!(
            err.to_string().contains("cannot read its size in sysfs"),
            "{err}"
        );
    }

    #[test]
    fn device_numbers_decode_as_glibc_and_musl_encode_them() {
        // makedev(252, 3) and makedev(4095, 1048575): major and minor split across the word.
        let enc = |major: u32, minor: u32| libc::makedev(major, minor);
        for (major, minor) in [(252, 3), (4095, 1_048_575), (1, 3)] {
            let err = device_size(enc(major, minor)).unwrap_err().to_string();
            assert!(
                err.contains(&format!("/sys/dev/char/{major}:{minor}/size")),
                "{err}"
            );
        }
    }
}
