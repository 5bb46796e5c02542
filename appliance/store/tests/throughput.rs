//! A rough throughput check of the hot paths (small get and set), run with `--ignored`
//! in release mode; it prints operations per second and asserts only that work was done.

use std::sync::Arc;
use std::time::Instant;

use ringstore_store::{NewMeta, ReadOpts, Store, StoreConfig, Write, NEVER};

#[test]
#[ignore = "timing; run with --release -- --ignored --nocapture"]
fn small_get_and_set_rate() {
    let s = Arc::new(
        Store::new(StoreConfig {
            memory_bytes: 256 << 20,
            item_size_max: 1 << 20,
            shards: 64,
            huge_pages: true,
            external_threshold: 0,
        })
        .expect("store"),
    );
    let keys: Vec<Vec<u8>> = (0..200_000u32)
        .map(|i| format!("key:{i:07}").into_bytes())
        .collect();
    let value = [b'v'; 100];
    let meta = NewMeta {
        flags: 0,
        exptime: NEVER,
        cas: None,
    };
    let t = Instant::now();
    for k in &keys {
        s.update(k, 1, |_| {
            (
                Write::Put {
                    value: &value,
                    meta,
                },
                (),
            )
        })
        .expect("put");
    }
    let set_rate = keys.len() as f64 / t.elapsed().as_secs_f64();
    let keys = Arc::new(keys);
    let threads = 2;
    let per_thread = 1_000_000;
    let t = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|n| {
            let (s, keys) = (s.clone(), keys.clone());
            std::thread::spawn(move || {
                let mut hits = 0usize;
                let mut buf = [0u8; 128];
                for i in 0..per_thread {
                    let k = &keys[(i * 7919 + n * 13) % keys.len()];
                    hits += s.get(
                        k,
                        1,
                        ReadOpts {
                            mark_access: true,
                            touch: None,
                            see_large: false,
                        },
                        |item| {
                            item.map_or(0, |it| {
                                buf[..it.value.len()].copy_from_slice(it.value);
                                1
                            })
                        },
                    );
                }
                hits
            })
        })
        .collect();
    let hits: usize = handles.into_iter().map(|h| h.join().expect("thread")).sum();
    let get_rate = (threads * per_thread) as f64 / t.elapsed().as_secs_f64();
    println!(
        "backing {:?}: set {set_rate:.0}/s (1 thread), get {get_rate:.0}/s ({threads} threads)",
        s.backing()
    );
    assert_eq!(hits, threads * per_thread);
}
