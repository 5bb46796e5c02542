//! Storage values received straight into the item (issue 38, ADR 0040's receive path).
//!
//! When the command line of a text `set`, `add`, `replace` or `cas`, of a meta `ms` in
//! mode S, E or R without `I`, or the header, extras and key of a binary SET, ADD or
//! REPLACE (quiet or not, with or without a CAS) are whole and at least [`DIRECT_MIN`] bytes of its value are
//! still to come, the session reserves the item in the
//! store ([`ringstore_store::Store::reserve`]: inside the memory budget, evicting as a
//! store does, invisible until committed), copies the value bytes that came with the line
//! into it (once), and from then on tells the runtime where the rest goes
//! ([`Direct::target`]): the runtime receives it into the item's memory and reports how much
//! came ([`Direct::received`]), so the value is never copied out of a receive buffer. Input
//! that still reaches the session meanwhile (a TLS session's plaintext) is copied in. The
//! `\r\n` behind a text or meta value arrives as ordinary input (a binary value has none:
//! the receive that completes it has the session called again to answer); then the command decides under the
//! shard lock and the item replaces the old one atomically ([`Direct::finish`]). A value
//! not followed by `\r\n` is a bad data chunk, as when buffered; a connection closed or cut
//! at `--request-timeout` mid-value gives the reservation back ([`Direct::abandon`]).
//!
//! Only without a data device (a journaled write records the whole value first) and only
//! where no reply is held; otherwise, and whenever the store cannot reserve, the value is
//! buffered as before. `append`/`prepend` (text, and ms modes A and P) stay buffered: their
//! item is the old value joined with the new one, which the store builds under the shard
//! lock from the value as it is at the commit; a reservation made at the header would have
//! to copy an old value that may still change before the commit. An ms with `I` may store
//! its value marked stale, which a reserved item cannot be.

use ringstore_proto::memcache::binary::{self, response, Status, StoreRequest};
use ringstore_proto::memcache::{
    meta_set_head, reply, store_head, KeyBuf, StoreKind, BAD_DATA_CHUNK,
};
use ringstore_store::{ItemRef, NewMeta, Reservation, Store, NEVER};

use super::expiry::{expiry, Expiry};
use super::meta;
use super::storage::{self, Outcome};
use super::Ctx;

/// A value is received into the item when at least this many of its bytes are still to
/// come once its command line is whole. Fewer cost less copied than the receive of their
/// own that the item would take (a completion and a loop turn, ~600 instructions, beside
/// the reservation's two extra lock rounds): under callgrind a pipeline of 4 KiB SETs whose
/// values straddle the receive buffers did 2.6% more instructions per SET when those short
/// remainders went into the item (docs/BENCHMARKS.md, "Values received into the item").
pub const DIRECT_MIN: usize = 4096;

/// The command a value is received for, as much of it as its answer needs.
#[derive(Debug)]
enum Command {
    /// A text `set`, `add`, `replace` or `cas`.
    Text {
        kind: StoreKind,
        cas_unique: u64,
        noreply: bool,
    },
    /// A meta `ms` (mode S, E or R, no `I`): its command line, read again for the answer
    /// (its flags say what the reply echoes).
    Meta { line: Vec<u8> },
    /// A binary SET, ADD or REPLACE (or its quiet form): its header, extras and key, read
    /// again for the answer.
    Binary { head: Vec<u8> },
}

impl Command {
    /// Bytes that follow the value: the text protocols' `\r\n`; none in binary.
    fn trailer_len(&self) -> usize {
        match self {
            Command::Binary { .. } => 0,
            Command::Text { .. } | Command::Meta { .. } => 2,
        }
    }
}

