//! Items kept in a fixed budget (issue 24): 1.5M pipelined `noreply` sets of 100 B values into
//! a 64 MiB server from outside, then every key asked for again with batched gets and the hits
//! counted; three fresh servers each, so the count's stability shows beside its size.

use super::fill;
use super::procs::Pinned;
use anyhow::{bail, Context, Result};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// The budget every server gets.
pub const BUDGET_MIB: u64 = 64;
/// Sets sent, keys `key:000000000` .. `key:001499999`.
pub const SETS: usize = 1_500_000;
pub const VALUE_LEN: usize = 100;
/// Fresh servers (runs) per kind.
pub const RUNS: usize = 3;
/// Sets per write while filling (no replies come back, so nothing has to be read).
const SET_BATCH: usize = 1000;
/// Keys per `get` while counting.
const GET_BATCH: usize = 100;
/// Bound on one fill plus count.
const RUN_LIMIT: Duration = Duration::from_secs(120);

/// What one fill of a fresh server showed.
#[derive(Clone, Debug, Default)]
pub struct FillCount {
    /// Keys that read back with their full value.
    pub hits: u64,
    pub curr_items: u64,
    /// `evictions` from stats, where the server reports it.
    pub evictions: Option<u64>,
    /// Hits among the first and the last tenth of the keys (what the eviction order keeps).
    pub hits_first_tenth: u64,
    pub hits_last_tenth: u64,
}

#[expect(clippy::expect_used, reason = "io::Write for Vec<u8> never fails")]
fn write_key(out: &mut Vec<u8>, index: usize) {
    write!(out, "key:{index:09}").expect("writing to a Vec");
}

/// Sends every set with `noreply`, then `version` and waits for its answer, so every set before
/// it has been taken in (one connection: requests are handled in order).
fn fill_noreply(stream: &mut TcpStream, deadline: Instant) -> Result<()> {
    let value = vec![b'v'; VALUE_LEN];
    let mut tx = Vec::with_capacity(SET_BATCH * (VALUE_LEN + 48));
    let mut next = 0;
    while next < SETS {
        if Instant::now() > deadline {
            bail!("filling took over {} s", RUN_LIMIT.as_secs());
        }
        tx.clear();
        for index in next..(next + SET_BATCH).min(SETS) {
            tx.extend_from_slice(b"set ");
            write_key(&mut tx, index);
            tx.extend_from_slice(format!(" 0 0 {VALUE_LEN} noreply\r\n").as_bytes());
            tx.extend_from_slice(&value);
            tx.extend_from_slice(b"\r\n");
        }
        stream.write_all(&tx).context("sending sets")?;
        next += SET_BATCH;
    }
    stream.write_all(b"version\r\n")?;
    let mut got = Vec::new();
    let mut chunk = [0u8; 4096];
    while !got.ends_with(b"\r\n") {
        let n = stream
            .read(&mut chunk)
            .context("reading the version line")?;
        if n == 0 {
            bail!("server closed the connection after the fill");
        }
        got.extend_from_slice(&chunk[..n]);
    }
    if !got.starts_with(b"VERSION ") {
        bail!(
            "after the fill: expected VERSION, got {:?}",
            String::from_utf8_lossy(&got[..got.len().min(120)])
        );
    }
    Ok(())
}

/// Full `VALUE` replies of `VALUE_LEN` bytes in one multi-key get reply; `None` until `END`.
fn count_values(buf: &[u8]) -> Result<Option<(u64, Vec<usize>)>> {
    let mut at = 0;
    let mut keys = Vec::new();
    loop {
        let Some(eol) = buf[at..].windows(2).position(|w| w == b"\r\n") else {
            return Ok(None);
        };
        let line = &buf[at..at + eol];
        if line == b"END" {
            return Ok(Some((keys.len() as u64, keys)));
        }
        let Some(rest) = line.strip_prefix(b"VALUE key:") else {
            bail!("unexpected reply line {:?}", String::from_utf8_lossy(line));
        };
        let mut fields = rest.split(|&b| b == b' ');
        let index = fields
            .next()
            .and_then(|f| std::str::from_utf8(f).ok())
            .and_then(|f| f.parse::<usize>().ok())
            .context("key index in VALUE line")?;
        let bytes = fields
            .nth(1)
            .and_then(|f| std::str::from_utf8(f).ok())
            .and_then(|f| f.parse::<usize>().ok())
            .context("byte count in VALUE line")?;
        let end = at + eol + 2 + bytes + 2;
        if buf.len() < end {
            return Ok(None);
        }
        if bytes == VALUE_LEN {
            keys.push(index);
        }
        at = end;
    }
}

/// Asks for every key in batches of `GET_BATCH` and counts what comes back.
fn count_hits(stream: &mut TcpStream, out: &mut FillCount, deadline: Instant) -> Result<()> {
    let mut tx = Vec::new();
    let mut rx = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    let tenth = SETS / 10;
    for first in (0..SETS).step_by(GET_BATCH) {
        if Instant::now() > deadline {
            bail!("counting took past {} s", RUN_LIMIT.as_secs());
        }
        tx.clear();
        tx.extend_from_slice(b"get");
        for index in first..(first + GET_BATCH).min(SETS) {
            tx.push(b' ');
            write_key(&mut tx, index);
        }
        tx.extend_from_slice(b"\r\n");
        stream.write_all(&tx)?;
        rx.clear();
        let (hits, keys) = loop {
            if let Some(found) = count_values(&rx)? {
                break found;
            }
            let n = stream.read(&mut chunk).context("reading get replies")?;
            if n == 0 {
                bail!("server closed the connection while counting");
            }
            rx.extend_from_slice(&chunk[..n]);
        };
        out.hits += hits;
        out.hits_first_tenth += keys.iter().filter(|&&k| k < tenth).count() as u64;
        out.hits_last_tenth += keys.iter().filter(|&&k| k >= SETS - tenth).count() as u64;
    }
    Ok(())
}

/// Fills a freshly started server and counts what it kept.
pub fn measure(server: &mut Pinned) -> Result<FillCount> {
    let deadline = Instant::now() + RUN_LIMIT;
    eprintln!(
        "{}: {SETS} noreply sets of {VALUE_LEN} B into {BUDGET_MIB} MiB, then counting",
        server.name
    );
    let mut stream = fill::connect(server.port)?;
    fill_noreply(&mut stream, deadline)?;
    let mut out = FillCount::default();
    count_hits(&mut stream, &mut out, deadline)?;
    server.check_alive()?;
    out.curr_items = fill::stat_u64(server.port, "curr_items")?;
    out.evictions = fill::stat_u64(server.port, "evictions").ok();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_full_values_of_a_multi_get_and_waits_for_end() {
        let value = "v".repeat(VALUE_LEN);
        let full = format!(
            "VALUE key:000000007 0 {VALUE_LEN}\r\n{value}\r\nVALUE key:000000009 0 2\r\nab\r\nEND\r\n"
        );
        let (hits, keys) = count_values(full.as_bytes()).unwrap().unwrap();
        assert_eq!((hits, keys), (1, vec![7]));
        assert!(count_values(&full.as_bytes()[..full.len() - 3])
            .unwrap()
            .is_none());
        assert_eq!(count_values(b"END\r\n").unwrap(), Some((0, vec![])));
        assert!(count_values(b"SERVER_ERROR x\r\n").is_err());
        let mut key = Vec::new();
        write_key(&mut key, 1_499_999);
        assert_eq!(key, b"key:001499999");
    }
}
