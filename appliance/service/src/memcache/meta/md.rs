//! md: delete, or with `I` mark stale (invalidate) instead.

use super::*;

pub(crate) fn md(ctx: &Ctx<'_>, out: &mut Vec<u8>, m: &MetaDelete<'_>) {
    let mut kb = KeyBuf::default();
    let key = m.key.bytes(&mut kb);
    let f = &m.flags;
    let ttl = flag_expiry(f.ttl, ctx);
    let result = ctx.store().update(key, ctx.now.store, |item| match item {
        None => (Write::Nothing, &b"NF"[..]),
        Some(it) if f.cas.is_some_and(|c| c != it.cas) => (Write::Nothing, &b"EX"[..]),
        Some(it) if f.invalidate => {
            let exptime = match ttl {
                Some(Expiry::At(t)) => t,
                Some(Expiry::Expired) => expired_at(ctx),
                None => it.exptime,
            };
            let write = Write::Meta {
                exptime,
                stale: true,
                win_token_sent: false,
                new_cas: true,
            };
            (write, &b"HD"[..])
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
