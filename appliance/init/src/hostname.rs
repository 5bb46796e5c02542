//! The host name PID 1 sets, first match wins: the `hostname` key (kernel command line,
//! config partition or image, by the layers' precedence), the HOSTNAME field of a static
//! `ip=`, else a default from the first NIC's MAC (`ringstore-525400123456`). The DHCP client
//! does not ask for a host name, so a lease never renames the box.

use crate::cmdline::IpSetting;

/// The default when no NIC has a MAC address.
pub const FALLBACK: &str = "ringstore";

/// Where the name came from (`status`'s `hostname_from`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// The `hostname` configuration key.
    Key,
    /// The HOSTNAME field of `ip=`.
    Ip,
    /// The MAC address of this interface.
    Mac(String),
    /// No key, no `ip=` name, no NIC with a MAC.
    Fallback,
}

impl Source {
    pub fn describe(&self) -> String {
        match self {
            Source::Key => "the hostname key".into(),
            Source::Ip => "ip= HOSTNAME field".into(),
            Source::Mac(nic) => format!("MAC of {nic}"),
            Source::Fallback => "no NIC with a MAC".into(),
        }
    }
}

/// `ringstore-` and the MAC's 12 hex digits.
pub fn from_mac(mac: [u8; 6]) -> String {
    let hex: String = mac.iter().map(|b| format!("{b:02x}")).collect();
    format!("ringstore-{hex}")
}

/// The name to set: `ringstore.hostname` (already checked by the config crate), else `ip=`'s
/// HOSTNAME field if it is a valid host name by the same rule
/// (`ringstore_config::parse_hostname`), else the default from `first_nic` (the first
/// physical Ethernet interface by name, and its MAC).
pub fn chosen(
    config: Option<&ringstore_config::Config>,
    ip: &IpSetting,
    first_nic: Option<(String, [u8; 6])>,
) -> (String, Source) {
    if let Some(name) = config.and_then(|c| c.hostname.clone()) {
        return (name, Source::Key);
    }
    if let IpSetting::Static {
        hostname: Some(name),
        ..
    } = ip
    {
        if let Some(name) = ringstore_config::parse_hostname(name) {
            return (name, Source::Ip);
        }
    }
    match first_nic {
        Some((nic, mac)) => (from_mac(mac), Source::Mac(nic)),
        None => (FALLBACK.to_string(), Source::Fallback),
    }
}

/// The first physical Ethernet interface (by name) that has a MAC address.
fn first_nic() -> Option<(String, [u8; 6])> {
    crate::net::link::ethernet_nics()
        .into_iter()
        .find_map(|nic| crate::net::link::mac_address(&nic).map(|mac| (nic, mac)))
}

/// Sets the chosen name (sethostname), logs what happened and says where it came from.
pub fn apply(config: Option<&ringstore_config::Config>, ip: &IpSetting) -> Source {
    let (name, source) = chosen(config, ip, first_nic());
    match ringstore_sys::set_hostname(&name) {
        Ok(()) => crate::info!("hostname {name} (from {})", source.describe()),
        Err(err) => crate::warn!("sethostname({name}): {err}"),
    }
    source
}

/// The host name as the kernel has it now (for `status`).
pub fn current() -> String {
    ringstore_sys::hostname()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAC: [u8; 6] = [0x3c, 0xec, 0xef, 0x10, 0x00, 0x01];

    fn static_ip(hostname: Option<&str>) -> IpSetting {
        IpSetting::Static {
            client: std::net::Ipv4Addr::new(10, 0, 0, 2),
            gateway: None,
            prefix_len: 24,
            hostname: hostname.map(str::to_string),
            device: None,
        }
    }

    fn name(
        config: Option<&ringstore_config::Config>,
        ip: &IpSetting,
        nic: Option<(String, [u8; 6])>,
    ) -> String {
        chosen(config, ip, nic).0
    }

    #[test]
    fn the_key_wins_over_ip_which_wins_over_the_mac() {
        let nic = || Some(("eth0".to_string(), MAC));
        let config =
            ringstore_config::Config::from_kernel_cmdline("ringstore.hostname=a1").unwrap();
        assert_eq!(
            chosen(Some(&config), &static_ip(Some("b2")), nic()),
            ("a1".to_string(), Source::Key)
        );
        let plain = ringstore_config::Config::default();
        assert_eq!(
            chosen(Some(&plain), &static_ip(Some("b2")), nic()),
            ("b2".to_string(), Source::Ip)
        );
        assert_eq!(name(None, &static_ip(Some("b2")), nic()), "b2");
        // A bad ip= name is passed over: the MAC default, not the bad name.
        assert_eq!(
            chosen(Some(&plain), &static_ip(Some("bad name;")), nic()),
            (
                "ringstore-3cecef100001".to_string(),
                Source::Mac("eth0".into())
            )
        );
        assert_eq!(
            name(Some(&plain), &static_ip(None), nic()),
            "ringstore-3cecef100001"
        );
        assert_eq!(
            name(Some(&plain), &IpSetting::Dhcp { device: None }, nic()),
            "ringstore-3cecef100001"
        );
        assert_eq!(
            chosen(None, &IpSetting::Off, None),
            (FALLBACK.to_string(), Source::Fallback)
        );
        assert!(!current().is_empty());
    }

    #[test]
    fn the_mac_default_is_a_valid_host_name() {
        let name = from_mac([0xff; 6]);
        assert_eq!(name, "ringstore-ffffffffffff");
        assert_eq!(
            ringstore_config::parse_hostname(&name).as_deref(),
            Some(name.as_str())
        );
        assert_eq!(Source::Mac("eth1".into()).describe(), "MAC of eth1");
    }
}
