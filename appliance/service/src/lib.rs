//! Sans-IO sessions: a connection's bytes in, reply bytes and a next step out, executed against the shared store.
//!
//! Invariant: nothing here touches a socket, a file or the clock. The I/O runtime reads
//! the clock once per batch and passes [`Now`] in; it owns every buffer that reaches the
//! kernel. A session owns only its bounded input remainder.
#![forbid(unsafe_code)]

use std::sync::Arc;

pub use ringstore_store::{Store, StoreConfig, StoreStats};

/// The time as the runtime read it at the start of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Now {
    /// Seconds since the store epoch (process start); what the store compares expiry against.
    pub store: ringstore_store::Time,
    /// Unix time in seconds (for memcached's absolute exptimes and `stats time`).
    pub unix: u64,
    /// Monotonic milliseconds, for timeouts.
    pub mono_ms: u64,
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
}

/// What the machine looks like, for `stats` and the console.
#[derive(Debug, Clone, Default)]
pub struct Topology {
    pub numa_node: u32,
    pub worker_cpus: Vec<usize>,
}

/// State shared by every worker: the store, counters, configuration.
pub struct Shared {
    pub store: Store,
    pub config: ServiceConfig,
    pub topology: Topology,
    _private: (),
}

impl Shared {
    /// `workers` sizes the per-worker counter slots (no contended atomics on the hot path).
    pub fn new(store: Store, config: ServiceConfig, topology: Topology, workers: usize, pid: u32, unix_start: u64) -> Arc<Shared> {
        let _ = (store, config, topology, workers, pid, unix_start);
        todo!()
    }

    /// The runtime reports connection opens/closes/refusals here (for `stats`).
    pub fn conn_opened(&self, worker: usize) {
        let _ = worker;
        todo!()
    }
    pub fn conn_closed(&self, worker: usize) {
        let _ = worker;
        todo!()
    }
    pub fn conn_refused(&self) {
        todo!()
    }
    /// Current open connections across all workers.
    pub fn curr_connections(&self) -> u64 {
        todo!()
    }
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
    _private: (),
}

impl Session {
    pub fn new(protocol: Protocol, worker: usize) -> Session {
        let _ = (protocol, worker);
        todo!()
    }

    /// Consumes `input` (possibly empty, to resume after [`Flow::Drain`]), appends replies to
    /// `out`, and keeps at most a bounded remainder of an incomplete request.
    pub fn on_bytes(&mut self, input: &[u8], now: Now, shared: &Shared, out: &mut Vec<u8>) -> Flow {
        let _ = (input, now, shared, out);
        todo!()
    }

    /// True while part of a request is buffered (the slow-client timer runs only then).
    pub fn has_partial_request(&self) -> bool {
        todo!()
    }
}
