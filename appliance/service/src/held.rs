//! Replies held until the data device settles the records they answer.
//!
//! A request that staged records (its tokens) gets its reply written, as usual, by the
//! command's code, and then moved here; every later reply of the connection follows it here,
//! so the client sees replies in request order. When the runtime reports a token settled
//! ([`HeldReplies::on_durable`]), each reply whose tokens have all settled goes to the output:
//! its own bytes when every token was made durable, the protocol's failure reply when one
//! was not (nothing for a `noreply` request, whose reply is empty). Nothing is ever spliced
//! into bytes already handed to the runtime.
//!
//! Bound: a session stops taking requests once its output plus what is held here passes
//! the high-water mark, and the runtime reads no more input while anything is held.

use std::collections::VecDeque;

/// A connection's replies waiting for the device, oldest first.
#[derive(Debug, Default)]
pub(crate) struct HeldReplies {
    /// The held replies' bytes, back to back.
    bytes: Vec<u8>,
    replies: VecDeque<Held>,
    /// The newest of this connection's tokens reported settled.
    settled: u64,
}

#[derive(Debug)]
struct Held {
    /// Bytes of the reply at the front of what is left in `bytes`.
    len: usize,
    /// The tokens its request staged, `first..=last` (`None`: none; it only keeps its place).
    tokens: Option<(u64, u64)>,
    /// Released once this token settled: its own last token, or the previous reply's.
    after: u64,
    /// One of its tokens failed: the failure reply goes out instead of its bytes.
    failed: bool,
    /// What goes out instead when it failed.
    failure: Failure,
}

/// The reply that stands in for a held reply whose record failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    /// The protocol's one failure reply (given to [`HeldReplies::on_durable`]); nothing for
    /// a request that had no reply (`noreply`).
    Fixed,
    /// A memcache binary request's: an error frame echoing its opcode and opaque, sent even
    /// for a quiet request (the binary protocol answers errors to those too).
    Binary(ringstore_proto::memcache::binary::Head),
}

/// Where a request's reply is being written: see [`HeldReplies::begin`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Mark {
    staged: u64,
    start: usize,
    /// The reply must be written to [`HeldReplies::buf`].
    pub(crate) held: bool,
}

impl HeldReplies {
    /// True while a reply waits for the device.
    pub(crate) fn is_holding(&self) -> bool {
        !self.replies.is_empty()
    }

    /// Bytes held.
    pub(crate) fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Before a request runs: `staged` is the device's newest token. Returns the mark to pass
    /// to [`HeldReplies::end`] and whether the reply must be written to
    /// [`HeldReplies::buf`] (something is held) rather than to the output.
    pub(crate) fn begin(&self, out: &[u8], staged: u64) -> Mark {
        let held = self.is_holding();
        Mark {
            staged,
            start: if held { self.bytes.len() } else { out.len() },
            held,
        }
    }

    /// The buffer held replies are written to (when [`Mark`] says so).
    pub(crate) fn buf(&mut self) -> &mut Vec<u8> {
        &mut self.bytes
    }

    /// After the request: `staged` is the device's newest token now. A reply to a request
    /// that staged records, or one behind a held reply, is held.
    pub(crate) fn end(&mut self, mark: Mark, out: &mut Vec<u8>, staged: u64) {
        self.end_as(mark, out, staged, Failure::Fixed);
    }

    /// [`HeldReplies::end`], with `failure` standing in for the reply if its records fail.
    /// Inline for the usual request (nothing held, nothing staged: the reply stays in the
    /// output); a call for it cost every request ~20 instructions (callgrind).
    #[inline]
    pub(crate) fn end_as(&mut self, mark: Mark, out: &mut Vec<u8>, staged: u64, failure: Failure) {
        if !mark.held && staged <= mark.staged {
            return;
        }
        self.hold(mark, out, staged, failure);
    }

    /// [`HeldReplies::end_as`] of a reply that is held.
    fn hold(&mut self, mark: Mark, out: &mut Vec<u8>, staged: u64, failure: Failure) {
        let tokens = (staged > mark.staged).then_some((mark.staged + 1, staged));
        let len = if mark.held {
            self.bytes.len() - mark.start
        } else {
            // It staged records (`end_as` kept the rest in the output) and nothing was held,
            // so `bytes` is empty: the reply becomes its first entry.
            debug_assert!(tokens.is_some());
            debug_assert!(self.bytes.is_empty());
            self.bytes.extend_from_slice(&out[mark.start..]);
            out.truncate(mark.start);
            self.bytes.len()
        };
        let after = match (tokens, self.replies.back()) {
            (Some((_, last)), _) => last,
            (None, Some(prev)) => prev.after,
            (None, None) => self.settled,
        };
        self.replies.push_back(Held {
            len,
            tokens,
            after,
            failed: false,
            failure,
        });
    }

    /// Runs one request whose reply `f` writes into the buffer it is given: the output, or
    /// behind what is held. `staged` reads the device's newest token, before and after.
    pub(crate) fn around<R>(
        &mut self,
        out: &mut Vec<u8>,
        staged: impl Fn() -> u64,
        failure: Failure,
        f: impl FnOnce(&mut Vec<u8>) -> R,
    ) -> R {
        let mark = self.begin(out, staged());
        let result = f(if mark.held {
            &mut self.bytes
        } else {
            &mut *out
        });
        self.end_as(mark, out, staged(), failure);
        result
    }

    /// Writes a reply that stages nothing (an error before a close, say) with `f`: to the
    /// output, or behind what is held.
    pub(crate) fn write(&mut self, out: &mut Vec<u8>, f: impl FnOnce(&mut Vec<u8>)) {
        let mark = self.begin(out, 0);
        if mark.held {
            f(&mut self.bytes);
        } else {
            f(out);
        }
        self.end(mark, out, 0);
    }

