//! Configuration keys shared by `ringstore serve` flags, the TOML file and the kernel command line.
//!
//! One table of keys ([`KEYS`]); three front ends (`--key value`, `key = value` in TOML,
//! `ringstore.key=value` on the kernel command line). A bad value is reported with the
//! key, the value and what is allowed.
#![forbid(unsafe_code)]

mod keys;
mod log_sink;
pub mod origin;
mod value;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

pub use keys::{KeyInfo, KEYS};
pub use log_sink::{parse_log_sink, LogSink, LogTransport};
pub use origin::{Layer, Origin, Resolved, Setting};
pub use value::{parse_count, parse_endpoint, parse_hostname, parse_size, HOSTNAME_MAX};

/// Largest `--config` file read (1 MiB); a larger one is refused before it is parsed, so a
/// path like `/dev/zero` or a runaway file cannot make the process read without bound.
pub const CONFIG_FILE_MAX: u64 = 1 << 20;

/// Which NUMA node to serve from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NumaChoice {
    /// From the locality of the up Ethernet interfaces (ARCHITECTURE.md, "NUMA placement").
    #[default]
    Auto,
    Node(u32),
}

/// `sub-memory`: item memory on every other online NUMA node, for items demoted from
/// `memory` instead of evicted (ADR 0035); any but `Off` needs an explicit `numa` node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SubMemory {
    /// `0`: none.
    #[default]
    Off,
    /// This many bytes (at least 1 MiB) on every other node.
    Bytes(u64),
    /// `auto`: the appliance sizes each other node's region as it sizes `memory` for the
    /// serving node and sets [`SubMemory::Bytes`] before the server starts; `ringstore
    /// serve` refuses it (it keeps explicit sizes).
    Auto,
}

impl SubMemory {
    /// Bytes on each other node: 0 when off or `auto` not yet sized.
    pub fn bytes(self) -> u64 {
        match self {
            SubMemory::Bytes(n) => n,
            SubMemory::Off | SubMemory::Auto => 0,
        }
    }
}

/// How accepted connections reach workers (ADR-0001). Hidden key `placement`, for measurement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Placement {
    /// One acceptor thread per endpoint hands each fd to the least-loaded worker (default).
    #[default]
    Acceptor,
    /// Every worker owns an SO_REUSEPORT listener per endpoint; the kernel hashes the 4-tuple.
    ReusePort,
}

/// `io`: which I/O runtime the workers run (ADR 0033).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IoRuntime {
    /// io_uring when a ring with the needed features can be set up, else epoll.
    #[default]
    Auto,
    /// io_uring only; a start where it cannot be set up fails (exit 1).
    IoUring,
    /// The readiness (epoll) runtime.
    Epoll,
}

/// `io-uring-setup` (hidden): which io_uring setup flags a worker tries first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IoUringSetup {
    /// SINGLE_ISSUER + DEFER_TASKRUN (+ COOP_TASKRUN), falling back to the others.
    #[default]
    Full,
    /// COOP_TASKRUN, falling back to a plain ring.
    Coop,
    /// No optional setup flags.
    Plain,
}

/// Data-plane switches that exist for measurement and for tests of the fallbacks (hidden keys;
/// the defaults are what production runs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tuning {
    /// `io-uring-setup`.
    pub io_uring_setup: IoUringSetup,
    /// `buf-ring`: receive through a provided-buffer ring when the kernel has one.
    pub buf_ring: bool,
    /// `link-recv`: link each connection's next receive behind its send.
    pub link_recv: bool,
    /// `poll-first`: linked receives poll before they try.
    pub poll_first: bool,
    /// `eventfd-wait`: a worker waits for completions in poll(2) on an eventfd registered with
    /// its ring (1 ms at most, then it looks again) instead of inside `io_uring_enter`
    /// (valgrind runs `io_uring_enter` holding its big lock, which starves every other thread;
    /// it releases the lock around a poll).
    pub eventfd_wait: bool,
}

