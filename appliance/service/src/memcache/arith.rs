//! incr / decr: 64-bit wrap on incr, floor at 0 on decr, flags and TTL kept.

use ringstore_proto::memcache::arith::{apply as apply_delta, NON_NUMERIC};
use ringstore_proto::memcache::reply;
use ringstore_store::{NewMeta, StoreError, Updated, Write};

use super::expiry::Expiry;

use super::Ctx;

/// How an incr/decr ended.
pub(crate) enum Outcome {
    /// The counter's new value.
    Value(u64),
    /// The key was missing and the counter was created with this value (binary protocol).
    Created(u64),
    Missing,
    NonNumeric,
    /// The item's CAS unique was not the one asked for (binary protocol).
    Exists,
}

/// Longest old value that is rewritten in place, padded with spaces.
const PAD_MAX: usize = 64;

/// The write for an incr/decr result. memcached rewrites the number in place when its text
/// is not longer than the old value and pads the rest with spaces (`decr` of `100` by 1
/// reads back as `99 `); clients that `get` a counter see those bytes, so ringstore does
/// the same. Longer results (or huge old values) are stored exactly.
pub(crate) fn number_write(
    value: u64,
    old_len: usize,
    meta: NewMeta,
    scratch: &mut [u8; PAD_MAX],
) -> Write<'_> {
    let mut digits = Vec::with_capacity(20);
    reply::push_u64(&mut digits, value);
    if digits.len() < old_len && old_len <= PAD_MAX {
        scratch[..digits.len()].copy_from_slice(&digits);
        scratch[digits.len()..old_len].fill(b' ');
        Write::Put {
            value: &scratch[..old_len],
            meta,
        }
    } else {
        Write::PutNumber { value, meta }
    }
}

pub(crate) fn arith(
    ctx: &Ctx<'_>,
    out: &mut Vec<u8>,
    incr: bool,
    key: &[u8],
    delta: u64,
    noreply: bool,
) {
    let outcome = match apply(ctx, incr, key, delta, 0, None) {
        Ok(done) => done.result,
        Err(_) => {
            if !noreply {
                reply::line(out, "SERVER_ERROR out of memory");
            }
            return;
        }
    };
    if noreply {
        return;
    }
    match outcome {
        Outcome::Value(v) | Outcome::Created(v) => {
            reply::push_u64(out, v);
            out.extend_from_slice(b"\r\n");
        }
        Outcome::Missing | Outcome::Exists => reply::line(out, "NOT_FOUND"),
        Outcome::NonNumeric => reply::line(out, NON_NUMERIC),
    }
}

/// One incr/decr, text or binary, under the shard lock, counted in the stats. `cas`
/// non-zero: only over an item with that CAS unique. `create`: a missing counter is stored
/// with this initial value and expiry instead (the binary protocol's).
pub(crate) fn apply(
    ctx: &Ctx<'_>,
    incr: bool,
    key: &[u8],
    delta: u64,
    cas: u64,
    create: Option<(u64, Expiry)>,
) -> Result<Updated<Outcome>, StoreError> {
    let mut scratch = [b' '; PAD_MAX];
    let scratch = &mut scratch;
    let result = ctx
        .store()
        .update(key, ctx.now.store, move |item| match (item, create) {
            (None, None) => (Write::Nothing, Outcome::Missing),
            (None, Some((initial, Expiry::Expired))) => (Write::Nothing, Outcome::Created(initial)),
            (None, Some((initial, Expiry::At(exptime)))) => {
                let meta = NewMeta {
                    flags: 0,
                    exptime,
                    cas: None,
                };
                (
                    Write::PutNumber {
                        value: initial,
                        meta,
                    },
                    Outcome::Created(initial),
                )
            }
            (Some(it), _) if cas != 0 && it.cas != cas => (Write::Nothing, Outcome::Exists),
            (Some(it), _) => match apply_delta(it.value, incr, delta) {
                None => (Write::Nothing, Outcome::NonNumeric),
                Some(value) => {
                    let meta = NewMeta {
                        flags: it.flags,
                        exptime: it.exptime,
                        cas: None,
                    };
                    (
                        number_write(value, it.value.len(), meta, scratch),
                        Outcome::Value(value),
                    )
                }
            },
        });
    let s = ctx.stats;
    let (hits, misses) = if incr {
        (&s.incr_hits, &s.incr_misses)
    } else {
        (&s.decr_hits, &s.decr_misses)
    };
    match result.as_ref().map(|d| &d.result) {
        Ok(Outcome::Value(_)) => hits.inc(),
        Ok(Outcome::Missing) => misses.inc(),
        _ => {}
    }
    result
}
