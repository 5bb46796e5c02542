//! set, add, replace, append, prepend, cas: one read-decide-write under the shard lock.

use ringstore_proto::memcache::{reply, StoreKind, StoreRequest, OUT_OF_MEMORY, TOO_LARGE};
use ringstore_store::{ItemRef, NewMeta, StoreError, Updated, Write};

use super::expiry::{expiry, Expiry};
use super::Ctx;

/// How a storage command ended.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Stored,
    NotStored,
    Exists,
    NotFound,
}

/// The write for a new value: a put, or for a value that arrives expired, the removal of
/// what it replaces (what a client can observe of memcached storing an expired item).
pub(crate) fn put<'v>(value: &'v [u8], flags: u32, exp: Expiry, cas: Option<u64>) -> Write<'v> {
    match exp {
        Expiry::At(exptime) => Write::Put {
            value,
            meta: NewMeta {
                flags,
                exptime,
                cas,
            },
        },
        Expiry::Expired => Write::Delete,
    }
}

/// Logs a `watch` mutation line (memcached's `item_store`) for one storage command.
pub(crate) fn watch_store(
    ctx: &Ctx<'_>,
    key: &[u8],
    cmd: &str,
    outcome: Outcome,
    exp: Expiry,
    size: usize,
) {
    let status = match outcome {
        Outcome::Stored => "stored",
        Outcome::NotStored => "not_stored",
        Outcome::Exists => "exists",
        Outcome::NotFound => "not_found",
    };
    let ttl = match exp {
        Expiry::At(ringstore_store::NEVER) | Expiry::Expired => 0,
        Expiry::At(t) => u64::from(t.saturating_sub(ctx.now.store)),
    };
    ctx.watch_store(crate::watch::StoreLine {
        key,
        status,
        cmd,
        ttl,
        size,
    });
}

pub(crate) fn store(ctx: &Ctx<'_>, out: &mut Vec<u8>, s: &StoreRequest<'_>) {
    let cas = if s.kind == StoreKind::Cas {
        s.cas_unique
    } else {
        0
    };
    let value = Value {
        flags: s.flags,
        exptime: i64::from(s.exptime),
        data: s.data,
    };
    let line = reply_line(&apply(ctx, s.kind, s.key, value, cas));
    if !s.noreply {
        reply::line(out, line);
    }
}

/// What a storage command stores.
#[derive(Clone, Copy)]
pub(crate) struct Value<'v> {
    pub flags: u32,
    /// memcached exptime as sent.
    pub exptime: i64,
    pub data: &'v [u8],
}

/// One storage command (text, or binary with its CAS): read, decide and write under the
/// shard lock, counted in the stats. `cas` is the `cas` command's unique; non-zero on an
/// append or prepend (the binary protocol's), the old item must carry it too.
pub(crate) fn apply(
    ctx: &Ctx<'_>,
    kind: StoreKind,
    key: &[u8],
    v: Value<'_>,
    cas: u64,
) -> Result<Updated<Outcome>, StoreError> {
    ctx.stats.cmd_set.inc();
    let exp = expiry(v.exptime, ctx.now);
    if let (StoreKind::Set, Expiry::At(exptime)) = (kind, exp) {
        // Whatever is there is replaced: no need to look it up first.
        let meta = NewMeta {
            flags: v.flags,
            exptime,
            cas: None,
        };
        let result = ctx
            .store()
            .set(key, ctx.now.store, v.data, meta)
            .map(|cas| Updated {
                result: Outcome::Stored,
                cas: Some(cas),
            });
        account(ctx, (kind, key, exp, v.data.len()), &result);
        return result;
    }
    let keep = |it: &ItemRef<'_>| NewMeta {
        flags: it.flags,
        exptime: it.exptime,
        cas: None,
    };
    let result = ctx
        .store()
        .update(key, ctx.now.store, |item| match (kind, item) {
            (StoreKind::Set, _) => (put(v.data, v.flags, exp, None), Outcome::Stored),
            (StoreKind::Add, Some(_)) | (StoreKind::Replace, None) => {
                (Write::Nothing, Outcome::NotStored)
            }
            (StoreKind::Add | StoreKind::Replace, _) => {
                (put(v.data, v.flags, exp, None), Outcome::Stored)
            }
            (StoreKind::Append | StoreKind::Prepend, None) => (Write::Nothing, Outcome::NotStored),
            (StoreKind::Append | StoreKind::Prepend, Some(it)) if cas != 0 && it.cas != cas => {
                (Write::Nothing, Outcome::Exists)
            }
            (StoreKind::Append, Some(it)) => (
                Write::Append {
                    suffix: v.data,
                    meta: keep(&it),
                },
                Outcome::Stored,
            ),
            (StoreKind::Prepend, Some(it)) => (
                Write::Prepend {
                    prefix: v.data,
                    meta: keep(&it),
                },
                Outcome::Stored,
            ),
            (StoreKind::Cas, None) => (Write::Nothing, Outcome::NotFound),
            (StoreKind::Cas, Some(it)) if it.cas == cas => {
                (put(v.data, v.flags, exp, None), Outcome::Stored)
            }
            (StoreKind::Cas, Some(_)) => (Write::Nothing, Outcome::Exists),
        });
    account(ctx, (kind, key, exp, v.data.len()), &result);
    result
}

