//! `Server`: binds the endpoints, chooses the NUMA node and CPUs, binds memory, builds the
//! store and the shared service state, and starts the workers and acceptors.

use std::sync::Arc;

use ringstore_config::{Config, IoRuntime};
use ringstore_service::{ServiceConfig, Shared, Store, StoreConfig, Topology as ServiceTopology};

use crate::clock::Clock;
use crate::handler::ServiceHandler;
use crate::numa::{
    bind_memory, bind_thread_to_cpus, choose_serving_node, worker_cpus, MemoryBinding,
};
use crate::placement::listeners::LocalAddrs;
use crate::plane::{Plane, PlaneSetup, Runtime};
use crate::setup::Limits;
use crate::sys::format_cpus;
use crate::tls::Tls;
use crate::topology::Topology;
use crate::RuntimeError;
use ringstore_durable::{FileDevice, Serving};

/// How long a stopping server lets in-flight requests finish and replies flush.
const DRAIN_DEADLINE_MS: u64 = 5000;
/// The timer tick: timeouts, the coarse clock and the reaper run from it.
const TICK_MS: u64 = 100;
/// Output a connection may have pending beyond one largest item before it is closed.
const OUT_HARD_CAP_BASE: usize = 4 << 20;
/// The service stops parsing a connection's input above this much pending output.
const OUT_HIGH_WATER: usize = 256 << 10;
/// Longest memcache command line.
const LINE_MAX: usize = 8 << 10;

/// A serving ringstore: workers and acceptors running over one shared keyspace.
pub struct Server {
    shared: Arc<Shared>,
    addrs: LocalAddrs,
    plane: Plane,
    node: u32,
    cpus: Vec<usize>,
    memory_binding: MemoryBinding,
    data: Option<Arc<Serving<FileDevice>>>,
    /// The XDP programs of `--xdp` (attached while these live) and the queue→worker lines.
    xdp: Vec<crate::datapath::xdp::XdpAttachment>,
    xdp_map: Vec<String>,
    clock: Clock,
    /// The NUMA exchange thread (with `--sub-memory`); stopped when dropped.
    exchange: Option<crate::numa_sub::Exchange>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("addrs", &self.addrs)
            .field("node", &self.node)
            .field("cpus", &self.cpus)
            .finish()
    }
}

impl Server {
    /// Starts serving `config`: returns once every endpoint listens and every worker runs.
    ///
    /// Binds the calling thread to the chosen node's CPUs and memory before the store is
    /// allocated, so the arena's pages come from the serving node; threads spawned afterwards
    /// inherit the mask and the policy.
    pub fn start(config: &Config) -> Result<Server, RuntimeError> {
        Server::start_prepared(config, None)
    }

