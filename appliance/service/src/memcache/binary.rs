//! The memcache binary protocol in a session: requests parsed by
//! `ringstore_proto::memcache::binary`, executed against the same store with the text
//! commands' code (storage, arith, get counting, flush_all, stats), answered in binary
//! frames.
//!
//! A connection speaks it from its first byte on when that byte is the request magic
//! (0x80), as memcached decides. The session's bounds are the text protocol's: input is
//! parsed where it lies, a value in flight is reserved in the connection-memory budget
//! before it is buffered (refused with "Out of memory" and swallowed when it does not fit),
//! a value over the item limit is refused from its header and swallowed, a hit is copied
//! only when the output has room in the budget, and parsing stops at the output high-water
//! mark. Replies wait behind the data device exactly like text replies; one whose record
//! fails is answered with an internal-error frame echoing its opcode and opaque.

use ringstore_proto::memcache::binary::{
    self, response, ArithRequest, GetRequest, Head, Parse, Request, Status, StoreRequest,
    HEADER_LEN, NO_CREATE,
};
use ringstore_proto::memcache::misc::StatsRequest;
use ringstore_proto::memcache::StoreKind;
use ringstore_store::{ReadOpts, StoreError, Write};

use super::arith::{self, Outcome as ArithOutcome};
use super::expiry::{expiry, Expiry};
use super::storage::{self, Outcome, Value};
use super::{admin, get, stats, Ctx, MemcacheSession, COMPAT_VERSION};
use crate::budget::Hold;
use crate::held::{Failure, HeldReplies};
use crate::zero_copy::ZeroCopy;
use crate::Flow;

/// A binary request on a connection that has not logged in under `--auth-file`: memcached
/// `-S`'s answer, an "Auth failure." frame (0x20) echoing opcode and opaque, then the
/// connection is closed. A storage request's value is never buffered.
fn refuse_unauthenticated(head: Head, out: &mut Vec<u8>, held: &mut HeldReplies) -> Flow {
    held.write(out, |out| response::error(out, head, Status::AuthError));
    Flow::Close
}

impl MemcacheSession {
    /// Parses and executes binary requests from `buf` (the binary twin of
    /// [`MemcacheSession::run_held`]); returns the bytes used and the next step.
    pub(super) fn run_binary(
        &mut self,
        buf: &[u8],
        ctx: &Ctx<'_>,
        out: &mut Vec<u8>,
        held: &mut HeldReplies,
    ) -> (usize, Flow) {
        let limits = ctx.limits();
        let mut pos = 0;
        self.awaiting = 0;
        loop {
            if let Some(flow) = self.before_request(
                ctx,
                buf.len(),
                &mut pos,
                out.len() + held.len() + self.zc.pinned,
            ) {
                return (pos, flow);
            }
            match binary::parse(&buf[pos..], &limits) {
                Parse::Incomplete => return (pos, Flow::Continue),
                Parse::Close => return (buf.len(), Flow::Close),
                Parse::AwaitingValue { head, .. } if self.locked() => {
                    return (buf.len(), refuse_unauthenticated(head, out, held));
                }
                Parse::AwaitingValue {
                    head,
                    request_len,
                    head_len,
                    key,
                    remove_old,
                } => {
                    if self.start_direct(ctx, held, &buf[pos..], head_len) {
                        return (buf.len(), Flow::Continue);
                    }
                    let Some(used) = self.value_or_refuse(
                        ctx,
                        (held, out),
                        buf.len() - pos,
                        Failure::Binary(head),
                        (head_len, request_len),
                        |target| {
                            storage::refused(ctx, key, remove_old, false);
                            response::error(target, head, Status::OutOfMemory);
                        },
                    ) else {
                        return (pos, Flow::Continue);
                    };
                    pos += used;
                }
                Parse::Done { head, request, .. }
                    if self.locked() && !super::sasl::allowed_unauthenticated(&request) =>
                {
                    return (buf.len(), refuse_unauthenticated(head, out, held));
                }
                Parse::Done {
                    head,
                    request,
                    consumed,
                } => {
                    let flow = held.around(
                        out,
                        || ctx.staged(),
                        Failure::Binary(head),
                        |target| self.execute_binary(head, request, ctx, target),
                    );
                    if flow == Flow::Close {
                        return (buf.len(), Flow::Close);
                    }
                    self.tally.note(crate::latency::Family::Binary);
                    pos += consumed;
                }
            }
        }
    }

