//! Server configurations from PEM: the certificate chain and key, client verification
//! (`--tls-verify` with `--tls-ca`), the lowest version, ALPN; and the reloadable store the
//! listeners take each new handshake's configuration from.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Instant;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};

use crate::TlsError;

/// The ALPN protocol the HTTPS listener offers.
pub const ALPN_HTTP1: &[u8] = b"http/1.1";

/// Whether clients present a certificate (memcached's `ssl_verify_mode` 0, 1, 2-3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Verify {
    /// No client certificate asked for.
    #[default]
    None,
    /// Asked for; a client without one is served, one with a bad one is refused.
    Request,
    /// A certificate signed by `--tls-ca` is required.
    Require,
}

/// The lowest TLS version offered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MinVersion {
    #[default]
    Tls12,
    Tls13,
}

/// Where the certificates are and how clients are verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: Option<PathBuf>,
    pub verify: Verify,
    pub min_version: MinVersion,
    /// Sessions will be handed to kernel TLS: no TLS 1.3 session tickets (see below).
    pub kernel_tls: bool,
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_path_buf(),
        source,
    })
}

fn pem_error<'p>(
    path: &'p Path,
    what: &'static str,
) -> impl Fn(rustls::pki_types::pem::Error) -> TlsError + 'p {
    move |e| TlsError::Pem {
        path: path.to_path_buf(),
        what,
        detail: e.to_string(),
    }
}

fn certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(pem_error(path, "certificate"))?;
    if certs.is_empty() {
        return Err(TlsError::Pem {
            path: path.to_path_buf(),
            what: "certificate",
            detail: "no CERTIFICATE block".into(),
        });
    }
    Ok(certs)
}

/// A client configuration that verifies a server against the CAs in `ca` (PEM): the log
/// sink's `tls://` receiver (ADR 0045).
pub fn client_config(ca: &Path) -> Result<Arc<rustls::ClientConfig>, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in certs(ca)? {
        roots.add(cert).map_err(TlsError::Rustls)?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Rustls)?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

impl Settings {
    /// A server configuration offering `alpn` (empty: no ALPN), read from the files now.
    pub fn server_config(&self, alpn: &[&[u8]]) -> Result<Arc<ServerConfig>, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let versions: &[&'static rustls::SupportedProtocolVersion] = match self.min_version {
            MinVersion::Tls12 => &[&rustls::version::TLS13, &rustls::version::TLS12],
            MinVersion::Tls13 => &[&rustls::version::TLS13],
        };
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(versions)
            .map_err(TlsError::Rustls)?;
        let builder = match (self.verify, &self.ca) {
            (Verify::None, _) => builder.with_no_client_auth(),
            (_, None) => return Err(TlsError::VerifyWithoutCa),
            (verify, Some(ca)) => {
                let mut roots = RootCertStore::empty();
                for cert in certs(ca)? {
                    roots.add(cert).map_err(TlsError::Rustls)?;
                }
                let verifier = WebPkiClientVerifier::builder_with_provider(roots.into(), provider);
                let verifier = if verify == Verify::Request {
                    verifier.allow_unauthenticated()
                } else {
                    verifier
                };
                builder.with_client_cert_verifier(
                    verifier
                        .build()
                        .map_err(|e| TlsError::Verifier(e.to_string()))?,
                )
            }
        };
        let key_pem = read(&self.key)?;
        let key =
            PrivateKeyDer::from_pem_slice(&key_pem).map_err(pem_error(&self.key, "private key"))?;
        let mut config = builder
            .with_single_cert(certs(&self.cert)?, key)
            .map_err(TlsError::Rustls)?;
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        // Keys may go to the kernel after the handshake (kernel TLS); rustls then keeps none.
        config.enable_secret_extraction = true;
        // With kernel TLS, no TLS 1.3 session tickets: they are records the server seals
        // right after the handshake, and the kernel can take a session only with nothing
        // sealed in user space still to send. Without it, two tickets as OpenSSL sends
        // (and resumption from rustls' bounded cache of 256 sessions): a ticket also ACKs
        // the client's Finished at once, which a Nagle client otherwise waits 40 ms for
        // (delayed ACK) before its first request.
        config.send_tls13_tickets = if self.kernel_tls { 0 } else { 2 };
        config.max_early_data_size = 0;
        Ok(Arc::new(config))
    }
}

/// The configurations new handshakes use, one per listener kind; [`CertStore::reload`]
/// swaps them (open sessions keep the configuration they started with).
#[derive(Debug)]
pub struct CertStore {
    settings: Settings,
    current: RwLock<Loaded>,
}

#[derive(Debug, Clone)]
struct Loaded {
    memcache: Arc<ServerConfig>,
    https: Arc<ServerConfig>,
    at: Instant,
}

impl CertStore {
    /// Loads the certificates of `settings` (an error names the file).
    pub fn load(settings: Settings) -> Result<CertStore, TlsError> {
        let loaded = Self::build(&settings)?;
        Ok(CertStore {
            settings,
            current: RwLock::new(loaded),
        })
    }

    fn build(settings: &Settings) -> Result<Loaded, TlsError> {
        Ok(Loaded {
            memcache: settings.server_config(&[])?,
            https: settings.server_config(&[ALPN_HTTP1])?,
            at: Instant::now(),
        })
    }

    /// Reads the files again; on an error the configuration in use stays.
    pub fn reload(&self) -> Result<(), TlsError> {
        let loaded = Self::build(&self.settings)?;
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = loaded;
        Ok(())
    }

    fn loaded(&self) -> Loaded {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The configuration for a new memcache (`https: false`) or HTTPS handshake.
    pub fn config(&self, https: bool) -> Arc<ServerConfig> {
        let loaded = self.loaded();
        if https {
            loaded.https
        } else {
            loaded.memcache
        }
    }

    /// Seconds since the certificates in use were read (`time_since_server_cert_refresh`).
    /// The settings the certificates were loaded with.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    pub fn secs_since_refresh(&self) -> u64 {
        self.loaded().at.elapsed().as_secs()
    }
}
