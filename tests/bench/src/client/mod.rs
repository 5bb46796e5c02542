//! The load generator, the one every bench part that drives memcache load uses: one thread
//! pinned to the client CPU, one io_uring per server, C connections that each keep a batch of
//! `depth` pipelined requests in flight (engine.rs). A mode (codec.rs) says what goes on the
//! wire: memcache text `get`/`set`, meta `mg`, binary GET/GETK (`Mode::Memcache`, by `Op`),
//! the TLS part's requests over rustls (`Mode::Tls`), memcache GET over UDP (`Mode::Udp`).
//! Latencies go into an HDR histogram (hist.rs, the `hdrhistogram` crate).
//!
//! Servers are measured in alternating slices (A B B A ...) from one thread with every
//! server's connections open, so background load on a shared machine hits all alike.
//!
//! Closed loop (`run`) starts a connection's next batch the moment its last reply is in, so it
//! finds a server's peak. Paced (`run_paced`, open loop, as wrk2) gives every connection a fixed
//! schedule instead (pace.rs): a stall counts against every request it delayed.

mod codec;
mod conn;
#[allow(
    unsafe_code,
    reason = "io_uring SQEs pointing into connection buffers (see the crate's deny)"
)]
mod engine;
mod pace;
mod result;

pub(crate) use conn::connect;
pub(crate) use engine::sqe_len;
pub use result::LoadResult;

use crate::mcwire::Op;
use crate::procs;
use crate::tls_wire::Wire;
use anyhow::{bail, Context, Result};
use engine::Generator;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

/// What a cell's connections say, and over what.
#[derive(Clone)]
pub enum Mode {
    /// memcache over TCP: text `get`/`set`, meta `mg`, binary GET/GETK (or RESP `SET` for
    /// Redis), per `op`, with `value_len`-byte values.
    Memcache { op: Op, value_len: usize },
    /// The TLS part's requests (tls_wire.rs) over TLS, or plain TCP where `config` is `None`.
    Tls {
        wire: Wire,
        config: Option<Arc<rustls::ClientConfig>>,
    },
    /// memcache GET of the key `bench` over UDP, a datagram per request, from a socket bound
    /// to `from` and connected to `to`.
    Udp { from: IpAddr, to: SocketAddr },
}

impl Mode {
    /// The value length the mode's replies carry (0 where it does not know).
    pub fn value_len(&self) -> usize {
        match self {
            Mode::Memcache { value_len, .. } => *value_len,
            Mode::Tls { wire, .. } => wire.value_len(),
            Mode::Udp { .. } => 0,
        }
    }

    /// How error messages name the mode.
    pub fn name(&self) -> &'static str {
        match self {
            Mode::Memcache { op, .. } => op.name(),
            Mode::Tls {
                config: Some(_), ..
            } => "TLS",
            Mode::Tls { config: None, .. } => "plain",
            Mode::Udp { .. } => "UDP GET",
        }
    }
}

/// One benchmark cell against one server.
#[derive(Clone)]
pub struct LoadSpec {
    /// The server's TCP port on loopback (UDP: the port of `Mode::Udp::to`, for messages).
    pub port: u16,
    pub mode: Mode,
    pub depth: usize,
    pub conns: usize,
    /// Keys `0..keyspace` (preloaded for gets, so every get hits).
    pub keyspace: usize,
    /// Before the first slice.
    pub warmup: Duration,
    /// Measured time in all, split into `slices` slices.
    pub measure: Duration,
    pub slices: u32,
    /// The server process whose CPU time is read at each slice's edges.
    pub server_pid: u32,
}

/// Ramp-up before every slice after the first (connections restart their batches).
const SLICE_WARMUP: Duration = Duration::from_millis(100);

/// Runs one cell against every server in `specs`, alternating slices between them, on a
/// thread pinned to the client CPU. Results come back in the order of `specs`.
pub fn run(specs: &[LoadSpec]) -> Result<Vec<LoadResult>> {
    let paced = specs.iter().map(|s| (s.clone(), None)).collect();
    run_on_client_cpu(paced, None)
}

/// Like `run`, on a thread pinned to `cpu` (the cores part runs one such load generator per
/// client core).
pub fn run_on(cpu: usize, specs: &[LoadSpec]) -> Result<Vec<LoadResult>> {
    let paced = specs.iter().map(|s| (s.clone(), None)).collect();
    run_pinned(cpu, paced, None)
}

