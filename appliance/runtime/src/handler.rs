//! The seam between the I/O loop and what a connection's or a datagram's bytes mean: the
//! real service (sans-IO sessions over the shared store) or, in tests, a tiny echo. This is
//! the one place where the runtime meets the service: connections, every datapath backend's
//! request datagrams (kernel UDP, AF_XDP, ExaNIC: [`Handler::udp_request`]) and their counters.

use std::sync::Arc;

use ringstore_service::zero_copy::Splice;
use ringstore_service::{Device, Flow, Now, Protocol, Session, Shared};

/// memcache over UDP's rules (a session per datagram, a mark per response, the reply cap)
/// are the service's (`ringstore_service::memcache::udp`).
pub use ringstore_service::memcache::udp::{Reply, REPLY_MAX};

/// What a worker calls for each connection's (or held datagram's) session. Monomorphised: no
/// dynamic dispatch per request. A wrapper (the TLS one, [`crate::tls::Tls`]) implements
/// this trait, changing what it changes; the worker-level hooks it leaves alone are reached
/// through [`Handler::hooks`], never through the wrapper.
pub(crate) trait Handler: Send + Sync + 'static {
    type Session;
    /// The worker-level counters and store hooks (the same for every wrapper of a handler).
    type Hooks: Hooks;
    fn hooks(&self) -> &Self::Hooks;
    fn open(&self, protocol: Protocol, worker: usize) -> Self::Session;
    /// A session for a connection of a TLS listener (ADR 0031). For the TLS wrapper
    /// ([`crate::tls::Tls`]) a session that decrypts and seals; for the handler it wraps, a
    /// session whose output is all in `out` (no [`Handler::splices`]: it gets sealed). The
    /// default: [`Handler::open`]. `now_ms`: the accept's monotonic time (the handshake
    /// timeout runs from it).
    fn open_tls(&self, protocol: Protocol, worker: usize, now_ms: u64) -> Self::Session {
        let _ = now_ms;
        self.open(protocol, worker)
    }
    /// Whether the session has its own reason to close at `now_ms`: a TLS handshake too slow
    /// or dropped for room, a memcache login that a reload of the users file took away. The
    /// worker's tick closes the connection, as it does one past the request or idle timeout
    /// ([`crate::connection::Conn::closed_by_tick`]). The default: never.
    fn expired(&self, session: &mut Self::Session, now_ms: u64) -> bool {
        let _ = (session, now_ms);
        false
    }
    /// `device`: the worker's data device for this connection, when one is attached.
    fn on_bytes(
        &self,
        session: &mut Self::Session,
        input: &[u8],
        now: Now,
        device: Option<&dyn Device>,
        out: &mut Vec<u8>,
    ) -> Flow;
    /// The data device settled `token`, a record `session` staged (durable when `ok`).
    fn on_durable(&self, session: &mut Self::Session, token: u64, ok: bool, out: &mut Vec<u8>) {
        let _ = (session, token, ok, out);
    }
    /// True while `session` holds a reply until the data device settles its records; the
    /// worker then feeds it no input and sends nothing until [`Handler::on_durable`] released it.
    fn awaits_durable(&self, session: &Self::Session) -> bool {
        let _ = session;
        false
    }
    fn has_partial_request(&self, session: &Self::Session) -> bool;
    /// Where the next receive of `session`'s connection goes instead of a receive buffer: a
    /// storage value's missing bytes in its reserved item (their first byte and how many,
    /// issue 38), or `None`. The range stays valid and untouched by anything else until
    /// the session is next called or closed, which the worker does only once no receive
    /// into it is in flight; what arrived there is reported with [`Handler::received_into`].
    fn recv_target(&self, session: &Self::Session) -> Option<(*mut u8, usize)> {
        let _ = session;
        None
    }
    /// `n` bytes were received at [`Handler::recv_target`]; what the connection does next
    /// ([`Flow::Drain`]: they made the request whole, call the session to answer it).
    fn received_into(&self, session: &mut Self::Session, n: usize) -> Flow {
        let _ = (session, n);
        Flow::Continue
    }
    /// Values to send from the item, spliced into the output at their offsets; their bytes
    /// stay valid until [`Handler::output_flushed`] or [`Handler::session_closed`], which the
    /// worker calls only once no send reading them is in flight.
    fn splices<'s>(&self, session: &'s Self::Session) -> &'s [Splice] {
        let _ = session;
        &[]
    }
    /// Every output byte of `session` has been sent.
    fn output_flushed(&self, session: &mut Self::Session) {
        let _ = session;
    }
    /// Output a session produces without input (memcached's `watch` log lines), appended
    /// to `out`; true when it appended any. The worker calls it on its tick for each
    /// connection with no output pending and no send in flight.
    fn poll_output(&self, session: &mut Self::Session, out: &mut Vec<u8>) -> bool {
        let _ = (session, out);
        false
    }
    /// The peer of the connection `session` was just opened for (memcached's `watch
    /// connevents`); called by both runtimes right after [`Handler::open`].
    fn peer_known(&self, session: &mut Self::Session, peer: std::net::SocketAddr) {
        let _ = (session, peer);
    }
    /// The connection of `session` is gone (before [`Hooks::conn_closed`]).
    fn session_closed(&self, session: &mut Self::Session, device: Option<&dyn Device>) {
        let _ = (session, device);
    }
    /// One memcache request datagram (the frame header already taken off), served on
    /// `worker`: the reply is left in `out`. `Some(session)` when the reply is held until the
    /// data device settles the request's records: the caller keeps the session, reports
    /// settled tokens with [`Handler::on_durable`] and sends its output, bounded by
    /// [`Hooks::udp_bound_reply`], once [`Handler::awaits_durable`] is false. The default
    /// echoes the request (tests).
    fn udp_request(
        &self,
        worker: usize,
        request: &[u8],
        now: Now,
        device: Option<&dyn Device>,
        out: &mut Reply,
    ) -> Option<Self::Session> {
        let _ = (worker, now, device);
        out.clear();
        out.bytes.extend_from_slice(request);
        None
    }
    /// Called by the worker right after [`Handler::on_bytes`] of received bytes, with the
    /// connection's socket and output, before anything of that output is sent and with no
    /// receive in flight: where a TLS session can go to the kernel (kernel TLS), the TLS
    /// wrapper installs its keys on `fd` now and puts what the session wrote in `out`, in
    /// the clear, for the kernel to encrypt. False: close the connection.
    fn after_bytes(
        &self,
        session: &mut Self::Session,
        fd: std::os::fd::BorrowedFd<'_>,
        out: &mut Vec<u8>,
    ) -> bool {
        let _ = (session, fd, out);
        true
    }
}

