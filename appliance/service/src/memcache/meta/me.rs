//! me: the debug line for a key.

use super::*;
use crate::memcache::dump::{memcached_item_size, push_cas_fetch_size};

pub(crate) fn me(ctx: &Ctx<'_>, out: &mut Vec<u8>, mkey: &MetaKey<'_>) {
    let mut kb = KeyBuf::default();
    let key = mkey.bytes(&mut kb);
    // memcached 1.6.18 counts only `me` as `cmd_meta`.
    ctx.stats.cmd_meta.inc();
    let now = ctx.now.store;
    let found = ctx.store().get(key, now, ReadOpts::default(), |item| {
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
        let size = memcached_item_size(it.key.len(), it.value.len(), it.flags);
        push_cas_fetch_size(out, it.cas, it.fetched, size);
        out.extend_from_slice(b"\r\n");
        true
    });
    if !found {
        reply::line(out, "EN");
    }
}
