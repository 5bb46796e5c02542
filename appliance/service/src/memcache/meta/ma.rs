//! ma: incr/decr with meta flags, autovivify and CAS.

use super::*;

enum ArithOutcome {
    Value {
        value: u64,
        exptime: Time,
        created: bool,
    },
    NotFound,
    Exists,
    NonNumeric,
}

/// The expiry times an `ma` may give the item: its `T` flag and the `N` (autovivify) flag.
#[derive(Clone, Copy)]
struct Times {
    ttl: Option<Expiry>,
    vivify: Option<Expiry>,
    /// What an already expired time becomes in the store.
    expired: Time,
}

impl Times {
    fn at(self, e: Expiry) -> Time {
        match e {
            Expiry::At(t) => t,
            Expiry::Expired => self.expired,
        }
    }
}

pub(crate) fn ma(ctx: &Ctx<'_>, out: &mut Vec<u8>, m: &MetaArith<'_>) {
    let mut kb = KeyBuf::default();
    let key = m.key.bytes(&mut kb);
    let times = Times {
        ttl: flag_expiry(m.flags.ttl, ctx),
        vivify: flag_expiry(m.flags.vivify, ctx),
        expired: expired_at(ctx),
    };
    let mut scratch = [b' '; 64];
    let scratch = &mut scratch;
    let result = ctx.store().update(key, ctx.now.store, move |item| {
        decide(item, m, times, scratch)
    });
    match result {
        Ok(done) => arith_reply(ctx, out, m, key, &done),
        Err(_) => reply::line(out, "SERVER_ERROR out of memory"),
    }
}

/// What an `ma` does to the item it finds (or does not): the write and the outcome.
fn decide<'s>(
    item: Option<ItemRef<'_>>,
    m: &MetaArith<'_>,
    times: Times,
    scratch: &'s mut [u8; 64],
) -> (Write<'s>, ArithOutcome) {
    let f = &m.flags;
    match item {
        None => match times.vivify {
            Some(v) => {
                let exptime = times.at(times.ttl.unwrap_or(v));
                let meta = NewMeta {
                    flags: 0,
                    exptime,
                    cas: None,
                };
                (
                    Write::PutNumber {
                        value: f.initial,
                        meta,
                    },
                    ArithOutcome::Value {
                        value: f.initial,
                        exptime,
                        created: true,
                    },
                )
            }
            None => (Write::Nothing, ArithOutcome::NotFound),
        },
        Some(it) if f.cas.is_some_and(|c| c != 0 && c != it.cas) => {
            (Write::Nothing, ArithOutcome::Exists)
        }
        Some(it) => match apply(it.value, m.incr, f.delta) {
            None => (Write::Nothing, ArithOutcome::NonNumeric),
            Some(value) => {
                let exptime = times.ttl.map_or(it.exptime, |e| times.at(e));
                let meta = NewMeta {
                    flags: it.flags,
                    exptime,
                    cas: None,
                };
                (
                    number_write(value, it.value.len(), meta, scratch),
                    ArithOutcome::Value {
                        value,
                        exptime,
                        created: false,
                    },
                )
            }
        },
    }
}

/// The reply to an `ma` that was carried out, and its hit or miss counted.
fn arith_reply(
    ctx: &Ctx<'_>,
    out: &mut Vec<u8>,
    m: &MetaArith<'_>,
    key: &[u8],
    done: &ringstore_store::Updated<ArithOutcome>,
) {
    let f = &m.flags;
    let s = ctx.stats;
    let (hits, misses) = if m.incr {
        (&s.incr_hits, &s.incr_misses)
    } else {
        (&s.decr_hits, &s.decr_misses)
    };
    match done.result {
        ArithOutcome::Value {
            value,
            exptime,
            created,
        } => {
            hits.inc();
            if f.quiet && !created {
                return;
            }
            value_reply(ctx, out, m, key, value, exptime, done.cas);
        }
        ArithOutcome::NotFound => {
            misses.inc();
            out.extend_from_slice(b"NF");
            echo_tail(out, f, key, &m.key, None);
        }
        ArithOutcome::Exists => {
            out.extend_from_slice(b"EX");
            echo_tail(out, f, key, &m.key, None);
        }
        ArithOutcome::NonNumeric => reply::line(out, NON_NUMERIC),
    }
}

/// `HD` (or `VA` with the number) and the flags asked for, after a successful `ma`.
fn value_reply(
    ctx: &Ctx<'_>,
    out: &mut Vec<u8>,
    m: &MetaArith<'_>,
    key: &[u8],
    value: u64,
    exptime: Time,
    cas: Option<u64>,
) {
    let f = &m.flags;
    let mut digits = Vec::with_capacity(20);
    push_u64(&mut digits, value);
    if f.value {
        out.extend_from_slice(b"VA ");
        push_u64(out, digits.len() as u64);
    } else {
        out.extend_from_slice(b"HD");
    }
    for tok in f.tokens() {
        match tok[0] {
            b'c' => meta_num(out, b'c', cas.unwrap_or(0)),
            b't' => {
                out.extend_from_slice(b" t");
                push_i64(out, ttl_left(exptime, ctx.now));
            }
            _ => echo_opaque_or_key(out, tok, key, &m.key),
        }
    }
    if f.value {
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(&digits);
    }
    out.extend_from_slice(b"\r\n");
}