    fn execute_binary(
        &mut self,
        head: Head,
        request: Request<'_>,
        ctx: &Ctx<'_>,
        out: &mut Vec<u8>,
    ) -> Flow {
        match request {
            Request::Get(g) => get_key(ctx, out, (&mut self.out_hold, &mut self.zc), head, &g),
            Request::Store(s) => store(ctx, out, head, &s),
            Request::TooLarge {
                key,
                remove_old,
                swallow,
            } => {
                storage::refused(ctx, key, remove_old, true);
                response::error(out, head, Status::TooLarge);
                self.swallow = swallow;
            }
            Request::Delete { key, cas, quiet } => delete(ctx, out, head, key, cas, quiet),
            Request::Arith(a) => incr_decr(ctx, out, head, &a),
            Request::Quit { quiet } => {
                if !quiet {
                    response::ok(out, head, 0);
                }
                return Flow::Close;
            }
            Request::Flush { exptime, quiet } => flush(ctx, out, head, exptime, quiet),
            Request::Noop => response::ok(out, head, 0),
            Request::Version => response::text(out, head, COMPAT_VERSION.as_bytes()),
            Request::Stat { key } => stat(ctx, out, head, key),
            Request::SaslListMechs => super::sasl::list_mechs(ctx, out, head),
            Request::Sasl { mech, data, step } => {
                // A failed attempt logs an authenticated connection out, as memcached does.
                match super::sasl::auth(ctx, out, head, mech, data, step) {
                    Some(Some(standing)) => self.log_in(standing),
                    Some(None) => self.log_out(),
                    None => {}
                }
            }
            Request::SaslRefused { status, swallow } => {
                super::sasl::refused(ctx, out, head, status);
                self.swallow = swallow;
            }
            Request::Error {
                status,
                swallow,
                close,
            } => {
                response::error(out, head, status);
                self.swallow = swallow;
                if close {
                    return Flow::Close;
                }
            }
        }
        Flow::Continue
    }
}

/// The binary status for a write the store refused.
fn store_status(e: &StoreError) -> Status {
    match e {
        StoreError::TooLarge => Status::TooLarge,
        StoreError::OutOfMemory | StoreError::DeviceFull | StoreError::Config(_) => {
            Status::OutOfMemory
        }
    }
}

