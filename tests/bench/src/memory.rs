//! Memory per item: RSS after storing N 100-byte values minus RSS when empty, divided by N,
//! with a memory budget large enough that nothing is evicted (checked with `curr_items`).

use super::fill;
use super::procs::{self, Pinned};
use anyhow::{bail, Result};
use std::time::Duration;

pub const VALUE_LEN: usize = 100;

/// RSS readings of one server.
pub struct MemoryRun {
    pub rss_empty: u64,
    pub rss_full: u64,
    pub items: u64,
}

impl MemoryRun {
    pub fn bytes_per_item(&self) -> f64 {
        self.rss_full.saturating_sub(self.rss_empty) as f64 / self.items as f64
    }
}

/// Fills a freshly started server with `items` keys and reads its RSS before and after.
pub fn measure(server: &mut Pinned, items: usize) -> Result<MemoryRun> {
    // Let the server finish its start-up allocations before the empty reading.
    std::thread::sleep(Duration::from_millis(300));
    let rss_empty = procs::rss_bytes(server.pid())?;
    eprintln!(
        "{}: filling {items} items of {VALUE_LEN} bytes",
        server.name
    );
    fill::preload(server.port, VALUE_LEN, items)?;
    server.check_alive()?;
    let stored = fill::stat_u64(server.port, "curr_items")?;
    if stored != items as u64 {
        bail!(
            "{} holds {stored} items after storing {items} (evicted or lost)",
            server.name
        );
    }
    if !fill::check_hit(server.port, VALUE_LEN, 0)?
        || !fill::check_hit(server.port, VALUE_LEN, items - 1)?
    {
        bail!("{} lost the first or last key", server.name);
    }
    let rss_full = procs::rss_bytes(server.pid())?;
    Ok(MemoryRun {
        rss_empty,
        rss_full,
        items: stored,
    })
}
