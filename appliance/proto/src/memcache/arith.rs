//! `incr` / `decr <key> <delta> [noreply]`.

use super::key::valid_text_key;
use super::tokens::{strtoull, Tokens};
use super::{Request, BAD_FORMAT, ERROR};

/// Reply to a delta that is not an unsigned 64-bit number.
pub const INVALID_DELTA: &str = "CLIENT_ERROR invalid numeric delta argument";
/// Reply when the stored value is not a number.
pub const NON_NUMERIC: &str = "CLIENT_ERROR cannot increment or decrement non-numeric value";

pub(crate) fn parse<'a>(toks: &Tokens<'a>, incr: bool) -> Request<'a> {
    key_arg_command(toks, |key, noreply| match strtoull(toks.at(2)) {
        Some(delta) => Request::Arith {
            incr,
            key,
            delta,
            noreply,
        },
        None => Request::error(INVALID_DELTA, noreply),
    })
}

/// `<cmd> <key> <arg> [noreply]` (incr, decr, touch): memcached's `ERROR` for a wrong
/// token count, bad-format for a bad key; else `request(key, noreply)` reads the argument.
pub(crate) fn key_arg_command<'a>(
    toks: &Tokens<'a>,
    request: impl FnOnce(&'a [u8], bool) -> Request<'a>,
) -> Request<'a> {
    let n = toks.ntokens();
    if n != 4 && n != 5 {
        return Request::reply(ERROR);
    }
    let noreply = toks.noreply();
    let key = toks.at(1);
    if !valid_text_key(key) {
        return Request::error(BAD_FORMAT, noreply);
    }
    request(key, noreply)
}

/// memcached's arithmetic on a stored value: `None` when the value is not a number
/// (empty, negative, or trailing garbage); incr wraps at 2^64, decr stops at 0.
pub fn apply(value: &[u8], incr: bool, delta: u64) -> Option<u64> {
    if value.is_empty() {
        return None;
    }
    let current = strtoull(value)?;
    Some(if incr {
        current.wrapping_add(delta)
    } else {
        current.saturating_sub(delta)
    })
}

#[cfg(test)]
mod tests {
    use super::super::testing::req;
    use super::*;

    #[test]
    fn parses_and_errors() {
        assert_eq!(
            req(b"incr a 5\r\n"),
            Request::Arith {
                incr: true,
                key: b"a",
                delta: 5,
                noreply: false
            }
        );
        assert_eq!(
            req(b"decr a 5 noreply\r\n"),
            Request::Arith {
                incr: false,
                key: b"a",
                delta: 5,
                noreply: true
            }
        );
        assert_eq!(
            req(b"incr a 1 2\r\n"),
            Request::Arith {
                incr: true,
                key: b"a",
                delta: 1,
                noreply: false
            }
        );
        assert_eq!(req(b"incr a\r\n"), Request::reply(ERROR));
        assert_eq!(
            req(b"incr a -1\r\n"),
            Request::Reply {
                line: INVALID_DELTA,
                noreply: false,
                swallow: 0
            }
        );
        assert_eq!(
            req(b"incr a abc noreply\r\n"),
            Request::Reply {
                line: INVALID_DELTA,
                noreply: true,
                swallow: 0
            }
        );
        assert_eq!(
            req(b"incr a 18446744073709551616\r\n"),
            Request::Reply {
                line: INVALID_DELTA,
                noreply: false,
                swallow: 0
            }
        );
    }

    #[test]
    fn arithmetic_rules() {
        assert_eq!(apply(b"18446744073709551615", true, 1), Some(0));
        assert_eq!(apply(b"100", false, 1000), Some(0));
        assert_eq!(apply(b" 12", true, 1), Some(13));
        assert_eq!(apply(b"12 ", true, 1), Some(13));
        assert_eq!(apply(b"-12", true, 1), None);
        assert_eq!(apply(b"", true, 1), None);
        assert_eq!(apply(b"x", true, 1), None);
    }
}
