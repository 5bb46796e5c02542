//! mg: a plain read, or a read-decide-write when it may hand out a win token or create an item.

use super::*;
use crate::zero_copy::ZeroCopy;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Got {
    Hit,
    Miss,
    NeedsWrite,
    /// The journal refused the write (a full data device); the error reply is written.
    Refused,
}

/// How a hit's value (with `v`) goes out.
#[derive(Clone, Copy, PartialEq, Eq)]
enum ValueOut {
    /// Copied into the output (within the connection-memory budget).
    Copy,
    /// Spliced from a pin the caller holds: only the header and the closing `\r\n` are
    /// written (`zero_copy.rs`).
    Splice,
}

/// Writes the reply of a hit; with [`ValueOut::Splice`] returns the output offset the
/// value's bytes go out at.
#[expect(
    clippy::too_many_arguments,
    reason = "one reply's parts, each a borrow"
)]
fn hit_reply(
    out: &mut Vec<u8>,
    out_hold: &mut Hold,
    ctx: &Ctx<'_>,
    m: &MetaGet<'_>,
    key: &[u8],
    it: &ItemRef<'_>,
    won: bool,
    value_out: ValueOut,
) -> Option<usize> {
    let f = &m.flags;
    let extra = it.value.len() + key.len() + VALUE_OVERHEAD;
    if f.value
        && value_out == ValueOut::Copy
        && !out_hold.room_for_output(&ctx.shared.conn_memory, out.len(), extra)
    {
        reply::line(out, OUT_OF_MEMORY_GET);
        return None;
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
            _ => echo_opaque_or_key(out, tok, key, &m.key),
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
    if !f.value {
        return None;
    }
    if value_out == ValueOut::Splice {
        let at = out.len();
        out.extend_from_slice(b"\r\n");
        return Some(at);
    }
    out.reserve(it.value.len() + 2);
    out.extend_from_slice(it.value);
    out.extend_from_slice(b"\r\n");
    None
}

/// mg; a plain read of a big value with `v` on a zero-copy connection sends it from the
/// item (`zc`), as `get` does. The read-decide-write paths (tokens, vivify, TTL changes)
/// copy: they read under the store's update, which grants no pins.
pub(crate) fn mg(
    ctx: &Ctx<'_>,
    out: &mut Vec<u8>,
    out_hold: &mut Hold,
    zc: &mut ZeroCopy,
    m: &MetaGet<'_>,
) {
    let mut kb = KeyBuf::default();
    let key = m.key.bytes(&mut kb);
    let f = &m.flags;
    let ttl = flag_expiry(f.ttl, ctx);
    let store = ctx.store();
    let now = ctx.now.store;
    let start = out.len();
    let mut got = Got::NeedsWrite;
    let mut size = 0;
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
        let pin_from = match f.value {
            true => zc.pin_from(ctx.device.is_some()),
            false => usize::MAX,
        };
        let mut spliced = None;
        let read = store.try_get_pinned(key, now, opts, pin_from, |item, pin| match item {
            None => Got::Miss,
            Some(it) if it.stale && !it.win_token_sent => Got::NeedsWrite,
            Some(it) => {
                size = it.value.len();
                let value_out = match zc.splice(ctx.stats, size, pin_from, pin) {
                    true => ValueOut::Splice,
                    false => ValueOut::Copy,
                };
                spliced = hit_reply(out, out_hold, ctx, m, key, &it, false, value_out);
                Got::Hit
            }
        });
        got = match read {
            Ok((got, pin)) => {
                if let (Some(at), Some(pin)) = (spliced, pin) {
                    zc.push(ctx.stats, at, pin);
                }
                got
            }
            Err(e) => refused(out, start, &e),
        };
    }
    if got == Got::NeedsWrite {
        got = mg_decide(ctx, out, out_hold, m, key, ttl);
    }
    ctx.watch_get(key, got == Got::Hit, size);
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
    let store = ctx.store();
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
            hit_reply(
                out,
                out_hold,
                ctx,
                m,
                key,
                &ItemRef { exptime, ..it },
                won,
                ValueOut::Copy,
            );
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
            hit_reply(out, out_hold, ctx, m, key, &it, true, ValueOut::Copy);
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
