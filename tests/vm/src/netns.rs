//! A network namespace of our own for a QEMU test: a tap the guest's NIC attaches to, with the
//! peer's address on it, so traffic between the test and the guest never leaves the namespace.
//! Dropping it deletes the tap and the namespace (after the Vm inside it is gone).

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result};

/// Prefix of the namespaces these tests create; the rest is the xtask's pid.
const PREFIX: &str = "ringstore-scan-";

/// A namespace `ringstore-scan-PID` with a persistent tap in it.
pub struct Netns {
    name: String,
    tap: Option<String>,
}

pub(crate) use ringstore_testkit::ip;

impl Netns {
    /// Creates `ringstore-scan-PID` (removing ones left by xtask runs that are gone) with `lo` up.
    pub fn create() -> Result<Netns> {
        remove_stale();
        let name = format!("{PREFIX}{}", std::process::id());
        let _ = ip(&["netns", "del", &name]);
        ip(&["netns", "add", &name])
            .context("creating a network namespace (needs root / CAP_SYS_ADMIN)")?;
        let netns = Netns { name, tap: None };
        netns.ip(&["link", "set", "lo", "up"])?;
        Ok(netns)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The namespace file setns(2) takes.
    pub fn path(&self) -> PathBuf {
        PathBuf::from("/run/netns").join(&self.name)
    }

    /// `ip -n NAME ARGS...`.
    pub fn ip(&self, args: &[&str]) -> Result<()> {
        let mut all = vec!["-n", self.name.as_str()];
        all.extend_from_slice(args);
        ip(&all)
    }

    /// A persistent tap `tap` with `peer/prefix_len` and the link-local `fe80::1/64` on it
    /// (no duplicate address detection, so it is usable at once), up (no carrier until QEMU
    /// attaches). Returns the tap's interface index, the scope of IPv6 link-local addresses on it.
    pub fn add_tap(&mut self, tap: &str, peer: Ipv4Addr, prefix_len: u8) -> Result<u32> {
        self.add_tap_with(tap, peer, prefix_len, false)
    }

    /// [`Netns::add_tap`], as a `multi_queue` tap when `multi_queue` (for a multiqueue
    /// virtio-net, profile key `queues`).
    pub fn add_tap_with(
        &mut self,
        tap: &str,
        peer: Ipv4Addr,
        prefix_len: u8,
        multi_queue: bool,
    ) -> Result<u32> {
        let mut add = vec!["tuntap", "add", "dev", tap, "mode", "tap"];
        if multi_queue {
            add.push("multi_queue");
        }
        self.ip(&add)?;
        self.tap = Some(tap.to_string());
        self.ip(&["addr", "add", &format!("{peer}/{prefix_len}"), "dev", tap])?;
        self.ip(&["addr", "add", "fe80::1/64", "dev", tap, "nodad"])?;
        self.ip(&["link", "set", tap, "up"])?;
        let out = Command::new("ip")
            .args(["-n", &self.name, "-o", "link", "show", "dev", tap])
            .output()
            .context("running ip")?;
        let text = String::from_utf8_lossy(&out.stdout);
        text.split(':')
            .next()
            .and_then(|n| n.trim().parse().ok())
            .with_context(|| format!("no interface index for {tap} in {text:?}"))
    }

    /// `program` run inside the namespace (`ip netns exec` execs it, so the child is `program`).
    pub fn command(&self, program: &str) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.name, program]);
        command
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if let Some(tap) = self.tap.take() {
            let _ = self.ip(&["link", "del", &tap]);
        }
        let _ = ip(&["netns", "del", &self.name]);
    }
}

/// Deletes `ringstore-scan-PID` namespaces whose xtask process no longer runs.
fn remove_stale() {
    let Ok(dir) = std::fs::read_dir("/run/netns") else {
        return;
    };
    for entry in dir.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix(PREFIX)
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if pid != std::process::id() && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = ip(&["netns", "del", &name]);
        }
    }
}
