//! Small readers of /proc facts that the console and the log show (the sysfs/procfs line
//! reader and the CPU-list syntax are `ringstore_sys`'s).

use std::fs;

/// Seconds since boot from /proc/uptime (0.0 before /proc is mounted).
pub fn uptime_secs() -> f64 {
    fs::read_to_string("/proc/uptime")
        .ok()
        .and_then(|text| text.split_whitespace().next().and_then(|s| s.parse().ok()))
        .unwrap_or(0.0)
}

/// A field of /proc/meminfo in bytes (the file gives kB), e.g. `MemTotal`.
pub fn meminfo_bytes(field: &str) -> Option<u64> {
    parse_meminfo(&fs::read_to_string("/proc/meminfo").ok()?, field)
}

pub fn parse_meminfo(text: &str, field: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (name, rest) = line.split_once(':')?;
        if name.trim() != field {
            return None;
        }
        let mut parts = rest.split_whitespace();
        let value: u64 = parts.next()?.parse().ok()?;
        Some(if parts.next() == Some("kB") {
            value * 1024
        } else {
            value
        })
    })
}

/// The running kernel's release (`uname -r`).
pub fn kernel_release() -> String {
    ringstore_sys::read_trim("/proc/sys/kernel/osrelease").unwrap_or_else(|| "unknown".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_fields() {
        let text =
            "MemTotal:        2000 kB\nHugePages_Total:      32\nHugepagesize:       2048 kB\n";
        assert_eq!(parse_meminfo(text, "MemTotal"), Some(2_048_000));
        assert_eq!(parse_meminfo(text, "HugePages_Total"), Some(32));
        assert_eq!(parse_meminfo(text, "Missing"), None);
    }
}
