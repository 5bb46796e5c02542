//! The memcache-over-TLS client the TLS tests share (`tls.rs`, `tls12.rs`, `ktls_reset.rs`):
//! a session that has proved it works, a request and its reply, a SET and its GET.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;

use anyhow::{ensure, Result};
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, StreamOwned};

use super::client::tcp;

pub(super) type Tls = StreamOwned<ClientConnection, TcpStream>;

/// A session on host port `port`: the handshake, and a `version` round trip as proof (so
/// the client's Finished is never read together with a partial record of a larger first
/// request, which would keep the session out of kernel TLS).
pub(super) fn connect(port: u16, config: &Arc<ClientConfig>) -> Result<Tls> {
    let name = ServerName::try_from("localhost")?;
    let conn = ClientConnection::new(config.clone(), name)?;
    let mut tls = StreamOwned::new(conn, tcp(port)?);
    // The handshake, and a proof the session works.
    let answer = ask(&mut tls, b"version\r\n", |t| t.ends_with(b"\r\n"))?;
    ensure!(
        answer.starts_with(b"VERSION "),
        "version over TLS: {answer:?}"
    );
    Ok(tls)
}

/// Writes `request` on `tls` and reads until `done` (bounded: 2 MiB).
pub(super) fn ask(tls: &mut Tls, request: &[u8], done: impl Fn(&[u8]) -> bool) -> Result<Vec<u8>> {
    tls.write_all(request)?;
    tls.flush()?;
    let mut got = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    while !done(&got) && got.len() < 2 << 20 {
        let n = tls.read(&mut buf)?;
        ensure!(n > 0, "closed after {} bytes", got.len());
        got.extend_from_slice(&buf[..n]);
    }
    Ok(got)
}

pub(super) fn tls_set_get(tls: &mut Tls, key: &str, value: &str) -> Result<()> {
    let set = format!("set {key} 0 0 {}\r\n{value}\r\n", value.len());
    let stored = ask(tls, set.as_bytes(), |t| t.ends_with(b"\r\n"))?;
    ensure!(stored == b"STORED\r\n", "set over TLS: {stored:?}");
    let got = ask(tls, format!("get {key}\r\n").as_bytes(), |t| {
        t.ends_with(b"END\r\n")
    })?;
    let want = format!("VALUE {key} 0 {}\r\n{value}\r\nEND\r\n", value.len());
    ensure!(got == want.as_bytes(), "get over TLS: {got:?}");
    Ok(())
}
