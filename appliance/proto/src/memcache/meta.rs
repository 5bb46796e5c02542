//! Meta-command flags shared by `mg`, `ms`, `md`, `ma`, and the `me` debug command.
//!
//! Flags are single letters, some with a token (`T30`, `Oopaque`). Parsing follows
//! memcached's `_meta_flag_preparse`: a repeated letter or an unknown one stops with an
//! error at once; bad numbers are remembered and reported after every flag was seen.
//! Reply flags are echoed in request order, so the raw flag tokens are kept.
//!
//! The letters are 1.6.18's, the version ringstore reports: `E` (explicit CAS, added in
//! 1.6.21) is an invalid flag there, so it is one here too. Every command takes every letter
//! 1.6.18 knows (its preparse is shared); the command then ignores the ones it has no use for.

#[cfg(test)]
use super::key::KeyBuf;
use super::key::{valid_text_key, MetaKey};
use super::tokens::{strtol32, strtoul32, strtoull, Tokens};
use super::{Request, BAD_FORMAT, KEY_LEN_MAX};

/// memcached's `MFLAG_MAX_OPT_LENGTH`: a meta line has at most 19 tokens plus the terminal.
pub const OPT_TOKENS_MAX: usize = 20;
/// memcached's `MFLAG_MAX_OPAQUE_LENGTH` (the `O` included).
pub const OPAQUE_LENGTH_MAX: usize = 32;
/// Reply to an `O` token over [`OPAQUE_LENGTH_MAX`].
pub const OPAQUE_TOO_LONG: &str = "CLIENT_ERROR opaque token too long";

/// One flag token as written (first byte is the flag letter).
pub type MetaFlag<'a> = &'a [u8];

/// The parsed flags of one meta command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetaFlags<'a> {
    /// The flag tokens' part of the line (at most 17 tokens: the line was checked).
    text: &'a [u8],
    /// `v`: return the value.
    pub value: bool,
    /// `q`: quiet mode (suppress the nominal reply of this command).
    pub quiet: bool,
    /// `u`: don't bump the item in the LRU.
    pub no_update: bool,
    /// `I`: invalidate (mark stale) instead of removing / store as stale.
    pub invalidate: bool,
    /// `T`: new TTL (memcached exptime).
    pub ttl: Option<i32>,
    /// `N`: autovivify on miss with this TTL.
    pub vivify: Option<i32>,
    /// `R`: win a recache token when the TTL is below this.
    pub recache: Option<i32>,
    /// `F`: client flags to store.
    pub client_flags: u32,
    /// `C`: compare this CAS unique.
    pub cas: Option<u64>,
    /// `M`: mode letter (ms: E A P R S; ma: I + D -).
    pub mode: Option<u8>,
    /// `J`: initial value for `ma` autovivify.
    pub initial: u64,
    /// `D`: delta for `ma` (default 1).
    pub delta: u64,
}

/// memcached's reply to a flag whose argument does not parse.
const BAD_TOKEN: &str = "CLIENT_ERROR bad token in command line format";

/// What one flag token did to the flags being parsed.
enum Flag {
    Taken,
    /// Refused, with memcached's message when it has its own (else the line's format error).
    Bad(Option<&'static str>),
}

impl<'a> MetaFlags<'a> {
    /// The flag tokens in request order.
    pub fn tokens(&self) -> impl Iterator<Item = MetaFlag<'a>> + 'a {
        self.text.split(|&b| b == b' ').filter(|t| !t.is_empty())
    }

    /// Whether a flag letter was given.
    pub fn has(&self, letter: u8) -> bool {
        self.tokens().any(|t| t[0] == letter)
    }