/// get, getq, getk, getkq, gat, gatq, gatk, gatkq, touch: one key. A big value on a
/// zero-copy connection goes out from the item (`zc`): the frame's header, flags and key
/// are written and the value spliced after them.
fn get_key(
    ctx: &Ctx<'_>,
    out: &mut Vec<u8>,
    (out_hold, zc): (&mut Hold, &mut ZeroCopy),
    head: Head,
    g: &GetRequest<'_>,
) {
    ctx.shared.hotkeys.record(ctx.worker, g.key);
    let store = ctx.store();
    let now = ctx.now.store;
    let touch = g.touch.map(|e| expiry(i64::from(e), ctx.now));
    let opts = ReadOpts {
        mark_access: g.with_value,
        touch: match touch {
            Some(Expiry::At(t)) => Some(t),
            _ => None,
        },
        see_large: false,
    };
    let budget = &ctx.shared.conn_memory;
    let mut no_room = false;
    let mut spliced = None;
    let pin_from = match g.with_value {
        true => zc.pin_from(ctx.device.is_some()),
        false => usize::MAX,
    };
    let found = store.try_get_pinned(g.key, now, opts, pin_from, |item, pin| match item {
        Some(it) => {
            let key: &[u8] = if g.with_key { it.key } else { &[] };
            let data: &[u8] = if g.with_value { it.value } else { &[] };
            if zc.splice(ctx.stats, data.len(), pin_from, pin) {
                response::value_header(out, head, it.cas, it.flags, key, data.len());
                spliced = Some(out.len());
                return true;
            }
            let extra = HEADER_LEN + 4 + key.len() + data.len();
            if !out_hold.room_for_output(budget, out.len(), extra) {
                no_room = true;
                return false;
            }
            response::value(out, head, it.cas, it.flags, key, data);
            true
        }
        None => false,
    });
    let found = found.map(|(hit, pin)| {
        if let (Some(at), Some(pin)) = (spliced, pin) {
            zc.push(ctx.stats, at, pin);
        }
        hit
    });
    if no_room {
        get::count(ctx, touch.is_some(), true);
        response::error(out, head, Status::OutOfMemory);
        return;
    }
    let found = match found {
        // Touched into the past: the value was served, now it is gone.
        Ok(true) if touch == Some(Expiry::Expired) => store
            .update(g.key, now, |_| (Write::Delete, ()))
            .map(|_| true),
        other => other,
    };
    match found {
        Ok(hit) => {
            get::count(ctx, touch.is_some(), hit);
            if hit || g.quiet {
                return;
            }
            if g.with_key {
                response::miss_with_key(out, head, g.key);
            } else {
                response::error(out, head, Status::KeyNotFound);
            }
        }
        // The journal refused a touch (a full data device): nothing was touched.
        Err(e) => {
            ctx.stats.cmd_touch.inc();
            response::error(out, head, store_status(&e));
        }
    }
}

/// set, add, replace (a CAS makes each a compare-and-swap, as in memcached), append, prepend
/// (a CAS must match), and their quiet forms.
fn store(ctx: &Ctx<'_>, out: &mut Vec<u8>, head: Head, s: &StoreRequest<'_>) {
    let value = Value {
        flags: s.flags,
        exptime: i64::from(s.exptime),
        data: s.data,
    };
    let result = storage::apply(ctx, store_kind(s), s.key, value, s.cas);
    store_answer(out, head, s, &result);
}

/// The store a binary storage request `s` makes: a CAS makes a set, add or replace a
/// compare-and-swap, as in memcached.
pub(super) fn store_kind(s: &StoreRequest<'_>) -> StoreKind {
    match s.kind {
        StoreKind::Set | StoreKind::Add | StoreKind::Replace if s.cas != 0 => StoreKind::Cas,
        kind => kind,
    }
}

/// Answers binary storage request `s` (of header `head`) that ended with `result`: both
/// ways its value arrives (buffered, or received into its item, `direct.rs`).
pub(super) fn store_answer(
    out: &mut Vec<u8>,
    head: Head,
    s: &StoreRequest<'_>,
    result: &Result<ringstore_store::Updated<Outcome>, StoreError>,
) {
    let status = match result {
        Ok(done) => match done.result {
            Outcome::Stored => {
                if !s.quiet {
                    response::ok(out, head, done.cas.unwrap_or(0));
                }
                return;
            }
            Outcome::Exists => Status::KeyExists,
            Outcome::NotFound => Status::KeyNotFound,
            // memcached's statuses for a store that did not happen.
            Outcome::NotStored => match s.kind {
                StoreKind::Add => Status::KeyExists,
                StoreKind::Replace => Status::KeyNotFound,
                _ => Status::NotStored,
            },
        },
        Err(e) => store_status(e),
    };
    response::error(out, head, status);
}

