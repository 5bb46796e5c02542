//! Key listings, produced as the client drains them: `lru_crawler metadump` (memcached's
//! `key=… exp=… la=… cas=… fetch=… cls=… size=…` lines, each ended by a bare `\n` as
//! memcached ends them) and `stats cachedump 1 N` (`ITEM <key> [<bytes> b; <exptime> s]`
//! lines ended by `\r\n`), both ended by `END\r\n`; and `lru_crawler mgdump` (memcached
//! 1.6.19+: `mg <key>` lines, then `EN\r\n`).
//!
//! Like a multi-key get ([`super::get`]), the request stays at the head of the session's
//! input while it is answered: each call walks the store in bounded steps
//! ([`ringstore_store::Store::dump`], at most [`STEP_ITEMS`] items and one shard lock at a
//! time), stops once the output is over the high-water mark, and keeps the store's cursor
//! in the session until the runtime calls again with the output drained. Nothing but the
//! pending output (and its budget reservation) holds the listing; what the listing shows
//! when the keyspace changes meanwhile is said at `Store::dump`. Keys held only on the data
//! device (not in RAM) and large objects are not listed; external items (value on the
//! device) are, with their full size.

use ringstore_proto::memcache::key::{base64_encode, valid_text_key};
use ringstore_proto::memcache::reply::{self, push_i64, push_u64};
use ringstore_proto::memcache::KeyDump;
use ringstore_store::{DumpCursor, DumpItem, Time, NEVER};

use super::Ctx;
use crate::budget::Hold;
use crate::Now;

/// Items one step of the store walk may list (and examine).
pub(crate) const STEP_ITEMS: usize = 64;

/// Longest listing line: a 255-byte key percent-encoded, plus the fields.
const LINE_MAX: usize = 3 * ringstore_store::KEY_LEN_MAX + 128;

/// The answer when the output of one more step cannot be reserved in the budget.
pub(crate) const OUT_OF_MEMORY_DUMP: &str = "SERVER_ERROR out of memory writing dump";

/// What a paused listing resumes from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct DumpState {
    cursor: DumpCursor,
    /// Items listed so far (for `stats cachedump`'s limit).
    listed: u32,
}

/// How far a listing got in one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Progress {
    /// The listing is complete (`END` or an error line written).
    Done,
    /// Output reached the high-water mark; call again with this state once it drained.
    Paused(DumpState),
}

/// The size memcached reports for an item (`ITEM_ntotal`: its 48-byte header, the key and
/// its NUL, the client flags when not 0, the value and its `\r\n`, the 8-byte CAS).
pub(crate) fn memcached_item_size(key_len: usize, value_len: usize, flags: u32) -> u64 {
    let flags = if flags == 0 { 0 } else { 4 };
    (48 + key_len + 1 + flags + value_len + 2 + 8) as u64
}

/// A store time as Unix time (the clock the runtime read for this batch).
fn unix_time(t: Time, now: Now) -> i64 {
    i64::try_from(now.unix).unwrap_or(i64::MAX) - i64::from(now.store) + i64::from(t)
}

/// memcached's `uriencode` (shared with the `watch` lines).
use crate::watch::push_key as push_uriencoded;

/// ` cas=<n> fetch=<yes|no> cls=1 size=<n>`: the tail memcached's metadump and `me` lines
/// share (one item class: 1).
pub(crate) fn push_cas_fetch_size(out: &mut Vec<u8>, cas: u64, fetched: bool, size: u64) {
    out.extend_from_slice(b" cas=");
    push_u64(out, cas);
    out.extend_from_slice(if fetched { b" fetch=yes" } else { b" fetch=no" });
    out.extend_from_slice(b" cls=1 size=");
    push_u64(out, size);
}

/// An expiry as absolute Unix time, or `never` for an item that does not expire.
fn unix_exptime(exptime: Time, never: i64, now: Now) -> i64 {
    if exptime == NEVER {
        never
    } else {
        unix_time(exptime, now)
    }
}

