//! The readiness runtime's send of output with spliced values (ADR 0027, 0033): one
//! nonblocking `sendmsg` whose iovec runs over the output buffer with each pinned value's
//! arena bytes at its offset, the same pieces the io_uring worker's SENDMSG carries
//! (`worker/send_vec.rs`).

use std::io::IoSlice;
use std::os::fd::RawFd;

use ringstore_service::zero_copy::Splice;

use crate::worker::send_vec::{pieces, IOV_PER_SEND};

/// Sends `out` with `splices` from logical offset `sent` on: at most [`IOV_PER_SEND`] pieces.
pub(super) fn send(fd: RawFd, out: &[u8], splices: &[Splice], sent: usize) -> crate::sys::Transfer {
    let mut iov: Vec<IoSlice<'_>> = Vec::with_capacity(IOV_PER_SEND);
    pieces(out, splices, sent, IOV_PER_SEND, |ptr, len| {
        // SAFETY: each piece is either a range of `out` (borrowed for this call) or a range
        // of a pinned value: the store neither rewrites nor recycles a pinned segment until
        // the pin is released, which the session does only after the runtime reports the
        // output sent or the connection closed — both after this call returns (the kernel
        // copies the bytes into the socket before `sendmsg` returns).
        let bytes = unsafe { std::slice::from_raw_parts(ptr, len) };
        iov.push(IoSlice::new(bytes));
    });
    crate::sys::sendmsg_nowait(fd, &iov)
}
