//! NUMA placement: which node serves, which CPUs the workers get, and binding the calling
//! thread's CPUs and memory policy to that node before the store is allocated (the rules are
//! in docs/ARCHITECTURE.md, "NUMA placement").

use std::collections::BTreeSet;
use std::net::IpAddr;

use ringstore_config::NumaChoice;

use crate::sys::format_cpus;
use crate::topology::Topology;
use crate::RuntimeError;

/// Chooses the serving node. `listen_ips` are the IPs the TCP/UDP endpoints bind; a wildcard
/// (0.0.0.0 / ::) means every up Ethernet interface is reached.
///
/// Explicit `--numa N` wins (N must exist). Otherwise a single-node machine serves from its
/// node; on a multi-node machine the node comes from the interfaces' locality, and
/// interfaces on different nodes, an unknown locality or no listening interface are errors
/// that list every interface, its addresses, its node and the usable `--numa` values.
pub fn choose_node(
    topology: &Topology,
    choice: NumaChoice,
    listen_ips: &[IpAddr],
) -> Result<u32, RuntimeError> {
    let usable = || {
        topology
            .nodes
            .iter()
            .map(|n| format!("--numa {}", n.id))
            .collect::<Vec<_>>()
            .join(" or ")
    };
    match choice {
        NumaChoice::Node(id) => match topology.node(id) {
            Some(_) => Ok(id),
            None => Err(RuntimeError::Numa(format!(
                "NUMA node {id} does not exist or has no CPUs; use {}",
                usable()
            ))),
        },
        NumaChoice::Auto if topology.nodes.len() == 1 => Ok(topology.nodes[0].id),
        NumaChoice::Auto => {
            let reached = reached_interfaces(topology, listen_ips);
            let describe = || {
                let all: Vec<String> = topology
                    .interfaces
                    .iter()
                    .filter(|i| i.name != "lo")
                    .map(|i| {
                        let addrs = if i.addrs.is_empty() {
                            "no address".to_string()
                        } else {
                            i.addrs
                                .iter()
                                .map(|a| a.to_string())
                                .collect::<Vec<_>>()
                                .join(" ")
                        };
                        let node = i.numa_node.map_or("unknown".to_string(), |n| n.to_string());
                        let state = if i.up && i.ethernet && i.physical {
                            ""
                        } else {
                            ", not an up physical Ethernet interface"
                        };
                        format!("{} ({addrs}) node {node}{state}", i.name)
                    })
                    .collect();
                format!(
                    "interfaces: {}; choose one with {}",
                    if all.is_empty() {
                        "none".into()
                    } else {
                        all.join("; ")
                    },
                    usable()
                )
            };
            if reached.is_empty() {
                return Err(RuntimeError::Numa(format!(
                    "cannot choose a NUMA node automatically: no up Ethernet interface is reached by the listeners; {}",
                    describe()
                )));
            }
            if reached.iter().any(|i| i.numa_node.is_none()) {
                return Err(RuntimeError::Numa(format!(
                    "cannot choose a NUMA node automatically: an interface has unknown NUMA locality; {}",
                    describe()
                )));
            }
            let nodes: BTreeSet<u32> = reached.iter().filter_map(|i| i.numa_node).collect();
            if nodes.len() > 1 {
                return Err(RuntimeError::Numa(format!(
                    "cannot choose a NUMA node automatically: interfaces are on different nodes; {}",
                    describe()
                )));
            }
            // Not empty: every reached interface (there is one) has a node.
            let Some(&node) = nodes.first() else {
                return Err(RuntimeError::Numa(format!(
                    "cannot choose a NUMA node automatically: no interface has a NUMA node; {}",
                    describe()
                )));
            };
            if topology.node(node).is_none() {
                return Err(RuntimeError::Numa(format!(
                    "cannot choose a NUMA node automatically: the interfaces' node {node} has no CPUs; {}",
                    describe()
                )));
            }
            Ok(node)
        }
    }
}

/// The up physical Ethernet interfaces the listeners reach (all of them for a wildcard).
fn reached_interfaces<'t>(
    topology: &'t Topology,
    listen_ips: &[IpAddr],
) -> Vec<&'t crate::topology::Interface> {
    let wildcard = listen_ips.iter().any(|ip| ip.is_unspecified());
    topology
        .serving_interfaces()
        .filter(|i| wildcard || i.addrs.iter().any(|a| listen_ips.contains(a)))
        .collect()
}

