//! The TLS clients of the benchmarks and the QEMU tests: rustls configurations that trust
//! exactly one self-signed certificate (made by [`self_signed_command`]), one suite, X25519.

use anyhow::{Context, Result};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{ring, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, SignatureScheme};
use std::path::Path;
use std::sync::Arc;

/// `openssl req` for a self-signed ECDSA P-256 certificate with common name `cn` for
/// `localhost`/127.0.0.1, valid `days` (also the QEMU TLS test's certificates).
pub fn self_signed_command(cert: &Path, key: &Path, cn: &str, days: u32) -> std::process::Command {
    let mut cmd = std::process::Command::new("openssl");
    cmd.args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
        .args(["ec_paramgen_curve:prime256v1", "-nodes", "-days"])
        .arg(days.to_string())
        .arg("-subj")
        .arg(format!("/CN={cn}"))
        .args([
            "-addext",
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
            "-keyout",
        ])
        .arg(key)
        .arg("-out")
        .arg(cert)
        .stderr(std::process::Stdio::null());
    cmd
}

/// Accepts exactly the test's certificate (generated for the run) and checks the
/// handshake's signature with ring's algorithms, as a normal client would.
#[derive(Debug)]
struct PinnedCert {
    der: CertificateDer<'static>,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for PinnedCert {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if end_entity.as_ref() == self.der.as_ref() {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::UnknownIssuer,
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// The client configuration of the bench's TLS cells: TLS 1.3 only, AES-128-GCM, X25519, the certificate in
/// `cert_pem` pinned, ALPN `alpn` when given, session resumption on or off.
pub fn client_config(
    cert_pem: &Path,
    alpn: Option<&[u8]>,
    resume: bool,
) -> Result<Arc<ClientConfig>> {
    let mut config = pinned_config(cert_pem, &rustls::version::TLS13)?;
    if let Some(alpn) = alpn {
        config.alpn_protocols = vec![alpn.to_vec()];
    }
    if !resume {
        config.resumption = rustls::client::Resumption::disabled();
    }
    Ok(Arc::new(config))
}

/// A TLS 1.2 client (AES-128-GCM, X25519) that trusts only `cert_pem`'s certificate and
/// resumes by session ID: its second connection with the same config is an abbreviated
/// handshake (the QEMU kernel-TLS test's full and resumed TLS 1.2 sessions).
pub fn client_config_tls12(cert_pem: &Path) -> Result<Arc<ClientConfig>> {
    Ok(Arc::new(pinned_config(cert_pem, &rustls::version::TLS12)?))
}

/// A client of one TLS version, one AES-128-GCM suite and X25519, pinned to `cert_pem`.
fn pinned_config(
    cert_pem: &Path,
    version: &'static rustls::SupportedProtocolVersion,
) -> Result<ClientConfig> {
    let mut provider = ring::default_provider();
    provider.cipher_suites = vec![
        ring::cipher_suite::TLS13_AES_128_GCM_SHA256,
        ring::cipher_suite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
        ring::cipher_suite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
    ];
    provider.kx_groups = vec![ring::kx_group::X25519];
    let provider = Arc::new(provider);
    let der = CertificateDer::from_pem_file(cert_pem)
        .with_context(|| format!("reading {}", cert_pem.display()))?;
    let verifier = Arc::new(PinnedCert {
        der,
        provider: provider.clone(),
    });
    Ok(ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[version])
        .context("a TLS version with the ring provider")?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth())
}
