//! The log shipped off the box (ADR 0045): RFC 5424 lines to the `log-sink` syslog receiver
//! over UDP, TCP or TLS (octet counting, RFC 6587), from a bounded queue that a logging
//! thread never waits on: a line that does not fit is dropped and counted
//! (`log_lines_dropped`), and the next line that gets through is preceded by one saying how
//! many were dropped. One sender thread owns the connection and reconnects with a bounded
//! backoff.

#![forbid(unsafe_code)]

mod capture;
mod format;
mod sender;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::Arc;

pub use capture::{tee_stderr, Tee};
pub use format::{
    format_line, octet_frame, sd_value, timestamp, Facility, Ident, Record, Severity, LINE_MAX,
    SD_ID,
};
pub use ringstore_config::{LogSink, LogTransport};
pub use sender::{BACKOFF_MAX_MS, BACKOFF_MIN_MS, IO_TIMEOUT_MS, SEND_BUFFER_BYTES};

/// Lines the queue holds: with [`LINE_MAX`] that bounds it to 2 MiB; on the appliance it is
/// also the backlog kept while the network is not up yet.
pub const QUEUE_LINES: usize = 1024;

/// Why the sink did not start.
#[derive(Debug, thiserror::Error)]
pub enum LogSinkError {
    #[error(
        "log-sink tls:// needs tls-ca (the CA the receiver's certificate is verified against)"
    )]
    NoCa,
    #[error("log-sink: {0}")]
    Tls(#[from] ringstore_tls::TlsError),
    #[error("log-sink: {0}")]
    Io(#[from] std::io::Error),
}

/// The sink's counters, shared by every handle and the sender thread.
#[derive(Debug, Default)]
pub struct Counters {
    /// Lines dropped since the start (`log_lines_dropped`): the queue was full.
    dropped: AtomicU64,
    /// Dropped but not yet reported in a line that got through.
    unreported: AtomicU64,
    /// Lines the receiver took (written whole to its socket).
    sent: AtomicU64,
    /// The server's `log_lines_dropped`, once it runs ([`Shipper::count_drops_in`]).
    mirror: std::sync::OnceLock<Arc<AtomicU64>>,
}

impl Counters {
    /// Lines dropped since the start.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Lines sent since the start.
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    fn drop_one(&self) {
        self.dropped.fetch_add(1, Ordering::Relaxed);
        self.unreported.fetch_add(1, Ordering::Relaxed);
        if let Some(mirror) = self.mirror.get() {
            mirror.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A cheap, cloneable handle that formats lines and queues them without waiting.
#[derive(Debug, Clone)]
pub struct Shipper {
    ident: Arc<Ident>,
    queue: SyncSender<String>,
    counters: Arc<Counters>,
}

impl Shipper {
    /// Starts the sender thread for `sink`; `ca` is the PEM file a `tls://` receiver is
    /// verified against.
    pub fn start(
        sink: &LogSink,
        ca: Option<&std::path::Path>,
        ident: Ident,
    ) -> Result<Shipper, LogSinkError> {
        let tls = match (sink.transport, ca) {
            (LogTransport::Tls, None) => return Err(LogSinkError::NoCa),
            (LogTransport::Tls, Some(ca)) => Some(ringstore_tls::client_config(ca)?),
            _ => None,
        };
        let (queue, lines) = sync_channel(QUEUE_LINES);
        let shipper = Shipper {
            ident: Arc::new(ident),
            queue,
            counters: Arc::new(Counters::default()),
        };
        sender::spawn(sink.clone(), tls, lines, shipper.clone())?;
        Ok(shipper)
    }

    /// Formats and queues one line stamped now; never blocks: a full queue drops it.
    pub fn log(&self, facility: Facility, severity: Severity, component: &str, text: &str) {
        let record = Record {
            facility,
            severity,
            component,
            text,
            unix_micros: now_micros(),
        };
        self.push(format_line(&self.ident, &record));
    }

    /// Queues a formatted line; never blocks.
    pub fn push(&self, line: String) {
        match self.queue.try_send(line) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => self.counters.drop_one(),
        }
    }

    /// The counters (`log_lines_dropped` is [`Counters::dropped`]).
    pub fn counters(&self) -> &Arc<Counters> {
        &self.counters
    }

    /// Counts every drop in `counter` too (the server's `log_lines_dropped`, built after the
    /// sink started), starting with those so far. A drop racing this call may be counted twice.
    pub fn count_drops_in(&self, counter: Arc<AtomicU64>) {
        if self.counters.mirror.set(Arc::clone(&counter)).is_ok() {
            counter.fetch_add(self.counters.dropped(), Ordering::Relaxed);
        }
    }

    /// Who this shipper's lines say they come from.
    pub fn ident(&self) -> &Ident {
        &self.ident
    }
}

/// Microseconds since the Unix epoch (0 if the clock is before it).
pub fn now_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

#[cfg(test)]
fn parse_sink(text: &str) -> LogSink {
    ringstore_config::parse_log_sink(text)
        .flatten()
        .unwrap_or_else(|| panic!("{text}"))
}