/// What the TLS wrapper ([`crate::tls::Tls`]) tells the handler it wraps about a session's
/// TLS; nothing else calls these (a wrapper needs not implement them).
pub(crate) trait Wrapped: Handler {
    /// The TLS wrapper verified the client certificate `der` of `session`'s connection
    /// (against `--tls-ca`) when its handshake completed.
    fn client_certificate(&self, session: &mut Self::Session, der: &[u8]) {
        let _ = (session, der);
    }
    /// `session`'s TLS went to the kernel: from now on its output is sent as a plain
    /// session's is, big values from the item included.
    fn kernel_tls_on(&self, session: &mut Self::Session) {
        let _ = session;
    }
}

/// The worker-level hooks: connection and datagram counters, and the store's background
/// steps. Reached through [`Handler::hooks`] (statically dispatched), so a wrapper of the
/// handler does not forward them.
pub(crate) trait Hooks: Send + Sync + 'static {
    fn conn_opened(&self, worker: usize);
    fn conn_closed(&self, worker: usize);
    fn conn_refused(&self);
    /// Background expiry step, called about once a second by one worker.
    fn reclaim(&self, now: Now);
    /// Drops the RAM copy of a write whose data-device write failed (if still that write).
    fn forget_if_cas(&self, key: &[u8], cas: u64, now: Now) {
        let _ = (key, cas, now);
    }
    /// Bounds a held UDP reply released by the data device (see [`Handler::udp_request`]).
    fn udp_bound_reply(&self, request: &[u8], out: &mut Vec<u8>) {
        let _ = (request, out);
    }
    /// Counts `n` memcache UDP events of one kind on `worker`'s slot.
    fn udp_count(&self, worker: usize, event: UdpEvent, n: u64) {
        let _ = (worker, event, n);
    }
    /// Counts one TLS event on `worker`'s slot (the TLS wrapper counts its handshakes here).
    fn tls_count(&self, worker: usize, event: TlsEvent) {
        let _ = (worker, event);
    }
}

