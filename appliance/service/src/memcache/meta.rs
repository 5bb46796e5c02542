//! Meta commands mg, ms, md, ma, me: status codes and flag echoes as memcached 1.6.
//!
//! Quiet mode (`q`) hides only the nominal reply, as memcached 1.6.18 does: `EN` for mg,
//! `HD` for ms and md, a successful result for ma. Errors are never hidden.
//! mg normally runs as a plain read (the access mark and the copy of the value happen under
//! one shard lock); it falls back to a read-decide-write only when it may hand out a
//! recache/stale "win" token or create an item (`N`), so a token is given at most once.

use ringstore_proto::memcache::arith::{apply, NON_NUMERIC};
use ringstore_proto::memcache::key::base64_encode;
use ringstore_proto::memcache::reply::{self, meta_num, push_i64, push_u64};
use ringstore_proto::memcache::{
    KeyBuf, MetaArith, MetaDelete, MetaFlags, MetaGet, MetaKey, MetaSet,
};
use ringstore_store::{ItemRef, NewMeta, ReadOpts, StoreError, Time, Write, NEVER};

use super::arith::number_write;
use super::expiry::{expiry, ttl_left, Expiry};
use super::get::{OUT_OF_MEMORY_GET, VALUE_OVERHEAD};
use super::storage::{put, store_error};
use super::Ctx;
use crate::budget::Hold;

/// Store time for "expired now" where a time is needed rather than a removal.
fn expired_at(ctx: &Ctx<'_>) -> Time {
    ctx.now.store.max(1)
}

fn flag_expiry(v: Option<i32>, ctx: &Ctx<'_>) -> Option<Expiry> {
    v.map(|t| expiry(i64::from(t), ctx.now))
}

/// ` k<key>` (base64 and ` b` for binary keys).
fn push_key(out: &mut Vec<u8>, key: &[u8], binary: bool) {
    out.extend_from_slice(b" k");
    if binary {
        base64_encode(key, out);
        out.extend_from_slice(b" b");
    } else {
        out.extend_from_slice(key);
    }
}

