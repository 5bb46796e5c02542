//! incr / decr: 64-bit wrap on incr, floor at 0 on decr, flags and TTL kept.

use ringstore_proto::memcache::arith::{apply, NON_NUMERIC};
use ringstore_proto::memcache::reply;
use ringstore_store::{NewMeta, Write};

use super::Ctx;

enum Outcome {
    Value(u64),
    Missing,
    NonNumeric,
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
    let mut scratch = [b' '; PAD_MAX];
    let scratch = &mut scratch;
    let result = ctx
        .store()
        .update(key, ctx.now.store, move |item| match item {
            None => (Write::Nothing, Outcome::Missing),
            Some(it) => match apply(it.value, incr, delta) {
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
    let outcome = match result {
        Ok(done) => done.result,
        Err(_) => {
            if !noreply {
                reply::line(out, "SERVER_ERROR out of memory");
            }
            return;
        }
    };
    match outcome {
        Outcome::Value(v) => {
            hits.inc();
            if !noreply {
                reply::push_u64(out, v);
                out.extend_from_slice(b"\r\n");
            }
        }
        Outcome::Missing => {
            misses.inc();
            if !noreply {
                reply::line(out, "NOT_FOUND");
            }
        }
        Outcome::NonNumeric => {
            if !noreply {
                reply::line(out, NON_NUMERIC);
            }
        }
    }
}