fn meta_line(out: &mut Vec<u8>, it: &DumpItem<'_>, now: Now) {
    out.extend_from_slice(b"key=");
    push_uriencoded(out, it.key);
    out.extend_from_slice(b" exp=");
    push_i64(out, unix_exptime(it.exptime, -1, now));
    out.extend_from_slice(b" la=");
    push_i64(out, unix_time(it.last_access, now));
    let size = memcached_item_size(it.key.len(), it.value_len, it.flags);
    push_cas_fetch_size(out, it.cas, it.fetched, size);
    // memcached ends these lines with a bare `\n` (only `END` has `\r\n`).
    out.push(b'\n');
}

/// `mg <key>\r\n`, or `mg <base64> b\r\n` for a key a text command could not carry.
fn mg_line(out: &mut Vec<u8>, it: &DumpItem<'_>) {
    out.extend_from_slice(b"mg ");
    if valid_text_key(it.key) && !it.key.contains(&b' ') {
        out.extend_from_slice(it.key);
    } else {
        base64_encode(it.key, out);
        out.extend_from_slice(b" b");
    }
    out.extend_from_slice(b"\r\n");
}

fn cachedump_line(out: &mut Vec<u8>, it: &DumpItem<'_>, now: Now) {
    out.extend_from_slice(b"ITEM ");
    out.extend_from_slice(it.key);
    out.extend_from_slice(b" [");
    push_u64(out, it.value_len as u64);
    out.extend_from_slice(b" b; ");
    push_i64(out, unix_exptime(it.exptime, 0, now));
    out.extend_from_slice(b" s]\r\n");
}

/// Lists items from `resume` on (`None`: from the start), pausing at the high-water mark.
pub(crate) fn dump(
    ctx: &Ctx<'_>,
    out: &mut Vec<u8>,
    out_hold: &mut Hold,
    kind: KeyDump,
    resume: Option<DumpState>,
) -> Progress {
    let high_water = ctx.shared.config.out_high_water;
    let limit = match kind {
        KeyDump::CacheDump { limit } if limit > 0 => limit,
        _ => u32::MAX,
    };
    let now = ctx.now;
    let mut state = resume.unwrap_or_default();
    let mut first = true;
    loop {
        // At least one step per call, so a resumed listing always makes progress.
        if !first && out.len() > high_water {
            return Progress::Paused(state);
        }
        first = false;
        if state.listed >= limit {
            break;
        }
        let steps = STEP_ITEMS.min((limit - state.listed) as usize);
        if !out_hold.room_for_output(&ctx.shared.conn_memory, out.len(), steps * LINE_MAX) {
            reply::line(out, OUT_OF_MEMORY_DUMP);
            return Progress::Done;
        }
        let listed = &mut state.listed;
        let next = ctx.shared.store.dump(state.cursor, now.store, steps, |it| {
            *listed += 1;
            match kind {
                KeyDump::Meta => meta_line(out, &it, now),
                KeyDump::CacheDump { .. } => cachedump_line(out, &it, now),
                KeyDump::Mg => mg_line(out, &it),
            }
        });
        match next {
            Some(cursor) => state.cursor = cursor,
            None => break,
        }
    }
    reply::line(out, if kind == KeyDump::Mg { "EN" } else { "END" });
    Progress::Done
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_keys_and_sizes_as_memcached() {
        // Both lines as memcached 1.6.18 printed them (`lru_crawler metadump all`).
        let mut out = Vec::new();
        push_uriencoded(&mut out, b"a/b%c:d~e_f.g-h");
        assert_eq!(out, b"a%2Fb%25c%3Ad~e_f.g-h");
        out.clear();
        push_uriencoded(&mut out, &[0, 1, 2]);
        assert_eq!(out, b"%00%01%02");
        assert_eq!(memcached_item_size(1, 3, 5), 67);
        assert_eq!(memcached_item_size(1, 1, 0), 61);
        assert_eq!(memcached_item_size(15, 1, 0), 75);
    }
}
