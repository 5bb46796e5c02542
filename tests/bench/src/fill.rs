//! Blocking memcache helpers for setting up a cell: preloading keys with pipelined sets and
//! reading `stats`. Not on the measured path.

use super::mcwire::{split_reply, write_key, write_request, Op, Reply};
use anyhow::{bail, Context, Result};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// Sets for this many keys go out in one write before their replies are read.
const BATCH: usize = 256;

/// A blocking connection to the server on loopback, with 10 s read and write timeouts.
pub fn connect(port: u16) -> Result<TcpStream> {
    let stream = TcpStream::connect(("127.0.0.1", port))
        .with_context(|| format!("connecting to port {port}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    stream.set_write_timeout(Some(Duration::from_secs(10)))?;
    Ok(stream)
}

/// Stores keys `0..count` with `value_len`-byte values; fails unless every set is `STORED`.
pub fn preload(port: u16, value_len: usize, count: usize) -> Result<()> {
    preload_range(port, value_len, 0, count)
}

/// Stores keys `first..first + count` on one connection; fails unless every set is `STORED`.
pub fn preload_range(port: u16, value_len: usize, first: usize, count: usize) -> Result<()> {
    let mut stream = connect(port)?;
    let value = vec![b'v'; value_len];
    let mut tx = Vec::new();
    let mut rx = vec![0u8; 64 * 1024];
    let end_key = first + count;
    let mut next = first;
    while next < end_key {
        let batch = BATCH.min(end_key - next);
        tx.clear();
        for index in next..next + batch {
            write_request(&mut tx, Op::Set, &value, index);
        }
        stream.write_all(&tx)?;
        let (mut start, mut end, mut stored) = (0, 0, 0);
        while stored < batch {
            if end == rx.len() {
                rx.copy_within(start..end, 0);
                (start, end) = (0, end - start);
            }
            let n = stream.read(&mut rx[end..]).context("reading set replies")?;
            if n == 0 {
                bail!("server closed the connection while preloading");
            }
            end += n;
            while let Some((reply, used)) = split_reply(&rx[start..end]) {
                if reply != Reply::Stored {
                    let line =
                        String::from_utf8_lossy(&rx[start..start + used.min(80)]).into_owned();
                    bail!("preloading key {}: got {line:?}", next + stored);
                }
                start += used;
                stored += 1;
            }
        }
        next += batch;
    }
    Ok(())
}

/// Whether key `index` of the `value_len` keyspace reads back with its full value.
pub fn check_hit(port: u16, value_len: usize, index: usize) -> Result<bool> {
    let mut stream = connect(port)?;
    let mut req = b"get ".to_vec();
    write_key(&mut req, value_len, index);
    req.extend_from_slice(b"\r\n");
    stream.write_all(&req)?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        if let Some((reply, _)) = split_reply(&buf) {
            return Ok(reply == Reply::Hit);
        }
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            bail!("server closed the connection");
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// The `stats` reply as (name, value) pairs.
pub fn stats(port: u16) -> Result<Vec<(String, String)>> {
    let mut stream = connect(port)?;
    stream.write_all(b"stats\r\n")?;
    let mut text = String::new();
    let mut chunk = [0u8; 8192];
    while !text.ends_with("END\r\n") {
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            bail!("server closed the connection during stats");
        }
        text.push_str(&String::from_utf8_lossy(&chunk[..n]));
        if text.len() > 1 << 20 {
            bail!("stats reply over 1 MiB");
        }
    }
    Ok(text
        .lines()
        .filter_map(|l| l.strip_prefix("STAT "))
        .filter_map(|l| l.split_once(' '))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect())
}

/// One numeric stat.
pub fn stat_u64(port: u16, name: &str) -> Result<u64> {
    stats(port)?
        .into_iter()
        .find(|(k, _)| k == name)
        .with_context(|| format!("no {name} in stats"))?
        .1
        .parse()
        .with_context(|| format!("{name} is not a number"))
}
