//! Per-worker counters: one cache-line padded slot per worker, written only by its owner.
//!
//! An increment is a relaxed load and store (no locked read-modify-write): the owning
//! worker is the only writer, readers (`stats`) tolerate a value that is a moment old.
//! If another thread ever wrote the same slot, counts could be lost, never corrupted.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// How the server was started, beyond [`crate::ServiceConfig`]: what memcache `stats
/// settings` reports as memcached's `tcpport`, `udpport`, `inter`, `idle_timeout`,
/// `tcp_backlog` and `ssl_kernel_tls`. Set once by the runtime after its listeners are
/// bound; unset (a service without a runtime, as in unit tests), those lines say "off".
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StartSettings {
    /// The memcache TCP listener's bound address; `None`: no memcache TCP listener.
    pub memcache: Option<SocketAddr>,
    /// The memcache UDP socket's bound address; `None`: UDP off.
    pub udp: Option<SocketAddr>,
    /// `--idle-timeout` in seconds (0: never).
    pub idle_timeout_secs: u64,
    /// The listen backlog of the TCP listeners.
    pub tcp_backlog: u32,
    /// TLS sessions are handed to kernel TLS where they can be (the start's probe).
    pub kernel_tls: bool,
}

/// One counter of a [`WorkerStats`] slot.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Adds one (owner thread only).
    #[inline]
    pub fn inc(&self) {
        self.add(1);
    }

    /// Adds `n` (owner thread only).
    #[inline]
    pub fn add(&self, n: u64) {
        self.0.store(self.0.load(Relaxed).wrapping_add(n), Relaxed);
    }

    /// The current value.
    pub fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }
}

macro_rules! counters {
    ($($(#[$doc:meta])* $name:ident),* $(,)?) => {
        /// The counters of one worker. Padded to two cache lines' alignment so neighbouring
        /// workers never share a line.
        #[derive(Debug, Default)]
        #[repr(align(128))]
        pub struct WorkerStats {
            $($(#[$doc])* pub $name: Counter,)*
        }

        /// Counters summed over every worker.
        #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
        pub struct StatsTotals {
            $($(#[$doc])* pub $name: u64,)*
            /// Connections refused at the limit (from [`crate::Shared::conn_refused`]).
            pub rejected_connections: u64,
            /// Look-ups that found their item expired (the store counts them: it is what
            /// finds an item expired; memcached `get_expired`).
            pub get_expired: u64,
            /// Look-ups of a key a flush_all removed (from the store; memcached `get_flushed`).
            pub get_flushed: u64,
        }

        impl StatsTotals {
            pub(crate) fn add(&mut self, s: &WorkerStats) {
                $(self.$name = self.$name.wrapping_add(s.$name.get());)*
            }

            pub(crate) fn since(&self, base: &StatsTotals) -> StatsTotals {
                StatsTotals {
                    $($name: self.$name.wrapping_sub(base.$name),)*
                    rejected_connections: self.rejected_connections.wrapping_sub(base.rejected_connections),
                    get_expired: self.get_expired.wrapping_sub(base.get_expired),
                    get_flushed: self.get_flushed.wrapping_sub(base.get_flushed),
                }
            }
        }
    };
}

counters! {
    /// Connections accepted (memcached `total_connections`).
    conns_opened,
    /// Connections closed.
    conns_closed,
    /// Keys looked up by get/gets/mg (memcached `cmd_get`).
    cmd_get,
    /// Storage commands (set/add/replace/append/prepend/cas/ms).
    cmd_set,
    /// `flush_all` commands.
    cmd_flush,
    /// touch/gat/gats keys and mg with T.
    cmd_touch,
    get_hits,
    get_misses,
    delete_misses,
    delete_hits,
    incr_misses,
    incr_hits,
    decr_misses,
    decr_hits,
    cas_misses,
    cas_hits,
    cas_badval,
    touch_hits,
    touch_misses,
    /// Writes refused because the value was over `--item-size-max` (memcached
    /// `store_too_large`).
    store_too_large,
    /// Writes refused for want of memory: the store's, or the connection-memory budget's
    /// (memcached `store_no_memory`).
    store_no_memory,
    /// Times a connection stopped reading requests to let its output drain (over the
    /// output high-water mark), memcached's `conn_yields` for ringstore's scheduling.
    conn_yields,
    /// Meta commands (mg ms md ma mn me; memcached `cmd_meta`).
    cmd_meta,
    /// Bytes received from clients (both protocols).
    bytes_read,
    /// Bytes of replies produced (both protocols).
    bytes_written,
    /// HTTP requests answered.
    http_requests,
    /// HTTP responses with a 4xx status.
    http_responses_4xx,
    /// HTTP responses with a 5xx status.
    http_responses_5xx,
    /// memcache UDP datagrams received (every backend).
    udp_rx_datagrams,
    /// memcache UDP reply datagrams sent.
    udp_tx_datagrams,
    /// memcache UDP datagrams dropped unanswered: short, multi-datagram, not allowed,
    /// truncated, no send slot, a failed send, or the held table full.
    udp_dropped,
    /// Of those, requests dropped because the table of UDP requests waiting for the data
    /// device was full.
    udp_held_full,
    /// Frames the AF_XDP sockets received.
    xdp_rx,
    /// Reply frames the AF_XDP sockets queued for transmit.
    xdp_tx,
    /// AF_XDP frames dropped: not a memcache request, no TX room, a bad descriptor.
    xdp_drop,
    /// GET values sent from the item (pinned in the arena, not copied; `zero_copy.rs`).
    zero_copy_sends,
    /// GET values of at least `ZERO_COPY_MIN` (4 KiB) copied because a pin cap was reached (connection,
    /// worker or store).
    zero_copy_fallbacks,
    /// A gauge, not a counter: value bytes pinned for sends in flight now (the owning worker
    /// adds and subtracts; `stats` shows the sum, unaffected by `stats reset`).
    pinned_bytes,
    /// Authentication attempts: text `set` logins and binary SASL auth (memcached `auth_cmds`).
    auth_cmds,
    /// Of those, the ones refused (memcached `auth_errors`).
    auth_errors,
    /// HTTP requests refused 401 under `--http-tokens` (`/metrics`' auth failures).
    http_auth_failures,
    // TLS (ADR 0031).
    /// TLS handshakes completed.
    tls_handshakes,
    /// TLS handshakes that failed (bad client certificate, garbage, plaintext, timeout) or
    /// were refused over the per-worker limit of handshakes in progress.
    tls_handshake_errors,
    /// TLS sessions whose sending the kernel took over (kernel TLS TX).
    tls_ktls_tx,
    /// TLS sessions whose receiving the kernel took over (kernel TLS RX).
    tls_ktls_rx,
    /// Finished TLS sessions the kernel refused to take (the socket's TLS ULP failed, e.g.
    /// the peer already reset): each stays in user space; nothing changes for others.
    tls_ktls_fallbacks,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_padded_and_sum() {
        assert!(std::mem::align_of::<WorkerStats>() >= 128);
        let a = WorkerStats::default();
        let b = WorkerStats::default();
        a.cmd_get.inc();
        a.cmd_get.add(4);
        b.cmd_get.inc();
        let mut t = StatsTotals::default();
        t.add(&a);
        t.add(&b);
        assert_eq!(t.cmd_get, 6);
        let base = t;
        a.cmd_get.inc();
        let mut t2 = StatsTotals::default();
        t2.add(&a);
        t2.add(&b);
        assert_eq!(t2.since(&base).cmd_get, 1);
    }
}
