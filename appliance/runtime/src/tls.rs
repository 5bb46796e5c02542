//! TLS at the `Handler` seam (docs/adr/0031-tls-rustls-ring-sans-io.md): [`Tls`] wraps the
//! service's handler so every runtime that drives a [`Handler`] serves TLS listeners with no
//! TLS code of its own. A TLS connection's received bytes go through [`ServerTls::read`]; the
//! plaintext goes to the wrapped session, whose output (in a plaintext buffer it sees exactly
//! as it would see the connection's output) is sealed into the connection's output.
//!
//! Bounds: a handshake in progress is charged against `--conn-memory` (rustls' state and its
//! received bytes, [`handshakes`]); when there is no room, the handshake of the worker that
//! has waited longest without progress is dropped for the newcomer. A connection that has
//! sent nothing holds no handshake state. `--tls-handshake-timeout` closes a connection whose
//! handshake is not done that long after its accept ([`Handler::expired`]); the request
//! timeout (and the login gate of `--auth-file`) runs from the end of the handshake, as on a
//! plain connection from its accept.

mod handshakes;

use std::os::fd::BorrowedFd;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use ringstore_service::budget::ConnMemory;
use ringstore_service::zero_copy::Splice;
use ringstore_service::{Device, Flow, Now, Protocol};
use ringstore_tls::{CertStore, ServerTls};

use crate::handler::{Handler, Hooks, Reply, TlsEvent, Wrapped};
use handshakes::{Handshakes, Ticket};

/// Plaintext sealed into the connection's output per send (six 16 KiB records). A bigger
/// reply (a 1 MiB HTTPS GET) is sealed a chunk per send through [`Flow::Drain`], so the
/// output stays under `OUT_RETAIN_MAX` and is reused instead of a whole-reply buffer being
/// allocated and zero-filled for every response; a depth-16 batch of 4 KiB values (66 KiB)
/// still goes out in one send.
const SEAL_CHUNK: usize = 96 << 10;

/// The TLS wrapper around handler `H`.
pub(crate) struct Tls<H> {
    pub inner: H,
    certs: Option<Arc<CertStore>>,
    /// Handshakes in progress, one table per worker (each touched by its worker only).
    handshakes: Box<[Mutex<Handshakes>]>,
    /// `--conn-memory`, which handshakes in progress are charged against.
    budget: Arc<ConnMemory>,
    /// `--tls-handshake-timeout` in ms, from the accept.
    handshake_timeout_ms: u64,
    /// Hand finished sessions to the kernel (the runtime calls [`Handler::after_bytes`]).
    /// Decided once, by the startup probe (`kernel_has_tls`): a hand-over that fails for one
    /// connection keeps that connection in user space and changes nothing for others.
    kernel_offload: bool,
}

impl<H> Tls<H> {
    /// `certs`: `None` when no TLS listener is on (every session is plain).
    /// `kernel_offload`: the runtime calls [`Handler::after_bytes`] after each received
    /// chunk, so finished sessions may go to the kernel (kernel TLS).
    pub(crate) fn new(inner: H, certs: Option<Arc<CertStore>>, setup: TlsSetup) -> Tls<H> {
        Tls {
            inner,
            certs,
            handshakes: (0..setup.workers.max(1) + 1)
                .map(|_| Mutex::new(Handshakes::new()))
                .collect(),
            budget: setup.budget,
            handshake_timeout_ms: setup.handshake_timeout_ms,
            kernel_offload: setup.kernel_offload,
        }
    }

