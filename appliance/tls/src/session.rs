//! One TLS connection, sans IO: received bytes in, plaintext and bytes to send out.

use std::path::PathBuf;
use std::sync::Arc;

use rustls::server::UnbufferedServerConnection;
use rustls::unbuffered::{
    ConnectionState, EncodeError, EncodeTlsData, EncryptError, InsufficientSizeError,
    UnbufferedStatus,
};
use rustls::ServerConfig;

/// Received bytes a connection buffers that are not yet a whole record (or, during the
/// handshake, a whole handshake message: rustls joins fragments in place, up to 64 KiB).
pub const INCOMING_MAX: usize = (64 << 10) + (18 << 10);

/// Received bytes held after the handshake: less than one whole record (header, 16 KiB of
/// plaintext, the 2 KiB expansion TLS allows) plus a few bytes of a next record's header.
pub const OPEN_INCOMING_MAX: usize = 5 + (16 << 10) + (2 << 10) + 5;

/// Heap bytes rustls' server state holds at most during a handshake, beyond the received
/// bytes ([`ServerTls::buffer_bytes`]): measured with a counting allocator over full and
/// partial handshakes, TLS 1.2 and 1.3, with and without a client certificate
/// (`tests/handshake_memory.rs`), with room to spare. What the runtime charges a handshake
/// in progress against `--conn-memory`.
pub const HANDSHAKE_STATE_MAX: usize = 16 << 10;

/// Bytes a sealed record adds at most to its plaintext (header 5, TLS 1.2 explicit nonce 8,
/// tag 16, TLS 1.3 content type 1), rounded up.
const RECORD_OVERHEAD: usize = 40;
/// Largest plaintext one record carries.
const RECORD_PLAINTEXT: usize = 16 << 10;

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: no {what}: {detail}", path.display())]
    Pem {
        path: PathBuf,
        what: &'static str,
        detail: String,
    },
    #[error("--tls-verify request|require needs --tls-ca")]
    VerifyWithoutCa,
    #[error("client verifier: {0}")]
    Verifier(String),
    #[error("tls: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("tls: more bytes received than a record or handshake message may hold")]
    IncomingFull,
    #[error("tls: the connection cannot send application data now")]
    NotWritable,
    #[error("tls: encode: {0}")]
    Encode(String),
}

/// What one [`ServerTls::read`] saw.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Progress {
    /// The handshake completed in this call.
    pub handshake_done: bool,
    /// The peer sent close_notify.
    pub peer_closed: bool,
}

/// A server-side TLS connection.
pub struct ServerTls {
    conn: UnbufferedServerConnection,
    incoming: Vec<u8>,
    handshaking: bool,
    failed: bool,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("buffered", &self.incoming.len())
            .field("handshaking", &self.handshaking)
            .field("failed", &self.failed)
            .finish()
    }
}

/// Appends the record `encode` holds to `out`.
fn encode_into<D>(encode: &mut EncodeTlsData<'_, D>, out: &mut Vec<u8>) -> Result<(), TlsError> {
    let start = out.len();
    out.resize(start + 4096, 0);
    let written = match encode.encode(&mut out[start..]) {
        Err(EncodeError::InsufficientSize(InsufficientSizeError { required_size })) => {
            out.resize(start + required_size, 0);
            encode.encode(&mut out[start..])
        }
        other => other,
    };
    match written {
        Ok(n) => {
            out.truncate(start + n);
            Ok(())
        }
        Err(e) => {
            out.truncate(start);
            Err(TlsError::Encode(e.to_string()))
        }
    }
}

impl ServerTls {
    pub fn new(config: Arc<ServerConfig>) -> Result<ServerTls, TlsError> {
        Ok(ServerTls {
            conn: UnbufferedServerConnection::new(config)?,
            incoming: Vec::new(),
            handshaking: true,
            failed: false,
        })
    }

    /// True until the handshake completed.
    pub fn is_handshaking(&self) -> bool {
        self.handshaking
    }

    /// Received bytes held that are not yet a whole record.
    pub fn buffered(&self) -> usize {
        self.incoming.len()
    }

    /// Heap bytes the received-bytes buffer holds now (its capacity, up to
    /// [`INCOMING_MAX`] during the handshake); rustls' own state comes on top, at most
    /// [`HANDSHAKE_STATE_MAX`] while handshaking.
    pub fn buffer_bytes(&self) -> usize {
        self.incoming.capacity()
    }

    /// The ALPN protocol agreed on, if any.
    pub fn alpn(&self) -> Option<&[u8]> {
        self.conn.alpn_protocol()
    }

    /// The client's end-entity certificate (DER), once the handshake verified it against
    /// `--tls-ca`; `None` without one (or before the handshake is done).
    pub fn peer_certificate(&self) -> Option<&[u8]> {
        self.conn
            .peer_certificates()
            .and_then(|chain| chain.first())
            .map(|cert| cert.as_ref())
    }