impl Default for Tuning {
    fn default() -> Tuning {
        Tuning {
            io_uring_setup: IoUringSetup::Full,
            buf_ring: true,
            link_recv: true,
            poll_first: true,
            eventfd_wait: false,
        }
    }
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
    /// `udp-allow`: source networks answered over UDP; empty = any.
    pub udp_allow: Vec<ipnet::IpNet>,
    /// `xdp`: interfaces whose memcache UDP is served through AF_XDP; empty = none.
    pub xdp: Vec<String>,
    /// `cores`: 0 = every CPU of the chosen node.
    pub cores: usize,
    pub numa: NumaChoice,
    /// `memory`: item RAM budget in bytes.
    pub memory: u64,
    /// `data`: data device or file.
    pub data: Option<std::path::PathBuf>,
    /// `memory-file`: the item arena lives in this file, sealed at a clean stop (ADR 0052).
    pub memory_file: Option<std::path::PathBuf>,
    /// `data-size`: create the data file at this size when it does not exist, or extend a
    /// blank one to it; a file larger than this, or formatted smaller, is refused.
    pub data_size: Option<u64>,
    /// `data-key`: a file holding the 32-byte key that seals everything written to the data
    /// device (ADR 0050); read (and its mode checked) when the device is opened.
    pub data_key: Option<std::path::PathBuf>,
    /// `data-format`: what to do with a data device holding something else.
    pub data_format: DataFormat,
    /// `data-recover`: what to do when recovery finds damage in acknowledged history.
    pub data_recover: DataRecover,
    /// `data-full`: what a write does when the data device has no room left.
    pub data_full: DataFull,
    /// `max-conns`.
    pub max_conns: usize,
    /// `conn-memory`: bytes of requests and replies in flight, across all connections,
    /// beyond a fixed allowance each.
    pub conn_memory: usize,
    /// `item-size-max`: largest value (memcached `-I`).
    pub item_size_max: usize,
    /// `object-size-max`: largest HTTP object with a data device (streamed to the device).
    pub object_size_max: u64,
    /// `external-value-min`: with a data device, values of at least this many bytes keep only
    /// their key and metadata in RAM and are read from the device on access (0 = off).
    pub external_value_min: usize,
    /// `idle-timeout`: seconds a connection may sit idle (0 = never).
    pub idle_timeout_secs: u64,
    /// `request-timeout`: seconds a started request may take to arrive whole (slow clients).
    pub request_timeout_secs: u64,
    /// `tls-handshake-timeout`: seconds a TLS connection may take from its accept to the end
    /// of its handshake (a stalled handshake is closed then; ADR 0031).
    pub tls_handshake_timeout_secs: u64,
    /// `hostname`: the host name PID 1 sets and `stats` reports; `None` = the system's.
    pub hostname: Option<String>,
    /// `auth-file`: memcached `-Y` users (`user:password` lines); memcache connections log
    /// in first (text `set` login, binary SASL PLAIN). `None` = no login.
    pub auth_file: Option<PathBuf>,
    /// `http-tokens`: `NAME SHA256-OF-TOKEN read|write [KEY-PREFIX]` lines; every HTTP
    /// request carries `Authorization: Bearer TOKEN`. `None` = open.
    pub http_tokens: Option<PathBuf>,
    /// `placement` (hidden): connection placement mode, for measurement.
    pub placement: Placement,
    /// TLS listeners and certificates (`memcache-tls`, `https`, `tls-*`; ADR 0031).
    pub tls: TlsConfig,
    /// `io`: the I/O runtime (auto, io_uring or epoll).
    pub io: IoRuntime,
    /// Hidden data-plane switches.
    pub tuning: Tuning,
    /// `sub-memory`: a size, `auto` or off (ADR 0035).
    pub sub_memory: SubMemory,
    /// `sub-memory-simulated` (hidden, tests only): on a one-node machine one sub region on
    /// the serving node stands in for a foreign node.
    pub sub_memory_simulated: bool,
    /// `log-sink`: the syslog receiver the log is shipped to (ADR 0045); `None` = off.
    pub log_sink: Option<LogSink>,
    /// `latency-histograms`: record the per-family request latency histograms of
    /// `/metrics` (ADR 0042); off: no series, and one predictable branch per batch of input.
    pub latency_histograms: bool,
    /// `hotkeys`: sample requests into the hot-key sketches (ADR 0044); off: `stats
    /// hotkeys` lists no key, and a GET or SET pays one predictable branch.
    pub hotkeys: bool,
    /// `hotkeys-sample`: one request in this many, on average, is sampled into the
    /// hot-key sketches (1..=[`HOTKEYS_SAMPLE_MAX`]).
    pub hotkeys_sample: u32,
}