/// delete and deleteq; a CAS must match.
fn delete(ctx: &Ctx<'_>, out: &mut Vec<u8>, head: Head, key: &[u8], cas: u64, quiet: bool) {
    let done = ctx.store().update(key, ctx.now.store, |item| match item {
        Some(it) if cas == 0 || it.cas == cas => (Write::Delete, Status::Success),
        Some(_) => (Write::Nothing, Status::KeyExists),
        None => (Write::Nothing, Status::KeyNotFound),
    });
    let status = match done {
        Ok(d) => d.result,
        Err(e) => store_status(&e),
    };
    match status {
        Status::Success => ctx.stats.delete_hits.inc(),
        Status::KeyNotFound => ctx.stats.delete_misses.inc(),
        _ => {}
    }
    if status != Status::Success {
        response::error(out, head, status);
    } else if !quiet {
        response::ok(out, head, 0);
    }
}

/// increment and decrement (and quiet forms): a missing counter is created with the initial
/// value unless the exptime is `0xffffffff`; a CAS must match.
fn incr_decr(ctx: &Ctx<'_>, out: &mut Vec<u8>, head: Head, a: &ArithRequest<'_>) {
    let create =
        (a.exptime != NO_CREATE).then(|| (a.initial, expiry(i64::from(a.exptime), ctx.now)));
    let status = match arith::apply(ctx, a.incr, a.key, a.delta, a.cas, create) {
        Ok(done) => match done.result {
            ArithOutcome::Value(v) | ArithOutcome::Created(v) => {
                if !a.quiet {
                    response::number(out, head, done.cas.unwrap_or(0), v);
                }
                return;
            }
            ArithOutcome::Missing => Status::KeyNotFound,
            ArithOutcome::NonNumeric => Status::NonNumeric,
            ArithOutcome::Exists => Status::KeyExists,
        },
        Err(_) => Status::OutOfMemory,
    };
    response::error(out, head, status);
}

/// flush and flushq, through the text command's flush_all (its reply tells how it went).
fn flush(ctx: &Ctx<'_>, out: &mut Vec<u8>, head: Head, exptime: u32, quiet: bool) {
    let mut text = Vec::new();
    let delay = i32::try_from(exptime).unwrap_or(i32::MAX);
    admin::flush_all(ctx, &mut text, delay, false);
    if text != b"OK\r\n" {
        // The data device could not log it.
        response::error(out, head, Status::Internal);
    } else if !quiet {
        response::ok(out, head, 0);
    }
}

/// stat with its key: the text command's statistics, one frame each (name as the key,
/// value as the body), then an empty frame. Keys as memcached 1.6.18 matches them.
fn stat(ctx: &Ctx<'_>, out: &mut Vec<u8>, head: Head, key: &[u8]) {
    let request = match key {
        b"" => StatsRequest::General,
        k if k.starts_with(b"reset") => StatsRequest::Reset,
        k if k.starts_with(b"settings") => StatsRequest::Settings,
        b"items" => StatsRequest::Items,
        b"slabs" => StatsRequest::Slabs,
        b"sizes" => StatsRequest::Sizes,
        b"hotkeys" => StatsRequest::HotKeys(ringstore_proto::memcache::misc::HOTKEYS_DEFAULT),
        k if k.starts_with(b"detail on") || k.starts_with(b"detail off") => StatsRequest::Empty,
        // memcached's per-prefix dump as one `detailed` frame; ringstore keeps no prefix
        // stats, so it is the dump's bare `END` (the text `stats detail dump` answers the same).
        k if k.starts_with(b"detail dump") => {
            response::stat(out, head, b"detailed", b"END\r\n");
            StatsRequest::Empty
        }
        _ => return response::error(out, head, Status::KeyNotFound),
    };
    let mut text = Vec::new();
    stats::stats(ctx, &mut text, request);
    for line in text.split(|&b| b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if let Some(stat) = line.strip_prefix(b"STAT ") {
            let space = stat.iter().position(|&b| b == b' ').unwrap_or(stat.len());
            let value = stat.get(space + 1..).unwrap_or(&[]);
            response::stat(out, head, &stat[..space], value);
        }
    }
    response::stat(out, head, b"", b"");
}

#[cfg(test)]
mod tests;
