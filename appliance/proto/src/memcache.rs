//! memcache text and meta protocol: request parsing and reply formatting.
//!
//! The parser is sans-IO and allocation-free: [`parse`] looks at the bytes buffered so far
//! and either asks for more, tells the caller to close, or returns one [`Request`] that
//! borrows keys and values from the input plus how many bytes it used. Replies are written
//! by the caller with the helpers in [`reply`]. Behaviour (token limits, number parsing,
//! error strings, which errors swallow a data block) follows memcached 1.6 `proto_text.c`.
//!
//! One file per command family, pelikan-style: [`tokens`] (line splitting, memcached's
//! number rules), [`key`] (key rules, base64), [`get`], [`storage`], [`arith`], [`delete`],
//! [`touch`], [`flush`], [`misc`] (stats, version, verbosity, quit), [`crawler`]
//! (`lru_crawler` key dumps, `shutdown`), [`meta`] (meta flag parsing shared by
//! mg/ms/md/ma), [`mg`], [`ms`], [`md`], [`ma`], and [`reply`]; [`scan`] finds a pipelined
//! batch's keys ahead of the parser (a prefetch hint); [`swar`] searches a key's few bytes
//! eight at a time. The binary protocol is [`binary`]: its own header, requests and
//! response frames.

pub mod arith;
pub mod binary;
pub mod crawler;
pub mod delete;
pub mod flush;
pub mod get;
pub mod key;
pub mod ma;
pub mod md;
pub mod meta;
pub mod mg;
pub mod misc;
pub mod ms;
pub mod reply;
pub mod scan;
pub mod storage;
mod swar;
pub mod tokens;
pub mod touch;

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod testing;

pub use crawler::KeyDump;
pub use get::{GetKeys, GetRequest};
pub use key::{KeyBuf, MetaKey};
pub use meta::{MetaArith, MetaDelete, MetaFlag, MetaFlags, MetaGet, MetaKeyed, MetaSet};
pub use ms::meta_set_head;
pub use storage::{store_head, StoreKind, StoreRequest};

/// Longest key memcached accepts (its `KEY_MAX_LENGTH`).
pub const KEY_LEN_MAX: usize = 250;

/// memcached's default line limit: a line longer than this without `\n` closes the
/// connection unless it is a `get`/`gets` (multi-gets may be long).
pub const DEFAULT_MAX_LINE: usize = 2048;

/// Bounds the parser enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest value accepted; larger ones get `SERVER_ERROR object too large for cache`
    /// and their data block is swallowed.
    pub item_size_max: usize,
    /// Longest command line (without a `\n`) before the connection is closed, except
    /// for `get`/`gets` lines, which may grow to [`Limits::max_buffered`].
    pub max_line: usize,
}

impl Limits {
    /// Hard bound on what a session ever needs to buffer for one request.
    pub fn max_buffered(&self) -> usize {
        self.item_size_max
            .saturating_add(self.max_line)
            .saturating_add(2)
    }
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            item_size_max: 1 << 20,
            max_line: DEFAULT_MAX_LINE,
        }
    }
}

/// The outcome of looking at buffered input.
#[derive(Debug, PartialEq, Eq)]
pub enum Parse<'a> {
    /// No complete request yet; keep the bytes and read more.
    Incomplete,
    /// A storage command (text or `ms`) whose line is whole but whose data block has not all
    /// arrived. The caller knows now how much it will have to buffer (`request_len` bytes in
    /// all) and may refuse before buffering it: answer `SERVER_ERROR out of memory storing
    /// object` (unless `noreply`), consume `line_len` bytes and swallow the `request_len -
    /// line_len` that follow, and for `set`/`ms` remove the old item, as memcached does when
    /// it cannot allocate the item. Otherwise it is handled like [`Parse::Incomplete`].
    AwaitingValue {
        request_len: usize,
        line_len: usize,
        key: &'a [u8],
        remove_old: bool,
        noreply: bool,
    },
    /// Input broke a bound memcached enforces by closing the connection. `reply` is sent
    /// first when there is one (memcached itself closes silently on an overlong line).
    Close { reply: Option<&'static str> },
    /// One request, and how many input bytes it used.
    Done {
        request: Request<'a>,
        consumed: usize,
    },
}

