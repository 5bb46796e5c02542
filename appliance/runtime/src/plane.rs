//! Starting and stopping the data plane's threads: pinned workers and the acceptors, generic
//! over what a connection's bytes mean (the service, or an echo in tests).

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use ringstore_service::Protocol;

use crate::placement::listeners::Endpoint;

use crate::clock::Clock;
use crate::handler::Handler;
use crate::placement::acceptor::Acceptor;
use crate::placement::inbox::Inbox;
use crate::ring::Features;
use crate::setup::{Limits, WorkerSetup};
use crate::RuntimeError;

/// Which loop the workers run (`--io`, ADR 0033): both drive the same [`Handler`] with the
/// same placement, inbox, connection table and limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Runtime {
    /// One io_uring ring per worker (`engine/uring.rs`).
    IoUring,
    /// One epoll instance per worker (`engine/epoll.rs`).
    Epoll,
}

impl Runtime {
    /// The name `stats io_runtime` and the log give it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Runtime::IoUring => "io_uring",
            Runtime::Epoll => "epoll",
        }
    }
}

/// Running workers and acceptors.
pub(crate) struct Plane {
    stop: Arc<AtomicBool>,
    /// Written once at stop and never read: stays readable for every acceptor's poll.
    stop_fd: OwnedFd,
    inboxes: Vec<Arc<Inbox>>,
    acceptors: Vec<JoinHandle<()>>,
    workers: Vec<JoinHandle<usize>>,
    features: Features,
    stopped: bool,
    /// The acceptors refuse new connections while set (the console's `drain`).
    draining: Arc<AtomicBool>,
    /// Workers accept for themselves (SO_REUSEPORT): `drain` cannot stop them.
    reuseport: bool,
}

/// What the plane is started with.
pub(crate) struct PlaneSetup<H: Handler> {
    pub handler: Arc<H>,
    /// One entry per worker: the CPU it is pinned to (None = unpinned).
    pub cpus: Vec<Option<usize>>,
    pub limits: Limits,
    pub clock: Clock,
    /// Per TCP endpoint: one listener (acceptor placement) or one per worker (reuseport).
    pub tcp: Vec<(Endpoint, Vec<OwnedFd>)>,
    /// The data device (`--data`); worker i drives region i.
    pub data: Option<Arc<ringstore_durable::Serving<ringstore_durable::FileDevice>>>,
    /// memcache UDP: one socket of the SO_REUSEPORT group per worker (empty: off).
    pub udp: Vec<OwnedFd>,
    /// `--udp-allow`.
    pub udp_allow: Vec<ipnet::IpNet>,
    /// Per worker (by index): its AF_XDP sockets; shorter than `cpus` (or empty) = none.
    pub xdp: Vec<Option<crate::datapath::xdp::XdpWorker>>,
    /// The workers' loop.
    pub runtime: Runtime,
}

fn spawn_named<T: Send + 'static>(
    name: String,
    body: impl FnOnce() -> T + Send + 'static,
) -> Result<JoinHandle<T>, RuntimeError> {
    std::thread::Builder::new()
        .name(name.clone())
        .spawn(body)
        .map_err(|e| RuntimeError::io(format!("spawning thread {name}"), e))
}

impl Plane {
    pub(crate) fn start<H: Handler>(setup: PlaneSetup<H>) -> Result<Plane, RuntimeError> {
        // Threads inherit the signal mask: spawn them with SIGTERM/SIGINT blocked so only the
        // signalfd (or the caller) sees them.
        let old_mask = crate::sys::block_signals(&crate::sys::termination_set());
        let result = Plane::spawn_all(setup);
        crate::sys::set_signal_mask(&old_mask);
        result
    }

    fn spawn_all<H: Handler>(setup: PlaneSetup<H>) -> Result<Plane, RuntimeError> {
        let workers = setup.cpus.len();
        let stop = Arc::new(AtomicBool::new(false));
        let stop_fd = crate::sys::eventfd().map_err(|e| RuntimeError::io("eventfd", e))?;
        let open = Arc::new(AtomicUsize::new(0));
        let inbox_capacity = setup.limits.max_conns.max(64);
        let inboxes = (0..workers)
            .map(|_| Inbox::new(inbox_capacity).map(Arc::new))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| RuntimeError::io("eventfd", e))?;
        let mut plane = Plane {
            stop: stop.clone(),
            stop_fd,
            inboxes: inboxes.clone(),
            acceptors: Vec::new(),
            workers: Vec::new(),
            features: Features::default(),
            stopped: false,
            draining: Arc::new(AtomicBool::new(false)),
            reuseport: false,
        };

