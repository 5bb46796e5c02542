//! The console's `watch`: memcached's `watch` log lines (fetchers, mutations, evictions,
//! connevents) streamed to the console until a key is pressed, a line count or a time
//! bound; with `--json`, the lines (at most [`JSON_LINES`]) in one answer.

use std::io::Read as _;
use std::os::fd::AsFd as _;
use std::time::{Duration, Instant};

use super::ctx::Ctx;
use super::output::Output;
use crate::plane::WatchFeed;

/// Default and largest `--secs`.
const SECS_DEFAULT: u64 = 10;
const SECS_MAX: u64 = 600;
/// Default and largest `--count`.
const COUNT_DEFAULT: usize = 1000;
const COUNT_MAX: usize = 100_000;
/// Lines a `--json` answer carries at most (the rest are counted, not kept).
pub const JSON_LINES: usize = 1000;
/// How long one wait for a key press (and so one poll of the feed) lasts.
const TICK_MS: u16 = 100;

/// What `watch` was asked for.
#[derive(Debug, PartialEq, Eq)]
pub struct Bounds<'a> {
    /// memcache `watch` words (none: `fetchers`, as memcached).
    pub words: Vec<&'a str>,
    pub count: usize,
    pub secs: u64,
}

/// Why a watch ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    Key,
    Count,
    Time,
}

impl Stop {
    fn word(self) -> &'static str {
        match self {
            Stop::Key => "key",
            Stop::Count => "count",
            Stop::Time => "time",
        }
    }
}

/// `[KIND ...] [--count N] [--secs S]`.
pub fn parse<'a>(args: &[&'a str]) -> Result<Bounds<'a>, String> {
    let mut b = Bounds {
        words: Vec::new(),
        count: COUNT_DEFAULT,
        secs: SECS_DEFAULT,
    };
    let mut it = args.iter();
    while let Some(&a) = it.next() {
        match a {
            "--count" => match it.next().and_then(|n| n.parse::<usize>().ok()) {
                Some(n) if (1..=COUNT_MAX).contains(&n) => b.count = n,
                _ => return Err(format!("--count takes 1 to {COUNT_MAX} lines")),
            },
            "--secs" => match it.next().and_then(|n| n.parse::<u64>().ok()) {
                Some(s) if (1..=SECS_MAX).contains(&s) => b.secs = s,
                _ => return Err(format!("--secs takes 1 to {SECS_MAX} seconds")),
            },
            word => b.words.push(word),
        }
    }
    Ok(b)
}

/// Pulls lines from `feed` and hands each to `emit` until `count` lines, `deadline`, or
/// `key_pressed` (which waits up to one tick for a key) says stop. Returns the lines
/// emitted and why it stopped.
pub fn stream(
    feed: &mut WatchFeed,
    count: usize,
    deadline: Instant,
    key_pressed: &mut dyn FnMut() -> bool,
    emit: &mut dyn FnMut(&str),
) -> (usize, Stop) {
    let mut buf = Vec::new();
    let mut emitted = 0;
    loop {
        buf.clear();
        feed(&mut buf);
        for line in String::from_utf8_lossy(&buf).lines() {
            if emitted == count {
                return (emitted, Stop::Count);
            }
            emit(line);
            emitted += 1;
        }
        if emitted == count {
            return (emitted, Stop::Count);
        }
        if Instant::now() >= deadline {
            return (emitted, Stop::Time);
        }
        if key_pressed() {
            return (emitted, Stop::Key);
        }
    }
}

/// Waits up to one tick for console input; what was typed is read and dropped (EOF or a
/// read error count as a key: nobody is there to watch). While a watch runs the console
/// delivers each key at once ([`ringstore_sys::KeysAtOnce`]), Ctrl-C included.
fn console_key() -> bool {
    let stdin = std::io::stdin();
    if !ringstore_sys::poll_one_readable(stdin.as_fd(), TICK_MS) {
        return false;
    }
    let mut scratch = [0u8; 64];
    let _ = stdin.lock().read(&mut scratch);
    true
}

