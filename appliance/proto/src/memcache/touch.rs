//! `touch <key> <exptime> [noreply]`.

use super::key::valid_text_key;
use super::tokens::{strtol32, Tokens};
use super::{Request, BAD_FORMAT, ERROR};

/// memcached's reply to an exptime that is not a number.
pub const INVALID_EXPTIME: &str = "CLIENT_ERROR invalid exptime argument";

pub(crate) fn parse<'a>(toks: &Tokens<'a>) -> Request<'a> {
    let n = toks.ntokens();
    if n != 4 && n != 5 {
        return Request::reply(ERROR);
    }
    let noreply = toks.noreply();
    let key = toks.at(1);
    if !valid_text_key(key) {
        return Request::Reply {
            line: BAD_FORMAT,
            noreply,
            swallow: 0,
        };
    }
    match strtol32(toks.at(2)) {
        Some(exptime) => Request::Touch {
            key,
            exptime,
            noreply,
        },
        None => Request::Reply {
            line: INVALID_EXPTIME,
            noreply,
            swallow: 0,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::super::{parse, Limits, Parse};
    use super::*;

    #[test]
    fn touch_forms() {
        let req = |i: &'static [u8]| match parse(i, &Limits::default()) {
            Parse::Done { request, .. } => request,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            req(b"touch a 10\r\n"),
            Request::Touch {
                key: b"a",
                exptime: 10,
                noreply: false
            }
        );
        assert_eq!(
            req(b"touch a 10 noreply\r\n"),
            Request::Touch {
                key: b"a",
                exptime: 10,
                noreply: true
            }
        );
        assert_eq!(req(b"touch a\r\n"), Request::reply(ERROR));
        assert_eq!(
            req(b"touch a abc\r\n"),
            Request::Reply {
                line: INVALID_EXPTIME,
                noreply: false,
                swallow: 0
            }
        );
    }
}
