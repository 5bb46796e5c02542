//! The data plane as PID 1 sees it: which NUMA node and CPUs serve (decided by
//! `ringstore_runtime::numa` when the `runtime` feature is on, exactly as `ringstore serve`
//! decides: docs/ARCHITECTURE.md "NUMA placement"), and starting/stopping the server.
//! Without the feature a stub reports that nothing serves, so the rest of PID 1 can be tested.

use ringstore_config::Config;

/// The node and CPUs chosen for serving.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub node: u32,
    pub workers: Vec<usize>,
    /// Online CPUs that do not serve: PID 1, IRQs other than the NIC queues.
    pub housekeeping: Vec<usize>,
}

/// A running data plane.
pub trait Serving: Send {
    /// `ready memcache=IP:PORT http=IP:PORT`.
    fn ready_line(&self) -> String;
    /// Stops accepting, drains in-flight requests and joins the workers.
    fn shutdown(self: Box<Self>);
    /// The counter `stats log_lines_dropped` reads (the log sink adds to it, ADR 0045).
    fn log_drop_counter(&self) -> Option<std::sync::Arc<std::sync::atomic::AtomicU64>> {
        None
    }
    /// memcache text `request` answered in-process (`stats`, `flush_all`), at most `max` bytes.
    fn admin(&self, request: &[u8], max: usize) -> Vec<u8>;
    /// Starts or ends refusing new connections (open ones are served).
    fn set_draining(&self, on: bool) -> Result<(), String>;
    fn draining(&self) -> bool;
    /// Reads the TLS certificates again: new handshakes use them, open sessions keep theirs;
    /// on an error (one line) the old ones stay. Without a TLS listener, nothing to do.
    fn reload_certs(&self) -> Result<(), String> {
        Ok(())
    }
    /// Reads the users and tokens files `config` names again (`ringstore_runtime::Server::
    /// reload_auth`): `Ok` what is in force (one line), `Err` why a file was not taken (one
    /// line; the one in force stays).
    fn reload_auth(&self, config: &Config) -> Result<String, String> {
        let _ = config;
        Err("the users and tokens are not served here".into())
    }
    /// `data rekey` (ADR 0055): seals with `key` from now on, `tpm_sealed` its TPM-sealed
    /// copy for the superblock; the new key's first epoch, or why it was refused.
    fn rekey(&self, key: &[u8; 32], tpm_sealed: &[u8]) -> Result<u32, String> {
        let _ = (key, tpm_sealed);
        Err("no data device is served here".into())
    }
    /// `data reseal` (ADR 0053): the one-boot copy `seal` makes of the key in use written to
    /// the superblock (`Ok(true)`), or with `None` a pending one erased (whether there was).
    fn reseal(
        &self,
        seal: Option<&mut ringstore_durable::OneBootSeal<'_>>,
    ) -> Result<bool, String> {
        let _ = seal;
        Err("no data device is served here".into())
    }
    /// Open client connections.
    fn connections(&self) -> u64;
    /// The data device's state as the console's `data` shows it (`None` without one).
    fn data_json(&self) -> Option<serde_json::Value>;
    /// AF_XDP: the mode per interface and the queue→worker map (empty without `xdp`).
    fn xdp_lines(&self) -> Vec<String> {
        Vec::new()
    }
    /// memcached's `watch` of `words` (`fetchers`, `mutations`, `evictions`, `connevents`):
    /// a feed that appends the log lines not pulled yet (true when any); the error is the
    /// refusal line. Holds nothing of the machine's state while it lives.
    fn watch(&self, words: &[&str]) -> Result<WatchFeed, String> {
        let _ = words;
        Err("watch is not served here".into())
    }
    /// With `sub_memory` (ADR 0035): each item memory region, the local one first; empty
    /// without sub memory.
    fn memory_regions(&self) -> Vec<MemoryRegion> {
        Vec::new()
    }
    /// Hands PID 1's own series to `/metrics` (`metrics_handoff.rs`).
    fn publish(&self, series: BoxSeries) {
        let _ = series;
    }
}

/// One handover of PID 1's own series to the server's `/metrics` (made in `metrics_handoff.rs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BoxSeries {
    /// Fixed for the boot: the slot (`A`, `B`, `none`) and the data device's path.
    Boot {
        slot: String,
        data_device: Option<String>,
    },
    /// The tuning verifier's checks: (check, subject, as wanted).
    Tuning(Vec<(String, String, bool)>),
    /// The serving certificate's notAfter (Unix seconds); `None`: no TLS.
    Certificate(Option<i64>),
}