/// `watch [fetchers|mutations|evictions|connevents ...] [--count N] [--secs S]`.
pub fn run(ctx: &mut Ctx, args: &[&str]) -> Output {
    let bounds = match parse(args) {
        Ok(b) => b,
        Err(why) => return Output::error(why),
    };
    // The feed holds no lock of the machine's state while it streams.
    let mut feed = match ctx.machine.with_server(|s| s.watch(&bounds.words)) {
        Ok(f) => f,
        Err(why) => return Output::error(why),
    };
    let json = ctx.json;
    if !json {
        crate::log::console_line(&format!(
            "watching (any key stops; at most {} lines or {} s)",
            bounds.count, bounds.secs
        ));
    }
    let stdin = std::io::stdin();
    let _keys = ringstore_sys::KeysAtOnce::start(stdin.as_fd());
    let started = Instant::now();
    let deadline = started + Duration::from_secs(bounds.secs);
    let mut kept = Vec::new();
    let mut emit = |line: &str| {
        if !json {
            crate::log::console_line(line);
        } else if kept.len() < JSON_LINES {
            kept.push(line.to_string());
        }
    };
    let (lines, stop) = stream(
        &mut feed,
        bounds.count,
        deadline,
        &mut console_key,
        &mut emit,
    );
    summary(lines, stop, started.elapsed(), kept)
}

fn summary(lines: usize, stop: Stop, took: Duration, kept: Vec<String>) -> Output {
    let secs = (took.as_secs_f64() * 10.0).round() / 10.0;
    let mut out = Output::new();
    out.line(format!(
        "watch: {lines} lines in {secs:.1} s, stopped by {}",
        stop.word()
    ));
    out.set("count", lines);
    out.set("stopped_by", stop.word());
    out.set("watched_s", secs);
    out.set("lines", kept);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed_of(batches: Vec<&'static str>) -> WatchFeed {
        let mut batches = batches.into_iter();
        Box::new(move |out: &mut Vec<u8>| match batches.next() {
            Some(b) => {
                out.extend_from_slice(b.as_bytes());
                true
            }
            None => false,
        })
    }

    #[test]
    fn arguments_are_kinds_and_bounds() {
        let b = parse(&["evictions", "--count", "5", "connevents", "--secs", "3"]).unwrap();
        assert_eq!(b.words, ["evictions", "connevents"]);
        assert_eq!((b.count, b.secs), (5, 3));
        assert_eq!(parse(&[]).unwrap().count, COUNT_DEFAULT);
        assert!(parse(&["--secs", "601"]).is_err());
        assert!(parse(&["--count", "0"]).is_err());
        assert!(parse(&["--count"]).is_err());
    }

    #[test]
    fn stops_at_the_count_even_inside_a_batch() {
        let mut feed = feed_of(vec!["a\nb\n", "c\nd\ne\n"]);
        let mut seen = Vec::new();
        let far = Instant::now() + Duration::from_secs(60);
        let (n, stop) = stream(&mut feed, 4, far, &mut || false, &mut |l| {
            seen.push(l.to_string())
        });
        assert_eq!((n, stop), (4, Stop::Count));
        assert_eq!(seen, ["a", "b", "c", "d"]);
    }

    #[test]
    fn stops_at_a_key_or_the_deadline() {
        let mut feed = feed_of(vec!["a\n"]);
        let mut ticks = 0;
        let far = Instant::now() + Duration::from_secs(60);
        let mut key = || {
            ticks += 1;
            ticks == 3
        };
        let (n, stop) = stream(&mut feed, 100, far, &mut key, &mut |_| {});
        assert_eq!((n, stop, ticks), (1, Stop::Key, 3));
        let mut feed = feed_of(vec![]);
        let past = Instant::now();
        let (n, stop) = stream(&mut feed, 100, past, &mut || false, &mut |_| {});
        assert_eq!((n, stop), (0, Stop::Time));
    }

    #[test]
    fn the_summary_says_how_many_and_why() {
        let out = summary(2, Stop::Time, Duration::from_millis(1500), vec!["x".into()]);
        assert_eq!(out.text, ["watch: 2 lines in 1.5 s, stopped by time"]);
        assert_eq!(out.fields["stopped_by"], "time");
        assert_eq!(out.fields["lines"], serde_json::json!(["x"]));
    }
}
