//! Hot keys: the keys read and written most, from a bounded Space-Saving sketch per worker
//! fed by a sample of the requests, merged when asked (memcache `stats hotkeys`, HTTP
//! `GET /_hotkeys`, the console's `hotkeys`). ADR 0044.
//!
//! Cost per request: [`HotKeys::record`] is one relaxed load and store of the worker's own
//! countdown; one request in [`SAMPLE_ONE_IN`] on average (the countdown restarts at a random
//! value, so a periodic workload cannot alias with it) takes the worker's own sketch lock
//! with `try_lock` (a sample that finds a reader merging is dropped, never waited for),
//! hashes the key and updates the sketch: a probe of its index and a sift of its heap.
//!
//! `--hotkeys off` ([`HotKeys::switched`]): one predictable branch per request instead, no
//! sketch, empty listings.
//!
//! Memory: [`ENTRIES`] entries of at most [`KEY_MAX`] key bytes per worker slot (144 KiB,
//! [`SKETCH_BYTES`]), fewer with many workers so all of them hold at most [`TOTAL_BYTES`]
//! ([`entries_for`]); each allocated on the slot's first sample and never grown, whatever
//! the keys.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard, TryLockError};

use ringstore_proto::memcache::key::{base64_encode, valid_text_key};
use ringstore_proto::memcache::reply;

/// One request in this many, on average, updates a sketch.
/// The default (`--hotkeys-sample`); the config crate's `HOTKEYS_SAMPLE_DEFAULT` is the same.
pub const SAMPLE_ONE_IN: u32 = 128;
/// Counters per worker sketch (Space-Saving's `m`) at most: a key counted more than
/// `N / ENTRIES` times of the `N` samples a worker took is in its sketch.
pub const ENTRIES: usize = 512;
/// Counters per worker sketch at least, however many workers share [`TOTAL_BYTES`].
pub const ENTRIES_MIN: usize = 32;
/// What every sketch together may hold: [`ENTRIES`] each up to 13 worker slots, fewer
/// beyond (so the bound stays inside the memory bound's fixed part), never under
/// [`ENTRIES_MIN`] (past 227 slots the total is `slots × sketch_bytes(ENTRIES_MIN)`).
pub const TOTAL_BYTES: usize = 2 << 20;
/// Longest key a sketch holds (the store's limit; a longer one is never stored anyway).
pub const KEY_MAX: usize = ringstore_store::KEY_LEN_MAX;
/// Most keys one answer lists.
pub const TOP_MAX: usize = 100;
/// Keys listed when the request names no number.
pub const TOP_DEFAULT: usize = 10;

/// Bytes of one [`SpaceSaving`] sketch of [`ENTRIES`] entries.
pub const SKETCH_BYTES: usize = sketch_bytes(ENTRIES);
/// Bytes per entry: the key bytes, its count, error, hash, length and heap position, its
/// place in the heap; and two index slots (the index has twice as many, rounded up to a
/// power of two, which [`sketch_bytes`] adds).
const ENTRY_BYTES: usize = KEY_MAX + 3 * 8 + 1 + 2 + 2;

/// Bytes of one sketch of `cap` entries.
pub const fn sketch_bytes(cap: usize) -> usize {
    cap * ENTRY_BYTES + index_len(cap) * 2
}

/// Entries per sketch for `slots` worker slots sharing [`TOTAL_BYTES`].
pub fn entries_for(slots: usize) -> usize {
    let mut cap = ENTRIES;
    while cap > ENTRIES_MIN && slots.saturating_mul(sketch_bytes(cap)) > TOTAL_BYTES {
        cap /= 2;
    }
    cap
}

const fn index_len(cap: usize) -> usize {
    (cap * 2).next_power_of_two()
}

/// A Space-Saving summary (Metwally et al., 2005) of at most `cap` keys: each key seen is
/// counted; a new key when every counter is taken replaces the key with the smallest count
/// and inherits that count plus one. With `n` keys observed, a key seen more than
/// `n / cap` times is held, and every count exceeds its key's true count by at most the
/// smallest count, itself at most `n / cap`.
#[derive(Debug)]
pub struct SpaceSaving {
    cap: usize,
    used: usize,
    observed: u64,
    seed: u64,
    count: Box<[u64]>,
    /// The count an entry inherited when it took its counter (its overestimate at most).
    err: Box<[u64]>,
    hash: Box<[u64]>,
    len: Box<[u8]>,
    keys: Box<[u8]>,
    /// Entries ordered as a binary min-heap by count.
    heap: Box<[u16]>,
    /// Each entry's place in `heap`.
    pos: Box<[u16]>,
    /// Open addressing with linear probing: entry + 1, 0 for an empty slot.
    index: Box<[u16]>,
}