    /// Worker `worker`'s handshakes in progress (uncontended: only that worker locks it).
    fn table(&self, worker: usize) -> MutexGuard<'_, Handshakes> {
        self.handshakes[worker.min(self.handshakes.len() - 1)]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// How [`Tls::new`] bounds and hands over sessions.
pub(crate) struct TlsSetup {
    pub workers: usize,
    pub budget: Arc<ConnMemory>,
    pub handshake_timeout_ms: u64,
    pub kernel_offload: bool,
}

/// A connection's session: the wrapped one, and the TLS state of a TLS connection.
pub(crate) struct TlsSession<S> {
    inner: S,
    tls: Option<Box<TlsState>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Nothing received yet: no handshake state is held (a connection that never sends
    /// costs no handshake memory; the handshake timeout closes it).
    Waiting,
    /// No room for its handshake even after dropping every other: closed at once.
    Refused,
    /// Its handshake state is in its worker's table ([`TlsState::ticket`]).
    Handshaking,
    Open,
    /// Handshake done and nothing held in user space: the session goes to the kernel in
    /// [`Handler::after_bytes`] (its output waits unsealed until then).
    Handover,
    /// The kernel encrypts and decrypts: bytes pass through.
    Kernel,
    Failed,
}

struct TlsState {
    /// The session's TLS state once its handshake is done (during the handshake it lives in
    /// the worker's table, under `ticket`).
    conn: Option<ServerTls>,
    ticket: Option<Ticket>,
    /// Monotonic ms of the accept (the handshake timeout runs from it).
    opened_ms: u64,
    phase: Phase,
    /// An HTTPS connection (ALPN http/1.1).
    https: bool,
    worker: usize,
    /// Plaintext received, for the wrapped session.
    plain_in: Vec<u8>,
    /// The wrapped session's output since the last flush; `sealed` bytes of it are sealed.
    plain_out: Vec<u8>,
    sealed: usize,
    /// The wrapped session's flow, held while `plain_out` has bytes left to seal (the
    /// connection drains them a [`SEAL_CHUNK`] per send before the session is called again).
    held: Option<Flow>,
}

impl<H: Wrapped> Tls<H> {
    /// The first bytes of a handshake arrived: rustls' state in the worker's table (room
    /// made by dropping the handshakes that waited longest), or [`Phase::Refused`].
    fn admit(&self, t: &mut TlsState, now_ms: u64) {
        t.phase = Phase::Refused;
        let Some(certs) = &self.certs else {
            return;
        };
        let Ok(conn) = ServerTls::new(certs.config(t.https)) else {
            return;
        };
        if let Ok(ticket) = self.table(t.worker).admit(conn, &self.budget, now_ms) {
            t.ticket = Some(ticket);
            t.phase = Phase::Handshaking;
        }
    }

    /// Ends the handshake phase of `t` (`ok`: completed), giving back its table entry and
    /// counting.
    fn end_handshake(&self, t: &mut TlsState, ok: bool) {
        if let Some(ticket) = t.ticket.take() {
            self.table(t.worker).remove(ticket);
        }
        if matches!(
            t.phase,
            Phase::Waiting | Phase::Handshaking | Phase::Refused
        ) {
            let event = if ok {
                TlsEvent::Handshake
            } else {
                TlsEvent::HandshakeError
            };
            self.inner.hooks().tls_count(t.worker, event);
        }
        t.phase = if ok { Phase::Open } else { Phase::Failed };
    }

