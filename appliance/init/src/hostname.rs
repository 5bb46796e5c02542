//! The host name PID 1 sets: `ringstore.hostname=`, else the HOSTNAME field of a static `ip=`.

use crate::cmdline::IpSetting;

/// The name to set, if the command line gives one: `ringstore.hostname` (already checked by
/// the config crate) wins over `ip=`'s HOSTNAME field, which is used only if it is a valid
/// host name by the same rule (`ringstore_config::parse_hostname`).
pub fn chosen(config: Option<&ringstore_config::Config>, ip: &IpSetting) -> Option<String> {
    if let Some(name) = config.and_then(|c| c.hostname.clone()) {
        return Some(name);
    }
    match ip {
        IpSetting::Static {
            hostname: Some(name),
            ..
        } => ringstore_config::parse_hostname(name),
        _ => None,
    }
}

/// Sets the chosen name (sethostname) and logs what happened.
pub fn apply(config: Option<&ringstore_config::Config>, ip: &IpSetting) {
    let Some(name) = chosen(config, ip) else {
        return;
    };
    match ringstore_sys::set_hostname(&name) {
        Ok(()) => crate::info!("hostname {name}"),
        Err(err) => crate::warn!("sethostname({name}): {err}"),
    }
}

/// The host name as the kernel has it now (for `status`).
pub fn current() -> String {
    ringstore_sys::hostname()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn static_ip(hostname: Option<&str>) -> IpSetting {
        IpSetting::Static {
            client: std::net::Ipv4Addr::new(10, 0, 0, 2),
            gateway: None,
            prefix_len: 24,
            hostname: hostname.map(str::to_string),
            device: None,
        }
    }

    #[test]
    fn the_config_key_wins_over_ip_and_bad_ip_names_are_ignored() {
        let config =
            ringstore_config::Config::from_kernel_cmdline("ringstore.hostname=a1").unwrap();
        assert_eq!(
            chosen(Some(&config), &static_ip(Some("b2"))).as_deref(),
            Some("a1")
        );
        let plain = ringstore_config::Config::default();
        assert_eq!(
            chosen(Some(&plain), &static_ip(Some("b2"))).as_deref(),
            Some("b2")
        );
        assert_eq!(chosen(None, &static_ip(Some("b2"))).as_deref(), Some("b2"));
        assert_eq!(chosen(Some(&plain), &static_ip(Some("bad name;"))), None);
        assert_eq!(chosen(Some(&plain), &static_ip(None)), None);
        assert_eq!(
            chosen(Some(&plain), &IpSetting::Dhcp { device: None }),
            None
        );
        assert!(!current().is_empty());
    }
}
