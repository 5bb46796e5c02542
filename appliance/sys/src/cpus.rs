//! CPU lists and CPU placement: the kernel's list syntax (parse and format, one copy for the
//! runtime and PID 1), the hex mask of /proc/irq, thread affinity and the NUMA memory policy.

use std::io;

use rustix::thread::{sched_getaffinity, sched_setaffinity, CpuSet};

/// A range `lo-hi` spanning more CPUs than this is malformed and skipped whole. No kernel
/// has this many CPUs (NR_CPUS tops out at 8192), so a wider range is garbage, and
/// truncating it would invent a plausible-looking list of CPUs that do not exist.
pub const CPULIST_SPAN_MAX: usize = 1 << 16;

/// At most this many CPUs are collected from one list; a part that would take the list past
/// it is skipped. Bounds memory (512 KiB) and time however long a hostile list is.
pub const CPULIST_LEN_MAX: usize = 1 << 16;

/// Parses the kernel's CPU list syntax (`0-3,8,10-11`); sorted, without duplicates.
/// Malformed parts (not numbers, `hi < lo`, a span over [`CPULIST_SPAN_MAX`]) are skipped,
/// as is any part that would take the list past [`CPULIST_LEN_MAX`] CPUs.
pub fn parse_cpulist(text: &str) -> Vec<usize> {
    let mut cpus = Vec::new();
    for part in text
        .trim()
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
    {
        let (lo, hi) = match part.split_once('-') {
            Some((lo, hi)) => match (lo.trim().parse::<usize>(), hi.trim().parse::<usize>()) {
                (Ok(lo), Ok(hi)) if lo <= hi && hi - lo < CPULIST_SPAN_MAX => (lo, hi),
                _ => continue,
            },
            None => match part.parse::<usize>() {
                Ok(cpu) => (cpu, cpu),
                Err(_) => continue,
            },
        };
        if cpus.len() + (hi - lo) < CPULIST_LEN_MAX {
            cpus.extend(lo..=hi);
        }
    }
    cpus.sort_unstable();
    cpus.dedup();
    cpus
}