    /// Feeds `input` to `t`'s handshake: `Ok(peer closed)` to go on (the handshake may have
    /// finished: the state moved to `t.conn`), `Err` to close (the alert, if any, in `out`).
    fn handshake(
        &self,
        inner: &mut H::Session,
        t: &mut TlsState,
        input: &[u8],
        now_ms: u64,
        out: &mut Vec<u8>,
    ) -> Result<bool, ()> {
        let mut table = self.table(t.worker);
        let read = match t.ticket.and_then(|ticket| table.get(ticket)) {
            // Dropped for room: its connection closes now.
            None => None,
            Some(conn) => Some(conn.read(input, &mut t.plain_in, out)),
        };
        let (Some(Ok(progress)), Some(ticket)) = (read, t.ticket) else {
            drop(table);
            self.end_handshake(t, false);
            return Err(());
        };
        if !progress.handshake_done {
            let charged = input.is_empty() || table.charge(ticket, &self.budget, now_ms).is_ok();
            drop(table);
            if !charged {
                self.end_handshake(t, false);
                return Err(());
            }
            return Ok(progress.peer_closed);
        }
        let conn = table.remove(ticket);
        drop(table);
        t.ticket = None;
        let Some(conn) = conn else {
            self.end_handshake(t, false);
            return Err(());
        };
        if let Some(der) = conn.peer_certificate() {
            self.inner.client_certificate(inner, der);
        }
        let hand_over = self.kernel_offload && out.is_empty() && conn.can_hand_over();
        t.conn = Some(conn);
        self.end_handshake(t, true);
        if hand_over {
            t.phase = Phase::Handover;
        }
        Ok(progress.peer_closed)
    }

    /// Seals what the wrapped session wrote since the last call, at most `limit` bytes of
    /// it; false on an error.
    fn seal_new(
        &self,
        inner: &H::Session,
        t: &mut TlsState,
        out: &mut Vec<u8>,
        limit: usize,
    ) -> bool {
        debug_assert!(
            self.inner.splices(inner).is_empty(),
            "open_tls sessions copy"
        );
        if self.inner.awaits_durable(inner)
            || t.sealed == t.plain_out.len()
            || t.phase == Phase::Handover
        {
            // A held reply is sealed once the data device released it; a session being
            // handed to the kernel sends its output in the clear (after_bytes).
            return true;
        }
        let Some(conn) = t.conn.as_mut() else {
            return false;
        };
        let end = t.plain_out.len().min(t.sealed.saturating_add(limit));
        let sealed = conn.seal(&t.plain_out[t.sealed..end], out).is_ok();
        t.sealed = end;
        sealed
    }

    /// Seals the next chunk of a reply bigger than [`SEAL_CHUNK`]: [`Flow::Drain`] while
    /// more is left, then the flow the wrapped session returned with it.
    fn seal_held(&self, inner: &H::Session, t: &mut TlsState, out: &mut Vec<u8>) -> Flow {
        if !self.seal_new(inner, t, out, SEAL_CHUNK) {
            t.held = None;
            return Flow::Close;
        }
        if t.sealed < t.plain_out.len() {
            return Flow::Drain;
        }
        let flow = t.held.take().unwrap_or(Flow::Continue);
        if flow == Flow::Close && t.phase == Phase::Open {
            if let Some(conn) = t.conn.as_mut() {
                conn.close_notify(out);
            }
        }
        flow
    }

    fn tls_bytes(
        &self,
        s: &mut TlsSession<H::Session>,
        input: &[u8],
        now: Now,
        device: Option<&dyn Device>,
        out: &mut Vec<u8>,
    ) -> Flow {
        let TlsSession { inner, tls } = s;
        let Some(t) = tls.as_deref_mut() else {
            return Flow::Close;
        };
        if t.phase == Phase::Waiting {
            if input.is_empty() {
                return Flow::Continue;
            }
            self.admit(t, now.mono_ms);
        }
        if t.phase == Phase::Kernel {
            return self.inner.on_bytes(inner, input, now, device, out);
        }
        if t.held.is_some() {
            // Resumed after a drain (no input comes while one is under way).
            debug_assert!(input.is_empty(), "input while a reply is being sealed");
            return self.seal_held(inner, t, out);
        }
        let peer_closed = match (t.phase, t.conn.as_mut()) {
            (Phase::Handshaking, _) => match self.handshake(inner, t, input, now.mono_ms, out) {
                Ok(closed) => closed,
                Err(()) => return Flow::Close,
            },
            (Phase::Open, Some(_)) if input.is_empty() => false,
            (Phase::Open, Some(conn)) => match conn.read(input, &mut t.plain_in, out) {
                Ok(progress) => progress.peer_closed,
                Err(_) => {
                    // The alert is in `out`: sent, then the connection closes.
                    t.phase = Phase::Failed;
                    return Flow::Close;
                }
            },
            _ => {
                self.end_handshake(t, false);
                return Flow::Close;
            }
        };
        if !matches!(t.phase, Phase::Open | Phase::Handover) {
            return if peer_closed {
                Flow::Close
            } else {
                Flow::Continue
            };
        }
        let mut flow = self
            .inner
            .on_bytes(inner, &t.plain_in, now, device, &mut t.plain_out);
        t.plain_in.clear();
        if peer_closed && flow == Flow::Continue {
            flow = Flow::Close;
        }
        if t.phase == Phase::Open
            && t.plain_out.len() - t.sealed > SEAL_CHUNK
            && !self.inner.awaits_durable(inner)
        {
            t.held = Some(flow);
            return self.seal_held(inner, t, out);
        }
        if !self.seal_new(inner, t, out, usize::MAX) {
            return Flow::Close;
        }
        if flow == Flow::Close && t.phase == Phase::Open {
            if let Some(conn) = t.conn.as_mut() {
                conn.close_notify(out);
            }
        }
        flow
    }

