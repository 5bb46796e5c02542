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

pub(crate) fn ma(ctx: &Ctx<'_>, out: &mut Vec<u8>, m: &MetaArith<'_>) {
    let mut kb = KeyBuf::default();
    let key = m.key.bytes(&mut kb);
    let f = &m.flags;
    let ttl = flag_expiry(f.ttl, ctx);
    let vivify = flag_expiry(f.vivify, ctx);
    let to_time = |e: Expiry| match e {
        Expiry::At(t) => t,
        Expiry::Expired => expired_at(ctx),
    };
    let mut scratch = [b' '; 64];
    let scratch = &mut scratch;
    let result = ctx
        .store()
        .update(key, ctx.now.store, move |item| match item {
            None => match vivify {
                Some(v) => {
                    let exptime = to_time(ttl.unwrap_or(v));
                    let meta = NewMeta {
                        flags: 0,
                        exptime,
                        cas: f.explicit_cas,
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
                    let exptime = ttl.map_or(it.exptime, to_time);
                    let meta = NewMeta {
                        flags: it.flags,
                        exptime,
                        cas: f.explicit_cas,
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
        });
    let s = ctx.stats;
    let (hits, misses) = if m.incr {
        (&s.incr_hits, &s.incr_misses)
    } else {
        (&s.decr_hits, &s.decr_misses)
    };
    let done = match result {
        Ok(d) => d,
        Err(_) => {
            reply::line(out, "SERVER_ERROR out of memory");
            return;
        }
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
                    b'c' => meta_num(out, b'c', done.cas.unwrap_or(0)),
                    b't' => {
                        out.extend_from_slice(b" t");
                        push_i64(out, ttl_left(exptime, ctx.now));
                    }
                    b'O' => {
                        out.push(b' ');
                        out.extend_from_slice(tok);
                    }
                    b'k' => push_key(out, key, m.key.is_binary()),
                    _ => {}
                }
            }
            if f.value {
                out.extend_from_slice(b"\r\n");
                out.extend_from_slice(&digits);
            }
            out.extend_from_slice(b"\r\n");
        }
        ArithOutcome::NotFound | ArithOutcome::Exists => {
            let code: &[u8] = if matches!(done.result, ArithOutcome::NotFound) {
                misses.inc();
                b"NF"
            } else {
                b"EX"
            };
            out.extend_from_slice(code);
            echo_tail(out, f, key, &m.key, None);
        }
        ArithOutcome::NonNumeric => reply::line(out, NON_NUMERIC),
    }
}
