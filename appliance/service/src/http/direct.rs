//! PUT bodies received straight into the item (issue 38), as memcache storage values are
//! (`memcache/direct.rs`).
//!
//! A PUT whose `Content-Length` body fits an item and has at least [`DIRECT_MIN`] bytes
//! still to come once its head is read reserves its item in the store
//! ([`Backend::reserve`]: inside the memory budget, invisible until committed), copies the
//! body bytes that came with the head into it (once), and from then on tells the runtime
//! where the rest goes ([`HttpSession::recv_target`]). The receive that completes the body
//! has the session called again ([`Flow::Drain`]); the item then replaces the old one
//! atomically ([`Backend::commit_put`]) and the PUT is answered as a buffered one is. A
//! connection closed or cut at `--request-timeout` mid-body gives the reservation back.
//! Not with a data device (its journal records whole values), not while a response is
//! held, and never for chunked bodies (their length is not known ahead).

use ringstore_store::Reservation;

use super::{Backend, HttpSession, PendingPut, State, Step};
use crate::memcache::DIRECT_MIN;
use crate::{Flow, Now};

/// A PUT whose body is being received into its reserved item.
pub(super) struct PutDirect {
    put: PendingPut,
    reservation: Reservation,
    /// Body bytes in the item so far.
    filled: usize,
    /// A copy into the item did not land: the PUT is not stored.
    bad: bool,
}

impl HttpSession {
    /// From now on, a PUT body of [`DIRECT_MIN`] bytes and more still to come is received
    /// into its item: a connection's session, whose runtime asks
    /// [`HttpSession::recv_target`] before each receive.
    pub fn enable_direct(&mut self) {
        self.direct_on = true;
    }

    /// Where the runtime receives the next input: the missing bytes of a PUT body being
    /// received into its item (their first byte and how many), or `None`.
    pub fn recv_target(&self) -> Option<(*mut u8, usize)> {
        let State::PutDirect(d) = &self.state else {
            return None;
        };
        let left = d.reservation.len() - d.filled;
        (left > 0).then(|| (d.reservation.as_mut_ptr().wrapping_add(d.filled), left))
    }

    /// `n` bytes were received at [`HttpSession::recv_target`]: [`Flow::Drain`] when they
    /// completed the body (the session answers at its next call).
    pub fn received_into(&mut self, n: usize) -> Flow {
        let State::PutDirect(d) = &mut self.state else {
            return Flow::Continue;
        };
        assert!(
            n <= d.reservation.len() - d.filled,
            "{n} bytes received past the reserved body"
        );
        d.filled += n;
        if d.filled == d.reservation.len() {
            Flow::Drain
        } else {
            Flow::Continue
        }
    }

    /// A PUT body of `len` bytes of which `here` arrived with what was read: reserved and
    /// received into its item from now on when that is worth it (`state` becomes
    /// [`State::PutDirect`]); false: it is buffered as before.
    pub(super) fn start_direct<B: Backend>(
        &mut self,
        (len, here): (usize, usize),
        held: bool,
        now: Now,
        backend: &B,
    ) -> bool {
        if !self.direct_on || held || len.saturating_sub(here) < DIRECT_MIN {
            return false;
        }
        let State::PutLength { put, .. } = &self.state else {
            return false;
        };
        let Some(reservation) = backend.reserve(put.key.as_bytes(), len, put.flags, put.ttl, now)
        else {
            return false;
        };
        let State::PutLength { put, .. } = std::mem::replace(&mut self.state, State::Head) else {
            unreachable!("matched above")
        };
        self.state = State::PutDirect(Box::new(PutDirect {
            put,
            reservation,
            filled: 0,
            bad: false,
        }));
        true
    }

    /// A step while a body is received into its item: body bytes in `data[pos..]` are
    /// copied in; once whole, the PUT is committed and answered.
    pub(super) fn direct_step<B: Backend>(
        &mut self,
        data: &[u8],
        pos: usize,
        now: Now,
        backend: &B,
        out: &mut Vec<u8>,
    ) -> Step {
        let State::PutDirect(d) = &mut self.state else {
            unreachable!("called in the PutDirect state")
        };
        let n = (d.reservation.len() - d.filled).min(data.len() - pos);
        if n > 0 {
            d.bad |= !backend.fill(&d.reservation, d.filled, &data[pos..pos + n]);
            d.filled += n;
        }
        if d.filled < d.reservation.len() {
            return Step::Wait(pos + n);
        }
        let State::PutDirect(d) = std::mem::replace(&mut self.state, State::Head) else {
            unreachable!("matched above")
        };
        let outcome = if d.bad {
            backend.abandon(d.reservation);
            super::PutOutcome::OutOfMemory
        } else {
            backend.commit_put(d.reservation, d.put.key.as_bytes(), now)
        };
        let status = super::reply::answer_put(outcome, d.put.connection, out);
        self.put_answered(&d.put, status, backend);
        Step::Next(pos + n)
    }

    /// The connection is gone: a body being received into its item never will be.
    pub(super) fn abandon_direct<B: Backend>(&mut self, backend: &B) {
        if !matches!(self.state, State::PutDirect(_)) {
            return;
        }
        if let State::PutDirect(d) = std::mem::replace(&mut self.state, State::Closed) {
            backend.abandon(d.reservation);
        }
    }
}
