//! What the results say about the machine: its CPUs, kernel and memory, and how loaded it is.

/// CPU model, CPU count, kernel, memory.
pub(super) fn machine_summary() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|m| m.trim_start_matches([' ', '\t', ':']))
        .unwrap_or("unknown CPU");
    let cpus = cpuinfo
        .lines()
        .filter(|l| l.starts_with("processor"))
        .count();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mem_kb: u64 = std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0);
    format!(
        "- machine: {cpus} × {model}, {:.0} GiB RAM, Linux {}",
        mem_kb as f64 / 1048576.0,
        kernel.trim()
    )
}

/// Load average and how many compilers run beside us (the machine is shared).
pub(super) fn load_summary() -> String {
    let loadavg = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load: Vec<&str> = loadavg.split_whitespace().take(3).collect();
    let mut compilers = 0;
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let comm = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
            if matches!(
                comm.trim(),
                "rustc" | "cc1" | "cc1plus" | "ld" | "clippy-driver"
            ) {
                compilers += 1;
            }
        }
    }
    format!(
        "load average {} (1/5/15 min), {compilers} compiler processes running",
        load.join(" ")
    )
}