        let reuseport = setup.tcp.iter().any(|(_, fds)| fds.len() > 1);
        plane.reuseport = reuseport;
        let mut per_worker: Vec<Vec<(OwnedFd, Endpoint)>> =
            (0..workers).map(|_| Vec::new()).collect();
        let mut shared_listeners = Vec::new();
        for (endpoint, fds) in setup.tcp {
            if reuseport {
                for (i, fd) in fds.into_iter().enumerate() {
                    per_worker[i % workers].push((fd, endpoint));
                }
            } else {
                shared_listeners.extend(fds.into_iter().map(|fd| (fd, endpoint)));
            }
        }

        let mut udp = setup.udp.into_iter();
        let mut xdp = setup.xdp;
        xdp.resize_with(workers, || None);
        let (ready_tx, ready_rx) = std::sync::mpsc::sync_channel(workers);
        for (index, (cpu, listeners)) in setup.cpus.iter().copied().zip(per_worker).enumerate() {
            let worker_setup = WorkerSetup {
                index,
                cpu,
                handler: setup.handler.clone(),
                inbox: inboxes[index].clone(),
                stop: stop.clone(),
                open: open.clone(),
                limits: setup.limits,
                clock: setup.clock,
                listeners,
                reaper: index == 0,
                data: setup.data.clone(),
                udp: udp.next().map(|fd| (fd, setup.udp_allow.clone())),
                xdp: xdp[index].take(),
            };
            let ready = ready_tx.clone();
            let runtime = setup.runtime;
            plane.workers.push(spawn_named(
                format!("ringstore-w{index}"),
                move || match runtime {
                    Runtime::IoUring => crate::engine::uring::run(worker_setup, ready),
                    Runtime::Epoll => crate::engine::epoll::run(worker_setup, ready),
                },
            )?);
        }
        drop(ready_tx);
        for _ in 0..workers {
            match ready_rx.recv() {
                Ok(Ok(features)) => plane.features = features,
                Ok(Err(message)) => {
                    return Err(RuntimeError::io(
                        message,
                        std::io::Error::other("worker start failed"),
                    ))
                }
                Err(_) => return Err(RuntimeError::Worker(0)),
            }
        }

        for (listener, endpoint) in shared_listeners {
            let acceptor = Acceptor {
                listener,
                endpoint,
                inboxes: inboxes.clone(),
                open: open.clone(),
                max_conns: setup.limits.max_conns,
                stop_fd: plane.stop_fd.as_raw_fd(),
                handler: setup.handler.clone(),
                draining: plane.draining.clone(),
            };
            let name = match (endpoint.protocol, endpoint.tls) {
                (Protocol::Memcache, false) => "ringstore-accept-memcache",
                (Protocol::Http, false) => "ringstore-accept-http",
                (Protocol::Memcache, true) => "ringstore-accept-mc-tls",
                (Protocol::Http, true) => "ringstore-accept-https",
            };
            plane
                .acceptors
                .push(spawn_named(name.to_string(), move || acceptor.run())?);
        }
        Ok(plane)
    }

    /// Starts (`true`) or ends refusing new TCP connections; connections already open are
    /// served as before. Refused with SO_REUSEPORT placement, where workers accept themselves.
    pub(crate) fn set_draining(&self, on: bool) -> Result<(), RuntimeError> {
        if self.reuseport {
            return Err(RuntimeError::io(
                "drain",
                std::io::Error::other("placement reuseport: the workers accept themselves"),
            ));
        }
        self.draining.store(on, Ordering::Release);
        Ok(())
    }

    pub(crate) fn draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    pub(crate) fn features(&self) -> Features {
        self.features
    }

    /// Stops accepting, lets workers finish in-flight requests (bounded by their drain
    /// deadline), and joins every thread.
    pub(crate) fn stop(&mut self) -> Result<(), RuntimeError> {
        if self.stopped {
            return Ok(());
        }
        self.stopped = true;
        crate::sys::eventfd_signal(self.stop_fd.as_raw_fd());
        let mut result = Ok(());
        let mut peaks = Vec::new();
        for handle in self.acceptors.drain(..) {
            if handle.join().is_err() {
                result = Err(RuntimeError::Worker(usize::MAX));
            }
        }
        self.stop.store(true, Ordering::Release);
        for inbox in &self.inboxes {
            inbox.wake();
        }
        for (index, handle) in self.workers.drain(..).enumerate() {
            match handle.join() {
                Ok(peak) => peaks.push(peak.to_string()),
                Err(_) => result = Err(RuntimeError::Worker(index)),
            }
        }
        eprintln!(
            "ringstore: stopped; peak connections per worker: {}",
            peaks.join(",")
        );
        result
    }
}

impl Drop for Plane {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}