/// Echoes the `O` and `k` flags in request order, then ends the line.
fn echo_tail(
    out: &mut Vec<u8>,
    flags: &MetaFlags<'_>,
    key: &[u8],
    mkey: &MetaKey<'_>,
    cas: Option<u64>,
) {
    for tok in flags.tokens() {
        match tok[0] {
            b'O' => {
                out.push(b' ');
                out.extend_from_slice(tok);
            }
            b'k' => push_key(out, key, mkey.is_binary()),
            b'c' => {
                if let Some(cas) = cas {
                    meta_num(out, b'c', cas);
                }
            }
            _ => {}
        }
    }
    out.extend_from_slice(b"\r\n");
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Got {
    Hit,
    Miss,
    NeedsWrite,
    /// The journal refused the write (a full data device); the error reply is written.
    Refused,
}

fn hit_reply(
    out: &mut Vec<u8>,
    out_hold: &mut Hold,
    ctx: &Ctx<'_>,
    m: &MetaGet<'_>,
    key: &[u8],
    it: &ItemRef<'_>,
    won: bool,
) {
    let f = &m.flags;
    let extra = it.value.len() + key.len() + VALUE_OVERHEAD;
    if f.value && !out_hold.room_for_output(&ctx.shared.conn_memory, out.len(), extra) {
        reply::line(out, OUT_OF_MEMORY_GET);
        return;
    }
    if f.value {
        out.extend_from_slice(b"VA ");
        push_u64(out, it.value.len() as u64);
    } else {
        out.extend_from_slice(b"HD");
    }
    for tok in f.tokens() {
        match tok[0] {
            b's' => meta_num(out, b's', it.value.len() as u64),
            b't' => {
                out.extend_from_slice(b" t");
                push_i64(out, ttl_left(it.exptime, ctx.now));
            }
            b'c' => meta_num(out, b'c', it.cas),
            b'f' => meta_num(out, b'f', u64::from(it.flags)),
            b'l' => meta_num(
                out,
                b'l',
                u64::from(ctx.now.store.saturating_sub(it.last_access)),
            ),
            b'h' => out.extend_from_slice(if it.fetched { b" h1" } else { b" h0" }),
            b'O' => {
                out.push(b' ');
                out.extend_from_slice(tok);
            }
            b'k' => push_key(out, key, m.key.is_binary()),
            _ => {}
        }
    }
    if it.win_token_sent {
        out.extend_from_slice(b" Z");
    }
    if it.stale {
        out.extend_from_slice(b" X");
    }
    if won {
        out.extend_from_slice(b" W");
    }
    out.extend_from_slice(b"\r\n");
    if f.value {
        out.reserve(it.value.len() + 2);
        out.extend_from_slice(it.value);
        out.extend_from_slice(b"\r\n");
    }
}

pub(crate) fn mg(ctx: &Ctx<'_>, out: &mut Vec<u8>, out_hold: &mut Hold, m: &MetaGet<'_>) {
    let mut kb = KeyBuf::default();
    let key = m.key.bytes(&mut kb);
    let f = &m.flags;
    let ttl = flag_expiry(f.ttl, ctx);
    let store = &ctx.shared.store;
    let now = ctx.now.store;
    let start = out.len();
    let mut got = Got::NeedsWrite;
    if f.vivify.is_none() && f.recache.is_none() && ttl != Some(Expiry::Expired) {
        let touch = match ttl {
            Some(Expiry::At(t)) => Some(t),
            _ => None,
        };
        let opts = ReadOpts {
            mark_access: !f.no_update,
            touch,
            see_large: false,
        };
        let read = store.try_get(key, now, opts, |item| match item {
            None => Got::Miss,
            Some(it) if it.stale && !it.win_token_sent => Got::NeedsWrite,
            Some(it) => {
                hit_reply(out, out_hold, ctx, m, key, &it, false);
                Got::Hit
            }
        });
        got = read.unwrap_or_else(|e| refused(out, start, &e));
    }
    if got == Got::NeedsWrite {
        got = mg_decide(ctx, out, out_hold, m, key, ttl);
    }
    let s = ctx.stats;
    match (ttl.is_some(), got == Got::Hit) {
        (true, hit) => {
            s.cmd_touch.inc();
            if hit {
                s.touch_hits.inc()
            } else {
                s.touch_misses.inc()
            }
        }
        (false, hit) => {
            s.cmd_get.inc();
            if hit {
                s.get_hits.inc()
            } else {
                s.get_misses.inc()
            }
        }
    }
    if got == Got::Miss && !f.quiet {
        out.extend_from_slice(b"EN");
        echo_tail(out, f, key, &m.key, None);
    }
}

/// mg as a read-decide-write: tokens (W/Z), autovivify, and TTL changes under one lock.
fn mg_decide(
    ctx: &Ctx<'_>,
    out: &mut Vec<u8>,
    out_hold: &mut Hold,
    m: &MetaGet<'_>,
    key: &[u8],
    ttl: Option<Expiry>,
) -> Got {
    let f = &m.flags;
    let store = &ctx.shared.store;
    let now = ctx.now.store;
    let start = out.len();
    let vivify = flag_expiry(f.vivify, ctx);
    let recache = flag_expiry(f.recache, ctx);
    #[derive(PartialEq, Eq)]
    enum Step {
        Done(Got),
        Created,
    }
    let decided = store.update(key, now, |item| match item {
        None => match vivify {
            Some(exp) => {
                let exptime = match exp {
                    Expiry::At(t) => t,
                    Expiry::Expired => expired_at(ctx),
                };
                (
                    Write::Put {
                        value: b"",
                        meta: NewMeta {
                            flags: 0,
                            exptime,
                            cas: None,
                        },
                    },
                    Step::Created,
                )
            }
            None => (Write::Nothing, Step::Done(Got::Miss)),
        },
        Some(it) => {
            let recache_won = match recache {
                Some(Expiry::At(r)) => !it.win_token_sent && it.exptime != NEVER && it.exptime < r,
                _ => false,
            };
            let won = recache_won || (it.stale && !it.win_token_sent);
            let exptime = match ttl {
                Some(Expiry::At(t)) => t,
                _ => it.exptime,
            };
            hit_reply(out, out_hold, ctx, m, key, &ItemRef { exptime, ..it }, won);
            let write = match ttl {
                Some(Expiry::Expired) => Write::Delete,
                Some(_) => Write::Meta {
                    exptime,
                    stale: it.stale,
                    win_token_sent: it.win_token_sent || won,
                    new_cas: false,
                },
                None if won => Write::Meta {
                    exptime,
                    stale: it.stale,
                    win_token_sent: true,
                    new_cas: false,
                },
                None => Write::Nothing,
            };
            (write, Step::Done(Got::Hit))
        }
    });
    let created_cas = match decided {
        Ok(d) => match d.result {
            Step::Done(got) => return got,
            Step::Created => d.cas,
        },
        Err(e) => return refused(out, start, &e),
    };
    // The item this request created: hand its token out (memcached does both under one lock).
    let shown = store.update(key, now, |item| match item {
        Some(it) if Some(it.cas) == created_cas => {
            hit_reply(out, out_hold, ctx, m, key, &it, true);
            (
                Write::Meta {
                    exptime: it.exptime,
                    stale: false,
                    win_token_sent: true,
                    new_cas: false,
                },
                true,
            )
        }
        _ => (Write::Nothing, false),
    });
    match shown {
        Ok(d) if d.result => Got::Hit,
        Ok(_) => Got::Miss,
        Err(e) => refused(out, start, &e),
    }
}

/// Replaces what this mg wrote since `start` (a hit reply written before its write was
/// refused) with the error: a refused write never answers as done.
fn refused(out: &mut Vec<u8>, start: usize, e: &StoreError) -> Got {
    out.truncate(start);
    reply::line(out, store_error(e));
    Got::Refused
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum SetOutcome {
    Stored,
    NotStored,
    Exists,
    NotFound,
}

pub(crate) fn ms(ctx: &Ctx<'_>, out: &mut Vec<u8>, m: &MetaSet<'_>) {
    ctx.stats.cmd_set.inc();
    let mut kb = KeyBuf::default();
    let key = m.key.bytes(&mut kb);
    let f = &m.flags;
    let exp = flag_expiry(f.ttl, ctx).unwrap_or(Expiry::At(NEVER));
    let data = m.data;
    let new = || put(data, f.client_flags, exp, f.explicit_cas);
    let result = ctx
        .shared
        .store
        .update(key, ctx.now.store, |item| match (m.mode, item) {
            (b'E', Some(_)) => (Write::Nothing, SetOutcome::NotStored),
            (b'E', None) => (new(), SetOutcome::Stored),
            (b'A' | b'P', None) => (Write::Nothing, SetOutcome::NotStored),
            (b'A' | b'P', Some(it)) => {
                if f.cas.is_some_and(|c| c != it.cas) {
                    return (Write::Nothing, SetOutcome::Exists);
                }
                let meta = NewMeta {
                    flags: it.flags,
                    exptime: it.exptime,
                    cas: f.explicit_cas,
                };
                let write = if m.mode == b'A' {
                    Write::Append { suffix: data, meta }
                } else {
                    Write::Prepend { prefix: data, meta }
                };
                (write, SetOutcome::Stored)
            }
            // Set or replace with a CAS to compare: memcached's CAS mode.
            (_, None) if f.cas.is_some() => (Write::Nothing, SetOutcome::NotFound),
            (_, Some(it)) if f.cas.is_some_and(|c| c != it.cas) => {
                (Write::Nothing, SetOutcome::Exists)
            }
            (b'R', None) => (Write::Nothing, SetOutcome::NotStored),
            _ => (new(), SetOutcome::Stored),
        });
    let done = match result {
        Ok(done) => done,
        Err(e) => {
            reply::line(out, store_error(&e));
            return;
        }
    };
    let code: &[u8] = match done.result {
        SetOutcome::Stored if f.quiet => return,
        SetOutcome::Stored => b"HD",
        SetOutcome::NotStored => b"NS",
        SetOutcome::Exists => b"EX",
        SetOutcome::NotFound => b"NF",
    };
    out.extend_from_slice(code);
    echo_tail(out, f, key, &m.key, Some(done.cas.unwrap_or(0)));
}

pub(crate) fn md(ctx: &Ctx<'_>, out: &mut Vec<u8>, m: &MetaDelete<'_>) {
    let mut kb = KeyBuf::default();
    let key = m.key.bytes(&mut kb);
    let f = &m.flags;
    let ttl = flag_expiry(f.ttl, ctx);
    let result = ctx
        .shared
        .store
        .update(key, ctx.now.store, |item| match item {
            None => (Write::Nothing, &b"NF"[..]),
            Some(it) if f.cas.is_some_and(|c| c != it.cas) => (Write::Nothing, &b"EX"[..]),
            Some(it) if f.invalidate => {
                let exptime = match ttl {
                    Some(Expiry::At(t)) => t,
                    Some(Expiry::Expired) => expired_at(ctx),
                    None => it.exptime,
                };
                (
                    Write::Meta {
                        exptime,
                        stale: true,
                        win_token_sent: false,
                        new_cas: true,
                    },
                    &b"HD"[..],
                )
            }
            Some(_) => (Write::Delete, &b"HD"[..]),
        });
    let code = match result {
        Ok(d) => d.result,
        Err(e) => {
            reply::line(out, store_error(&e));
            return;
        }
    };
    if code == b"HD" {
        ctx.stats.delete_hits.inc();
        if f.quiet {
            return;
        }
    } else {
        ctx.stats.delete_misses.inc();
    }
    out.extend_from_slice(code);
    echo_tail(out, f, key, &m.key, None);
}

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
        .shared
        .store
        .update(key, ctx.now.store, move |item| match item {
            None => match vivify {
                Some(v) => {
                    let exptime = to_time(ttl.unwrap_or(v));
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
                    let exptime = ttl.map_or(it.exptime, to_time);
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

/// Size memcached would report for an item (`me size=`): key, value and a header.
const ITEM_HEADER_ESTIMATE: usize = 48;

pub(crate) fn me(ctx: &Ctx<'_>, out: &mut Vec<u8>, mkey: &MetaKey<'_>) {
    let mut kb = KeyBuf::default();
    let key = mkey.bytes(&mut kb);
    let now = ctx.now.store;
    let found = ctx.shared.store.get(key, now, ReadOpts::default(), |item| {
        let Some(it) = item else { return false };
        out.extend_from_slice(b"ME ");
        if mkey.is_binary() {
            base64_encode(key, out);
        } else {
            out.extend_from_slice(key);
        }
        out.extend_from_slice(b" exp=");
        // memcached prints `current_time - exptime` here (negative while the item lives).
        push_i64(
            out,
            if it.exptime == NEVER {
                -1
            } else {
                i64::from(now) - i64::from(it.exptime)
            },
        );
        out.extend_from_slice(b" la=");
        push_u64(out, u64::from(now.saturating_sub(it.last_access)));
        out.extend_from_slice(b" cas=");
        push_u64(out, it.cas);
        out.extend_from_slice(if it.fetched {
            b" fetch=yes"
        } else {
            b" fetch=no"
        });
        out.extend_from_slice(b" cls=1 size=");
        push_u64(
            out,
            (it.key.len() + it.value.len() + ITEM_HEADER_ESTIMATE) as u64,
        );
        out.extend_from_slice(b"\r\n");
        true
    });
    if !found {
        reply::line(out, "EN");
    }
}