    /// [`Server::start`] with the AF_XDP programs and sockets of `xdp` already made by
    /// [`crate::prepare_xdp`] (PID 1 makes them while it still holds the privileges).
    pub fn start_prepared(
        config: &Config,
        prepared: Option<crate::XdpPrepared>,
    ) -> Result<Server, RuntimeError> {
        crate::sys::ignore_sigpipe();
        crate::sys::return_freed_memory_promptly();
        crate::sys::raise_nofile_limit();
        // Read before anything is bound or mapped: a file at fault refuses the start.
        let auth_files = crate::auth_files::load(config)?;
        let runtime = choose_runtime(config)?;
        let placed = place(config)?;
        let (node, cpus) = (placed.node, placed.cpus);
        let bound = crate::placement::listeners::bind(config, cpus.len())?;
        let udp_sockets = bound.udp.len();
        let (store, clock) = build_store(config, node, &cpus, &placed.sub_regions)?;
        let (kernel_tls, certs) = tls_setup(config)?;
        let (xdp, xdp_mode) = attach_xdp(config, prepared, bound.addrs.udp, &cpus, clock)?;
        // Everything the shared state reports is known now: it is built once, complete.
        let started = ringstore_service::Started {
            rusage: Some(crate::sys::process_cpu_time),
            xdp_mode,
            auth: crate::auth_files::enable(auth_files),
            tls: certs.as_ref().map(|certs| {
                Arc::new(crate::tls::CertControl(certs.clone()))
                    as Arc<dyn ringstore_service::TlsControl>
            }),
            io_runtime: runtime.name(),
            settings: start_settings(config, &bound.addrs, kernel_tls),
            clock: Some(crate::lend::mono_ns),
            worker_cpu: Some(crate::lend::worker_cpu),
            latency_histograms: config.latency_histograms,
            hotkeys: config.hotkeys,
            hotkeys_sample: config.hotkeys_sample,
        };
        let shared = shared_state(config, store, node, &cpus, clock, started);
        let data = placed.durable.map(|durable| {
            crate::durable::open::attach(durable, &shared.store, clock, config.data_full)
        });
        let handler = Arc::new(Tls::new(
            ServiceHandler(shared.clone()),
            certs,
            crate::tls::TlsSetup {
                workers: cpus.len(),
                budget: Arc::clone(&shared.conn_memory),
                handshake_timeout_ms: config.tls_handshake_timeout_secs.saturating_mul(1000),
                kernel_offload: kernel_tls,
            },
        ));
        let plane = Plane::start(PlaneSetup {
            handler: handler.clone(),
            cpus: cpus.iter().map(|&c| Some(c)).collect(),
            limits: limits(config),
            clock,
            tcp: bound.tcp,
            data: data.clone(),
            udp: bound.udp,
            udp_allow: config.udp_allow.clone(),
            xdp: xdp.workers,
            runtime,
        })?;
        if udp_sockets > 0 {
            eprintln!(
                "ringstore: udp {} on {udp_sockets} workers (one SO_REUSEPORT socket each)",
                crate::datapath::Mode::KernelUdp
            );
        }
        let exchange =
            crate::numa_sub::Exchange::start(shared.clone(), clock, placed.exchange_cpus)?;
        // Every worker has started (Plane::start waits for them): publish the union of their
        // effective capability sets for `stats worker_capeff`.
        shared.worker_capeff.store(
            serving_threads_capeff(),
            std::sync::atomic::Ordering::Relaxed,
        );
        eprintln!(
            "ringstore: numa node {node} (memory {}), workers on CPUs {}, placement {:?}, store {:?}, {}",
            match placed.memory_binding {
                MemoryBinding::Bound => "bound",
                MemoryBinding::SingleNode => "single node",
            },
            format_cpus(&cpus),
            config.placement,
            shared.store.backing(),
            match runtime {
                Runtime::IoUring => format!("io_uring {}", plane.features()),
                Runtime::Epoll => "io epoll".to_string(),
            }
        );
        Ok(Server {
            shared,
            addrs: bound.addrs,
            plane,
            node,
            cpus,
            memory_binding: placed.memory_binding,
            data,
            xdp: xdp.attachments,
            xdp_map: xdp.map,
            clock,
            exchange,
        })
    }

    /// The AF_XDP state for the console and the log: per interface `IF: MODE, N queues`,
    /// then per queue `IF queue Q -> worker W (cpu C)`; empty without `--xdp`.
    pub fn xdp_lines(&self) -> Vec<String> {
        let mut lines: Vec<String> = self
            .xdp
            .iter()
            .map(|a| format!("{}: {}, {} queue(s)", a.interface, a.mode, a.queues))
            .collect();
        lines.extend(self.xdp_map.iter().cloned());
        lines
    }

    /// Exactly `ready memcache=IP:PORT http=IP:PORT` (plus ` udp=IP:PORT` when on).
    pub fn ready_line(&self) -> String {
        self.addrs.ready_line()
    }

    /// The bound addresses (port 0 resolved).
    pub fn local_addrs(&self) -> LocalAddrs {
        self.addrs
    }

    /// The shared service state (store, counters).
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Reads `config`'s `--auth-file` and `--http-tokens` again (SIGHUP, the console's
    /// `auth reload`) and puts each file that parses in force: new logins and HTTP requests
    /// are checked against it; a memcache connection logged in as a user the new file no
    /// longer has, or whose password it changed, is closed at its worker's next tick (within
    /// 100 ms) and is served no further request; an HTTP request with a token the new file
    /// no longer has gets 401 (keep-alive connections stay open). A file that cannot be
    /// read or does not parse keeps the one in force. Each outcome is logged on one line;
    /// `Ok` says what is in force, `Err` (one line) why a file was not taken. Without either
    /// flag, nothing to do (turning a check on or off needs a restart).
    pub fn reload_auth(&self, config: &Config) -> Result<String, String> {
        crate::auth_files::reload(&self.shared, config)
    }

