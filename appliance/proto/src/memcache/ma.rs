//! `ma <key> <flags>*`: meta arithmetic (incr/decr with autovivify).

use super::meta::{parse_head, MetaArith};
use super::tokens::Tokens;
use super::Request;

pub(crate) fn parse<'a>(toks: &Tokens<'a>, line: &'a [u8]) -> Request<'a> {
    let h = match parse_head(
        toks,
        line,
        "CLIENT_ERROR options flags too long",
        Some("CLIENT_ERROR invalid or duplicate flag"),
    ) {
        Ok(h) => h,
        Err(line) => return Request::reply(line),
    };
    let incr = match h.flags.mode {
        None | Some(b'I') | Some(b'+') => true,
        Some(b'D') | Some(b'-') => false,
        Some(_) => return Request::reply("CLIENT_ERROR invalid mode for ma M token"),
    };
    Request::MetaArith(MetaArith {
        key: h.key,
        flags: h.flags,
        incr,
    })
}
