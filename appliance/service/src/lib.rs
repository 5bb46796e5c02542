//! Sans-IO sessions: a connection's bytes in, reply bytes and a next step out, executed against the shared store.
//!
//! Invariant: nothing here touches a socket, a file or the clock. The I/O runtime reads
//! the clock once per batch and passes [`Now`] in; it owns every buffer that reaches the
//! kernel. A session owns only its bounded input remainder.
#![forbid(unsafe_code)]

use std::sync::Arc;

pub mod auth;
pub mod budget;
pub mod device;
mod held;
pub mod hotkeys;
pub mod http;
pub mod latency;
pub mod memcache;
pub mod metrics;
mod stats;
pub mod watch;
pub mod zero_copy;
#[cfg(test)]
mod zero_copy_tests;

pub use device::Device;
pub use ringstore_store::{Backfill, Fetched, Journal, Mutation, Store, StoreConfig, StoreStats};
pub use stats::{Counter, StartSettings, StatsTotals, WorkerStats};

/// The time as the runtime read it at the start of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Now {
    /// Seconds since the store epoch (process start); what the store compares expiry against.
    pub store: ringstore_store::Time,
    /// Unix time in seconds (for memcached's absolute exptimes and `stats time`).
    pub unix: u64,
    /// Monotonic milliseconds, for timeouts.
    pub mono_ms: u64,
    /// Monotonic nanoseconds on the scale of [`Started::clock`], read with the rest when the
    /// worker woke with this input: where a request's latency starts (`latency.rs`).
    pub mono_ns: u64,
}

/// Which protocol a listening endpoint speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Memcache,
    Http,
}

/// Limits and settings shared by every session.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    /// Largest value accepted (memcached `-I`); also the HTTP body limit (413 beyond).
    pub item_size_max: usize,
    /// Largest memcache command line (memcached answers longer ones with an error and closes).
    pub max_line: usize,
    /// Output high-water mark: a session stops parsing when its pending output exceeds this.
    pub out_high_water: usize,
    /// `--max-conns`.
    pub max_conns: usize,
    /// Largest HTTP object (`object-size-max`); bodies over `item_size_max` are streamed to
    /// the data device when one is attached, and refused (413) without one.
    pub object_size_max: u64,
    /// Bytes all connections together may hold in requests being received and replies
    /// waiting to be sent, beyond [`budget::IN_FREE`] + [`budget::OUT_FREE`] each
    /// (`--conn-memory`).
    pub conn_memory: usize,
}

impl Default for ServiceConfig {
    /// memcached's defaults: 1 MiB items, 2048-byte lines, 1024 connections.
    fn default() -> ServiceConfig {
        ServiceConfig {
            item_size_max: 1 << 20,
            max_line: 2048,
            out_high_water: 256 * 1024,
            max_conns: 1024,
            object_size_max: 0,
            conn_memory: 64 << 20,
        }
    }
}

/// What the machine looks like, for `stats` and the console.
#[derive(Debug, Clone, Default)]
pub struct Topology {
    pub numa_node: u32,
    pub worker_cpus: Vec<usize>,
    /// The host name `stats` reports (`hostname`); not listed when empty.
    pub hostname: String,
}

