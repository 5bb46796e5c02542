//! Binary-protocol SASL with `--auth-file` (memcached `-S` with the PLAIN mechanism; the
//! users are the same file as the text login's). Without `--auth-file` every SASL opcode is
//! "Unknown command", as memcached without SASL answers it.
//!
//! Before a login only `SASL list mechs`, `SASL auth`, `SASL step` and `version` are served
//! (memcached's `authenticated()`); anything else is answered "Auth failure." and the
//! connection closed (`binary.rs`). PLAIN is one message, `[authzid] NUL user NUL
//! password`, so a `SASL step` always fails; a failed attempt logs a connection that had
//! logged in out again (checked against memcached 1.6.18 `-S`); an authorization id other than the user's is
//! refused, as Cyrus SASL refuses it without a proxy policy.

use ringstore_proto::memcache::binary::{response, Head, Request, Status};

use super::ascii_auth::check;
use super::Ctx;
use crate::auth::Standing;

/// The one mechanism offered.
const MECHANISMS: &[u8] = b"PLAIN";

/// Requests a connection may send before it logged in.
pub(super) fn allowed_unauthenticated(request: &Request<'_>) -> bool {
    matches!(
        request,
        Request::SaslListMechs
            | Request::Sasl { .. }
            | Request::SaslRefused { .. }
            | Request::Version
            | Request::Error { close: true, .. }
    )
}

fn auth_on(ctx: &Ctx<'_>) -> bool {
    ctx.shared
        .started
        .auth
        .as_ref()
        .is_some_and(|a| a.users.is_some())
}

/// `SASL list mechs`.
pub(super) fn list_mechs(ctx: &Ctx<'_>, out: &mut Vec<u8>, head: Head) {
    if auth_on(ctx) {
        response::text(out, head, MECHANISMS);
    } else {
        response::error(out, head, Status::UnknownCommand);
    }
}

/// A SASL request refused from its lengths.
pub(super) fn refused(ctx: &Ctx<'_>, out: &mut Vec<u8>, head: Head, status: Status) {
    let status = if auth_on(ctx) {
        status
    } else {
        Status::UnknownCommand
    };
    response::error(out, head, status);
}

/// `SASL auth` / `SASL step`: `Some(Some(who))` when the connection is now logged in,
/// `Some(None)` when the attempt failed (`None`: no `--auth-file`, answered "Unknown
/// command").
pub(super) fn auth(
    ctx: &Ctx<'_>,
    out: &mut Vec<u8>,
    head: Head,
    mech: &[u8],
    data: &[u8],
    step: bool,
) -> Option<Option<Box<Standing>>> {
    if !auth_on(ctx) {
        response::error(out, head, Status::UnknownCommand);
        return None;
    }
    let plain = (!step && mech == MECHANISMS)
        .then(|| plain_message(data))
        .flatten();
    let standing = match plain {
        Some((user, pass)) => check(ctx, user, pass, "memcache SASL PLAIN"),
        None => {
            // Counted like a refused password (memcached counts every failed SASL step).
            ctx.stats.auth_cmds.inc();
            ctx.stats.auth_errors.inc();
            if let Some(auth) = ctx.shared.started.auth.as_ref() {
                auth.log.failed(ctx.now.mono_ms, "memcache SASL");
            }
            None
        }
    };
    if standing.is_some() {
        response::text(out, head, b"Authenticated");
    } else {
        response::error(out, head, Status::AuthError);
    }
    Some(standing)
}

/// PLAIN's `[authzid] NUL authcid NUL passwd` as (user, password).
fn plain_message(data: &[u8]) -> Option<(&[u8], &[u8])> {
    let mut parts = data.splitn(3, |&b| b == 0);
    let (authz, user, pass) = (parts.next()?, parts.next()?, parts.next()?);
    (authz.is_empty() || authz == user).then_some((user, pass))
}

#[cfg(test)]
mod tests {
    use super::plain_message;

    #[test]
    fn plain_messages() {
        assert_eq!(
            plain_message(b"\0alice\0secret"),
            Some((&b"alice"[..], &b"secret"[..]))
        );
        assert_eq!(
            plain_message(b"alice\0alice\0secret"),
            Some((&b"alice"[..], &b"secret"[..]))
        );
        assert_eq!(plain_message(b"bob\0alice\0secret"), None);
        assert_eq!(plain_message(b"alice\0secret"), None);
        assert_eq!(plain_message(b""), None);
    }
}
