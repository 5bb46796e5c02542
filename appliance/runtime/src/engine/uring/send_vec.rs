//! The io_uring worker's send of output with spliced values (docs/adr/0027-big-values-sent-from-the-item.md):
//! one SENDMSG whose iovec runs over the output stream's pieces (`connection/output.rs`,
//! the same pieces the readiness engine sends), at most [`IOV_PER_SEND`](crate::connection::output::IOV_PER_SEND) of them.

use super::*;
use crate::connection::output::Iovecs;
use ringstore_service::zero_copy::Splice;
use std::os::fd::RawFd;

/// A connection's `sendmsg` state, boxed so it stays put while the send is in flight (the
/// connection slab may move the `Conn` itself).
pub(crate) struct VecSend {
    msg: libc::msghdr,
    iov: Iovecs,
}

impl VecSend {
    pub(crate) fn new() -> Box<VecSend> {
        Box::new(VecSend {
            msg: crate::sys::zeroed_msghdr(),
            iov: Iovecs::new(),
        })
    }
}

/// A `sendmsg` on `fd` of a connection's output (`out` with its session's `splices`) from
/// `sent` on, at most `IOV_PER_SEND` pieces, in the connection's `vec_send` state.
pub(crate) fn entry(
    fd: RawFd,
    out: &[u8],
    sent: usize,
    vec_send: &mut Option<Box<VecSend>>,
    splices: &[Splice],
) -> squeue::Entry {
    let vs = vec_send.get_or_insert_with(VecSend::new);
    vs.iov.fill(out, splices, sent);
    let iov = vs.iov.as_slice();
    vs.msg.msg_iov = iov.as_ptr().cast_mut();
    vs.msg.msg_iovlen = iov.len() as _;
    // The kernel reads the iovec's memory until the completion: the output buffer is not
    // touched while a send is in flight, and each pinned value's segment is neither
    // rewritten nor recycled while its pin is held, which the session keeps until the
    // runtime reports the output sent (`output_flushed`) or the connection closed with
    // nothing in flight (`session_closed`), both after this send's completion.
    opcode::SendMsg::new(types::Fd(fd), &vs.msg)
        .flags(libc::MSG_NOSIGNAL as u32)
        .build()
}