/// State shared by every worker: the store, counters, configuration.
///
/// Counting: each worker owns one cache-line padded [`WorkerStats`] slot, reached with
/// [`Shared::stats`]`(worker)`; its pub [`Counter`] fields are bumped with `inc()`/`add(n)`
/// (relaxed load + store, no read-modify-write, no contention) and only by the thread
/// serving that worker. `stats` sums the slots. Threads that are not workers use
/// [`Shared::aux_slot`], a spare slot after the workers' (memcache UDP is served by the
/// workers, on their own slots).
///
/// Built once ([`Shared::with`]) from what the runtime knows at start ([`Started`]) and
/// never changed after: what changes while serving (counters, the users and tokens a reload
/// installs, the certificates) changes inside its own field. The one value published later
/// is `worker_capeff`, the effective capability set (`CapEff` from `/proc/self/status`) of
/// the worker threads, known only once they have started and dropped privileges; `stats`
/// prints it as 16 hex digits (`worker_capeff`), 0 until then.
pub struct Shared {
    pub store: Store,
    /// What connections hold in flight, bounded across all of them.
    pub conn_memory: Arc<budget::ConnMemory>,
    pub config: ServiceConfig,
    pub topology: Topology,
    /// Effective capabilities of the workers (bit mask as in `CapEff`); published by the
    /// runtime once its workers run.
    pub worker_capeff: std::sync::atomic::AtomicU64,
    pid: u32,
    unix_start: u64,
    slots: Box<[WorkerStats]>,
    refused: std::sync::atomic::AtomicU64,
    /// `stats reset` subtracts this snapshot instead of writing other workers' slots.
    baseline: std::sync::Mutex<StatsTotals>,
    /// `refresh_certs`: one reload a second for the whole server, and its counters.
    pub refresh_certs: memcache::CertRefreshGate,
    /// Unfinished large HTTP uploads, by client and region (`http/uploads.rs`).
    pub uploads: Arc<http::UploadLedger>,
    /// memcached's `watch`: the per-worker log rings and who watches (`watch.rs`).
    pub watch: Arc<watch::Hub>,
    /// The sampled per-worker hot-key sketches (`stats hotkeys`, `hotkeys.rs`).
    pub hotkeys: hotkeys::HotKeys,
    /// What the runtime knew at start.
    pub started: Started,
    /// `--log-sink`: lines dropped so far (`stats log_lines_dropped`, ADR 0045); the sink
    /// adds to it once the server started (`Shipper::count_drops_in`); 0 without one.
    pub log_lines_dropped: Arc<std::sync::atomic::AtomicU64>,
    /// `/metrics`: the latency histograms.
    pub metrics: metrics::Metrics,
}

/// What the runtime knows before its workers start, for `stats`, logins and `refresh_certs`;
/// [`Shared::with`] takes it whole. The default: a plain test server (no login, no TLS, no
/// XDP, `io_uring`).
pub struct Started {
    /// The process's CPU time so far, user and system, in microseconds (memcache
    /// `rusage_user`, `rusage_system`); the runtime's, which may make the syscall.
    pub rusage: Option<fn() -> (u64, u64)>,
    /// The AF_XDP mode per interface (`IF:MODE,...`, `stats xdp_mode`); `None`: no XDP.
    pub xdp_mode: Option<String>,
    /// `--auth-file` and `--http-tokens`; `None`: no login asked, no token needed.
    pub auth: Option<auth::Auth>,
    /// The TLS certificates when a TLS listener is on: `refresh_certs` and the TLS stats.
    pub tls: Option<Arc<dyn TlsControl>>,
    /// The workers' I/O runtime, `io_uring` or `epoll` (`stats io_runtime`).
    pub io_runtime: &'static str,
    /// Listeners, timeouts and kernel TLS as started (`stats settings`).
    pub settings: StartSettings,
    /// Monotonic nanoseconds for the latency histograms (the runtime's clock: the service
    /// reads none); `None`: every request counts as taking 0 s.
    pub clock: Option<fn() -> u64>,
    /// Calls back with `(worker, CPU nanoseconds)` for each worker thread it can read
    /// (`/metrics` `ringstore_worker_cpu_seconds_total`); `None`: no such series.
    pub worker_cpu: Option<metrics::WorkerCpu>,
    /// `--latency-histograms`: record the request latency histograms (default on).
    pub latency_histograms: bool,
    /// `--hotkeys`: sample requests into the hot-key sketches (default on).
    pub hotkeys: bool,
    /// `--hotkeys-sample`: one request in this many, on average, is sampled.
    pub hotkeys_sample: u32,
}

impl Default for Started {
    fn default() -> Started {
        Started {
            rusage: None,
            xdp_mode: None,
            auth: None,
            tls: None,
            io_runtime: "io_uring",
            settings: StartSettings::default(),
            clock: None,
            worker_cpu: None,
            latency_histograms: true,
            hotkeys: true,
            hotkeys_sample: hotkeys::SAMPLE_ONE_IN,
        }
    }
}

