//! Host-side clients of the guest's forwarded data ports: a bounded TCP exchange, a memcache
//! set/get, an HTTP PUT/GET, and the check that a port serves no memcache.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};

pub(super) fn tcp(port: u16) -> Result<TcpStream> {
    let stream =
        TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_secs(5))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    Ok(stream)
}

/// Writes `request` and reads until `done` says the answer is whole (bounded in size and time).
pub(super) fn exchange(
    stream: &mut TcpStream,
    request: &[u8],
    done: impl Fn(&str) -> bool,
) -> Result<String> {
    stream.write_all(request)?;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !done(&String::from_utf8_lossy(&got)) && got.len() < 1 << 20 {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
    }
    Ok(String::from_utf8_lossy(&got).into_owned())
}

/// `set KEY 0 0 LEN` of `value` on `stream`: the answer line.
pub(super) fn set(stream: &mut TcpStream, key: &str, value: &str) -> Result<String> {
    let request = format!("set {key} 0 0 {}\r\n{value}\r\n", value.len());
    exchange(stream, request.as_bytes(), |t| t.ends_with("\r\n"))
}

/// `get KEY` on `stream`: its value (flags 0), `None` for a miss.
pub(super) fn get(stream: &mut TcpStream, key: &str) -> Result<Option<String>> {
    let got = exchange(stream, format!("get {key}\r\n").as_bytes(), whole_get)?;
    if got == "END\r\n" {
        return Ok(None);
    }
    let value = got
        .strip_prefix(&format!("VALUE {key} 0 "))
        .and_then(|rest| rest.split_once("\r\n"))
        .and_then(|(_, rest)| rest.strip_suffix("\r\nEND\r\n"))
        .with_context(|| format!("get {key}: {:?}", &got[..got.len().min(80)]))?;
    Ok(Some(value.to_string()))
}

/// A `set` of `key` on a new connection to `port` that must be stored.
pub(super) fn set_at(port: u16, key: &str, value: &str) -> Result<()> {
    let got = set(&mut tcp(port)?, key, value)?;
    ensure!(got == "STORED\r\n", "set {key} on port {port}: {got:?}");
    Ok(())
}

/// A `get` of `key` on a new connection to `port`.
pub(super) fn get_at(port: u16, key: &str) -> Result<Option<String>> {
    get(&mut tcp(port)?, key).with_context(|| format!("on port {port}"))
}

/// Whether `t` is a whole answer to one `get`: a hit with the bytes its header announces and
/// `END`, or any other line (a miss, an error).
fn whole_get(t: &str) -> bool {
    let Some(head_end) = t.find("\r\n") else {
        return false;
    };
    let announced = t[..head_end]
        .strip_prefix("VALUE ")
        .and_then(|head| head.rsplit(' ').next())
        .and_then(|n| n.parse::<usize>().ok());
    announced.is_none_or(|len| t.len() >= head_end + 2 + len + "\r\nEND\r\n".len())
}

pub(super) fn memcache_set_get(port: u16) -> Result<()> {
    let mut s = tcp(port)?;
    let stored = exchange(&mut s, b"set vmkey 0 0 5\r\nhello\r\n", |t| {
        t.ends_with("\r\n")
    })?;
    anyhow::ensure!(stored == "STORED\r\n", "set answered {stored:?}");
    let got = exchange(&mut s, b"get vmkey\r\n", |t| t.ends_with("END\r\n"))?;
    anyhow::ensure!(
        got == "VALUE vmkey 0 5\r\nhello\r\nEND\r\n",
        "get answered {got:?}"
    );
    Ok(())
}

pub(super) fn http_put_get(port: u16) -> Result<()> {
    let mut s = tcp(port)?;
    let put = exchange(
        &mut s,
        b"PUT /vmobject HTTP/1.1\r\nHost: vm\r\nContent-Length: 5\r\n\r\nworld",
        |t| t.contains("\r\n\r\n"),
    )?;
    anyhow::ensure!(put.starts_with("HTTP/1.1 20"), "PUT answered {put:?}");
    let mut s = tcp(port)?;
    let get = exchange(&mut s, b"GET /vmobject HTTP/1.1\r\nHost: vm\r\n\r\n", |t| {
        t.contains("\r\n\r\n") && t.ends_with("world")
    })?;
    anyhow::ensure!(
        get.starts_with("HTTP/1.1 200") && get.ends_with("world"),
        "GET answered {get:?}"
    );
    Ok(())
}

/// The port answers nothing: the connection closes or times out without a memcache reply.
pub(super) fn memcache_closed(port: u16) -> Result<()> {
    let Ok(mut s) = tcp(port) else { return Ok(()) };
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    match exchange(&mut s, b"version\r\n", |t| t.ends_with("\r\n")) {
        Ok(answer) if answer.starts_with("VERSION") => {
            bail!("port {port} serves memcache: {answer:?}")
        }
        _ => Ok(()),
    }
}