    /// [`Handler::after_bytes`] for a session in [`Phase::Handover`]: the keys to the
    /// kernel, or (the kernel refused the ULP for this socket) on in user space. The
    /// refusal is this connection's alone (a peer that reset after its Finished gets
    /// ENOTCONN): counted as a fallback, it changes nothing for other sessions.
    fn hand_over(&self, t: &mut TlsState, fd: BorrowedFd<'_>, out: &mut Vec<u8>) -> bool {
        let installed = crate::sys::install_kernel_tls(fd, || {
            let secrets = t.conn.take()?.into_kernel()?;
            Some((
                kernel_keys(secrets.version, secrets.tx),
                kernel_keys(secrets.version, secrets.rx),
            ))
        });
        match installed {
            Ok(()) => {
                crate::sys::quick_ack(fd);
                t.phase = Phase::Kernel;
                self.inner.hooks().tls_count(t.worker, TlsEvent::KtlsTx);
                self.inner.hooks().tls_count(t.worker, TlsEvent::KtlsRx);
                // What the session wrote since the handshake goes out in the clear: the
                // kernel encrypts it.
                out.extend_from_slice(&t.plain_out[t.sealed..]);
                t.sealed = t.plain_out.len();
                true
            }
            Err(crate::sys::KtlsError::Unavailable(_)) => {
                self.inner
                    .hooks()
                    .tls_count(t.worker, TlsEvent::KtlsFallback);
                t.phase = Phase::Open;
                let Some(conn) = t.conn.as_mut() else {
                    return false;
                };
                let sealed = conn.seal(&t.plain_out[t.sealed..], out).is_ok();
                t.sealed = t.plain_out.len();
                sealed
            }
            Err(e) => {
                // The ULP is on but the keys were not taken: the socket is unusable.
                eprintln!("ringstore: closing a TLS connection: {e}");
                t.phase = Phase::Failed;
                false
            }
        }
    }
}

/// The kernel's form of one direction's secrets.
fn kernel_keys(version: u16, d: ringstore_tls::DirectionSecrets) -> crate::sys::KtlsKeys {
    use crate::sys::KtlsCipher;
    use ringstore_tls::KernelCipher;
    crate::sys::KtlsKeys {
        version,
        cipher: match d.cipher {
            KernelCipher::AesGcm128 => KtlsCipher::AesGcm128,
            KernelCipher::AesGcm256 => KtlsCipher::AesGcm256,
            KernelCipher::Chacha20Poly1305 => KtlsCipher::Chacha20Poly1305,
        },
        key: d.key,
        iv: d.iv,
        seq: d.seq,
    }
}

impl<H: Wrapped> Handler for Tls<H> {
    type Session = TlsSession<H::Session>;
    type Hooks = H::Hooks;
    fn hooks(&self) -> &H::Hooks {
        self.inner.hooks()
    }
    fn open(&self, protocol: Protocol, worker: usize) -> Self::Session {
        TlsSession {
            inner: self.inner.open(protocol, worker),
            tls: None,
        }
    }
    fn open_tls(&self, protocol: Protocol, worker: usize, now_ms: u64) -> Self::Session {
        if self.certs.is_none() {
            return self.open(protocol, worker);
        }
        TlsSession {
            inner: self.inner.open_tls(protocol, worker, now_ms),
            tls: Some(Box::new(TlsState {
                conn: None,
                ticket: None,
                opened_ms: now_ms,
                phase: Phase::Waiting,
                https: protocol == Protocol::Http,
                worker,
                plain_in: Vec::new(),
                plain_out: Vec::new(),
                sealed: 0,
                held: None,
            })),
        }
    }
    #[inline]
    fn on_bytes(
        &self,
        s: &mut Self::Session,
        input: &[u8],
        now: Now,
        device: Option<&dyn Device>,
        out: &mut Vec<u8>,
    ) -> Flow {
        if s.tls.is_none() {
            return self.inner.on_bytes(&mut s.inner, input, now, device, out);
        }
        self.tls_bytes(s, input, now, device, out)
    }
    fn on_durable(&self, s: &mut Self::Session, token: u64, ok: bool, out: &mut Vec<u8>) {
        match s.tls.as_deref_mut() {
            None => self.inner.on_durable(&mut s.inner, token, ok, out),
            // The kernel seals: the reply goes out as it is.
            Some(t) if t.phase == Phase::Kernel => {
                self.inner.on_durable(&mut s.inner, token, ok, out)
            }
            Some(t) => {
                self.inner
                    .on_durable(&mut s.inner, token, ok, &mut t.plain_out);
                // A sealing failure leaves the connection to its next call, which closes it.
                if !self.seal_new(&s.inner, t, out, usize::MAX) {
                    t.phase = Phase::Failed;
                }
            }
        }
    }
    fn awaits_durable(&self, s: &Self::Session) -> bool {
        self.inner.awaits_durable(&s.inner)
    }
    /// During the handshake, false: the handshake has its own deadline ([`Handler::expired`]),
    /// and the request timeout (a login the auth file asks for included) runs from its end.
    fn has_partial_request(&self, s: &Self::Session) -> bool {
        match s.tls.as_deref() {
            Some(t) if !matches!(t.phase, Phase::Open | Phase::Handover | Phase::Kernel) => false,
            Some(t) => {
                t.conn.as_ref().is_some_and(|c| c.buffered() > 0)
                    || self.inner.has_partial_request(&s.inner)
            }
            None => self.inner.has_partial_request(&s.inner),
        }
    }
    /// A handshake not done `--tls-handshake-timeout` after the accept, or dropped from its
    /// worker's table to make room for a newer one; after the handshake, the wrapped
    /// session's own reasons.
    fn expired(&self, s: &mut Self::Session, now_ms: u64) -> bool {
        match s.tls.as_deref() {
            Some(t)
                if matches!(
                    t.phase,
                    Phase::Waiting | Phase::Handshaking | Phase::Refused
                ) =>
            {
                now_ms.saturating_sub(t.opened_ms) >= self.handshake_timeout_ms
                    || t.ticket.is_some_and(|k| !self.table(t.worker).holds(k))
            }
            _ => self.inner.expired(&mut s.inner, now_ms),
        }
    }
    fn splices<'s>(&self, s: &'s Self::Session) -> &'s [Splice] {
        match s.tls.as_deref() {
            // Kernel TLS seals what the worker sends, values sent from the item included.
            Some(t) if t.phase == Phase::Kernel => self.inner.splices(&s.inner),
            Some(_) => &[],
            None => self.inner.splices(&s.inner),
        }
    }
    fn output_flushed(&self, s: &mut Self::Session) {
        if let Some(t) = s.tls.as_deref_mut() {
            if t.sealed < t.plain_out.len() {
                // Sealed chunks went out; the rest of the reply follows (the drain).
                return;
            }
            t.plain_out.clear();
            t.sealed = 0;
        }
        self.inner.output_flushed(&mut s.inner);
    }
    fn peer_known(&self, s: &mut Self::Session, peer: std::net::SocketAddr) {
        self.inner.peer_known(&mut s.inner, peer);
    }
    /// A `watch` session's log lines: sealed like any other output (in the clear once the
    /// kernel holds the keys); nothing while the handshake is under way.
    fn poll_output(&self, s: &mut Self::Session, out: &mut Vec<u8>) -> bool {
        let TlsSession { inner, tls } = s;
        let Some(t) = tls.as_deref_mut() else {
            return self.inner.poll_output(inner, out);
        };
        match t.phase {
            Phase::Kernel => self.inner.poll_output(inner, out),
            Phase::Open => {
                if !self.inner.poll_output(inner, &mut t.plain_out) {
                    return false;
                }
                // A failed seal leaves the bytes unsent; the next read closes the session.
                let _ = self.seal_new(inner, t, out, usize::MAX);
                !out.is_empty()
            }
            _ => false,
        }
    }
    fn session_closed(&self, s: &mut Self::Session, device: Option<&dyn Device>) {
        if let Some(t) = s.tls.as_deref_mut() {
            match t.phase {
                Phase::Handshaking | Phase::Refused => self.end_handshake(t, false),
                // Never sent a byte: not a handshake (memcached counts none either).
                Phase::Waiting => t.phase = Phase::Failed,
                Phase::Open | Phase::Handover | Phase::Kernel | Phase::Failed => {}
            }
        }
        self.inner.session_closed(&mut s.inner, device);
    }
    fn udp_request(
        &self,
        worker: usize,
        request: &[u8],
        now: Now,
        device: Option<&dyn Device>,
        out: &mut Reply,
    ) -> Option<Self::Session> {
        self.inner
            .udp_request(worker, request, now, device, out)
            .map(|inner| TlsSession { inner, tls: None })
    }
    fn after_bytes(&self, s: &mut Self::Session, fd: BorrowedFd<'_>, out: &mut Vec<u8>) -> bool {
        match s.tls.as_deref_mut() {
            Some(t) if t.phase == Phase::Handover => {
                let ok = self.hand_over(t, fd, out);
                if ok && t.phase == Phase::Kernel {
                    self.inner.kernel_tls_on(&mut s.inner);
                }
                ok
            }
            _ => true,
        }
    }
}

