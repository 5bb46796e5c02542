//! The data device as PID 1 sees it (`ringstore.data=/dev/vda`, ADR-0011): wait until the
//! driver has created its node in devtmpfs, describe it for the log and the console, and turn
//! the server's refusal into the line an operator of the appliance can act on.
//!
//! PID 1 never mounts or partitions the device, and writes one place of it: on a blank device
//! with a TPM, the sealed data key's area of the superblock block before the server formats
//! (`data_seal.rs`, ADR 0053). Every other byte is the server's (it opens the device in
//! `Server::start` and writes the checkpoint in `Server::shutdown`).

use std::os::unix::fs::FileTypeExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// How long the device node may take to appear: block drivers probe before /init runs, but an
/// asynchronous probe (or a slow controller) can still be creating it.
pub const NODE_WAIT: Duration = Duration::from_secs(5);
const POLL: Duration = Duration::from_millis(50);

/// Waits until `path` exists; returns its description (`/dev/vda: block device, 64 MiB`).
pub fn wait_for_node(path: &Path, limit: Duration) -> Result<String, String> {
    let deadline = Instant::now() + limit;
    loop {
        match std::fs::metadata(path) {
            Ok(meta) => return Ok(describe(path, &meta)),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound && Instant::now() < deadline => std::thread::sleep(POLL),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                return Err(format!(
                    "data device {}: no such device after {} s (is the disk attached? block devices: {})",
                    path.display(),
                    limit.as_secs(),
                    block_devices().join(" ")
                ))
            }
            Err(err) => return Err(format!("data device {}: {err}", path.display())),
        }
    }
}

fn describe(path: &Path, meta: &std::fs::Metadata) -> String {
    if meta.file_type().is_block_device() {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        // /sys/class/block/NAME/size counts 512-byte sectors whatever the logical block size.
        let bytes = ringstore_sys::read_trim(format!("/sys/class/block/{name}/size"))
            .and_then(|s| s.parse::<u64>().ok())
            .map(|s| s * 512);
        match bytes {
            Some(bytes) => format!("{}: block device, {}", path.display(), size_text(bytes)),
            None => format!("{}: block device", path.display()),
        }
    } else if meta.is_file() {
        format!("{}: file, {}", path.display(), size_text(meta.len()))
    } else {
        format!("{}: not a block device or file", path.display())
    }
}

/// `64 MiB` for whole MiB, else bytes.
pub fn size_text(bytes: u64) -> String {
    if bytes >= 1 << 20 && bytes.is_multiple_of(1 << 20) {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{bytes} bytes")
    }
}

/// The block devices the kernel knows (`/sys/class/block`), for the "not found" message.
fn block_devices() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir("/sys/class/block")
        .map(|dir| {
            dir.filter_map(|e| e.ok())
                .filter_map(|e| e.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    if names.is_empty() {
        names.push("none".into());
    }
    names
}

/// The server's refusal as the appliance's operator reads it: the runtime names its command-line
/// flag; on the appliance the same setting is a kernel command-line key.
pub fn appliance_message(message: &str) -> String {
    message.replace("--data-format=force", "ringstore.data_format=force")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_node_fails_after_the_wait_and_names_the_path() {
        let started = Instant::now();
        let err =
            wait_for_node(Path::new("/nonexistent/vdz"), Duration::from_millis(120)).unwrap_err();
        assert!(
            started.elapsed() >= Duration::from_millis(120),
            "returned before the wait ended"
        );
        assert!(
            err.starts_with("data device /nonexistent/vdz: no such device after 0 s"),
            "{err}"
        );
    }

    #[test]
    fn an_existing_file_is_described_with_its_size() {
        let path =
            std::env::temp_dir().join(format!("ringstore-init-data-device-{}", std::process::id()));
        std::fs::write(&path, vec![0u8; 2 << 20]).unwrap();
        let described = wait_for_node(&path, Duration::ZERO);
        std::fs::remove_file(&path).unwrap();
        assert_eq!(
            described.unwrap(),
            format!("{}: file, 2 MiB", path.display())
        );
    }

    #[test]
    fn sizes_and_messages() {
        assert_eq!(size_text(64 << 20), "64 MiB");
        assert_eq!(size_text(1000), "1000 bytes");
        assert_eq!(
            appliance_message("data device /dev/vda: holds an ext4 filesystem; use --data-format=force to format it"),
            "data device /dev/vda: holds an ext4 filesystem; use ringstore.data_format=force to format it"
        );
    }
}
