//! The `numa_maps` check of `tuning` (ADR 0035): with `ringstore.sub_memory`, every page of
//! each item memory region (the local arena and one sub region per other node) must be on
//! that region's node. [`count`] reads the pages per node (`N0=… N1=…`) of the mappings in
//! `/proc/self/numa_maps` that overlap a region's address ranges (their ends come from
//! `/proc/self/maps`, which lists the same mappings); [`checks`] reports any page elsewhere.

use std::collections::HashMap;

use super::{check, Check};
use crate::plane::MemoryRegion;

/// The pages found in one region's mappings, in bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RegionPages {
    pub node: u32,
    /// `local` or `sub`.
    pub kind: &'static str,
    pub bytes: u64,
    /// Bytes of the region handed to shards (segments in use).
    pub used_bytes: u64,
    /// Bytes of resident pages on `node`, and on other nodes as `(node, bytes)`.
    pub on_node: u64,
    pub elsewhere: Vec<(u32, u64)>,
    /// Bytes of the overlapping mappings outside the region (a mapping the kernel merged
    /// with a neighbour): their pages are counted too.
    pub shared_bytes: u64,
}

/// One `numa_maps` line: where its mapping starts and its resident bytes per node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MappingPages {
    pub start: u64,
    pub per_node: Vec<(u32, u64)>,
}

/// Parses one `numa_maps` line (`7f…000 bind:1 anon=512 N1=500 N0=12 kernelpagesize_kB=4`):
/// the `Nn=pages` counts are in pages of `kernelpagesize_kB` (4 KiB for anonymous and
/// transparent huge pages, 2048 for hugetlb), turned into bytes here.
pub fn parse_line(line: &str) -> Option<MappingPages> {
    let mut fields = line.split_whitespace();
    let start = u64::from_str_radix(fields.next()?, 16).ok()?;
    let mut page_kib = 4;
    let mut pages = Vec::new();
    for f in fields {
        if let Some(kib) = f.strip_prefix("kernelpagesize_kB=") {
            page_kib = kib.parse().ok()?;
        } else if let Some((n, count)) = f.strip_prefix('N').and_then(|f| f.split_once('=')) {
            if let (Ok(n), Ok(count)) = (n.parse::<u32>(), count.parse::<u64>()) {
                pages.push((n, count));
            }
        }
    }
    let per_node = pages
        .into_iter()
        .map(|(n, count)| (n, count * page_kib * 1024))
        .collect();
    Some(MappingPages { start, per_node })
}

/// The end of every mapping by its start, from `/proc/self/maps` (`start-end perms …`).
pub fn mapping_ends(maps: &str) -> HashMap<u64, u64> {
    maps.lines()
        .filter_map(|l| {
            let (start, end) = l.split_whitespace().next()?.split_once('-')?;
            let start = u64::from_str_radix(start, 16).ok()?;
            Some((start, u64::from_str_radix(end, 16).ok()?))
        })
        .collect()
}

/// For each region, the pages per node of the mappings that overlap its address ranges.
pub fn count(numa_maps: &str, maps: &str, regions: &[MemoryRegion]) -> Vec<RegionPages> {
    let ends = mapping_ends(maps);
    let mappings: Vec<(u64, u64, MappingPages)> = numa_maps
        .lines()
        .filter_map(parse_line)
        .filter_map(|m| Some((m.start, *ends.get(&m.start)?, m)))
        .collect();
    regions
        .iter()
        .map(|region| region_pages(region, &mappings))
        .collect()
}

fn region_pages(region: &MemoryRegion, mappings: &[(u64, u64, MappingPages)]) -> RegionPages {
    let mut r = RegionPages {
        node: region.node,
        kind: region.kind,
        bytes: region.bytes,
        used_bytes: region.used_bytes,
        ..RegionPages::default()
    };
    for (start, end, m) in mappings {
        let inside: u64 = region
            .spans
            .iter()
            .map(|&(s, len)| (s + len).min(*end).saturating_sub(s.max(*start)))
            .sum();
        if inside == 0 {
            continue;
        }
        r.shared_bytes += (end - start) - inside;
        for &(n, bytes) in &m.per_node {
            if n == region.node {
                r.on_node += bytes;
            } else if let Some(e) = r.elsewhere.iter_mut().find(|e| e.0 == n) {
                e.1 += bytes;
            } else {
                r.elsewhere.push((n, bytes));
            }
        }
    }
    r.elsewhere.sort_unstable();
    r
}

fn kib(bytes: u64) -> String {
    format!("{} KiB", bytes >> 10)
}

/// One check per region: a difference when any of its pages is on another node, or when a
/// region in use shows no resident page at all (its mapping was not found).
pub fn checks(regions: &[RegionPages]) -> Vec<Check> {
    regions.iter().map(region_check).collect()
}

