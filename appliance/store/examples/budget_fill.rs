//! In-process twin of `cargo xtask bench --only memory`'s budget fill (issue 24): 1.5M sets
//! of 100-byte values, keys `key:000000000`.., into a 64 MiB store, then every key read back;
//! prints the kept count per run (each run a new store, so a new hash seed) with the index
//! and segment bytes, so the count's spread and where it comes from show without a server.
//!
//! `cargo run --release -p ringstore-store --example budget_fill -- [RUNS] [SHARDS]`
//! (SHARDS as the server asks for: 64 per core, at least 64).

use ringstore_store::{NewMeta, ReadOpts, Store, StoreConfig, Write, NEVER};
use std::io::Write as _;

const SETS: usize = 1_500_000;
const VALUE_LEN: usize = 100;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let runs: usize = args.next().map_or(Ok(5), |a| a.parse())?;
    let shards: usize = args.next().map_or(Ok(64), |a| a.parse())?;
    let value = [b'v'; VALUE_LEN];
    for run in 1..=runs {
        let store = Store::new(StoreConfig {
            memory_bytes: 64 << 20,
            item_size_max: 1 << 20,
            shards,
            huge_pages: false,
            external_threshold: 0,
        })?;
        let mut key = Vec::with_capacity(16);
        for i in 0..SETS {
            key.clear();
            write!(key, "key:{i:09}")?;
            let meta = NewMeta {
                flags: 0,
                exptime: NEVER,
                cas: None,
            };
            store.update(&key, 1, |_| {
                (
                    Write::Put {
                        value: &value,
                        meta,
                    },
                    (),
                )
            })?;
        }
        let mut kept = 0u64;
        for i in 0..SETS {
            key.clear();
            write!(key, "key:{i:09}")?;
            let opts = ReadOpts {
                mark_access: true,
                ..ReadOpts::default()
            };
            kept += u64::from(store.get(&key, 1, opts, |item| item.is_some()));
        }
        let st = store.stats();
        println!(
            "run {run}: shards {} kept {kept} curr_items {} evictions {} index_bytes {} segment_bytes {} unwritten_bytes {}",
            store.shard_count(),
            st.curr_items,
            st.evictions,
            st.index_bytes,
            st.segment_bytes,
            st.unwritten_bytes
        );
    }
    Ok(())
}
