//! `ms <key> <datalen> <flags>*` and its data block: meta set.

use super::key::{valid_text_key, MetaKey};
use super::meta::{opaque_too_long, parse_ms_flags, MetaSet, MAX_OPT_TOKENS, OPAQUE_TOO_LONG};
use super::tokens::{strtol32, Tokens};
use super::{
    data_block, DataBlock, Limits, Parse, Request, BAD_DATA_CHUNK, BAD_FORMAT, ERROR,
    KEY_MAX_LENGTH,
};

pub(crate) fn parse<'a>(
    toks: &Tokens<'a>,
    line: &'a [u8],
    line_end: usize,
    after: &'a [u8],
    limits: &Limits,
) -> Parse<'a> {
    let line_only = |request| Parse::Done {
        request,
        consumed: line_end,
    };
    if toks.ntokens() < 3 {
        return line_only(Request::reply(ERROR));
    }
    let raw = toks.at(1);
    if raw.len() > KEY_MAX_LENGTH || toks.ntokens() == 3 {
        return line_only(Request::reply(BAD_FORMAT));
    }
    if toks.ntokens() > MAX_OPT_TOKENS {
        return line_only(Request::reply("CLIENT_ERROR options flags too long"));
    }
    let vlen = match strtol32(toks.at(2)) {
        Some(v) if (0..=i32::MAX - 2).contains(&v) => v as usize,
        _ => return line_only(Request::reply(BAD_FORMAT)),
    };
    // From here on memcached knows the data length and swallows the block after an error.
    let swallowing = |line| Request::Reply {
        line,
        noreply: false,
        swallow: vlen + 2,
    };
    let mut key = MetaKey::text(raw);
    let flags = match parse_ms_flags(toks, line, &mut key) {
        Ok(f) => f,
        Err(e) => return line_only(swallowing(e)),
    };
    if opaque_too_long(&flags) {
        return line_only(swallowing(OPAQUE_TOO_LONG));
    }
    let mode = match flags.mode {
        None => b'S',
        Some(m @ (b'E' | b'A' | b'P' | b'R' | b'S')) => m,
        Some(_) => return line_only(swallowing("CLIENT_ERROR invalid mode for ms M token")),
    };
    if !key.is_binary() && !valid_text_key(raw) {
        return line_only(swallowing(BAD_FORMAT));
    }
    if vlen > limits.item_size_max {
        return line_only(Request::TooLarge {
            key: raw,
            remove_old: true,
            noreply: false,
            swallow: vlen + 2,
        });
    }
    match data_block(after, vlen) {
        DataBlock::Incomplete => Parse::Incomplete,
        DataBlock::BadChunk => Parse::Done {
            request: Request::reply(BAD_DATA_CHUNK),
            consumed: line_end + vlen + 2,
        },
        DataBlock::Ok(data) => Parse::Done {
            request: Request::MetaSet(MetaSet {
                key,
                flags,
                mode,
                data,
            }),
            consumed: line_end + vlen + 2,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::super::{parse, Limits, Parse, Request};

    fn p(input: &[u8]) -> Parse<'_> {
        parse(
            input,
            &Limits {
                item_size_max: 100,
                max_line: 2048,
            },
        )
    }

    #[test]
    fn ms_parses() {
        let Parse::Done {
            request: Request::MetaSet(s),
            consumed,
        } = p(b"ms foo 2 T100 F5 c k O1 MA\r\nhi\r\n")
        else {
            panic!()
        };
        assert_eq!(consumed, 32);
        assert_eq!(
            (
                s.key.bytes(&mut crate::memcache::key::KeyBuf::default()),
                s.mode,
                s.data,
                s.flags.client_flags,
                s.flags.ttl
            ),
            (&b"foo"[..], b'A', &b"hi"[..], 5, Some(100))
        );
        assert_eq!(p(b"ms foo 2\r\nh"), Parse::Incomplete);
    }

    #[test]
    fn ms_errors_swallow_like_memcached() {
        let r = |i: &'static [u8]| match p(i) {
            Parse::Done {
                request:
                    Request::Reply {
                        line,
                        noreply,
                        swallow,
                    },
                consumed,
            } => (line, noreply, swallow, consumed),
            other => panic!("{other:?}"),
        };
        assert_eq!(
            r(b"ms foo\r\n"),
            ("CLIENT_ERROR bad command line format", false, 0, 8)
        );
        assert_eq!(
            r(b"ms foo abc\r\nhi\r\n"),
            ("CLIENT_ERROR bad command line format", false, 0, 12)
        );
        assert_eq!(
            r(b"ms foo 2 Z\r\nhi\r\n"),
            ("CLIENT_ERROR invalid flag", false, 4, 12)
        );
        assert_eq!(
            r(b"ms foo 2 MX\r\n"),
            ("CLIENT_ERROR invalid mode for ms M token", false, 4, 13)
        );
        assert_eq!(
            r(b"ms foo 2 MEE\r\n").0,
            "CLIENT_ERROR incorrect length for M token"
        );
        assert_eq!(
            r(b"ms foo 2 b\r\n"),
            ("CLIENT_ERROR error decoding key", false, 4, 12)
        );
        assert_eq!(
            r(b"ms a 1 F-1\r\n"),
            ("CLIENT_ERROR bad command line format", false, 3, 12)
        );
        assert_eq!(
            r(b"ms foo 2 q\r\nhiX\r\n"),
            ("CLIENT_ERROR bad data chunk", false, 0, 16)
        );
        assert!(matches!(
            p(b"ms foo 101 q\r\n"),
            Parse::Done {
                request: Request::TooLarge {
                    remove_old: true,
                    noreply: false,
                    swallow: 103,
                    ..
                },
                consumed: 14
            }
        ));
    }
}
