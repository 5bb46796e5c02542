//! A small memtier-like memcache load generator for loopback measurements (ADR-0001, ADR-0004).
//!
//! `cargo run --release -p ringstore-bench -- load --addr 127.0.0.1:11211 --mode long --conns 4 --threads 1 --secs 5`
//! (blocking std sockets, a thread per group of connections: a quick check by hand, where
//! `cargo xtask bench` pins, paces and compares).
//! - `long`: `conns` persistent connections split over `threads`; each round sends one request
//!   per connection (pipeline depth 1), then reads every reply. 1 set per 10 gets
//!   (`--set-every 1`: sets only, for durable write throughput).
//! - `short`: each thread loops connect, `get`, close.
//!
//! Prints one line: mode, connections, ops, ops/s, and the spread of per-connection op counts.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

struct Args {
    addr: SocketAddr,
    mode: String,
    conns: usize,
    threads: usize,
    secs: u64,
    keys: usize,
    value_size: usize,
    /// One request in this many is a set (11 = 1 set per 10 gets; 1 = sets only).
    set_every: usize,
}

#[expect(
    clippy::expect_used,
    clippy::unwrap_used,
    reason = "a measurement tool run by hand: a failure should stop it with the message"
)]
fn parse_args(argv: &[String]) -> Args {
    let mut a = Args {
        addr: "127.0.0.1:11211".parse().unwrap(),
        mode: "long".into(),
        conns: 4,
        threads: 1,
        secs: 5,
        keys: 1000,
        value_size: 32,
        set_every: 11,
    };
    for pair in argv.chunks(2) {
        let value = pair.get(1).cloned().unwrap_or_default();
        match pair[0].as_str() {
            "--addr" => a.addr = value.parse().expect("--addr IP:PORT"),
            "--mode" => a.mode = value,
            "--conns" => a.conns = value.parse().expect("--conns N"),
            "--threads" => a.threads = value.parse().expect("--threads N"),
            "--secs" => a.secs = value.parse().expect("--secs N"),
            "--keys" => a.keys = value.parse().expect("--keys N"),
            "--value-size" => a.value_size = value.parse().expect("--value-size N"),
            "--set-every" => a.set_every = value.parse::<usize>().expect("--set-every N").max(1),
            other => panic!("unknown flag {other}"),
        }
    }
    a
}

/// Reads until `buf` ends with `end` (buf is reused across requests).
fn read_reply(stream: &mut TcpStream, buf: &mut Vec<u8>, end: &[u8]) -> bool {
    buf.clear();
    let mut chunk = [0u8; 16384];
    while !buf.ends_with(end) {
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => return false,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    true
}

#[expect(
    clippy::expect_used,
    clippy::unwrap_used,
    reason = "a measurement tool run by hand: a failure should stop it with the message"
)]
fn preload(a: &Args) {
    let mut s = TcpStream::connect(a.addr).expect("connect");
    let value = vec![b'v'; a.value_size];
    let mut buf = Vec::new();
    for k in 0..a.keys {
        let mut req = format!("set key:{k} 0 0 {}\r\n", a.value_size).into_bytes();
        req.extend_from_slice(&value);
        req.extend_from_slice(b"\r\n");
        s.write_all(&req).unwrap();
        assert!(read_reply(&mut s, &mut buf, b"\r\n"));
    }
}

#[expect(
    clippy::expect_used,
    clippy::unwrap_used,
    reason = "a measurement tool run by hand: a failure should stop it with the message"
)]
fn long_thread(a: Arc<Args>, conns: usize, seed: usize, stop: Arc<AtomicBool>) -> Vec<u64> {
    let mut streams: Vec<TcpStream> = (0..conns)
        .map(|_| TcpStream::connect(a.addr).expect("connect"))
        .collect();
    for s in &streams {
        s.set_nodelay(true).unwrap();
    }
    let mut counts = vec![0u64; conns];
    let mut buf = Vec::with_capacity(4096);
    let value = vec![b'v'; a.value_size];
    let mut n = seed;
    let mut kinds = vec![false; conns];
    while !stop.load(Ordering::Relaxed) {
        for (i, s) in streams.iter_mut().enumerate() {
            n = n
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let key = (n >> 33) % a.keys;
            let roll = (n >> 20) % a.set_every;
            let set = roll == 0;
            kinds[i] = set;
            if set {
                let mut req = format!("set key:{key} 0 0 {}\r\n", a.value_size).into_bytes();
                req.extend_from_slice(&value);
                req.extend_from_slice(b"\r\n");
                s.write_all(&req).unwrap();
            } else {
                s.write_all(format!("get key:{key}\r\n").as_bytes())
                    .unwrap();
            }
        }
        for (i, s) in streams.iter_mut().enumerate() {
            let end: &[u8] = if kinds[i] { b"\r\n" } else { b"END\r\n" };
            if !read_reply(s, &mut buf, end) {
                return counts;
            }
            counts[i] += 1;
        }
    }
    counts
}

#[expect(
    clippy::unwrap_used,
    reason = "a measurement tool run by hand: a failure should stop it with the message"
)]
fn short_thread(a: Arc<Args>, seed: usize, stop: Arc<AtomicBool>) -> Vec<u64> {
    let mut count = 0u64;
    let mut buf = Vec::with_capacity(4096);
    let mut n = seed;
    while !stop.load(Ordering::Relaxed) {
        n = n
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let key = (n >> 33) % a.keys;
        let Ok(mut s) = TcpStream::connect(a.addr) else {
            continue;
        };
        s.set_nodelay(true).unwrap();
        s.write_all(format!("get key:{key}\r\n").as_bytes())
            .unwrap();
        if read_reply(&mut s, &mut buf, b"END\r\n") {
            count += 1;
        }
    }
    vec![count]
}

/// `ringstore-bench load ARGS`: prints one line (see the top of this file).
#[expect(
    clippy::unwrap_used,
    reason = "a measurement tool run by hand: a failure should stop it with the message"
)]
pub fn main(argv: &[String]) {
    let a = Arc::new(parse_args(argv));
    preload(&a);
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let handles: Vec<_> = (0..a.threads)
        .map(|t| {
            let (a, stop) = (a.clone(), stop.clone());
            let share = a.conns / a.threads + usize::from(t < a.conns % a.threads);
            std::thread::spawn(move || {
                if a.mode == "short" {
                    short_thread(a, t + 1, stop)
                } else {
                    long_thread(a, share, t + 1, stop)
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(a.secs));
    stop.store(true, Ordering::Relaxed);
    let counts: Vec<u64> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    let elapsed = started.elapsed().as_secs_f64();
    let total: u64 = counts.iter().sum();
    let (min, max) = (
        counts.iter().min().copied().unwrap_or(0),
        counts.iter().max().copied().unwrap_or(0),
    );
    println!(
        "mode={} conns={} threads={} ops={} ops_per_sec={:.0} per_conn_min={} per_conn_max={}",
        a.mode,
        if a.mode == "short" {
            a.threads
        } else {
            a.conns
        },
        a.threads,
        total,
        total as f64 / elapsed,
        min,
        max
    );
}
