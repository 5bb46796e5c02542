//! NUMA sub memory (`--sub-memory`, ADR 0035): which nodes get a sub region and whether they
//! can back it, and the background exchange thread that promotes read-hot foreign items,
//! bounded to a fixed fraction of one core of the serving node.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use ringstore_config::{Config, SubMemory};
use ringstore_service::Shared;
use ringstore_store::SubRegion;

use crate::clock::Clock;
use crate::topology::Topology;
use crate::RuntimeError;

/// The exchange runs at most one part in this many of one core (5%), measured in its own
/// thread CPU time: after a step that used `t`, it sleeps at least `t * (SHARE_DIVISOR - 1)`.
pub const SHARE_DIVISOR: u32 = 20;
/// Time between exchange steps when they are cheap.
const PERIOD: Duration = Duration::from_millis(10);
/// Promotions one step may try (each holds one shard lock for one item copy).
const STEP_ITEMS: usize = 256;

/// The sub regions `config` asks for with the serving `node`: `sub_memory` bytes on every
/// other online node with CPUs, bound there by mbind. Refused (a usage error, exit 2) on a
/// one-node machine, unless the test-only simulation stands one region on `node` in for a
/// foreign node, and when a node has less free memory than the size. `sys` is `/sys`.
pub fn sub_regions(
    topology: &Topology,
    node: u32,
    config: &Config,
    sys: &Path,
) -> Result<Vec<SubRegion>, RuntimeError> {
    let size = match config.sub_memory {
        SubMemory::Off => return Ok(Vec::new()),
        // Only the appliance's PID 1 sizes `auto` (init/src/sizing.rs) before it starts us.
        SubMemory::Auto => {
            return Err(RuntimeError::Numa(
                "sub-memory auto is sized by the appliance; give a size (like 4GiB)".into(),
            ))
        }
        SubMemory::Bytes(n) => n,
    };
    let bytes = usize::try_from(size).unwrap_or(usize::MAX);
    let mut nodes: Vec<u32> = topology
        .nodes
        .iter()
        .map(|n| n.id)
        .filter(|&id| id != node)
        .collect();
    if nodes.is_empty() {
        if !config.sub_memory_simulated {
            return Err(RuntimeError::Numa(format!(
                "sub-memory needs another NUMA node; this machine has only node {node}"
            )));
        }
        // Simulation (tests only): the "foreign" region is bound to the serving node itself.
        eprintln!("ringstore: sub-memory SIMULATED: one region on node {node} stands in for a foreign node");
        nodes.push(node);
    }
    for &n in &nodes {
        let free = node_free_bytes(sys, n);
        if free.is_some_and(|f| f < size) {
            return Err(RuntimeError::Numa(format!(
                "NUMA node {n} cannot back sub-memory {} bytes: it has {} bytes free",
                size,
                free.unwrap_or(0)
            )));
        }
    }
    Ok(nodes
        .into_iter()
        .map(|n| SubRegion {
            bytes,
            node: n,
            bind: Some(crate::sys::mbind_bind),
            huge_pages: true,
        })
        .collect())
}

/// `MemFree` of node `n` in bytes, from `sys/devices/system/node/nodeN/meminfo`.
fn node_free_bytes(sys: &Path, n: u32) -> Option<u64> {
    let path = sys.join(format!("devices/system/node/node{n}/meminfo"));
    let text = std::fs::read_to_string(path).ok()?;
    text.lines().find_map(|line| {
        let rest = line.split_once("MemFree:")?.1;
        let kb: u64 = rest.trim().trim_end_matches("kB").trim().parse().ok()?;
        Some(kb.saturating_mul(1024))
    })
}

/// The CPUs the exchange thread may run on: the serving node's CPUs that are neither
/// isolated nor a worker's; else its non-isolated ones (shared with workers); else the
/// machine's non-isolated CPUs. Never an isolated worker core. Empty: leave it unpinned.
pub fn exchange_cpus(topology: &Topology, node: u32, workers: &[usize]) -> Vec<usize> {
    let node_cpus = topology
        .node(node)
        .map(|n| n.cpus.clone())
        .unwrap_or_default();
    let isolated = |c: &usize| topology.isolated.contains(c);
    let spare: Vec<usize> = node_cpus
        .iter()
        .copied()
        .filter(|c| !isolated(c) && !workers.contains(c))
        .collect();
    if !spare.is_empty() {
        return spare;
    }
    let shared: Vec<usize> = node_cpus.iter().copied().filter(|c| !isolated(c)).collect();
    if !shared.is_empty() {
        return shared;
    }
    topology
        .nodes
        .iter()
        .flat_map(|n| n.cpus.iter().copied())
        .filter(|c| !isolated(c))
        .collect()
}

