//! The fleet inventory (TOML): MAC → hostname, `ip=`, memory, cores, data device and any other
//! `ringstore.*` key, checked whole before anything is generated from it (ADR 0026).
//!
//! Every value ends up on a kernel command line inside an iPXE script, so each is checked with
//! the parser that reads it on the box (`ringstore_config` for `ringstore.*`, PID 1's
//! `cmdline::split` for `ip=`) and limited to characters that neither split a kernel argument
//! nor expand in iPXE (`${...}`). Unknown MACs are refused at boot: `boot.ipxe` has no default.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// Largest inventory file read (1 MiB).
pub const INVENTORY_MAX: u64 = 1 << 20;
/// Most hosts one inventory may list.
pub const HOSTS_MAX: usize = 4096;
/// memcache's port when a host does not set `memcache`.
pub const MEMCACHE_DEFAULT_PORT: u16 = 11211;

/// Why an inventory was refused: each names the host (by position and name) and the value.
#[derive(Debug, thiserror::Error)]
pub enum InventoryError {
    #[error("cannot read inventory {path}: {reason}")]
    Read { path: String, reason: String },
    #[error("inventory is larger than {INVENTORY_MAX} bytes")]
    TooLarge,
    #[error("invalid inventory: {0}")]
    Toml(String),
    #[error("the inventory lists no [[host]]")]
    NoHosts,
    #[error("the inventory lists {0} hosts; at most {HOSTS_MAX} are allowed")]
    TooManyHosts(usize),
    #[error(
        "{host}: MAC {value:?} is not six hex pairs like 52:54:00:12:34:56 (unicast, not all zero)"
    )]
    BadMac { host: String, value: String },
    #[error("MAC {mac} is listed twice: {first} and {second}")]
    DuplicateMac {
        mac: Mac,
        first: String,
        second: String,
    },
    #[error("{host}: hostname {value:?}: {expected}")]
    BadHostname {
        host: String,
        value: String,
        expected: &'static str,
    },
    #[error("hostname {hostname} is listed twice: {first} and {second}")]
    DuplicateHostname {
        hostname: String,
        first: String,
        second: String,
    },
    #[error("{host}: unknown key {key:?}: known ringstore keys are {known}")]
    UnknownKey {
        host: String,
        key: String,
        known: String,
    },
    #[error("{host}: key {key} is given twice (as a field and in the ringstore table, or hostname in the table)")]
    DuplicateKey { host: String, key: String },
    #[error("{host}: {key} = {value:?}: values may hold only letters, digits and ._:/,+=@[]%- (they go onto a kernel command line in an iPXE script)")]
    Unsafe {
        host: String,
        key: String,
        value: String,
    },
    #[error("{host}: {key} = {value:?}: expected a string, an integer or a boolean")]
    BadType {
        host: String,
        key: String,
        value: String,
    },
    #[error("{host}: {source}")]
    Config {
        host: String,
        #[source]
        source: ringstore_config::ConfigError,
    },
    #[error("{host}: {source}")]
    Ip {
        host: String,
        #[source]
        source: ringstore_init::cmdline::CmdlineError,
    },
    #[error("{host}: ip= names host {ip_name:?} but the hostname is {hostname:?}")]
    IpHostname {
        host: String,
        ip_name: String,
        hostname: String,
    },
    #[error("{host}: data-format = force would reformat the data device at every network boot; format once by hand instead")]
    ForceFormat { host: String },
    #[error("[boot] cmdline token {token:?}: {why}")]
    BootToken { token: String, why: &'static str },
    #[error("{host}: no fixed memcache address for a server list: give ip=CLIENT:... or memcache = \"IP:PORT\"")]
    NoAddress { host: String },
    #[error("memcache address {addr} is listed twice: {first} and {second}")]
    DuplicateAddress {
        addr: SocketAddr,
        first: String,
        second: String,
    },
}

/// A unicast Ethernet address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Mac(pub [u8; 6]);

