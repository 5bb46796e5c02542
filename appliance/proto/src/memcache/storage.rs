//! `set`, `add`, `replace`, `append`, `prepend`, `cas`: a command line and a data block.

use super::key::valid_text_key;
use super::swar;
use super::tokens::{strtol32, strtoul32, strtoull, Tokens};
use super::{
    value_len, with_value, Limits, Parse, Request, ValueHead, BAD_FORMAT, ERROR, KEY_LEN_MAX,
};

/// Which storage command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreKind {
    Set,
    Add,
    Replace,
    Append,
    Prepend,
    Cas,
}

/// A storage command with its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreRequest<'a> {
    pub kind: StoreKind,
    pub key: &'a [u8],
    pub flags: u32,
    /// memcached exptime as sent (relative, absolute unix time, or negative).
    pub exptime: i32,
    pub data: &'a [u8],
    /// The `cas` command's unique; 0 otherwise.
    pub cas_unique: u64,
    pub noreply: bool,
}

pub(crate) fn parse<'a>(
    toks: &Tokens<'a>,
    kind: StoreKind,
    line_end: usize,
    after: &'a [u8],
    limits: &Limits,
) -> Parse<'a> {
    let (head, vlen) = match head(toks, kind) {
        Ok(head) => head,
        Err((line, noreply)) => {
            return Parse::Done {
                request: Request::error(line, noreply),
                consumed: line_end,
            }
        }
    };
    let value = ValueHead {
        key: head.key,
        vlen,
        remove_old: kind == StoreKind::Set,
        noreply: head.noreply,
    };
    with_value(value, line_end, after, limits, |data| {
        Request::Store(StoreRequest { data, ..head })
    })
}

/// A plain `set <key> <flags> <exptime> <bytes>[ noreply]` request at the start of `input`,
/// its line read in one pass up to the `\n` (or `\r\n`) that ends it, single spaces,
/// numbers of plain digits (an exptime may start with `-`) no longer than memcached reads
/// them the same way here; then its data block as [`parse`] takes it. `None` for any other
/// line (more spaces, `+5`, a 10-digit length, a bad key, a control byte, a line not whole
/// yet, a line over `max_line`), which [`super::parse`] then answers through the token
/// array. The cache's hot path: the token array and the number parsers cost a SET about
/// 700 instructions more (callgrind). Answers as [`parse`] does (property-tested).
#[inline]
pub(crate) fn parse_plain<'a>(input: &'a [u8], limits: &Limits) -> Option<Parse<'a>> {
    const START: usize = b"set ".len();
    let rest = input.strip_prefix(b"set ")?;
    // The first space or byte no key may hold, a word at a time (swar.rs).
    let key_len = swar::key_stop(rest)?;
    if key_len == 0 || key_len > KEY_LEN_MAX || rest[key_len] != b' ' {
        return None;
    }
    let mut at = key_len + 1;
    // Ten digits at most: a value below 10^10 parses here as strtoull/strtol read it.
    let flags = digits(rest, &mut at, 10)?;
    space(rest, &mut at)?;
    let negative = rest.get(at) == Some(&b'-');
    at += usize::from(negative);
    let magnitude = digits(rest, &mut at, 10)?;
    space(rest, &mut at)?;
    // Nine: below 10^9, so inside memcached's 0..=INT_MAX - 2.
    let vlen = digits(rest, &mut at, 9)?;
    let noreply = rest[at..].starts_with(b" noreply");
    at += if noreply { b" noreply".len() } else { 0 };
    let nl = match rest.get(at)? {
        b'\n' => at,
        b'\r' if rest.get(at + 1) == Some(&b'\n') => at + 1,
        _ => return None,
    };
    if START + nl > limits.max_line {
        return None;
    }
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_possible_wrap,
        reason = "below 10^10: as memcached truncates flags to uint32_t and exptime to int32_t"
    )]
    let (flags, exptime) = {
        let exptime = magnitude as i64;
        (
            flags as u32,
            (if negative { -exptime } else { exptime }) as i32,
        )
    };
    let key = &rest[..key_len];
    let line_end = START + nl + 1;
    let value = ValueHead {
        key,
        vlen: usize::try_from(vlen).ok()?,
        remove_old: true,
        noreply,
    };
    Some(with_value(
        value,
        line_end,
        &input[line_end..],
        limits,
        |data| {
            Request::Store(StoreRequest {
                kind: StoreKind::Set,
                key,
                flags,
                exptime,
                data,
                cas_unique: 0,
                noreply,
            })
        },
    ))
}

