//! The worker's unsafe edge with its ring, and nothing else: pushing SQEs whose pointers
//! must stay valid until their completions, and adopting the descriptor an accept
//! completion returns. Only this code knows those lifetimes (ADR-0017's amendment), so the
//! runtime's `unsafe` allowance for the worker covers this module alone.

use std::os::fd::{FromRawFd, OwnedFd};

use super::Worker;
use crate::handler::Handler;

impl<H: Handler> Worker<H> {
    /// Pushes queued entries (submitting early if the SQ is full), then one enter that also waits.
    pub(super) fn submit_and_wait(&mut self) -> std::io::Result<()> {
        let mut next = 0;
        while next < self.pending.len() {
            {
                let mut sq = self.ring.submission();
                while next < self.pending.len() {
                    // Output buffers and own receive buffers are not touched or freed while their op
                    // is in flight, the pool lives as long as the ring, the inbox word is leaked, the
                    // timespec is copied by the kernel at submission, data-device batch buffers
                    // stay in `DeviceWorker::inflight` until their completion (the device fd with them),
                    // and the compactor's erase block and read buffer stay put until theirs; the
                    // UDP receive's msghdr and buffer group live as long as the ring, and a UDP
                    // send slot (msghdr, iovecs, address, GSO control message, bytes, in a slice
                    // that is never resized) and its follower slots are not reused until the
                    // lead's completion (`Sends::send_done`). A connection's vectored send
                    // (`engine/uring/send_vec.rs`) has its boxed msghdr and iovec in the `Conn`, untouched
                    // until the completion, and its iovec points at the output buffer and at pinned
                    // arena bytes: the pin invariant (store/src/pin.rs) is that a pinned segment is
                    // not recycled or rewritten until the pin is released, and the session releases
                    // its pins only in `output_flushed` / `session_closed`, which the worker calls
                    // after this send's completion (never with a send in flight). A receive
                    // into a reserved item (`Handler::recv_target`, issue 38) writes pinned
                    // arena bytes that only it writes: the session gives the reservation back
                    // only when it is next called or closed, which the worker does after this
                    // receive's completion (a close waits for the operations in flight).
                    // SAFETY: every entry points only at memory that outlives its completion (above).
                    if unsafe { sq.push(&self.pending[next]) }.is_err() {
                        break;
                    }
                    next += 1;
                }
            }
            if next < self.pending.len() {
                self.enter(0)?;
            }
        }
        self.pending.clear();
        let mut next = 0;
        while next < self.pending_chains.len() {
            {
                let mut sq = self.ring.submission();
                while next < self.pending_chains.len() {
                    // Data-device batch buffers stay in `DeviceWorker::inflight` and an
                    // erase's block in the compactor until their completion (see above); a
                    // flush points at no memory.
                    // SAFETY: both entries point only at memory that outlives their completions.
                    if unsafe { sq.push_multiple(&self.pending_chains[next]) }.is_err() {
                        break; // both or neither: the chain never spans two submissions
                    }
                    next += 1;
                }
            }
            if next < self.pending_chains.len() {
                self.enter(0)?;
            }
        }
        self.pending_chains.clear();
        if self.wait_fd.is_some() {
            return self.wait_in_eventfd();
        }
        self.enter(1)
    }
}

/// The descriptor a successful accept completion (`res >= 0`) returned, owned from now on.
pub(super) fn adopt_accepted(res: i32) -> OwnedFd {
    debug_assert!(res >= 0, "only a successful accept returns a descriptor");
    // SAFETY: a successful accept completion's result is a fresh descriptor that nobody
    // else owns; this is the only place it is wrapped.
    unsafe { OwnedFd::from_raw_fd(res) }
}
