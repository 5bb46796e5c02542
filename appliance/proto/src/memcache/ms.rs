//! `ms <key> <datalen> <flags>*` and its data block: meta set.

use super::key::{valid_text_key, MetaKey};
use super::meta::{opaque_too_long, parse_ms_flags, MetaSet, OPAQUE_TOO_LONG, OPT_TOKENS_MAX};
use super::tokens::Tokens;
use super::{
    value_len, with_value, Limits, Parse, Request, ValueHead, BAD_FORMAT, ERROR, KEY_LEN_MAX,
};

pub(crate) fn parse<'a>(
    toks: &Tokens<'a>,
    line: &'a [u8],
    line_end: usize,
    after: &'a [u8],
    limits: &Limits,
) -> Parse<'a> {
    match head(toks, line) {
        Ok((m, vlen)) => {
            let head = ValueHead {
                key: toks.at(1),
                vlen,
                remove_old: true,
                noreply: false,
            };
            with_value(head, line_end, after, limits, |data| {
                Request::MetaSet(MetaSet { data, ..m })
            })
        }
        Err(Refused { line, swallow }) => Parse::Done {
            request: Request::Reply {
                line,
                noreply: false,
                swallow,
            },
            consumed: line_end,
        },
    }
}

/// memcached's answer to an `ms` line it refuses, and the bytes after the line it swallows.
struct Refused {
    line: &'static str,
    swallow: usize,
}

/// The `ms` line `toks` (of `line`) without its data, and its data length; or how memcached
/// refuses the line.
fn head<'a>(toks: &Tokens<'a>, line: &'a [u8]) -> Result<(MetaSet<'a>, usize), Refused> {
    let refuse = |line| Refused { line, swallow: 0 };
    if toks.ntokens() < 3 {
        return Err(refuse(ERROR));
    }
    let raw = toks.at(1);
    if raw.len() > KEY_LEN_MAX || toks.ntokens() == 3 {
        return Err(refuse(BAD_FORMAT));
    }
    if toks.ntokens() > OPT_TOKENS_MAX {
        return Err(refuse("CLIENT_ERROR options flags too long"));
    }
    let Some(vlen) = value_len(toks.at(2)) else {
        return Err(refuse(BAD_FORMAT));
    };
    // From here on memcached knows the data length and swallows the block after an error.
    let swallowing = |line| Refused {
        line,
        swallow: vlen + 2,
    };
    let mut key = MetaKey::text(raw);
    let flags = parse_ms_flags(toks, line, &mut key).map_err(swallowing)?;
    if opaque_too_long(&flags) {
        return Err(swallowing(OPAQUE_TOO_LONG));
    }
    let mode = match flags.mode {
        None => b'S',
        Some(m @ (b'E' | b'A' | b'P' | b'R' | b'S')) => m,
        Some(_) => return Err(swallowing("CLIENT_ERROR invalid mode for ms M token")),
    };
    if !key.is_binary() && !valid_text_key(raw) {
        // As memcached answers a key it finds invalid (too long): the data block is not
        // swallowed, so it is read as the next command.
        return Err(refuse(BAD_FORMAT));
    }
    let m = MetaSet {
        key,
        flags,
        mode,
        data: &[],
    };
    Ok((m, vlen))
}

/// The `ms` request whose command line is `line` (with its `\r\n`, as
/// [`super::Parse::AwaitingValue`]'s `line_len` bytes frame it), with no data, and its data
/// length: what a caller that receives the data block elsewhere (into the item) needs, as
/// [`super::store_head`] for the text storage commands. `None` for any other line or one
/// that is refused.
pub fn meta_set_head(line: &[u8]) -> Option<(MetaSet<'_>, usize)> {
    let line = super::command_of(line)?;
    let toks = Tokens::new(line);
    if toks.get(0)? != b"ms" {
        return None;
    }
    head(&toks, line).ok()
}

#[cfg(test)]
mod tests {
    use super::super::testing::{parse_small as p, reply_small as r};
    use super::super::{Parse, Request};

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
        assert!(matches!(
            p(b"ms foo 2\r\nh"),
            Parse::AwaitingValue {
                request_len: 14,
                line_len: 10,
                ..
            }
        ));
    }

    #[test]
    fn the_head_of_an_ms_line_is_read_without_its_data() {
        let (m, vlen) = super::meta_set_head(b"ms Zm9v 5000 b T9 F3 MR C7 q\r\n").expect("ms");
        let key = m
            .key
            .bytes(&mut crate::memcache::key::KeyBuf::default())
            .to_vec();
        assert_eq!((&key[..], vlen, m.mode), (&b"foo"[..], 5000, b'R'));
        assert_eq!((m.flags.ttl, m.flags.client_flags), (Some(9), 3));
        assert_eq!(
            (m.flags.cas, m.flags.quiet, m.data),
            (Some(7), true, &b""[..])
        );
        assert!(super::meta_set_head(b"ms foo 5000 MX\r\n").is_none());
        assert!(super::meta_set_head(b"set foo 0 0 5000\r\n").is_none());
        assert!(super::meta_set_head(b"ms foo\r\n").is_none());
    }

    #[test]
    fn ms_errors_swallow_like_memcached() {
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
        // A control byte in the key: refused as memcached refuses a too-long key, the data
        // block left to be read as a command.
        assert_eq!(
            r(b"ms a\x01b 1\r\nx\r\n"),
            ("CLIENT_ERROR bad command line format", false, 0, 10)
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
