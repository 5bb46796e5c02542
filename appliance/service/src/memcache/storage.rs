//! set, add, replace, append, prepend, cas: one read-decide-write under the shard lock.

use ringstore_proto::memcache::{reply, StoreKind, StoreRequest, OUT_OF_MEMORY, TOO_LARGE};
use ringstore_store::{NewMeta, StoreError, Write};

use super::expiry::{expiry, Expiry};
use super::Ctx;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Outcome {
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

pub(crate) fn store(ctx: &Ctx<'_>, out: &mut Vec<u8>, s: &StoreRequest<'_>) {
    ctx.stats.cmd_set.inc();
    let exp = expiry(i64::from(s.exptime), ctx.now);
    let result = ctx
        .store()
        .update(s.key, ctx.now.store, |item| match (s.kind, item) {
            (StoreKind::Set, _) => (put(s.data, s.flags, exp, None), Outcome::Stored),
            (StoreKind::Add, Some(_)) | (StoreKind::Replace, None) => {
                (Write::Nothing, Outcome::NotStored)
            }
            (StoreKind::Add | StoreKind::Replace, _) => {
                (put(s.data, s.flags, exp, None), Outcome::Stored)
            }
            (StoreKind::Append | StoreKind::Prepend, None) => (Write::Nothing, Outcome::NotStored),
            (StoreKind::Append, Some(it)) => {
                let meta = NewMeta {
                    flags: it.flags,
                    exptime: it.exptime,
                    cas: None,
                };
                (
                    Write::Append {
                        suffix: s.data,
                        meta,
                    },
                    Outcome::Stored,
                )
            }
            (StoreKind::Prepend, Some(it)) => {
                let meta = NewMeta {
                    flags: it.flags,
                    exptime: it.exptime,
                    cas: None,
                };
                (
                    Write::Prepend {
                        prefix: s.data,
                        meta,
                    },
                    Outcome::Stored,
                )
            }
            (StoreKind::Cas, None) => (Write::Nothing, Outcome::NotFound),
            (StoreKind::Cas, Some(it)) if it.cas == s.cas_unique => {
                (put(s.data, s.flags, exp, None), Outcome::Stored)
            }
            (StoreKind::Cas, Some(_)) => (Write::Nothing, Outcome::Exists),
        });
    let line = match result {
        Ok(done) => {
            if s.kind == StoreKind::Cas {
                match done.result {
                    Outcome::NotFound => ctx.stats.cas_misses.inc(),
                    Outcome::Exists => ctx.stats.cas_badval.inc(),
                    _ => ctx.stats.cas_hits.inc(),
                }
            }
            match done.result {
                Outcome::Stored => "STORED",
                Outcome::NotStored => "NOT_STORED",
                Outcome::Exists => "EXISTS",
                Outcome::NotFound => "NOT_FOUND",
            }
        }
        Err(e) => {
            count_store_error(ctx, &e);
            store_error(&e)
        }
    };
    if !s.noreply {
        reply::line(out, line);
    }
}

/// Counts a refused store as memcached does: `store_too_large` or `store_no_memory`.
pub(crate) fn count_store_error(ctx: &Ctx<'_>, e: &StoreError) {
    match e {
        StoreError::TooLarge => ctx.stats.store_too_large.inc(),
        StoreError::OutOfMemory | StoreError::Config(_) => ctx.stats.store_no_memory.inc(),
    }
}

/// memcached's reply for a write the store refused.
pub(crate) fn store_error(e: &StoreError) -> &'static str {
    match e {
        StoreError::TooLarge => TOO_LARGE,
        StoreError::OutOfMemory | StoreError::Config(_) => OUT_OF_MEMORY,
    }
}

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
    if line == TOO_LARGE {
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
    if !noreply {
        reply::line(out, line);
    }
}