/// A storage command whose value is being received into its reserved item.
#[derive(Debug)]
pub(crate) struct Direct {
    reservation: Reservation,
    command: Command,
    /// The item's key (decoded, for an ms with a base64 key).
    key: Vec<u8>,
    exp: Expiry,
    /// Value bytes in the item so far.
    filled: usize,
    /// Bytes of the `\r\n` behind the value seen so far (0..=2).
    trailer: usize,
    /// A byte of the trailer was not the `\r\n` it should be: a bad data chunk.
    bad: bool,
}

/// What a command line asks to store, for [`Direct::start`].
struct Head {
    command: Command,
    key: Vec<u8>,
    flags: u32,
    exp: Expiry,
    vlen: usize,
}

/// The head of a text storage line, an ms line or a binary storage request (`binary`) that
/// may be received into its item.
fn head(ctx: &Ctx<'_>, line: &[u8], binary: bool) -> Option<Head> {
    if binary {
        return binary_head(ctx, line);
    }
    if let Some((m, vlen)) = meta_set_head(line) {
        if !matches!(m.mode, b'S' | b'E' | b'R') || m.flags.invalidate {
            return None;
        }
        let exp = m
            .flags
            .ttl
            .map_or(Expiry::At(NEVER), |t| expiry(i64::from(t), ctx.now));
        let key = m.key.bytes(&mut KeyBuf::default()).to_vec();
        let command = Command::Meta {
            line: line.to_vec(),
        };
        let flags = m.flags.client_flags;
        return Some(Head {
            command,
            key,
            flags,
            exp,
            vlen,
        });
    }
    let (head, vlen) = store_head(line)?;
    if matches!(head.kind, StoreKind::Append | StoreKind::Prepend) {
        return None;
    }
    let command = Command::Text {
        kind: head.kind,
        cas_unique: head.cas_unique,
        noreply: head.noreply,
    };
    Some(Head {
        command,
        key: head.key.to_vec(),
        flags: head.flags,
        exp: expiry(i64::from(head.exptime), ctx.now),
        vlen,
    })
}

/// The head of a binary SET, ADD or REPLACE (`head`: its header, extras and key).
fn binary_head(ctx: &Ctx<'_>, head: &[u8]) -> Option<Head> {
    let (_, s, vlen) = binary::store_head(head)?;
    if matches!(s.kind, StoreKind::Append | StoreKind::Prepend) {
        return None;
    }
    Some(Head {
        command: Command::Binary {
            head: head.to_vec(),
        },
        key: s.key.to_vec(),
        flags: s.flags,
        exp: expiry(i64::from(s.exptime), ctx.now),
        vlen,
    })
}

