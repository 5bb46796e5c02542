//! What an HTTP session needs from the keyspace, as a small trait: the real store behind
//! [`Shared`] in production, an in-memory map in the session's unit tests.

use ringstore_proto::http::Status;
use ringstore_store::{
    ItemRef, Journal, Journaled, NewMeta, ReadOpts, Reservation, Store, StoreError, Updated, Write,
};

use crate::device::Device;

use crate::memcache::expiry::{expiry, Expiry};
use crate::{Now, Shared, WorkerStats};

/// A stored object as a reply needs it.
#[derive(Debug, Clone, Copy)]
pub struct Object<'a> {
    pub value: &'a [u8],
    pub flags: u32,
    pub cas: u64,
    /// `value` is a large object's manifest (see [`ringstore_durable::Manifest`]).
    pub large: bool,
}

impl<'a> From<ItemRef<'a>> for Object<'a> {
    fn from(item: ItemRef<'a>) -> Self {
        Object {
            value: item.value,
            flags: item.flags,
            cas: item.cas,
            large: item.large,
        }
    }
}

/// What a session may do with objects larger than `item_size_max` (only with a data device).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LargeLimits {
    /// Largest object accepted (413 beyond).
    pub object_size_max: u64,
    /// Bytes per chunk on the device.
    pub chunk_len: usize,
    /// Bytes of the worker's region of the device (what bounds unfinished uploads).
    pub region_len: u64,
}

/// Outcome of a PUT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutOutcome {
    /// Stored; `created` when no live item had the key. `cas` of the new value.
    Stored { created: bool, cas: Option<u64> },
    /// The store refused the size (413).
    TooLarge,
    /// No memory could be freed for it (507).
    OutOfMemory,
}

/// A request outcome worth counting in `stats` (memcached's names in brackets).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// GET or HEAD [cmd_get, get_hits / get_misses].
    Get { hit: bool },
    /// PUT [cmd_set].
    Set,
    /// DELETE [delete_hits / delete_misses].
    Delete { hit: bool },
    /// A final response was written [http_requests, http_responses_4xx / _5xx].
    Response(Status),
    /// A request refused 401 under `--http-tokens` [http_auth_failures].
    AuthFailed,
}