    /// The NUMA node served from.
    pub fn numa_node(&self) -> u32 {
        self.node
    }

    /// The CPUs the workers are pinned to.
    pub fn worker_cpus(&self) -> &[usize] {
        &self.cpus
    }

    /// Whether memory is strictly bound to the node.
    pub fn memory_binding(&self) -> MemoryBinding {
        self.memory_binding
    }

    /// A `watch` of what `words` ask for, outside any connection (the console's `watch`):
    /// a feed to pull log lines from; the error is memcached's answer line.
    pub fn watch(&self, words: &[&[u8]]) -> Result<ringstore_service::watch::Feed, &'static str> {
        ringstore_service::watch::Feed::join(&self.shared.watch, words)
    }

    /// Runs memcache text `request` (`stats\r\n`, `flush_all\r\n`) in-process against the
    /// shared state, as a client of the memcache port would be answered (the console's
    /// `stats` and `flush`; its counters go to the spare slot). At most `max` bytes of reply.
    pub fn admin(&self, request: &[u8], max: usize) -> Vec<u8> {
        let mut session = ringstore_service::Session::new(
            ringstore_service::Protocol::Memcache,
            self.shared.aux_slot(),
        );
        let mut out = Vec::new();
        let mut reply = Vec::new();
        let mut flow = session.on_bytes(request, self.clock.now(), &self.shared, None, &mut out);
        // A reply bigger than the session's high-water mark comes in pieces.
        while flow == ringstore_service::Flow::Drain && reply.len() < max {
            reply.append(&mut out);
            session.on_output_flushed();
            flow = session.on_bytes(&[], self.clock.now(), &self.shared, None, &mut out);
        }
        reply.append(&mut out);
        reply.truncate(max);
        reply
    }

    /// Reads the TLS certificates again (SIGHUP): new handshakes use them, open sessions keep
    /// theirs. The error (the old certificates stay) is one line; without TLS, nothing to do.
    pub fn reload_certs(&self) -> Result<(), String> {
        match self.shared.started.tls.as_ref() {
            Some(tls) => tls.refresh(),
            None => Ok(()),
        }
    }

    /// Starts or ends draining: new TCP connections are refused (memcache `ERROR Too many
    /// open connections`, HTTP 503), open ones are served.
    pub fn set_draining(&self, on: bool) -> Result<(), RuntimeError> {
        self.plane.set_draining(on)
    }

    pub fn draining(&self) -> bool {
        self.plane.draining()
    }

    /// `data rekey` (ADR 0055): seals with `key` from now on and rewrites the records under
    /// the old key in the background; `tpm_sealed`: the key's TPM-sealed copy (the
    /// appliance). Returns the new key's first epoch, or why it was refused.
    pub fn rekey(
        &self,
        key: ringstore_durable::DataKey,
        tpm_sealed: Option<&[u8]>,
    ) -> Result<u32, String> {
        let data = self.data.as_ref().ok_or("no data device")?;
        data.rekey(key, tpm_sealed).map_err(|e| e.to_string())
    }

    /// `data reseal` (ADR 0053): the one-boot copy `seal` makes of the key in use written
    /// beside its PCR 7 copy; `None`: a pending copy erased (whether there was one).
    pub fn reseal(
        &self,
        seal: Option<&mut ringstore_durable::OneBootSeal<'_>>,
    ) -> Result<bool, String> {
        let data = self.data.as_ref().ok_or("no data device")?;
        match seal {
            Some(seal) => data.reseal(seal).map(|()| true),
            None => data.reseal_cancel(),
        }
        .map_err(|e| e.to_string())
    }

    /// Whether a `data reseal` copy waits for the next boot (`None` without a data device).
    pub fn reseal_pending(&self) -> Option<bool> {
        self.data.as_ref().and_then(|d| d.reseal_pending().ok())
    }

    /// SIGHUP of `ringstore serve`: with `--data-key FILE` and a `FILE.next`, rekeys to it
    /// and renames it over FILE once the switch is durable (logged either way).
    pub fn rekey_to_next_key_file(&self, config: &Config) {
        if let Some(data) = &self.data {
            crate::durable::open::rekey_to_next(data, config);
        }
    }

    /// Where a rekey stands (`None` without a data device).
    pub fn rekey_status(&self) -> Option<ringstore_durable::RekeyStatus> {
        self.data.as_ref().map(|d| d.rekey_status())
    }

    /// The data device's state for the console's `data` (`None` without one).
    pub fn data_state(&self) -> Option<ringstore_durable::ServingState> {
        self.data.as_ref().map(|d| d.state())
    }

    /// Stops accepting, finishes in-flight requests and flushes replies (at most 5 s), joins every thread.
    pub fn shutdown(mut self) -> Result<(), RuntimeError> {
        drop(self.exchange.take());
        let stopped = self.plane.stop();
        // The workers (and their sockets) are gone: detach the programs.
        self.xdp.clear();
        // Nothing changes the store any more: seal a memory file for the next start.
        crate::memory_file::seal(&self.shared.store, self.clock);
        if let Some(data) = &self.data {
            // Every worker drained its log and parked it: publish the checkpoint.
            let started = std::time::Instant::now();
            match data.checkpoint() {
                Ok(true) => eprintln!("ringstore: data device: checkpoint written in {} ms", started.elapsed().as_millis()),
                Ok(false) => eprintln!("ringstore: data device: index too large for the checkpoint area; next start scans"),
                Err(err) => return Err(RuntimeError::Data(format!("data device checkpoint failed: {err}"))),
            }
        }
        stopped
    }
}