/// What the service may ask of the TLS layer (ADR 0031).
pub trait TlsControl: Send + Sync {
    /// Reads the certificate files again; new handshakes use them. The error is one line.
    fn refresh(&self) -> Result<(), String>;
    /// Seconds since the certificates in use were read.
    fn secs_since_refresh(&self) -> u64;
    /// What `stats settings` lists about TLS, in memcached `-Z`'s names and forms.
    fn settings(&self) -> TlsSettings;
}

/// The TLS configuration as memcached 1.6.18 `-Z` prints it in `stats settings`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsSettings {
    /// `ssl_chain_cert`: the certificate chain file.
    pub chain_cert: String,
    /// `ssl_key`: the key file.
    pub key: String,
    /// `ssl_ca_cert`: the client CA file; memcached prints `NULL` without one.
    pub ca_cert: Option<String>,
    /// `ssl_verify_mode`: OpenSSL's verify flags, as memcached prints them: 0 none,
    /// 1 request (`SSL_VERIFY_PEER`), 3 require (`| SSL_VERIFY_FAIL_IF_NO_PEER_CERT`;
    /// memcached's `ssl_verify_mode=2` prints 3).
    pub verify_mode: u8,
    /// `ssl_min_version`: `tlsv1.2` or `tlsv1.3`.
    pub min_version: &'static str,
}

impl Shared {
    /// [`Shared::with`] a default [`Started`] (tests, tools).
    pub fn new(
        store: Store,
        config: ServiceConfig,
        topology: Topology,
        workers: usize,
        pid: u32,
        unix_start: u64,
    ) -> Arc<Shared> {
        Shared::with(
            store,
            config,
            topology,
            workers,
            pid,
            unix_start,
            Started::default(),
        )
    }

    /// The shared state of a server with `workers` workers (which sizes the per-worker
    /// counter slots: no contended atomics on the hot path) in process `pid`, started at
    /// Unix time `unix_start`.
    pub fn with(
        store: Store,
        config: ServiceConfig,
        topology: Topology,
        workers: usize,
        pid: u32,
        unix_start: u64,
        started: Started,
    ) -> Arc<Shared> {
        let watch = Arc::new(watch::Hub::new(workers.max(1) + 1));
        store.attach_eviction_log(Arc::clone(&watch) as Arc<dyn ringstore_store::EvictionLog>);
        Arc::new(Shared {
            store,
            conn_memory: budget::ConnMemory::new(config.conn_memory),
            config,
            topology,
            worker_capeff: std::sync::atomic::AtomicU64::new(0),
            pid,
            unix_start,
            slots: (0..workers.max(1) + 1)
                .map(|_| WorkerStats::default())
                .collect(),
            refused: std::sync::atomic::AtomicU64::new(0),
            baseline: std::sync::Mutex::new(StatsTotals::default()),
            refresh_certs: memcache::CertRefreshGate::default(),
            uploads: Arc::default(),
            watch,
            hotkeys: hotkeys::HotKeys::sampling(workers.max(1) + 1, started.hotkeys_sample)
                .switched(started.hotkeys),
            metrics: metrics::Metrics::new(workers.max(1) + 1, started.clock)
                .latency_histograms(started.latency_histograms),
            started,
            log_lines_dropped: Arc::default(),
        })
    }

    /// The counter slot of `worker` (a worker index past the end gets the spare slot).
    pub fn stats(&self, worker: usize) -> &WorkerStats {
        &self.slots[worker.min(self.slots.len() - 1)]
    }

    /// Index of the spare slot for threads that are not workers.
    pub fn aux_slot(&self) -> usize {
        self.slots.len() - 1
    }

    /// Process id reported by `stats`.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Unix time the server started (`stats uptime`).
    pub fn unix_start(&self) -> u64 {
        self.unix_start
    }

    /// Number of worker slots (`stats threads`).
    pub fn workers(&self) -> usize {
        self.slots.len() - 1
    }

