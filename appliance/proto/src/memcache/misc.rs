//! `stats`, `verbosity`, `watch`: the administrative commands.

use super::tokens::{strtoul32, Tokens};
use super::{Request, BAD_FORMAT, ERROR};

/// Which `stats` listing was asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatsRequest {
    /// `stats`
    General,
    /// `stats reset`: answers `RESET`.
    Reset,
    /// `stats settings`
    Settings,
    /// `stats items`
    Items,
    /// `stats slabs`
    Slabs,
    /// `stats sizes`
    Sizes,
    /// `stats conns`
    Conns,
    /// `stats hotkeys [N]`: the N (default [`HOTKEYS_DEFAULT`], at most [`HOTKEYS_MAX`])
    /// keys requested most.
    HotKeys(u8),
    /// `stats detail dump` (ringstore keeps no per-prefix stats) and `stats cachedump` of
    /// a class other than 1: an empty listing (`END`).
    Empty,
}

/// Keys `stats hotkeys` lists without a number.
pub const HOTKEYS_DEFAULT: u8 = 10;
/// Most keys `stats hotkeys N` lists (a larger N lists this many).
pub const HOTKEYS_MAX: u8 = 100;

const DETAIL_USAGE: &str = "CLIENT_ERROR usage: stats detail on|off|dump";

pub(crate) fn parse_stats<'a>(toks: &Tokens<'a>) -> Request<'a> {
    let n = toks.ntokens();
    if n == 2 {
        return Request::Stats(StatsRequest::General);
    }
    let stats = |s| Request::Stats(s);
    match toks.at(1) {
        b"reset" => stats(StatsRequest::Reset),
        b"detail" => match toks.at(2) {
            b"on" | b"off" if n >= 4 => Request::reply("OK"),
            b"dump" if n >= 4 => stats(StatsRequest::Empty),
            _ => Request::reply(DETAIL_USAGE),
        },
        b"settings" => stats(StatsRequest::Settings),
        b"cachedump" => {
            if n < 5 {
                return Request::reply("CLIENT_ERROR bad command line");
            }
            match (strtoul32(toks.at(2)), strtoul32(toks.at(3))) {
                (Some(id), Some(_)) if id >= 64 => Request::reply("CLIENT_ERROR Illegal slab id"),
                (Some(1), Some(limit)) => Request::KeyDump(super::KeyDump::CacheDump { limit }),
                (Some(_), Some(_)) => stats(StatsRequest::Empty),
                _ => Request::reply(BAD_FORMAT),
            }
        }
        b"conns" => stats(StatsRequest::Conns),
        b"items" => stats(StatsRequest::Items),
        b"slabs" => stats(StatsRequest::Slabs),
        b"sizes" => stats(StatsRequest::Sizes),
        b"hotkeys" if n == 3 => stats(StatsRequest::HotKeys(HOTKEYS_DEFAULT)),
        b"hotkeys" => match strtoul32(toks.at(2)) {
            Some(0) | None => Request::reply(BAD_FORMAT),
            Some(k) => stats(StatsRequest::HotKeys(
                u8::try_from(k.min(u32::from(HOTKEYS_MAX))).unwrap_or(HOTKEYS_MAX),
            )),
        },
        _ => Request::reply(ERROR),
    }
}

/// The event kinds a `watch` asked for, as bits (`WatchKinds::FETCHERS` ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WatchKinds(pub u8);

impl WatchKinds {
    /// `fetchers`: item reads (`type=item_get`).
    pub const FETCHERS: u8 = 1;
    /// `mutations`: item stores (`type=item_store`).
    pub const MUTATIONS: u8 = 2;
    /// `evictions`: items evicted for space (`type=eviction`).
    pub const EVICTIONS: u8 = 4;
    /// `connevents`: connections opened and closed.
    pub const CONNEVENTS: u8 = 8;

    /// True when any kind in `mask` was asked for.
    pub fn any(self, mask: u8) -> bool {
        self.0 & mask != 0
    }
}

/// memcached 1.6.18's `watch` words: no word means `fetchers`; a word it does not know is
/// `ERROR`. Kinds ringstore has no events of (`rawcmds`, `sysevents`, `deletions`, the
/// proxy's) are accepted and produce nothing.
pub(crate) fn parse_watch<'a>(toks: &Tokens<'a>) -> Request<'a> {
    match watch_kinds(toks.from(1)) {
        Some(kinds) => Request::Watch(kinds),
        None => Request::reply(ERROR),
    }
}

