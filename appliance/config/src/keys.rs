//! The one table of configuration keys: name, what values are allowed, how a value is applied.

use crate::value::{
    parse_count, parse_endpoint, parse_hostname, parse_networks, parse_size, parse_switch,
};
use crate::{Config, IoRuntime, IoUringSetup, NumaChoice, Placement, TlsVerify};

/// One configuration key.
#[derive(Debug)]
pub struct KeyInfo {
    /// Canonical spelling (dashes).
    pub name: &'static str,
    /// What is allowed, as shown in error messages and `ringstore help`.
    pub expected: &'static str,
    /// One-line description for `ringstore help`.
    pub help: &'static str,
    /// An address key (`false` in TOML means `off`).
    pub endpoint: bool,
    /// Not listed in help (measurement switches).
    pub hidden: bool,
    /// Applies a text value; `Err(())` means the value is not allowed.
    pub apply: fn(&mut Config, &str) -> Result<(), ()>,
}

/// A path, or `off` (`None`); an empty value is refused.
fn path_or_off(v: &str) -> Result<Option<std::path::PathBuf>, ()> {
    match v.trim() {
        "" => Err(()),
        v if v.eq_ignore_ascii_case("off") => Ok(None),
        v => Ok(Some(v.into())),
    }
}

const ENDPOINT: &str = "an address IP:PORT (port 0 = any free port) or off";