/// `hotkeys-sample`'s default: one request in 128 (ADR 0044 "Cost" and "Accuracy").
pub const HOTKEYS_SAMPLE_DEFAULT: u32 = 128;
/// The sparsest `hotkeys-sample`: past it a hot key of a few thousand requests is barely seen.
pub const HOTKEYS_SAMPLE_MAX: u32 = 65_536;

/// `--tls-verify`: client certificates (memcached's `ssl_verify_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TlsVerify {
    /// None asked for (mode 0).
    #[default]
    None,
    /// Asked for; one that does not verify against `tls-ca` is refused (mode 1).
    Request,
    /// Required, signed by `tls-ca` (modes 2 and 3).
    Require,
}

/// TLS listeners and certificates.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TlsConfig {
    /// `memcache-tls`: memcache (text, meta, binary) over TLS; default off.
    pub memcache: Option<SocketAddr>,
    /// `https`: the HTTP object API over TLS (ALPN http/1.1); default off.
    pub https: Option<SocketAddr>,
    /// `tls-only`: refuse to start with a plain data listener (memcache, http, udp) on.
    pub only: bool,
    /// `tls-cert`: PEM certificate chain.
    pub cert: Option<PathBuf>,
    /// `tls-key`: PEM private key.
    pub key: Option<PathBuf>,
    /// `tls-ca`: PEM CA certificates client certificates are verified against.
    pub ca: Option<PathBuf>,
    pub verify: TlsVerify,
    /// `tls-min-version 1.3` (default 1.2).
    pub min_tls13: bool,
    /// Hidden `tls-kernel-offload off`: sessions stay in user space even where the kernel
    /// has TLS (the in-guest comparison of the two).
    pub user_space_only: bool,
}

impl TlsConfig {
    /// Whether any TLS listener is on.
    pub fn enabled(&self) -> bool {
        self.memcache.is_some() || self.https.is_some()
    }

    fn validate(&self, plain: &[(&str, Option<SocketAddr>)]) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Inconsistent(m));
        if self.enabled() && (self.cert.is_none() || self.key.is_none()) {
            return bad("memcache-tls and https need tls-cert and tls-key".into());
        }
        if self.verify != TlsVerify::None && self.ca.is_none() {
            return bad("tls-verify request or require needs tls-ca".into());
        }
        if self.only {
            if !self.enabled() {
                return bad("tls-only needs memcache-tls or https".into());
            }
            if let Some((name, Some(addr))) = plain.iter().find(|(_, a)| a.is_some()) {
                return bad(format!(
                    "tls-only refuses plain listeners: {name} is on at {addr} (set {name} to off)"
                ));
            }
        }
        Ok(())
    }
}

/// `data-recover`: what a start does when recovery finds a record in acknowledged history that
/// does not verify (ADR 0016).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataRecover {
    /// Refuse to start and leave the device untouched: starting could serve older values.
    Refuse,
    /// Start with every record that verifies (also past the damage) and report the damage
    /// loudly; keys whose newest record was damaged may answer an older value or be missing.
    Salvage,
}

