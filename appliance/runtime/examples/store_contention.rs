//! ADR-0002 microbenchmark: the shared sharded store under 1 and 2 threads, against the cost
//! of forwarding an operation to another core and waiting for the answer (what a partitioned
//! keyspace pays for every remote key).
//!
//! `cargo run --release -p ringstore-runtime --example store_contention -- [secs]`

#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::sync_channel;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ringstore_store::{NewMeta, ReadOpts, Store, StoreConfig, Write};

const KEYS: u64 = 10_000;

fn key(n: u64) -> Vec<u8> {
    format!("key:{}", n % KEYS).into_bytes()
}

/// One memtier-like operation: 1 set per 10 gets.
fn op(store: &Store, n: u64) {
    let k = key(n >> 7);
    if (n >> 3) % 11 == 1 {
        let _ = store.update(&k, 1, |_| {
            (
                Write::Put {
                    value: b"0123456789abcdef0123456789abcdef",
                    meta: NewMeta::default(),
                },
                (),
            )
        });
    } else {
        store.get(
            &k,
            1,
            ReadOpts {
                mark_access: true,
                touch: None,
                see_large: false,
            },
            |item| item.map(|i| i.value.len()),
        );
    }
}

fn next(n: u64) -> u64 {
    n.wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407)
}

fn pin(cpu: usize) {
    // Best effort, as before: an unpinned run still measures.
    let _ = ringstore_sys::set_affinity(&[cpu]);
}

/// CPU seconds the calling thread has used.
fn thread_cpu() -> f64 {
    ringstore_sys::thread_cpu_time().as_secs_f64()
}

/// (ops per wall second, ops per CPU second) with `threads` threads on one shared store.
#[expect(
    clippy::unwrap_used,
    reason = "a measurement tool run by hand: a failure should stop it with the message"
)]
fn shared(store: &Arc<Store>, threads: usize, secs: u64) -> (f64, f64) {
    let stop = Arc::new(AtomicBool::new(false));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (store, stop) = (store.clone(), stop.clone());
            std::thread::spawn(move || {
                pin(t);
                let cpu0 = thread_cpu();
                let mut n = t as u64 + 1;
                let mut ops = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    for _ in 0..256 {
                        n = next(n);
                        op(&store, n);
                    }
                    ops += 256;
                }
                (ops, thread_cpu() - cpu0)
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(secs));
    stop.store(true, Ordering::Relaxed);
    let results: Vec<(u64, f64)> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let ops: u64 = results.iter().map(|r| r.0).sum();
    let cpu: f64 = results.iter().map(|r| r.1).sum();
    (ops as f64 / secs as f64, ops as f64 / cpu)
}

/// Every operation is sent to an owner thread on the other CPU and its answer awaited.
#[expect(
    clippy::unwrap_used,
    reason = "a measurement tool run by hand: a failure should stop it with the message"
)]
fn forwarded(store: &Arc<Store>, secs: u64) -> f64 {
    let (to_owner, owner_rx) = sync_channel::<u64>(1024);
    let (to_caller, caller_rx) = sync_channel::<()>(1024);
    let owner_store = store.clone();
    let owner = std::thread::spawn(move || {
        pin(1);
        while let Ok(n) = owner_rx.recv() {
            op(&owner_store, n);
            if to_caller.send(()).is_err() {
                break;
            }
        }
    });
    pin(0);
    let started = Instant::now();
    let mut n = 1u64;
    let mut ops = 0u64;
    while started.elapsed() < Duration::from_secs(secs) {
        for _ in 0..64 {
            n = next(n);
            to_owner.send(n).unwrap();
            caller_rx.recv().unwrap();
        }
        ops += 64;
    }
    drop(to_owner);
    owner.join().unwrap();
    ops as f64 / started.elapsed().as_secs_f64()
}

#[expect(
    clippy::unwrap_used,
    reason = "a measurement tool run by hand: a failure should stop it with the message"
)]
fn main() {
    let secs: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let store = Arc::new(
        Store::new(StoreConfig {
            memory_bytes: 64 << 20,
            item_size_max: 1 << 20,
            shards: 1024,
            huge_pages: false,
            external_threshold: 0,
        })
        .unwrap(),
    );
    for k in 0..KEYS {
        let _ = store.update(&key(k), 1, |_| {
            (
                Write::Put {
                    value: b"0123456789abcdef0123456789abcdef",
                    meta: NewMeta::default(),
                },
                (),
            )
        });
    }
    let (one, one_cpu) = shared(&store, 1, secs);
    let (two, two_cpu) = shared(&store, 2, secs);
    let fwd = forwarded(&store, secs);
    println!(
        "shared store, 1 thread:  {one:.0} ops/s, {one_cpu:.0} ops per CPU-second ({:.0} ns/op)",
        1e9 / one_cpu
    );
    println!(
        "shared store, 2 threads: {two:.0} ops/s ({:.2}x), {two_cpu:.0} ops per CPU-second ({:.0} ns/op)",
        two / one,
        1e9 / two_cpu
    );
    println!(
        "forwarded to the other core, round trip per op: {fwd:.0} ops/s ({:.0} ns/op)",
        1e9 / fwd
    );
}