/// One parsed request. Keys and values borrow from the input.
#[derive(Debug, PartialEq, Eq)]
pub enum Request<'a> {
    /// `get`, `gets`, `gat`, `gats` (and memcached's old alias `bget`).
    Get(GetRequest<'a>),
    /// `set`, `add`, `replace`, `append`, `prepend`, `cas` with their data block.
    Store(StoreRequest<'a>),
    /// A storage command whose value is over `item_size_max`: answer
    /// `SERVER_ERROR object too large for cache`, swallow `swallow` bytes that follow, and
    /// for `set` (and `ms`) remove the old item as memcached does.
    TooLarge {
        key: &'a [u8],
        remove_old: bool,
        noreply: bool,
        swallow: usize,
    },
    /// `incr` / `decr`.
    Arith {
        incr: bool,
        key: &'a [u8],
        delta: u64,
        noreply: bool,
    },
    /// `delete <key> [0] [noreply]`.
    Delete { key: &'a [u8], noreply: bool },
    /// `touch <key> <exptime> [noreply]`.
    Touch {
        key: &'a [u8],
        exptime: i32,
        noreply: bool,
    },
    /// `flush_all [delay] [noreply]`; `delay` is memcached's exptime argument (0 = now).
    FlushAll { delay: i32, noreply: bool },
    /// `stats [subcommand ...]`.
    Stats(misc::StatsRequest),
    /// `version`.
    Version,
    /// `verbosity <level> [noreply]`.
    Verbosity { noreply: bool },
    /// `watch [kind ...]`: the connection becomes a log watcher (`misc::WatchKinds`).
    Watch(misc::WatchKinds),
    /// `quit`: close after sending what is pending.
    Quit,
    /// `refresh_certs [noreply]`: read the TLS certificates again (memcached's command).
    RefreshCerts { noreply: bool },
    /// `mg`.
    MetaGet(MetaGet<'a>),
    /// `ms` with its data block.
    MetaSet(MetaSet<'a>),
    /// `md`.
    MetaDelete(MetaDelete<'a>),
    /// `ma`.
    MetaArith(MetaArith<'a>),
    /// A key listing (`lru_crawler metadump`, `stats cachedump 1`), streamed.
    KeyDump(KeyDump),
    /// `mn`: answers `MN`.
    MetaNoop,
    /// `me <key> [b]`: debug line for a key.
    MetaDebug { key: MetaKey<'a> },
    /// A fixed reply line (an error), already decided by the parser. `noreply` means
    /// memcached would suppress it. `swallow` bytes after the request are discarded.
    Reply {
        line: &'static str,
        noreply: bool,
        swallow: usize,
    },
}

impl<'a> Request<'a> {
    fn reply(line: &'static str) -> Request<'a> {
        Request::error(line, false)
    }

    /// An error line that `noreply` suppresses; nothing to swallow.
    fn error(line: &'static str, noreply: bool) -> Request<'a> {
        Request::Reply {
            line,
            noreply,
            swallow: 0,
        }
    }
}

/// The memcached reply for an unknown command or a wrong number of tokens.
pub const ERROR: &str = "ERROR";
/// memcached's usual complaint about a malformed line.
pub const BAD_FORMAT: &str = "CLIENT_ERROR bad command line format";
/// A data block not followed by `\r\n`.
pub const BAD_DATA_CHUNK: &str = "CLIENT_ERROR bad data chunk";
/// A value over `item_size_max`.
pub const TOO_LARGE: &str = "SERVER_ERROR object too large for cache";
/// The store ran out of memory for a value.
pub const OUT_OF_MEMORY: &str = "SERVER_ERROR out of memory storing object";
/// Reply to a `get`/`gets` line longer than [`Limits::max_buffered`] before closing.
pub const LINE_TOO_LONG: &str = "CLIENT_ERROR line too long";

/// Looks at `input` (the start of a request) and returns what to do next.
///
/// Never panics and never looks past `input`; a request needs at most
/// [`Limits::max_buffered`] bytes, except that [`Parse::Close`] is returned first.
pub fn parse<'a>(input: &'a [u8], limits: &Limits) -> Parse<'a> {
    // A plain request is built where this returns it: through `plain`'s `Option<Parse>` it
    // was moved once more, a memcpy call (~30 instructions a GET or SET, callgrind).
    match input.first() {
        Some(b'g') => {
            if let Some(parse) = plain_get(input, limits) {
                return parse;
            }
        }
        Some(b's') => {
            if let Some(parse) = storage::parse_plain(input, limits) {
                return parse;
            }
        }
        _ => {}
    }
    general(input, limits)
}

/// [`plain`]'s get, its answer built in the caller's place.
#[inline(always)]
fn plain_get<'a>(input: &'a [u8], limits: &Limits) -> Option<Parse<'a>> {
    let (get, nl) = get::parse_plain(input)?;
    // A get line may grow past `max_line`, to `max_buffered` (`is_multiget`).
    (nl <= limits.max_buffered()).then_some(Parse::Done {
        request: Request::Get(get),
        consumed: nl + 1,
    })
}

/// The cache's hot path: a plain `get`/`gets` or `set` request read in one pass over its
/// line (no search for its end first, no token array). `None`: [`general`] answers it.
/// Where it answers, it answers as [`general`] does (property-tested). [`parse`] spells it
/// out per command, so the request is built where it returns it.
#[cfg(test)]
fn plain<'a>(input: &'a [u8], limits: &Limits) -> Option<Parse<'a>> {
    match input.first()? {
        b'g' => plain_get(input, limits),
        b's' => storage::parse_plain(input, limits),
        _ => None,
    }
}

/// [`parse`] of any request: its line found, then split into tokens.
fn general<'a>(input: &'a [u8], limits: &Limits) -> Parse<'a> {
    let Some(nl) = memchr::memchr(b'\n', input) else {
        return incomplete_line(input, limits);
    };
    if nl > limits.max_line && !(is_multiget(input) && nl <= limits.max_buffered()) {
        return overlong(input, limits);
    }
    let line_end = nl + 1;
    let mut line = &input[..nl];
    // memcached strips a `\r` before the `\n` only when the line has more than one byte.
    if nl > 1 && line[nl - 1] == b'\r' {
        line = &line[..nl - 1];
    }
    // memcached works on C strings: a NUL ends the command line.
    if let Some(nul) = memchr::memchr(0, line) {
        line = &line[..nul];
    }
    dispatch(line, line_end, input, limits)
}

/// The command of a whole line (ending in `\n`, as [`Parse::AwaitingValue`]'s `line_len`
/// frames it) as [`parse`] reads it: without its `\r\n` and cut at a NUL. For the readers of
/// a storage line whose data goes into the item, so both ways read the same command.
pub(crate) fn command_of(line: &[u8]) -> Option<&[u8]> {
    let line = line.strip_suffix(b"\n")?;
    let line = match line.strip_suffix(b"\r") {
        Some(stripped) if line.len() > 1 => stripped,
        _ => line,
    };
    Some(match memchr::memchr(0, line) {
        Some(nul) => &line[..nul],
        None => line,
    })
}

fn incomplete_line<'a>(input: &'a [u8], limits: &Limits) -> Parse<'a> {
    if input.len() <= limits.max_line {
        return Parse::Incomplete;
    }
    if is_multiget(input) && input.len() <= limits.max_buffered() {
        return Parse::Incomplete;
    }
    overlong(input, limits)
}

