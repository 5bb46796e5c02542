//! Sizes that follow the machine on the appliance: with no `memory` in any configuration
//! layer, the item memory is the serving node's RAM less what the kernel, PID 1 and the
//! connections may need (`ringstore serve` keeps memcached's explicit `--memory`).
//!
//! The reserve is the README's memory bound read backwards: the server's RSS stays within
//! `memory + conn-memory + max-conns × 160 KiB + 16 MiB + 4 MiB × workers`, so that much
//! beyond `memory` is kept free, plus the kernel's share of the node (page tables, socket
//! buffers, the page cache the data device reads through): a sixteenth of the node, at least
//! 256 MiB. Whatever is left is rounded down to whole 2 MiB huge pages; never under 64 MiB
//! (memcached's default, the built-in one).
//!
//! `sub_memory = auto` sizes the region on each other node (ADR 0035) by the same rule from
//! that node's RAM; the runtime gives every other node one size, so it is the smallest of
//! theirs (the nodes of a server are usually alike).

use ringstore_config::Config;

/// Per connection, what the README's bound allows beyond `--conn-memory`.
const PER_CONN: u64 = 160 << 10;
/// The bound's fixed part and its part per worker.
const FIXED: u64 = 16 << 20;
const PER_WORKER: u64 = 4 << 20;
/// The kernel's share of the node: a sixteenth, at least this.
const KERNEL_MIN: u64 = 256 << 20;
/// The floor (the built-in default, memcached's `-m 64`).
const FLOOR: u64 = 64 << 20;
const HUGE_PAGE: u64 = 2 << 20;

/// The `memory` for a node of `node_total` bytes serving with `workers` workers and
/// `config`'s connection limits, and the reserve it leaves.
pub fn memory_for(node_total: u64, workers: usize, config: &Config) -> (u64, u64) {
    let kernel = (node_total / 16).max(KERNEL_MIN);
    let conns = (config.max_conns as u64).saturating_mul(PER_CONN);
    let reserve = kernel
        .saturating_add(config.conn_memory as u64)
        .saturating_add(conns)
        .saturating_add(FIXED)
        .saturating_add(PER_WORKER.saturating_mul(workers as u64));
    let left = node_total.saturating_sub(reserve) / HUGE_PAGE * HUGE_PAGE;
    (left.max(FLOOR), reserve)
}

/// With `sub_memory = auto`: the size for every node but `serving`, from each node's
/// `MemTotal` in `totals` (node, bytes) by [`memory_for`]: the smallest, and the node that
/// set it. `None` when there is no other node (the runtime then refuses sub memory).
pub fn sub_memory_for(
    totals: &[(u32, u64)],
    serving: u32,
    workers: usize,
    config: &Config,
) -> Option<(u64, u32)> {
    totals
        .iter()
        .filter(|(node, _)| *node != serving)
        .map(|&(node, total)| (memory_for(total, workers, config).0, node))
        .min()
}

/// `node`'s `MemTotal` in `totals` (from [`node_totals`]).
pub fn total_of(totals: &[(u32, u64)], node: u32) -> Option<u64> {
    totals
        .iter()
        .find(|(n, _)| *n == node)
        .map(|&(_, total)| total)
}

/// Every NUMA node with CPUs (the serving node, and those the runtime gives sub regions) and
/// its `MemTotal`: the one walk of `/sys/devices/system/node` that both sizes use.
pub fn node_totals() -> Vec<(u32, u64)> {
    let Ok(dir) = std::fs::read_dir("/sys/devices/system/node") else {
        return Vec::new();
    };
    let mut totals: Vec<(u32, u64)> = dir
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.strip_prefix("node")?.parse().ok())
        .filter(|&n: &u32| {
            let cpus = std::fs::read_to_string(format!("/sys/devices/system/node/node{n}/cpulist"));
            cpus.is_ok_and(|c| !ringstore_sys::parse_cpulist(&c).is_empty())
        })
        .filter_map(|n| Some((n, node_total(n)?)))
        .collect();
    totals.sort_unstable();
    totals
}

/// `MemTotal` of NUMA node `node` (`/sys/devices/system/node/nodeN/meminfo`), in bytes.
fn node_total(node: u32) -> Option<u64> {
    let text =
        std::fs::read_to_string(format!("/sys/devices/system/node/node{node}/meminfo")).ok()?;
    parse_node_total(&text)
}

fn parse_node_total(meminfo: &str) -> Option<u64> {
    // `Node 0 MemTotal:        1016028 kB`
    let line = meminfo.lines().find(|l| l.contains("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().rev().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    #[test]
    fn memory_is_the_node_less_the_bound_and_the_kernel() {
        let config = Config::default();
        // A 1 GiB node (the 2 GiB two-node QEMU machine), two workers: 1024 - 256 (kernel)
        // - 64 (conn-memory) - 640 (4096 conns x 160 KiB) - 16 - 8 = 40 MiB: the floor.
        assert_eq!(memory_for(GIB, 2, &config).0, 64 * MIB);
        // A 256 GiB node, 32 workers: 256 GiB - 16 GiB - 64 - 640 - 16 - 128 MiB.
        let (memory, reserve) = memory_for(256 * GIB, 32, &config);
        assert_eq!(reserve, 16 * GIB + (64 + 640 + 16 + 128) * MIB);
        assert_eq!(memory, 256 * GIB - reserve);
        assert_eq!(memory % (2 * MIB), 0, "whole huge pages");
        // Fewer connections leave more for items.
        let small = Config {
            max_conns: 256,
            ..Config::default()
        };
        let (memory, _) = memory_for(4 * GIB, 2, &small);
        assert_eq!(memory, 4 * GIB - 256 * MIB - (64 + 40 + 16 + 8) * MIB);
    }

    #[test]
    fn sub_memory_auto_is_memory_sized_on_each_other_node_the_smallest_kept() {
        let config = Config::default();
        let totals = [(0, 256 * GIB), (1, 256 * GIB), (2, 128 * GIB)];
        // Node 1 serves: nodes 0 and 2 get one size, node 2's (the smaller).
        let (size, node) = sub_memory_for(&totals, 1, 32, &config).unwrap();
        assert_eq!((size, node), (memory_for(128 * GIB, 32, &config).0, 2));
        assert_eq!(size, 128 * GIB - 8 * GIB - (64 + 640 + 16 + 128) * MIB);
        // Two alike nodes: the other node's size is what `memory` is for the serving one.
        let two = [(0, 256 * GIB), (1, 256 * GIB)];
        let (size, node) = sub_memory_for(&two, 0, 32, &config).unwrap();
        assert_eq!((size, node), (memory_for(256 * GIB, 32, &config).0, 1));
        // The two-node QEMU machine: 1 GiB nodes keep the 64 MiB floor.
        let qemu = [(0, GIB), (1, GIB)];
        assert_eq!(sub_memory_for(&qemu, 1, 1, &config), Some((64 * MIB, 0)));
        assert_eq!(sub_memory_for(&[(0, GIB)], 0, 1, &config), None);
        // `memory` takes the serving node's total from the same walk.
        assert_eq!(total_of(&totals, 2), Some(128 * GIB));
        assert_eq!(total_of(&totals, 3), None);
    }

    #[test]
    fn node_meminfo() {
        let text = "Node 1 MemTotal:        1016028 kB\nNode 1 MemFree:          900000 kB\n";
        assert_eq!(parse_node_total(text), Some(1_016_028 * 1024));
        assert_eq!(parse_node_total("garbage"), None);
    }
}
