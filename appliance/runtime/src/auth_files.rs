//! `--auth-file` and `--http-tokens` on the server: read at start (a file at fault refuses
//! the start) and again by [`reload`] (SIGHUP, the console); the sessions do the checks.

use ringstore_config::Config;
use ringstore_service::auth::{Auth, Credentials, HttpTokens, Reloadable, AUTH_FILE_MAX};
use ringstore_service::Shared;

use crate::error::RuntimeError;

/// What the files hold, read before the server starts.
pub(crate) struct Files {
    users: Option<Credentials>,
    /// The `--auth-file` path as given (memcached's `stats settings` prints it).
    users_file: Option<String>,
    tokens: Option<HttpTokens>,
}

/// The bytes of `path`, at most [`AUTH_FILE_MAX`] + 1 (one past the limit tells a file that
/// is too large from one that fits).
fn read(key: &str, path: &std::path::Path) -> Result<Vec<u8>, RuntimeError> {
    let file = std::fs::File::open(path)
        .map_err(|e| RuntimeError::AuthFile(format!("{key} {}: {e}", path.display())))?;
    let mut text = Vec::new();
    std::io::Read::read_to_end(
        &mut std::io::Read::take(file, AUTH_FILE_MAX as u64 + 1),
        &mut text,
    )
    .map_err(|e| RuntimeError::AuthFile(format!("{key} {}: {e}", path.display())))?;
    Ok(text)
}

fn refused(key: &str, path: &std::path::Path, why: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::AuthFile(format!("{key} {}: {why}", path.display()))
}

/// Reads and checks the users file (memcached `-Y` format).
pub fn load_users(path: &std::path::Path) -> Result<Credentials, RuntimeError> {
    Credentials::parse(&read("auth-file", path)?).map_err(|e| refused("auth-file", path, e))
}

/// Reads and checks the HTTP tokens file.
pub fn load_tokens(path: &std::path::Path) -> Result<HttpTokens, RuntimeError> {
    let text = read("http-tokens", path)?;
    let text = std::str::from_utf8(&text).map_err(|_| refused("http-tokens", path, "not UTF-8"))?;
    HttpTokens::parse(text).map_err(|e| refused("http-tokens", path, e))
}

/// Reads every file `config` names.
pub(crate) fn load(config: &Config) -> Result<Files, RuntimeError> {
    Ok(Files {
        users: config.auth_file.as_deref().map(load_users).transpose()?,
        users_file: config
            .auth_file
            .as_deref()
            .map(|p| p.to_string_lossy().into_owned()),
        tokens: config.http_tokens.as_deref().map(load_tokens).transpose()?,
    })
}

/// The log line sink for failed attempts (rate-bounded by the service).
fn log_line(line: &str) {
    eprintln!("{line}");
}

/// The checks for every connection the server will serve (it is built with them, before the
/// workers start); `None` when neither file is named.
pub(crate) fn enable(files: Files) -> Option<Auth> {
    if files.users.is_none() && files.tokens.is_none() {
        return None;
    }
    if let Some(users) = &files.users {
        eprintln!(
            "ringstore: auth-file: {} users; memcache connections log in first",
            users.len()
        );
    }
    if let Some(tokens) = &files.tokens {
        eprintln!(
            "ringstore: http-tokens: {} tokens; HTTP requests need a bearer token",
            tokens.len()
        );
    }
    let mut auth = Auth::new(files.users, files.tokens, log_line);
    auth.users_file = files.users_file;
    Some(auth)
}

/// Reads the files `config` names again (SIGHUP, the console) and puts each that parses in
/// force: new logins and requests are checked against it, a memcache connection logged in
/// as a user it no longer has (or whose password changed) is closed (`Session::revoked`,
/// asked by the worker's next tick and before its next request), and an HTTP request
/// whose token it no longer has is 401. Each file on its own: one at fault keeps the one
/// in force, and the log says why on one line. Turning a check on or off needs a restart.
/// `Ok`: what is in force now (one line); `Err`: why a file was not taken (one line).
pub fn reload(shared: &Shared, config: &Config) -> Result<String, String> {
    let Some(auth) = shared.started.auth.as_ref() else {
        return Ok("no --auth-file or --http-tokens: nothing to reload".into());
    };
    let mut outcomes = Vec::new();
    if let (Some(now), Some(path)) = (&auth.users, config.auth_file.as_deref()) {
        let said = |u: &Credentials| format!("auth-file reloaded: {} users", u.len());
        outcomes.push(reload_one(now, path, load_users, said, "users"));
    }
    if let (Some(now), Some(path)) = (&auth.tokens, config.http_tokens.as_deref()) {
        let said = |t: &HttpTokens| format!("http-tokens reloaded: {} tokens", t.len());
        outcomes.push(reload_one(now, path, load_tokens, said, "tokens"));
    }
    for outcome in &outcomes {
        eprintln!("ringstore: {}", outcome.as_ref().unwrap_or_else(|e| e));
    }
    let (done, failed): (Vec<_>, Vec<_>) = outcomes.into_iter().partition(Result::is_ok);
    if failed.is_empty() {
        Ok(done.into_iter().flatten().collect::<Vec<_>>().join("; "))
    } else {
        Err(failed
            .into_iter()
            .filter_map(Result::err)
            .collect::<Vec<_>>()
            .join("; "))
    }
}

/// Reads `path` with `load` and puts it in force in `now`; a file at fault keeps what is in
/// force. The log line: `said` of the new contents, or why (the `kept` in force stay).
fn reload_one<T>(
    now: &Reloadable<T>,
    path: &std::path::Path,
    load: fn(&std::path::Path) -> Result<T, RuntimeError>,
    said: impl Fn(&T) -> String,
    kept: &str,
) -> Result<String, String> {
    match load(path) {
        Ok(new) => {
            let line = said(&new);
            now.replace(new);
            Ok(line)
        }
        Err(e) => Err(format!("{e}; the {kept} in force stay")),
    }
}