/// Like `run`, open loop: server `i` gets `rates[i]` requests per second in all, spread evenly
/// over its connections on a fixed schedule (see pace.rs).
pub fn run_paced(specs: &[LoadSpec], rates: &[f64]) -> Result<Vec<LoadResult>> {
    if specs.len() != rates.len() || rates.iter().any(|r| !r.is_finite() || *r <= 0.0) {
        bail!("one positive rate per paced server");
    }
    let paced = specs
        .iter()
        .zip(rates)
        .map(|(s, r)| (s.clone(), Some(*r)))
        .collect();
    run_on_client_cpu(paced, None)
}

/// Like `run`, from inside the network namespace `netns` (its name under /run/netns).
pub fn run_in_netns(netns: &str, specs: &[LoadSpec]) -> Result<Vec<LoadResult>> {
    let paced = specs.iter().map(|s| (s.clone(), None)).collect();
    run_on_client_cpu(paced, Some(netns.to_string()))
}

fn enter_netns(netns: &str) -> Result<()> {
    use std::os::fd::AsFd;
    let file = std::fs::File::open(format!("/run/netns/{netns}"))?;
    rustix::thread::move_into_link_name_space(
        file.as_fd(),
        Some(rustix::thread::LinkNameSpaceType::Network),
    )
    .map_err(std::io::Error::from)
    .context("setns into the bench namespace")
}

fn run_on_client_cpu(
    paced: Vec<(LoadSpec, Option<f64>)>,
    netns: Option<String>,
) -> Result<Vec<LoadResult>> {
    run_pinned(procs::CLIENT_CPU, paced, netns)
}

fn run_pinned(
    cpu: usize,
    paced: Vec<(LoadSpec, Option<f64>)>,
    netns: Option<String>,
) -> Result<Vec<LoadResult>> {
    std::thread::spawn(move || {
        if let Some(netns) = &netns {
            enter_netns(netns)?;
        }
        procs::pin_current_thread(cpu)?;
        procs::raise_own_priority();
        let specs: Vec<LoadSpec> = paced.iter().map(|(s, _)| s.clone()).collect();
        let mut generators = paced
            .iter()
            .map(|(spec, rate)| Generator::new(spec, *rate))
            .collect::<Result<Vec<_>>>()?;
        let outcome = alternate(&mut generators, &specs);
        for generator in &mut generators {
            generator.close();
        }
        outcome
    })
    .join()
    .map_err(|_| anyhow::anyhow!("load generator thread panicked"))?
}

/// Connections held open on the calling thread for counted passes, where time means nothing
/// (icount: instructions per request under callgrind). Each pass may change the op and depth;
/// the connections and their key walks go on.
pub struct Session(Generator);

impl Session {
    /// Opens `spec`'s connections (closed loop; `warmup`, `measure`, `slices` are not used).
    pub fn open(spec: &LoadSpec) -> Result<Session> {
        Ok(Session(Generator::new(spec, None)?))
    }

    /// Sends `requests` requests (rounded up to whole batches of `depth`) on every connection
    /// and waits for all replies; fails when none comes for `patience`.
    pub fn pass(
        &mut self,
        mode: &Mode,
        depth: usize,
        requests: usize,
        patience: Duration,
    ) -> Result<LoadResult> {
        let batches = requests.div_ceil(depth.max(1));
        self.0.exact(mode, depth, batches, patience)
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.0.close();
    }
}

fn alternate(generators: &mut [Generator], specs: &[LoadSpec]) -> Result<Vec<LoadResult>> {
    let mut totals: Vec<LoadResult> = generators.iter().map(|_| LoadResult::empty()).collect();
    let slices = specs.iter().map(|s| s.slices).max().unwrap_or(1).max(1);
    for slice in 0..slices {
        let mut order: Vec<usize> = (0..generators.len()).collect();
        if slice % 2 == 1 {
            order.reverse();
        }
        for index in order {
            let spec = &specs[index];
            let warmup = if slice == 0 {
                spec.warmup
            } else {
                SLICE_WARMUP
            };
            let part = generators[index].segment(warmup, spec.measure / slices)?;
            totals[index].merge(&part);
        }
    }
    Ok(totals)
}

#[cfg(test)]
mod tests;