/// One item memory region (ADR 0035) as the console and the tuning verifier see it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemoryRegion {
    /// The node its pages should be on.
    pub node: u32,
    /// `local` (the serving node's) or `sub`.
    pub kind: &'static str,
    pub bytes: u64,
    /// Bytes of its segments handed to shards.
    pub used_bytes: u64,
    /// Its address ranges `(start, length)`, ascending.
    pub spans: Vec<(u64, u64)>,
}

/// A `watch` feed ([`Serving::watch`]).
pub type WatchFeed = Box<dyn FnMut(&mut Vec<u8>) -> bool + Send>;

/// The AF_XDP lines of `server`, for the console's `irq` and `net` and the tuning verifier:
/// `xdp:` then one indented line each; empty without a server or without `ringstore.xdp`.
pub fn xdp_lines(server: Option<&dyn Serving>) -> Vec<String> {
    let lines = server.map(|s| s.xdp_lines()).unwrap_or_default();
    if lines.is_empty() {
        return lines;
    }
    std::iter::once("xdp:".to_string())
        .chain(lines.into_iter().map(|l| format!("  {l}")))
        .collect()
}

impl Placement {
    /// Workers on `workers`; housekeeping on the rest of the `online` CPUs.
    fn new(node: u32, workers: Vec<usize>, online: Vec<usize>) -> Placement {
        let housekeeping = online
            .into_iter()
            .filter(|c| !workers.contains(c))
            .collect();
        Placement {
            node,
            workers,
            housekeeping,
        }
    }
}

fn online_cpus() -> Vec<usize> {
    ringstore_sys::read_trim("/sys/devices/system/cpu/online")
        .map(|s| ringstore_sys::parse_cpulist(&s))
        .unwrap_or_default()
}

/// Chooses the node and worker CPUs exactly as the server will.
#[cfg(feature = "runtime")]
pub fn place(config: &Config) -> Result<Placement, String> {
    use ringstore_runtime::{numa, topology::Topology};
    let topology =
        Topology::read().map_err(|e| format!("cannot read the machine topology: {e}"))?;
    let node = numa::choose_node(&topology, config.numa, &config.listen_ips())
        .map_err(|e| e.to_string())?;
    let online = online_cpus();
    // The same CPU set the server will see: it starts on a thread spawned from this one.
    let workers = numa::worker_cpus(&topology, node, config.cores, &numa::current_affinity())
        .map_err(|e| e.to_string())?;
    Ok(Placement::new(node, workers, online))
}

/// Stub until the runtime is wired: the explicit node, or the single node of the NICs that are
/// up; worker CPUs are that node's CPUs. The runtime's `numa::choose_node` replaces it.
#[cfg(not(feature = "runtime"))]
pub fn place(config: &Config) -> Result<Placement, String> {
    use ringstore_config::NumaChoice;
    let node_cpus = |node: u32| {
        ringstore_sys::read_trim(format!("/sys/devices/system/node/node{node}/cpulist"))
            .map(|s| ringstore_sys::parse_cpulist(&s))
    };
    let node = match config.numa {
        NumaChoice::Node(n) => n,
        NumaChoice::Auto => {
            let mut nics: Vec<(String, Option<u32>)> = crate::net::link::ethernet_nics()
                .into_iter()
                .filter(|n| {
                    ringstore_sys::read_trim(format!("/sys/class/net/{n}/carrier")).as_deref()
                        == Some("1")
                })
                .map(|n| {
                    let node =
                        ringstore_sys::read_trim(format!("/sys/class/net/{n}/device/numa_node"))
                            .and_then(|s| s.parse::<u32>().ok());
                    (n, node)
                })
                .collect();
            nics.sort();
            let mut nodes: Vec<Option<u32>> = nics.iter().map(|(_, n)| *n).collect();
            nodes.dedup();
            match nodes.as_slice() {
                [Some(n)] => *n,
                [None] if node_cpus(1).is_none() => 0,
                _ => {
                    let list: Vec<String> = nics
                        .iter()
                        .map(|(n, node)| format!("{n} node {node:?}"))
                        .collect();
                    return Err(format!("cannot choose a NUMA node from the interfaces [{}]; set ringstore.numa=NODE", list.join(", ")));
                }
            }
        }
    };
    let online = online_cpus();
    let workers = node_cpus(node)
        .filter(|c| !c.is_empty())
        .or_else(|| (node == 0).then(|| online.clone()))
        .ok_or_else(|| format!("no NUMA node {node}"))?;
    let workers: Vec<usize> = if config.cores == 0 {
        workers
    } else {
        workers.into_iter().take(config.cores).collect()
    };
    Ok(Placement::new(node, workers, online))
}

