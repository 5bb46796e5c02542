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
use super::storage::{count_store_error, put, store_error};
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
            b'c' => {
                if let Some(cas) = cas {
                    meta_num(out, b'c', cas);
                }
            }
            _ => echo_opaque_or_key(out, tok, key, mkey),
        }
    }
    out.extend_from_slice(b"\r\n");
}

/// Echoes `tok` when it is the opaque (`O`) or the key (`k`) flag, which every meta reply
/// returns as the client gave them; nothing for any other flag.
fn echo_opaque_or_key(out: &mut Vec<u8>, tok: &[u8], key: &[u8], mkey: &MetaKey<'_>) {
    match tok[0] {
        b'O' => {
            out.push(b' ');
            out.extend_from_slice(tok);
        }
        b'k' => push_key(out, key, mkey.is_binary()),
        _ => {}
    }
}

mod ma;
mod md;
mod me;
mod mg;
mod ms;

pub(crate) use ma::ma;
pub(crate) use md::md;
pub(crate) use me::me;
pub(crate) use mg::mg;
pub(crate) use ms::{answer as ms_answer, decide as ms_decide, ms, SetOutcome};