/// Keyspace operations and limits an HTTP session uses.
pub trait Backend {
    /// Counts a request outcome for worker `worker`.
    fn record(&self, worker: usize, event: Event) {
        let _ = (worker, event);
    }
    /// Largest value accepted (413 beyond).
    fn item_size_max(&self) -> usize;
    /// Output size past which the session stops and asks the runtime to drain.
    fn out_high_water(&self) -> usize;
    /// The connection-memory budget request bodies are reserved in (`None`: unbounded, for
    /// tests of other behaviour).
    fn conn_memory(&self) -> Option<&std::sync::Arc<crate::budget::ConnMemory>> {
        None
    }
    /// Reads `key` (marking it accessed) and calls `f` with it while it is pinned.
    fn read<R>(&self, key: &[u8], now: Now, f: impl FnOnce(Option<Object<'_>>) -> R) -> R;
    /// Stores `value` with memcache exptime `ttl` (0 never, up to 30 days relative, beyond
    /// absolute, negative already expired).
    fn put(&self, key: &[u8], value: &[u8], flags: u32, ttl: i64, now: Now) -> PutOutcome;
    /// Removes `key`; false when no live item had it.
    fn delete(&self, key: &[u8], now: Now) -> bool;
    /// Reserves an item for a PUT body of `len` bytes to be received straight into it
    /// (`direct.rs`), with `flags` and memcache exptime `ttl`; `None` (the default, and
    /// whenever the store does not reserve): the body is buffered.
    fn reserve(
        &self,
        key: &[u8],
        len: usize,
        flags: u32,
        ttl: i64,
        now: Now,
    ) -> Option<Reservation> {
        let _ = (key, len, flags, ttl, now);
        None
    }
    /// Copies `bytes` into reservation `r` at `offset`; false when they did not land.
    fn fill(&self, r: &Reservation, offset: usize, bytes: &[u8]) -> bool {
        let _ = (r, offset, bytes);
        false
    }
    /// The body is whole: the reserved item replaces `key`'s, as [`Backend::put`] stores.
    fn commit_put(&self, r: Reservation, key: &[u8], now: Now) -> PutOutcome {
        let _ = (r, key, now);
        PutOutcome::OutOfMemory
    }
    /// The body will not be completed: the reservation goes back.
    fn abandon(&self, r: Reservation) {
        let _ = r;
    }
    /// The worker's data device, when one is attached (large objects' chunks go through it).
    fn device(&self) -> Option<&dyn Device> {
        None
    }
    /// Large objects: `None` without a data device (bodies over `item_size_max` get 413).
    fn large(&self) -> Option<LargeLimits> {
        None
    }
    /// `--http-tokens` (and the failure log): `None` serves every request unauthenticated.
    fn auth(&self) -> Option<&crate::auth::Auth> {
        None
    }
    /// The server's unfinished large uploads (`None`: not bounded, for tests of other
    /// behaviour).
    fn uploads(&self) -> Option<&std::sync::Arc<super::UploadLedger>> {
        None
    }
    /// Counts a GET, HEAD or PUT of `key` for the hot-key listing.
    fn count_key(&self, worker: usize, key: &[u8]) {
        let _ = (worker, key);
    }
    /// `GET /_hotkeys`: the `k` hot keys starting with `prefix`, as JSON (`None`: 404).
    fn hot_keys(&self, k: usize, prefix: &[u8]) -> Option<Vec<u8>> {
        let _ = (k, prefix);
        None
    }
    /// `GET /metrics`: appends the exposition (OpenMetrics when `open_metrics`) to `out`;
    /// false when this backend has none (then `/metrics` names a key like any other).
    fn metrics(&self, worker: usize, now: Now, open_metrics: bool, out: &mut Vec<u8>) -> bool {
        let _ = (worker, now, open_metrics, out);
        false
    }
    /// Large objects: publish `manifest` under `key` (every chunk is durable).
    fn put_large(&self, key: &[u8], manifest: &[u8], flags: u32, ttl: i64, now: Now) -> PutOutcome {
        let _ = (key, manifest, flags, ttl, now);
        PutOutcome::TooLarge
    }
}

/// The real keyspace and the limits an HTTP session obeys.
#[derive(Clone, Copy)]
pub struct StoreBackend<'a> {
    pub store: &'a Store,
    /// The worker's counter slot; `None` counts nothing.
    pub stats: Option<&'a WorkerStats>,
    pub item_size_max: usize,
    pub out_high_water: usize,
    /// Largest HTTP object with a data device (`object-size-max`).
    pub object_size_max: u64,
    /// Where request bodies are reserved.
    pub conn_memory: Option<&'a std::sync::Arc<crate::budget::ConnMemory>>,
    /// The worker's data device, when one is attached.
    pub device: Option<&'a dyn Device>,
    /// `--http-tokens`, when given.
    pub auth: Option<&'a crate::auth::Auth>,
    /// The server's unfinished large uploads.
    pub uploads: Option<&'a std::sync::Arc<super::UploadLedger>>,
    /// The whole server, for `/metrics` and the hot keys (`None`: neither).
    pub shared: Option<&'a Shared>,
}

impl<'a> StoreBackend<'a> {
    pub fn of(
        shared: &'a Shared,
        worker: usize,
        device: Option<&'a dyn Device>,
    ) -> StoreBackend<'a> {
        StoreBackend {
            store: &shared.store,
            stats: Some(shared.stats(worker)),
            item_size_max: shared.config.item_size_max,
            out_high_water: shared.config.out_high_water,
            object_size_max: shared.config.object_size_max,
            conn_memory: Some(&shared.conn_memory),
            device,
            auth: shared.started.auth.as_ref(),
            uploads: Some(&shared.uploads),
            shared: Some(shared),
        }
    }

    /// The store, with writes logged to the data device first.
    fn logged(&self) -> Journaled<'a> {
        self.store.journaled(self.device.map(|d| d as &dyn Journal))
    }
}

