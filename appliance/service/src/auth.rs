//! Authentication in force on the server: the users and tokens files as parsed by
//! `ringstore-auth` (re-exported here), the logins they accept, their reloads, and the
//! rate-bounded log of failed attempts (ADR 0032).

use std::sync::atomic::{
    AtomicU64,
    Ordering::{Acquire, Relaxed, Release},
};
use std::sync::{Arc, OnceLock, RwLock};

pub use ringstore_auth::*;

/// At most one log line per this many milliseconds reports failed attempts (with the count
/// of those not reported on a line of their own).
pub const AUTH_LOG_INTERVAL_MS: u64 = 1000;

/// A logged-in connection's standing: who it is and the users file (by its
/// [`Reloadable::generation`]) it was last found in.
#[derive(Debug)]
pub struct Standing {
    who: Identity,
    generation: u64,
}

/// The failure log: at most one line per [`AUTH_LOG_INTERVAL_MS`], whatever the rate of
/// failed attempts; the lines never carry what the client sent.
#[derive(Debug, Default)]
pub struct AuthLog {
    /// Monotonic milliseconds before which no line is written.
    next_ms: AtomicU64,
    /// Failures not reported on a line yet.
    unreported: AtomicU64,
    sink: OnceLock<fn(&str)>,
}

impl AuthLog {
    /// Notes one failed attempt of `kind` at `now_ms`; writes a line when the interval has
    /// passed. Returns whether it wrote one.
    pub fn failed(&self, now_ms: u64, kind: &str) -> bool {
        let next = self.next_ms.load(Relaxed);
        if now_ms < next
            || self
                .next_ms
                .compare_exchange(next, now_ms + AUTH_LOG_INTERVAL_MS, Relaxed, Relaxed)
                .is_err()
        {
            self.unreported.fetch_add(1, Relaxed);
            return false;
        }
        let earlier = self.unreported.swap(0, Relaxed);
        if let Some(sink) = self.sink.get() {
            sink(&format!(
                "ringstore: authentication failed ({kind}); {earlier} earlier failures not logged one by one"
            ));
        }
        true
    }
}

/// A value a reload may replace while sessions read it (they keep the copy they took), and
/// how many times it was replaced: a session compares that generation with the one it saw
/// (one atomic load) and looks at the value again only when it moved.
#[derive(Debug)]
pub struct Reloadable<T> {
    value: RwLock<Arc<T>>,
    generation: AtomicU64,
}

impl<T> Reloadable<T> {
    pub fn new(value: T) -> Reloadable<T> {
        Reloadable {
            value: RwLock::new(Arc::new(value)),
            generation: AtomicU64::new(0),
        }
    }

    /// The value now in force.
    pub fn get(&self) -> Arc<T> {
        Arc::clone(&self.value.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Replacements so far. A [`Reloadable::get`] after this read returns the value of this
    /// generation or a later one.
    pub fn generation(&self) -> u64 {
        self.generation.load(Acquire)
    }

    /// Puts `value` in force for every later [`Reloadable::get`].
    pub fn replace(&self, value: T) {
        let mut now = self.value.write().unwrap_or_else(|e| e.into_inner());
        *now = Arc::new(value);
        // Moved while the lock is held: whoever reads the new number then waits for the lock
        // and gets the new value.
        self.generation.fetch_add(1, Release);
    }
}

impl Reloadable<Credentials> {
    /// The standing of a login as `user` with `pass`, when the file in force has that line.
    pub fn login(&self, user: &[u8], pass: &[u8]) -> Option<Standing> {
        let generation = self.generation();
        let who = self.get().login(user, pass)?;
        Some(Standing { who, generation })
    }

    /// False once a reload removed the line of `standing` (the user, or its password
    /// changed). Looks at the file only when it was reloaded since the last call.
    pub fn still_holds(&self, standing: &mut Standing) -> bool {
        let generation = self.generation();
        if generation == standing.generation {
            return true;
        }
        let held = self.get().holds(&standing.who);
        if held {
            standing.generation = generation;
        }
        held
    }
}

/// What `--auth-file` and `--http-tokens` turn on, kept in [`crate::Shared`].
#[derive(Debug)]
pub struct Auth {
    /// `--auth-file`: memcache connections log in first.
    pub users: Option<Reloadable<Credentials>>,
    /// The `--auth-file` path (memcached's `stats settings` prints it as
    /// `auth_enabled_ascii`); set by the runtime.
    pub users_file: Option<String>,
    /// `--http-tokens`: every HTTP request carries a bearer token.
    pub tokens: Option<Reloadable<HttpTokens>>,
    pub log: AuthLog,
}

impl Auth {
    /// Auth with `users` and/or `tokens`; failure lines go to `sink` (the runtime's log).
    pub fn new(users: Option<Credentials>, tokens: Option<HttpTokens>, sink: fn(&str)) -> Auth {
        let log = AuthLog::default();
        let _ = log.sink.set(sink);
        Auth {
            users: users.map(Reloadable::new),
            users_file: None,
            tokens: tokens.map(Reloadable::new),
            log,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_of_failures_writes_one_line_a_second() {
        let log = AuthLog::default();
        let written = (0..10_000u64)
            .filter(|i| log.failed(5_000 + i / 10, "x"))
            .count();
        // 10 000 failures over 1 000 ms of clock: the first line, and one when the second
        // interval begins.
        assert_eq!(written, 1);
        assert!(log.failed(6_000, "x"));
        assert_eq!(log.unreported.load(Relaxed), 0);
        assert!(!log.failed(6_999, "x"));
    }
}