/// What `--io io_uring` says when no ring can be set up: the reason, then the likely causes
/// and what to do about each.
const IO_URING_REMEDIES: &str = "likely causes: a seccomp profile that denies io_uring_setup, io_uring_enter and io_uring_register (Docker's, podman's and containerd's default profiles do), or sysctl kernel.io_uring_disabled=1 or 2; remedies: run with --io epoll (or --io auto), give the container a seccomp profile that allows those three calls, or set kernel.io_uring_disabled=0";

/// The workers' runtime for `config.io` (ADR 0033): `auto` probes for a ring as a worker
/// would build it and falls back to epoll, saying why; `io_uring` fails with the reason and
/// the remedies. The epoll runtime refuses what it does not serve.
fn choose_runtime(config: &Config) -> Result<Runtime, RuntimeError> {
    let runtime = match config.io {
        IoRuntime::Epoll => Runtime::Epoll,
        IoRuntime::IoUring => match crate::ring::probe(config.tuning.io_uring_setup) {
            Ok(()) => Runtime::IoUring,
            Err(why) => {
                return Err(RuntimeError::IoUring(format!(
                    "--io io_uring: {why}; {IO_URING_REMEDIES}"
                )))
            }
        },
        IoRuntime::Auto => match crate::ring::probe(config.tuning.io_uring_setup) {
            Ok(()) => Runtime::IoUring,
            Err(why) => {
                eprintln!("ringstore: {why}; serving with epoll");
                Runtime::Epoll
            }
        },
    };
    if runtime == Runtime::Epoll {
        let unsupported = [
            (
                config.udp.is_some() && config.data.is_some(),
                "--udp with --data (UDP replies held until their group commit)",
            ),
            (!config.xdp.is_empty(), "--xdp"),
        ];
        if let Some((_, flag)) = unsupported.iter().find(|(on, _)| *on) {
            return Err(RuntimeError::Unsupported(format!(
                "{flag} is not served by the epoll runtime yet (ADR 0033); it needs io_uring (--io io_uring)"
            )));
        }
    }
    Ok(runtime)
}

/// Where the server runs: the node, the worker CPUs, the data device opened on them, and
/// how memory is bound.
struct Placed {
    node: u32,
    cpus: Vec<usize>,
    durable: Option<ringstore_durable::Durable<FileDevice>>,
    memory_binding: MemoryBinding,
    /// `--sub-memory` regions on the other nodes (ADR 0035), and where their exchange runs.
    sub_regions: Vec<ringstore_store::SubRegion>,
    exchange_cpus: Vec<usize>,
}

