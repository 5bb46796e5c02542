//! Huge-page reservation on the serving node, sized from `ringstore.memory`.

use std::fs;

/// The huge-page size the store's arena uses.
pub const HUGEPAGE_BYTES: u64 = 2 << 20;

/// Pages needed to hold `memory` bytes (rounded up).
pub fn pages_for(memory: u64) -> u64 {
    memory.div_ceil(HUGEPAGE_BYTES)
}

fn node_file(node: u32, file: &str) -> String {
    format!("/sys/devices/system/node/node{node}/hugepages/hugepages-2048kB/{file}")
}

/// Asks the kernel for `pages` 2 MiB pages on `node`; returns how many the node now has
/// (fewer when memory is fragmented or short).
pub fn reserve(node: u32, pages: u64) -> std::io::Result<u64> {
    fs::write(node_file(node, "nr_hugepages"), pages.to_string())?;
    Ok(count(node, "nr_hugepages").unwrap_or(0))
}

/// A node's `nr_hugepages` or `free_hugepages`.
pub fn count(node: u32, file: &str) -> Option<u64> {
    ringstore_sys::read_trim(node_file(node, file))?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_round_up() {
        assert_eq!(pages_for(0), 0);
        assert_eq!(pages_for(1), 1);
        assert_eq!(pages_for(64 << 20), 32);
        assert_eq!(pages_for((64 << 20) + 1), 33);
    }
}
