//! Parsers for the value syntaxes config keys use: sizes, addresses, counts, durations.

use std::net::SocketAddr;

/// Parses `64MiB`, `4GiB`, `512k`, `1048576`. Units are powers of 1024 (memcached style);
/// `k`, `K`, `KB`, `KiB` all mean 1024.
pub fn parse_size(text: &str) -> Option<u64> {
    let text = text.trim();
    let digits_end = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    if digits_end == 0 {
        return None;
    }
    let number: u64 = text[..digits_end].parse().ok()?;
    let unit = text[digits_end..].trim();
    let shift = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return None,
    };
    number.checked_mul(1u64 << shift)
}

/// Parses `IP:PORT` (`[v6]:PORT` for IPv6) or `off`.
pub fn parse_endpoint(text: &str) -> Option<Option<SocketAddr>> {
    let text = text.trim();
    if text.eq_ignore_ascii_case("off") {
        return Some(None);
    }
    text.parse::<SocketAddr>().ok().map(Some)
}

/// Longest host name Linux accepts (`HOST_NAME_MAX`).
pub const HOSTNAME_MAX: usize = 64;

/// Parses a host name (RFC 1123): 1 to [`HOSTNAME_MAX`] bytes of dot-separated labels, each
/// 1 to 63 letters, digits and dashes, neither starting nor ending with a dash.
pub fn parse_hostname(text: &str) -> Option<String> {
    let text = text.trim();
    if text.is_empty() || text.len() > HOSTNAME_MAX {
        return None;
    }
    let label_ok = |l: &str| {
        (1..=63).contains(&l.len())
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    text.split('.').all(label_ok).then(|| text.to_string())
}

/// Parses a decimal count.
pub fn parse_count(text: &str) -> Option<u64> {
    let text = text.trim();
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_in_every_spelling() {
        assert_eq!(parse_size("1048576"), Some(1 << 20));
        assert_eq!(parse_size("64MiB"), Some(64 << 20));
        assert_eq!(parse_size("4GiB"), Some(4 << 30));
        assert_eq!(parse_size("512k"), Some(512 << 10));
        assert_eq!(parse_size("2M"), Some(2 << 20));
        assert_eq!(parse_size("1tb"), Some(1 << 40));
        assert_eq!(parse_size("abc"), None);
        assert_eq!(parse_size("12 parsecs"), None);
        assert_eq!(parse_size(""), None);
        assert_eq!(parse_size("-1"), None);
        assert_eq!(parse_size("99999999999999999999GiB"), None);
        assert_eq!(
            parse_size("17179869184GiB"),
            None,
            "overflow must be rejected"
        );
    }

    #[test]
    fn endpoints() {
        assert_eq!(parse_endpoint("off"), Some(None));
        assert_eq!(parse_endpoint("OFF"), Some(None));
        assert_eq!(
            parse_endpoint("127.0.0.1:0"),
            Some(Some("127.0.0.1:0".parse().unwrap()))
        );
        assert_eq!(
            parse_endpoint("[::1]:11211"),
            Some(Some("[::1]:11211".parse().unwrap()))
        );
        assert_eq!(parse_endpoint("localhost:80"), None);
        assert_eq!(parse_endpoint("1.2.3.4"), None);
    }

    #[test]
    fn counts() {
        assert_eq!(parse_count("42"), Some(42));
        assert_eq!(parse_count("+42"), None);
        assert_eq!(parse_count("4x"), None);
        assert_eq!(parse_count(""), None);
    }
}

/// Parses `10.0.0.0/8,192.168.1.7,::1/128` (a bare address is a single host) or `any`
/// (every source: the empty list). At most 256 networks.
pub fn parse_networks(text: &str) -> Option<Vec<ipnet::IpNet>> {
    let text = text.trim();
    if text.eq_ignore_ascii_case("any") {
        return Some(Vec::new());
    }
    let nets: Option<Vec<ipnet::IpNet>> = text
        .split(',')
        .map(str::trim)
        .map(|part| {
            part.parse::<ipnet::IpNet>().ok().or_else(|| {
                part.parse::<std::net::IpAddr>()
                    .ok()
                    .map(ipnet::IpNet::from)
            })
        })
        .collect();
    nets.filter(|n| !n.is_empty() && n.len() <= 256)
}

#[cfg(test)]
mod network_tests {
    use super::{parse_networks, parse_switch};

    #[test]
    fn switches_parse() {
        assert_eq!(parse_switch(" off "), Some(false));
        assert_eq!(parse_switch("ON"), Some(true));
        assert_eq!(parse_switch("maybe"), None);
    }

    #[test]
    fn networks_parse_and_reject_junk() {
        let nets = parse_networks("10.0.0.0/8, 127.0.0.1,::1/128").unwrap();
        assert_eq!(nets.len(), 3);
        assert!(nets[0].contains(&"10.9.8.7".parse::<std::net::IpAddr>().unwrap()));
        assert!(!nets[1].contains(&"127.0.0.2".parse::<std::net::IpAddr>().unwrap()));
        assert_eq!(parse_networks("any"), Some(Vec::new()));
        for bad in ["", "10.0.0.0/33", "nope", "10.0.0.0/8,", "1.2.3.4/8/9"] {
            assert_eq!(parse_networks(bad), None, "{bad:?}");
        }
    }
}

/// Parses `on`/`off` (also `true`/`false`, `yes`/`no`, `1`/`0`).
pub fn parse_switch(text: &str) -> Option<bool> {
    match text.trim().to_ascii_lowercase().as_str() {
        "on" | "true" | "yes" | "1" => Some(true),
        "off" | "false" | "no" | "0" => Some(false),
        _ => None,
    }
}