/// `data-full`: what a region of the data device with no room left for a value does
/// (ADR 0039). The one definition: the durable crate's compactor and staging use it too.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum DataFull {
    /// The region's compactor evicts its oldest segment before values run out of room: its
    /// records leave the index (and their RAM copies), counted as evictions, so writes keep
    /// succeeding.
    #[default]
    Evict,
    /// Values are refused with a "data device full" error until deletes free room: every
    /// acknowledged write stays until it is deleted.
    Refuse,
}

/// `data-format`: how a data device that is neither blank nor ringstore's current format is treated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataFormat {
    /// Format a blank device, open ringstore's own format, refuse anything else.
    Auto,
    /// Format over whatever is there (another filesystem, another format version).
    Force,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            memcache: Some(SocketAddr::from(([0, 0, 0, 0], 11211))),
            http: Some(SocketAddr::from(([0, 0, 0, 0], 8080))),
            udp: None,
            udp_allow: Vec::new(),
            xdp: Vec::new(),
            cores: 0,
            numa: NumaChoice::Auto,
            memory: 64 << 20,
            data: None,
            memory_file: None,
            data_size: None,
            data_key: None,
            data_format: DataFormat::Auto,
            data_recover: DataRecover::Refuse,
            data_full: DataFull::Evict,
            max_conns: 4096,
            conn_memory: 64 << 20,
            item_size_max: 1 << 20,
            object_size_max: 4 << 30,
            external_value_min: 64 << 10,
            idle_timeout_secs: 0,
            request_timeout_secs: 10,
            tls_handshake_timeout_secs: 5,
            hostname: None,
            auth_file: None,
            http_tokens: None,
            placement: Placement::Acceptor,
            tls: TlsConfig::default(),
            io: IoRuntime::Auto,
            tuning: Tuning::default(),
            sub_memory: SubMemory::Off,
            sub_memory_simulated: false,
            log_sink: None,
            latency_histograms: true,
            hotkeys: true,
            hotkeys_sample: HOTKEYS_SAMPLE_DEFAULT,
        }
    }
}

/// Why a configuration was rejected. Display is one line naming the key, the value and what is allowed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("invalid value {value:?} for {key}: expected {expected}")]
    InvalidValue {
        key: String,
        value: String,
        expected: String,
    },
    #[error("unknown key {key:?}: known keys are {known}")]
    UnknownKey { key: String, known: String },
    #[error("missing value for {key}: expected {expected}")]
    MissingValue { key: String, expected: String },
    #[error("unexpected argument {arg:?}: flags look like --key value or --key=value")]
    UnexpectedArgument { arg: String },
    #[error("cannot read config file {path}: {reason}")]
    File { path: PathBuf, reason: String },
    #[error("config file {path} is larger than {limit} bytes, the most ringstore reads")]
    FileTooLarge { path: PathBuf, limit: u64 },
    #[error("invalid config file {path}: {reason}")]
    Toml { path: PathBuf, reason: String },
    #[error("inconsistent configuration: {0}")]
    Inconsistent(String),
}

impl Config {
    /// The IPs the TCP and UDP endpoints bind, in the order memcache, HTTP, UDP (those that
    /// are on): what the NUMA choice looks at, for the server and PID 1 alike.
    pub fn listen_ips(&self) -> Vec<std::net::IpAddr> {
        [
            self.memcache,
            self.http,
            self.udp,
            self.tls.memcache,
            self.tls.https,
        ]
        .into_iter()
        .flatten()
        .map(|a| a.ip())
        .collect()
    }