/// The kinds `watch` `words` ask for (the console's `watch` too); `None` for a word
/// memcached does not know.
pub fn watch_kinds(words: &[&[u8]]) -> Option<WatchKinds> {
    if words.is_empty() {
        return Some(WatchKinds(WatchKinds::FETCHERS));
    }
    let mut kinds = 0;
    for word in words {
        kinds |= match *word {
            b"fetchers" => WatchKinds::FETCHERS,
            b"mutations" => WatchKinds::MUTATIONS,
            b"evictions" => WatchKinds::EVICTIONS,
            b"connevents" => WatchKinds::CONNEVENTS,
            b"rawcmds" | b"sysevents" | b"deletions" | b"proxyreqs" | b"proxyevents"
            | b"proxyuser" => 0,
            _ => return None,
        };
    }
    Some(WatchKinds(kinds))
}

pub(crate) fn parse_verbosity<'a>(toks: &Tokens<'a>) -> Request<'a> {
    let n = toks.ntokens();
    if n != 3 && n != 4 {
        return Request::reply(ERROR);
    }
    let noreply = toks.noreply();
    match strtoul32(toks.at(1)) {
        Some(_) => Request::Verbosity { noreply },
        None => Request::error(BAD_FORMAT, noreply),
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::req;
    use super::*;

    #[test]
    fn watch_words_as_memcached() {
        let w = |k| Request::Watch(WatchKinds(k));
        assert_eq!(req(b"watch\r\n"), w(WatchKinds::FETCHERS));
        assert_eq!(
            req(b"watch fetchers mutations evictions connevents\r\n"),
            w(15)
        );
        assert_eq!(
            req(b"watch mutations rawcmds\r\n"),
            w(WatchKinds::MUTATIONS)
        );
        assert_eq!(req(b"watch deletions\r\n"), w(0));
        assert_eq!(req(b"watch fetchers foo\r\n"), Request::reply(ERROR));
    }

    #[test]
    fn stats_subcommands() {
        assert_eq!(req(b"stats\r\n"), Request::Stats(StatsRequest::General));
        assert_eq!(req(b"stats reset\r\n"), Request::Stats(StatsRequest::Reset));
        assert_eq!(req(b"stats detail\r\n"), Request::reply(DETAIL_USAGE));
        assert_eq!(req(b"stats detail x\r\n"), Request::reply(DETAIL_USAGE));
        assert_eq!(req(b"stats detail on x\r\n"), Request::reply("OK"));
        assert_eq!(
            req(b"stats detail dump\r\n"),
            Request::Stats(StatsRequest::Empty)
        );
        assert_eq!(req(b"stats foo\r\n"), Request::reply(ERROR));
        assert_eq!(
            req(b"stats cachedump 1\r\n"),
            Request::reply("CLIENT_ERROR bad command line")
        );
        assert_eq!(
            req(b"stats cachedump 99 1\r\n"),
            Request::reply("CLIENT_ERROR Illegal slab id")
        );
        assert_eq!(req(b"stats items\r\n"), Request::Stats(StatsRequest::Items));
    }

    #[test]
    fn stats_hotkeys_takes_an_optional_count_up_to_the_limit() {
        let hot = |k| Request::Stats(StatsRequest::HotKeys(k));
        assert_eq!(req(b"stats hotkeys\r\n"), hot(HOTKEYS_DEFAULT));
        assert_eq!(req(b"stats hotkeys 3\r\n"), hot(3));
        assert_eq!(req(b"stats hotkeys 100\r\n"), hot(100));
        assert_eq!(req(b"stats hotkeys 5000\r\n"), hot(HOTKEYS_MAX));
        assert_eq!(req(b"stats hotkeys 0\r\n"), Request::reply(BAD_FORMAT));
        assert_eq!(req(b"stats hotkeys x\r\n"), Request::reply(BAD_FORMAT));
    }

    #[test]
    fn verbosity_forms() {
        assert_eq!(
            req(b"verbosity 1\r\n"),
            Request::Verbosity { noreply: false }
        );
        assert_eq!(
            req(b"verbosity 1 noreply\r\n"),
            Request::Verbosity { noreply: true }
        );
        assert_eq!(
            req(b"verbosity a\r\n"),
            Request::Reply {
                line: BAD_FORMAT,
                noreply: false,
                swallow: 0
            }
        );
        assert_eq!(
            req(b"verbosity noreply\r\n"),
            Request::Reply {
                line: BAD_FORMAT,
                noreply: true,
                swallow: 0
            }
        );
        assert_eq!(req(b"verbosity\r\n"), Request::reply(ERROR));
        assert_eq!(req(b"verbosity 1 2 3\r\n"), Request::reply(ERROR));
    }
}
