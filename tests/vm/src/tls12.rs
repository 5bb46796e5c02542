//! TLS 1.2 under kernel TLS (issue 35, ADR 0031): a full TLS 1.2 handshake ends with the
//! server's Finished, so that session stays in user space; a resumed one ends with the
//! client's Finished and goes to the kernel. Both carry a 256 KiB value both ways, checked
//! byte for byte, and `stats` counts exactly one kernel hand-over for the pair.

use std::io::{Read, Write};
use std::path::Path;

use anyhow::{ensure, Context, Result};
use rustls::HandshakeKind;

use super::console::stat;
use super::tls_client::{connect, Tls};
use super::vm::Vm;

/// The value's size: several records each way, under the 2 MiB the reader allows.
const VALUE: usize = 256 << 10;

/// A value no record boundary can hide a shifted or repeated byte in.
fn pattern(seed: u8) -> Vec<u8> {
    (0..VALUE)
        .map(|i| b"abcdefghijklmnopqrstuvwxyz"[(i * 7 + i / 251 + usize::from(seed)) % 26])
        .collect()
}

/// Sets `key` to a pattern and gets it back on `tls`, byte for byte.
fn set_get(tls: &mut Tls, key: &str, seed: u8) -> Result<()> {
    let value = pattern(seed);
    let mut set = format!("set {key} 0 0 {VALUE}\r\n").into_bytes();
    set.extend_from_slice(&value);
    set.extend_from_slice(b"\r\nget ");
    set.extend_from_slice(key.as_bytes());
    set.extend_from_slice(b"\r\n");
    tls.write_all(&set)?;
    tls.flush()?;
    let mut want = b"STORED\r\n".to_vec();
    want.extend_from_slice(format!("VALUE {key} 0 {VALUE}\r\n").as_bytes());
    want.extend_from_slice(&value);
    want.extend_from_slice(b"\r\nEND\r\n");
    let mut got = vec![0u8; want.len()];
    tls.read_exact(&mut got)
        .with_context(|| format!("reading {} bytes over TLS 1.2", want.len()))?;
    ensure!(
        got == want,
        "TLS 1.2 {key}: the reply differs from byte {}",
        got.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(0)
    );
    Ok(())
}

fn ktls_tx(vm: &mut Vm) -> Result<u64> {
    let stats = vm.command("stats")?;
    stat(&stats, "tls_ktls_tx")
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("no tls_ktls_tx in stats:\n{stats}"))
}

/// The full and the resumed TLS 1.2 session against the memcache-TLS listener on host port
/// `port` (certificate `cert_pem`); a line for the test's report.
pub fn full_and_resumed(vm: &mut Vm, port: u16, cert_pem: &Path) -> Result<String> {
    let config = ringstore_testkit::tls::client_config_tls12(cert_pem)?;
    let before = ktls_tx(vm)?;
    let mut full = connect(port, &config)?;
    ensure!(
        full.conn.handshake_kind() == Some(HandshakeKind::Full),
        "the first TLS 1.2 session: {:?}",
        full.conn.handshake_kind()
    );
    set_get(&mut full, "tls12full", 1)?;
    ensure!(
        ktls_tx(vm)? == before,
        "a full TLS 1.2 session was handed to the kernel"
    );
    let mut resumed = connect(port, &config)?;
    ensure!(
        resumed.conn.handshake_kind() == Some(HandshakeKind::Resumed),
        "the second TLS 1.2 session did not resume: {:?}",
        resumed.conn.handshake_kind()
    );
    set_get(&mut resumed, "tls12resumed", 2)?;
    // The full session still works beside it, in user space.
    set_get(&mut full, "tls12full", 3)?;
    let after = ktls_tx(vm)?;
    ensure!(
        after == before + 1,
        "kernel TLS hand-overs for a full and a resumed TLS 1.2 session: {}, want 1",
        after - before
    );
    Ok(format!(
        "TLS 1.2: full session in user space, resumed session in kernel TLS, {} KiB each way byte for byte",
        VALUE >> 10
    ))
}