/// 1 to `max` ASCII digits at `*at` in `s`, and `*at` moved past them. One pass: a
/// count then a fold cost a SET about 100 instructions more (callgrind).
#[inline(always)]
fn digits(s: &[u8], at: &mut usize, max: usize) -> Option<u64> {
    let start = *at;
    let mut value = 0u64;
    // The whole run of digits, its length checked once after it: more than `max` of them is
    // a longer number, left to the general path (the value, wrapped then, is not used).
    while let Some(d) = s.get(*at).map(|b| b.wrapping_sub(b'0')) {
        if d > 9 {
            break;
        }
        value = value.wrapping_mul(10).wrapping_add(u64::from(d));
        *at += 1;
    }
    (1..=max).contains(&(*at - start)).then_some(value)
}

/// The one space between two words at `*at` in `s`, and `*at` moved past it.
fn space(s: &[u8], at: &mut usize) -> Option<()> {
    (s.get(*at) == Some(&b' ')).then(|| *at += 1)
}

/// The command line of a storage command: the request with no data yet, and the data
/// length; `Err`: the error line the line gets and whether `noreply` suppresses it.
fn head<'a>(
    toks: &Tokens<'a>,
    kind: StoreKind,
) -> Result<(StoreRequest<'a>, usize), (&'static str, bool)> {
    let (lo, hi) = if kind == StoreKind::Cas {
        (7, 8)
    } else {
        (6, 7)
    };
    let n = toks.ntokens();
    if n != lo && n != hi {
        return Err((ERROR, false));
    }
    let noreply = toks.noreply();
    let bad = (BAD_FORMAT, noreply);
    let key = toks.at(1);
    if !valid_text_key(key) {
        return Err(bad);
    }
    let (Some(flags), Some(exptime), Some(vlen)) = (
        strtoul32(toks.at(2)),
        strtol32(toks.at(3)),
        value_len(toks.at(4)),
    ) else {
        return Err(bad);
    };
    let cas_unique = if kind == StoreKind::Cas {
        match strtoull(toks.at(5)) {
            Some(c) => c,
            None => return Err(bad),
        }
    } else {
        0
    };
    let request = StoreRequest {
        kind,
        key,
        flags,
        exptime,
        data: &[],
        cas_unique,
        noreply,
    };
    Ok((request, vlen))
}

/// The storage command (`set`, `add`, `replace`, `append`, `prepend`, `cas`) whose command
/// line is `line` (with its `\r\n`, as [`super::Parse::AwaitingValue`]'s `line_len` bytes
/// frame it), with no data, and its data length: what a caller that receives the data
/// block elsewhere (into the item) needs. `None` for any other line or a malformed one.
pub fn store_head(line: &[u8]) -> Option<(StoreRequest<'_>, usize)> {
    let line = super::command_of(line)?;
    let toks = Tokens::new(line);
    let kind = match toks.get(0)? {
        b"set" => StoreKind::Set,
        b"add" => StoreKind::Add,
        b"replace" => StoreKind::Replace,
        b"append" => StoreKind::Append,
        b"prepend" => StoreKind::Prepend,
        b"cas" => StoreKind::Cas,
        _ => return None,
    };
    head(&toks, kind).ok()
}

#[cfg(test)]
mod tests {
    use super::super::testing::{parse_small as p, reply_small as reply};
    use super::super::BAD_DATA_CHUNK;
    use super::*;

    #[test]
    fn set_with_data() {
        let Parse::Done {
            request: Request::Store(s),
            consumed,
        } = p(b"set k 5 -1 3 noreply\r\nabc\r\nget")
        else {
            panic!()
        };
        assert_eq!(consumed, 27);
        assert_eq!(
            (s.kind, s.key, s.flags, s.exptime, s.data, s.noreply),
            (StoreKind::Set, &b"k"[..], 5, -1, &b"abc"[..], true)
        );
        let Parse::Done {
            request: Request::Store(s),
            ..
        } = p(b"cas k 0 0 1 77\r\nx\r\n")
        else {
            panic!()
        };
        assert_eq!((s.kind, s.cas_unique), (StoreKind::Cas, 77));
        let Parse::Done {
            request: Request::Store(s),
            ..
        } = p(b"set k 0 0 1 junk\r\nx\r\n")
        else {
            panic!()
        };
        assert!(!s.noreply);
    }

