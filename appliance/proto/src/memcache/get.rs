//! `get`, `gets`, `gat`, `gats`: retrieval of one or many keys.

use super::key::valid_text_key;
use super::tokens::{strtol32, Tokens};
use super::{Request, BAD_FORMAT, ERROR};

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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GetKeys<'a> {
    rest: &'a [u8],
}

impl<'a> GetKeys<'a> {
    /// Keys from the space-separated text `rest`.
    pub fn new(rest: &'a [u8]) -> GetKeys<'a> {
        GetKeys { rest }
    }
}

impl<'a> Iterator for GetKeys<'a> {
    type Item = &'a [u8];
    fn next(&mut self) -> Option<&'a [u8]> {
        let start = self.rest.iter().position(|&b| b != b' ')?;
        let rest = &self.rest[start..];
        let end = memchr::memchr(b' ', rest).unwrap_or(rest.len());
        self.rest = &rest[end..];
        Some(&rest[..end])
    }
}

/// Offset of `tok` (a sub-slice of `line`) just past its end.
fn end_of(line: &[u8], tok: &[u8]) -> usize {
    (tok.as_ptr() as usize - line.as_ptr() as usize) + tok.len()
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
    }
}