/// The running exchange thread; stopped and joined when dropped.
pub(crate) struct Exchange {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl Exchange {
    /// Starts the exchange over `shared`'s store on `cpus` (none when the store has no sub
    /// regions).
    pub(crate) fn start(
        shared: Arc<Shared>,
        clock: Clock,
        cpus: Vec<usize>,
    ) -> Result<Option<Exchange>, RuntimeError> {
        if shared.store.sub_regions().is_empty() {
            return Ok(None);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::Builder::new()
            .name("ringstore-numa".into())
            .spawn(move || {
                if !cpus.is_empty() {
                    // Best effort: unpinned it still keeps its bound.
                    let _ = crate::sys::set_affinity(&cpus);
                }
                run(&shared, clock, &flag);
            })
            .map_err(|e| RuntimeError::io("spawning the NUMA exchange thread", e))?;
        Ok(Some(Exchange {
            stop,
            handle: Some(handle),
        }))
    }
}

/// Exchange steps until `stop`, each followed by a sleep that keeps the thread's CPU time
/// within one part in [`SHARE_DIVISOR`] of a core.
fn run(shared: &Shared, clock: Clock, stop: &AtomicBool) {
    while !stop.load(Ordering::Acquire) {
        let before = crate::sys::thread_cpu_time();
        shared.store.exchange(clock.now().store, STEP_ITEMS);
        let used = crate::sys::thread_cpu_time().saturating_sub(before);
        shared
            .store
            .add_exchange_cpu(u64::try_from(used.as_micros()).unwrap_or(u64::MAX));
        std::thread::park_timeout(PERIOD.max(used * (SHARE_DIVISOR - 1)));
    }
}

impl Drop for Exchange {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(handle) = self.handle.take() {
            handle.thread().unpark();
            let _ = handle.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::NumaNode;

    fn topology(nodes: &[(u32, &[usize])], isolated: &[usize]) -> Topology {
        Topology {
            nodes: nodes
                .iter()
                .map(|(id, cpus)| NumaNode {
                    id: *id,
                    cpus: cpus.to_vec(),
                })
                .collect(),
            isolated: isolated.to_vec(),
            interfaces: Vec::new(),
        }
    }

    fn fake_sys(free_kb: &[(u32, u64)]) -> tempdir::Dir {
        let dir = tempdir::Dir::new();
        for (n, kb) in free_kb {
            let d = dir.path().join(format!("devices/system/node/node{n}"));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(
                d.join("meminfo"),
                format!("Node {n} MemTotal: 99999999 kB\nNode {n} MemFree:  {kb} kB\n"),
            )
            .unwrap();
        }
        dir
    }

    mod tempdir {
        /// A fresh directory under the system's temp dir, removed on drop.
        pub struct Dir(std::path::PathBuf);
        impl Dir {
            pub fn new() -> Dir {
                use std::sync::atomic::{AtomicU32, Ordering};
                static NEXT: AtomicU32 = AtomicU32::new(0);
                let p = std::env::temp_dir().join(format!(
                    "ringstore-numa-sub-{}-{}",
                    std::process::id(),
                    NEXT.fetch_add(1, Ordering::Relaxed)
                ));
                std::fs::create_dir_all(&p).unwrap();
                Dir(p)
            }
            pub fn path(&self) -> &std::path::Path {
                &self.0
            }
        }
        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    fn config(sub: u64, simulated: bool) -> Config {
        Config {
            sub_memory: if sub == 0 {
                SubMemory::Off
            } else {
                SubMemory::Bytes(sub)
            },
            sub_memory_simulated: simulated,
            numa: ringstore_config::NumaChoice::Node(1),
            ..Config::default()
        }
    }

    #[test]
    fn one_region_per_other_node_each_checked_for_free_memory() {
        let t = topology(&[(0, &[0, 1]), (1, &[2, 3]), (2, &[4])], &[]);
        let sys = fake_sys(&[(0, 1 << 20), (2, 1 << 20)]);
        let regions = sub_regions(&t, 1, &config(32 << 20, false), sys.path()).unwrap();
        let nodes: Vec<u32> = regions.iter().map(|r| r.node).collect();
        assert_eq!(nodes, vec![0, 2]);
        assert!(regions
            .iter()
            .all(|r| r.bytes == 32 << 20 && r.bind.is_some()));
        // Node 2 has 1 GiB free: 2 GiB cannot be backed.
        let err = sub_regions(&t, 1, &config(2 << 30, false), sys.path()).unwrap_err();
        assert!(matches!(err, RuntimeError::Numa(_)));
        assert!(err.to_string().contains("node 0 cannot back"), "{err}");
        assert!(sub_regions(&t, 1, &config(0, false), sys.path())
            .unwrap()
            .is_empty());
        let auto = Config {
            sub_memory: SubMemory::Auto,
            ..config(0, false)
        };
        let err = sub_regions(&t, 1, &auto, sys.path()).unwrap_err();
        assert!(err.to_string().contains("give a size"), "{err}");
    }

    #[test]
    fn a_one_node_machine_is_refused_unless_simulated() {
        let t = topology(&[(0, &[0, 1])], &[]);
        let sys = fake_sys(&[(0, 1 << 20)]);
        let err = sub_regions(&t, 0, &config(32 << 20, false), sys.path()).unwrap_err();
        assert!(err.to_string().contains("only node 0"), "{err}");
        let sim = sub_regions(&t, 0, &config(32 << 20, true), sys.path()).unwrap();
        assert_eq!(sim.len(), 1);
        assert_eq!(sim[0].node, 0, "the simulation binds to the serving node");
    }

    #[test]
    fn the_exchange_never_runs_on_an_isolated_worker_core() {
        let t = topology(&[(0, &[0, 1, 2, 3]), (1, &[4, 5])], &[0, 1]);
        assert_eq!(exchange_cpus(&t, 0, &[0, 1]), vec![2, 3]);
        assert_eq!(
            exchange_cpus(&t, 0, &[0, 1, 2, 3]),
            vec![2, 3],
            "shares non-isolated workers"
        );
        let all_isolated = topology(&[(0, &[0, 1]), (1, &[4, 5])], &[0, 1]);
        assert_eq!(exchange_cpus(&all_isolated, 0, &[0, 1]), vec![4, 5]);
    }
}