    #[test]
    fn store_head_reads_the_line_of_an_awaited_value() {
        let (s, vlen) = store_head(b"cas k 5 -1 4096 77 noreply\r\n").expect("head");
        assert_eq!(
            (
                s.kind,
                s.key,
                s.flags,
                s.exptime,
                s.cas_unique,
                s.noreply,
                vlen
            ),
            (StoreKind::Cas, &b"k"[..], 5, -1, 77, true, 4096)
        );
        assert!(store_head(b"get k\r\n").is_none());
        assert!(store_head(b"set k 0 0\r\n").is_none());
        // Read as `parse` reads it: a NUL ends the command (so `noreply` here is the last token).
        let (s, vlen) = store_head(b"set k 0 0 5000 noreply\0x\r\n").expect("head");
        assert!(s.noreply && vlen == 5000);
        let awaiting = super::super::parse(b"set k 0 0 5000 noreply\0x\r\nab", &Limits::default());
        let Parse::AwaitingValue { noreply: true, .. } = awaiting else {
            panic!("parse reads the same line: {awaiting:?}")
        };
    }

    #[test]
    fn set_waits_for_data() {
        let awaiting = Parse::AwaitingValue {
            request_len: 18,
            line_len: 13,
            key: b"k",
            remove_old: true,
            noreply: false,
        };
        assert_eq!(p(b"set k 0 0 3\r\nab"), awaiting);
        assert_eq!(p(b"set k 0 0 3\r\nabc\r"), awaiting);
        assert_eq!(p(b"set k 0 0 3\r\n"), awaiting);
        assert_eq!(
            p(b"set k 0 0 3"),
            Parse::Incomplete,
            "the line itself is not whole"
        );
    }

    #[test]
    fn set_errors() {
        assert_eq!(
            reply(b"set k 0 0 1\r\nxy\r\n"),
            (BAD_DATA_CHUNK, false, 0, 16)
        );
        assert!(reply(b"set k 0 0 1 noreply\r\nxy\r\n").1);
        assert_eq!(reply(b"set k 0 0\r\n"), (ERROR, false, 0, 11));
        assert_eq!(reply(b"set k 0 0 1 2 3\r\n").0, ERROR);
        assert_eq!(reply(b"cas k 0 0 1\r\n").0, ERROR);
        assert_eq!(reply(b"set k abc 0 1\r\nx\r\n"), (BAD_FORMAT, false, 0, 15));
        assert_eq!(reply(b"set k -1 0 1\r\nx\r\n").0, BAD_FORMAT);
        assert_eq!(reply(b"set k 0 0 -1\r\n").0, BAD_FORMAT);
        assert_eq!(reply(b"cas k 0 0 1 abc\r\n").0, BAD_FORMAT);
        assert_eq!(reply(b"set k\x01 0 0 1\r\n").0, BAD_FORMAT);
        let long = [b"set ".as_slice(), &[b'k'; 251], b" 0 0 1 noreply\r\n"].concat();
        assert!(matches!(
            p(&long),
            Parse::Done {
                request: Request::Reply {
                    line: BAD_FORMAT,
                    noreply: true,
                    swallow: 0
                },
                ..
            }
        ));
    }

    #[test]
    fn too_large_swallows() {
        assert_eq!(
            p(b"set k 0 0 101\r\n"),
            Parse::Done {
                request: Request::TooLarge {
                    key: b"k",
                    remove_old: true,
                    noreply: false,
                    swallow: 103
                },
                consumed: 15
            }
        );
        assert!(matches!(
            p(b"add k 0 0 101 noreply\r\n"),
            Parse::Done {
                request: Request::TooLarge {
                    remove_old: false,
                    noreply: true,
                    ..
                },
                ..
            }
        ));
    }
}
