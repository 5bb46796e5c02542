//! Configuration keys shared by `ringstore serve` flags, the TOML file and the kernel command line.
//!
//! One table of keys; three front ends (`--key value`, `key = value` in TOML,
//! `ringstore.key=value` on the kernel command line). A bad value is reported with the
//! key, the value and what is allowed.
#![forbid(unsafe_code)]

use std::net::SocketAddr;

/// Which NUMA node to serve from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NumaChoice {
    /// From the locality of the up Ethernet interfaces (ADR-0018 rules).
    #[default]
    Auto,
    Node(u32),
}

/// The whole configuration of a serving ringstore.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// `memcache`: TCP endpoint; `None` = off. Default 0.0.0.0:11211.
    pub memcache: Option<SocketAddr>,
    /// `http`: default 0.0.0.0:8080.
    pub http: Option<SocketAddr>,
    /// `udp`: memcache over UDP; default off.
    pub udp: Option<SocketAddr>,
    /// `cores`: 0 = every CPU of the chosen node.
    pub cores: usize,
    pub numa: NumaChoice,
    /// `memory`: item RAM budget in bytes.
    pub memory: u64,
    /// `data`: data device or file.
    pub data: Option<std::path::PathBuf>,
    /// `max-conns`.
    pub max_conns: usize,
    /// `item-size-max`: largest value (memcached `-I`).
    pub item_size_max: usize,
    /// `idle-timeout`: seconds a connection may sit idle (0 = never).
    pub idle_timeout_secs: u64,
    /// `request-timeout`: seconds a started request may take to arrive whole (slow clients).
    pub request_timeout_secs: u64,
}
