//! Sans-IO TLS for the data plane (docs/adr/0031-tls-rustls-ring-sans-io.md): rustls'
//! unbuffered server connection with the `ring` provider. The worker hands a connection's
//! received bytes to [`ServerTls::read`] and sends what it appends to its output; plaintext to
//! send is sealed with [`ServerTls::seal`]. No I/O, no threads, no unsafe.
//!
//! Certificates are read here too: [`CertificateSummary`] (subject and expiry, for the
//! console) and [`Subject`] (a client certificate's subject, for `--http-tokens`), walked
//! from the DER by a small reader that reads, never trusts (rustls verified the chain).
//!
//! Bounds: a connection buffers at most [`INCOMING_MAX`] received bytes during the handshake
//! and [`OPEN_INCOMING_MAX`] after it that are not yet a whole record or handshake message (rustls refuses records over 16 KiB + 2 KiB and
//! handshake messages over 64 KiB itself); a peer error (garbage, plaintext, an oversized
//! record, a renegotiation attempt) ends the connection with the TLS alert rustls queued.
#![forbid(unsafe_code)]

mod certificate;
mod config;
#[cfg(any(test, feature = "test-util"))]
pub mod der_builder;
mod session;
mod subject;

pub use certificate::{CertificateSummary, DAY_SECS};
pub use config::{client_config, CertStore, MinVersion, Settings, Verify, ALPN_HTTP1};
pub use rustls::{ClientConfig, ServerConfig};
pub use session::{
    DirectionSecrets, KernelCipher, KernelSecrets, Progress, ServerTls, TlsError,
    HANDSHAKE_STATE_MAX, INCOMING_MAX, OPEN_INCOMING_MAX,
};
pub use subject::{Subject, SUBJECT_MAX};