    /// Sets one key from its text form; `key` may be spelled with dashes or underscores.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), ConfigError> {
        let canonical = key.replace('_', "-");
        match keys::find(&canonical) {
            Some(info) => (info.apply)(self, value).map_err(|()| ConfigError::InvalidValue {
                key: info.name.to_string(),
                value: value.to_string(),
                expected: info.expected.to_string(),
            }),
            None => Err(ConfigError::UnknownKey {
                key: key.to_string(),
                known: keys::known_list(),
            }),
        }
    }

    /// Parses the flags after `ringstore serve`: `--key value` or `--key=value`.
    /// `--config FILE` is read first, whatever its position; the other flags override it.
    pub fn from_args<I, S>(args: I) -> Result<Config, ConfigError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut pairs: Vec<(String, String)> = Vec::new();
        let mut iter = args.into_iter().map(|s| s.as_ref().to_string());
        while let Some(arg) = iter.next() {
            let Some(flag) = arg.strip_prefix("--") else {
                return Err(ConfigError::UnexpectedArgument { arg });
            };
            let (key, value) = match flag.split_once('=') {
                Some((key, value)) => (key.to_string(), value.to_string()),
                None => {
                    let expected = keys::find(&flag.replace('_', "-"))
                        .map(|info| info.expected.to_string())
                        .unwrap_or_else(|| "a path to a TOML file".to_string());
                    if flag != "config" && keys::find(&flag.replace('_', "-")).is_none() {
                        return Err(ConfigError::UnknownKey {
                            key: flag.to_string(),
                            known: keys::known_list(),
                        });
                    }
                    match iter.next() {
                        Some(value) => (flag.to_string(), value),
                        None => {
                            return Err(ConfigError::MissingValue {
                                key: flag.to_string(),
                                expected,
                            })
                        }
                    }
                }
            };
            pairs.push((key, value));
        }
        let mut config = Config::default();
        for (_, path) in pairs.iter().filter(|(key, _)| key == "config") {
            config.merge_file(Path::new(path))?;
        }
        for (key, value) in pairs.iter().filter(|(key, _)| key != "config") {
            config.set(key, value)?;
        }
        config.validate()?;
        Ok(config)
    }

    /// Parses a TOML document of `key = value` lines over the defaults.
    pub fn from_toml_str(text: &str) -> Result<Config, ConfigError> {
        let mut config = Config::default();
        config.merge_toml(text, Path::new("<string>"))?;
        config.validate()?;
        Ok(config)
    }

    /// Reads `ringstore.KEY=VALUE` tokens of a kernel command line over the defaults; other
    /// tokens (`console=`, `ip=`, ...) are ignored.
    pub fn from_kernel_cmdline(cmdline: &str) -> Result<Config, ConfigError> {
        let pairs = origin::kernel_cmdline_pairs(cmdline)?;
        origin::resolve(&[Layer {
            origin: Origin::KernelCmdline,
            pairs,
        }])
        .map(|r| r.config)
    }

    /// Applies the keys of a TOML file over `self`. At most [`CONFIG_FILE_MAX`] bytes are
    /// read: a file (or device, or pipe) that holds more is refused.
    pub fn merge_file(&mut self, path: &Path) -> Result<(), ConfigError> {
        use std::io::Read;
        let file_error = |err: std::io::Error| ConfigError::File {
            path: path.to_path_buf(),
            reason: err.to_string(),
        };
        let file = std::fs::File::open(path).map_err(file_error)?;
        let mut bytes = Vec::new();
        file.take(CONFIG_FILE_MAX + 1)
            .read_to_end(&mut bytes)
            .map_err(file_error)?;
        if bytes.len() as u64 > CONFIG_FILE_MAX {
            return Err(ConfigError::FileTooLarge {
                path: path.to_path_buf(),
                limit: CONFIG_FILE_MAX,
            });
        }
        let text = String::from_utf8(bytes).map_err(|_| ConfigError::File {
            path: path.to_path_buf(),
            reason: "not UTF-8 text".to_string(),
        })?;
        self.merge_toml(&text, path)
    }

    fn merge_toml(&mut self, text: &str, path: &Path) -> Result<(), ConfigError> {
        for (key, value) in toml_pairs_at(text, path)? {
            self.set(&key, &value)?;
        }
        Ok(())
    }

    /// Checks the rules that span keys.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.memcache.is_none()
            && self.http.is_none()
            && self.udp.is_none()
            && !self.tls.enabled()
        {
            return Err(ConfigError::Inconsistent(
                "every endpoint is off: enable memcache, http or udp".into(),
            ));
        }
        self.tls.validate(&[
            ("memcache", self.memcache),
            ("http", self.http),
            ("udp", self.udp),
        ])?;
        if !self.xdp.is_empty() && self.udp.is_none() {
            return Err(ConfigError::Inconsistent(
                "xdp serves memcache UDP: set udp (its port is the one steered) too".into(),
            ));
        }
        if !self.xdp.is_empty() && self.data.is_some() {
            // Frame backends answer at once (ADR 0021): a write through AF_XDP would be
            // acknowledged before its group commit. Refused rather than half durable.
            return Err(ConfigError::Inconsistent(
                "xdp with data is not supported: UDP writes through AF_XDP would be acknowledged before they are durable".into(),
            ));
        }
        if self.auth_file.is_some() && self.udp.is_some() {
            // memcache over UDP has no connection to log in on (memcached -Y leaves UDP
            // unauthenticated); refused rather than an open side door.
            return Err(ConfigError::Inconsistent(
                "auth-file with udp: memcache over UDP cannot log in; turn udp off".into(),
            ));
        }
        let sub_memory = self.sub_memory != SubMemory::Off;
        if sub_memory && !matches!(self.numa, NumaChoice::Node(_)) {
            return Err(ConfigError::Inconsistent(
                "sub-memory needs an explicit --numa NODE (the node served from; sub regions go on the others), not auto".into(),
            ));
        }
        if self
            .log_sink
            .as_ref()
            .is_some_and(|s| s.transport == LogTransport::Tls)
            && self.tls.ca.is_none()
        {
            return Err(ConfigError::Inconsistent(
                "log-sink tls:// verifies the receiver against tls-ca: set tls-ca too".into(),
            ));
        }
        if self.data_key.is_some() && self.data.is_none() {
            return Err(ConfigError::Inconsistent(
                "data-key seals the data device: set data too".into(),
            ));
        }
        if self.data_size.is_some() && self.data.is_none() {
            return Err(ConfigError::Inconsistent(
                "data-size sizes the data file: set data (a file path) too".into(),
            ));
        }
        if self.item_size_max as u64 > self.memory {
            return Err(ConfigError::Inconsistent(format!(
                "item-size-max ({}) is larger than memory ({})",
                self.item_size_max, self.memory
            )));
        }
        Ok(())
    }
}

