//! Listening sockets from /proc/net/{tcp,tcp6,udp,udp6} for the console's `net`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// Parses the kernel's hex `ADDR:PORT` (address words in host byte order).
pub fn parse_hex_endpoint(text: &str) -> Option<SocketAddr> {
    let (addr, port) = text.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let ip = match addr.len() {
        8 => IpAddr::V4(Ipv4Addr::from(
            u32::from_str_radix(addr, 16).ok()?.to_ne_bytes(),
        )),
        32 => {
            let mut bytes = [0u8; 16];
            for (i, chunk) in bytes.chunks_mut(4).enumerate() {
                chunk.copy_from_slice(
                    &u32::from_str_radix(addr.get(i * 8..i * 8 + 8)?, 16)
                        .ok()?
                        .to_ne_bytes(),
                );
            }
            IpAddr::V6(Ipv6Addr::from(bytes))
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

/// Local endpoints in one /proc/net table whose state is `state` (TCP LISTEN = 0A, UDP unconnected = 07).
pub fn listening(table: &str, state: &str) -> Vec<SocketAddr> {
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let local = fields.nth(1)?;
            let st = fields.nth(1)?;
            (st == state).then(|| parse_hex_endpoint(local)).flatten()
        })
        .collect()
}

/// Every listening TCP and bound UDP socket, as `tcp 0.0.0.0:11211` lines.
pub fn listening_lines() -> Vec<String> {
    let mut out = Vec::new();
    for (file, proto, state) in [
        ("tcp", "tcp", "0A"),
        ("tcp6", "tcp", "0A"),
        ("udp", "udp", "07"),
        ("udp6", "udp", "07"),
    ] {
        let text = std::fs::read_to_string(format!("/proc/net/{file}")).unwrap_or_default();
        out.extend(
            listening(&text, state)
                .into_iter()
                .map(|a| format!("{proto:<4} {a}")),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_net_tables() {
        let tcp = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:2BCB 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0000000000000000 100 0 0 10 0
   1: 0F02000A:2BCB 0202000A:C350 01 00000000:00000000 00:00000000 00000000     0        0 2 1 0000000000000000 100 0 0 10 0
";
        assert_eq!(listening(tcp, "0A"), vec!["0.0.0.0:11211".parse().unwrap()]);
        assert_eq!(
            parse_hex_endpoint("0100007F:1F90"),
            Some("127.0.0.1:8080".parse().unwrap())
        );
        assert_eq!(
            parse_hex_endpoint("00000000000000000000000001000000:0050"),
            Some("[::1]:80".parse().unwrap())
        );
        assert_eq!(parse_hex_endpoint("zz:1"), None);
    }
}
