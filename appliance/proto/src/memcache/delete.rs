//! `delete <key> [0] [noreply]`.

use super::key::valid_text_key;
use super::tokens::Tokens;
use super::{Request, BAD_FORMAT, ERROR};

/// memcached's reply to `delete` with a hold time other than 0.
pub const DELETE_USAGE: &str =
    "CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]";

pub(crate) fn parse<'a>(toks: &Tokens<'a>) -> Request<'a> {
    let n = toks.ntokens();
    if !(3..=5).contains(&n) {
        return Request::reply(ERROR);
    }
    let noreply = toks.noreply();
    if n > 3 {
        let hold_is_zero = toks.at(2) == b"0";
        let valid = (n == 4 && (hold_is_zero || noreply)) || (n == 5 && hold_is_zero && noreply);
        if !valid {
            return Request::error(DELETE_USAGE, noreply);
        }
    }
    let key = toks.at(1);
    if !valid_text_key(key) {
        return Request::error(BAD_FORMAT, noreply);
    }
    Request::Delete { key, noreply }
}

#[cfg(test)]
mod tests {
    use super::super::testing::req;
    use super::*;

    #[test]
    fn delete_forms() {
        assert_eq!(
            req(b"delete a\r\n"),
            Request::Delete {
                key: b"a",
                noreply: false
            }
        );
        assert_eq!(
            req(b"delete a 0\r\n"),
            Request::Delete {
                key: b"a",
                noreply: false
            }
        );
        assert_eq!(
            req(b"delete a noreply\r\n"),
            Request::Delete {
                key: b"a",
                noreply: true
            }
        );
        assert_eq!(
            req(b"delete a 0 noreply\r\n"),
            Request::Delete {
                key: b"a",
                noreply: true
            }
        );
        assert_eq!(
            req(b"delete a 5\r\n"),
            Request::Reply {
                line: DELETE_USAGE,
                noreply: false,
                swallow: 0
            }
        );
        assert_eq!(
            req(b"delete a x noreply\r\n"),
            Request::Reply {
                line: DELETE_USAGE,
                noreply: true,
                swallow: 0
            }
        );
        assert_eq!(req(b"delete\r\n"), Request::reply(ERROR));
        assert_eq!(req(b"delete a 0 noreply x\r\n"), Request::reply(ERROR));
    }
}
