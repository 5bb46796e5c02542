//! The readiness runtime's send of output with spliced values (ADR 0027, 0033): one
//! nonblocking `sendmsg` whose iovec runs over the output buffer with each pinned value's
//! arena bytes at its offset, the same pieces the io_uring worker's SENDMSG carries
//! (`engine/uring/send_vec.rs`). The iovecs go to the kernel as raw addresses
//! (`sys::sendmsg_iovecs_nowait`), so this module needs no `unsafe`.

use std::os::fd::RawFd;

use ringstore_service::zero_copy::Splice;

use crate::engine::uring::send_vec::{iovecs, IOV_PER_SEND};

/// Sends `out` with `splices` from logical offset `sent` on: at most [`IOV_PER_SEND`] pieces.
pub(super) fn send(fd: RawFd, out: &[u8], splices: &[Splice], sent: usize) -> crate::sys::Transfer {
    let mut iov: Vec<libc::iovec> = Vec::with_capacity(IOV_PER_SEND);
    iovecs(out, splices, sent, &mut iov);
    crate::sys::sendmsg_iovecs_nowait(fd, &iov)
}
