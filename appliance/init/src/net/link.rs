//! The network interfaces PID 1 configures: names and MACs from sysfs, and (through the
//! classic socket ioctls in `ringstore_sys`, ADR-0006) links up, one IPv4 address per
//! interface, the default route.

use std::net::Ipv4Addr;

/// Names in /sys/class/net, sorted.
pub fn interfaces() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir("/sys/class/net")
        .map(|dir| {
            dir.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// Ethernet interfaces (ARPHRD_ETHER) with a device behind them: the NICs.
pub fn ethernet_nics() -> Vec<String> {
    interfaces()
        .into_iter()
        .filter(|name| {
            let base = format!("/sys/class/net/{name}");
            ringstore_sys::read_trim(format!("{base}/type")).as_deref() == Some("1")
                && std::path::Path::new(&format!("{base}/device")).exists()
        })
        .collect()
}

/// The interface's MAC address from sysfs.
pub fn mac_address(name: &str) -> Option<[u8; 6]> {
    parse_mac(&ringstore_sys::read_trim(format!(
        "/sys/class/net/{name}/address"
    ))?)
}

pub fn parse_mac(text: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = text.trim().split(':');
    for byte in &mut mac {
        *byte = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

pub use ringstore_sys::{add_default_route, set_up};

/// Gives `name` the IPv4 address `addr/prefix_len` (replacing its primary address).
pub fn set_ipv4(name: &str, addr: Ipv4Addr, prefix_len: u8) -> std::io::Result<()> {
    ringstore_sys::set_ipv4(name, addr, crate::cmdline::prefix_netmask(prefix_len))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macs() {
        assert_eq!(
            parse_mac("52:54:00:12:34:56\n"),
            Some([0x52, 0x54, 0, 0x12, 0x34, 0x56])
        );
        assert_eq!(parse_mac("52:54:00:12:34"), None);
        assert_eq!(parse_mac("52:54:00:12:34:56:78"), None);
        assert_eq!(parse_mac("zz:54:00:12:34:56"), None);
    }
}
