//! `mg <key> <flags>*`: meta get.

use super::meta::parse_head;
use super::tokens::Tokens;
use super::Request;

pub(crate) fn parse<'a>(toks: &Tokens<'a>, line: &'a [u8]) -> Request<'a> {
    match parse_head(toks, line, "CLIENT_ERROR options flags are too long", None) {
        Ok(h) => Request::MetaGet(h),
        Err(line) => Request::reply(line),
    }
}
