//! Storage values received straight into the item (issue 38, ADR 0040's receive path).
//!
//! When the command line of a text `set`, `add`, `replace` or `cas` is whole and at least
//! [`DIRECT_MIN`] bytes of its value are still to come, the session reserves the item in the
//! store ([`ringstore_store::Store::reserve`]: inside the memory budget, evicting as a
//! store does, invisible until committed), copies the value bytes that came with the line
//! into it (once), and from then on tells the runtime where the rest goes
//! ([`Direct::target`]): the runtime receives it into the item's memory and reports how much
//! came ([`Direct::received`]), so the value is never copied out of a receive buffer. Input
//! that still reaches the session meanwhile (a TLS session's plaintext) is copied in. The
//! `\r\n` behind the value arrives as ordinary input; then the command decides under the
//! shard lock and the item replaces the old one atomically ([`Direct::finish`]). A value
//! not followed by `\r\n` is a bad data chunk, as when buffered; a connection closed or cut
//! at `--request-timeout` mid-value gives the reservation back ([`Direct::abandon`]).
//!
//! Only without a data device (a journaled write records the whole value first) and only
//! where no reply is held; otherwise, and whenever the store cannot reserve, the value is
//! buffered as before.

use ringstore_proto::memcache::{reply, store_head, StoreKind, BAD_DATA_CHUNK};
use ringstore_store::{ItemRef, NewMeta, Reservation, Store};

use super::expiry::{expiry, Expiry};
use super::storage::{self, Outcome};
use super::Ctx;

/// A value is received into the item when at least this many of its bytes are still to
/// come once its command line is whole. Fewer cost less copied than the receive of their
/// own that the item would take (a completion and a loop turn, ~600 instructions, beside
/// the reservation's two extra lock rounds): under callgrind a pipeline of 4 KiB SETs whose
/// values straddle the receive buffers did 2.6% more instructions per SET when those short
/// remainders went into the item (docs/BENCHMARKS.md, "Values received into the item").
pub const DIRECT_MIN: usize = 4096;

/// A storage command whose value is being received into its reserved item.
#[derive(Debug)]
pub(crate) struct Direct {
    reservation: Reservation,
    kind: StoreKind,
    key: Vec<u8>,
    cas_unique: u64,
    noreply: bool,
    exp: Expiry,
    /// Value bytes in the item so far.
    filled: usize,
    /// Bytes of the `\r\n` behind the value seen so far (0..=2).
    trailer: usize,
    /// A byte of the trailer was not the `\r\n` it should be: a bad data chunk.
    bad: bool,
}

impl Direct {
    /// Starts receiving into the item for the storage request at the start of `request`,
    /// whose command line is `line_len` bytes long and whose value has not all arrived;
    /// `None` when it is not received into the item (less than [`DIRECT_MIN`] bytes of it
    /// still to come, not a text set, add,
    /// replace or cas, expired on arrival, or the store could not reserve). On `Some`, all
    /// of `request` is used: the value bytes after the line are in the item.
    pub(crate) fn start(ctx: &Ctx<'_>, request: &[u8], line_len: usize) -> Option<Direct> {
        let (head, vlen) = store_head(request.get(..line_len)?)?;
        let here = request.len() - line_len;
        if vlen.saturating_sub(here) < DIRECT_MIN
            || matches!(head.kind, StoreKind::Append | StoreKind::Prepend)
        {
            return None;
        }
        let Expiry::At(exptime) = expiry(i64::from(head.exptime), ctx.now) else {
            return None; // stored as a removal: nothing to receive into
        };
        let meta = NewMeta {
            flags: head.flags,
            exptime,
            cas: None,
        };
        let store = &ctx.shared.store;
        let reservation = store.reserve(head.key, vlen, meta, ctx.now.store)?;
        let mut direct = Direct {
            reservation,
            kind: head.kind,
            key: head.key.to_vec(),
            cas_unique: head.cas_unique,
            noreply: head.noreply,
            exp: Expiry::At(exptime),
            filled: 0,
            trailer: 0,
            bad: false,
        };
        let (used, whole) = direct.absorb(store, &request[line_len..]);
        debug_assert!(
            used == request.len() - line_len && !whole,
            "the value was awaited"
        );
        Some(direct)
    }

    /// Where the rest of the value may be received: its first missing byte and how many
    /// are missing (`None` once the value is whole). The bytes are the reserved item's,
    /// pinned until [`Direct::finish`] or [`Direct::abandon`]; nothing else writes them.
    pub(crate) fn target(&self) -> Option<(*mut u8, usize)> {
        let left = self.reservation.len() - self.filled;
        (left > 0).then(|| {
            let at = self.reservation.as_mut_ptr().wrapping_add(self.filled);
            (at, left)
        })
    }

    /// `n` value bytes were received at [`Direct::target`].
    pub(crate) fn received(&mut self, n: usize) {
        assert!(
            n <= self.reservation.len() - self.filled,
            "{n} bytes received past the reserved value"
        );
        self.filled += n;
    }

    /// Input while the value is outstanding: value bytes are copied into the item, then the
    /// `\r\n` behind it is checked. Returns the bytes used and whether the request is whole.
    pub(crate) fn absorb(&mut self, store: &Store, input: &[u8]) -> (usize, bool) {
        let n = (self.reservation.len() - self.filled).min(input.len());
        if n > 0 {
            // A fill that did not land is a value not stored: answered as bad data, never
            // stored with the bytes it missed.
            self.bad |= !store.fill(&self.reservation, self.filled, &input[..n]);
            self.filled += n;
        }
        let mut used = n;
        while self.filled == self.reservation.len() && self.trailer < 2 && used < input.len() {
            self.bad |= input[used] != b"\r\n"[self.trailer];
            self.trailer += 1;
            used += 1;
        }
        (used, self.trailer == 2)
    }

    /// The request is whole: the command decides and the item is linked (or not), counted
    /// and answered in `out` as a buffered one is (`storage::apply`).
    pub(crate) fn finish(self, ctx: &Ctx<'_>, out: &mut Vec<u8>) {
        let store = &ctx.shared.store;
        if self.bad {
            store.abandon(self.reservation);
            if !self.noreply {
                reply::line(out, BAD_DATA_CHUNK);
            }
            return;
        }
        ctx.stats.cmd_set.inc();
        let (kind, cas) = (self.kind, self.cas_unique);
        let size = self.reservation.len();
        let result = store.commit(self.reservation, &self.key, ctx.now.store, |item| {
            let outcome = decide(kind, item.as_ref(), cas);
            (outcome == Outcome::Stored, outcome)
        });
        storage::account(ctx, (kind, &self.key, self.exp, size), &result);
        if !self.noreply {
            reply::line(out, storage::reply_line(&result));
        }
    }

    /// The value will not be completed (the connection closed or was cut): the item is
    /// never linked and its room goes back.
    pub(crate) fn abandon(self, store: &Store) {
        store.abandon(self.reservation);
    }
}

/// What a set, add, replace or cas (with `cas`) does given the current item.
fn decide(kind: StoreKind, item: Option<&ItemRef<'_>>, cas: u64) -> Outcome {
    match (kind, item) {
        (StoreKind::Add, Some(_)) | (StoreKind::Replace, None) => Outcome::NotStored,
        (StoreKind::Cas, None) => Outcome::NotFound,
        (StoreKind::Cas, Some(it)) if it.cas != cas => Outcome::Exists,
        _ => Outcome::Stored,
    }
}