impl Mac {
    /// Six hex pairs separated by `:` or `-` (one separator kind); not multicast, not all zero.
    pub fn parse(text: &str) -> Option<Mac> {
        let sep = if text.contains('-') { '-' } else { ':' };
        let parts: Vec<&str> = text.split(sep).collect();
        if parts.len() != 6 {
            return None;
        }
        let mut mac = [0u8; 6];
        for (byte, part) in mac.iter_mut().zip(&parts) {
            if part.len() != 2 || !part.bytes().all(|b| b.is_ascii_hexdigit()) {
                return None;
            }
            *byte = u8::from_str_radix(part, 16).ok()?;
        }
        (mac[0] & 1 == 0 && mac != [0; 6]).then_some(Mac(mac))
    }

    /// iPXE's `${mac:hexhyp}` form: `52-54-00-12-34-56`.
    pub fn hexhyp(&self) -> String {
        self.0
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<Vec<_>>()
            .join("-")
    }
}

impl fmt::Display for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.hexhyp().replace('-', ":"))
    }
}

/// The keys a host or `[defaults]` may set.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawKeys {
    ip: Option<String>,
    memory: Option<toml::Value>,
    cores: Option<toml::Value>,
    data: Option<String>,
    #[serde(default)]
    ringstore: toml::Table,
}