/// The certificates of `config`'s TLS listeners, read now; `None` when none is on.
/// `kernel_tls`: sessions will be handed to the kernel (it has TLS and the runtime offloads).
pub(crate) fn load_certs(
    config: &ringstore_config::Config,
    kernel_tls: bool,
) -> Result<Option<Arc<CertStore>>, ringstore_tls::TlsError> {
    let tls = &config.tls;
    let (true, Some(cert), Some(key)) = (tls.enabled(), &tls.cert, &tls.key) else {
        return Ok(None);
    };
    let settings = ringstore_tls::Settings {
        cert: cert.clone(),
        key: key.clone(),
        ca: tls.ca.clone(),
        verify: match tls.verify {
            ringstore_config::TlsVerify::None => ringstore_tls::Verify::None,
            ringstore_config::TlsVerify::Request => ringstore_tls::Verify::Request,
            ringstore_config::TlsVerify::Require => ringstore_tls::Verify::Require,
        },
        min_version: if tls.min_tls13 {
            ringstore_tls::MinVersion::Tls13
        } else {
            ringstore_tls::MinVersion::Tls12
        },
        kernel_tls,
    };
    CertStore::load(settings).map(|c| Some(Arc::new(c)))
}

/// The certificates as the service sees them (`refresh_certs`, the TLS stats).
pub(crate) struct CertControl(pub Arc<CertStore>);