/// What [`Hooks::tls_count`] counts (memcache `stats`: `tls_handshakes`,
/// `tls_handshake_errors`, `tls_ktls_tx`, `tls_ktls_rx`, `tls_ktls_fallbacks`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TlsEvent {
    Handshake,
    HandshakeError,
    KtlsTx,
    KtlsRx,
    /// The kernel refused one finished session's hand-over: it stays in user space.
    KtlsFallback,
}

/// What [`Hooks::udp_count`] counts (memcache `stats`: `udp_rx_datagrams`,
/// `udp_tx_datagrams`, `udp_dropped`, `udp_held_full`; AF_XDP's frame counters `xdp_rx`,
/// `xdp_tx`, `xdp_drop`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum UdpEvent {
    Rx,
    Tx,
    Dropped,
    /// Dropped because the held table was full (counted as `Dropped` too).
    HeldFull,
    /// Frames an AF_XDP socket received.
    XdpRx,
    /// Frames an AF_XDP socket transmitted.
    XdpTx,
    /// Frames an AF_XDP socket dropped.
    XdpDrop,
}

/// The production handler: [`Session`]s executing against [`Shared`].
pub(crate) struct ServiceHandler(pub Arc<Shared>);

/// Expired items reclaimed per reaper step (bounded so one tick never stalls a worker).
const RECLAIM_BUDGET: usize = 1000;
/// Seconds an item stays expired before the reaper takes it. A request in that window
/// finds it expired and memcache `stats` counts it (`get_expired`), as memcached counts the
/// expired items its LRU crawler has not reclaimed yet; no read ever sees such an item,
/// and eviction takes it sooner when memory is needed.
const REAP_GRACE_SECS: u32 = 60;

impl Handler for ServiceHandler {
    type Session = Session;
    type Hooks = ServiceHandler;
    fn hooks(&self) -> &ServiceHandler {
        self
    }
    fn open(&self, protocol: Protocol, worker: usize) -> Session {
        // Connections (TCP) send big GET values from the item; UDP sessions copy.
        let mut session = Session::for_connection(protocol, worker, &self.0);
        session.enable_zero_copy();
        session
    }
    /// TLS output is sealed from `out`: values are copied into it, not sent from the item.
    /// Otherwise the session a plain connection gets: with `--auth-file` it must log in,
    /// timed from the end of the handshake (the TLS wrapper reports no partial request
    /// until then).
    fn open_tls(&self, protocol: Protocol, worker: usize, _now_ms: u64) -> Session {
        Session::for_connection(protocol, worker, &self.0)
    }
    #[inline]
    fn on_bytes(
        &self,
        session: &mut Session,
        input: &[u8],
        now: Now,
        device: Option<&dyn Device>,
        out: &mut Vec<u8>,
    ) -> Flow {
        session.on_bytes(input, now, &self.0, device, out)
    }
    fn on_durable(&self, session: &mut Session, token: u64, ok: bool, out: &mut Vec<u8>) {
        session.on_durable(token, ok, &self.0, out)
    }
    fn awaits_durable(&self, session: &Session) -> bool {
        session.awaits_durable()
    }
    fn has_partial_request(&self, session: &Session) -> bool {
        session.has_partial_request()
    }
    #[inline]
    fn recv_target(&self, session: &Session) -> Option<(*mut u8, usize)> {
        session.recv_target()
    }
    fn received_into(&self, session: &mut Session, n: usize) -> Flow {
        session.received_into(n, &self.0)
    }
    fn splices<'s>(&self, session: &'s Session) -> &'s [Splice] {
        session.splices()
    }
    fn output_flushed(&self, session: &mut Session) {
        session.on_output_flushed();
        session.release_output(&self.0);
    }
    fn poll_output(&self, session: &mut Session, out: &mut Vec<u8>) -> bool {
        session.poll_output(&self.0, out)
    }
    fn peer_known(&self, session: &mut Session, peer: std::net::SocketAddr) {
        session.peer_known(&self.0, peer);
    }
    /// A memcache login as a user the reloaded users file no longer has.
    fn expired(&self, session: &mut Session, _now_ms: u64) -> bool {
        session.revoked(&self.0)
    }
    fn session_closed(&self, session: &mut Session, device: Option<&dyn Device>) {
        session.on_close(&self.0, device);
    }
    /// memcached's rules: `ringstore_service::memcache::udp::serve`.
    fn udp_request(
        &self,
        worker: usize,
        request: &[u8],
        now: Now,
        device: Option<&dyn Device>,
        reply: &mut Reply,
    ) -> Option<Session> {
        ringstore_service::memcache::udp::serve(&self.0, worker, request, now, device, reply)
    }
}