    /// memcached's preparse: the flags from token `start`; also decodes the key (`b`).
    fn parse(
        toks: &Tokens<'a>,
        line: &'a [u8],
        start: usize,
        key: &mut MetaKey<'a>,
    ) -> Result<MetaFlags<'a>, &'static str> {
        let text = match toks.get(start) {
            Some(first) => &line[first.as_ptr() as usize - line.as_ptr() as usize..],
            None => &[],
        };
        let mut f = MetaFlags {
            text,
            value: false,
            quiet: false,
            no_update: false,
            invalidate: false,
            ttl: None,
            vivify: None,
            recache: None,
            client_flags: 0,
            cas: None,
            mode: None,
            initial: 0,
            delta: 1,
        };
        let mut seen = [false; 128];
        let mut err: Option<&'static str> = None;
        let mut has_error = false;
        for &tok in toks.from(start) {
            let o = tok[0];
            if o >= 127 || seen[usize::from(o)] {
                return Err("CLIENT_ERROR duplicate flag");
            }
            seen[usize::from(o)] = true;
            if let Flag::Bad(e) = f.take_flag(tok, key)? {
                // memcached keeps parsing; the last error that has a message is the reply.
                if e.is_some() {
                    err = e;
                }
                has_error = true;
            }
        }
        if has_error {
            return Err(err.unwrap_or(BAD_FORMAT));
        }
        Ok(f)
    }

    /// Applies one flag token (`tok[0]` the letter) to the flags; `Bad` for a token memcached
    /// refuses after reading the whole line, `Err` for one it refuses at once.
    fn take_flag(&mut self, tok: &[u8], key: &mut MetaKey<'a>) -> Result<Flag, &'static str> {
        let o = tok[0];
        let arg = &tok[1..];
        match o {
            b'b' => match MetaKey::base64(key.raw()) {
                Some(k) => *key = k,
                None => return Ok(Flag::Bad(Some("CLIENT_ERROR error decoding key"))),
            },
            b'N' | b'T' | b'R' => match strtol32(arg) {
                Some(v) => match o {
                    b'N' => self.vivify = Some(v),
                    b'T' => self.ttl = Some(v),
                    _ => self.recache = Some(v),
                },
                None => return Ok(Flag::Bad(Some(BAD_TOKEN))),
            },
            b'l' | b'O' | b'P' | b'L' | b'k' | b's' | b't' | b'c' | b'f' | b'h' => {}
            b'v' => self.value = true,
            b'u' => self.no_update = true,
            b'q' => self.quiet = true,
            b'I' => self.invalidate = true,
            b'F' => match strtoul32(arg) {
                Some(v) => self.client_flags = v,
                None => return Ok(Flag::Bad(None)),
            },
            b'C' => match strtoull(arg) {
                Some(v) => self.cas = Some(v),
                None => return Ok(Flag::Bad(Some(BAD_TOKEN))),
            },
            b'M' => {
                if tok.len() != 2 {
                    return Ok(Flag::Bad(Some("CLIENT_ERROR incorrect length for M token")));
                }
                self.mode = Some(tok[1]);
            }
            b'J' => match strtoull(arg) {
                Some(v) => self.initial = v,
                None => {
                    return Ok(Flag::Bad(Some(
                        "CLIENT_ERROR invalid numeric initial value",
                    )))
                }
            },
            b'D' => match strtoull(arg) {
                Some(v) => self.delta = v,
                None => return Ok(Flag::Bad(Some("CLIENT_ERROR invalid numeric delta value"))),
            },
            _ => return Err("CLIENT_ERROR invalid flag"),
        }
        Ok(Flag::Taken)
    }

    fn opaque_too_long(&self) -> bool {
        self.tokens()
            .any(|t| t[0] == b'O' && t.len() > OPAQUE_LENGTH_MAX)
    }
}

/// Parses `<cmd> <key> <flags>*` (mg, md, ma). `too_many` and `flag_error` are the
/// command-specific messages memcached uses; `None` for `flag_error` keeps preparse's own.
pub(crate) fn parse_head<'a>(
    toks: &Tokens<'a>,
    line: &'a [u8],
    too_many: &'static str,
    flag_error: Option<&'static str>,
) -> Result<MetaKeyed<'a>, &'static str> {
    if toks.ntokens() < 3 {
        return Err(super::ERROR);
    }
    let raw = toks.at(1);
    if raw.len() > KEY_LEN_MAX {
        return Err(BAD_FORMAT);
    }
    if toks.ntokens() > OPT_TOKENS_MAX {
        return Err(too_many);
    }
    let mut key = MetaKey::text(raw);
    let flags = MetaFlags::parse(toks, line, 2, &mut key).map_err(|e| flag_error.unwrap_or(e))?;
    if !key.is_binary() && !valid_text_key(raw) {
        return Err(BAD_FORMAT);
    }
    if flags.opaque_too_long() {
        return Err(OPAQUE_TOO_LONG);
    }
    Ok(MetaKeyed { key, flags })
}

/// A meta command that is a key and its flags: the common head of mg/md/ma, and all of
/// [`MetaGet`] and [`MetaDelete`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetaKeyed<'a> {
    pub key: MetaKey<'a>,
    pub flags: MetaFlags<'a>,
}

