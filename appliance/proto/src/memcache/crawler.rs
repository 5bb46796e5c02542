//! `lru_crawler` (metadump, mgdump, crawl and its settings) and `shutdown`, answered as memcached
//! 1.6.18's `process_lru_crawler_command` and `process_shutdown_command` answer them.
//!
//! `mgdump` is memcached 1.6.19's; the rest is as 1.6.18 has it.
//!
//! ringstore has one item class (memcached's slab class 1 in every listing) and an expiry
//! reaper that always runs: `metadump` of a class list that names 1 (or `all`, `hash`)
//! lists every key, a valid list without 1 lists nothing; `crawl` answers `OK` (the reaper
//! is already at work), `enable` answers as memcached does when its crawler already runs,
//! `disable` fails (the reaper cannot be stopped).

use super::tokens::{strtoul32, Tokens};
use super::{Request, BAD_FORMAT, ERROR};

/// Which key listing a request asked for; produced as the client drains it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyDump {
    /// `lru_crawler metadump all|hash|<classes>`: one `key=… exp=… la=… cas=… fetch=…
    /// cls=… size=…` line per item, then `END`.
    Meta,
    /// `stats cachedump 1 <limit>`: one `ITEM <key> [<bytes> b; <exptime> s]` line per
    /// item, at most `limit` of them (0: all), then `END`.
    CacheDump { limit: u32 },
    /// `lru_crawler mgdump all|hash|<classes>` (memcached 1.6.19+, what dump-and-load tools
    /// such as mcdumpload read): one `mg <key>` line per item (`mg <base64> b` for a key
    /// that is not a text key), then `EN`.
    Mg,
}

/// memcached's `MAX_NUMBER_OF_SLAB_CLASSES`: class ids are 1..=63.
const CLASSES: u32 = 64;

/// memcached's answer to a class list naming a class that cannot exist.
pub const BADCLASS: &str = "BADCLASS invalid class id";
/// memcached's answer to a class list naming no class (`,`).
pub const NOTSTARTED: &str = "NOTSTARTED no items to crawl";
/// memcached's answer to `shutdown` unless started with `-A` (ringstore never allows it).
pub const SHUTDOWN_DISABLED: &str = "ERROR: shutdown not enabled";

/// What a class list names: `Err` is the reply, `Ok(true)` when class 1 is among them.
fn classes(list: &[u8]) -> Result<bool, &'static str> {
    if list == b"all" {
        return Ok(true);
    }
    let mut any = false;
    let mut one = false;
    for id in list.split(|&b| b == b',').filter(|t| !t.is_empty()) {
        match strtoul32(id) {
            Some(id) if (1..CLASSES).contains(&id) => {
                any = true;
                one |= id == 1;
            }
            _ => return Err(BADCLASS),
        }
    }
    if any {
        Ok(one)
    } else {
        Err(NOTSTARTED)
    }
}