    /// The negotiated version (`None` during the handshake).
    pub fn protocol_version(&self) -> Option<rustls::ProtocolVersion> {
        self.conn.protocol_version()
    }

    /// Takes `input` (received bytes): appends its application data to `plain` and the
    /// records to send (handshake, alerts) to `out`. On an error the alert rustls queued
    /// is in `out`; the caller sends it and closes.
    pub fn read(
        &mut self,
        input: &[u8],
        plain: &mut Vec<u8>,
        out: &mut Vec<u8>,
    ) -> Result<Progress, TlsError> {
        if self.failed {
            return Err(TlsError::NotWritable);
        }
        self.incoming.extend_from_slice(input);
        let before = out.len();
        let result = self.process(plain, out);
        let limit = if self.handshaking {
            INCOMING_MAX
        } else {
            OPEN_INCOMING_MAX
        };
        if result.is_ok() && self.incoming.len() > limit {
            self.failed = true;
            self.alert_if_silent(out, before);
            self.incoming = Vec::new();
            return Err(TlsError::IncomingFull);
        }
        if result.is_err() {
            self.failed = true;
            // The alert rustls queued on the error goes out before the close. One call: it
            // hands out queued records before parsing the held bytes again (which would
            // fail a second time).
            let status = self.conn.process_tls_records(&mut self.incoming);
            if let Ok(ConnectionState::EncodeTlsData(mut encode)) = status.state {
                let _ = encode_into(&mut encode, out);
            }
            self.incoming = Vec::new();
            self.alert_if_silent(out, before);
        }
        result
    }

    /// A failure rustls queued no alert for (a handshake message over the bound, which
    /// rustls would keep joining): before the server said anything, a cleartext fatal
    /// `decode_error` alert, so garbage on a TLS port always gets one alert and the close.
    /// After the server's first flight an alert would have to be sealed: the close alone.
    fn alert_if_silent(&self, out: &mut Vec<u8>, before: usize) {
        if out.len() == before && self.handshaking && self.conn.protocol_version().is_none() {
            out.extend_from_slice(&[21, 3, 3, 0, 2, 2, 50]);
        }
    }

    fn process(&mut self, plain: &mut Vec<u8>, out: &mut Vec<u8>) -> Result<Progress, TlsError> {
        let mut progress = Progress::default();
        let mut start = 0;
        let result = loop {
            let UnbufferedStatus { discard, state } =
                self.conn.process_tls_records(&mut self.incoming[start..]);
            let step = match state {
                Err(e) => Err(TlsError::Rustls(e)),
                Ok(ConnectionState::ReadTraffic(mut traffic)) => {
                    let mut read = Ok(true);
                    while let Some(record) = traffic.next_record() {
                        match record {
                            Ok(record) => plain.extend_from_slice(record.payload),
                            Err(e) => {
                                read = Err(TlsError::Rustls(e));
                                break;
                            }
                        }
                    }
                    read
                }
                Ok(ConnectionState::EncodeTlsData(mut encode)) => {
                    encode_into(&mut encode, out).map(|()| true)
                }
                Ok(ConnectionState::TransmitTlsData(transmit)) => {
                    // Appended to `out`, which the worker sends in order.
                    transmit.done();
                    Ok(true)
                }
                Ok(ConnectionState::PeerClosed) => {
                    progress.peer_closed = true;
                    Ok(true)
                }
                Ok(ConnectionState::WriteTraffic(_)) => {
                    if self.handshaking {
                        self.handshaking = false;
                        progress.handshake_done = true;
                    }
                    Ok(false)
                }
                Ok(ConnectionState::Closed) => {
                    progress.peer_closed = true;
                    Ok(false)
                }
                // BlockedHandshake: more bytes needed; early data is never accepted.
                Ok(_) => Ok(false),
            };
            start += discard;
            match step {
                Ok(true) => continue,
                Ok(false) => break Ok(progress),
                Err(e) => break Err(e),
            }
        };
        self.incoming.drain(..start);
        result
    }

    /// Appends the records rustls has queued (handshake messages, alerts) to `out`. The held
    /// bytes are passed along (never an empty buffer while rustls is joining a handshake
    /// message in them); a whole record among them is left for the next [`ServerTls::read`].
    fn flush_pending(&mut self, out: &mut Vec<u8>) -> Result<(), TlsError> {
        loop {
            let status = self.conn.process_tls_records(&mut self.incoming);
            let discard = status.discard;
            let more = match status.state {
                Ok(ConnectionState::EncodeTlsData(mut encode)) => {
                    encode_into(&mut encode, out).map(|()| true)
                }
                Ok(ConnectionState::TransmitTlsData(transmit)) => {
                    transmit.done();
                    Ok(true)
                }
                _ => Ok(false),
            };
            self.incoming.drain(..discard);
            if !more? {
                return Ok(());
            }
        }
    }

