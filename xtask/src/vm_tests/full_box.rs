//! A box whose data device is full (issue 36, ADR 0039), driven through the forwarded
//! memcache port: big values fill the data partition fast; in `refuse` mode the sets end in
//! the device-full error, in `evict` mode they keep being stored. The update test runs its
//! updates on such a box (`uefi.rs`), where the canary's internal writes take the reserve.

use anyhow::{bail, ensure, Result};

use super::client::{exchange, tcp};

/// Value bytes of one fill item: about 2,000 of them fill the default disk.img's ~95 MB data
/// partition in 190 sets (under memcached's 1 MiB item limit).
pub(super) const BIG: usize = 500_000;
/// The refusal a `data_full = refuse` box answers a set with (service `DEVICE_FULL`).
const DEVICE_FULL: &str = "SERVER_ERROR data device full storing object\r\n";

pub(super) fn fill_key(i: usize) -> String {
    format!("fill{i:05}")
}

/// The value of fill item `i`: ASCII, its own number first, so a read checks it exactly.
fn fill_value(i: usize) -> String {
    let head = format!("{i}:");
    let body: String = (0..BIG - head.len())
        .map(|j| char::from(b'a' + u8::try_from((i + j) % 26).unwrap_or(0)))
        .collect();
    head + &body
}

/// `set` of fill item `i`: the answer line.
fn set(port: u16, i: usize) -> Result<String> {
    let mut s = tcp(port)?;
    let request = format!("set {} 0 0 {BIG}\r\n{}\r\n", fill_key(i), fill_value(i));
    exchange(&mut s, request.as_bytes(), |t| t.ends_with("\r\n"))
}

/// `data_full = refuse`: sets items `from..` until the device-full error (at most `most`
/// stored, else the device never filled); returns the number of the last one stored.
pub(super) fn fill_until_refused(port: u16, from: usize, most: usize) -> Result<usize> {
    for i in from..from + most {
        match set(port, i)?.as_str() {
            "STORED\r\n" => {}
            DEVICE_FULL if i > from => return Ok(i - 1),
            other => bail!("set {} answered {other:?}", fill_key(i)),
        }
    }
    bail!("{most} sets of {BIG} bytes never filled the data device")
}

/// `data_full = evict`: `count` sets from item `from` on are all stored.
pub(super) fn keep_storing(port: u16, from: usize, count: usize) -> Result<()> {
    for i in from..from + count {
        let answer = set(port, i)?;
        ensure!(
            answer == "STORED\r\n",
            "on a full evicting device set {} answered {answer:?}",
            fill_key(i)
        );
    }
    Ok(())
}

/// Fill item `i` reads back with its exact value.
pub(super) fn reads_back(port: u16, i: usize) -> Result<()> {
    let mut s = tcp(port)?;
    let request = format!("get {}\r\n", fill_key(i));
    let got = exchange(&mut s, request.as_bytes(), |t| {
        t.ends_with("END\r\n") && (t.len() > BIG || t == "END\r\n")
    })?;
    let want = format!(
        "VALUE {} 0 {BIG}\r\n{}\r\nEND\r\n",
        fill_key(i),
        fill_value(i)
    );
    ensure!(
        got == want,
        "get {} answered {} bytes: {:?}",
        fill_key(i),
        got.len(),
        &got[..got.len().min(80)]
    );
    Ok(())
}