/// One entry of a sketch, as [`SpaceSaving::entries`] lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry<'a> {
    pub key: &'a [u8],
    /// Observations counted (at least the true number).
    pub count: u64,
    /// What the count may exceed the true number by.
    pub err: u64,
}

impl SpaceSaving {
    /// An empty sketch of `cap` counters (1..=32767), its keys hashed with `seed`.
    pub fn new(cap: usize, seed: u64) -> SpaceSaving {
        let cap = cap.clamp(1, i16::MAX as usize);
        SpaceSaving {
            cap,
            used: 0,
            observed: 0,
            seed,
            count: vec![0; cap].into(),
            err: vec![0; cap].into(),
            hash: vec![0; cap].into(),
            len: vec![0; cap].into(),
            keys: vec![0; cap * KEY_MAX].into(),
            heap: vec![0; cap].into(),
            pos: vec![0; cap].into(),
            index: vec![0; index_len(cap)].into(),
        }
    }

    /// Bytes the sketch holds (fixed at creation).
    pub fn memory_bytes(&self) -> usize {
        (self.count.len() + self.err.len() + self.hash.len()) * 8
            + self.len.len()
            + self.keys.len()
            + (self.heap.len() + self.pos.len() + self.index.len()) * 2
    }

    /// Observations so far.
    pub fn observed(&self) -> u64 {
        self.observed
    }

    /// The smallest count when every counter is taken, else 0: no key outside the sketch
    /// was observed more often.
    pub fn min_count(&self) -> u64 {
        if self.used < self.cap {
            0
        } else {
            self.count[usize::from(self.heap[0])]
        }
    }

    /// Counts one observation of `key` (a key over [`KEY_MAX`] bytes is not counted).
    pub fn observe(&mut self, key: &[u8]) {
        if key.len() > KEY_MAX {
            return;
        }
        self.observed += 1;
        let h = hash(self.seed, key);
        if let Some(e) = self.find(h, key) {
            self.count[e] += 1;
            self.sift_down(usize::from(self.pos[e]));
            return;
        }
        if self.used < self.cap {
            let e = self.used;
            self.used += 1;
            self.fill(e, key, h, 1, 0);
            self.heap[e] = slot16(e);
            self.pos[e] = slot16(e);
            self.sift_up(e);
        } else {
            let e = usize::from(self.heap[0]);
            self.unindex(e);
            let min = self.count[e];
            self.fill(e, key, h, min + 1, min);
            self.sift_down(0);
        }
    }

    /// Every key held, in no particular order.
    pub fn entries(&self) -> impl Iterator<Item = Entry<'_>> + '_ {
        (0..self.used).map(|e| Entry {
            key: self.key(e),
            count: self.count[e],
            err: self.err[e],
        })
    }

    fn key(&self, e: usize) -> &[u8] {
        &self.keys[e * KEY_MAX..e * KEY_MAX + usize::from(self.len[e])]
    }

    fn mask(&self) -> usize {
        self.index.len() - 1
    }

    fn home(&self, h: u64) -> usize {
        // The index is far smaller than 2^32 slots: the low bits of the hash pick the slot.
        usize::try_from(h & self.mask() as u64).unwrap_or(0)
    }

    fn find(&self, h: u64, key: &[u8]) -> Option<usize> {
        let mut i = self.home(h);
        loop {
            let slot = usize::from(self.index[i]);
            if slot == 0 {
                return None;
            }
            let e = slot - 1;
            if self.hash[e] == h && self.key(e) == key {
                return Some(e);
            }
            i = (i + 1) & self.mask();
        }
    }