impl Wrapped for ServiceHandler {
    fn client_certificate(&self, session: &mut Session, der: &[u8]) {
        session.client_certificate(der);
    }
    fn kernel_tls_on(&self, session: &mut Session) {
        session.enable_zero_copy();
    }
}

impl Hooks for ServiceHandler {
    fn conn_opened(&self, worker: usize) {
        self.0.conn_opened(worker)
    }
    fn conn_closed(&self, worker: usize) {
        self.0.conn_closed(worker)
    }
    fn conn_refused(&self) {
        self.0.conn_refused()
    }
    fn reclaim(&self, now: Now) {
        self.0
            .store
            .reclaim_expired(now.store.saturating_sub(REAP_GRACE_SECS), RECLAIM_BUDGET);
    }
    fn forget_if_cas(&self, key: &[u8], cas: u64, now: Now) {
        self.0.store.forget_if_cas(key, cas, now.store);
    }
    fn udp_bound_reply(&self, request: &[u8], out: &mut Vec<u8>) {
        ringstore_service::memcache::udp::bound_reply(request, out);
    }
    #[inline]
    fn udp_count(&self, worker: usize, event: UdpEvent, n: u64) {
        let stats = self.0.stats(worker);
        match event {
            UdpEvent::Rx => stats.udp_rx_datagrams.add(n),
            UdpEvent::Tx => stats.udp_tx_datagrams.add(n),
            UdpEvent::Dropped => stats.udp_dropped.add(n),
            UdpEvent::HeldFull => {
                stats.udp_dropped.add(n);
                stats.udp_held_full.add(n);
            }
            UdpEvent::XdpRx => stats.xdp_rx.add(n),
            UdpEvent::XdpTx => stats.xdp_tx.add(n),
            UdpEvent::XdpDrop => stats.xdp_drop.add(n),
        }
    }
    fn tls_count(&self, worker: usize, event: TlsEvent) {
        let stats = self.0.stats(worker);
        match event {
            TlsEvent::Handshake => stats.tls_handshakes.inc(),
            TlsEvent::HandshakeError => stats.tls_handshake_errors.inc(),
            TlsEvent::KtlsTx => stats.tls_ktls_tx.inc(),
            TlsEvent::KtlsRx => stats.tls_ktls_rx.inc(),
            TlsEvent::KtlsFallback => stats.tls_ktls_fallbacks.inc(),
        }
    }
}

#[cfg(test)]
pub(crate) mod echo {
    //! A line echo for testing the I/O paths without the service: each complete line is
    //! echoed; `quit` closes; `big N` replies N bytes (to exercise Drain and short sends);
    //! `into N` takes the next N bytes as a value received into memory of the session's
    //! own (as a storage value is received into its item: [`Handler::recv_target`]) and
    //! replies `into N <sum of its bytes>`.
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[derive(Default)]
    pub(crate) struct Echo {
        pub opened: AtomicUsize,
        pub closed: AtomicUsize,
        pub refused: AtomicUsize,
        pub reclaims: AtomicUsize,
        /// Bytes the runtime received straight into `into` values.
        pub received_into: AtomicUsize,
    }

    pub(crate) struct EchoSession {
        partial: Vec<u8>,
        pending_big: usize,
        /// An `into N` value: its bytes and how many have arrived.
        into: Option<(Box<[u8]>, usize)>,
        /// Bytes of `into` values that went through `on_bytes` (copied) rather than into them.
        pub copied: usize,
        /// The `into` values completed so far, oldest first (at most [`KEPT_VALUES`]: the
        /// property tests compare them byte for byte).
        pub whole: std::collections::VecDeque<Box<[u8]>>,
    }

    /// Completed `into` values a session keeps for inspection.
    pub(crate) const KEPT_VALUES: usize = 8;