#[cfg(feature = "runtime")]
struct RuntimeServer(ringstore_runtime::Server);

#[cfg(feature = "runtime")]
impl Serving for RuntimeServer {
    fn ready_line(&self) -> String {
        self.0.ready_line()
    }
    fn log_drop_counter(&self) -> Option<std::sync::Arc<std::sync::atomic::AtomicU64>> {
        Some(self.0.shared().log_lines_dropped.clone())
    }
    fn shutdown(self: Box<Self>) {
        if let Err(err) = self.0.shutdown() {
            crate::warn!("shutdown: {err}");
        }
    }
    fn xdp_lines(&self) -> Vec<String> {
        self.0.xdp_lines()
    }
    fn memory_regions(&self) -> Vec<MemoryRegion> {
        let store = &self.0.shared().store;
        if store.sub_regions().is_empty() {
            return Vec::new();
        }
        store
            .regions()
            .into_iter()
            .map(|r| {
                let (node, kind) = match r.node {
                    None => (self.0.numa_node(), "local"),
                    Some(n) => (n, "sub"),
                };
                MemoryRegion {
                    node,
                    kind,
                    bytes: r.bytes,
                    used_bytes: r.used_bytes,
                    spans: r.spans,
                }
            })
            .collect()
    }
    fn admin(&self, request: &[u8], max: usize) -> Vec<u8> {
        self.0.admin(request, max)
    }
    fn watch(&self, words: &[&str]) -> Result<WatchFeed, String> {
        let words: Vec<&[u8]> = words.iter().map(|w| w.as_bytes()).collect();
        let mut feed = self.0.watch(&words).map_err(str::to_string)?;
        Ok(Box::new(move |out: &mut Vec<u8>| feed.poll(out)))
    }
    fn set_draining(&self, on: bool) -> Result<(), String> {
        self.0.set_draining(on).map_err(|e| e.to_string())
    }
    fn reload_certs(&self) -> Result<(), String> {
        self.0.reload_certs()
    }
    fn reload_auth(&self, config: &Config) -> Result<String, String> {
        self.0.reload_auth(config)
    }
    fn draining(&self) -> bool {
        self.0.draining()
    }
    fn rekey(&self, key: &[u8; 32], tpm_sealed: &[u8]) -> Result<u32, String> {
        self.0.rekey(
            ringstore_durable::DataKey::from_bytes(*key),
            Some(tpm_sealed),
        )
    }
    fn reseal(
        &self,
        seal: Option<&mut ringstore_durable::OneBootSeal<'_>>,
    ) -> Result<bool, String> {
        self.0.reseal(seal)
    }
    fn publish(&self, series: BoxSeries) {
        // The server's `metrics::appliance`, reached in plain values: PID 1 does not depend on
        // the service crate (auth_files.rs tests that).
        let appliance = &self.0.shared().metrics.appliance;
        match series {
            BoxSeries::Boot { slot, data_device } => {
                appliance.set_boot(slot, data_device);
            }
            BoxSeries::Tuning(checks) => appliance.set_tuning(checks),
            BoxSeries::Certificate(not_after) => appliance.set_certificate(not_after),
        }
    }
    fn connections(&self) -> u64 {
        self.0.shared().curr_connections()
    }
    fn data_json(&self) -> Option<serde_json::Value> {
        let s = self.0.data_state()?;
        let g = s.geometry;
        let capacity = u64::from(g.regions) * u64::from(g.segments_per_region) * g.segment_size;
        let regions: Vec<serde_json::Value> = s
            .region_live_bytes
            .iter()
            .zip(&s.region_live_segments)
            .enumerate()
            .map(|(i, (live, segs))| {
                serde_json::json!({"region": i, "live_bytes": live, "segments_with_live_data": segs,
                                   "used_bytes": u64::from(*segs) * g.segment_size,
                                   "segments": g.segments_per_region,
                                   "bytes": u64::from(g.segments_per_region) * g.segment_size})
            })
            .collect();
        Some(serde_json::json!({
            "device_bytes": s.device_len,
            "capacity_bytes": capacity,
            "segment_bytes": g.segment_size,
            "block_bytes": g.block_size,
            "records": s.records,
            "live_bytes": s.region_live_bytes.iter().sum::<u64>(),
            "used_bytes": s.region_live_segments.iter().map(|&n| u64::from(n) * g.segment_size).sum::<u64>(),
            "corrupt_records": s.corrupt_records,
            "load_refused_records": s.load_refused_records,
            "compactions": s.compactions,
            "compactions_aborted": s.compactions_aborted,
            "evicted_records": s.evicted_records,
            "evicted_segments": s.evicted_segments,
            "uploads_in_progress": s.uploads,
            "upload_reserved_bytes": s.upload_reserved_bytes,
            "regions": regions,
            "reseal_pending": self.0.reseal_pending(),
            "rekey": self.0.rekey_status().filter(|r| r.sealed).map(|r| serde_json::json!({
                "old_key_until_epoch": r.old_key_until_epoch,
                "regions_done": r.regions_done,
                "regions": r.regions,
                "rekeys": r.rekeys,
                "retired": r.retired,
            })),
        }))
    }
}