/// `--numa auto` for `ringstore serve`: [`choose_node`], except that on a multi-node machine
/// with no physical Ethernet interface reached by the listeners (a container's veth, a bond, a
/// bridge) the node comes from the CPUs this process may run on (`allowed`, its cpuset): the
/// one node that has any of them, or the one with the most (the lowest id on a tie). The
/// appliance keeps [`choose_node`]'s strict rule for its physical NICs. Returns the node and,
/// for the fallback, the line the log says it with (why, and how to choose another).
pub fn choose_serving_node(
    topology: &Topology,
    choice: NumaChoice,
    listen_ips: &[IpAddr],
    allowed: &[usize],
) -> Result<(u32, Option<String>), RuntimeError> {
    let fallback = choice == NumaChoice::Auto
        && topology.nodes.len() > 1
        && reached_interfaces(topology, listen_ips).is_empty();
    if !fallback {
        return choose_node(topology, choice, listen_ips).map(|node| (node, None));
    }
    let counts: Vec<(u32, usize)> = topology
        .nodes
        .iter()
        .map(|n| {
            let mine = n
                .cpus
                .iter()
                .filter(|c| allowed.is_empty() || allowed.contains(c))
                .count();
            (n.id, mine)
        })
        .filter(|&(_, mine)| mine > 0)
        .collect();
    // The most allowed CPUs; on a tie the first (lowest id: nodes are in id order).
    let Some(&(node, mine)) = counts.iter().rev().max_by_key(|&&(_, mine)| mine) else {
        return choose_node(topology, choice, listen_ips).map(|node| (node, None));
    };
    let spread = counts
        .iter()
        .map(|(id, n)| format!("node {id}: {n}"))
        .collect::<Vec<_>>()
        .join(", ");
    let why = format!(
        "numa auto: no physical Ethernet interface in view (a container's veth, a bond or a bridge); serving from node {node}, which has {mine} of the CPUs this process may use ({spread}); choose another with --numa N"
    );
    Ok((node, Some(why)))
}

/// The CPUs workers run on: the node's CPUs this process may use (isolated CPUs count as
/// usable and come first), `cores` of them (0 = all).
pub fn worker_cpus(
    topology: &Topology,
    node: u32,
    cores: usize,
    allowed: &[usize],
) -> Result<Vec<usize>, RuntimeError> {
    let node_cpus = topology
        .node(node)
        .map(|n| n.cpus.clone())
        .unwrap_or_default();
    let usable: Vec<usize> = node_cpus
        .iter()
        .copied()
        .filter(|c| allowed.is_empty() || allowed.contains(c) || topology.isolated.contains(c))
        .collect();
    let mut ordered: Vec<usize> = usable
        .iter()
        .copied()
        .filter(|c| topology.isolated.contains(c))
        .collect();
    ordered.extend(
        usable
            .iter()
            .copied()
            .filter(|c| !topology.isolated.contains(c)),
    );
    if cores > ordered.len() || ordered.is_empty() {
        return Err(RuntimeError::Cores {
            requested: cores,
            available: ordered.len(),
            node,
            cpus: format_cpus(&usable),
        });
    }
    if cores > 0 {
        ordered.truncate(cores);
    }
    Ok(ordered)
}

/// How the memory policy was set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryBinding {
    /// MPOL_BIND to the node: allocations fail rather than go remote.
    Bound,
    /// One node only: no policy needed.
    SingleNode,
}

/// Pins the calling thread to `cpus`; threads it spawns inherit the mask.
pub fn bind_thread_to_cpus(cpus: &[usize]) -> Result<(), RuntimeError> {
    crate::sys::set_affinity(cpus).map_err(|e| {
        RuntimeError::io(
            format!("sched_setaffinity to CPUs {}", format_cpus(cpus)),
            e,
        )
    })
}

