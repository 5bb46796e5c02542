//! `flush_all [delay] [noreply]`.

use super::tokens::{strtol32, Tokens};
use super::touch::INVALID_EXPTIME;
use super::{Request, ERROR};

pub(crate) fn parse<'a>(toks: &Tokens<'a>) -> Request<'a> {
    let n = toks.ntokens();
    if !(2..=4).contains(&n) {
        return Request::reply(ERROR);
    }
    let noreply = toks.noreply();
    let mut delay = 0;
    if n != if noreply { 3 } else { 2 } {
        match strtol32(toks.at(1)) {
            Some(d) => delay = d,
            None => return Request::error(INVALID_EXPTIME, noreply),
        }
    }
    Request::FlushAll { delay, noreply }
}

#[cfg(test)]
mod tests {
    use super::super::testing::req;
    use super::*;

    #[test]
    fn flush_forms() {
        assert_eq!(
            req(b"flush_all\r\n"),
            Request::FlushAll {
                delay: 0,
                noreply: false
            }
        );
        assert_eq!(
            req(b"flush_all 10\r\n"),
            Request::FlushAll {
                delay: 10,
                noreply: false
            }
        );
        assert_eq!(
            req(b"flush_all noreply\r\n"),
            Request::FlushAll {
                delay: 0,
                noreply: true
            }
        );
        assert_eq!(
            req(b"flush_all 5 noreply\r\n"),
            Request::FlushAll {
                delay: 5,
                noreply: true
            }
        );
        assert_eq!(
            req(b"flush_all 1 2\r\n"),
            Request::FlushAll {
                delay: 1,
                noreply: false
            }
        );
        assert_eq!(
            req(b"flush_all abc\r\n"),
            Request::Reply {
                line: INVALID_EXPTIME,
                noreply: false,
                swallow: 0
            }
        );
        assert_eq!(req(b"flush_all 1 2 3\r\n"), Request::reply(ERROR));
    }
}
