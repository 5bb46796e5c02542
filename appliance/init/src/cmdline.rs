//! The kernel command line as PID 1 reads it: `ip=` (kernel nfsroot syntax), the PID 1-only key
//! `ringstore.on_fatal`, and the rest of the `ringstore.*` keys for `ringstore_config`.

use std::net::Ipv4Addr;

/// This boot's kernel command line, read from `/proc/cmdline` once (it never changes while
/// the kernel runs; boot, tuning, the update's slot, the RAM tier and kexec all ask). An
/// unreadable file is an error here and the empty line to every later caller: boot stops on
/// it first.
pub fn running() -> Result<&'static str, String> {
    static LINE: std::sync::OnceLock<Result<String, String>> = std::sync::OnceLock::new();
    LINE.get_or_init(|| {
        std::fs::read_to_string("/proc/cmdline").map_err(|e| format!("/proc/cmdline: {e}"))
    })
    .as_deref()
    .map_err(Clone::clone)
}

/// [`running`], or the empty line when `/proc/cmdline` could not be read.
pub fn running_or_empty() -> &'static str {
    running().unwrap_or_default()
}

/// How interfaces get their IPv4 address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IpSetting {
    /// DHCP on every Ethernet interface (or on `device` only).
    Dhcp { device: Option<String> },
    /// `ip=CLIENT::GATEWAY:NETMASK:HOSTNAME:DEVICE:off`.
    Static {
        client: Ipv4Addr,
        gateway: Option<Ipv4Addr>,
        prefix_len: u8,
        hostname: Option<String>,
        device: Option<String>,
    },
    /// `ip=off` / `ip=none`: links up, no address.
    Off,
}

/// What PID 1 does after a fatal error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnFatal {
    /// Log, wait a few seconds, reboot (default: a fleet box comes back by itself).
    Reboot,
    /// Log and stay at the console (debugging).
    Halt,
}

/// The options PID 1 itself owns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitOptions {
    pub ip: IpSetting,
    pub on_fatal: OnFatal,
}

/// A bad `ip=` or `ringstore.on_fatal=` value: key, value, what is allowed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid value {value:?} for {key}: expected {expected}")]
pub struct CmdlineError {
    pub key: &'static str,
    pub value: String,
    pub expected: &'static str,
}

/// The `ringstore.*` keys PID 1 reads itself (not server configuration keys).
pub const INIT_KEYS: &[&str] = &["on_fatal"];

const IP_EXPECTED: &str = "dhcp, off, or CLIENT::GATEWAY:NETMASK:HOSTNAME:DEVICE:off";
const ON_FATAL_EXPECTED: &str = "reboot or halt";

/// Splits the command line into PID 1's options and the text `ringstore_config` should parse
/// (the same command line without the PID 1-only keys).
pub fn split(cmdline: &str) -> Result<(InitOptions, String), CmdlineError> {
    let mut options = InitOptions {
        ip: IpSetting::Dhcp { device: None },
        on_fatal: OnFatal::Reboot,
    };
    let mut rest = Vec::new();
    for token in cmdline.split_whitespace() {
        if let Some(value) = token.strip_prefix("ip=") {
            options.ip = parse_ip(value)?;
        } else if let Some(value) = token
            .strip_prefix("ringstore.on_fatal=")
            .or_else(|| token.strip_prefix("ringstore.on-fatal="))
        {
            options.on_fatal = match value {
                "reboot" => OnFatal::Reboot,
                "halt" => OnFatal::Halt,
                _ => {
                    return Err(CmdlineError {
                        key: "ringstore.on_fatal",
                        value: value.to_string(),
                        expected: ON_FATAL_EXPECTED,
                    })
                }
            };
        } else {
            rest.push(token);
        }
    }
    Ok((options, rest.join(" ")))
}

fn parse_ip(value: &str) -> Result<IpSetting, CmdlineError> {
    let bad = || CmdlineError {
        key: "ip",
        value: value.to_string(),
        expected: IP_EXPECTED,
    };
    match value {
        "dhcp" | "on" | "any" | "both" => return Ok(IpSetting::Dhcp { device: None }),
        "off" | "none" => return Ok(IpSetting::Off),
        _ => {}
    }
    let fields: Vec<&str> = value.split(':').collect();
    if fields.len() < 2 || fields.len() > 10 {
        return Err(bad());
    }
    let field = |i: usize| fields.get(i).copied().filter(|s| !s.is_empty());
    let device = field(5).map(str::to_string);
    match field(6).unwrap_or(if field(0).is_some() { "off" } else { "dhcp" }) {
        "dhcp" | "on" | "any" | "both" => return Ok(IpSetting::Dhcp { device }),
        "off" | "none" | "static" => {}
        _ => return Err(bad()),
    }
    let client: Ipv4Addr = field(0).ok_or_else(bad)?.parse().map_err(|_| bad())?;
    let gateway = match field(2) {
        Some(gw) => Some(gw.parse::<Ipv4Addr>().map_err(|_| bad())?),
        None => None,
    };
    let prefix_len = match field(3) {
        Some(mask) => {
            netmask_prefix(mask.parse::<Ipv4Addr>().map_err(|_| bad())?).ok_or_else(bad)?
        }
        None => default_prefix(client),
    };
    Ok(IpSetting::Static {
        client,
        gateway,
        prefix_len,
        hostname: field(4).map(str::to_string),
        device,
    })
}

