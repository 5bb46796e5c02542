//! get, gets, gat, gats: each hit's value is copied once, under the shard lock, into the
//! output buffer.

use ringstore_proto::memcache::{reply, GetRequest};
use ringstore_store::{ReadOpts, Write};

use super::expiry::{expiry, Expiry};
use super::storage::store_error;
use super::Ctx;

pub(crate) fn get(ctx: &Ctx<'_>, out: &mut Vec<u8>, g: GetRequest<'_>) {
    let store = &ctx.shared.store;
    let now = ctx.now.store;
    let touch = g.touch.map(|e| expiry(i64::from(e), ctx.now));
    let with_cas = g.cas;
    let opts = ReadOpts {
        mark_access: true,
        touch: match touch {
            Some(Expiry::At(t)) => Some(t),
            _ => None,
        },
        see_large: false,
    };
    let start = out.len();
    for key in g.keys {
        let found = store.try_get(key, now, opts, |item| match item {
            Some(it) => {
                reply::value(out, it.key, it.flags, it.value, with_cas.then_some(it.cas));
                true
            }
            None => false,
        });
        let found = match found {
            Ok(true) if touch == Some(Expiry::Expired) => {
                // Touched into the past: the value was served, now it is gone.
                store
                    .update(key, now, |_| (Write::Delete, ()))
                    .map(|_| true)
            }
            other => other,
        };
        let hit = match found {
            Ok(hit) => hit,
            Err(e) => {
                // The journal refused a touch (a full data device): the request fails as a
                // whole, like a refused set, rather than answering values it did not touch.
                ctx.stats.cmd_touch.inc();
                out.truncate(start);
                reply::line(out, store_error(&e));
                return;
            }
        };
        let s = ctx.stats;
        match (touch.is_some(), hit) {
            (true, true) => {
                s.cmd_touch.inc();
                s.touch_hits.inc();
            }
            (true, false) => {
                s.cmd_touch.inc();
                s.touch_misses.inc();
            }
            (false, true) => {
                s.cmd_get.inc();
                s.get_hits.inc();
            }
            (false, false) => {
                s.cmd_get.inc();
                s.get_misses.inc();
            }
        }
    }
    out.extend_from_slice(b"END\r\n");
}
