//! `md <key> <flags>*`: meta delete (or invalidate with `I`).

use super::meta::parse_head;
use super::tokens::Tokens;
use super::Request;

pub(crate) fn parse<'a>(toks: &Tokens<'a>, line: &'a [u8]) -> Request<'a> {
    match parse_head(
        toks,
        line,
        "CLIENT_ERROR options flags too long",
        Some("CLIENT_ERROR invalid or duplicate flag"),
    ) {
        Ok(h) => Request::MetaDelete(h),
        Err(line) => Request::reply(line),
    }
}