impl RawKeys {
    /// The named keys, as `ringstore.*` keys (`ip` is PID 1's, handled apart).
    fn fields(&self) -> [(&'static str, Option<toml::Value>); 3] {
        [
            ("memory", self.memory.clone()),
            ("cores", self.cores.clone()),
            ("data", self.data.clone().map(toml::Value::String)),
        ]
    }
}

/// A `[[host]]`: its identity and the same keys as `[defaults]`.
#[derive(Debug)]
struct RawHost {
    mac: String,
    hostname: String,
    keys: RawKeys,
}

impl RawHost {
    /// Takes `mac` and `hostname` out of the table and reads the rest as [`RawKeys`], whose
    /// `deny_unknown_fields` then refuses anything else (serde's `flatten` would not).
    fn from_table(index: usize, mut table: toml::Table) -> Result<RawHost, InventoryError> {
        let mut take = |field: &str| match table.remove(field) {
            Some(toml::Value::String(s)) => Ok(s),
            Some(other) => Err(InventoryError::Toml(format!(
                "host {}: {field} = {other}: expected a string",
                index + 1
            ))),
            None => Err(InventoryError::Toml(format!(
                "host {}: missing field `{field}`",
                index + 1
            ))),
        };
        let (mac, hostname) = (take("mac")?, take("hostname")?);
        let keys = toml::Value::Table(table)
            .try_into()
            .map_err(|e: toml::de::Error| {
                InventoryError::Toml(format!("host {}: {}", index + 1, e.message()))
            })?;
        Ok(RawHost {
            mac,
            hostname,
            keys,
        })
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBoot {
    /// Kernel arguments every host gets before its own (`console=ttyS0,115200`, ...).
    #[serde(default)]
    cmdline: String,
}

/// `[scaleout]`: the twemproxy pool's own settings (ADR 0026 has the defaults' reasons).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scaleout {
    /// Where nutcracker listens.
    #[serde(default = "Scaleout::default_listen")]
    pub listen: SocketAddr,
    /// Milliseconds nutcracker waits for a server's reply.
    #[serde(default = "Scaleout::default_timeout")]
    pub timeout_ms: u32,
    /// Milliseconds an ejected server stays out before it is tried again.
    #[serde(default = "Scaleout::default_retry")]
    pub server_retry_timeout_ms: u32,
    /// Consecutive failures that eject a server.
    #[serde(default = "Scaleout::default_failures")]
    pub server_failure_limit: u32,
}

impl Scaleout {
    fn default_listen() -> SocketAddr {
        SocketAddr::from(([0, 0, 0, 0], 22121))
    }
    fn default_timeout() -> u32 {
        1000
    }
    fn default_retry() -> u32 {
        30_000
    }
    fn default_failures() -> u32 {
        2
    }
}

impl Default for Scaleout {
    fn default() -> Scaleout {
        Scaleout {
            listen: Scaleout::default_listen(),
            timeout_ms: Scaleout::default_timeout(),
            server_retry_timeout_ms: Scaleout::default_retry(),
            server_failure_limit: Scaleout::default_failures(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawInventory {
    #[serde(default)]
    boot: RawBoot,
    #[serde(default)]
    scaleout: Scaleout,
    #[serde(default)]
    defaults: RawKeys,
    #[serde(default)]
    host: Vec<toml::Table>,
}

/// One checked host.
#[derive(Debug, Clone)]
pub struct Host {
    pub mac: Mac,
    pub hostname: String,
    /// The `ip=` value (`dhcp` when none is given).
    pub ip: String,
    /// `ringstore.*` keys in canonical spelling (dashes), sorted, `hostname` included.
    pub keys: BTreeMap<String, String>,
    /// What the box will run with (parsed from the same command line it gets).
    pub config: ringstore_config::Config,
    /// The static address from `ip=`, if any.
    pub static_ip: Option<std::net::Ipv4Addr>,
}

impl Host {
    /// `host 2 (cache-02)`: how errors name it.
    fn label(index: usize, hostname: &str) -> String {
        format!("host {} ({hostname})", index + 1)
    }

    /// The host's own kernel arguments: `ip=` then `ringstore.KEY=VALUE` in key order.
    pub fn kernel_args(&self) -> String {
        let mut args = vec![format!("ip={}", self.ip)];
        args.extend(self.keys.iter().map(|(k, v)| format!("ringstore.{k}={v}")));
        args.join(" ")
    }

    /// Where clients reach its memcache endpoint: `memcache`'s IP unless it is a wildcard, else
    /// the static `ip=` address, with `memcache`'s port (11211 by default).
    pub fn memcache_addr(&self) -> Option<SocketAddr> {
        let port = self
            .config
            .memcache
            .map_or(MEMCACHE_DEFAULT_PORT, |a| a.port());
        match self.config.memcache {
            None => None,
            Some(a) if !a.ip().is_unspecified() => Some(a),
            Some(_) => self.static_ip.map(|ip| SocketAddr::new(ip.into(), port)),
        }
    }
}

/// A checked inventory.
#[derive(Debug, Clone)]
pub struct Inventory {
    /// `[boot] cmdline`, split into tokens.
    pub boot_args: Vec<String>,
    pub scaleout: Scaleout,
    pub hosts: Vec<Host>,
}

impl Inventory {
    /// Reads and checks `path` (at most [`INVENTORY_MAX`] bytes).
    pub fn load(path: &Path) -> Result<Inventory, InventoryError> {
        use std::io::Read;
        let read_error = |e: std::io::Error| InventoryError::Read {
            path: path.display().to_string(),
            reason: e.to_string(),
        };
        let mut bytes = Vec::new();
        std::fs::File::open(path)
            .map_err(read_error)?
            .take(INVENTORY_MAX + 1)
            .read_to_end(&mut bytes)
            .map_err(read_error)?;
        if bytes.len() as u64 > INVENTORY_MAX {
            return Err(InventoryError::TooLarge);
        }
        let text = String::from_utf8(bytes).map_err(|_| InventoryError::Read {
            path: path.display().to_string(),
            reason: "not UTF-8".into(),
        })?;
        Inventory::parse(&text)
    }

    /// Parses and checks an inventory document.
    pub fn parse(text: &str) -> Result<Inventory, InventoryError> {
        if text.len() as u64 > INVENTORY_MAX {
            return Err(InventoryError::TooLarge);
        }
        let raw: RawInventory = toml::from_str(text)
            .map_err(|e| InventoryError::Toml(e.message().replace('\n', " ")))?;
        if raw.host.is_empty() {
            return Err(InventoryError::NoHosts);
        }
        if raw.host.len() > HOSTS_MAX {
            return Err(InventoryError::TooManyHosts(raw.host.len()));
        }
        let boot_args = boot_args(&raw.boot.cmdline)?;
        let mut hosts: Vec<Host> = Vec::with_capacity(raw.host.len());
        let mut by_mac: BTreeMap<Mac, String> = BTreeMap::new();
        let mut by_name: BTreeMap<String, String> = BTreeMap::new();
        for (index, table) in raw.host.into_iter().enumerate() {
            let raw_host = RawHost::from_table(index, table)?;
            let label = Host::label(index, &raw_host.hostname);
            let host = check_host(&label, &raw_host, &raw.defaults)?;
            if let Some(first) = by_mac.insert(host.mac, label.clone()) {
                return Err(InventoryError::DuplicateMac {
                    mac: host.mac,
                    first,
                    second: label,
                });
            }
            if let Some(first) = by_name.insert(host.hostname.clone(), label.clone()) {
                return Err(InventoryError::DuplicateHostname {
                    hostname: host.hostname,
                    first,
                    second: label,
                });
            }
            hosts.push(host);
        }
        Ok(Inventory {
            boot_args,
            scaleout: raw.scaleout,
            hosts,
        })
    }

    /// Every host's memcache address, in inventory order; refused when one has none or two share one.
    pub fn memcache_servers(&self) -> Result<Vec<(SocketAddr, &Host)>, InventoryError> {
        let mut seen: BTreeMap<SocketAddr, String> = BTreeMap::new();
        let mut out = Vec::with_capacity(self.hosts.len());
        for (index, host) in self.hosts.iter().enumerate() {
            let label = Host::label(index, &host.hostname);
            let addr = host
                .memcache_addr()
                .ok_or_else(|| InventoryError::NoAddress {
                    host: label.clone(),
                })?;
            if let Some(first) = seen.insert(addr, label.clone()) {
                return Err(InventoryError::DuplicateAddress {
                    addr,
                    first,
                    second: label,
                });
            }
            out.push((addr, host));
        }
        Ok(out)
    }
}

/// Characters a value may hold: none splits a kernel argument, quotes it or expands in iPXE.
fn safe(value: &str) -> bool {
    !value.is_empty()
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._:/,+=@[]%-".contains(&b))
}

fn boot_args(cmdline: &str) -> Result<Vec<String>, InventoryError> {
    let mut out = Vec::new();
    for token in cmdline.split_whitespace() {
        let why = if !safe(token) {
            Some("only letters, digits and ._:/,+=@[]%- are allowed")
        } else if token.starts_with("ip=") || token.starts_with("ringstore.") {
            Some("ip= and ringstore.* are per host: set them in [defaults] or [[host]]")
        } else if token.starts_with("initrd=") {
            Some("initrd= is written by the generator")
        } else {
            None
        };
        if let Some(why) = why {
            return Err(InventoryError::BootToken {
                token: token.to_string(),
                why,
            });
        }
        out.push(token.to_string());
    }
    Ok(out)
}

/// A TOML scalar as the text a kernel argument carries.
fn scalar(label: &str, key: &str, value: &toml::Value) -> Result<String, InventoryError> {
    match value {
        toml::Value::String(s) => Ok(s.clone()),
        toml::Value::Integer(i) => Ok(i.to_string()),
        toml::Value::Boolean(b) => Ok(if *b { "on" } else { "off" }.to_string()),
        other => Err(InventoryError::BadType {
            host: label.to_string(),
            key: key.to_string(),
            value: other.to_string(),
        }),
    }
}

/// One level's keys (`[defaults]` or a host): the named fields, then the `ringstore` table;
/// a key given both ways at one level is refused.
fn level_keys(
    label: &str,
    fields: [(&str, Option<toml::Value>); 3],
    table: &toml::Table,
) -> Result<BTreeMap<String, String>, InventoryError> {
    let mut out = BTreeMap::new();
    for (key, value) in fields {
        if let Some(value) = value {
            out.insert(key.to_string(), scalar(label, key, &value)?);
        }
    }
    for (key, value) in table {
        let canonical = key.replace('_', "-");
        if !ringstore_config::KEYS.iter().any(|k| k.name == canonical) {
            return Err(InventoryError::UnknownKey {
                host: label.to_string(),
                key: key.clone(),
                known: ringstore_config::KEYS
                    .iter()
                    .filter(|k| !k.hidden)
                    .map(|k| k.name)
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
        let text = scalar(label, key, value)?;
        if canonical == "hostname" || out.insert(canonical.clone(), text).is_some() {
            return Err(InventoryError::DuplicateKey {
                host: label.to_string(),
                key: canonical,
            });
        }
    }
    Ok(out)
}

fn check_host(label: &str, raw: &RawHost, defaults: &RawKeys) -> Result<Host, InventoryError> {
    let mac = Mac::parse(&raw.mac).ok_or_else(|| InventoryError::BadMac {
        host: label.to_string(),
        value: raw.mac.clone(),
    })?;
    let hostname = ringstore_config::parse_hostname(&raw.hostname).ok_or_else(|| {
        InventoryError::BadHostname {
            host: label.to_string(),
            value: raw.hostname.clone(),
            expected: "dot-separated labels of letters, digits and inner dashes, at most 64 bytes",
        }
    })?;
    let mut keys = level_keys("[defaults]", defaults.fields(), &defaults.ringstore)?;
    keys.extend(level_keys(label, raw.keys.fields(), &raw.keys.ringstore)?);
    keys.insert("hostname".into(), hostname.clone());
    let ip = raw
        .keys
        .ip
        .clone()
        .or_else(|| defaults.ip.clone())
        .unwrap_or_else(|| "dhcp".into());
    for (key, value) in keys.iter().chain([(&"ip".to_string(), &ip)]) {
        if !safe(value) {
            return Err(InventoryError::Unsafe {
                host: label.to_string(),
                key: key.clone(),
                value: value.clone(),
            });
        }
    }
    if keys
        .get("data-format")
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("force"))
    {
        return Err(InventoryError::ForceFormat {
            host: label.to_string(),
        });
    }
    let line: Vec<String> = keys
        .iter()
        .map(|(k, v)| format!("ringstore.{k}={v}"))
        .collect();
    let config =
        ringstore_config::Config::from_kernel_cmdline(&line.join(" ")).map_err(|source| {
            InventoryError::Config {
                host: label.to_string(),
                source,
            }
        })?;
    let (options, _) = ringstore_init::cmdline::split(&format!("ip={ip}")).map_err(|source| {
        InventoryError::Ip {
            host: label.to_string(),
            source,
        }
    })?;
    let static_ip = match &options.ip {
        ringstore_init::cmdline::IpSetting::Static {
            client,
            hostname: ip_name,
            ..
        } => {
            if let Some(ip_name) = ip_name.as_ref().filter(|n| **n != hostname) {
                return Err(InventoryError::IpHostname {
                    host: label.to_string(),
                    ip_name: ip_name.clone(),
                    hostname,
                });
            }
            Some(*client)
        }
        _ => None,
    };
    Ok(Host {
        mac,
        hostname,
        ip,
        keys,
        config,
        static_ip,
    })
}

/// Parses `--inventory FILE [--out DIR]` (DIR relative to the workspace root by default) and,
/// for `pxe`, the secret flags into `secrets`.
pub fn inventory_args(
    args: &[String],
    command: &str,
    default_out: &str,
    secrets: &mut crate::image::BootOptions,
) -> anyhow::Result<(PathBuf, PathBuf)> {
    let mut inventory = None;
    let mut out = crate::util::root().join(default_out);
    for (flag, value) in crate::cli::parse(command, args)?.flags {
        match flag {
            "--inventory" => inventory = value.map(PathBuf::from),
            "--out" => out = PathBuf::from(value.unwrap_or_default()),
            other => {
                if !secrets.take_secret(other, value) {
                    return Err(crate::cli::unhandled(command, other));
                }
            }
        }
    }
    let inventory =
        anyhow::Context::with_context(inventory, || format!("{command} needs --inventory FILE"))?;
    Ok((inventory, out))
}

#[cfg(test)]
mod tests;