impl Direct {
    /// Starts receiving into the item for the storage request at the start of `request`,
    /// whose command line is `line_len` bytes long and whose value has not all arrived;
    /// `None` when it is not received into the item (less than [`DIRECT_MIN`] bytes of it
    /// still to come, not a command that takes it ([`head`]), expired on arrival, or the
    /// store could not reserve). On `Some`, all of `request` is used: the value bytes
    /// after the line are in the item.
    /// `binary`: the session speaks the binary protocol (`line_len` frames the request's
    /// header, extras and key).
    pub(crate) fn start(
        ctx: &Ctx<'_>,
        request: &[u8],
        line_len: usize,
        binary: bool,
    ) -> Option<Direct> {
        let line = request.get(..line_len)?;
        let here = request.len() - line_len;
        let head = head(ctx, line, binary).filter(|h| h.vlen.saturating_sub(here) >= DIRECT_MIN)?;
        let Expiry::At(exptime) = head.exp else {
            return None; // stored as a removal: nothing to receive into
        };
        let meta = NewMeta {
            flags: head.flags,
            exptime,
            cas: None,
        };
        let store = &ctx.shared.store;
        let reservation = store.reserve(&head.key, head.vlen, meta, ctx.now.store)?;
        let mut direct = Direct {
            reservation,
            command: head.command,
            key: head.key,
            exp: head.exp,
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

    /// `n` value bytes were received at [`Direct::target`]. True when the request is
    /// whole with them (a binary value: nothing follows it), to be finished at the next
    /// call.
    pub(crate) fn received(&mut self, n: usize) -> bool {
        assert!(
            n <= self.reservation.len() - self.filled,
            "{n} bytes received past the reserved value"
        );
        self.filled += n;
        self.filled == self.reservation.len() && self.command.trailer_len() == 0
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
        let trailer = self.command.trailer_len();
        let value_whole = self.filled == self.reservation.len();
        while value_whole && self.trailer < trailer && used < input.len() {
            self.bad |= input[used] != b"\r\n"[self.trailer];
            self.trailer += 1;
            used += 1;
        }
        (used, value_whole && self.trailer == trailer)
    }

    /// The request is whole: the command decides and the item is linked (or not), counted
    /// and answered in `out` as a buffered one is (`storage::apply`, `meta::ms`).
    pub(crate) fn finish(self, ctx: &Ctx<'_>, out: &mut Vec<u8>) {
        let store = &ctx.shared.store;
        if self.bad {
            store.abandon(self.reservation);
            match &self.command {
                Command::Text { noreply: true, .. } => {}
                Command::Text { .. } | Command::Meta { .. } => reply::line(out, BAD_DATA_CHUNK),
                // Only a fill that did not land: the item could not be stored.
                Command::Binary { head } => {
                    if let Some((head, _, _)) = binary::store_head(head) {
                        response::error(out, head, Status::OutOfMemory);
                    }
                }
            }
            return;
        }
        ctx.stats.cmd_set.inc();
        let size = self.reservation.len();
        let (key, exp) = (&self.key[..], self.exp);
        match &self.command {
            Command::Text {
                kind,
                cas_unique,
                noreply,
            } => {
                let (kind, cas) = (*kind, *cas_unique);
                let result = store.commit(self.reservation, key, ctx.now.store, |item| {
                    let outcome = decide(kind, item.as_ref(), cas);
                    (outcome == Outcome::Stored, outcome)
                });
                storage::account(ctx, (kind, key, exp, size), &result);
                if !noreply {
                    reply::line(out, storage::reply_line(&result));
                }
            }
            Command::Meta { line } => {
                let Some((m, _)) = meta_set_head(line) else {
                    // Read once already at the start: it cannot fail now.
                    return store.abandon(self.reservation);
                };
                let (mode, cas) = (m.mode, m.flags.cas);
                let result = store.commit(self.reservation, key, ctx.now.store, |item| {
                    let outcome = meta::ms_decide(mode, cas, item.as_ref());
                    (outcome == meta::SetOutcome::Stored, outcome)
                });
                meta::ms_answer(ctx, out, &m, (key, exp, size), result);
            }
            Command::Binary { head } => {
                let Some((head, s, _)) = binary::store_head(head) else {
                    // Read once already at the start: it cannot fail now.
                    return store.abandon(self.reservation);
                };
                let result = commit_binary(ctx, self.reservation, &s);
                storage::account(
                    ctx,
                    (super::binary::store_kind(&s), key, exp, size),
                    &result,
                );
                super::binary::store_answer(out, head, &s, &result);
            }
        }
    }

    /// The value will not be completed (the connection closed or was cut): the item is
    /// never linked and its room goes back.
    pub(crate) fn abandon(self, store: &Store) {
        store.abandon(self.reservation);
    }
}

/// Commits binary storage request `s`'s reserved item as [`storage::apply`] would store it.
fn commit_binary(
    ctx: &Ctx<'_>,
    reservation: Reservation,
    s: &StoreRequest<'_>,
) -> Result<ringstore_store::Updated<Outcome>, ringstore_store::StoreError> {
    let (kind, cas) = (super::binary::store_kind(s), s.cas);
    ctx.shared
        .store
        .commit(reservation, s.key, ctx.now.store, |item| {
            let outcome = decide(kind, item.as_ref(), cas);
            (outcome == Outcome::Stored, outcome)
        })
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