/// Chooses the node and the worker CPUs, opens the data device (formatted, or refused)
/// before anything listens, and binds this thread's CPUs and memory to the node, so the
/// store's arena is allocated there.
fn place(config: &Config) -> Result<Placed, RuntimeError> {
    let topology = Topology::read().map_err(|e| RuntimeError::io("reading /sys topology", e))?;
    let allowed = crate::sys::affinity();
    let (node, why) = choose_serving_node(&topology, config.numa, &config.listen_ips(), &allowed)?;
    if let Some(why) = why {
        eprintln!("ringstore: {why}");
    }
    let mut cpus = worker_cpus(&topology, node, config.cores, &allowed)?;
    let sub_regions =
        crate::numa_sub::sub_regions(&topology, node, config, std::path::Path::new("/sys"))?;
    let durable = match &config.data {
        Some(path) => Some(crate::durable::open::open(path, config, &mut cpus)?),
        None => None,
    };
    let node_cpus = topology
        .node(node)
        .map(|n| n.cpus.clone())
        .unwrap_or_default();
    bind_thread_to_cpus(&node_cpus)?;
    let memory_binding = bind_memory(&topology, node)?;
    let exchange_cpus = crate::numa_sub::exchange_cpus(&topology, node, &cpus);
    Ok(Placed {
        node,
        cpus,
        durable,
        memory_binding,
        sub_regions,
        exchange_cpus,
    })
}

/// Whether sessions go to the kernel (kernel TLS), and the certificates of the TLS
/// listeners (`None`: none is on).
fn tls_setup(
    config: &Config,
) -> Result<(bool, Option<Arc<ringstore_tls::CertStore>>), RuntimeError> {
    // Kernel TLS where the kernel has it (both runtimes call after_bytes): this probe alone
    // decides that the kernel has none; a hand-over one socket refuses stays its own.
    let kernel_tls =
        config.tls.enabled() && !config.tls.user_space_only && crate::sys::kernel_has_tls();
    let certs =
        crate::tls::load_certs(config, kernel_tls).map_err(|e| RuntimeError::Tls(e.to_string()))?;
    if config.tls.enabled() {
        eprintln!(
            "ringstore: tls {}",
            match (kernel_tls, config.tls.user_space_only) {
                (true, _) => "with kernel offload (CONFIG_TLS)",
                (false, true) => "in user space (tls-kernel-offload off)",
                (false, false) => "in user space (the kernel has no TLS)",
            }
        );
    }
    Ok((kernel_tls, certs))
}

/// The store, and the clock started once it is built.
fn build_store(
    config: &Config,
    node: u32,
    cpus: &[usize],
    sub_regions: &[ringstore_store::SubRegion],
) -> Result<(Store, Clock), RuntimeError> {
    let store_config = StoreConfig {
        memory_bytes: usize::try_from(config.memory).unwrap_or(usize::MAX),
        item_size_max: config.item_size_max,
        shards: (cpus.len() * 64).next_power_of_two().clamp(64, 4096),
        huge_pages: true,
        // Extstore-like values need the device to read them back from.
        external_threshold: if config.data.is_some() {
            config.external_value_min
        } else {
            0
        },
    };
    if let Some(path) = &config.memory_file {
        if !sub_regions.is_empty() {
            return Err(RuntimeError::Store(ringstore_store::StoreError::Config(
                "--memory-file and --sub-memory cannot be used together".into(),
            )));
        }
        // The clock first: the region's seal is read against this run's store time.
        let clock = Clock::start();
        let data = config.data.is_some();
        let store = crate::memory_file::build(path, store_config, data, clock)?;
        return Ok((store, clock));
    }
    let store = Store::with_sub_regions(store_config, sub_regions)?;
    for r in store.regions().iter().filter(|_| !sub_regions.is_empty()) {
        match r.node {
            None => eprintln!("ringstore: local region on node {node}: {} bytes", r.bytes),
            Some(n) => eprintln!(
                "ringstore: sub region on node {n}: {} bytes (mbind)",
                r.bytes
            ),
        }
    }
    Ok((store, Clock::start()))
}