    impl EchoSession {
        /// Copies what `partial` holds of an `into` value into it; once whole, replies.
        fn fill_into(&mut self, out: &mut Vec<u8>) {
            let Some((value, filled)) = &mut self.into else {
                return;
            };
            let n = (value.len() - *filled).min(self.partial.len());
            value[*filled..*filled + n].copy_from_slice(&self.partial[..n]);
            self.partial.drain(..n);
            *filled += n;
            self.copied += n;
            if *filled == value.len() {
                let sum: u64 = value.iter().map(|&b| u64::from(b)).sum();
                out.extend_from_slice(format!("into {} {sum}\n", value.len()).as_bytes());
                if let Some((value, _)) = self.into.take() {
                    if self.whole.len() == KEPT_VALUES {
                        self.whole.pop_front();
                    }
                    self.whole.push_back(value);
                }
            }
        }
    }

    const HIGH_WATER: usize = 64 << 10;

    impl Handler for Echo {
        type Session = EchoSession;
        type Hooks = Echo;
        fn hooks(&self) -> &Echo {
            self
        }
        fn open(&self, _: Protocol, _: usize) -> EchoSession {
            EchoSession {
                partial: Vec::new(),
                pending_big: 0,
                into: None,
                copied: 0,
                whole: std::collections::VecDeque::new(),
            }
        }
        fn on_bytes(
            &self,
            s: &mut EchoSession,
            input: &[u8],
            _: Now,
            _: Option<&dyn Device>,
            out: &mut Vec<u8>,
        ) -> Flow {
            s.partial.extend_from_slice(input);
            loop {
                s.fill_into(out);
                if s.into.is_some() {
                    return Flow::Continue;
                }
                while s.pending_big > 0 {
                    if out.len() >= HIGH_WATER {
                        return Flow::Drain;
                    }
                    let n = s.pending_big.min(4096);
                    out.extend(std::iter::repeat_n(b'x', n));
                    s.pending_big -= n;
                    if s.pending_big == 0 {
                        out.extend_from_slice(b"\r\n");
                    }
                }
                let Some(pos) = s.partial.iter().position(|&b| b == b'\n') else {
                    return Flow::Continue;
                };
                let line: Vec<u8> = s.partial.drain(..=pos).collect();
                let text = String::from_utf8_lossy(&line).trim().to_string();
                if text == "quit" {
                    return Flow::Close;
                }
                if let Some(n) = text
                    .strip_prefix("into ")
                    .and_then(|n| n.parse::<usize>().ok())
                {
                    s.into = Some((vec![0u8; n].into_boxed_slice(), 0));
                    continue;
                }
                if let Some(n) = text
                    .strip_prefix("big ")
                    .and_then(|n| n.parse::<usize>().ok())
                {
                    s.pending_big = n;
                    continue;
                }
                out.extend_from_slice(&line);
            }
        }
        fn has_partial_request(&self, s: &EchoSession) -> bool {
            !s.partial.is_empty() || s.into.is_some()
        }
        fn recv_target(&self, s: &EchoSession) -> Option<(*mut u8, usize)> {
            let (value, filled) = s.into.as_ref()?;
            let left = value.len() - filled;
            (left > 0).then(|| (value.as_ptr().cast_mut().wrapping_add(*filled), left))
        }
        fn received_into(&self, s: &mut EchoSession, n: usize) -> Flow {
            self.received_into.fetch_add(n, Ordering::Relaxed);
            let Some((value, filled)) = &mut s.into else {
                panic!("{n} bytes received into no value");
            };
            *filled += n;
            // Whole: the reply goes out with the next input (as the service's does once the
            // value's `\r\n` arrives).
            assert!(*filled <= value.len(), "received past the value");
            Flow::Continue
        }
    }

    impl Wrapped for Echo {}

    impl Hooks for Echo {
        fn conn_opened(&self, _: usize) {
            self.opened.fetch_add(1, Ordering::Relaxed);
        }
        fn conn_closed(&self, _: usize) {
            self.closed.fetch_add(1, Ordering::Relaxed);
        }
        fn conn_refused(&self) {
            self.refused.fetch_add(1, Ordering::Relaxed);
        }
        fn reclaim(&self, _: Now) {
            self.reclaims.fetch_add(1, Ordering::Relaxed);
        }
    }
}
