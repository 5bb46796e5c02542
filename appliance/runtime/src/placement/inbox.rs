//! A worker's inbox: accepted fds handed over by the acceptors through a bounded mutex queue,
//! signalled by an eventfd the worker keeps a read armed on (ADR-0001 placement).

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::placement::listeners::Endpoint;

/// One worker's queue of new connections and its load (active + queued connections).
pub(crate) struct Inbox {
    queue: Mutex<VecDeque<(OwnedFd, Endpoint)>>,
    capacity: usize,
    eventfd: OwnedFd,
    load: AtomicUsize,
}

impl Inbox {
    pub(crate) fn new(capacity: usize) -> std::io::Result<Inbox> {
        Ok(Inbox {
            queue: Mutex::new(VecDeque::with_capacity(capacity.min(1024))),
            capacity,
            eventfd: crate::sys::eventfd()?,
            load: AtomicUsize::new(0),
        })
    }

    pub(crate) fn eventfd(&self) -> RawFd {
        self.eventfd.as_raw_fd()
    }

    /// Active plus queued connections.
    pub(crate) fn load(&self) -> usize {
        self.load.load(Ordering::Relaxed)
    }

    /// Queues a connection and wakes the worker; gives the fd back when the queue is full.
    pub(crate) fn push(&self, fd: OwnedFd, endpoint: Endpoint) -> Result<(), OwnedFd> {
        {
            let mut queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
            if queue.len() >= self.capacity {
                return Err(fd);
            }
            queue.push_back((fd, endpoint));
        }
        self.load.fetch_add(1, Ordering::Relaxed);
        crate::sys::eventfd_signal(self.eventfd());
        Ok(())
    }

    /// Resets the wakeup counter (the readiness runtime's level-triggered watch of it; the
    /// io_uring worker's read does this itself).
    pub(crate) fn clear_wakeups(&self) {
        use std::os::fd::AsFd;
        let _ = crate::sys::eventfd_read(self.eventfd.as_fd());
    }

    /// Wakes the worker without a connection (stop requests).
    pub(crate) fn wake(&self) {
        crate::sys::eventfd_signal(self.eventfd());
    }

    /// Takes every queued connection (they stay counted in the load until closed).
    pub(crate) fn drain_into(&self, into: &mut Vec<(OwnedFd, Endpoint)>) {
        let mut queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        into.extend(queue.drain(..));
    }

    /// Counts a connection the worker accepted itself (reuseport mode).
    pub(crate) fn add_load(&self) {
        self.load.fetch_add(1, Ordering::Relaxed);
    }

    /// A connection of this worker closed.
    pub(crate) fn connection_closed(&self) {
        self.load.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The worker with the fewest active + queued connections (ties: the lowest index).
pub(crate) fn least_loaded(inboxes: &[std::sync::Arc<Inbox>]) -> usize {
    let mut best = 0;
    let mut best_load = usize::MAX;
    for (i, inbox) in inboxes.iter().enumerate() {
        let load = inbox.load();
        if load < best_load {
            best = i;
            best_load = load;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringstore_service::Protocol;
    use std::sync::Arc;

    fn fd() -> OwnedFd {
        crate::sys::eventfd().unwrap()
    }

    #[test]
    fn bounded_and_balanced() {
        let inboxes: Vec<Arc<Inbox>> = (0..3).map(|_| Arc::new(Inbox::new(2).unwrap())).collect();
        for _ in 0..6 {
            let w = least_loaded(&inboxes);
            inboxes[w]
                .push(fd(), Endpoint::plain(Protocol::Memcache))
                .map_err(drop)
                .unwrap();
        }
        assert!(inboxes.iter().all(|i| i.load() == 2), "round robin by load");
        assert!(
            inboxes[0]
                .push(fd(), Endpoint::plain(Protocol::Http))
                .is_err(),
            "queue is bounded"
        );
        let mut taken = Vec::new();
        inboxes[1].drain_into(&mut taken);
        assert_eq!(taken.len(), 2);
        assert_eq!(
            inboxes[1].load(),
            2,
            "drained connections stay counted until closed"
        );
        inboxes[1].connection_closed();
        assert_eq!(least_loaded(&inboxes), 1);
    }
}