    /// Seals `plain` into records appended to `out` (after the handshake).
    pub fn seal(&mut self, plain: &[u8], out: &mut Vec<u8>) -> Result<(), TlsError> {
        if plain.is_empty() {
            return Ok(());
        }
        self.flush_pending(out)?;
        let status = self.conn.process_tls_records(&mut self.incoming);
        debug_assert_eq!(status.discard, 0, "read() took every whole record");
        let Ok(ConnectionState::WriteTraffic(mut write)) = status.state else {
            return Err(TlsError::NotWritable);
        };
        let start = out.len();
        let records = plain.len().div_ceil(RECORD_PLAINTEXT);
        let room = plain.len() + (records + 1) * RECORD_OVERHEAD;
        // Exactly the room the records need: the worker keeps an output buffer of a bounded
        // capacity for the next reply only (a doubled one would be released and faulted in
        // again).
        out.reserve_exact(room);
        out.resize(start + room, 0);
        let written = match write.encrypt(plain, &mut out[start..]) {
            Err(EncryptError::InsufficientSize(InsufficientSizeError { required_size })) => {
                out.resize(start + required_size, 0);
                write.encrypt(plain, &mut out[start..])
            }
            other => other,
        };
        match written {
            Ok(n) => {
                out.truncate(start + n);
                Ok(())
            }
            Err(e) => {
                out.truncate(start);
                Err(TlsError::Encode(e.to_string()))
            }
        }
    }

    /// Appends a close_notify alert to `out` (when the handshake is done).
    pub fn close_notify(&mut self, out: &mut Vec<u8>) {
        if self.failed || self.handshaking {
            return;
        }
        let status = self.conn.process_tls_records(&mut self.incoming);
        if let Ok(ConnectionState::WriteTraffic(mut write)) = status.state {
            let start = out.len();
            out.resize(start + 64, 0);
            match write.queue_close_notify(&mut out[start..]) {
                Ok(n) => out.truncate(start + n),
                Err(_) => out.truncate(start),
            }
        }
    }
}

/// The AEADs kernel TLS takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelCipher {
    AesGcm128,
    AesGcm256,
    Chacha20Poly1305,
}

/// One direction's traffic secrets for the kernel: key, 12-byte IV, next sequence number.
pub struct DirectionSecrets {
    pub cipher: KernelCipher,
    pub key: Vec<u8>,
    pub iv: [u8; 12],
    pub seq: u64,
}

/// A session's traffic secrets, handed over once the handshake is done (kernel TLS).
pub struct KernelSecrets {
    /// 0x0303 (TLS 1.2) or 0x0304 (TLS 1.3).
    pub version: u16,
    pub tx: DirectionSecrets,
    pub rx: DirectionSecrets,
}

fn direction((seq, secrets): (u64, rustls::ConnectionTrafficSecrets)) -> Option<DirectionSecrets> {
    use rustls::ConnectionTrafficSecrets as S;
    let (cipher, key, iv) = match secrets {
        S::Aes128Gcm { key, iv } => (KernelCipher::AesGcm128, key, iv),
        S::Aes256Gcm { key, iv } => (KernelCipher::AesGcm256, key, iv),
        S::Chacha20Poly1305 { key, iv } => (KernelCipher::Chacha20Poly1305, key, iv),
        _ => return None,
    };
    Some(DirectionSecrets {
        cipher,
        key: key.as_ref().to_vec(),
        iv: iv.as_ref().try_into().ok()?,
        seq,
    })
}

impl ServerTls {
    /// Whether the session may go to the kernel now: handshake done, no received bytes held.
    pub fn can_hand_over(&self) -> bool {
        !self.handshaking && !self.failed && self.incoming.is_empty()
    }

    /// Gives up the session's traffic secrets (rustls keeps nothing; this connection no
    /// longer reads or seals here). `None` when the session cannot be handed over. What
    /// the kernel cannot do for such a session: TLS 1.3 post-handshake messages (no
    /// tickets are sent; a client's KeyUpdate reaches the kernel as a control record,
    /// which ends the connection).
    pub fn into_kernel(self) -> Option<KernelSecrets> {
        if !self.can_hand_over() {
            return None;
        }
        let version = match self.conn.protocol_version()? {
            rustls::ProtocolVersion::TLSv1_2 => 0x0303,
            rustls::ProtocolVersion::TLSv1_3 => 0x0304,
            _ => return None,
        };
        let (secrets, _kernel) = self.conn.dangerous_into_kernel_connection().ok()?;
        Some(KernelSecrets {
            version,
            tx: direction(secrets.tx)?,
            rx: direction(secrets.rx)?,
        })
    }
}
