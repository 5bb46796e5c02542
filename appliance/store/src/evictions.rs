//! Telling an observer of each item eviction drops (memcached's `watch evictions`), at no
//! cost while nobody asks: one relaxed load per compaction.

/// One evicted item, as memcached's `type=eviction` log line describes it.
#[derive(Debug, Clone, Copy)]
pub struct Evicted<'a> {
    pub key: &'a [u8],
    /// Read since it was stored (memcached's `fetch=yes|no`).
    pub fetched: bool,
    /// Seconds it had left to live; `None` when it never expires (memcached: `ttl=-1`).
    pub ttl: Option<u32>,
    /// Seconds since it was last accessed (memcached's `la=`).
    pub idle: u32,
    /// Value length in bytes.
    pub size: usize,
}

/// What the store tells of evictions (`Store::attach_eviction_log`). Called under a shard
/// lock on the evicting worker's thread: it must not block nor call into the store.
pub trait EvictionLog: Send + Sync {
    /// True while someone wants eviction lines (checked once per compacted segment).
    fn wanted(&self) -> bool;
    /// One item was evicted.
    fn evicted(&self, item: &Evicted<'_>);
}

impl Evicted<'_> {
    /// The description of the item with header `h` and key `key`, evicted at `now`.
    pub(crate) fn of<'k>(h: &crate::item::Header, key: &'k [u8], now: u32) -> Evicted<'k> {
        Evicted {
            key,
            fetched: h.bits & crate::item::FETCHED != 0,
            ttl: (h.exptime != 0).then(|| h.exptime.saturating_sub(now)),
            idle: now.saturating_sub(h.last_access(now)),
            size: h.value_len,
        }
    }
}