/// The `key = value` lines of a TOML configuration as (key, value text) pairs sorted by key,
/// values in the syntax `set` takes (a string as is, an integer in decimal, `false` for an
/// endpoint as `off`); keys are not checked here. PID 1 uses it for the config partition.
pub fn toml_pairs(text: &str) -> Result<Vec<(String, String)>, ConfigError> {
    toml_pairs_at(text, Path::new("ringstore.toml"))
}

fn toml_pairs_at(text: &str, path: &Path) -> Result<Vec<(String, String)>, ConfigError> {
    let table: toml::Table = toml::from_str(text).map_err(|err| ConfigError::Toml {
        path: path.to_path_buf(),
        reason: err.message().replace('\n', " "),
    })?;
    let mut pairs = Vec::new();
    for (key, value) in &table {
        let text = match value {
            toml::Value::String(s) => s.clone(),
            toml::Value::Integer(i) => i.to_string(),
            toml::Value::Boolean(false)
                if keys::find(&key.replace('_', "-")).is_some_and(|k| k.endpoint) =>
            {
                "off".to_string()
            }
            other => {
                let expected = keys::find(&key.replace('_', "-"))
                    .map(|k| k.expected)
                    .unwrap_or("a string or integer");
                return Err(ConfigError::InvalidValue {
                    key: key.clone(),
                    value: format!("{other:?}"),
                    expected: expected.to_string(),
                });
            }
        };
        pairs.push((key.clone(), text));
    }
    Ok(pairs)
}

#[cfg(test)]
mod tests;