fn region_check(r: &RegionPages) -> Check {
    let off: u64 = r.elsewhere.iter().map(|e| e.1).sum();
    let missing = r.used_bytes > 0 && r.on_node == 0 && off == 0;
    let mut actual = format!("{} on node {}", kib(r.on_node), r.node);
    for &(n, bytes) in &r.elsewhere {
        actual.push_str(&format!(", {} on node {n}", kib(bytes)));
    }
    let mut c = check(
        "numa_maps",
        format!("{} region node {}", r.kind, r.node),
        format!("every page on node {}", r.node),
        actual,
        off > 0 || missing,
    );
    let mut notes = vec![format!(
        "{} of {} MiB in use",
        r.used_bytes >> 20,
        r.bytes >> 20
    )];
    if missing {
        notes.push("no resident page of it in /proc/self/numa_maps".into());
    }
    if r.shared_bytes > 0 {
        notes.push(format!(
            "its mappings hold {} outside the region, counted too",
            kib(r.shared_bytes)
        ));
    }
    c.note = Some(notes.join("; "));
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A two-node guest: the local arena on node 1 (thread policy, THP), the sub region
    /// mbind-bound to node 0, 12 of its pages wrongly on node 1, a heap mapping in between.
    const NUMA_MAPS: &str = "\
55d4c0a00000 default heap anon=33 dirty=33 N0=20 N1=13 kernelpagesize_kB=4
7f3a40000000 default anon=8192 dirty=8192 active=0 N1=8192 kernelpagesize_kB=4
7f3a42000000 bind:0 anon=6000 dirty=6000 N0=5988 N1=12 kernelpagesize_kB=4
7f3a44000000 default file=/init mapped=3 N0=3 kernelpagesize_kB=4
7f3b00000000 default huge anon=4 dirty=4 N1=4 kernelpagesize_kB=2048
";
    const MAPS: &str = "\
55d4c0a00000-55d4c0a21000 rw-p 00000000 00:00 0                          [heap]
7f3a40000000-7f3a42000000 rw-p 00000000 00:00 0
7f3a42000000-7f3a44000000 rw-p 00000000 00:00 0
7f3a44000000-7f3a44003000 r-xp 00000000 00:02 11                         /init
7f3b00000000-7f3b00800000 rw-p 00000000 00:0f 1028                       /anon_hugepage (deleted)
";

    fn region(node: u32, kind: &'static str, start: u64, bytes: u64) -> MemoryRegion {
        MemoryRegion {
            node,
            kind,
            bytes,
            used_bytes: bytes / 2,
            spans: vec![(start, bytes)],
        }
    }

    #[test]
    fn parses_pages_per_node_in_bytes() {
        let m = parse_line("7f3a42000000 bind:0 anon=6000 N0=5988 N1=12 kernelpagesize_kB=4");
        assert_eq!(
            m,
            Some(MappingPages {
                start: 0x7f3a_4200_0000,
                per_node: vec![(0, 5988 * 4096), (1, 12 * 4096)],
            })
        );
        let huge = parse_line("7f3b00000000 default huge anon=4 N1=4 kernelpagesize_kB=2048");
        assert_eq!(huge.map(|m| m.per_node), Some(vec![(1, 4 << 21)]));
        assert_eq!(parse_line(""), None);
    }

    #[test]
    fn pages_on_the_wrong_node_are_a_difference() {
        let regions = [
            region(1, "local", 0x7f3a_4000_0000, 32 << 20),
            region(0, "sub", 0x7f3a_4200_0000, 32 << 20),
        ];
        let r = count(NUMA_MAPS, MAPS, &regions);
        assert_eq!((r[0].on_node, r[0].elsewhere.clone()), (32 << 20, vec![]));
        assert_eq!(r[1].on_node, 5988 * 4096);
        assert_eq!(r[1].elsewhere, vec![(1, 12 * 4096)]);
        let c = checks(&r);
        assert!(!c[0].difference, "{:?}", c[0]);
        assert!(c[1].difference, "12 pages of node 0's region are on node 1");
        assert_eq!(c[1].subject, "sub region node 0");
        assert_eq!(c[1].actual, "23952 KiB on node 0, 48 KiB on node 1");
    }

    #[test]
    fn hugetlb_pages_and_a_region_in_two_spans_are_counted() {
        let mut local = region(1, "local", 0x7f3b_0000_0000, 8 << 20);
        local.spans.insert(0, (0x7f3a_4000_0000, 32 << 20));
        let r = count(NUMA_MAPS, MAPS, &[local]);
        assert_eq!(r[0].on_node, (32 << 20) + (8 << 20));
        assert!(!checks(&r)[0].difference);
    }

    #[test]
    fn a_region_in_use_without_pages_or_sharing_a_mapping_is_reported() {
        let gone = region(0, "sub", 0x7000_0000_0000, 32 << 20);
        let part = region(1, "local", 0x7f3a_4100_0000, 16 << 20);
        let r = count(NUMA_MAPS, MAPS, &[gone, part]);
        let c = checks(&r);
        assert!(c[0].difference, "in use but not found: {:?}", c[0]);
        assert_eq!(
            r[1].shared_bytes,
            16 << 20,
            "half of the mapping is outside"
        );
        assert!(c[1].note.as_deref().is_some_and(|n| n.contains("outside")));
    }
}
