//! memcached's ASCII authentication (`-Y`, ringstore `--auth-file`) in a text session.
//!
//! Until a connection logs in, memcached 1.6.18 (`try_read_command_asciiauth`) reads only
//! `set <key> <flags> <exptime> <len>` lines whose `len`-byte data block is `user password`;
//! everything else is answered `CLIENT_ERROR unauthenticated` and the connection stays
//! open. Its replies share one response object until it writes: a reply replaces the one
//! before it, and only the last of a burst goes out, when the input runs dry, after the
//! 21st command of a read and after every 20 more, or at the login. This module answers
//! the same bytes (tests/e2e/test_auth.py compares them with memcached). Bounds: a line
//! without `\n` in 2048 buffered bytes closes the connection (memcached's rule), and a
//! data block over [`LOGIN_BLOCK_MAX`] closes it at once (memcached closes when it no
//! longer fits its 16 KiB read buffer), so a connection that has not logged in holds at
//! most its fixed input allowance.

use super::Ctx;
use crate::auth::Standing;

/// Buffered bytes without a line end after which the connection is closed.
const LINE_JUNK_MAX: usize = 2048;
/// Largest login data block, `\r\n` included.
pub const LOGIN_BLOCK_MAX: usize = 16 * 1024;
/// Commands memcached runs in the first burst of a read before it writes (`-R 20`: 21).
const FIRST_BURST: u8 = 21;
/// Commands in each later burst of the same read.
const LATER_BURST: u8 = 20;

const UNAUTHENTICATED: &str = "CLIENT_ERROR unauthenticated";
const BAD_TERMINATION: &str = "CLIENT_ERROR bad command line termination";
const BAD_FORMAT: &str = "CLIENT_ERROR bad authentication token format";
const FAILURE: &str = "CLIENT_ERROR authentication failure";
const STORED: &str = "STORED";

/// Whether a memcache session must log in.
#[derive(Debug, Default)]
pub(crate) enum Gate {
    /// Not looked at yet (the first bytes decide, from [`crate::Shared::auth`]).
    #[default]
    Unresolved,
    /// No `--auth-file`.
    Open,
    /// Not logged in.
    Locked(Login),
    /// Logged in, as this line of the users file (boxed: only connections that log in
    /// carry it). A reload that removes the line closes the connection ([`Gate::revoked`]).
    LoggedIn(Box<Standing>),
}

impl Gate {
    pub(crate) fn for_shared(shared: &crate::Shared) -> Gate {
        if shared
            .started
            .auth
            .as_ref()
            .is_some_and(|a| a.users.is_some())
        {
            Gate::Locked(Login::default())
        } else {
            Gate::Open
        }
    }

    /// True when the connection logged in as a user that a reload of the users file has
    /// since removed (or whose password it changed): the connection is closed. One atomic
    /// load while the file was not reloaded.
    pub(crate) fn revoked(&mut self, shared: &crate::Shared) -> bool {
        let Gate::LoggedIn(standing) = self else {
            return false;
        };
        let users = shared.started.auth.as_ref().and_then(|a| a.users.as_ref());
        users.is_some_and(|users| !users.still_holds(standing))
    }
}

/// What to do after a login step.
#[derive(Debug)]
pub(crate) enum Step {
    /// Input used up: wait for more.
    More,
    /// Logged in (as this line of the file); the rest of the input is ordinary commands.
    LoggedIn(Box<Standing>),
    /// Close without a reply.
    Close,
}

/// A text connection's login in progress.
#[derive(Debug, Default)]
pub(crate) struct Login {
    /// Bytes of the data block being waited for (`None`: waiting for a line).
    block: Option<usize>,
    /// The reply not written yet (replaced by the next one, as memcached does).
    reply: Option<&'static str>,
}

impl Login {
    /// Runs login lines from `buf`; returns the bytes used and what comes next. Replies go
    /// to `out`.
    pub(crate) fn run(&mut self, buf: &[u8], ctx: &Ctx<'_>, out: &mut Vec<u8>) -> (usize, Step) {
        let mut pos = 0;
        let (mut burst, mut limit) = (0u8, FIRST_BURST);
        let step = loop {
            let rest = &buf[pos..];
            if let Some(len) = self.block {
                if rest.len() < len {
                    break Step::More;
                }
                pos += len;
                self.block = None;
                if let Some(standing) = self.finish(&rest[..len], ctx) {
                    break Step::LoggedIn(standing);
                }
            } else {
                if rest.len() < 2 {
                    break Step::More;
                }
                let Some(end) = rest.iter().position(|&b| b == b'\n') else {
                    break if rest.len() > LINE_JUNK_MAX {
                        Step::Close
                    } else {
                        Step::More
                    };
                };
                pos += end + 1;
                match login_length(&rest[..end]).map(usize::try_from) {
                    Some(Ok(n)) if n <= LOGIN_BLOCK_MAX - 2 => self.block = Some(n + 2),
                    Some(_) => break Step::Close,
                    None => self.reply = Some(UNAUTHENTICATED),
                }
            }
            burst += 1;
            if burst == limit {
                self.flush(out);
                (burst, limit) = (0, LATER_BURST);
            }
        };
        match step {
            Step::Close => self.reply = None,
            _ => self.flush(out),
        }
        (pos, step)
    }