fn overlong<'a>(input: &'a [u8], _limits: &Limits) -> Parse<'a> {
    if is_multiget(input) {
        Parse::Close {
            reply: Some(LINE_TOO_LONG),
        }
    } else {
        Parse::Close { reply: None }
    }
}

/// memcached lets only `get `/`gets ` lines (after at most 100 leading spaces) grow past
/// the line limit.
fn is_multiget(input: &[u8]) -> bool {
    let spaces = input.iter().take(101).take_while(|&&b| b == b' ').count();
    if spaces > 100 {
        return false;
    }
    let rest = &input[spaces..];
    rest.starts_with(b"get ") || rest.starts_with(b"gets ")
}

fn dispatch<'a>(line: &'a [u8], line_end: usize, input: &'a [u8], limits: &Limits) -> Parse<'a> {
    let done = |request| Parse::Done {
        request,
        consumed: line_end,
    };
    let toks = tokens::Tokens::new(line);
    let Some(cmd) = toks.get(0) else {
        return done(Request::reply(ERROR));
    };
    if cmd.len() < 2 {
        return done(Request::reply(ERROR));
    }
    let after = &input[line_end..];
    if cmd[0] == b'm' && cmd.len() == 2 {
        return match cmd[1] {
            b'g' => done(mg::parse(&toks, line)),
            b's' => ms::parse(&toks, line, line_end, after, limits),
            b'd' => done(md::parse(&toks, line)),
            b'a' => done(ma::parse(&toks, line)),
            b'n' => done(Request::MetaNoop),
            b'e' => done(meta::parse_me(&toks)),
            _ => done(Request::reply(ERROR)),
        };
    }
    match cmd {
        b"get" | b"bget" => done(get::parse(&toks, line, false, false)),
        b"gets" => done(get::parse(&toks, line, true, false)),
        b"gat" => done(get::parse(&toks, line, false, true)),
        b"gats" => done(get::parse(&toks, line, true, true)),
        b"set" => storage::parse(&toks, StoreKind::Set, line_end, after, limits),
        b"add" => storage::parse(&toks, StoreKind::Add, line_end, after, limits),
        b"replace" => storage::parse(&toks, StoreKind::Replace, line_end, after, limits),
        b"append" => storage::parse(&toks, StoreKind::Append, line_end, after, limits),
        b"prepend" => storage::parse(&toks, StoreKind::Prepend, line_end, after, limits),
        b"cas" => storage::parse(&toks, StoreKind::Cas, line_end, after, limits),
        b"incr" => done(arith::parse(&toks, true)),
        b"decr" => done(arith::parse(&toks, false)),
        b"delete" => done(delete::parse(&toks)),
        b"touch" => done(touch::parse(&toks)),
        b"flush_all" => done(flush::parse(&toks)),
        b"stats" => done(misc::parse_stats(&toks)),
        b"version" => done(Request::Version),
        b"quit" => done(Request::Quit),
        b"verbosity" => done(misc::parse_verbosity(&toks)),
        b"refresh_certs" => done(Request::RefreshCerts {
            noreply: toks.noreply(),
        }),
        b"watch" => done(misc::parse_watch(&toks)),
        b"lru_crawler" => done(crawler::parse_lru_crawler(&toks)),
        b"shutdown" => done(Request::reply(crawler::SHUTDOWN_DISABLED)),
        _ if looks_like_http(&toks) => Parse::Close { reply: None },
        _ => done(Request::reply(ERROR)),
    }
}

