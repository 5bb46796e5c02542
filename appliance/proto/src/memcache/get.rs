//! `get`, `gets`, `gat`, `gats`: retrieval of one or many keys.

use super::key::{key_byte, valid_text_key};
use super::swar;
use super::tokens::{strtol32, Tokens};
use super::{Request, BAD_FORMAT, ERROR, KEY_LEN_MAX};

/// A retrieval request. Keys are checked at parse time: memcached answers only the error
/// when any key is too long, dropping the values it already gathered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GetRequest<'a> {
    /// `gets`/`gats`: include the CAS unique in each `VALUE` line.
    pub cas: bool,
    /// `gat`/`gats`: memcached exptime to set on every hit.
    pub touch: Option<i32>,
    /// The keys, in request order.
    pub keys: GetKeys<'a>,
}

/// The keys of a retrieval line, split lazily (a multi-get may hold thousands).
#[derive(Debug, Clone, Copy)]
pub struct GetKeys<'a> {
    rest: &'a [u8],
    /// `rest` is one key, no space in it (the plain parse knew): given whole, not searched.
    single: bool,
}

impl<'a> GetKeys<'a> {
    /// Keys from the space-separated text `rest`.
    pub fn new(rest: &'a [u8]) -> GetKeys<'a> {
        GetKeys {
            rest,
            single: false,
        }
    }

    /// The one key `key` (non-empty, no space).
    fn single(key: &'a [u8]) -> GetKeys<'a> {
        debug_assert!(!key.is_empty() && !key.contains(&b' '));
        GetKeys {
            rest: key,
            single: true,
        }
    }
}

/// The same keys, however the text around them was cut (and whether it was known to be one).
impl PartialEq for GetKeys<'_> {
    fn eq(&self, other: &Self) -> bool {
        Iterator::eq(*self, *other)
    }
}

impl Eq for GetKeys<'_> {}

impl<'a> Iterator for GetKeys<'a> {
    type Item = &'a [u8];
    fn next(&mut self) -> Option<&'a [u8]> {
        if self.single {
            self.single = false;
            return Some(std::mem::take(&mut self.rest));
        }
        let start = self.rest.iter().position(|&b| b != b' ')?;
        let rest = &self.rest[start..];
        // Keys are short: a word-at-a-time search, not a call into `memchr` (swar.rs).
        let end = swar::find(rest, b' ').unwrap_or(rest.len());
        self.rest = &rest[end..];
        Some(&rest[..end])
    }
}

/// Offset of `tok` (a sub-slice of `line`) just past its end.
fn end_of(line: &[u8], tok: &[u8]) -> usize {
    (tok.as_ptr() as usize - line.as_ptr() as usize) + tok.len()
}

/// A plain `get <keys>` or `gets <keys>` request at the start of `input`, its line read in
/// one pass over its bytes up to the `\n` (or `\r\n`) that ends it: the request and the
/// offset of that `\n`. `None` for anything else (a leading space, no key, a bad key, a
/// control byte, a line not whole yet, another command), which [`super::parse`] then answers
/// as memcached would. The cache's hot path: the token array and the key check over
/// [`GetKeys`] cost a GET of one key about 270 instructions more, the search for the `\n`
/// before the pass about 50 more (callgrind). Gives the same keys as [`parse`]
/// (property-tested).
#[inline]
pub(crate) fn parse_plain(input: &[u8]) -> Option<(GetRequest<'_>, usize)> {
    let (cas, start) = if input.starts_with(b"get ") {
        (false, 4)
    } else if input.starts_with(b"gets ") {
        (true, 5)
    } else {
        return None;
    };
    let rest = &input[start..];
    // The first key's end, a word at a time: a get of one key ends there. Past a space, the
    // byte loop reads the other keys; a leading space or no key, that loop decides too.
    let stop = swar::key_stop(rest)?;
    let (end, keys) = match rest[stop] {
        _ if stop > KEY_LEN_MAX => return None,
        b' ' => key_run(rest, stop, usize::from(stop > 0))?,
        _ => (stop, usize::from(stop > 0)),
    };
    let nl = match rest[end] {
        b'\n' => end,
        b'\r' if rest.get(end + 1) == Some(&b'\n') => end + 1,
        _ => return None,
    };
    // The get alone, not a whole `Request`: moving that into the parser's answer cost a
    // memcpy call (~30 instructions a GET).
    (keys > 0).then(|| {
        let keys = if end == stop {
            GetKeys::single(&rest[..end])
        } else {
            GetKeys::new(&rest[..end])
        };
        let request = GetRequest {
            cas,
            touch: None,
            keys,
        };
        (request, start + nl)
    })
}

/// The keys of `rest` from `from` (a space, or the start): the first byte that is neither a
/// space nor a key's (the line's end, or a refusal) and the keys counted, `keys` before
/// `from` included. `None` when the line is not whole.
fn key_run(rest: &[u8], from: usize, mut keys: usize) -> Option<(usize, usize)> {
    let mut run = 0usize;
    let end = rest[from..].iter().position(|&b| {
        if b == b' ' {
            run = 0;
            return false;
        }
        if !key_byte(b) || run == KEY_LEN_MAX {
            return true;
        }
        keys += usize::from(run == 0);
        run += 1;
        false
    })?;
    Some((from + end, keys))
}