    fn flush(&mut self, out: &mut Vec<u8>) {
        if let Some(line) = self.reply.take() {
            ringstore_proto::memcache::reply::line(out, line);
        }
    }

    /// The data block (`\r\n` included) has arrived: checks it; `Some` when logged in.
    fn finish(&mut self, block: &[u8], ctx: &Ctx<'_>) -> Option<Box<Standing>> {
        let (data, end) = block.split_at(block.len() - 2);
        if end != b"\r\n" {
            self.reply = Some(BAD_TERMINATION);
            return None;
        }
        let mut words = tokens(c_string(data));
        let (Some(user), Some(pass)) = (words.next(), words.next()) else {
            self.reply = Some(BAD_FORMAT);
            return None;
        };
        let standing = check(ctx, user, pass, "memcache text login");
        self.reply = Some(if standing.is_some() { STORED } else { FAILURE });
        standing
    }
}

/// Checks `user`/`pass` against the file in force and counts the attempt (`auth_cmds`,
/// `auth_errors`); a failure is logged at the bounded rate. `Some`: who logged in.
pub(crate) fn check(ctx: &Ctx<'_>, user: &[u8], pass: &[u8], kind: &str) -> Option<Box<Standing>> {
    let (auth, users) = ctx
        .shared
        .started
        .auth
        .as_ref()
        .and_then(|a| a.users.as_ref().map(|u| (a, u)))?;
    ctx.stats.auth_cmds.inc();
    let standing = users.login(user, pass).map(Box::new);
    if standing.is_none() {
        ctx.stats.auth_errors.inc();
        auth.log.failed(ctx.now.mono_ms, kind);
    }
    standing
}

/// What C string functions see of `bytes`: up to the first NUL.
fn c_string(bytes: &[u8]) -> &[u8] {
    bytes.split(|&b| b == 0).next().unwrap_or_default()
}

/// memcached's tokenizer: words separated by spaces (only spaces).
fn tokens(line: &[u8]) -> impl Iterator<Item = &[u8]> {
    line.split(|&b| b == b' ').filter(|w| !w.is_empty())
}

/// The data length of a login line (`set <key> <flags> <exptime> <len> ...`; the line end
/// excluded), or `None` when the line is anything else.
fn login_length(line: &[u8]) -> Option<u64> {
    let words: Vec<&[u8]> = tokens(c_string(line)).take(5).collect();
    match words[..] {
        [b"set", _, _, _, len] => safe_strtoul(len),
        _ => None,
    }
}

/// memcached's `safe_strtoul`: C `strtoul` (leading white space, a sign, decimal digits),
/// then white space or the end; a negative number is refused; the value is kept to 32 bits
/// as memcached stores it in a `uint32_t`.
fn safe_strtoul(word: &[u8]) -> Option<u64> {
    let space = |b: &u8| matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r');
    let start = word.iter().position(|b| !space(b)).unwrap_or(word.len());
    let mut rest = &word[start..];
    let negative = rest.first() == Some(&b'-');
    if matches!(rest.first(), Some(b'-' | b'+')) {
        rest = &rest[1..];
    }
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 || matches!(rest.get(digits), Some(b) if !space(b)) {
        return None;
    }
    let mut value: u64 = 0;
    for &d in &rest[..digits] {
        value = value.checked_mul(10)?.checked_add(u64::from(d - b'0'))?;
    }
    if negative && value != 0 {
        return None;
    }
    Some(value & u64::from(u32::MAX))
}

#[cfg(test)]
mod tests {
    use super::{login_length, safe_strtoul};

    #[test]
    fn login_lines_as_memcached_reads_them() {
        assert_eq!(login_length(b"set k 0 0 12\r"), Some(12));
        assert_eq!(login_length(b"set k 0 0 12 noreply"), Some(12));
        assert_eq!(login_length(b"set  k 0 0 +7"), Some(7));
        assert_eq!(login_length(b"set k 0\t0 12"), None);
        assert_eq!(login_length(b"SET k 0 0 12"), None);
        assert_eq!(login_length(b"set k 0 0 -1"), None);
        assert_eq!(login_length(b"set k 0 0 12x"), None);
        assert_eq!(login_length(b"set k 0 0"), None);
        assert_eq!(login_length(b"set k 0 0 1\x002"), Some(1));
        assert_eq!(safe_strtoul(b"4294967296"), Some(0));
        assert_eq!(safe_strtoul(b"-0"), Some(0));
        assert_eq!(safe_strtoul(b"99999999999999999999999"), None);
    }
}