/// memcached's defence against cross-protocol requests (a browser made to POST to the
/// memcache port): an unknown command whose last token starts with `HTTP/` closes the
/// connection without a reply (`process_command_ascii`'s final branch). It applies only
/// where memcached reaches that branch: not to 2-byte `m` commands (handled above) and
/// not to commands starting with `g s a c i d t` or the few it knows by name that
/// ringstore does not serve, which memcached answers with an error instead. Tokens are
/// counted as memcached counts them, so with more than 23 the 23rd is the one looked at.
fn looks_like_http(toks: &tokens::Tokens<'_>) -> bool {
    const ANSWERED_BY_MEMCACHED: [&[u8]; 5] = [
        b"lru_crawler",
        b"watch",
        b"lru",
        b"extstore",
        b"refresh_certs",
    ];
    let Some(cmd) = toks.get(0) else {
        return false;
    };
    if b"gsacidt".contains(&cmd[0]) || ANSWERED_BY_MEMCACHED.contains(&cmd) {
        return false;
    }
    toks.get(toks.len() - 1)
        .is_some_and(|last| last.starts_with(b"HTTP/"))
}

/// A storage command's data length token: memcached's `vlen` must be 0..=`INT_MAX - 2`.
/// Shared by the text storage commands and `ms`.
pub(crate) fn value_len(token: &[u8]) -> Option<usize> {
    match tokens::strtol32(token) {
        Some(v) if (0..=i32::MAX - 2).contains(&v) => Some(v as usize),
        _ => None,
    }
}

/// What a storage command line (text or `ms`) said about the data block after it.
pub(crate) struct ValueHead<'a> {
    /// Named in [`Request::TooLarge`].
    pub key: &'a [u8],
    /// The data length from the line.
    pub vlen: usize,
    /// Whether a too-large value removes the old item (`set` and `ms`).
    pub remove_old: bool,
    pub noreply: bool,
}

