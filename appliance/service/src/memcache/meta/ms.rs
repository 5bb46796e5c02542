//! ms: set with meta flags (modes, CAS, invalidation, base64 keys).

use super::*;
use crate::memcache::storage::{watch_store, Outcome};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum SetOutcome {
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
    let new = || put(data, f.client_flags, exp, None);
    let result = ctx
        .store()
        .update(key, ctx.now.store, |item| match (m.mode, item) {
            (b'A' | b'P', None) => (Write::Nothing, SetOutcome::NotStored),
            (b'A' | b'P', Some(it)) => {
                if f.cas.is_some_and(|c| c != it.cas) {
                    return (Write::Nothing, SetOutcome::Exists);
                }
                let meta = NewMeta {
                    flags: it.flags,
                    exptime: it.exptime,
                    cas: None,
                };
                let write = if m.mode == b'A' {
                    Write::Append { suffix: data, meta }
                } else {
                    Write::Prepend { prefix: data, meta }
                };
                (write, SetOutcome::Stored)
            }
            // `I` with a CAS older than the item's (0 is no CAS there): memcached stores the
            // value anyway, marked stale, with the old TTL and the win-token mark kept.
            (b'S' | b'R', Some(it))
                if f.invalidate && f.cas.is_some_and(|c| c != 0 && c < it.cas) =>
            {
                let meta = NewMeta {
                    flags: f.client_flags,
                    exptime: it.exptime,
                    cas: None,
                };
                let write = Write::PutStale {
                    value: data,
                    meta,
                    win_token_sent: it.win_token_sent,
                };
                (write, SetOutcome::Stored)
            }
            (mode, item) => match decide(mode, f.cas, item.as_ref()) {
                SetOutcome::Stored => (new(), SetOutcome::Stored),
                outcome => (Write::Nothing, outcome),
            },
        });
    answer(ctx, out, m, (key, exp, data.len()), result);
}

/// What an ms in mode `mode` (E, R or S; `cas`: its `C` flag) decides given the current
/// item, when it needs neither the old value (A, P) nor stale marking (`I`): the only ms
/// a value received into its item takes (`direct.rs`).
pub(crate) fn decide(mode: u8, cas: Option<u64>, item: Option<&ItemRef<'_>>) -> SetOutcome {
    match (mode, item) {
        (b'E', Some(_)) => SetOutcome::NotStored,
        (b'E', None) => SetOutcome::Stored,
        // Set or replace with a CAS to compare: memcached's CAS mode.
        (_, None) if cas.is_some() => SetOutcome::NotFound,
        (_, Some(it)) if cas.is_some_and(|c| c != it.cas) => SetOutcome::Exists,
        (b'R', None) => SetOutcome::NotStored,
        _ => SetOutcome::Stored,
    }
}

/// Counts, logs and answers ms `m` on `key` (decoded), expiring at `exp`, with a value of
/// `size` bytes, that ended with `result`: both ways its value arrives (buffered, or
/// received into its item, `direct.rs`).
pub(crate) fn answer(
    ctx: &Ctx<'_>,
    out: &mut Vec<u8>,
    m: &MetaSet<'_>,
    (key, exp, size): (&[u8], Expiry, usize),
    result: Result<ringstore_store::Updated<SetOutcome>, StoreError>,
) {
    let f = &m.flags;
    let done = match result {
        Ok(done) => done,
        Err(e) => {
            count_store_error(ctx, &e);
            reply::line(out, store_error(&e));
            return;
        }
    };
    let outcome = match done.result {
        SetOutcome::Stored => Outcome::Stored,
        SetOutcome::NotStored => Outcome::NotStored,
        SetOutcome::Exists => Outcome::Exists,
        SetOutcome::NotFound => Outcome::NotFound,
    };
    let cmd = match m.mode {
        b'E' => "add",
        b'A' => "append",
        b'P' => "prepend",
        b'R' => "replace",
        _ if f.cas.is_some() => "cas",
        _ => "set",
    };
    watch_store(ctx, key, cmd, outcome, exp, size);
    if f.cas.is_some() && matches!(m.mode, b'S' | b'R') {
        let s = ctx.stats;
        match done.result {
            SetOutcome::Stored => s.cas_hits.inc(),
            SetOutcome::Exists => s.cas_badval.inc(),
            SetOutcome::NotFound => s.cas_misses.inc(),
            SetOutcome::NotStored => {}
        }
    }
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
