//! What the machine looks like: NUMA nodes and their CPUs, isolated CPUs, network interfaces
//! and their NUMA locality, read from sysfs. Also used by PID 1 (node choice, huge pages, IRQs).
//! The CPU-list syntax and the sysfs reader are `ringstore-sys`'s.

use std::fs;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use crate::sys::{parse_cpulist, read_trim};

/// One NUMA node and its CPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NumaNode {
    pub id: u32,
    pub cpus: Vec<usize>,
}

/// One network interface as seen in /sys/class/net.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interface {
    pub name: String,
    /// Its IP addresses (from getifaddrs; empty when read from a fake sysfs).
    pub addrs: Vec<IpAddr>,
    /// `operstate` is `up` (or `unknown` with carrier, as virtio reports).
    pub up: bool,
    /// ARPHRD_ETHER (type 1).
    pub ethernet: bool,
    /// Has a `device` link: a real (or emulated) NIC, not a virtual device like lo, bridges, ifb.
    pub physical: bool,
    /// `device/numa_node`; `None` when the kernel reports -1 or nothing.
    pub numa_node: Option<u32>,
}

/// NUMA nodes, isolated CPUs and interfaces of this machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    /// Online nodes with at least one CPU, ascending. Never empty: a kernel without NUMA
    /// support is reported as node 0 holding every online CPU.
    pub nodes: Vec<NumaNode>,
    /// `/sys/devices/system/cpu/isolated` (isolcpus=).
    pub isolated: Vec<usize>,
    pub interfaces: Vec<Interface>,
}

impl Topology {
    /// Reads the running machine's topology (interface addresses included).
    pub fn read() -> std::io::Result<Topology> {
        let mut topology = Topology::read_from(Path::new("/sys"))?;
        let addrs = crate::sys::interface_addresses();
        for iface in &mut topology.interfaces {
            iface.addrs = addrs
                .iter()
                .filter(|(name, _)| *name == iface.name)
                .map(|(_, ip)| *ip)
                .collect();
        }
        Ok(topology)
    }

    /// Reads a sysfs tree rooted at `sys` (tests pass a fake one). Interface addresses are left empty.
    pub fn read_from(sys: &Path) -> std::io::Result<Topology> {
        let mut nodes = Vec::new();
        let node_dir = sys.join("devices/system/node");
        if let Ok(entries) = fs::read_dir(&node_dir) {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                let Some(id) = name
                    .strip_prefix("node")
                    .and_then(|n| n.parse::<u32>().ok())
                else {
                    continue;
                };
                let cpus = read_trim(entry.path().join("cpulist"))
                    .map(|s| parse_cpulist(&s))
                    .unwrap_or_default();
                if !cpus.is_empty() {
                    nodes.push(NumaNode { id, cpus });
                }
            }
        }
        nodes.sort_by_key(|n| n.id);
        if nodes.is_empty() {
            let online = read_trim(sys.join("devices/system/cpu/online"))
                .map(|s| parse_cpulist(&s))
                .unwrap_or_default();
            let cpus = if online.is_empty() {
                (0..std::thread::available_parallelism().map_or(1, |n| n.get())).collect()
            } else {
                online
            };
            nodes.push(NumaNode { id: 0, cpus });
        }
        let isolated = read_trim(sys.join("devices/system/cpu/isolated"))
            .map(|s| parse_cpulist(&s))
            .unwrap_or_default();
        let mut interfaces = Vec::new();
        if let Ok(entries) = fs::read_dir(sys.join("class/net")) {
            for entry in entries.flatten() {
                interfaces.push(read_interface(
                    &entry.path(),
                    entry.file_name().to_string_lossy().into_owned(),
                ));
            }
        }
        interfaces.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(Topology {
            nodes,
            isolated,
            interfaces,
        })
    }

    /// The node with id `id`.
    pub fn node(&self, id: u32) -> Option<&NumaNode> {
        self.nodes.iter().find(|n| n.id == id)
    }

    /// Up, physical Ethernet interfaces: the ones whose NUMA locality `numa::choose_node`
    /// looks at when `--numa auto` picks the serving node.
    pub fn serving_interfaces(&self) -> impl Iterator<Item = &Interface> {
        self.interfaces
            .iter()
            .filter(|i| i.up && i.ethernet && i.physical)
    }
}

fn read_interface(dir: &Path, name: String) -> Interface {
    let operstate = read_trim(dir.join("operstate")).unwrap_or_default();
    let carrier = read_trim(dir.join("carrier")).is_some_and(|c| c == "1");
    let up = operstate == "up" || (operstate == "unknown" && carrier);
    let ethernet = read_trim(dir.join("type")).is_some_and(|t| t == "1");
    let device: PathBuf = dir.join("device");
    let physical = device.exists();
    // A virtio NIC's `device` is the virtio device; its PCI function (the parent) has numa_node.
    let numa_node = read_trim(device.join("numa_node"))
        .or_else(|| read_trim(device.join("../numa_node")))
        .and_then(|n| n.parse::<i64>().ok())
        .and_then(|n| u32::try_from(n).ok());
    Interface {
        name,
        addrs: Vec::new(),
        up,
        ethernet,
        physical,
        numa_node,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_fake_sysfs() {
        let root = crate::numa::tests::fake_sysfs(
            "read",
            &[(0, "0-1"), (1, "2-3")],
            &[("eth0", Some(1), true)],
            "3",
        );
        let topo = Topology::read_from(&root).unwrap();
        assert_eq!(
            topo.nodes,
            vec![
                NumaNode {
                    id: 0,
                    cpus: vec![0, 1]
                },
                NumaNode {
                    id: 1,
                    cpus: vec![2, 3]
                }
            ]
        );
        assert_eq!(topo.isolated, vec![3]);
        let eth0 = topo.interfaces.iter().find(|i| i.name == "eth0").unwrap();
        assert!(eth0.up && eth0.ethernet && eth0.physical);
        assert_eq!(eth0.numa_node, Some(1));
        let lo = topo.interfaces.iter().find(|i| i.name == "lo").unwrap();
        assert!(!lo.physical, "lo has no device link");
        assert_eq!(topo.serving_interfaces().count(), 1);
        std::fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn reads_this_machine() {
        let topo = Topology::read().unwrap();
        assert!(!topo.nodes.is_empty());
        assert!(topo.nodes.iter().all(|n| !n.cpus.is_empty()));
    }
}