/// Takes the data block of a storage command: `vlen` bytes and `\r\n` right after the
/// command line ending at `line_end`. A value over `item_size_max` is refused before its
/// data arrives (and swallowed); a block not ending in `\r\n` is a bad data chunk.
/// `request` builds the request from the data. Shared by the text storage commands and `ms`.
/// Inlined, so a plain set's answer is built where [`parse`] returns it (~30 instructions).
#[inline(always)]
pub(crate) fn with_value<'a>(
    head: ValueHead<'a>,
    line_end: usize,
    after: &'a [u8],
    limits: &Limits,
    request: impl FnOnce(&'a [u8]) -> Request<'a>,
) -> Parse<'a> {
    let ValueHead {
        key,
        vlen,
        remove_old,
        noreply,
    } = head;
    if vlen > limits.item_size_max {
        return Parse::Done {
            request: Request::TooLarge {
                key,
                remove_old,
                noreply,
                swallow: vlen + 2,
            },
            consumed: line_end,
        };
    }
    let need = vlen + 2;
    if after.len() < need {
        return Parse::AwaitingValue {
            request_len: line_end + need,
            line_len: line_end,
            key,
            remove_old,
            noreply,
        };
    }
    // Each request built in its answer: one built apart and then moved in cost a SET a
    // memcpy call (~30 instructions, callgrind).
    if &after[vlen..need] != b"\r\n" {
        return Parse::Done {
            request: Request::error(BAD_DATA_CHUNK, noreply),
            consumed: line_end + need,
        };
    }
    Parse::Done {
        request: request(&after[..vlen]),
        consumed: line_end + need,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What memcached 1.6.18 does with each line (checked against the real server).
    #[test]
    fn http_looking_commands_close_without_a_reply_like_memcached() {
        let close = Parse::Close { reply: None };
        for line in [
            &b"GET / HTTP/1.0\r\n"[..],
            b"PUT /x HTTP/1.1\r\n",
            b"DELETE HTTP/1.1\r\n",
            b"HEAD / HTTP/1.1\r\n",
            b"OPTIONS * HTTP/1.1\r\n",
            b"Get / HTTP/1.1\r\n",
            b"HTTP/1.1\r\n",
            b"POST / HTTP/\r\n",
            b"GET / HTTP/1.1\n",
            b"GET / HTTP/1.1\0trailing\r\n",
            b"XX  HTTP/1.1  \r\n",
            b"XX HTTP/1.1\r\r\n",
            b"mxx HTTP/1.1\r\n",
            b"misbehave HTTP/1.1\r\n",
        ] {
            assert_eq!(
                parse(line, &Limits::default()),
                close,
                "{:?}",
                String::from_utf8_lossy(line)
            );
        }
        // 22 tokens and HTTP/1.1 as the 23rd: memcached looks at the 23rd whatever follows.
        let at_23 = format!("{}HTTP/1.1 y\r\n", "XX ".repeat(22));
        assert_eq!(parse(at_23.as_bytes(), &Limits::default()), close);
    }

    #[test]
    fn http_looking_lines_memcached_answers_keep_their_reply() {
        for (line, want) in [
            (&b"gx / HTTP/1.1\r\n"[..], ERROR),
            (b"G HTTP/1.1\r\n", ERROR),
            (b"POST / http/1.1\r\n", ERROR),
            (b"POST / HTTPS\r\n", ERROR),
            (b"foo HTTP/1.1 x\r\n", ERROR),
            (b"mx HTTP/1.1\r\n", ERROR),
            (b"replace a HTTP/1.1\r\n", ERROR),
            (b"lru HTTP/1.1\r\n", ERROR),
            (b"lru_crawler HTTP/1.1\r\n", ERROR),
            (b"watch HTTP/1.1\r\n", ERROR),
            (b"extstore HTTP/1.1\r\n", ERROR),
            (b"incr HTTP/1.1\r\n", ERROR),
            (b"touch HTTP/1.1\r\n", ERROR),
            (b"GET\0 / HTTP/1.1\r\n", ERROR),
            (b"XX\tHTTP/1.1\r\n", ERROR),
        ] {
            match parse(line, &Limits::default()) {
                Parse::Done {
                    request: Request::Reply { line: got, .. },
                    ..
                } => assert_eq!(got, want, "{:?}", String::from_utf8_lossy(line)),
                other => panic!("{:?} -> {other:?}", String::from_utf8_lossy(line)),
            }
        }
        // The 23rd token is not HTTP/: memcached answers ERROR.
        let at_24 = format!("{}HTTP/1.1\r\n", "XX ".repeat(23));
        assert!(matches!(
            parse(at_24.as_bytes(), &Limits::default()),
            Parse::Done {
                request: Request::Reply { line: ERROR, .. },
                ..
            }
        ));
        // Known commands with an HTTP/ token run as usual.
        assert!(matches!(
            parse(b"get / HTTP/1.1\r\n", &Limits::default()),
            Parse::Done {
                request: Request::Get(_),
                ..
            }
        ));
        assert_eq!(
            parse(b"version HTTP/1.1\r\n", &Limits::default()),
            Parse::Done {
                request: Request::Version,
                consumed: 18
            }
        );
    }
}
