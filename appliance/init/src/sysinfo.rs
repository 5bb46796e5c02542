//! Small readers of /proc and /sys facts that the console and the log show.

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

/// Reads a sysfs/procfs file as one trimmed line.
pub fn read_trim(path: &str) -> Option<String> {
    fs::read_to_string(path).ok().map(|s| s.trim().to_string())
}

/// The running kernel's release (`uname -r`).
pub fn kernel_release() -> String {
    read_trim("/proc/sys/kernel/osrelease").unwrap_or_else(|| "unknown".to_string())
}

/// The kernel's CPU list syntax (`0-3,8`); malformed parts are skipped.
pub fn parse_cpulist(text: &str) -> Vec<usize> {
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((lo, hi)) => {
                if let (Ok(lo), Ok(hi)) = (lo.parse::<usize>(), hi.parse::<usize>()) {
                    cpus.extend((lo..=hi).take(65536));
                }
            }
            None => cpus.extend(part.parse::<usize>().ok()),
        }
    }
    cpus.sort_unstable();
    cpus.dedup();
    cpus
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
        assert_eq!(parse_cpulist("0-2,5\n"), vec![0, 1, 2, 5]);
        assert_eq!(parse_cpulist("x,3"), vec![3]);
    }
}