/// Sets the calling thread's default memory policy to the node (inherited by threads spawned later).
pub fn bind_memory(topology: &Topology, node: u32) -> Result<MemoryBinding, RuntimeError> {
    if topology.nodes.len() == 1 {
        return Ok(MemoryBinding::SingleNode);
    }
    crate::sys::set_mempolicy_bind(node)
        .map_err(|e| RuntimeError::io(format!("set_mempolicy(MPOL_BIND, node {node})"), e))?;
    Ok(MemoryBinding::Bound)
}

/// CPUs the calling thread may run on now (empty if unknown): what `worker_cpus` may choose from.
pub fn current_affinity() -> Vec<usize> {
    crate::sys::affinity()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::path::PathBuf;

    /// Builds a fake /sys: nodes (id, cpulist), interfaces (name, numa_node, physical), isolated list.
    pub(crate) fn fake_sysfs(
        tag: &str,
        nodes: &[(u32, &str)],
        ifaces: &[(&str, Option<i32>, bool)],
        isolated: &str,
    ) -> PathBuf {
        let root =
            std::env::temp_dir().join(format!("ringstore-sysfs-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for (id, cpus) in nodes {
            let dir = root.join(format!("devices/system/node/node{id}"));
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("cpulist"), format!("{cpus}\n")).unwrap();
        }
        std::fs::create_dir_all(root.join("devices/system/cpu")).unwrap();
        std::fs::write(
            root.join("devices/system/cpu/isolated"),
            format!("{isolated}\n"),
        )
        .unwrap();
        let lo = root.join("class/net/lo");
        std::fs::create_dir_all(&lo).unwrap();
        std::fs::write(lo.join("operstate"), "unknown\n").unwrap();
        std::fs::write(lo.join("type"), "772\n").unwrap();
        for (name, node, physical) in ifaces {
            let dir = root.join("class/net").join(name);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("operstate"), "up\n").unwrap();
            std::fs::write(dir.join("type"), "1\n").unwrap();
            if *physical {
                std::fs::create_dir_all(dir.join("device")).unwrap();
                if let Some(node) = node {
                    std::fs::write(dir.join("device/numa_node"), format!("{node}\n")).unwrap();
                }
            }
        }
        root
    }

    fn topo(
        tag: &str,
        nodes: &[(u32, &str)],
        ifaces: &[(&str, Option<i32>, bool)],
        isolated: &str,
    ) -> Topology {
        let root = fake_sysfs(tag, nodes, ifaces, isolated);
        let mut t = Topology::read_from(&root).unwrap();
        std::fs::remove_dir_all(root).unwrap();
        for (n, i) in t.interfaces.iter_mut().enumerate() {
            i.addrs = vec![IpAddr::from([10, 0, 0, u8::try_from(n).unwrap()])];
        }
        t
    }

    const ANY: &[IpAddr] = &[IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED)];

    #[test]
    fn explicit_node_must_exist() {
        let t = topo("explicit", &[(0, "0-1"), (1, "2-3")], &[], "");
        assert_eq!(choose_node(&t, NumaChoice::Node(1), ANY).unwrap(), 1);
        let err = choose_node(&t, NumaChoice::Node(5), ANY)
            .unwrap_err()
            .to_string();
        assert!(err.contains("--numa 0 or --numa 1"), "{err}");
    }

    #[test]
    fn single_node_is_node_zero_even_with_unknown_locality() {
        let t = topo("single", &[(0, "0-1")], &[("eth0", Some(-1), true)], "");
        assert_eq!(choose_node(&t, NumaChoice::Auto, ANY).unwrap(), 0);
    }

    #[test]
    fn multi_node_follows_the_nic() {
        let t = topo(
            "follow",
            &[(0, "0-1"), (1, "2-3")],
            &[("eth0", Some(1), true), ("veth9", None, false)],
            "",
        );
        assert_eq!(
            choose_node(&t, NumaChoice::Auto, ANY).unwrap(),
            1,
            "virtual devices are ignored"
        );
    }

    #[test]
    fn multi_node_conflicts_list_every_interface() {
        let t = topo(
            "split",
            &[(0, "0-1"), (1, "2-3")],
            &[("eth0", Some(0), true), ("eth1", Some(1), true)],
            "",
        );
        let err = choose_node(&t, NumaChoice::Auto, ANY).unwrap_err();
        assert!(matches!(err, RuntimeError::Numa(_)));
        let msg = err.to_string();
        for part in [
            "different nodes",
            "eth0 (10.0.0.0) node 0",
            "eth1 (10.0.0.1) node 1",
            "--numa 0 or --numa 1",
        ] {
            assert!(msg.contains(part), "{part:?} missing in {msg}");
        }
        assert!(!msg.contains('\n'));
        let t = topo(
            "unknown",
            &[(0, "0-1"), (1, "2-3")],
            &[("eth0", Some(-1), true)],
            "",
        );
        let msg = choose_node(&t, NumaChoice::Auto, ANY)
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("unknown NUMA locality") && msg.contains("node unknown"),
            "{msg}"
        );
        let t = topo("none", &[(0, "0-1"), (1, "2-3")], &[], "");
        let msg = choose_node(&t, NumaChoice::Auto, ANY)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("no up Ethernet interface"), "{msg}");
    }

    #[test]
    fn specific_listen_address_picks_its_interface() {
        let t = topo(
            "specific",
            &[(0, "0-1"), (1, "2-3")],
            &[("eth0", Some(0), true), ("eth1", Some(1), true)],
            "",
        );
        let eth1 = t
            .interfaces
            .iter()
            .find(|i| i.name == "eth1")
            .unwrap()
            .addrs[0];
        assert_eq!(choose_node(&t, NumaChoice::Auto, &[eth1]).unwrap(), 1);
    }

    #[test]
    fn serve_without_a_physical_nic_chooses_from_its_cpuset() {
        // A two-node host seen from a container: only a veth (no `device` link).
        let t = topo(
            "container",
            &[(0, "0-3"), (1, "4-7")],
            &[("eth0", None, false)],
            "",
        );
        assert!(
            choose_node(&t, NumaChoice::Auto, ANY).is_err(),
            "the appliance's strict rule refuses"
        );
        let (node, why) = choose_serving_node(&t, NumaChoice::Auto, ANY, &[]).unwrap();
        assert_eq!(node, 0, "every CPU allowed: a tie, the lowest id");
        let why = why.expect("the fallback says so");
        assert!(
            why.contains("--numa N") && why.contains("node 0: 4, node 1: 4"),
            "{why}"
        );
        // A cpuset on node 1 only, then one that leans to node 1.
        let pick = |allowed: &[usize]| {
            choose_serving_node(&t, NumaChoice::Auto, ANY, allowed)
                .unwrap()
                .0
        };
        assert_eq!(pick(&[5, 6]), 1);
        assert_eq!(pick(&[0, 4, 5, 6]), 1);
        assert_eq!(pick(&[0, 1, 4]), 0);
        // An explicit node and a physical NIC keep their rules.
        assert_eq!(
            choose_serving_node(&t, NumaChoice::Node(1), ANY, &[0]).unwrap(),
            (1, None)
        );
        let nic = topo(
            "container-nic",
            &[(0, "0-3"), (1, "4-7")],
            &[("eth0", Some(1), true)],
            "",
        );
        assert_eq!(
            choose_serving_node(&nic, NumaChoice::Auto, ANY, &[0, 1]).unwrap(),
            (1, None)
        );
        let single = topo("container-one", &[(0, "0-3")], &[("eth0", None, false)], "");
        assert_eq!(
            choose_serving_node(&single, NumaChoice::Auto, ANY, &[]).unwrap(),
            (0, None)
        );
    }

    #[test]
    fn workers_prefer_isolated_cpus_and_respect_cores() {
        let t = topo("cpus", &[(0, "0-3"), (1, "4-7")], &[], "2-3");
        assert_eq!(
            worker_cpus(&t, 0, 0, &[0, 1, 4, 5, 6, 7]).unwrap(),
            vec![2, 3, 0, 1]
        );
        assert_eq!(worker_cpus(&t, 0, 2, &[]).unwrap(), vec![2, 3]);
        assert_eq!(
            worker_cpus(&t, 1, 0, &[0, 1, 4, 5]).unwrap(),
            vec![4, 5],
            "only allowed CPUs"
        );
        let err = worker_cpus(&t, 1, 9, &[]).unwrap_err();
        assert!(
            matches!(
                err,
                RuntimeError::Cores {
                    requested: 9,
                    available: 4,
                    node: 1,
                    ..
                }
            ),
            "{err}"
        );
    }
}