    /// Entry `e` takes `key` and is indexed (its heap place is left to the caller).
    fn fill(&mut self, e: usize, key: &[u8], h: u64, count: u64, err: u64) {
        self.keys[e * KEY_MAX..e * KEY_MAX + key.len()].copy_from_slice(key);
        self.len[e] = u8::try_from(key.len()).unwrap_or(u8::MAX);
        self.hash[e] = h;
        self.count[e] = count;
        self.err[e] = err;
        let mut i = self.home(h);
        while self.index[i] != 0 {
            i = (i + 1) & self.mask();
        }
        self.index[i] = slot16(e + 1);
    }

    /// Removes entry `e` from the index, shifting back the entries probed past it.
    fn unindex(&mut self, e: usize) {
        let mask = self.mask();
        let mut i = self.home(self.hash[e]);
        while usize::from(self.index[i]) != e + 1 {
            i = (i + 1) & mask;
        }
        let mut j = i;
        loop {
            j = (j + 1) & mask;
            let slot = usize::from(self.index[j]);
            if slot == 0 {
                self.index[i] = 0;
                return;
            }
            let k = self.home(self.hash[slot - 1]);
            // The entry at j may move to i unless its home lies cyclically in (i, j].
            let stays = if i <= j {
                i < k && k <= j
            } else {
                i < k || k <= j
            };
            if !stays {
                self.index[i] = self.index[j];
                i = j;
            }
        }
    }

    fn counted(&self, p: usize) -> u64 {
        self.count[usize::from(self.heap[p])]
    }

    fn swap(&mut self, a: usize, b: usize) {
        self.heap.swap(a, b);
        self.pos[usize::from(self.heap[a])] = slot16(a);
        self.pos[usize::from(self.heap[b])] = slot16(b);
    }

    fn sift_up(&mut self, mut p: usize) {
        while p > 0 {
            let parent = (p - 1) / 2;
            if self.counted(parent) <= self.counted(p) {
                return;
            }
            self.swap(p, parent);
            p = parent;
        }
    }

    fn sift_down(&mut self, mut p: usize) {
        loop {
            let (l, r) = (2 * p + 1, 2 * p + 2);
            let mut least = p;
            if l < self.used && self.counted(l) < self.counted(least) {
                least = l;
            }
            if r < self.used && self.counted(r) < self.counted(least) {
                least = r;
            }
            if least == p {
                return;
            }
            self.swap(p, least);
            p = least;
        }
    }
}

/// An index below the sketch's capacity (at most `i16::MAX`) as stored.
fn slot16(i: usize) -> u16 {
    u16::try_from(i).unwrap_or(u16::MAX)
}

/// A seeded 64-bit hash, eight key bytes per step (a key of 250 bytes is 32 steps).
fn hash(seed: u64, key: &[u8]) -> u64 {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut h = seed ^ (key.len() as u64).wrapping_mul(K);
    for chunk in key.chunks(8) {
        let mut w = [0u8; 8];
        w[..chunk.len()].copy_from_slice(chunk);
        h = (h ^ u64::from_le_bytes(w)).wrapping_mul(K);
        h ^= h >> 29;
    }
    h ^ (h >> 32)
}

/// A random 64-bit number from the standard library's per-process hash keys (the service
/// reads no clock and opens no file).
fn random_seed() -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u8(0);
    h.finish() | 1
}

/// One worker's sampler and sketch, on cache lines of its own.
#[derive(Debug)]
#[repr(align(128))]
struct Slot {
    /// Requests until the next sample; written only by the slot's worker.
    countdown: AtomicU32,
    /// xorshift state for the next countdown.
    rng: AtomicU64,
    /// Samples dropped because a reader held the sketch.
    busy: AtomicU64,
    sketch: Mutex<Option<Box<SpaceSaving>>>,
}

/// A key of the merged listing, with its estimated number of requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HotKey {
    pub key: Vec<u8>,
    /// Samples counted for it over every worker, times [`HotKeys::one_in`].
    pub count: u64,
}

/// Every worker's sketch (and one spare slot for threads that are not workers).
#[derive(Debug)]
pub struct HotKeys {
    slots: Box<[Slot]>,
    /// Read on each sample and each listing; changed only by [`HotKeys::set_one_in`].
    one_in: AtomicU32,
    entries: usize,
    seed: u64,
    /// `--hotkeys`: false samples nothing (the bench's "without").
    on: bool,
}

impl HotKeys {
    /// Sketches for `slots` worker slots, [`SAMPLE_ONE_IN`], [`entries_for`] `slots`.
    pub fn new(slots: usize) -> HotKeys {
        HotKeys::sampling(slots, SAMPLE_ONE_IN)
    }

