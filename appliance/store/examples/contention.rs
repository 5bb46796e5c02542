//! The store's serial fraction: GET or SET of 100-byte values over the bench's 10 000 keys
//! from 1 and 2 threads on one shared store (the shard count a 2-worker server uses), with
//! the shard-lock contention counters: acquisitions that waited, time waiting, time held,
//! and the time per operation with the global CAS counter's cache line in play (SET).
//!
//! `cargo run --release -p ringstore-store --features contention --example contention -- [secs]`

#![forbid(unsafe_code)]

use ringstore_store::{
    contention_snapshot, Contention, NewMeta, ReadOpts, Store, StoreConfig, Write,
};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The bench's keyspace for 100-byte values.
const KEYS: u64 = 10_000;
const VALUE: [u8; 100] = [b'v'; 100];

fn key(n: u64) -> Vec<u8> {
    format!("key:{}", n % KEYS).into_bytes()
}

fn set(store: &Store, k: &[u8]) {
    let _ = store.update(k, 1, |_| {
        (
            Write::Put {
                value: &VALUE,
                meta: NewMeta::default(),
            },
            (),
        )
    });
}

fn get(store: &Store, k: &[u8]) -> Option<usize> {
    let opts = ReadOpts {
        mark_access: true,
        touch: None,
        see_large: false,
    };
    store.get(k, 1, opts, |item| item.map(|i| i.value.len()))
}

fn next(n: u64) -> u64 {
    n.wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407)
}

/// (operations, CPU seconds) of `threads` threads, each pinned to its own CPU, for `secs`.
#[expect(
    clippy::unwrap_used,
    reason = "a measurement tool run by hand: a failure should stop it with the message"
)]
fn run(store: &Arc<Store>, threads: usize, writes: bool, secs: f64) -> (u64, f64) {
    let stop = Arc::new(AtomicBool::new(false));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (store, stop) = (store.clone(), stop.clone());
            std::thread::spawn(move || {
                let _ = ringstore_sys::set_affinity(&[t]);
                let cpu0 = ringstore_sys::thread_cpu_time();
                let (mut n, mut ops) = (t as u64 + 1, 0u64);
                while !stop.load(Ordering::Relaxed) {
                    for _ in 0..256 {
                        n = next(n);
                        let k = key(n >> 17);
                        if writes {
                            set(&store, &k);
                        } else {
                            std::hint::black_box(get(&store, &k));
                        }
                    }
                    ops += 256;
                }
                let cpu = ringstore_sys::thread_cpu_time() - cpu0;
                (ops, cpu.as_secs_f64())
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs_f64(secs));
    stop.store(true, Ordering::Relaxed);
    handles
        .into_iter()
        .map(|h| h.join().unwrap())
        .fold((0, 0.0), |(o, c), (o1, c1)| (o + o1, c + c1))
}

fn delta(a: Contention, b: Contention) -> Contention {
    Contention {
        acquisitions: b.acquisitions - a.acquisitions,
        waited: b.waited - a.waited,
        wait_ns: b.wait_ns - a.wait_ns,
        held_ns: b.held_ns - a.held_ns,
    }
}

fn report(label: &str, threads: usize, (ops, cpu): (u64, f64), c: Contention) {
    let per = |x: u64| x as f64 / ops.max(1) as f64;
    println!(
        "{label} {threads} thread(s): {ops} ops, {:.0} ns CPU/op; lock acquisitions/op {:.3}, waited {} ({:.4}% of acquisitions), wait {:.1} ns/op, held {:.1} ns/op",
        1e9 * cpu / ops.max(1) as f64,
        per(c.acquisitions),
        c.waited,
        100.0 * c.waited as f64 / c.acquisitions.max(1) as f64,
        per(c.wait_ns),
        per(c.held_ns),
    );
}

#[expect(
    clippy::unwrap_used,
    reason = "a measurement tool run by hand: a failure should stop it with the message"
)]
fn main() {
    let secs: f64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(2.0);
    let store = Arc::new(
        Store::new(StoreConfig {
            memory_bytes: 1024 << 20,
            item_size_max: 1 << 20,
            // What `serve --cores 2` uses: 64 shards per worker, at least 64.
            shards: 128,
            huge_pages: false,
            external_threshold: 0,
        })
        .unwrap(),
    );
    println!("shards in use: {}", store.shard_count());
    for k in 0..KEYS {
        set(&store, &key(k));
    }
    for (label, writes) in [("GET", false), ("SET", true)] {
        for threads in [1, 2] {
            let before = contention_snapshot();
            let done = run(&store, threads, writes, secs);
            report(label, threads, done, delta(before, contention_snapshot()));
        }
    }
}