/// The prefix length of a contiguous netmask (255.255.255.0 → 24); `None` when not contiguous.
pub fn netmask_prefix(mask: Ipv4Addr) -> Option<u8> {
    let bits = u32::from(mask);
    let ones = bits.leading_ones();
    // At most 32 ones: the conversion cannot fail.
    u8::try_from(ones)
        .ok()
        .filter(|_| bits.checked_shl(ones).unwrap_or(0) == 0)
}

/// The netmask of a prefix length (24 → 255.255.255.0).
pub fn prefix_netmask(prefix_len: u8) -> Ipv4Addr {
    Ipv4Addr::from(
        u32::MAX
            .checked_shl(32 - u32::from(prefix_len.min(32)))
            .unwrap_or(0),
    )
}

fn default_prefix(addr: Ipv4Addr) -> u8 {
    match addr.octets()[0] {
        0..=127 => 8,
        128..=191 => 16,
        _ => 24,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_dhcp_and_other_keys_pass_through() {
        let (opts, rest) = split("console=ttyS0 ringstore.numa=1 panic=-1").unwrap();
        assert_eq!(opts.ip, IpSetting::Dhcp { device: None });
        assert_eq!(opts.on_fatal, OnFatal::Reboot);
        assert_eq!(rest, "console=ttyS0 ringstore.numa=1 panic=-1");
    }

    #[test]
    fn static_ip() {
        let (opts, rest) =
            split("ip=10.1.2.3::10.1.2.1:255.255.255.0:box1:eth1:off ringstore.on_fatal=halt x=1")
                .unwrap();
        assert_eq!(
            opts.ip,
            IpSetting::Static {
                client: Ipv4Addr::new(10, 1, 2, 3),
                gateway: Some(Ipv4Addr::new(10, 1, 2, 1)),
                prefix_len: 24,
                hostname: Some("box1".into()),
                device: Some("eth1".into()),
            }
        );
        assert_eq!(opts.on_fatal, OnFatal::Halt);
        assert_eq!(rest, "x=1");
        // The QEMU scan test's form: no server, no hostname, a /30.
        let (opts, _) = split("ip=10.77.0.2::10.77.0.1:255.255.255.252::eth0:off").unwrap();
        assert_eq!(
            opts.ip,
            IpSetting::Static {
                client: Ipv4Addr::new(10, 77, 0, 2),
                gateway: Some(Ipv4Addr::new(10, 77, 0, 1)),
                prefix_len: 30,
                hostname: None,
                device: Some("eth0".into())
            }
        );
        let (opts, _) = split("ip=192.168.0.9:::::eth0:off").unwrap();
        assert!(matches!(
            opts.ip,
            IpSetting::Static {
                prefix_len: 24,
                gateway: None,
                ..
            }
        ));
    }

    #[test]
    fn dhcp_on_one_device_and_off() {
        assert_eq!(
            split("ip=:::::eth1:dhcp").unwrap().0.ip,
            IpSetting::Dhcp {
                device: Some("eth1".into())
            }
        );
        assert_eq!(split("ip=off").unwrap().0.ip, IpSetting::Off);
    }

    #[test]
    fn bad_values_name_key_value_and_allowed() {
        let err = split("ip=10.0.0.300::::::off").unwrap_err();
        assert_eq!(err.key, "ip");
        assert!(err.to_string().contains("10.0.0.300") && err.to_string().contains("dhcp, off"));
        let err = split("ip=1.2.3.4::1.2.3.1:255.0.255.0::eth0:off").unwrap_err();
        assert_eq!(err.key, "ip");
        let err = split("ringstore.on_fatal=explode").unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid value \"explode\" for ringstore.on_fatal: expected reboot or halt"
        );
    }

    #[test]
    fn netmasks() {
        assert_eq!(netmask_prefix(Ipv4Addr::new(255, 255, 255, 0)), Some(24));
        assert_eq!(netmask_prefix(Ipv4Addr::new(0, 0, 0, 0)), Some(0));
        assert_eq!(netmask_prefix(Ipv4Addr::new(255, 255, 255, 255)), Some(32));
        assert_eq!(netmask_prefix(Ipv4Addr::new(255, 0, 255, 0)), None);
        assert_eq!(prefix_netmask(24), Ipv4Addr::new(255, 255, 255, 0));
        assert_eq!(prefix_netmask(0), Ipv4Addr::new(0, 0, 0, 0));
    }
}
