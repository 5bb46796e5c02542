//! The heap a handshake in progress holds, measured with a counting allocator: rustls' server
//! state must stay within `HANDSHAKE_STATE_MAX` (what the runtime charges each handshake
//! against `--conn-memory`) at every point where a peer can stall — after a partial
//! ClientHello, after the server's flight, with most of the client's second flight held —
//! for TLS 1.3 and 1.2, with and without a client certificate.
#![expect(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed step fails the test (allow-*-in-tests does not reach an integration test's helpers)"
)]

mod testcerts;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::Arc;

use ringstore_tls::{CertStore, MinVersion, ServerTls, Settings, Verify, HANDSHAKE_STATE_MAX};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore};

/// Counts the live heap bytes of the calling thread (the measured code runs on one thread).
struct Counting;

thread_local! {
    static LIVE: Cell<isize> = const { Cell::new(0) };
}

fn add(n: isize) {
    // `try_with`: a thread being torn down has no counter; its frees are not ours.
    let _ = LIVE.try_with(|c| c.set(c.get() + n));
}

// SAFETY: every call goes straight to `System` with the caller's arguments; the counter is a
// const-initialized thread local (no allocation).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        add(layout.size() as isize);
        // SAFETY: the caller's contract is `System`'s.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        add(-(layout.size() as isize));
        // SAFETY: `ptr` came from `alloc` with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        add(new_size as isize - layout.size() as isize);
        // SAFETY: as for `dealloc`, and `new_size` is the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

fn live() -> isize {
    LIVE.with(Cell::get)
}

fn client_config(
    certs: &testcerts::TestCerts,
    client_cert: bool,
    tls13: bool,
) -> Arc<ClientConfig> {
    let mut roots = RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(certs.path("ca.pem")).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let versions: &[&rustls::SupportedProtocolVersion] = if tls13 {
        &[&rustls::version::TLS13]
    } else {
        &[&rustls::version::TLS12]
    };
    let builder =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_protocol_versions(versions)
            .unwrap()
            .with_root_certificates(roots);
    Arc::new(if client_cert {
        let chain = CertificateDer::pem_file_iter(certs.path("client.pem"))
            .unwrap()
            .map(|c| c.unwrap())
            .collect();
        let key = PrivateKeyDer::from_pem_file(certs.path("client.key")).unwrap();
        builder.with_client_auth_cert(chain, key).unwrap()
    } else {
        builder.with_no_client_auth()
    })
}

/// The most heap the server's state held (beyond its received-bytes buffer) at the points a
/// peer can stall in one handshake.
fn peak_state(store: &CertStore, client_config: Arc<ClientConfig>) -> isize {
    let mut client =
        ClientConnection::new(client_config, ServerName::try_from("localhost").unwrap()).unwrap();
    let mut hello = Vec::new();
    client.write_tls(&mut hello).unwrap();
    let config = store.config(false);
    // Buffers of the caller, sized up front so their growth is not counted.
    let (mut plain, mut out) = (Vec::with_capacity(1 << 16), Vec::with_capacity(1 << 16));
    let base = live();
    let mut server = ServerTls::new(config).unwrap();
    let state = |server: &ServerTls| live() - base - server.buffer_bytes() as isize;
    server.read(&hello[..60], &mut plain, &mut out).unwrap();
    let mut peak = state(&server);
    server.read(&hello[60..], &mut plain, &mut out).unwrap();
    peak = peak.max(state(&server));
    let mut rd = &out[..];
    while !rd.is_empty() {
        client.read_tls(&mut rd).unwrap();
        client.process_new_packets().unwrap();
    }
    let mut second = Vec::new();
    client.write_tls(&mut second).unwrap();
    out.clear();
    // All but the last byte of the client's second flight: held, the handshake not done.
    let progress = server
        .read(&second[..second.len() - 1], &mut plain, &mut out)
        .unwrap();
    assert!(!progress.handshake_done);
    peak = peak.max(state(&server));
    let progress = server
        .read(&second[second.len() - 1..], &mut plain, &mut out)
        .unwrap();
    assert!(progress.handshake_done, "the handshake completes");
    drop(server);
    // What stays is the server's session cache (resumption), shared, not this connection's.
    println!(
        "{} bytes left after the connection was dropped",
        live() - base
    );
    peak
}

#[test]
fn a_handshake_in_progress_holds_at_most_the_charged_state() {
    let certs = testcerts::TestCerts::make();
    for (verify, client_cert) in [(Verify::None, false), (Verify::Require, true)] {
        let store = CertStore::load(Settings {
            cert: certs.path("server.pem"),
            key: certs.path("server.key"),
            ca: (verify != Verify::None).then(|| certs.path("ca.pem")),
            verify,
            min_version: MinVersion::Tls12,
            kernel_tls: false,
        })
        .unwrap();
        for tls13 in [true, false] {
            let peak = peak_state(&store, client_config(&certs, client_cert, tls13));
            println!("verify {verify:?} tls13 {tls13}: {peak} bytes of state at most");
            assert!(peak > 0, "the counter sees the state");
            assert!(
                peak <= HANDSHAKE_STATE_MAX as isize,
                "{peak} bytes of handshake state, more than the {HANDSHAKE_STATE_MAX} charged"
            );
        }
    }
}