impl ringstore_service::TlsControl for CertControl {
    fn refresh(&self) -> Result<(), String> {
        let result = self
            .0
            .reload()
            .map_err(|e| e.to_string().replace(['\r', '\n'], " "));
        match &result {
            Ok(()) => eprintln!("ringstore: tls certificates reloaded"),
            Err(e) => {
                eprintln!("ringstore: tls certificates not reloaded (the old ones stay): {e}")
            }
        }
        result
    }
    fn secs_since_refresh(&self) -> u64 {
        self.0.secs_since_refresh()
    }
    fn settings(&self) -> ringstore_service::TlsSettings {
        let s = self.0.settings();
        ringstore_service::TlsSettings {
            chain_cert: s.cert.to_string_lossy().into_owned(),
            key: s.key.to_string_lossy().into_owned(),
            ca_cert: s.ca.as_ref().map(|p| p.to_string_lossy().into_owned()),
            verify_mode: match s.verify {
                ringstore_tls::Verify::None => 0,
                ringstore_tls::Verify::Request => 1,
                ringstore_tls::Verify::Require => 3,
            },
            min_version: match s.min_version {
                ringstore_tls::MinVersion::Tls12 => "tlsv1.2",
                ringstore_tls::MinVersion::Tls13 => "tlsv1.3",
            },
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A server config on a throwaway self-signed certificate (made by the `openssl` CLI).
    pub(crate) fn server_config() -> Arc<ringstore_tls::ServerConfig> {
        static CERTS: std::sync::OnceLock<(tempfile::TempDir, Arc<CertStore>)> =
            std::sync::OnceLock::new();
        let (_, store) = CERTS.get_or_init(|| {
            let dir = tempfile::tempdir().expect("a temporary directory");
            let status = std::process::Command::new("openssl")
                .args([
                    "req",
                    "-x509",
                    "-newkey",
                    "ec",
                    "-pkeyopt",
                    "ec_paramgen_curve:P-256",
                ])
                .args([
                    "-nodes", "-keyout", "key.pem", "-out", "cert.pem", "-days", "2",
                ])
                .args(["-subj", "/CN=localhost"])
                .current_dir(dir.path())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status()
                .expect("openssl runs");
            assert!(status.success(), "openssl made the certificate");
            let store = CertStore::load(ringstore_tls::Settings {
                cert: dir.path().join("cert.pem"),
                key: dir.path().join("key.pem"),
                ca: None,
                verify: ringstore_tls::Verify::None,
                min_version: ringstore_tls::MinVersion::Tls12,
                kernel_tls: false,
            })
            .expect("the certificate loads");
            (dir, Arc::new(store))
        });
        store.config(false)
    }

    /// The worker-level hooks of a TLS-wrapped handler are the wrapped handler's own, reached
    /// without going through the wrapper (issue 37: the wrapper forwards only what it changes).
    #[test]
    fn the_hooks_of_the_wrapper_are_the_wrapped_handlers() {
        use crate::handler::echo::Echo;
        use std::sync::atomic::Ordering::Relaxed;
        let tls = Tls::new(
            Echo::default(),
            None,
            TlsSetup {
                workers: 1,
                budget: ConnMemory::new(1 << 20),
                handshake_timeout_ms: 1000,
                kernel_offload: false,
            },
        );
        assert!(std::ptr::eq(tls.hooks(), &tls.inner));
        tls.hooks().conn_opened(0);
        tls.hooks().conn_refused();
        assert_eq!(tls.inner.opened.load(Relaxed), 1);
        assert_eq!(tls.inner.refused.load(Relaxed), 1);
    }
}