    /// The runtime reports connection opens/closes/refusals here (for `stats`).
    pub fn conn_opened(&self, worker: usize) {
        self.stats(worker).conns_opened.inc();
    }
    pub fn conn_closed(&self, worker: usize) {
        self.stats(worker).conns_closed.inc();
    }
    pub fn conn_refused(&self) {
        // Rare and from the acceptor: a shared atomic is fine here.
        self.refused
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    /// Current open connections across all workers.
    pub fn curr_connections(&self) -> u64 {
        let (opened, closed) = self.slots.iter().fold((0u64, 0u64), |(o, c), s| {
            (
                o.wrapping_add(s.conns_opened.get()),
                c.wrapping_add(s.conns_closed.get()),
            )
        });
        opened.saturating_sub(closed)
    }

    /// Value bytes pinned for zero-copy sends in flight, over all workers (a gauge).
    pub fn pinned_bytes(&self) -> u64 {
        self.slots
            .iter()
            .fold(0u64, |n, s| n.wrapping_add(s.pinned_bytes.get()))
    }

    /// Connections refused at the limit, since start (or the last `stats reset`).
    pub fn rejected_connections(&self) -> u64 {
        self.refused
            .load(std::sync::atomic::Ordering::Relaxed)
            .saturating_sub(self.lock_baseline().rejected_connections)
    }

    /// Sum of every slot minus the last `stats reset` snapshot.
    pub fn totals(&self) -> StatsTotals {
        self.totals_and_store().0
    }

    /// [`Shared::totals`] and the store's counters, from one pass over the store's shards.
    pub fn totals_and_store(&self) -> (StatsTotals, StoreStats) {
        let store = self.store.stats();
        let raw = self.raw_totals(&store);
        (raw.since(&self.lock_baseline()), store)
    }

    /// `stats reset`: counters read as zero from now on (connections stay counted).
    pub fn reset_stats(&self) {
        let mut raw = self.raw_totals(&self.store.stats());
        raw.rejected_connections = self.refused.load(std::sync::atomic::Ordering::Relaxed);
        *self.lock_baseline() = raw;
    }

    /// The slots summed, with the counters the store keeps (`get_expired`, `get_flushed`).
    fn raw_totals(&self, store: &StoreStats) -> StatsTotals {
        let mut t = StatsTotals::default();
        for s in self.slots.iter() {
            t.add(s);
        }
        t.get_expired = store.get_expired;
        t.get_flushed = store.get_flushed;
        t
    }

    fn lock_baseline(&self) -> std::sync::MutexGuard<'_, StatsTotals> {
        // A panic while holding it cannot leave the snapshot torn in a harmful way.
        self.baseline.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The reply a session sends instead of its reply to a write whose data-device write or
/// flush failed: the request was not made durable and its RAM copy was dropped. A memcache
/// connection speaking the binary protocol gets [`durable_failure_reply_binary`] instead.
pub fn durable_failure_reply(protocol: Protocol) -> &'static [u8] {
    match protocol {
        Protocol::Memcache => b"SERVER_ERROR data device write failed\r\n",
        Protocol::Http => b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\n\r\n",
    }
}

/// [`durable_failure_reply`] for a memcache binary-protocol request: an error frame
/// (status 0x84, internal error) echoing the request's opcode and opaque, appended to `out`.
pub fn durable_failure_reply_binary(
    head: ringstore_proto::memcache::binary::Head,
    out: &mut Vec<u8>,
) {
    use ringstore_proto::memcache::binary::{response, Status};
    response::error(out, head, Status::Internal);
}

/// What the runtime should do after a session consumed bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    /// Send what is in `out`, then keep reading.
    Continue,
    /// Output is above the high-water mark: send `out`, then call [`Session::on_bytes`] with
    /// no new bytes before reading more.
    Drain,
    /// Send what is in `out`, then close the connection (quit, protocol error, HTTP close).
    Close,
}

/// One connection's protocol state. Sans-IO.
pub struct Session {
    inner: SessionKind,
}

// The memcache variant is the common one and stays inline (no pointer chase per request);
// HTTP's larger state is boxed.
#[expect(
    clippy::large_enum_variant,
    reason = "the memcache session stays inline on purpose (see above)"
)]
enum SessionKind {
    Memcache(memcache::MemcacheSession),
    Http(Box<http::HttpSession>),
}