/// Every key, in the order `ringstore help` lists them.
pub static KEYS: &[KeyInfo] = &[
    KeyInfo {
        name: "memcache",
        expected: ENDPOINT,
        help: "memcache TCP endpoint (default 0.0.0.0:11211)",
        endpoint: true,
        hidden: false,
        apply: |c, v| parse_endpoint(v).map(|e| c.memcache = e).ok_or(()),
    },
    KeyInfo {
        name: "http",
        expected: ENDPOINT,
        help: "HTTP object API endpoint (default 0.0.0.0:8080)",
        endpoint: true,
        hidden: false,
        apply: |c, v| parse_endpoint(v).map(|e| c.http = e).ok_or(()),
    },
    KeyInfo {
        name: "udp",
        expected: ENDPOINT,
        help: "memcache UDP endpoint (default off)",
        endpoint: true,
        hidden: false,
        apply: |c, v| parse_endpoint(v).map(|e| c.udp = e).ok_or(()),
    },
    KeyInfo {
        name: "udp-allow",
        expected: "a comma list of networks like 10.0.0.0/8,::1/128 (or any)",
        help: "source networks whose memcache UDP datagrams are answered (default any)",
        endpoint: false,
        hidden: false,
        apply: |c, v| parse_networks(v).map(|n| c.udp_allow = n).ok_or(()),
    },
    KeyInfo {
        name: "xdp",
        expected: "a comma list of interface names like eth0,eth1 (or none)",
        help: "serve memcache UDP through AF_XDP on these interfaces (needs udp; default none)",
        endpoint: false,
        hidden: false,
        apply: |c, v| parse_interfaces(v).map(|n| c.xdp = n).ok_or(()),
    },
    KeyInfo {
        name: "cores",
        expected: "a number of worker CPUs from 0 to 4096 (0 = every CPU of the chosen NUMA node)",
        help: "worker threads, one pinned per CPU (default 0 = all CPUs of the node)",
        endpoint: false,
        hidden: false,
        apply: |c, v| match parse_count(v).and_then(|n| usize::try_from(n).ok()) {
            Some(n) if n <= 4096 => {
                c.cores = n;
                Ok(())
            }
            _ => Err(()),
        },
    },
    KeyInfo {
        name: "numa",
        expected: "auto or a NUMA node number like 0",
        help: "NUMA node to serve from (default auto: the node of the network interfaces)",
        endpoint: false,
        hidden: false,
        apply: |c, v| {
            if v.trim().eq_ignore_ascii_case("auto") {
                c.numa = NumaChoice::Auto;
                return Ok(());
            }
            match parse_count(v).and_then(|n| u32::try_from(n).ok()) {
                Some(n) if n < 1024 => {
                    c.numa = NumaChoice::Node(n);
                    Ok(())
                }
                _ => Err(()),
            }
        },
    },
    KeyInfo {
        name: "memory",
        expected: "a size like 64MiB or 4GiB (at least 1MiB)",
        help: "item RAM budget (default 64MiB)",
        endpoint: false,
        hidden: false,
        apply: |c, v| match parse_size(v) {
            Some(n) if n >= 1 << 20 => {
                c.memory = n;
                Ok(())
            }
            _ => Err(()),
        },
    },
    KeyInfo {
        name: "data",
        expected: "a path to a block device or file, or off",
        help: "data device or file for durability (default off: RAM only)",
        endpoint: false,
        hidden: false,
        apply: |c, v| path_or_off(v).map(|p| c.data = p),
    },
    KeyInfo {
        name: "memory-file",
        expected: "a path to a file on tmpfs or hugetlbfs, or off",
        help: "keep the item memory in this file: a clean stop (SIGTERM) seals it and the next start with the same layout resumes with every item (ADR 0052); default off",
        endpoint: false,
        hidden: false,
        apply: |c, v| path_or_off(v).map(|p| c.memory_file = p),
    },
    KeyInfo {
        name: "data-size",
        expected: "a size like 10GiB (at least 64MiB)",
        help: "with data as a file: create it at this size when missing, or extend a blank one (never shrinks, never grows a formatted one)",
        endpoint: false,
        hidden: false,
        apply: |c, v| match parse_size(v) {
            Some(n) if n >= 64 << 20 => {
                c.data_size = Some(n);
                Ok(())
            }
            _ => Err(()),
        },
    },
    KeyInfo {
        name: "data-key",
        expected: "a path to a 32-byte key file (mode 0600), or off",
        help: "seal everything on the data device with this key, AES-256-GCM (default off: in clear); without the key the data cannot be read",
        endpoint: false,
        hidden: false,
        apply: |c, v| path_or_off(v).map(|p| c.data_key = p),
    },
    KeyInfo {
        name: "data-format",
        expected: "auto or force",
        help: "auto: format a blank data device, refuse foreign content; force: format over it",
        endpoint: false,
        hidden: false,
        apply: |c, v| {
            c.data_format = match v.trim().to_ascii_lowercase().as_str() {
                "auto" => crate::DataFormat::Auto,
                "force" => crate::DataFormat::Force,
                _ => return Err(()),
            };
            Ok(())
        },
    },
    KeyInfo {
        name: "data-recover",
        expected: "refuse or salvage",
        help: "damage in acknowledged history found at start: refuse to start (default), or salvage: serve every record that verifies and report the damage (some keys may then answer older values)",
        endpoint: false,
        hidden: false,
        apply: |c, v| {
            c.data_recover = match v.trim().to_ascii_lowercase().as_str() {
                "refuse" => crate::DataRecover::Refuse,
                "salvage" => crate::DataRecover::Salvage,
                _ => return Err(()),
            };
            Ok(())
        },
    },
    KeyInfo {
        name: "data-full",
        expected: "evict or refuse",
        help: "a full data device: evict drops its oldest records as a cache does (default); refuse answers writes with an error until deletes free room, keeping every acknowledged write until it is deleted",
        endpoint: false,
        hidden: false,
        apply: |c, v| {
            c.data_full = match v.trim().to_ascii_lowercase().as_str() {
                "evict" => crate::DataFull::Evict,
                "refuse" => crate::DataFull::Refuse,
                _ => return Err(()),
            };
            Ok(())
        },
    },
    KeyInfo {
        name: "max-conns",
        expected: "a number of connections from 1 to 1048576",
        help: "open connections beyond which new ones are refused (default 4096)",
        endpoint: false,
        hidden: false,
        apply: |c, v| match parse_count(v).and_then(|n| usize::try_from(n).ok()) {
            Some(n) if (1..=1 << 20).contains(&n) => {
                c.max_conns = n;
                Ok(())
            }
            _ => Err(()),
        },
    },
    KeyInfo {
        name: "conn-memory",
        expected: "a size like 64MiB (at least 1MiB)",
        help: "RAM all connections together may hold in requests and replies in flight, beyond 32KiB in and 64KiB out each (default 64MiB)",
        endpoint: false,
        hidden: false,
        apply: |c, v| match parse_size(v) {
            Some(n) if n >= 1 << 20 => {
                c.conn_memory = usize::try_from(n).unwrap_or(usize::MAX);
                Ok(())
            }
            _ => Err(()),
        },
    },
    KeyInfo {
        name: "item-size-max",
        expected: "a size from 1KiB to 1GiB like 1MiB",
        help: "largest value accepted (default 1MiB)",
        endpoint: false,
        hidden: false,
        apply: |c, v| match parse_size(v).and_then(|n| usize::try_from(n).ok()) {
            Some(n) if (1 << 10..=1 << 30).contains(&n) => {
                c.item_size_max = n;
                Ok(())
            }
            _ => Err(()),
        },
    },
    KeyInfo {
        name: "object-size-max",
        expected: "a size from 1MiB to 1TiB like 4GiB",
        help: "largest HTTP object with --data; bodies over item-size-max stream to the device (default 4GiB)",
        endpoint: false,
        hidden: false,
        apply: |c, v| match parse_size(v) {
            Some(n) if (1 << 20..=1 << 40).contains(&n) => {
                c.object_size_max = n;
                Ok(())
            }
            _ => Err(()),
        },
    },
    KeyInfo {
        name: "external-value-min",
        expected: "0 or a size from 1KiB to 1GiB like 64KiB",
        help: "with --data, values of at least this size keep only key and metadata in RAM and are read from the device on access (extstore-like); 0 = off; default 64KiB",
        endpoint: false,
        hidden: false,
        apply: |c, v| match parse_size(v).and_then(|n| usize::try_from(n).ok()) {
            Some(n) if n == 0 || (1 << 10..=1 << 30).contains(&n) => {
                c.external_value_min = n;
                Ok(())
            }
            _ => Err(()),
        },
    },
    KeyInfo {
        name: "idle-timeout",
        expected: "seconds from 0 to 31536000 (0 = never)",
        help: "close connections idle this many seconds (default 0 = never, as memcached)",
        endpoint: false,
        hidden: false,
        apply: |c, v| match parse_count(v) {
            Some(n) if n <= 31_536_000 => {
                c.idle_timeout_secs = n;
                Ok(())
            }
            _ => Err(()),
        },
    },
    KeyInfo {
        name: "request-timeout",
        expected: "seconds from 1 to 3600",
        help: "close a client whose started request is not complete after this many seconds (default 10)",
        endpoint: false,
        hidden: false,
        apply: |c, v| match parse_count(v) {
            Some(n) if (1..=3600).contains(&n) => {
                c.request_timeout_secs = n;
                Ok(())
            }
            _ => Err(()),
        },
    },
    KeyInfo {
        name: "hostname",
        expected: "a host name of at most 64 bytes: dot-separated labels of letters, digits and inner dashes, 63 bytes each",
        help: "host name: PID 1 sets it (sethostname); memcache stats and the console report it (default: the system's)",
        endpoint: false,
        hidden: false,
        apply: |c, v| parse_hostname(v).map(|h| c.hostname = Some(h)).ok_or(()),
    },
    // TLS (ADR 0031).
    KeyInfo {
        name: "memcache-tls",
        expected: ENDPOINT,
        help: "memcache (text, meta, binary) over TLS (default off; needs tls-cert and tls-key)",
        endpoint: true,
        hidden: false,
        apply: |c, v| parse_endpoint(v).map(|e| c.tls.memcache = e).ok_or(()),
    },
    KeyInfo {
        name: "https",
        expected: ENDPOINT,
        help: "HTTP object API over TLS, ALPN http/1.1 (default off; needs tls-cert and tls-key)",
        endpoint: true,
        hidden: false,
        apply: |c, v| parse_endpoint(v).map(|e| c.tls.https = e).ok_or(()),
    },
    KeyInfo {
        name: "tls-only",
        expected: "on or off",
        help: "refuse to start while a plain data listener (memcache, http, udp) is on (default off)",
        endpoint: false,
        hidden: false,
        apply: |c, v| parse_switch(v).map(|on| c.tls.only = on).ok_or(()),
    },
    KeyInfo {
        name: "tls-cert",
        expected: "a path to a PEM certificate chain",
        help: "the TLS listeners' certificate chain, PEM (read at start, on SIGHUP and refresh_certs)",
        endpoint: false,
        hidden: false,
        apply: |c, v| parse_path(v).map(|p| c.tls.cert = Some(p)).ok_or(()),
    },
    KeyInfo {
        name: "tls-key",
        expected: "a path to a PEM private key",
        help: "the certificate's private key, PEM",
        endpoint: false,
        hidden: false,
        apply: |c, v| parse_path(v).map(|p| c.tls.key = Some(p)).ok_or(()),
    },
    KeyInfo {
        name: "tls-ca",
        expected: "a path to PEM CA certificates",
        help: "CAs client certificates (with tls-verify request or require) and a log-sink tls:// receiver are verified against",
        endpoint: false,
        hidden: false,
        apply: |c, v| parse_path(v).map(|p| c.tls.ca = Some(p)).ok_or(()),
    },
    KeyInfo {
        name: "tls-verify",
        expected: "none, request or require",
        help: "client certificates: none, request (a bad one is refused), require (default none)",
        endpoint: false,
        hidden: false,
        apply: |c, v| {
            c.tls.verify = match v.trim() {
                "none" => TlsVerify::None,
                "request" => TlsVerify::Request,
                "require" => TlsVerify::Require,
                _ => return Err(()),
            };
            Ok(())
        },
    },
    KeyInfo {
        name: "tls-handshake-timeout",
        expected: "seconds from 1 to 3600",
        help: "close a TLS connection whose handshake is not done this many seconds after its accept (default 5)",
        endpoint: false,
        hidden: false,
        apply: |c, v| match parse_count(v) {
            Some(n) if (1..=3600).contains(&n) => {
                c.tls_handshake_timeout_secs = n;
                Ok(())
            }
            _ => Err(()),
        },
    },
    KeyInfo {
        name: "tls-min-version",
        expected: "1.2 or 1.3",
        help: "lowest TLS version accepted (default 1.2)",
        endpoint: false,
        hidden: false,
        apply: |c, v| {
            c.tls.min_tls13 = match v.trim() {
                "1.2" => false,
                "1.3" => true,
                _ => return Err(()),
            };
            Ok(())
        },
    },
    KeyInfo {
        name: "auth-file",
        expected: "a path to a file of user:password lines (memcached -Y), or off",
        help: "memcache connections log in first: text set login, binary SASL PLAIN (default off)",
        endpoint: false,
        hidden: false,
        apply: |c, v| path_or_off(v).map(|p| c.auth_file = p),
    },
    KeyInfo {
        name: "http-tokens",
        expected: "a path to a file of NAME SHA256-HEX read|write [KEY-PREFIX] lines, or off",
        help: "HTTP requests need Authorization: Bearer TOKEN (default off)",
        endpoint: false,
        hidden: false,
        apply: |c, v| path_or_off(v).map(|p| c.http_tokens = p),
    },
    KeyInfo {
        name: "io",
        expected: "auto, io_uring or epoll",
        help: "I/O runtime: io_uring, epoll, or auto (io_uring when it can be set up, else epoll; default auto)",
        endpoint: false,
        hidden: false,
        apply: |c, v| {
            c.io = match v.trim() {
                "auto" => IoRuntime::Auto,
                "io_uring" => IoRuntime::IoUring,
                "epoll" => IoRuntime::Epoll,
                _ => return Err(()),
            };
            Ok(())
        },
    },
    KeyInfo {
        name: "placement",
        expected: "acceptor or reuseport",
        help: "connection placement (measurement only)",
        endpoint: false,
        hidden: true,
        apply: |c, v| {
            c.placement = match v.trim() {
                "acceptor" => Placement::Acceptor,
                "reuseport" => Placement::ReusePort,
                _ => return Err(()),
            };
            Ok(())
        },
    },
    KeyInfo {
        name: "io-uring-setup",
        expected: "full, coop or plain",
        help: "io_uring setup flags tried first: full (SINGLE_ISSUER+DEFER_TASKRUN), coop (COOP_TASKRUN), plain (measurement only)",
        endpoint: false,
        hidden: true,
        apply: |c, v| {
            c.tuning.io_uring_setup = match v.trim() {
                "full" => IoUringSetup::Full,
                "coop" => IoUringSetup::Coop,
                "plain" => IoUringSetup::Plain,
                _ => return Err(()),
            };
            Ok(())
        },
    },
    KeyInfo {
        name: "buf-ring",
        expected: "on or off",
        help: "receive through a provided-buffer ring when the kernel has one; off: a buffer per connection (measurement, tests)",
        endpoint: false,
        hidden: true,
        apply: |c, v| parse_switch(v).map(|on| c.tuning.buf_ring = on).ok_or(()),
    },
    KeyInfo {
        name: "tls-kernel-offload",
        expected: "on or off",
        help: "hand finished TLS sessions to kernel TLS where the kernel has it; off: user space always (measurement, tests)",
        endpoint: false,
        hidden: true,
        apply: |c, v| parse_switch(v).map(|on| c.tls.user_space_only = !on).ok_or(()),
    },
    KeyInfo {
        name: "link-recv",
        expected: "on or off",
        help: "link each connection's next receive behind its send (measurement only)",
        endpoint: false,
        hidden: true,
        apply: |c, v| parse_switch(v).map(|on| c.tuning.link_recv = on).ok_or(()),
    },
    KeyInfo {
        name: "poll-first",
        expected: "on or off",
        help: "linked receives poll before they try (measurement only)",
        endpoint: false,
        hidden: true,
        apply: |c, v| parse_switch(v).map(|on| c.tuning.poll_first = on).ok_or(()),
    },
    KeyInfo {
        name: "eventfd-wait",
        expected: "on or off",
        help: "workers wait for completions in poll(2) on an eventfd registered with the ring (at most 1 ms at a time), not in io_uring_enter (measurement only: lets valgrind run the other threads)",
        endpoint: false,
        hidden: true,
        apply: |c, v| parse_switch(v).map(|on| c.tuning.eventfd_wait = on).ok_or(()),
    },
    // NUMA sub memory (issue 23, ADR 0035).
    KeyInfo {
        name: "sub-memory",
        expected: "a size like 32MiB or 4GiB (0 = off), or auto on the appliance, with an explicit --numa NODE",
        help: "item memory on every other online NUMA node, bound there, for items demoted from --memory instead of evicted (default 0 = off; needs --numa NODE); auto on the appliance: each such node's RAM less the reserve the appliance's memory sizing keeps",
        endpoint: false,
        hidden: false,
        apply: |c, v| {
            c.sub_memory = if v.trim().eq_ignore_ascii_case("auto") {
                crate::SubMemory::Auto
            } else {
                match parse_size(v) {
                    Some(0) => crate::SubMemory::Off,
                    Some(n) if n >= 1 << 20 => crate::SubMemory::Bytes(n),
                    _ => return Err(()),
                }
            };
            Ok(())
        },
    },
    KeyInfo {
        name: "sub-memory-simulated",
        expected: "on or off",
        help: "test only: on a one-node machine one sub region on the serving node stands in for a foreign node (a simulation: nothing is remote)",
        endpoint: false,
        hidden: true,
        apply: |c, v| parse_switch(v).map(|on| c.sub_memory_simulated = on).ok_or(()),
    },
    KeyInfo {
        name: "log-sink",
        expected: "udp://HOST:PORT, tcp://HOST:PORT, tls://HOST:PORT or off",
        help: "ship the log to this syslog receiver, RFC 5424 lines (tls:// verified against tls-ca; default off)",
        endpoint: false,
        hidden: false,
        apply: |c, v| crate::parse_log_sink(v).map(|s| c.log_sink = s).ok_or(()),
    },
    // What observing the requests costs can be switched off (issue 33: the bench measures
    // each with and without).
    KeyInfo {
        name: "latency-histograms",
        expected: "on or off",
        help: "record the request latency histograms of /metrics, ringstore_request_duration_seconds (default on)",
        endpoint: false,
        hidden: false,
        apply: |c, v| parse_switch(v).map(|on| c.latency_histograms = on).ok_or(()),
    },
    KeyInfo {
        name: "hotkeys",
        expected: "on or off",
        help: "sample reads and writes into the hot-key sketches of stats hotkeys (default on)",
        endpoint: false,
        hidden: false,
        apply: |c, v| parse_switch(v).map(|on| c.hotkeys = on).ok_or(()),
    },
    KeyInfo {
        name: "hotkeys-sample",
        expected: "a count from 1 to 65536",
        help: "sample one request in N, on average, into the hot-key sketches; 1: every request, exact counts (default 128)",
        endpoint: false,
        hidden: false,
        apply: |c, v| {
            parse_count(v)
                .and_then(|n| u32::try_from(n).ok())
                .filter(|n| (1..=crate::HOTKEYS_SAMPLE_MAX).contains(n))
                .map(|n| c.hotkeys_sample = n)
                .ok_or(())
        },
    },
];

