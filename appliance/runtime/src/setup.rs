//! What every worker is started with, whichever engine runs it: its limits, its share of the
//! placement (inbox, own listeners), the handler, the data device and the datagram sockets.

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use crate::clock::Clock;
use crate::handler::{Handler, Hooks};
use crate::placement::inbox::Inbox;
use crate::placement::listeners::Endpoint;

/// Limits every worker enforces.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub max_conns: usize,
    /// 0 = never.
    pub idle_timeout_ms: u64,
    pub request_timeout_ms: u64,
    /// A connection whose pending output grows past this is closed.
    pub out_hard_cap: usize,
    /// How long a stopping worker lets in-flight requests finish.
    pub drain_deadline_ms: u64,
    pub tick_ms: u64,
    /// Data-plane switches (hidden config keys): buffer rings, linked receives, poll-first,
    /// io_uring setup flags. Tests turn buffer rings off to cover the fallback.
    pub tuning: ringstore_config::Tuning,
}

impl Limits {
    /// The timeouts the connection machine's tick applies.
    pub(crate) fn timeouts(&self) -> crate::connection::machine::Timeouts {
        crate::connection::machine::Timeouts {
            request_ms: self.request_timeout_ms,
            idle_ms: self.idle_timeout_ms,
        }
    }
}

/// Everything a worker thread is started with.
pub(crate) struct WorkerSetup<H: Handler> {
    pub index: usize,
    pub cpu: Option<usize>,
    pub handler: Arc<H>,
    pub inbox: Arc<Inbox>,
    pub stop: Arc<AtomicBool>,
    /// Open connections across all workers (for `--max-conns`).
    pub open: Arc<AtomicUsize>,
    pub limits: Limits,
    pub clock: Clock,
    /// Reuseport placement: this worker's own listeners.
    pub listeners: Vec<(OwnedFd, Endpoint)>,
    /// This worker runs the expiry reaper.
    pub reaper: bool,
    /// The data device, when `--data` is on: this worker drives region `index`.
    pub data: Option<Arc<ringstore_durable::Serving<ringstore_durable::FileDevice>>>,
    /// memcache UDP: this worker's socket of the SO_REUSEPORT group and `--udp-allow`.
    pub udp: Option<(OwnedFd, Vec<ipnet::IpNet>)>,
    /// The AF_XDP sockets of the receive queues pinned to this worker's CPU (`--xdp`).
    pub xdp: Option<crate::datapath::xdp::XdpWorker>,
}

impl<H: Handler> WorkerSetup<H> {
    /// A connection this worker accepted itself (reuseport placement), counted against
    /// `--max-conns` and this worker's load: `Some` to serve, or `None` once refused with
    /// the protocol's refusal. Both runtimes admit through here.
    pub(crate) fn admit_own(&self, fd: OwnedFd, endpoint: Endpoint) -> Option<OwnedFd> {
        if self.open.fetch_add(1, Ordering::AcqRel) >= self.limits.max_conns {
            self.open.fetch_sub(1, Ordering::AcqRel);
            self.handler.hooks().conn_refused();
            crate::placement::acceptor::refuse_now(&fd, endpoint);
            return None;
        }
        self.inbox.add_load();
        Some(fd)
    }

    /// Accounting for a connection that is gone (closed or dropped before it was served).
    pub(crate) fn forget_connection(&self) {
        self.inbox.connection_closed();
        self.open.fetch_sub(1, Ordering::AcqRel);
    }
}