impl Session {
    pub fn new(protocol: Protocol, worker: usize) -> Session {
        let inner = match protocol {
            Protocol::Memcache => SessionKind::Memcache(memcache::MemcacheSession::new(worker)),
            Protocol::Http => SessionKind::Http(Box::new(http::HttpSession::new(worker))),
        };
        Session { inner }
    }

    /// Consumes `input` (possibly empty, to resume after [`Flow::Drain`]), appends replies to
    /// `out`, and keeps at most a bounded remainder of an incomplete request.
    ///
    /// `device` is the worker's data device, when one is attached. A reply to a request
    /// that staged records on it is held by the session until the runtime reports those
    /// records settled ([`Session::on_durable`]); while [`Session::awaits_durable`], the
    /// runtime feeds no more input.
    pub fn on_bytes(
        &mut self,
        input: &[u8],
        now: Now,
        shared: &Shared,
        device: Option<&dyn Device>,
        out: &mut Vec<u8>,
    ) -> Flow {
        match &mut self.inner {
            SessionKind::Memcache(s) => s.on_bytes(input, now, shared, device, out),
            SessionKind::Http(s) => s.on_bytes(input, now, shared, device, out),
        }
    }

    /// The TLS layer verified this connection's client certificate `der`: on HTTP its
    /// subject may stand in for a bearer token (`--http-tokens` `subject:` lines); memcache
    /// ignores it.
    pub fn client_certificate(&mut self, der: &[u8]) {
        if let SessionKind::Http(s) = &mut self.inner {
            s.client_certificate(der);
        }
    }

    /// The runtime settled `token`, a record this session staged (tokens are reported in
    /// increasing order): made durable when `ok`, failed (and its RAM copy dropped) when
    /// not. The replies it completes are appended to `out`: their own, or the protocol's
    /// failure reply ([`durable_failure_reply`]).
    pub fn on_durable(&mut self, token: u64, ok: bool, shared: &Shared, out: &mut Vec<u8>) {
        match &mut self.inner {
            SessionKind::Memcache(s) => s.on_durable(token, ok, shared, out),
            SessionKind::Http(s) => {
                let n = s.on_durable(token, ok, out);
                shared.stats(s.worker()).bytes_written.add(n as u64);
            }
        }
    }

    /// memcache: note where each response ends in the output (for memcache over UDP, which
    /// frames each response separately as memcached does). No effect on HTTP.
    pub fn mark_responses(&mut self) {
        if let SessionKind::Memcache(s) = &mut self.inner {
            s.mark_responses();
        }
    }

    /// The response ends noted since [`Session::mark_responses`] (emptied).
    pub fn take_response_marks(&mut self) -> Vec<memcache::ResponseMark> {
        match &mut self.inner {
            SessionKind::Memcache(s) => s.take_response_marks(),
            SessionKind::Http(_) => Vec::new(),
        }
    }

    /// Sends GET values of at least [`zero_copy::ZERO_COPY_MIN`] bytes from the item: the
    /// output then has [`Session::splices`] the runtime must send in place (TCP only; the
    /// session never splices while a data device is attached). No effect on HTTP.
    pub fn enable_zero_copy(&mut self) {
        if let SessionKind::Memcache(s) = &mut self.inner {
            s.zc.enabled = true;
        }
    }

    /// Pinned values to send at their offsets in the output, in order. Their bytes stay
    /// valid until [`Session::release_output`] or [`Session::on_close`].
    pub fn splices(&self) -> &[zero_copy::Splice] {
        match &self.inner {
            SessionKind::Memcache(s) => &s.zc.splices,
            SessionKind::Http(_) => &[],
        }
    }

    /// The output, spliced values included, has been sent (or will never be): their pins go
    /// back to the store. Call only when no send reading them is in flight.
    pub fn release_output(&mut self, shared: &Shared) {
        if let SessionKind::Memcache(s) = &mut self.inner {
            s.release_splices(shared);
        }
    }

    /// A `watch` connection's log lines since the last call (none for other sessions);
    /// true when it appended any. The runtime calls it on its tick while no output is
    /// pending, so a watcher's output stays bounded by one poll.
    pub fn poll_output(&mut self, shared: &Shared, out: &mut Vec<u8>) -> bool {
        match &mut self.inner {
            SessionKind::Memcache(s) => s.poll_watch(shared, out),
            SessionKind::Http(_) => false,
        }
    }