/// Formats CPUs as a comma list (`0,1,2`): what `stats worker_cpus`, the console and
/// `/proc/irq/N/smp_affinity_list` take.
pub fn format_cpus(cpus: &[usize]) -> String {
    cpus.iter()
        .map(|c| c.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// A CPU set as the kernel's hex mask (`3` for CPUs 0-1), comma-grouped per 32 bits, as
/// `/proc/irq/default_smp_affinity` takes it.
pub fn cpumask_hex(cpus: &[usize]) -> String {
    let words = cpus.iter().max().map_or(1, |m| m / 32 + 1);
    let mut mask = vec![0u32; words];
    for cpu in cpus {
        mask[cpu / 32] |= 1 << (cpu % 32);
    }
    mask.iter()
        .rev()
        .map(|w| format!("{w:08x}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Pins the calling thread to `cpus`; a CPU beyond the affinity mask's size is an error.
pub fn set_affinity(cpus: &[usize]) -> io::Result<()> {
    let mut set = CpuSet::new();
    for &cpu in cpus {
        if cpu >= CpuSet::MAX_CPU {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("CPU {cpu} beyond CPU_SETSIZE"),
            ));
        }
        set.set(cpu);
    }
    // None: the calling thread.
    Ok(sched_setaffinity(None, &set)?)
}

/// CPUs the calling thread may run on (empty if unknown).
pub fn affinity() -> Vec<usize> {
    match sched_getaffinity(None) {
        Ok(set) => (0..CpuSet::MAX_CPU)
            .filter(|&cpu| set.is_set(cpu))
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// `set_mempolicy(MPOL_BIND, {node})` for the calling thread. Raw: rustix has no
/// set_mempolicy wrapper.
pub fn set_mempolicy_bind(node: u32) -> io::Result<()> {
    const MPOL_BIND: libc::c_long = 2;
    const WORDS: usize = 16; // 1024 nodes
    if node as usize >= WORDS * 64 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "node number too large",
        ));
    }
    let mut mask = [0u64; WORDS];
    mask[node as usize / 64] |= 1 << (node % 64);
    // SAFETY: `mask` holds WORDS*64 bits and outlives the call; maxnode is its bit count + 1, as the kernel expects.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_set_mempolicy,
            MPOL_BIND,
            mask.as_ptr(),
            (WORDS * 64 + 1) as libc::c_ulong,
        )
    };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// `mbind(region, MPOL_BIND, {node}, MPOL_MF_MOVE)`: the pages of `region` (page aligned, as a
/// fresh mapping is) come from `node` only, whatever the calling thread's policy; pages
/// already faulted in elsewhere are moved. How the store's sub regions are bound to their
/// node (ADR 0035). Raw: rustix has no mbind wrapper.
pub fn mbind_bind(region: &mut [u8], node: u32) -> io::Result<()> {
    const MPOL_BIND: libc::c_ulong = 2;
    const MPOL_MF_MOVE: libc::c_ulong = 1 << 1;
    const WORDS: usize = 16; // 1024 nodes
    if node as usize >= WORDS * 64 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "node number too large",
        ));
    }
    let mut mask = [0u64; WORDS];
    mask[node as usize / 64] |= 1 << (node % 64);
    // SAFETY: `region` is memory this process owns for the whole call (a unique borrow, so
    // nothing else reads it meanwhile); mbind changes only where its pages live, never their
    // contents. `mask` holds WORDS*64 bits and outlives the call; maxnode is its bit count + 1.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_mbind,
            region.as_mut_ptr(),
            region.len() as libc::c_ulong,
            MPOL_BIND,
            mask.as_ptr(),
            (WORDS * 64 + 1) as libc::c_ulong,
            MPOL_MF_MOVE,
        )
    };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpulists() {
        assert_eq!(parse_cpulist("0-3,8,10-11\n"), vec![0, 1, 2, 3, 8, 10, 11]);
        assert_eq!(parse_cpulist("0-2,5\n"), vec![0, 1, 2, 5]);
        assert_eq!(parse_cpulist(""), Vec::<usize>::new());
        assert_eq!(parse_cpulist("3,1,1"), vec![1, 3]);
        assert_eq!(parse_cpulist("5-2,x,7"), vec![7]);
        assert_eq!(parse_cpulist("x,3"), vec![3]);
        assert_eq!(parse_cpulist(" 1 , 4 - 5 "), vec![1, 4, 5]);
        assert_eq!(format_cpus(&[0, 2, 5]), "0,2,5");
    }

    #[test]
    fn garbage_ranges_are_skipped_not_truncated() {
        assert_eq!(parse_cpulist("0-4294967295"), Vec::<usize>::new());
        assert_eq!(parse_cpulist("0-4294967295,3"), vec![3]);
        assert_eq!(parse_cpulist("0-18446744073709551615"), Vec::<usize>::new());
        assert_eq!(
            parse_cpulist("0-99999999999999999999999"),
            Vec::<usize>::new()
        );
        assert_eq!(
            parse_cpulist("65530-65540"),
            (65530..=65540).collect::<Vec<_>>()
        );
        assert_eq!(parse_cpulist("0-65535").len(), CPULIST_SPAN_MAX);
        assert_eq!(parse_cpulist("0-65536"), Vec::<usize>::new());
    }

    #[test]
    fn a_hostile_list_is_bounded() {
        // A million wide ranges: the list stops growing at CPULIST_LEN_MAX, and parsing
        // does not iterate over the ranges it skips.
        let text = "1000000-1065534,".repeat(1_000_000);
        let started = std::time::Instant::now();
        let cpus = parse_cpulist(&text);
        assert_eq!(cpus, (1_000_000..1_065_535).collect::<Vec<_>>());
        let many = (0..200_000)
            .map(|c| c.to_string())
            .collect::<Vec<_>>()
            .join(",");
        assert_eq!(parse_cpulist(&many).len(), CPULIST_LEN_MAX);
        assert!(started.elapsed() < std::time::Duration::from_secs(10));
    }

    #[test]
    fn cpumasks() {
        assert_eq!(cpumask_hex(&[0, 1]), "00000003");
        assert_eq!(cpumask_hex(&[2, 3]), "0000000c");
        assert_eq!(cpumask_hex(&[0, 33]), "00000002,00000001");
    }

    #[test]
    fn affinity_round_trip() {
        let cpus = affinity();
        assert!(!cpus.is_empty());
        set_affinity(&cpus).unwrap();
        assert!(set_affinity(&[CpuSet::MAX_CPU]).is_err());
    }

    #[test]
    fn mbind_binds_a_fresh_mapping_to_node_0_and_refuses_a_bad_node() {
        let mut map = vec![0u8; 1 << 20];
        let page = 4096;
        let start = map.as_ptr() as usize;
        let aligned = start.next_multiple_of(page) - start;
        let region = &mut map[aligned..aligned + 64 * page];
        mbind_bind(region, 0).expect("node 0 exists on every Linux machine");
        region.fill(7);
        assert!(region.iter().all(|&b| b == 7), "binding keeps the contents");
        assert!(
            mbind_bind(region, 5000).is_err(),
            "a node past the mask is refused"
        );
        assert!(
            mbind_bind(region, 1000).is_err(),
            "a node this machine lacks is refused"
        );
    }
}
