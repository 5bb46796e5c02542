//! get, gets, gat, gats: produced incrementally, as the client drains them. Each hit's value
//! is copied once, under the shard lock, into the output buffer, and only while the pending
//! output is under the high-water mark and the copy fits in the connection-memory budget;
//! a value of at least 4 KiB (`ZERO_COPY_MIN`) on a zero-copy connection is instead pinned in the arena and
//! spliced into the output by the runtime's send (`zero_copy.rs`), within the pin caps.
//!
//! Why a cursor: one command line of a few KB can name the same 1 MiB value thousands of
//! times. Building the whole reply first would hold gigabytes and stall the worker; instead
//! the request stays at the head of the session's input, `cursor` counts the keys already
//! answered, and the runtime calls the session again once the output has been sent.

use ringstore_proto::memcache::{reply, GetRequest};
use ringstore_store::{ReadOpts, StoreError, Write};

use super::expiry::{expiry, Expiry};
use super::storage::store_error;
use super::Ctx;
use crate::budget::Hold;
use crate::zero_copy::ZeroCopy;

/// memcached's answer when it cannot allocate room for a get's reply.
pub(crate) const OUT_OF_MEMORY_GET: &str = "SERVER_ERROR out of memory writing get response";

/// Bytes of a `VALUE` line beyond the key and the data (flags, length, cas, separators).
pub(crate) const VALUE_OVERHEAD: usize = 64;

/// How far a get got in one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Progress {
    /// The reply is complete (`END` or an error line written).
    Done,
    /// Output reached the high-water mark after `n` keys in all; call again with
    /// `cursor = n` once it has drained.
    Paused(usize),
}

/// Answers `g`'s keys from `cursor` on, pausing at the high-water mark.
pub(crate) fn get(
    ctx: &Ctx<'_>,
    out: &mut Vec<u8>,
    out_hold: &mut Hold,
    g: GetRequest<'_>,
    cursor: usize,
    marks: &mut Option<Vec<super::ResponseMark>>,
    zc: &mut ZeroCopy,
) -> Progress {
    let store = ctx.store();
    let high_water = ctx.shared.config.out_high_water;
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
    // Not `peekable` to find the last key: each key but the first of a call ends the
    // response before it instead (what a peek per key cost, callgrind: ~20 instructions).
    for (index, key) in g.keys.enumerate().skip(cursor) {
        if index > cursor {
            // memcached answers each key but the last as its own response (END joins the
            // last); the key before this one was answered by an earlier call when
            // `index == cursor`.
            super::mark(marks, out.len(), true);
            // At least one key per call, so a resumed get always makes progress.
            if out.len() + zc.pinned > high_water {
                return Progress::Paused(index);
            }
        }
        let mut size = 0;
        let found = match read_key(ctx, out, out_hold, zc, key, opts, with_cas) {
            Ok((Read::NoRoom, _)) => {
                // The hit is counted; its reply is the error and the rest of the keys go unread.
                ctx.stats.cmd_get.inc();
                ctx.stats.get_hits.inc();
                reply::line(out, OUT_OF_MEMORY_GET);
                return Progress::Done;
            }
            Ok((read, len)) => {
                size = len;
                Ok(read == Read::Hit)
            }
            Err(e) => Err(e),
        };
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
                // whole, like a refused set, rather than answering values it did not touch
                // (what an earlier call of a paused get already sent cannot be taken back).
                ctx.stats.cmd_touch.inc();
                out.truncate(start);
                zc.release_from(ctx.shared, ctx.stats, start);
                reply::line(out, store_error(&e));
                return Progress::Done;
            }
        };
        count(ctx, touch.is_some(), hit);
        ctx.watch_get(key, hit, size);
    }
    out.extend_from_slice(b"END\r\n");
    Progress::Done
}

/// What reading one key of a get wrote.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Read {
    /// Its value (copied, or its header with the value to splice from a pin).
    Hit,
    Miss,
    /// A hit with no room in the connection-memory budget for its value: nothing written.
    NoRoom,
}

/// Reads `key` and writes its value into `out`: copied, or (a big value, without a data
/// device, within the pin caps) as a header with the value spliced from the pinned item.
/// Also returns the value's length (0 on a miss).
fn read_key(
    ctx: &Ctx<'_>,
    out: &mut Vec<u8>,
    out_hold: &mut Hold,
    zc: &mut ZeroCopy,
    key: &[u8],
    opts: ReadOpts,
    with_cas: bool,
) -> Result<(Read, usize), StoreError> {
    let budget = &ctx.shared.conn_memory;
    let mut size = 0;
    let mut no_room = false;
    let mut spliced = None;
    let pin_from = zc.pin_from(ctx.device.is_some());
    let found = ctx
        .store()
        .try_get_pinned(key, ctx.now.store, opts, pin_from, |item, pin| match item {
            Some(it) => {
                size = it.value.len();
                if zc.splice(ctx.stats, it.value.len(), pin_from, pin) {
                    let cas = with_cas.then_some(it.cas);
                    reply::value_header(out, it.key, it.flags, it.value.len(), cas);
                    spliced = Some(out.len());
                    out.extend_from_slice(b"\r\n");
                    return true;
                }
                let extra = it.key.len() + it.value.len() + VALUE_OVERHEAD;
                if !out_hold.room_for_output(budget, out.len(), extra) {
                    no_room = true;
                    return false;
                }
                reply::value(out, it.key, it.flags, it.value, with_cas.then_some(it.cas));
                true
            }
            None => false,
        });
    let found = found.map(|(hit, pin)| {
        if let (Some(at), Some(pin)) = (spliced, pin) {
            zc.push(ctx.stats, at, pin);
        }
        hit
    });
    if no_room {
        return Ok((Read::NoRoom, size));
    }
    found.map(|hit| {
        if hit {
            (Read::Hit, size)
        } else {
            (Read::Miss, 0)
        }
    })
}

/// Counts one key of a get, or of a gat or touch (`touch`), as a hit or a miss.
pub(crate) fn count(ctx: &Ctx<'_>, touch: bool, hit: bool) {
    let s = ctx.stats;
    match (touch, hit) {
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