/// The service state every worker shares, over `store`, with what the runtime knew at start.
fn shared_state(
    config: &Config,
    store: Store,
    node: u32,
    cpus: &[usize],
    clock: Clock,
    started: ringstore_service::Started,
) -> Arc<Shared> {
    let service_config = ServiceConfig {
        item_size_max: config.item_size_max,
        max_line: LINE_MAX,
        out_high_water: OUT_HIGH_WATER,
        max_conns: config.max_conns,
        object_size_max: if config.data.is_some() {
            config.object_size_max
        } else {
            0
        },
        conn_memory: config.conn_memory,
    };
    let service_topology = ServiceTopology {
        numa_node: node,
        worker_cpus: cpus.to_vec(),
        // Read once at start (PID 1 sets it before it starts the server); a system name that
        // is not a valid host name (it could hold spaces or line ends) is not listed.
        hostname: config.hostname.clone().unwrap_or_else(|| {
            ringstore_config::parse_hostname(&crate::sys::hostname()).unwrap_or_default()
        }),
    };
    Shared::with(
        store,
        service_config,
        service_topology,
        cpus.len(),
        std::process::id(),
        clock.unix_start(),
        started,
    )
}

/// What `stats settings` reports of the start (memcached's `tcpport`, `udpport`, `inter`,
/// `idle_timeout`, `tcp_backlog`, `ssl_kernel_tls`): the bound addresses, port 0 resolved.
fn start_settings(
    config: &Config,
    addrs: &LocalAddrs,
    kernel_tls: bool,
) -> ringstore_service::StartSettings {
    ringstore_service::StartSettings {
        memcache: addrs.memcache,
        udp: addrs.udp,
        idle_timeout_secs: config.idle_timeout_secs,
        tcp_backlog: crate::sys::LISTEN_BACKLOG.unsigned_abs(),
        kernel_tls,
    }
}

/// The limits every worker enforces, from `config`.
fn limits(config: &Config) -> Limits {
    Limits {
        max_conns: config.max_conns,
        idle_timeout_ms: config.idle_timeout_secs.saturating_mul(1000),
        request_timeout_ms: config.request_timeout_secs.saturating_mul(1000),
        out_hard_cap: OUT_HARD_CAP_BASE + config.item_size_max,
        drain_deadline_ms: DRAIN_DEADLINE_MS,
        tick_ms: TICK_MS,
        tuning: config.tuning,
    }
}

/// AF_XDP: program, map and sockets are made before the workers start (under PID 1 before
/// privileges drop: `prepared`; otherwise here, for `--xdp`, steering the bound UDP port);
/// each queue goes to the worker on its IRQ's CPU. With the mode line `stats xdp_mode`
/// reports; empty and `None` without XDP.
fn attach_xdp(
    config: &Config,
    prepared: Option<crate::XdpPrepared>,
    udp: Option<std::net::SocketAddr>,
    cpus: &[usize],
    clock: Clock,
) -> Result<(crate::datapath::xdp::Attached, Option<String>), RuntimeError> {
    let prepared = match (prepared, config.xdp.is_empty(), udp) {
        (Some(p), _, _) => Some(p),
        // The port steered is the bound one (`udp` may name port 0).
        (None, false, Some(udp)) => Some(crate::datapath::xdp::prepare(&config.xdp, udp.port())?),
        _ => None,
    };
    let Some(prepared) = prepared else {
        return Ok((crate::datapath::xdp::Attached::default(), None));
    };
    let attached = crate::datapath::xdp::distribute(prepared, cpus, &config.udp_allow, clock);
    let modes = crate::datapath::xdp::modes_line(&attached.attachments);
    Ok((attached, Some(modes)))
}

/// The union of `CapEff` over this process's serving threads (`ringstore-*` threads), read
/// from `/proc/self/task/*/status`. 0 means no serving thread holds any capability.
fn serving_threads_capeff() -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    let mut union = 0;
    for task in tasks.flatten() {
        let path = task.path();
        let is_serving = std::fs::read_to_string(path.join("comm"))
            .is_ok_and(|name| name.starts_with("ringstore-"));
        if !is_serving {
            continue;
        }
        let status = std::fs::read_to_string(path.join("status")).unwrap_or_default();
        union |= status
            .lines()
            .find_map(|line| line.strip_prefix("CapEff:"))
            .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
            .unwrap_or(0);
    }
    union
}

#[cfg(test)]
mod defaults {
    /// `ringstore serve` and a service built with `Started::default()` sample alike.
    #[test]
    fn the_hot_key_sampling_default_is_the_services() {
        assert_eq!(
            ringstore_config::HOTKEYS_SAMPLE_DEFAULT,
            ringstore_service::hotkeys::SAMPLE_ONE_IN
        );
    }
}
