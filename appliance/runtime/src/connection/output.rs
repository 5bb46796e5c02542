//! A connection's output as one logical stream, the same for both engines (ADR 0027, 0040):
//! the output buffer with each pinned value's arena bytes at its offset (`VALUE` line from
//! the buffer, the value straight from the item, the `\r\n` and what follows from the buffer
//! again). `Conn::sent` counts the stream's bytes; a short send resumes where the kernel
//! stopped. Both engines' vectored sends carry the pieces as [`Iovecs`]: the io_uring
//! worker's SENDMSG (`engine/uring/send_vec.rs`), the readiness engine's nonblocking
//! `sendmsg` (`sys::sendmsg_iovecs_nowait`).

use ringstore_service::zero_copy::Splice;

/// iovec entries one send carries at most (below the kernel's UIO_MAXIOV of 1024); the rest
/// of the output goes in the next send.
pub(crate) const IOV_PER_SEND: usize = 64;

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

/// The iovecs of one vectored send: a fixed array of [`IOV_PER_SEND`] entries, so a send
/// allocates nothing (the io_uring worker keeps one per connection, boxed with its msghdr;
/// the readiness engine one on the stack per send).
pub(crate) struct Iovecs {
    iov: [libc::iovec; IOV_PER_SEND],
    len: usize,
}

impl Iovecs {
    pub(crate) fn new() -> Iovecs {
        let empty = libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        };
        Iovecs {
            iov: [empty; IOV_PER_SEND],
            len: 0,
        }
    }

    /// The output's pieces from logical offset `sent` on, at most [`IOV_PER_SEND`] (what
    /// was there before is replaced).
    pub(crate) fn fill(&mut self, out: &[u8], splices: &[Splice], sent: usize) {
        let (iov, len) = (&mut self.iov, &mut self.len);
        *len = 0;
        pieces(out, splices, sent, IOV_PER_SEND, |ptr, n| {
            iov[*len] = libc::iovec {
                iov_base: ptr.cast_mut().cast(),
                iov_len: n,
            };
            *len += 1;
        });
    }

    /// The filled entries.
    pub(crate) fn as_slice(&self) -> &[libc::iovec] {
        &self.iov[..self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iovecs_hold_at_most_a_sends_worth() {
        let out = vec![1u8; 10];
        let mut iov = Iovecs::new();
        iov.fill(&out, &[], 3);
        assert_eq!(iov.as_slice().len(), 1);
        assert_eq!(iov.as_slice()[0].iov_len, 7);
        iov.fill(&out, &[], 10);
        assert!(
            iov.as_slice().is_empty(),
            "a refill replaces what was there"
        );
    }

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