/// `mg <key> <flags>*`.
pub type MetaGet<'a> = MetaKeyed<'a>;

/// `ms <key> <datalen> <flags>*` and its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetaSet<'a> {
    pub key: MetaKey<'a>,
    pub flags: MetaFlags<'a>,
    /// Storage mode from the `M` flag: b'S' (default), b'E' add, b'A' append,
    /// b'P' prepend, b'R' replace.
    pub mode: u8,
    pub data: &'a [u8],
}

/// `md <key> <flags>*`.
pub type MetaDelete<'a> = MetaKeyed<'a>;

/// `ma <key> <flags>*`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetaArith<'a> {
    pub key: MetaKey<'a>,
    pub flags: MetaFlags<'a>,
    /// Mode `I`/`+` (default) or `D`/`-`.
    pub incr: bool,
}

pub(crate) fn parse_ms_flags<'a>(
    toks: &Tokens<'a>,
    line: &'a [u8],
    key: &mut MetaKey<'a>,
) -> Result<MetaFlags<'a>, &'static str> {
    MetaFlags::parse(toks, line, 3, key)
}

pub(crate) fn opaque_too_long(flags: &MetaFlags<'_>) -> bool {
    flags.opaque_too_long()
}

/// `me <key> [b]`.
pub(crate) fn parse_me<'a>(toks: &Tokens<'a>) -> Request<'a> {
    let raw = toks.at(1);
    if toks.ntokens() < 3 || raw.len() > KEY_LEN_MAX {
        return Request::reply(BAD_FORMAT);
    }
    if toks.ntokens() >= 4 && toks.at(2) == b"b" {
        return match MetaKey::base64(raw) {
            Some(key) => Request::MetaDebug { key },
            None => Request::reply(BAD_FORMAT),
        };
    }
    if !valid_text_key(raw) {
        return Request::reply(BAD_FORMAT);
    }
    Request::MetaDebug {
        key: MetaKey::text(raw),
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::req;
    use super::*;

    fn err(i: &[u8]) -> &'static str {
        match req(i) {
            Request::Reply {
                line,
                noreply: false,
                swallow: 0,
            } => line,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn mg_flags() {
        let Request::MetaGet(g) = req(b"mg foo s v f t c k O123 h l T30 N5 R10 q u\r\n") else {
            panic!()
        };
        assert_eq!(g.key.bytes(&mut KeyBuf::default()), b"foo");
        assert!(g.flags.value && g.flags.quiet && g.flags.no_update);
        assert_eq!(
            (g.flags.ttl, g.flags.vivify, g.flags.recache),
            (Some(30), Some(5), Some(10))
        );
        assert_eq!(g.flags.tokens().count(), 14);
        assert_eq!(g.flags.tokens().nth(6), Some(&b"O123"[..]));
        let Request::MetaGet(g) = req(b"mg Zm9v b k v\r\n") else {
            panic!()
        };
        assert_eq!(g.key.bytes(&mut KeyBuf::default()), b"foo");
        assert!(g.key.is_binary());
    }

    #[test]
    fn mg_errors_match_memcached() {
        assert_eq!(err(b"mg\r\n"), "ERROR");
        assert_eq!(err(b"mx foo\r\n"), "ERROR");
        assert_eq!(err(b"mg foo v v\r\n"), "CLIENT_ERROR duplicate flag");
        assert_eq!(err(b"mg foo O1 O2\r\n"), "CLIENT_ERROR duplicate flag");
        assert_eq!(err(b"mg foo zz\r\n"), "CLIENT_ERROR invalid flag");
        assert_eq!(
            err(b"mg foo Tabc\r\n"),
            "CLIENT_ERROR bad token in command line format"
        );
        assert_eq!(
            err(b"mg foo Nabc\r\n"),
            "CLIENT_ERROR bad token in command line format"
        );
        assert_eq!(err(b"mg a b\r\n"), "CLIENT_ERROR error decoding key");
        let long_opaque = [b"mg foo O".as_slice(), &[b'x'; 40], b"\r\n"].concat();
        assert_eq!(err(&long_opaque), OPAQUE_TOO_LONG);
        let long_key = [b"mg ".as_slice(), &[b'k'; 251], b" v\r\n"].concat();
        assert_eq!(err(&long_key), BAD_FORMAT);
        assert_eq!(
            err(b"mg k a b c d e f g h i j k l m n o p q r s\r\n"),
            "CLIENT_ERROR options flags are too long"
        );
        assert_eq!(
            err(b"md k a b c d e f g h i j k l m n o p q r s\r\n"),
            "CLIENT_ERROR options flags too long"
        );
    }

    #[test]
    fn unknown_flags_win_over_a_key_that_does_not_decode() {
        // Issue 35's lines: memcached 1.6.18 answers both `invalid flag` (`E` is 1.6.21's), the
        // first although its `b` key (`k`) does not decode, an error noted before `E` is read.
        assert_eq!(
            err(b"mg k b c f h k l O123 q s t v u E5 N30 R30 T30\r\n"),
            "CLIENT_ERROR invalid flag"
        );
        assert_eq!(
            err(b"mg k s v f t c k O1 h l q u T1 N1 R1 E1 F1 P1\r\n"),
            "CLIENT_ERROR invalid flag"
        );
        assert_eq!(err(b"mg k b Z\r\n"), "CLIENT_ERROR invalid flag");
        assert_eq!(err(b"mg k b v v\r\n"), "CLIENT_ERROR duplicate flag");
        assert_eq!(err(b"mg k b v\r\n"), "CLIENT_ERROR error decoding key");
        assert_eq!(
            err(b"md k b E1\r\n"),
            "CLIENT_ERROR invalid or duplicate flag"
        );
        assert_eq!(
            err(b"ma k E1\r\n"),
            "CLIENT_ERROR invalid or duplicate flag"
        );
        // Every letter 1.6.18 knows is taken by every command (its preparse is shared).
        for flag in [
            "C1", "D1", "F1", "I", "J1", "L", "M+", "N1", "O1", "P", "R1", "T1",
        ] {
            let line = format!("mg k {flag} b c f h k l q s t u v\r\n");
            assert_eq!(
                err(line.as_bytes()),
                "CLIENT_ERROR error decoding key",
                "{flag}"
            );
        }
    }

    #[test]
    fn md_ma_errors() {
        assert_eq!(
            err(b"md foo zz\r\n"),
            "CLIENT_ERROR invalid or duplicate flag"
        );
        assert_eq!(
            err(b"ma a Jabc\r\n"),
            "CLIENT_ERROR invalid or duplicate flag"
        );
        assert_eq!(
            err(b"ma cnt MX\r\n"),
            "CLIENT_ERROR invalid mode for ma M token"
        );
        let Request::MetaArith(a) = req(b"ma cnt MD D3 v\r\n") else {
            panic!()
        };
        assert!(!a.incr);
        assert_eq!(a.flags.delta, 3);
        let Request::MetaArith(a) = req(b"ma cnt\r\n") else {
            panic!()
        };
        assert!(a.incr);
        assert_eq!(a.flags.delta, 1);
    }

    #[test]
    fn me_forms() {
        assert_eq!(err(b"me\r\n"), BAD_FORMAT);
        assert_eq!(err(b"me a b\r\n"), BAD_FORMAT);
        assert!(matches!(req(b"me foo\r\n"), Request::MetaDebug { .. }));
        assert_eq!(req(b"mn foo bar\r\n"), Request::MetaNoop);
    }
}