pub(crate) fn parse<'a>(toks: &Tokens<'a>, line: &'a [u8], cas: bool, touch: bool) -> Request<'a> {
    if toks.ntokens() < 3 {
        return Request::reply(ERROR);
    }
    let (touch, after) = if touch {
        let Some(exptime) = strtol32(toks.at(1)) else {
            return Request::reply("CLIENT_ERROR invalid exptime argument");
        };
        (Some(exptime), end_of(line, toks.at(1)))
    } else {
        (None, end_of(line, toks.at(0)))
    };
    let keys = GetKeys::new(&line[after..]);
    if keys.clone().any(|k| !valid_text_key(k)) {
        return Request::reply(BAD_FORMAT);
    }
    Request::Get(GetRequest { cas, touch, keys })
}

#[cfg(test)]
mod tests {
    use super::super::{parse, Limits, Parse, Request};

    fn get(input: &[u8]) -> (Vec<Vec<u8>>, bool, Option<i32>, usize) {
        match parse(input, &Limits::default()) {
            Parse::Done {
                request: Request::Get(g),
                consumed,
            } => (
                g.keys.map(|k| k.to_vec()).collect(),
                g.cas,
                g.touch,
                consumed,
            ),
            other => panic!("not a get: {other:?}"),
        }
    }

    #[test]
    fn get_variants() {
        assert_eq!(
            get(b"get a b\r\n"),
            (vec![b"a".to_vec(), b"b".to_vec()], false, None, 9)
        );
        assert_eq!(get(b"gets  a \n"), (vec![b"a".to_vec()], true, None, 9));
        assert_eq!(
            get(b"gat 10 a\r\n"),
            (vec![b"a".to_vec()], false, Some(10), 10)
        );
        assert_eq!(get(b"gats -1 a b\r\n").2, Some(-1));
        assert_eq!(get(b"gat 0\r\n").0.len(), 0);
        assert_eq!(get(b"get a\0b c\r\n").0, vec![b"a".to_vec()]);
        let many: Vec<u8> = [b"get".as_slice(), &b" k".repeat(100), b"\r\n"].concat();
        assert_eq!(get(&many).0.len(), 100);
    }

    #[test]
    fn get_errors() {
        let reply = |i: &[u8]| match parse(i, &Limits::default()) {
            Parse::Done {
                request: Request::Reply { line, .. },
                ..
            } => line,
            other => panic!("{other:?}"),
        };
        assert_eq!(reply(b"get\r\n"), "ERROR");
        assert_eq!(reply(b"gets\r\n"), "ERROR");
        assert_eq!(
            reply(b"gat abc a\r\n"),
            "CLIENT_ERROR invalid exptime argument"
        );
        let long = [b"get a ".as_slice(), &[b'k'; 251], b"\r\n"].concat();
        assert_eq!(reply(&long), "CLIENT_ERROR bad command line format");
        assert_eq!(reply(b"GET a\r\n"), "ERROR");
        assert_eq!(reply(b"getx a\r\n"), "ERROR");
        assert_eq!(reply(b"get \r\n"), "ERROR");
        assert_eq!(reply(b"gets   \r\n"), "ERROR");
        let bad = [b"get a k\x01y b".as_slice(), b"\r\n"].concat();
        assert_eq!(reply(&bad), "CLIENT_ERROR bad command line format");
    }

    /// The keys of a get line as the general path (the token array) reads them.
    fn general(line: &[u8]) -> Option<(bool, Vec<Vec<u8>>)> {
        let toks = super::Tokens::new(line);
        let cas = match toks.get(0)? {
            b"get" => false,
            b"gets" => true,
            _ => return None,
        };
        match super::parse(&toks, line, cas, false) {
            Request::Get(g) => Some((g.cas, g.keys.map(<[u8]>::to_vec).collect())),
            _ => None,
        }
    }

    /// The keys of a get line as the plain path reads it, ended by `\r\n`.
    fn plain(line: &[u8]) -> Option<(bool, Vec<Vec<u8>>)> {
        let input = [line, b"\r\n"].concat();
        match super::parse_plain(&input)? {
            (g, nl) if nl == line.len() + 1 => Some((g.cas, g.keys.map(<[u8]>::to_vec).collect())),
            _ => None,
        }
    }

    proptest::proptest! {
        /// Where the plain path answers, it answers as the general one; and it answers
        /// every line of valid keys after `get ` or `gets `.
        #[test]
        fn the_plain_path_agrees_with_the_general_one(
            cmd in proptest::sample::select(vec!["get ", "gets ", " get ", "get", "gat 1 ", "getx "]),
            words in proptest::collection::vec(
                proptest::collection::vec(proptest::sample::select(
                    vec![b'a', b'z', b' ', b':', 0x80, b'-'],
                ), 0..8),
                0..30,
            ),
            poison in proptest::option::of((
                proptest::prelude::any::<usize>(),
                proptest::sample::select(vec![b'\t', 0x7f, 0x1f, 0x00, b'\r']),
            )),
            long in proptest::option::of(249usize..=252),
        ) {
            let mut line = cmd.as_bytes().to_vec();
            for w in &words {
                line.extend_from_slice(w);
                line.push(b' ');
            }
            if let Some(n) = long {
                line.extend(std::iter::repeat_n(b'k', n));
            }
            if let Some((at, byte)) = poison {
                let at = at % (line.len() + 1);
                line.insert(at, byte);
            }
            let fast = plain(&line);
            if fast.is_some() {
                proptest::prop_assert_eq!(&fast, &general(&line));
            }
            let all_valid = general(&line).is_some_and(|(_, keys)| !keys.is_empty());
            if cmd.starts_with("get") && cmd.ends_with(' ') && !cmd.starts_with(' ') {
                proptest::prop_assert_eq!(fast.is_some(), all_valid, "{:?}", line);
            }
        }
    }
}
