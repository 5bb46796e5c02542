//! `log-sink`: where the log goes off the box, `udp://HOST:PORT`, `tcp://HOST:PORT` or
//! `tls://HOST:PORT` (ADR 0045). Parsed by hand, bounded, and property-tested below.

use std::fmt;

use crate::value::parse_hostname;

/// How lines travel to the syslog receiver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogTransport {
    /// RFC 5426: one line per datagram.
    Udp,
    /// RFC 6587 octet counting over TCP.
    Tcp,
    /// RFC 5425: octet counting over TLS; the receiver's certificate is verified against
    /// `tls-ca`.
    Tls,
}

/// A syslog receiver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogSink {
    pub transport: LogTransport,
    /// An IP address (IPv6 without brackets) or a host name.
    pub host: String,
    pub port: u16,
}

impl LogSink {
    /// `HOST:PORT` for name resolution (`[v6]:PORT` for an IPv6 address).
    pub fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

impl fmt::Display for LogSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = match self.transport {
            LogTransport::Udp => "udp",
            LogTransport::Tcp => "tcp",
            LogTransport::Tls => "tls",
        };
        write!(f, "{scheme}://{}", self.authority())
    }
}

/// Longest `log-sink` value.
const LOG_SINK_MAX: usize = 300;

/// Parses `udp://HOST:PORT`, `tcp://HOST:PORT`, `tls://HOST:PORT` (HOST an IPv4 address,
/// `[IPv6]` or a host name; PORT 1-65535) or `off`.
pub fn parse_log_sink(text: &str) -> Option<Option<LogSink>> {
    let text = text.trim();
    if text.eq_ignore_ascii_case("off") {
        return Some(None);
    }
    if text.len() > LOG_SINK_MAX {
        return None;
    }
    let (scheme, rest) = text.split_once("://")?;
    let transport = match scheme.to_ascii_lowercase().as_str() {
        "udp" => LogTransport::Udp,
        "tcp" => LogTransport::Tcp,
        "tls" => LogTransport::Tls,
        _ => return None,
    };
    let (host, port) = rest.rsplit_once(':')?;
    if port.is_empty() || port.len() > 5 || !port.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let port: u16 = port.parse().ok().filter(|p| *p != 0)?;
    let host = if let Some(v6) = host.strip_prefix('[') {
        v6.strip_suffix(']')?
            .parse::<std::net::Ipv6Addr>()
            .ok()?
            .to_string()
    } else if host.parse::<std::net::Ipv4Addr>().is_ok() {
        host.to_string()
    } else {
        parse_hostname(host)?
    };
    Some(Some(LogSink {
        transport,
        host,
        port,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_three_schemes_and_off() {
        let sink = parse_log_sink("udp://10.0.2.2:514").unwrap().unwrap();
        assert_eq!(sink.transport, LogTransport::Udp);
        assert_eq!(sink.authority(), "10.0.2.2:514");
        let sink = parse_log_sink("TCP://logs.example.com:6514")
            .unwrap()
            .unwrap();
        assert_eq!(sink.transport, LogTransport::Tcp);
        assert_eq!(sink.host, "logs.example.com");
        let sink = parse_log_sink("tls://[::1]:6514").unwrap().unwrap();
        assert_eq!(
            (sink.transport, sink.host.as_str()),
            (LogTransport::Tls, "::1")
        );
        assert_eq!(sink.to_string(), "tls://[::1]:6514");
        assert_eq!(parse_log_sink("off"), Some(None));
    }

    #[test]
    fn malformed_values_are_refused() {
        for bad in [
            "",
            "udp://",
            "udp://host",
            "udp://host:0",
            "udp://host:65536",
            "udp://host:+1",
            "http://host:80",
            "udp://::1:514",
            "udp://[::1:514",
            "udp://ho st:514",
            "udp//host:514",
            "udp://:514",
        ] {
            assert_eq!(parse_log_sink(bad), None, "{bad:?}");
        }
        assert_eq!(
            parse_log_sink(&format!("udp://{}:1", "a".repeat(400))),
            None
        );
    }

    proptest! {
        #[test]
        fn any_text_parses_or_is_refused_and_a_parsed_sink_prints_back(text in ".{0,80}") {
            if let Some(Some(sink)) = parse_log_sink(&text) {
                prop_assert_eq!(parse_log_sink(&sink.to_string()), Some(Some(sink)));
            }
        }

        #[test]
        fn every_printed_sink_parses_back(
            scheme in prop_oneof!["udp", "tcp", "tls"],
            host in "[a-z]([a-z0-9-]{0,9}[a-z0-9])?(\\.[a-z][a-z0-9]{0,5}){0,3}",
            port in 1u16..,
        ) {
            let text = format!("{scheme}://{host}:{port}");
            let sink = parse_log_sink(&text).flatten();
            prop_assert!(sink.is_some(), "{}", text);
            prop_assert_eq!(sink.map(|s| s.to_string()), Some(text));
        }
    }
}
