//! The CPU-use tables: server and client process CPU beside their cores' softirq and busy time.

use super::procs;
use std::fmt::Write as _;

/// Header of the CPU tables: process CPU (utime + stime) and whole-core busy time, which also
/// holds the softirq time of loopback TCP that no process is charged for.
pub(super) const CPU_TABLE_HEAD: &str = "### CPU use (server on CPU 0, client on CPU 1)

| run | server | server process % | CPU 0 softirq % | CPU 0 busy % | client process % | CPU 1 softirq % | CPU 1 busy % |
| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |
";

pub(super) fn cpu_row(
    out: &mut String,
    run: &str,
    server: &str,
    server_process: f64,
    server_core: procs::CoreUse,
    client_process: f64,
    client_core: procs::CoreUse,
) {
    let _ = writeln!(
        out,
        "| {run} | {server} | {server_process:.0} | {:.0} | {:.0} | {client_process:.0} | {:.0} | {:.0} |",
        server_core.softirq_percent, server_core.busy_percent, client_core.softirq_percent, client_core.busy_percent
    );
}
