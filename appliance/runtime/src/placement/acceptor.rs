//! One acceptor thread per endpoint (ADR-0001): accepts in batches and hands each
//! fd to the worker with the fewest active + queued connections; refuses cleanly beyond
//! `--max-conns` (and while draining) and backs off when the process runs out of descriptors.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ringstore_service::Protocol;

use crate::placement::listeners::Endpoint;

use crate::handler::{Handler, Hooks};
use crate::placement::inbox::{least_loaded, Inbox};

/// What memcached answers when it is out of connections.
pub(crate) const MEMCACHE_REFUSAL: &[u8] = b"ERROR Too many open connections\r\n";
/// The HTTP refusal.
pub(crate) const HTTP_REFUSAL: &[u8] =
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: 21\r\nConnection: close\r\n\r\ntoo many connections\n";

/// Refused connections kept open briefly so the refusal is read rather than reset.
const LINGERING_MAX: usize = 64;
const LINGER: Duration = Duration::from_millis(500);
/// Pause after EMFILE/ENFILE before accepting again (the pending connection stays queued).
const FD_BACKOFF: Duration = Duration::from_millis(100);

/// Writes the protocol's refusal and half-closes; the caller drops (or lingers) the fd. A TLS
/// endpoint gets no plaintext refusal: the connection is just closed.
pub(crate) fn refuse_now(fd: &OwnedFd, endpoint: Endpoint) {
    let message = match endpoint.protocol {
        Protocol::Memcache => MEMCACHE_REFUSAL,
        Protocol::Http => HTTP_REFUSAL,
    };
    if !endpoint.tls {
        let _ = crate::sys::send_nosignal(fd.as_raw_fd(), message);
    }
    crate::sys::shutdown(fd.as_raw_fd(), libc::SHUT_WR);
}

pub(crate) struct Acceptor<H: Handler> {
    pub listener: OwnedFd,
    pub endpoint: Endpoint,
    pub inboxes: Vec<Arc<Inbox>>,
    pub open: Arc<AtomicUsize>,
    pub max_conns: usize,
    pub stop_fd: RawFd,
    pub handler: Arc<H>,
    /// Set by the console's `drain`: new connections get the protocol's refusal.
    pub draining: Arc<AtomicBool>,
}

impl<H: Handler> Acceptor<H> {
    /// Runs until `stop_fd` becomes readable; the listener closes when this returns.
    pub(crate) fn run(self) {
        let mut lingering: Vec<(OwnedFd, Instant)> = Vec::new();
        let mut backoff_until: Option<Instant> = None;
        let mut last_emfile_log: Option<Instant> = None;
        let mut scratch = [0u8; 512];
        loop {
            let now = Instant::now();
            if backoff_until.is_some_and(|t| now >= t) {
                backoff_until = None;
            }
            let timeout = if lingering.is_empty() && backoff_until.is_none() {
                1000
            } else {
                50
            };
            let ready = if backoff_until.is_some() {
                let r = crate::sys::poll_readable(&[self.stop_fd], timeout);
                vec![false, r[0]]
            } else {
                crate::sys::poll_readable(&[self.listener.as_raw_fd(), self.stop_fd], timeout)
            };
            if ready[1] {
                break;
            }
            lingering.retain(|(fd, deadline)| {
                if Instant::now() >= *deadline {
                    return false;
                }
                loop {
                    match crate::sys::recv_discard(fd.as_raw_fd(), &mut scratch) {
                        Ok(0) => return false,
                        Ok(_) => continue,
                        Err(e) => return e.raw_os_error() == Some(libc::EAGAIN),
                    }
                }
            });
            if !ready[0] {
                continue;
            }
            loop {
                match crate::sys::accept(self.listener.as_raw_fd()) {
                    Ok(Some(fd)) => self.place(fd, &mut lingering),
                    Ok(None) => break,
                    Err(err) => {
                        if matches!(
                            err.raw_os_error(),
                            Some(libc::EMFILE)
                                | Some(libc::ENFILE)
                                | Some(libc::ENOBUFS)
                                | Some(libc::ENOMEM)
                        ) {
                            backoff_until = Some(Instant::now() + FD_BACKOFF);
                            if last_emfile_log.is_none_or(|t| t.elapsed() > Duration::from_secs(10))
                            {
                                eprintln!("ringstore: accept: {err}; pausing accepts briefly");
                                last_emfile_log = Some(Instant::now());
                            }
                        } else {
                            eprintln!("ringstore: accept: {err}");
                        }
                        break;
                    }
                }
            }
        }
    }

    fn place(&self, fd: OwnedFd, lingering: &mut Vec<(OwnedFd, Instant)>) {
        let refused = if self.open.fetch_add(1, Ordering::AcqRel) >= self.max_conns
            || self.draining.load(Ordering::Acquire)
        {
            Some(fd)
        } else {
            let worker = least_loaded(&self.inboxes);
            self.inboxes[worker].push(fd, self.endpoint).err()
        };
        if let Some(fd) = refused {
            self.open.fetch_sub(1, Ordering::AcqRel);
            self.handler.hooks().conn_refused();
            refuse_now(&fd, self.endpoint);
            if lingering.len() < LINGERING_MAX {
                lingering.push((fd, Instant::now() + LINGER));
            }
        }
    }
}