/// The key spelled `canonical` (dashes).
pub fn find(canonical: &str) -> Option<&'static KeyInfo> {
    KEYS.iter().find(|k| k.name == canonical)
}

/// The visible key names, comma separated, for "unknown key" errors.
pub fn known_list() -> String {
    KEYS.iter()
        .filter(|k| !k.hidden)
        .map(|k| k.name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// A non-empty path of at most 4096 bytes without NUL.
fn parse_path(v: &str) -> Option<std::path::PathBuf> {
    let v = v.trim();
    (!v.is_empty() && v.len() <= 4096 && !v.contains('\0')).then(|| v.into())
}

/// Longest interface name Linux accepts (IFNAMSIZ - 1).
const IFNAME_MAX: usize = 15;
/// Most interfaces `xdp` may name.
pub const XDP_INTERFACES_MAX: usize = 16;

/// `eth0,eth1` (or `none`/empty): interface names, each 1-15 bytes of `[A-Za-z0-9._-]`.
fn parse_interfaces(v: &str) -> Option<Vec<String>> {
    let v = v.trim();
    if v.is_empty() || v == "none" {
        return Some(Vec::new());
    }
    let names: Vec<String> = v.split(',').map(|n| n.trim().to_string()).collect();
    let ok = |n: &String| {
        !n.is_empty()
            && n.len() <= IFNAME_MAX
            && n.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
    };
    (names.len() <= XDP_INTERFACES_MAX && names.iter().all(ok)).then_some(names)
}

#[cfg(test)]
mod interface_tests {
    use super::parse_interfaces;

    #[test]
    fn interface_lists_are_bounded_and_checked() {
        assert_eq!(
            parse_interfaces("eth0, veth1"),
            Some(vec!["eth0".into(), "veth1".into()])
        );
        assert_eq!(parse_interfaces("none"), Some(vec![]));
        assert_eq!(parse_interfaces(""), Some(vec![]));
        assert_eq!(parse_interfaces("a,,b"), None);
        assert_eq!(parse_interfaces("sixteen-chars-xx"), None);
        assert_eq!(parse_interfaces("eth0/1"), None);
        let many = vec!["e"; 17].join(",");
        assert_eq!(parse_interfaces(&many), None);
        assert!(parse_interfaces(&vec!["e"; 16].join(",")).is_some());
    }
}