/// Counts a storage command's outcome in the stats and logs its `watch` line: `what` is
/// the command, its key, its expiry and its value's length (both ways a value arrives:
/// through the input, or received into the item, `direct.rs`).
pub(crate) fn account(
    ctx: &Ctx<'_>,
    (kind, key, exp, size): (StoreKind, &[u8], Expiry, usize),
    result: &Result<Updated<Outcome>, StoreError>,
) {
    if let Err(e) = result {
        count_store_error(ctx, e);
    }
    if let Ok(done) = result {
        let cmd = match kind {
            StoreKind::Set => "set",
            StoreKind::Add => "add",
            StoreKind::Replace => "replace",
            StoreKind::Append => "append",
            StoreKind::Prepend => "prepend",
            StoreKind::Cas => "cas",
        };
        watch_store(ctx, key, cmd, done.result, exp, size);
    }
    if let (StoreKind::Cas, Ok(done)) = (kind, result) {
        match done.result {
            Outcome::NotFound => ctx.stats.cas_misses.inc(),
            Outcome::Exists => ctx.stats.cas_badval.inc(),
            _ => ctx.stats.cas_hits.inc(),
        }
    }
}

/// The reply line of a storage command that ended with `result`.
pub(crate) fn reply_line(result: &Result<Updated<Outcome>, StoreError>) -> &'static str {
    match result {
        Ok(done) => match done.result {
            Outcome::Stored => "STORED",
            Outcome::NotStored => "NOT_STORED",
            Outcome::Exists => "EXISTS",
            Outcome::NotFound => "NOT_FOUND",
        },
        Err(e) => store_error(e),
    }
}

/// Counts a refused store as memcached does: `store_too_large` or `store_no_memory`.
pub(crate) fn count_store_error(ctx: &Ctx<'_>, e: &StoreError) {
    match e {
        StoreError::TooLarge => ctx.stats.store_too_large.inc(),
        StoreError::OutOfMemory | StoreError::DeviceFull | StoreError::Config(_) => {
            ctx.stats.store_no_memory.inc()
        }
    }
}

/// memcached's reply for a write the store refused.
pub(crate) fn store_error(e: &StoreError) -> &'static str {
    match e {
        StoreError::TooLarge => TOO_LARGE,
        StoreError::OutOfMemory | StoreError::Config(_) => OUT_OF_MEMORY,
        StoreError::DeviceFull => DEVICE_FULL,
    }
}

/// The reply for a write the data device had no room for (`data-full refuse`, ADR 0039):
/// memcached's `SERVER_ERROR` form, saying what is full.
pub(crate) const DEVICE_FULL: &str = "SERVER_ERROR data device full storing object";

/// A value refused before its data is read (over the item limit, or no room in the
/// connection-memory budget): the error `line`, and for `set` the old value goes (memcached
/// removes it so a failed set never leaves stale data behind). Not a `cmd_set`: memcached
/// counts a set only once its item is allocated; `store_too_large` / `store_no_memory` it is.
pub(crate) fn refuse_value(
    ctx: &Ctx<'_>,
    out: &mut Vec<u8>,
    key: &[u8],
    remove_old: bool,
    noreply: bool,
    line: &str,
) {
    refused(ctx, key, remove_old, line == TOO_LARGE);
    if !noreply {
        reply::line(out, line);
    }
}

/// A value refused before its data is read, in either protocol: not a `cmd_set` (memcached
/// counts a set only once its item is allocated) but `store_too_large` (`too_large`) or
/// `store_no_memory`; with `remove_old` (a set) the old value goes.
pub(crate) fn refused(ctx: &Ctx<'_>, key: &[u8], remove_old: bool, too_large: bool) {
    if too_large {
        ctx.stats.store_too_large.inc();
    } else {
        ctx.stats.store_no_memory.inc();
    }
    if remove_old {
        let _ = ctx.store().update(key, ctx.now.store, |item| {
            (
                if item.is_some() {
                    Write::Delete
                } else {
                    Write::Nothing
                },
                (),
            )
        });
    }
}