impl Backend for StoreBackend<'_> {
    fn auth(&self) -> Option<&crate::auth::Auth> {
        self.auth
    }
    fn record(&self, _worker: usize, event: Event) {
        let Some(stats) = self.stats else { return };
        match event {
            Event::Get { hit } => {
                stats.cmd_get.inc();
                if hit {
                    stats.get_hits.inc()
                } else {
                    stats.get_misses.inc()
                }
            }
            Event::Set => stats.cmd_set.inc(),
            Event::AuthFailed => stats.http_auth_failures.inc(),
            Event::Delete { hit } => {
                if hit {
                    stats.delete_hits.inc()
                } else {
                    stats.delete_misses.inc()
                }
            }
            Event::Response(status) => {
                stats.http_requests.inc();
                match status.code() {
                    400..=499 => stats.http_responses_4xx.inc(),
                    500..=599 => stats.http_responses_5xx.inc(),
                    _ => {}
                }
            }
        }
    }

    fn count_key(&self, worker: usize, key: &[u8]) {
        if let Some(hot) = self.shared.map(|s| &s.hotkeys) {
            hot.record(worker, key);
        }
    }

    fn hot_keys(&self, k: usize, prefix: &[u8]) -> Option<Vec<u8>> {
        let hot = &self.shared?.hotkeys;
        Some(crate::hotkeys::json(hot, k, &hot.top(k, prefix)))
    }

    fn item_size_max(&self) -> usize {
        self.item_size_max
    }

    fn metrics(&self, worker: usize, now: Now, open_metrics: bool, out: &mut Vec<u8>) -> bool {
        let Some(shared) = self.shared else {
            return false;
        };
        crate::metrics::render(shared, worker, self.device, now, open_metrics, out);
        true
    }

    fn out_high_water(&self) -> usize {
        self.out_high_water
    }

    fn conn_memory(&self) -> Option<&std::sync::Arc<crate::budget::ConnMemory>> {
        self.conn_memory
    }

    fn read<R>(&self, key: &[u8], now: Now, f: impl FnOnce(Option<Object<'_>>) -> R) -> R {
        let opts = ReadOpts {
            mark_access: true,
            touch: None,
            see_large: true,
        };
        self.logged()
            .get(key, now.store, opts, |item| f(item.map(Object::from)))
    }

    fn put(&self, key: &[u8], value: &[u8], flags: u32, ttl: i64, now: Now) -> PutOutcome {
        self.store_value(key, value, false, flags, ttl, now)
    }

    fn large(&self) -> Option<LargeLimits> {
        let device = self.device?;
        let chunk_len = device.chunk_len();
        (chunk_len > 0 && self.object_size_max > self.item_size_max as u64).then_some(LargeLimits {
            object_size_max: self.object_size_max,
            chunk_len,
            region_len: device.region_len(),
        })
    }

    fn uploads(&self) -> Option<&std::sync::Arc<super::UploadLedger>> {
        self.uploads
    }

    fn device(&self) -> Option<&dyn Device> {
        self.device
    }

    fn put_large(&self, key: &[u8], manifest: &[u8], flags: u32, ttl: i64, now: Now) -> PutOutcome {
        self.store_value(key, manifest, true, flags, ttl, now)
    }

    fn reserve(
        &self,
        key: &[u8],
        len: usize,
        flags: u32,
        ttl: i64,
        now: Now,
    ) -> Option<Reservation> {
        // With a data device the journal records whole values: no reservation.
        if self.device.is_some() {
            return None;
        }
        let Expiry::At(exptime) = expiry(ttl, now) else {
            return None; // stored already expired: nothing to receive into
        };
        let meta = NewMeta {
            flags,
            exptime,
            cas: None,
        };
        self.store.reserve(key, len, meta, now.store)
    }

    fn fill(&self, r: &Reservation, offset: usize, bytes: &[u8]) -> bool {
        self.store.fill(r, offset, bytes)
    }

    fn commit_put(&self, r: Reservation, key: &[u8], now: Now) -> PutOutcome {
        let updated = self
            .store
            .commit(r, key, now.store, |current| (true, current.is_none()));
        put_outcome(updated)
    }

    fn abandon(&self, r: Reservation) {
        self.store.abandon(r);
    }

    fn delete(&self, key: &[u8], now: Now) -> bool {
        let deleted = self
            .logged()
            .update(key, now.store, |current| match current {
                Some(_) => (Write::Delete, true),
                None => (Write::Nothing, false),
            });
        matches!(deleted, Ok(done) if done.result)
    }
}

impl StoreBackend<'_> {
    /// PUT of a value, or of a large object's manifest.
    fn store_value(
        &self,
        key: &[u8],
        value: &[u8],
        large: bool,
        flags: u32,
        ttl: i64,
        now: Now,
    ) -> PutOutcome {
        let expires = match expiry(ttl, now) {
            Expiry::At(at) => Some(at),
            Expiry::Expired => None,
        };
        let updated = self.logged().update(key, now.store, |current| {
            let created = current.is_none();
            let write = match expires {
                Some(exptime) => {
                    let meta = NewMeta {
                        flags,
                        exptime,
                        cas: None,
                    };
                    if large {
                        Write::PutLarge {
                            manifest: value,
                            meta,
                        }
                    } else {
                        Write::Put { value, meta }
                    }
                }
                // Stored already expired: what remains observable is that the old value is gone.
                None if created => Write::Nothing,
                None => Write::Delete,
            };
            (write, created)
        });
        put_outcome(updated)
    }
}

/// What a PUT's store (`created`: no item had its key) comes to.
fn put_outcome(updated: Result<Updated<bool>, StoreError>) -> PutOutcome {
    match updated {
        Ok(done) => PutOutcome::Stored {
            created: done.result,
            cas: done.cas,
        },
        Err(StoreError::TooLarge) => PutOutcome::TooLarge,
        // 507 Insufficient Storage says both.
        Err(StoreError::OutOfMemory | StoreError::DeviceFull | StoreError::Config(_)) => {
            PutOutcome::OutOfMemory
        }
    }
}