    /// Sketches for `slots` worker slots sampling one request in `one_in` on average
    /// (`--hotkeys-sample`), [`entries_for`] `slots`.
    pub fn sampling(slots: usize, one_in: u32) -> HotKeys {
        HotKeys::with(slots, one_in, entries_for(slots))
    }

    /// Sketches of `entries` counters sampling one request in `one_in` on average (1: every
    /// request, for tests).
    pub fn with(slots: usize, one_in: u32, entries: usize) -> HotKeys {
        HotKeys::seeded(slots, one_in, entries, random_seed())
    }

    /// As [`HotKeys::with`], with the sampling and hashing seeded by `seed` rather than at
    /// random: the same requests are then sampled every run (tests of accuracy).
    pub fn seeded(slots: usize, one_in: u32, entries: usize, seed: u64) -> HotKeys {
        let slots = (0..slots.max(1) as u64)
            .map(|i| Slot {
                countdown: AtomicU32::new(1),
                rng: AtomicU64::new(seed ^ (i + 1).wrapping_mul(0xd1b5_4a32_d192_ed03) | 1),
                busy: AtomicU64::new(0),
                sketch: Mutex::new(None),
            })
            .collect();
        HotKeys {
            slots,
            one_in: AtomicU32::new(one_in.max(1)),
            entries,
            seed,
            on: true,
        }
    }

    /// `--hotkeys on|off`: off, [`HotKeys::record`] returns at its first branch, no sketch
    /// is ever allocated and every listing is empty.
    pub fn switched(self, on: bool) -> HotKeys {
        HotKeys { on, ..self }
    }

    /// Whether requests are sampled.
    pub fn on(&self) -> bool {
        self.on
    }

    /// The sampling rate: one request in this many, on average.
    pub fn one_in(&self) -> u32 {
        self.one_in.load(Relaxed)
    }

    /// Samples one request in `one_in` from each worker's next sample on (1: every request,
    /// which session tests use for exact counts). Counts taken before are scaled by the new
    /// rate in later listings.
    pub fn set_one_in(&self, one_in: u32) {
        self.one_in.store(one_in.max(1), Relaxed);
        for slot in self.slots.iter() {
            slot.countdown.store(1, Relaxed);
        }
    }

    /// Counts a request for `key` on worker `worker` (past the last slot: the spare one).
    #[inline]
    pub fn record(&self, worker: usize, key: &[u8]) {
        if !self.on {
            return;
        }
        let slot = &self.slots[worker.min(self.slots.len() - 1)];
        let left = slot.countdown.load(Relaxed);
        if left > 1 {
            slot.countdown.store(left - 1, Relaxed);
            return;
        }
        self.sample(slot, key);
    }

    #[cold]
    #[inline(never)]
    fn sample(&self, slot: &Slot, key: &[u8]) {
        let mut x = slot.rng.load(Relaxed);
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        slot.rng.store(x, Relaxed);
        // Uniform in 1..=2N-1: the mean gap is N.
        let span = u64::from(self.one_in()) * 2 - 1;
        let next = 1 + u32::try_from(x % span).unwrap_or(0);
        slot.countdown.store(next, Relaxed);
        let mut sketch = match slot.sketch.try_lock() {
            Ok(guard) => guard,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => {
                slot.busy.store(slot.busy.load(Relaxed) + 1, Relaxed);
                return;
            }
        };
        sketch
            .get_or_insert_with(|| Box::new(SpaceSaving::new(self.entries, self.seed)))
            .observe(key);
    }

    /// Bytes the sketches allocated so far.
    pub fn memory_bytes(&self) -> usize {
        self.slots
            .iter()
            .map(|s| lock(&s.sketch).as_ref().map_or(0, |s| s.memory_bytes()))
            .sum()
    }

    /// The most the sketches can ever hold: every slot's sketch allocated.
    pub fn memory_bound_bytes(&self) -> usize {
        self.slots.len() * sketch_bytes(self.entries)
    }

    /// Samples dropped because a reader held a sketch at that moment.
    pub fn busy(&self) -> u64 {
        self.slots.iter().map(|s| s.busy.load(Relaxed)).sum()
    }

