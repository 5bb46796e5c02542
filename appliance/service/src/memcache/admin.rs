//! delete, touch, flush_all, refresh_certs.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use ringstore_proto::memcache::reply;
use ringstore_store::{ReadOpts, Write};

use super::expiry::{expiry, Expiry};
use super::storage::store_error;
use super::Ctx;

pub(crate) fn delete(ctx: &Ctx<'_>, out: &mut Vec<u8>, key: &[u8], noreply: bool) {
    let deleted = ctx
        .store()
        .update(key, ctx.now.store, |item| match item {
            Some(_) => (Write::Delete, true),
            None => (Write::Nothing, false),
        })
        .map(|d| d.result)
        .unwrap_or(false);
    if deleted {
        ctx.stats.delete_hits.inc();
    } else {
        ctx.stats.delete_misses.inc();
    }
    if !noreply {
        reply::line(out, if deleted { "DELETED" } else { "NOT_FOUND" });
    }
}

pub(crate) fn touch(ctx: &Ctx<'_>, out: &mut Vec<u8>, key: &[u8], exptime: i32, noreply: bool) {
    let store = ctx.store();
    let now = ctx.now.store;
    let done = match expiry(i64::from(exptime), ctx.now) {
        Expiry::At(t) => store.try_get(
            key,
            now,
            ReadOpts {
                mark_access: false,
                touch: Some(t),
                see_large: false,
            },
            |item| item.is_some(),
        ),
        Expiry::Expired => store
            .update(key, now, |item| match item {
                Some(_) => (Write::Delete, true),
                None => (Write::Nothing, false),
            })
            .map(|d| d.result),
    };
    ctx.stats.cmd_touch.inc();
    let line = match done {
        Ok(true) => {
            ctx.stats.touch_hits.inc();
            "TOUCHED"
        }
        Ok(false) => {
            ctx.stats.touch_misses.inc();
            "NOT_FOUND"
        }
        // The journal refused the change (a full data device): nothing was touched.
        Err(e) => store_error(&e),
    };
    if !noreply {
        reply::line(out, line);
    }
}

/// memcached's `process_started`: 62 s (`ITEM_UPDATE_INTERVAL` + 2) before the start.
const PROCESS_STARTED_BEFORE_START: i64 = 62;

/// True for a `flush_all` delay memcached 1.6.18 turns into no flush at all: an absolute
/// time at or before its `process_started` (`realtime` gives 1, so `oldest_live` is 0).
/// `flush_all 99999999999` reads as 1215752191 (in 2008) and is one.
fn flushes_nothing(delay: i32, now: crate::Now) -> bool {
    let started = i64::try_from(now.unix).unwrap_or(i64::MAX) - i64::from(now.store);
    let delay = i64::from(delay);
    delay > super::expiry::RELATIVE_LIMIT && delay <= started - PROCESS_STARTED_BEFORE_START
}

pub(crate) fn flush_all(ctx: &Ctx<'_>, out: &mut Vec<u8>, delay: i32, noreply: bool) {
    ctx.stats.cmd_flush.inc();
    if flushes_nothing(delay, ctx.now) {
        if !noreply {
            reply::line(out, "OK");
        }
        return;
    }
    let now = ctx.now.store;
    let at = if delay > 0 {
        match expiry(i64::from(delay), ctx.now) {
            Expiry::At(t) => t,
            Expiry::Expired => now,
        }
    } else {
        now
    };
    match ctx.store().flush_all(now, at) {
        Ok(()) if !noreply => reply::line(out, "OK"),
        Ok(()) => {}
        Err(_) => reply::line(out, "SERVER_ERROR cannot log flush_all to the data device"),
    }
}

/// Least time between two reloads by `refresh_certs`, for the whole server: each reload
/// reads the files and builds the TLS configurations (and drops the resumption caches), and
/// without `--auth-file` any client may send the command.
pub const REFRESH_CERTS_INTERVAL: Duration = Duration::from_secs(1);

/// Reply to `refresh_certs` over UDP, where any spoofed datagram could send it.
pub const REFRESH_CERTS_NOT_OVER_UDP: &str = "CLIENT_ERROR refresh_certs is not accepted over UDP";

/// Reply to a `refresh_certs` within [`REFRESH_CERTS_INTERVAL`] of the last reload.
pub const REFRESH_CERTS_TOO_SOON: &str =
    "Error refreshing certificates: too soon, at most one refresh a second";

/// The server's `refresh_certs` rate limit and counters (`stats`: `tls_cert_refreshes`,
/// `tls_cert_refreshes_refused`).
#[derive(Debug, Default)]
pub struct CertRefreshGate {
    /// When the last admitted reload began, monotonic ms (`None`: never).
    last_ms: Mutex<Option<u64>>,
    /// Reloads `refresh_certs` ran (successful or not).
    pub(crate) done: AtomicU64,
    /// `refresh_certs` refused: over UDP, or within the interval of the last reload.
    pub(crate) refused: AtomicU64,
}

impl CertRefreshGate {
    /// True (and the clock restarted) when a reload may run at `now_ms` (the monotonic time
    /// the runtime passed in); false, counted as refused, within [`REFRESH_CERTS_INTERVAL`]
    /// of the last one.
    pub(crate) fn admit(&self, now_ms: u64) -> bool {
        let interval = u64::try_from(REFRESH_CERTS_INTERVAL.as_millis()).unwrap_or(u64::MAX);
        let mut last = self.last_ms.lock().unwrap_or_else(PoisonError::into_inner);
        if last.is_some_and(|t| now_ms.saturating_sub(t) < interval) {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        *last = Some(now_ms);
        self.done.fetch_add(1, Ordering::Relaxed);
        true
    }
}

/// `refresh_certs`: memcached's replies, `OK` or its error line (`Error TLS not enabled`
/// without a TLS listener). New handshakes use the new certificates; open sessions keep theirs.
/// Refused over UDP (`datagram`), and within a second of the server's last reload: both do
/// no work and answer an error line (unless `noreply`).
pub(crate) fn refresh_certs(ctx: &Ctx<'_>, out: &mut Vec<u8>, noreply: bool, datagram: bool) {
    let gate = &ctx.shared.refresh_certs;
    let reply = match ctx.shared.started.tls.as_ref() {
        _ if datagram => {
            gate.refused.fetch_add(1, Ordering::Relaxed);
            REFRESH_CERTS_NOT_OVER_UDP.to_string()
        }
        None => "Error TLS not enabled".to_string(),
        Some(_) if !gate.admit(ctx.now.mono_ms) => REFRESH_CERTS_TOO_SOON.to_string(),
        Some(tls) => match tls.refresh() {
            Ok(()) => "OK".to_string(),
            Err(e) => format!("Error refreshing certificates: {e}"),
        },
    };
    if !noreply {
        reply::line(out, &reply);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_reload_a_second_for_the_whole_server() {
        let gate = CertRefreshGate::default();
        let t0 = 5_000;
        assert!(gate.admit(t0));
        assert!(!gate.admit(t0));
        assert!(!gate.admit(t0 + 999));
        assert!(gate.admit(t0 + 1000));
        // A refused one does not restart the clock.
        assert!(!gate.admit(t0 + 1500));
        assert!(gate.admit(t0 + 2000));
        let count = |c: &AtomicU64| c.load(Ordering::Relaxed);
        assert_eq!((count(&gate.done), count(&gate.refused)), (3, 3));
    }
}
