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
    let allowed = with_token(backend, head, client, now, |token| {
        let writes = matches!(head.method, Method::Put | Method::Delete);
        (token.write || !writes) && key.starts_with(&token.prefix)
    })?;
    match allowed {
        Some(false) => Err(Status::Forbidden),
        Some(true) | None => Ok(()),
    }
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
    match with_token(backend, head, client, now, |token| token.prefix.is_empty())? {
        Some(false) => Err(Status::Forbidden),
        Some(true) | None => Ok(()),
    }
}

/// The key prefix a reading request in `head` may see (empty: every key); `Err` is the
/// status to answer (401 without a known token when `--http-tokens` asks for one).
pub(super) fn read_prefix<B: Backend>(
    backend: &B,
    head: &RequestHead<'_>,
    client: Option<&Subject>,
    now: Now,
) -> Result<Vec<u8>, Status> {
    Ok(with_token(backend, head, client, now, |token| token.prefix.clone())?.unwrap_or_default())
}

/// `f` of the token the request presents; `Ok(None)` when no token is asked for, 401 when
/// one is asked for and none known is presented.
fn with_token<B: Backend, R>(
    backend: &B,
    head: &RequestHead<'_>,
    client: Option<&Subject>,
    now: Now,
    f: impl FnOnce(&crate::auth::Token) -> R,
) -> Result<Option<R>, Status> {
    let Some(auth) = backend.auth() else {
        return Ok(None);
    };
    let Some(tokens) = &auth.tokens else {
        return Ok(None);
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
    Ok(Some(f(token)))
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