    /// The `k` (at most [`TOP_MAX`]) keys starting with `prefix` with the highest summed
    /// counts over every worker, highest first (ties by key). One worker's sketch is locked
    /// at a time, while its keys are copied out.
    pub fn top(&self, k: usize, prefix: &[u8]) -> Vec<HotKey> {
        let mut sum: HashMap<Vec<u8>, u64> = HashMap::new();
        for slot in self.slots.iter() {
            if let Some(sketch) = lock(&slot.sketch).as_ref() {
                for e in sketch.entries().filter(|e| e.key.starts_with(prefix)) {
                    *sum.entry(e.key.to_vec()).or_default() += e.count;
                }
            }
        }
        let mut keys: Vec<HotKey> = sum
            .into_iter()
            .map(|(key, n)| HotKey {
                key,
                count: n.saturating_mul(u64::from(self.one_in())),
            })
            .collect();
        keys.sort_unstable_by(|a, b| b.count.cmp(&a.count).then_with(|| a.key.cmp(&b.key)));
        keys.truncate(k.min(TOP_MAX));
        keys
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A sketch left mid-update by a panic is still a valid (if slightly off) summary.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// True when `key` can be shown as it is on a text-protocol line: what a text command could
/// carry (no control bytes, no space).
pub fn shown_as_text(key: &[u8]) -> bool {
    valid_text_key(key) && !key.contains(&b' ')
}

/// memcache `stats hotkeys`: `STAT hotkey:<rank>:key <key>` (base64, followed by
/// `STAT hotkey:<rank>:base64 1`, when [`shown_as_text`] says it cannot be shown as it is)
/// and `STAT hotkey:<rank>:count <estimated requests>`, ranks from 1 (`END` is the caller's).
pub fn stats_lines(out: &mut Vec<u8>, keys: &[HotKey]) {
    for (rank, hot) in (1u64..).zip(keys) {
        let name = |field: &str| format!("hotkey:{rank}:{field}");
        if shown_as_text(&hot.key) {
            stat_bytes(out, &name("key"), &hot.key);
        } else {
            let mut b64 = Vec::with_capacity(hot.key.len().div_ceil(3) * 4);
            base64_encode(&hot.key, &mut b64);
            stat_bytes(out, &name("key"), &b64);
            reply::stat(out, &name("base64"), 1);
        }
        reply::stat(out, &name("count"), hot.count);
    }
}

fn stat_bytes(out: &mut Vec<u8>, name: &str, value: &[u8]) {
    out.extend_from_slice(b"STAT ");
    out.extend_from_slice(name.as_bytes());
    out.push(b' ');
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// The JSON answer of `GET /_hotkeys`: `{"k":…,"sample_one_in":…,"memory_bytes":…,
/// "memory_bound_bytes":…,"keys":[{"rank":1,"key":"…","count":…},…]}`; a key that is not
/// UTF-8 text without control bytes is given as `"key_base64"` instead of `"key"`.
pub fn json(hot: &HotKeys, k: usize, keys: &[HotKey]) -> Vec<u8> {
    let mut out = format!(
        "{{\"k\":{},\"sample_one_in\":{},\"memory_bytes\":{},\"memory_bound_bytes\":{},\"keys\":[",
        k.min(TOP_MAX),
        hot.one_in(),
        hot.memory_bytes(),
        hot.memory_bound_bytes()
    )
    .into_bytes();
    for (rank, key) in (1u64..).zip(keys) {
        if rank > 1 {
            out.push(b',');
        }
        out.extend_from_slice(format!("{{\"rank\":{rank},").as_bytes());
        match std::str::from_utf8(&key.key) {
            Ok(text) if valid_text_key(&key.key) => {
                out.extend_from_slice(b"\"key\":\"");
                for c in text.chars() {
                    if c == '"' || c == '\\' {
                        out.push(b'\\');
                    }
                    let mut buf = [0u8; 4];
                    out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                }
            }
            _ => {
                out.extend_from_slice(b"\"key_base64\":\"");
                base64_encode(&key.key, &mut out);
            }
        }
        out.extend_from_slice(format!("\",\"count\":{}}}", key.count).as_bytes());
    }
    out.extend_from_slice(b"]}\n");
    out
}

#[cfg(test)]
#[path = "hotkeys_tests.rs"]
mod tests;
