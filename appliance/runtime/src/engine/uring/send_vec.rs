//! Sending output with spliced values (docs/adr/0027-big-values-sent-from-the-item.md): one
//! `sendmsg` whose iovec runs over the output buffer with each pinned value's arena bytes
//! inserted at its offset (`VALUE` line from the buffer, the value straight from the item,
//! the `\r\n` and what follows from the buffer again). The output is one logical stream
//! (`Conn::sent` counts its bytes); a short send resumes where the kernel stopped.

use super::*;
use ringstore_service::zero_copy::Splice;
use std::os::fd::RawFd;

/// iovec entries one send carries at most (below the kernel's UIO_MAXIOV of 1024); the rest
/// of the output goes in the next send.
pub(crate) const IOV_PER_SEND: usize = 64;

/// A connection's `sendmsg` state, boxed so it stays put while the send is in flight (the
/// connection slab may move the `Conn` itself).
pub(crate) struct VecSend {
    msg: libc::msghdr,
    iov: Vec<libc::iovec>,
}

impl VecSend {
    pub(crate) fn new() -> Box<VecSend> {
        Box::new(VecSend {
            msg: crate::sys::zeroed_msghdr(),
            iov: Vec::with_capacity(IOV_PER_SEND),
        })
    }
}

/// Bytes of the whole output: the buffer and every spliced value.
pub(crate) fn output_len(out: &[u8], splices: &[Splice]) -> usize {
    out.len() + splices.iter().map(|s| s.pin.len()).sum::<usize>()
}

/// The pieces of the output from logical offset `skip` on, as (address, length), at most
/// `max` of them: buffer bytes up to each splice's offset, then its pinned bytes.
pub(crate) fn pieces(
    out: &[u8],
    splices: &[Splice],
    mut skip: usize,
    max: usize,
    mut f: impl FnMut(*const u8, usize),
) {
    let mut emitted = 0;
    let mut prev = 0;
    let tail = [(out.len(), None)];
    let spliced = splices.iter().map(|s| (s.at, Some(&s.pin)));
    for (at, pin) in spliced.chain(tail) {
        let buffer = (out[prev..at].as_ptr(), at - prev);
        let value = pin.map(|p| (p.as_ptr(), p.len()));
        prev = at;
        for (ptr, len) in std::iter::once(buffer).chain(value) {
            if skip >= len {
                skip -= len;
                continue;
            }
            // A pointer into the same piece, not dereferenced here.
            f(ptr.wrapping_add(skip), len - skip);
            skip = 0;
            emitted += 1;
            if emitted == max {
                return;
            }
        }
    }
}

/// The output's pieces from logical offset `sent` on as iovecs in `iov` (cleared first), at
/// most [`IOV_PER_SEND`]: what both engines' vectored sends carry.
pub(crate) fn iovecs(out: &[u8], splices: &[Splice], sent: usize, iov: &mut Vec<libc::iovec>) {
    iov.clear();
    pieces(out, splices, sent, IOV_PER_SEND, |ptr, len| {
        iov.push(libc::iovec {
            iov_base: ptr.cast_mut().cast(),
            iov_len: len,
        })
    });
}

/// A `sendmsg` on `fd` of a connection's output (`out` with its session's `splices`) from
/// `sent` on, at most [`IOV_PER_SEND`] pieces, in the connection's `vec_send` state.
pub(crate) fn entry(
    fd: RawFd,
    out: &[u8],
    sent: usize,
    vec_send: &mut Option<Box<VecSend>>,
    splices: &[Splice],
) -> squeue::Entry {
    let vs = vec_send.get_or_insert_with(VecSend::new);
    iovecs(out, splices, sent, &mut vs.iov);
    vs.msg.msg_iov = vs.iov.as_mut_ptr();
    vs.msg.msg_iovlen = vs.iov.len() as _;
    // The kernel reads the iovec's memory until the completion: the output buffer is not
    // touched while a send is in flight, and each pinned value's segment is neither
    // rewritten nor recycled while its pin is held, which the session keeps until the
    // runtime reports the output sent (`output_flushed`) or the connection closed with
    // nothing in flight (`session_closed`), both after this send's completion.
    opcode::SendMsg::new(types::Fd(fd), &vs.msg)
        .flags(libc::MSG_NOSIGNAL as u32)
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collect(out: &[u8], splices: &[Splice], skip: usize, max: usize) -> Vec<(usize, usize)> {
        let mut v = Vec::new();
        pieces(out, splices, skip, max, |p, l| v.push((p as usize, l)));
        v
    }

    #[test]
    fn pieces_cover_the_buffer_when_nothing_is_spliced() {
        let out = b"hello world".to_vec();
        let base = out.as_ptr() as usize;
        assert_eq!(collect(&out, &[], 0, 8), vec![(base, 11)]);
        assert_eq!(collect(&out, &[], 4, 8), vec![(base + 4, 7)]);
        assert!(collect(&out, &[], 11, 8).is_empty());
    }

    #[test]
    fn pieces_splice_pinned_values_and_resume_after_a_short_send() {
        use ringstore_store::{NewMeta, ReadOpts, Store, StoreConfig, Write};
        let store = Store::new(StoreConfig {
            memory_bytes: 8 << 20,
            item_size_max: 1 << 20,
            shards: 1,
            huge_pages: false,
            external_threshold: 0,
        })
        .expect("store");
        let value = vec![7u8; 20 << 10];
        let meta = NewMeta::default();
        store
            .update(b"k", 1, |_| {
                (
                    Write::Put {
                        value: &value,
                        meta,
                    },
                    (),
                )
            })
            .expect("set");
        let pinned = |store: &Store| {
            let (_, pin) = store
                .journaled(None)
                .try_get_pinned(b"k", 1, ReadOpts::default(), 1, |_, req| req.want())
                .expect("read");
            pin.expect("pin")
        };
        let splices = [
            Splice {
                at: 5,
                pin: pinned(&store),
            },
            Splice {
                at: 5,
                pin: pinned(&store),
            },
        ];
        let (pa, n) = (splices[0].pin.as_ptr() as usize, value.len());
        let out = b"HEAD:\r\n\r\nEND".to_vec();
        let o = out.as_ptr() as usize;
        assert_eq!(output_len(&out, &splices), out.len() + 2 * n);
        assert_eq!(
            collect(&out, &splices, 0, 64),
            vec![(o, 5), (pa, n), (pa, n), (o + 5, 7)],
            "an empty buffer run between two splices is skipped"
        );
        assert_eq!(
            collect(&out, &splices, 7, 64),
            vec![(pa + 2, n - 2), (pa, n), (o + 5, 7)]
        );
        assert_eq!(collect(&out, &splices, 5 + 2 * n + 2, 64), vec![(o + 7, 5)]);
        assert_eq!(
            collect(&out, &splices, 0, 2),
            vec![(o, 5), (pa, n)],
            "at most max"
        );
        for s in splices {
            store.unpin(s.pin);
        }
        assert_eq!(store.stats().pinned_segments, 0);
    }
}