    /// True while a reply waits for the data device.
    pub fn awaits_durable(&self) -> bool {
        match &self.inner {
            SessionKind::Memcache(s) => s.awaits_durable(),
            SessionKind::Http(s) => s.awaits_durable(),
        }
    }

    /// The connection's peer, told once after it opened (`watch connevents`).
    pub fn peer_known(&mut self, shared: &Shared, peer: std::net::SocketAddr) {
        match &mut self.inner {
            SessionKind::Memcache(s) => s.peer_known(shared, peer),
            SessionKind::Http(s) => s.peer_known(peer.ip()),
        }
    }

    /// The connection is gone: give up what a request in progress holds (a large upload's
    /// chunks on the data device).
    pub fn on_close(&mut self, shared: &Shared, device: Option<&dyn Device>) {
        match &mut self.inner {
            SessionKind::Http(s) => s.on_close(&http::StoreBackend::of(shared, s.worker(), device)),
            SessionKind::Memcache(s) => {
                s.release_splices(shared);
                s.abandon_direct(shared);
                s.log_conn_event(shared, true);
            }
        }
    }

    /// Every byte of output the session produced has been sent: what it reserved for that
    /// output in the connection-memory budget goes back.
    pub fn on_output_flushed(&mut self) {
        match &mut self.inner {
            SessionKind::Memcache(s) => s.on_output_flushed(),
            SessionKind::Http(s) => s.on_output_flushed(),
        }
    }

    /// A connection's session: with `--auth-file`, a memcache one must log in first (until
    /// then [`Session::has_partial_request`] is true, so the slow-client timer runs from
    /// the accept). A session made with [`Session::new`] finds out on its first bytes.
    pub fn for_connection(protocol: Protocol, worker: usize, shared: &Shared) -> Session {
        let mut session = Session::new(protocol, worker);
        match &mut session.inner {
            SessionKind::Memcache(s) => {
                s.resolve_gate(shared);
                s.enable_direct();
            }
            SessionKind::Http(s) => s.enable_direct(),
        }
        session
    }

    /// Where the runtime receives this session's next input instead of its receive buffer:
    /// the missing bytes of a storage value received straight into its item (their first
    /// byte and how many; memcache `direct.rs`), or `None`. Writing them is sound until the
    /// session is next called or closed (the item is reserved and pinned, nothing else
    /// writes it); the runtime then reports them with [`Session::received_into`].
    pub fn recv_target(&self) -> Option<(*mut u8, usize)> {
        match &self.inner {
            SessionKind::Memcache(s) => s.recv_target(),
            SessionKind::Http(s) => s.recv_target(),
        }
    }

    /// `n` bytes were received at [`Session::recv_target`]; what the connection does next:
    /// [`Flow::Drain`] when they made the request whole and the session is to be called
    /// again, with no input, to answer it (a binary value: nothing follows it).
    pub fn received_into(&mut self, n: usize, shared: &Shared) -> Flow {
        match &mut self.inner {
            SessionKind::Memcache(s) => s.received_into(n, shared),
            SessionKind::Http(s) => {
                shared.stats(s.worker()).bytes_read.add(n as u64);
                s.received_into(n)
            }
        }
    }

    /// True when the connection must close because a reload took away what let it in: a
    /// memcache connection logged in as a user the users file no longer has (or whose
    /// password changed). The runtime asks on every tick; an HTTP connection is never
    /// closed for this: each request's token is checked against the file in force (a
    /// removed token's next request is 401).
    pub fn revoked(&mut self, shared: &Shared) -> bool {
        match &mut self.inner {
            SessionKind::Memcache(s) => s.revoked(shared),
            SessionKind::Http(_) => false,
        }
    }

    /// True while part of a request is buffered, or a memcache connection has not logged in
    /// under `--auth-file` (the slow-client timer runs only then).
    pub fn has_partial_request(&self) -> bool {
        match &self.inner {
            SessionKind::Memcache(s) => s.has_partial_request(),
            SessionKind::Http(s) => s.has_partial_request(),
        }
    }
}
