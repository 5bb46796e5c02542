//! ServerTls driven in-process against a rustls client: handshakes (whole, byte by byte, with
//! client certificates), data both ways, and what a hostile peer sends (garbage, plaintext
//! memcache, truncated and oversized records, a flood of handshake bytes).
#![expect(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed step fails the test (allow-*-in-tests does not reach an integration test's helpers)"
)]

mod testcerts;

use std::sync::Arc;

use ringstore_tls::{CertStore, MinVersion, ServerTls, Settings, TlsError, Verify, INCOMING_MAX};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore};
use testcerts::TestCerts;

fn settings(certs: &TestCerts, verify: Verify) -> Settings {
    Settings {
        cert: certs.path("server.pem"),
        key: certs.path("server.key"),
        ca: (verify != Verify::None).then(|| certs.path("ca.pem")),
        verify,
        min_version: MinVersion::Tls12,
        kernel_tls: true,
    }
}

fn client_config(
    certs: &TestCerts,
    client: Option<&str>,
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> Arc<ClientConfig> {
    let mut roots = RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(certs.path("ca.pem")).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let builder =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_protocol_versions(versions)
            .unwrap()
            .with_root_certificates(roots);
    let config = match client {
        None => builder.with_no_client_auth(),
        Some(name) => {
            let chain = CertificateDer::pem_file_iter(certs.path(&format!("{name}.pem")))
                .unwrap()
                .map(|c| c.unwrap())
                .collect();
            let key = PrivateKeyDer::from_pem_file(certs.path(&format!("{name}.key"))).unwrap();
            builder.with_client_auth_cert(chain, key).unwrap()
        }
    };
    Arc::new(config)
}

fn client(config: Arc<ClientConfig>) -> ClientConnection {
    ClientConnection::new(config, ServerName::try_from("localhost").unwrap()).unwrap()
}

/// Moves bytes both ways until neither side has anything to say; `chunk` bytes at a time
/// into the server. Returns the server's error, if it failed.
fn pump(
    server: &mut ServerTls,
    client: &mut ClientConnection,
    plain: &mut Vec<u8>,
    chunk: usize,
) -> Result<(), TlsError> {
    for _ in 0..10_000 {
        let mut to_server = Vec::new();
        client.write_tls(&mut to_server).unwrap();
        let mut to_client = Vec::new();
        let mut result = Ok(());
        if to_server.is_empty() {
            result = server.read(&[], plain, &mut to_client).map(|_| ());
        }
        for piece in to_server.chunks(chunk.max(1)) {
            result = server.read(piece, plain, &mut to_client).map(|_| ());
            if result.is_err() {
                break;
            }
        }
        let moved = !to_server.is_empty() || !to_client.is_empty();
        let client_state = feed_client(client, &to_client, &mut Vec::new());
        result?;
        client_state.map_err(TlsError::Rustls)?;
        if !moved {
            return Ok(());
        }
    }
    panic!("no end to the exchange");
}

/// Gives `bytes` to the client, keeping its buffers small; its plaintext goes to `got`.
fn feed_client(
    client: &mut ClientConnection,
    bytes: &[u8],
    got: &mut Vec<u8>,
) -> Result<(), rustls::Error> {
    let mut rd = bytes;
    while !rd.is_empty() {
        client.read_tls(&mut rd).unwrap();
        client.process_new_packets()?;
        let _ = std::io::Read::read_to_end(&mut client.reader(), got);
    }
    client.process_new_packets().map(|_| ())
}

fn handshake(
    certs: &TestCerts,
    verify: Verify,
    who: Option<&str>,
    chunk: usize,
) -> (ServerTls, ClientConnection, Result<(), TlsError>) {
    let store = CertStore::load(settings(certs, verify)).unwrap();
    let mut server = ServerTls::new(store.config(false)).unwrap();
    let mut client = client(client_config(certs, who, rustls::DEFAULT_VERSIONS));
    let mut plain = Vec::new();
    let result = pump(&mut server, &mut client, &mut plain, chunk);
    (server, client, result)
}

#[test]
fn handshake_then_data_both_ways() {
    let certs = TestCerts::make();
    let (mut server, mut client, result) = handshake(&certs, Verify::None, None, usize::MAX);
    result.unwrap();
    assert!(!server.is_handshaking());
    assert!(!client.is_handshaking());
    assert_eq!(
        server.protocol_version(),
        Some(rustls::ProtocolVersion::TLSv1_3)
    );
    std::io::Write::write_all(&mut client.writer(), b"get k\r\n").unwrap();
    let mut plain = Vec::new();
    pump(&mut server, &mut client, &mut plain, usize::MAX).unwrap();
    assert_eq!(plain, b"get k\r\n");
    // A reply larger than one record comes back whole.
    let reply: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    let mut sealed = Vec::new();
    server.seal(&reply, &mut sealed).unwrap();
    assert!(sealed.len() > reply.len() && sealed.len() < reply.len() + 7 * 40);
    let mut got = Vec::new();
    feed_client(&mut client, &sealed, &mut got).unwrap();
    assert_eq!(got, reply);
}

#[test]
fn handshake_byte_by_byte_and_tls12() {
    let certs = TestCerts::make();
    let (server, _client, result) = handshake(&certs, Verify::None, None, 1);
    result.unwrap();
    assert!(!server.is_handshaking());
    let store = CertStore::load(settings(&certs, Verify::None)).unwrap();
    let mut server = ServerTls::new(store.config(false)).unwrap();
    let mut client = client(client_config(&certs, None, &[&rustls::version::TLS12]));
    pump(&mut server, &mut client, &mut Vec::new(), 7).unwrap();
    assert_eq!(
        server.protocol_version(),
        Some(rustls::ProtocolVersion::TLSv1_2)
    );
}

#[test]
fn min_version_13_refuses_a_tls12_client() {
    let certs = TestCerts::make();
    let mut s = settings(&certs, Verify::None);
    s.min_version = MinVersion::Tls13;
    let store = CertStore::load(s).unwrap();
    let mut server = ServerTls::new(store.config(false)).unwrap();
    let mut client = client(client_config(&certs, None, &[&rustls::version::TLS12]));
    assert!(pump(&mut server, &mut client, &mut Vec::new(), usize::MAX).is_err());
}

#[test]
fn require_wants_a_certificate_from_the_ca() {
    let certs = TestCerts::make();
    let (_, _, ok) = handshake(&certs, Verify::Require, Some("client"), usize::MAX);
    ok.unwrap();
    let (_, _, none) = handshake(&certs, Verify::Require, None, usize::MAX);
    assert!(none.is_err());
    let (_, _, stranger) = handshake(&certs, Verify::Require, Some("stranger"), usize::MAX);
    assert!(stranger.is_err());
    // request: no certificate is fine, a bad one is not.
    let (_, _, none) = handshake(&certs, Verify::Request, None, usize::MAX);
    none.unwrap();
    let (_, _, stranger) = handshake(&certs, Verify::Request, Some("stranger"), usize::MAX);
    assert!(stranger.is_err());
    assert!(matches!(
        CertStore::load(Settings {
            ca: None,
            ..settings(&certs, Verify::Require)
        }),
        Err(TlsError::VerifyWithoutCa)
    ));
}

fn fresh(certs: &TestCerts) -> ServerTls {
    ServerTls::new(
        CertStore::load(settings(certs, Verify::None))
            .unwrap()
            .config(false),
    )
    .unwrap()
}

/// Is `bytes` exactly one TLS alert record (content type 21)?
fn is_alert(bytes: &[u8]) -> bool {
    bytes.len() == 7 && bytes[0] == 21 && bytes[3..5] == [0, 2] && bytes[5] == 2
}

#[test]
fn garbage_and_plaintext_get_an_alert() {
    let certs = TestCerts::make();
    for input in [
        &b"get foo\r\n"[..],
        b"GET / HTTP/1.1\r\n\r\n",
        &[0xffu8; 64],
    ] {
        let mut server = fresh(&certs);
        let mut out = Vec::new();
        assert!(server.read(input, &mut Vec::new(), &mut out).is_err());
        assert!(is_alert(&out), "{input:?} -> {out:?}");
        // Nothing more is taken once failed.
        assert!(server
            .read(b"more", &mut Vec::new(), &mut Vec::new())
            .is_err());
    }
}

#[test]
fn oversized_record_is_refused() {
    let certs = TestCerts::make();
    let mut server = fresh(&certs);
    // A handshake record header announcing 16 KiB + 2 KiB + 1 bytes of body.
    let len: u16 = (16 << 10) + (2 << 10) + 1;
    let mut record = vec![22, 3, 1];
    record.extend_from_slice(&len.to_be_bytes());
    let mut out = Vec::new();
    assert!(server.read(&record, &mut Vec::new(), &mut out).is_err());
    assert!(is_alert(&out), "{out:?}");
    // After the handshake: an application record too large to be legal.
    let (mut server, _c, r) = handshake(&certs, Verify::None, None, usize::MAX);
    r.unwrap();
    let mut record = vec![23, 3, 3];
    record.extend_from_slice(&len.to_be_bytes());
    record.resize(5 + usize::from(len), 0);
    let mut out = Vec::new();
    assert!(server.read(&record, &mut Vec::new(), &mut out).is_err());
    assert!(
        out.first() == Some(&21) || out.first() == Some(&23),
        "an alert (sealed after the handshake)"
    );
}

#[test]
fn truncated_record_waits_then_holds_nothing_past_the_bound() {
    let certs = TestCerts::make();
    let mut server = fresh(&certs);
    let mut client = client(client_config(&certs, None, rustls::DEFAULT_VERSIONS));
    let mut hello = Vec::new();
    client.write_tls(&mut hello).unwrap();
    let mut out = Vec::new();
    // All but the last byte: nothing to say yet, the bytes are held.
    server
        .read(&hello[..hello.len() - 1], &mut Vec::new(), &mut out)
        .unwrap();
    assert!(out.is_empty());
    assert_eq!(server.buffered(), hello.len() - 1);
    assert!(server.is_handshaking());
    server
        .read(&hello[hello.len() - 1..], &mut Vec::new(), &mut out)
        .unwrap();
    assert!(!out.is_empty(), "the server's flight");
}

#[test]
fn endless_handshake_fragments_stop_at_the_bound() {
    let certs = TestCerts::make();
    let mut server = fresh(&certs);
    // A ClientHello header announcing a 16 MiB message, then 1 KiB handshake records of it.
    let mut first = vec![22, 3, 1, 0, 4, 1, 0xff, 0xff, 0xff];
    first.truncate(9);
    let mut out = Vec::new();
    let mut result = server.read(&first, &mut Vec::new(), &mut out).map(|_| ());
    let mut fed = first.len();
    while result.is_ok() && fed < 4 * INCOMING_MAX {
        let mut record = vec![22, 3, 1, 4, 0];
        record.resize(5 + 1024, 0x41);
        fed += record.len();
        result = server.read(&record, &mut Vec::new(), &mut out).map(|_| ());
    }
    assert!(result.is_err(), "refused after {fed} bytes");
    assert!(fed <= INCOMING_MAX + 2048, "{fed}");
    assert!(server.buffered() <= INCOMING_MAX);
    // rustls queued nothing for it: the cleartext decode_error alert, once.
    assert_eq!(out, [21, 3, 3, 0, 2, 2, 50]);
}

#[test]
fn reload_changes_new_handshakes_only() {
    let certs = TestCerts::make();
    let dir = tempfile::tempdir().unwrap();
    let cert = dir.path().join("cert.pem");
    let key = dir.path().join("key.pem");
    std::fs::copy(certs.path("server.pem"), &cert).unwrap();
    std::fs::copy(certs.path("server.key"), &key).unwrap();
    let store = CertStore::load(Settings {
        cert: cert.clone(),
        key: key.clone(),
        ..settings(&certs, Verify::None)
    })
    .unwrap();
    let before = store.config(false);
    std::fs::copy(certs.path("server2.pem"), &cert).unwrap();
    std::fs::copy(certs.path("server2.key"), &key).unwrap();
    store.reload().unwrap();
    let after = store.config(false);
    assert!(!Arc::ptr_eq(&before, &after));
    let subject = |config: Arc<rustls::ServerConfig>| {
        let mut server = ServerTls::new(config).unwrap();
        let mut c = client(client_config(&certs, None, rustls::DEFAULT_VERSIONS));
        pump(&mut server, &mut c, &mut Vec::new(), usize::MAX).unwrap();
        c.peer_certificates().unwrap()[0].to_vec()
    };
    assert_ne!(subject(before), subject(after));
    // A broken file: the reload fails and the certificates in use stay.
    std::fs::write(&key, b"not a key").unwrap();
    assert!(store.reload().is_err());
    let _ = subject(store.config(false));
}

#[test]
fn secrets_for_the_kernel_only_after_the_handshake() {
    let certs = TestCerts::make();
    let server = fresh(&certs);
    assert!(!server.can_hand_over());
    assert!(server.into_kernel().is_none());
    for versions in [&[&rustls::version::TLS13][..], &[&rustls::version::TLS12]] {
        let mut server = fresh(&certs);
        let mut c = client(client_config(&certs, None, versions));
        pump(&mut server, &mut c, &mut Vec::new(), usize::MAX).unwrap();
        assert!(server.can_hand_over());
        let secrets = server.into_kernel().unwrap();
        let tls13 = versions[0] == &rustls::version::TLS13;
        assert_eq!(secrets.version, if tls13 { 0x0304 } else { 0x0303 });
        // No session tickets: nothing was sent under the traffic keys yet (TLS 1.3); TLS
        // 1.2's Finished went under them (sequence 1).
        assert_eq!(secrets.tx.seq, u64::from(!tls13));
        assert!(matches!(secrets.tx.key.len(), 16 | 32));
        assert_ne!(secrets.tx.key, secrets.rx.key);
    }
}

/// Runs a handshake between `server` and `client`; returns the bytes the server sent in the
/// read that finished its handshake (empty: the client spoke last).
fn handshake_last_flight(server: &mut ServerTls, client: &mut ClientConnection) -> Vec<u8> {
    for _ in 0..100 {
        let mut to_server = Vec::new();
        client.write_tls(&mut to_server).unwrap();
        let mut to_client = Vec::new();
        let progress = server
            .read(&to_server, &mut Vec::new(), &mut to_client)
            .unwrap();
        feed_client(client, &to_client, &mut Vec::new()).unwrap();
        if progress.handshake_done {
            return to_client;
        }
    }
    panic!("no end to the handshake");
}

#[test]
fn a_resumed_tls12_session_ends_with_the_client_and_may_go_to_the_kernel() {
    let certs = TestCerts::make();
    let store = CertStore::load(settings(&certs, Verify::None)).unwrap();
    let config = client_config(&certs, None, &[&rustls::version::TLS12]);
    // Full handshake: the server's Finished is the last flight, sealed in user space; the
    // runtime hands a session over only when that read left nothing to send.
    let mut full = ServerTls::new(store.config(false)).unwrap();
    let mut c = client(config.clone());
    assert!(!handshake_last_flight(&mut full, &mut c).is_empty());
    assert!(!c.is_handshaking());
    // Resumed (session ID from the server's cache): the client's Finished ends it.
    let mut resumed = ServerTls::new(store.config(false)).unwrap();
    let mut c = client(config);
    assert!(handshake_last_flight(&mut resumed, &mut c).is_empty());
    assert_eq!(c.handshake_kind(), Some(rustls::HandshakeKind::Resumed));
    assert!(resumed.can_hand_over());
    let secrets = resumed.into_kernel().unwrap();
    assert_eq!(secrets.version, 0x0303);
    // Each side's Finished went under the new keys: record 0 both ways.
    assert_eq!((secrets.tx.seq, secrets.rx.seq), (1, 1));
}