pub(crate) fn parse_lru_crawler<'a>(toks: &Tokens<'a>) -> Request<'a> {
    let n = toks.ntokens();
    if n < 3 {
        return Request::reply(ERROR);
    }
    match (toks.at(1), n) {
        (b"metadump" | b"mgdump", 4) => {
            let (dump, empty) = match toks.at(1) {
                b"metadump" => (KeyDump::Meta, "END"),
                _ => (KeyDump::Mg, "EN"),
            };
            let list = toks.at(2);
            let named = if list == b"hash" {
                Ok(true)
            } else {
                classes(list)
            };
            match named {
                Ok(true) => Request::KeyDump(dump),
                Ok(false) => Request::reply(empty),
                Err(e) => Request::reply(e),
            }
        }
        (b"crawl", 4) => match classes(toks.at(2)) {
            Ok(_) => Request::reply("OK"),
            Err(e) => Request::reply(e),
        },
        (b"tocrawl", 4) => match strtoul32(toks.at(2)) {
            Some(_) => Request::reply("OK"),
            None => Request::reply(BAD_FORMAT),
        },
        (b"sleep", 4) => match strtoul32(toks.at(2)) {
            Some(us) if us > 1_000_000 => {
                Request::reply("CLIENT_ERROR sleep must be one second or less")
            }
            Some(_) => Request::reply("OK"),
            None => Request::reply(BAD_FORMAT),
        },
        (b"enable", 3) => Request::reply("ERROR failed to start lru crawler thread"),
        (b"disable", 3) => Request::reply("ERROR failed to stop lru crawler thread"),
        _ => Request::reply(ERROR),
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::req;
    use super::*;

    fn line(input: &[u8]) -> &'static str {
        match req(input) {
            Request::Reply { line, .. } => line,
            other => panic!("{other:?}"),
        }
    }

    /// Each reply is what memcached 1.6.18 answers to the same line.
    #[test]
    fn lru_crawler_forms() {
        for dump in [
            &b"lru_crawler metadump all\r\n"[..],
            b"lru_crawler metadump hash\r\n",
            b"lru_crawler metadump 1\r\n",
            b"lru_crawler metadump 2,1\r\n",
        ] {
            assert_eq!(req(dump), Request::KeyDump(KeyDump::Meta));
        }
        assert_eq!(line(b"lru_crawler metadump 2\r\n"), "END");
        assert_eq!(line(b"lru_crawler metadump 63\r\n"), "END");
        assert_eq!(line(b"lru_crawler metadump 0\r\n"), BADCLASS);
        assert_eq!(line(b"lru_crawler metadump 64\r\n"), BADCLASS);
        assert_eq!(line(b"lru_crawler metadump x\r\n"), BADCLASS);
        assert_eq!(line(b"lru_crawler metadump 1,x\r\n"), BADCLASS);
        assert_eq!(line(b"lru_crawler metadump ,\r\n"), NOTSTARTED);
        assert_eq!(line(b"lru_crawler metadump\r\n"), ERROR);
        assert_eq!(line(b"lru_crawler metadump all extra\r\n"), ERROR);
        // mgdump is memcached 1.6.19's (1.6.18 answers ERROR).
        assert_eq!(
            req(b"lru_crawler mgdump all\r\n"),
            Request::KeyDump(KeyDump::Mg)
        );
        assert_eq!(
            req(b"lru_crawler mgdump 1,3\r\n"),
            Request::KeyDump(KeyDump::Mg)
        );
        assert_eq!(line(b"lru_crawler mgdump 3\r\n"), "EN");
        assert_eq!(line(b"lru_crawler mgdump 99\r\n"), BADCLASS);
        assert_eq!(line(b"lru_crawler mgdump\r\n"), ERROR);
        assert_eq!(line(b"lru_crawler\r\n"), ERROR);
        assert_eq!(line(b"lru_crawler foo\r\n"), ERROR);
        assert_eq!(line(b"lru_crawler crawl all\r\n"), "OK");
        assert_eq!(line(b"lru_crawler crawl 1\r\n"), "OK");
        assert_eq!(line(b"lru_crawler crawl x\r\n"), BADCLASS);
        assert_eq!(line(b"lru_crawler sleep 10\r\n"), "OK");
        assert_eq!(
            line(b"lru_crawler sleep 1000001\r\n"),
            "CLIENT_ERROR sleep must be one second or less"
        );
        assert_eq!(line(b"lru_crawler tocrawl 10\r\n"), "OK");
        assert_eq!(line(b"lru_crawler tocrawl x\r\n"), BAD_FORMAT);
        assert_eq!(
            line(b"lru_crawler enable\r\n"),
            "ERROR failed to start lru crawler thread"
        );
    }

    #[test]
    fn shutdown_is_never_enabled() {
        assert_eq!(line(b"shutdown\r\n"), SHUTDOWN_DISABLED);
        assert_eq!(line(b"shutdown graceful\r\n"), SHUTDOWN_DISABLED);
    }

    #[test]
    fn stats_cachedump_lists_class_one() {
        assert_eq!(
            req(b"stats cachedump 1 10\r\n"),
            Request::KeyDump(KeyDump::CacheDump { limit: 10 })
        );
        // Other classes are empty: the stats listing of nothing, `END`.
        let empty = Request::Stats(super::super::misc::StatsRequest::Empty);
        assert_eq!(req(b"stats cachedump 2 10\r\n"), empty);
        assert_eq!(req(b"stats cachedump 0 0\r\n"), empty);
    }
}