    /// The runtime settled `token`, one of this connection's (reported in increasing order):
    /// made durable when `ok`. Replies now complete go to `out`, `failure` standing in for a
    /// failed one. Returns the bytes added to `out`.
    pub(crate) fn on_durable(
        &mut self,
        token: u64,
        ok: bool,
        out: &mut Vec<u8>,
        failure: &[u8],
    ) -> usize {
        debug_assert!(token > self.settled, "tokens are reported in order");
        self.settled = self.settled.max(token);
        if !ok {
            for r in self.replies.iter_mut() {
                if r.tokens
                    .is_some_and(|(first, last)| (first..=last).contains(&token))
                {
                    r.failed = true;
                }
            }
        }
        let before = out.len();
        let mut used = 0;
        while self
            .replies
            .front()
            .is_some_and(|r| r.after <= self.settled)
        {
            let Some(r) = self.replies.pop_front() else {
                break;
            };
            let bytes = &self.bytes[used..used + r.len];
            match (r.failed, r.failure) {
                (false, _) => out.extend_from_slice(bytes),
                (true, Failure::Fixed) if !bytes.is_empty() => out.extend_from_slice(failure),
                (true, Failure::Fixed) => {}
                (true, Failure::Binary(head)) => crate::durable_failure_reply_binary(head, out),
            }
            used += r.len;
        }
        self.bytes.drain(..used);
        if self.replies.is_empty() && self.bytes.capacity() > 64 << 10 {
            self.bytes = Vec::new();
        }
        out.len() - before
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FAIL: &[u8] = b"FAIL\r\n";

    /// Runs a request writing `reply`, staging `records` tokens from `*next` on.
    fn request(h: &mut HeldReplies, out: &mut Vec<u8>, next: &mut u64, reply: &[u8], records: u64) {
        let mark = h.begin(out, *next);
        if mark.held {
            h.buf().extend_from_slice(reply);
        } else {
            out.extend_from_slice(reply);
        }
        *next += records;
        h.end(mark, out, *next);
    }

    #[test]
    fn replies_without_records_pass_straight_through() {
        let (mut h, mut out, mut next) = (HeldReplies::default(), Vec::new(), 0);
        request(&mut h, &mut out, &mut next, b"VALUE\r\n", 0);
        assert_eq!(out, b"VALUE\r\n");
        assert!(!h.is_holding());
    }

    #[test]
    fn a_reply_waits_for_its_token_and_later_replies_wait_behind_it() {
        let (mut h, mut out, mut next) = (HeldReplies::default(), Vec::new(), 0);
        request(&mut h, &mut out, &mut next, b"A\r\n", 0);
        request(&mut h, &mut out, &mut next, b"STORED\r\n", 1);
        request(&mut h, &mut out, &mut next, b"HIT\r\n", 0);
        request(&mut h, &mut out, &mut next, b"STORED2\r\n", 2);
        assert_eq!(out, b"A\r\n", "held behind token 1");
        assert_eq!(h.on_durable(1, true, &mut out, FAIL), 13);
        assert_eq!(out, b"A\r\nSTORED\r\nHIT\r\n");
        h.on_durable(2, false, &mut out, FAIL);
        assert_eq!(out, b"A\r\nSTORED\r\nHIT\r\n", "token 3 still open");
        h.on_durable(3, true, &mut out, FAIL);
        assert_eq!(out, b"A\r\nSTORED\r\nHIT\r\nFAIL\r\n");
        assert!(!h.is_holding());
        assert_eq!(h.len(), 0);
    }

    #[test]
    fn a_failed_noreply_write_answers_nothing() {
        let (mut h, mut out, mut next) = (HeldReplies::default(), Vec::new(), 0);
        request(&mut h, &mut out, &mut next, b"", 1);
        request(&mut h, &mut out, &mut next, b"END\r\n", 0);
        h.on_durable(1, false, &mut out, FAIL);
        assert_eq!(out, b"END\r\n");
    }

    #[test]
    fn a_failed_binary_write_answers_its_own_error_frame_even_when_quiet() {
        use ringstore_proto::memcache::binary::{Head, Status};
        let (mut h, mut out) = (HeldReplies::default(), Vec::new());
        let head = Head {
            opcode: 0x11,
            opaque: 77,
        };
        let mark = h.begin(&out, 0);
        h.end_as(mark, &mut out, 1, Failure::Binary(head));
        h.on_durable(1, false, &mut out, FAIL);
        let mut want = Vec::new();
        ringstore_proto::memcache::binary::response::error(&mut want, head, Status::Internal);
        assert_eq!(out, want);
    }

    #[test]
    fn tokens_of_other_connections_never_hold_a_reply() {
        // This connection's tokens are 1 and 5; 2..=4 belonged to others and are never
        // reported here, so a reply with no records behind token 1 must not wait for them.
        let (mut h, mut out) = (HeldReplies::default(), Vec::new());
        let mut next = 0;
        request(&mut h, &mut out, &mut next, b"S1\r\n", 1);
        next = 4;
        request(&mut h, &mut out, &mut next, b"G\r\n", 0);
        request(&mut h, &mut out, &mut next, b"S5\r\n", 1);
        h.on_durable(1, true, &mut out, FAIL);
        assert_eq!(out, b"S1\r\nG\r\n");
        h.on_durable(5, true, &mut out, FAIL);
        assert_eq!(out, b"S1\r\nG\r\nS5\r\n");
    }
}