/// Why the server did not start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartError {
    /// The data device was refused (foreign content, too small, cannot be opened) or could not
    /// be recovered: the box was told to be durable and cannot be, so this is fatal (on_fatal).
    DataDevice(String),
    /// Anything else (bind, NUMA, store): logged, the console stays.
    Other(String),
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StartError::DataDevice(m) | StartError::Other(m) => f.write_str(m),
        }
    }
}

/// Starts the server on a thread that first drops every privilege, so all the threads the
/// server spawns inherit none.
pub fn start(config: &Config) -> Result<Box<dyn Serving>, StartError> {
    let config = config.clone();
    // AF_XDP programs and sockets need CAP_BPF/CAP_NET_ADMIN/CAP_NET_RAW: made here, with
    // PID 1's privileges, and handed to the unprivileged start thread.
    let xdp = prepare_xdp(&config)?;
    let spawned = std::thread::Builder::new()
        .name("serve-start".into())
        .spawn(move || -> Result<Box<dyn Serving>, StartError> {
            crate::privs::drop_thread_privileges().map_err(|e| StartError::Other(e.to_string()))?;
            start_here(&config, xdp)
        });
    let handle =
        spawned.map_err(|e| StartError::Other(format!("cannot start the server thread: {e}")))?;
    handle
        .join()
        .map_err(|_| StartError::Other("the server start panicked".to_string()))?
}

#[cfg(feature = "runtime")]
type Prepared = Option<ringstore_runtime::XdpPrepared>;
#[cfg(not(feature = "runtime"))]
type Prepared = Option<std::convert::Infallible>;

/// Attaches the XDP program and opens the AF_XDP sockets of `config.xdp` (the UDP port must
/// be fixed: the program is built before the socket is bound).
#[cfg(feature = "runtime")]
fn prepare_xdp(config: &Config) -> Result<Prepared, StartError> {
    match config.udp {
        Some(udp) if !config.xdp.is_empty() && udp.port() != 0 => {
            ringstore_runtime::prepare_xdp(&config.xdp, udp.port())
                .map(Some)
                .map_err(|e| StartError::Other(e.to_string()))
        }
        _ => Ok(None),
    }
}

#[cfg(not(feature = "runtime"))]
fn prepare_xdp(_config: &Config) -> Result<Prepared, StartError> {
    Ok(None)
}

#[cfg(feature = "runtime")]
fn start_here(config: &Config, xdp: Prepared) -> Result<Box<dyn Serving>, StartError> {
    use ringstore_runtime::RuntimeError;
    let server = ringstore_runtime::Server::start_prepared(config, xdp).map_err(|e| match e {
        RuntimeError::DataRefused(m) | RuntimeError::Data(m) => StartError::DataDevice(m),
        other => StartError::Other(other.to_string()),
    })?;
    Ok(Box::new(RuntimeServer(server)))
}

#[cfg(not(feature = "runtime"))]
fn start_here(_config: &Config, _xdp: Prepared) -> Result<Box<dyn Serving>, StartError> {
    Err(StartError::Other(
        "this image was built without the data plane (ringstore-init feature `runtime`)"
            .to_string(),
    ))
}
