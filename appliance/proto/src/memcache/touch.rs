//! `touch <key> <exptime> [noreply]`.

use super::arith::key_arg_command;
use super::tokens::{strtol32, Tokens};
use super::Request;

/// memcached's reply to an exptime that is not a number.
pub const INVALID_EXPTIME: &str = "CLIENT_ERROR invalid exptime argument";

pub(crate) fn parse<'a>(toks: &Tokens<'a>) -> Request<'a> {
    key_arg_command(toks, |key, noreply| match strtol32(toks.at(2)) {
        Some(exptime) => Request::Touch {
            key,
            exptime,
            noreply,
        },
        None => Request::error(INVALID_EXPTIME, noreply),
    })
}

#[cfg(test)]
mod tests {
    use super::super::testing::req;
    use super::super::ERROR;
    use super::*;

    #[test]
    fn touch_forms() {
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
