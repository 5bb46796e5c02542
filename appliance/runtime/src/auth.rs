//! `--auth-file` and `--http-tokens` on the server: read at start (a file at fault refuses
//! the start) and again by [`reload`] (SIGHUP, the console); the sessions do the checks.

use ringstore_config::Config;
use ringstore_service::auth::{Auth, Credentials, HttpTokens, AUTH_FILE_MAX};
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

/// Turns the checks on for every connection `shared` will serve (before the workers start).
pub(crate) fn enable(shared: &Shared, files: Files) {
    if files.users.is_none() && files.tokens.is_none() {
        return;
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
    let _ = shared.auth.set(auth);
}

/// Reads the files `config` names again and puts them in force for new logins and new
/// requests (connections already logged in stay so). For SIGHUP and the console: a file at
/// fault keeps what was in force and returns why; turning a check on or off needs a
/// restart. `Ok(false)`: the server runs with neither file.
pub fn reload(shared: &Shared, config: &Config) -> Result<bool, RuntimeError> {
    let Some(auth) = shared.auth.get() else {
        return Ok(false);
    };
    let files = load(config)?;
    if let (Some(now), Some(new)) = (&auth.users, files.users) {
        eprintln!("ringstore: auth-file reloaded: {} users", new.len());
        now.replace(new);
    }
    if let (Some(now), Some(new)) = (&auth.tokens, files.tokens) {
        eprintln!("ringstore: http-tokens reloaded: {} tokens", new.len());
        now.replace(new);
    }
    Ok(true)
}
