//! `--http-tokens`: each request carries `Authorization: Bearer TOKEN`; a missing or unknown
//! token is 401 with `WWW-Authenticate: Bearer`, a read-only token's PUT or DELETE and any
//! token's request for a key outside its prefix are 403. The token is looked up by its
//! SHA-256 in constant time (`auth.rs`); a 401 is logged at the bounded rate, without the
//! token. On a TLS connection whose client certificate was verified, a request without an
//! `Authorization` field is allowed what the certificate's subject line allows (a request
//! with one is judged by its token alone).

use super::request::connection_field;
use super::*;
use crate::auth::bearer;
use ringstore_tls::Subject;

/// Whether the request in `head` for `key` may go on; `Err` is the status to answer.
pub(super) fn check<B: Backend>(
    backend: &B,
    head: &RequestHead<'_>,
    key: &[u8],
    client: Option<&Subject>,
    now: Now,
) -> Result<(), Status> {
    with_token(backend, head, client, now, |token| {
        let writes = matches!(head.method, Method::Put | Method::Delete);
        if (writes && !token.write) || !key.starts_with(&token.prefix) {
            return Err(Status::Forbidden);
        }
        Ok(())
    })
}

/// Whether `GET /metrics` may be answered: under `--http-tokens`, any token (read or write)
/// whose prefix is empty, i.e. one allowed every key: the series are server-wide, so a
/// token confined to a prefix (one tenant) is refused 403.
pub(super) fn check_metrics<B: Backend>(
    backend: &B,
    head: &RequestHead<'_>,
    client: Option<&Subject>,
    now: Now,
) -> Result<(), Status> {
    with_token(backend, head, client, now, |token| {
        if token.prefix.is_empty() {
            Ok(())
        } else {
            Err(Status::Forbidden)
        }
    })
}

/// Finds the token the request presents (its bearer token, else its verified client
/// certificate's line) and lets `allow` judge it; without `--http-tokens` every request
/// goes on, without a known token it is 401.
fn with_token<B: Backend>(
    backend: &B,
    head: &RequestHead<'_>,
    client: Option<&Subject>,
    now: Now,
    allow: impl FnOnce(&crate::auth::Token) -> Result<(), Status>,
) -> Result<(), Status> {
    let Some(auth) = backend.auth() else {
        return Ok(());
    };
    let Some(tokens) = &auth.tokens else {
        return Ok(());
    };
    let tokens = tokens.get();
    let token = match (head.authorization, client) {
        (Some(field), _) => bearer(field).and_then(|t| tokens.find(t)),
        (None, Some(subject)) => tokens.find_subject(subject),
        (None, None) => None,
    };
    let Some(token) = token else {
        auth.log.failed(now.mono_ms, "HTTP bearer token");
        return Err(Status::Unauthorized);
    };
    allow(token)
}

impl HttpSession {
    /// Answers a refused request: the connection stays open when the request has no body
    /// (nothing to skip), and closes (lingering) when it has one: a refused body is never
    /// read into memory.
    pub(super) fn refuse_access<B: Backend>(
        &mut self,
        backend: &B,
        head: &RequestHead<'_>,
        pos: usize,
        out: &mut Vec<u8>,
        status: Status,
    ) -> Step {
        if status == Status::Unauthorized {
            backend.record(self.worker, Event::AuthFailed);
        }
        if !matches!(head.body, BodyFraming::None) || !head.keep_alive {
            return self.fail(backend, out, status);
        }
        backend.record(self.worker, Event::Response(status));
        write_empty(out, status, connection_field(true, head.version));
        Step::Next(pos)
    }
}
