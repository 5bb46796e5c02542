//! memcached's `watch`: log lines about item reads and stores streamed to operator
//! connections, in memcached 1.6.18's line format, never slowing the workers.
//!
//! Each worker writes its lines into its own bounded ring ([`RING_LINES`] lines of at most
//! [`LINE_MAX`] bytes, allocated when a first line is logged) and never waits: it takes the
//! ring's lock with `try_lock`, and a line that finds it held by a reading watcher is lost
//! and counted. A watcher session reads every ring from its own cursor when its worker's
//! tick polls it (and only once its previous output has been sent), at most
//! [`POLL_BYTES`] per poll; lines a slow watcher was lapped on, or that were lost, are
//! announced to it as memcached does, with a `skipped=N` line. Nothing is formatted
//! while no watcher wants that kind of event (one relaxed atomic load per event).

use std::io::Write as _;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use ringstore_proto::memcache::misc::WatchKinds;
use ringstore_store::Evicted;

use crate::Now;

/// memcached's `WATCHER_LIMIT`: watchers at once; the next is refused.
pub const WATCHERS_MAX: u32 = 20;
/// Lines each worker's ring holds.
pub const RING_LINES: usize = 1024;
/// Longest line: a 250-byte key URI-encoded (750 bytes) and the fields around it.
pub const LINE_MAX: usize = 1024;
/// Output one poll of one watcher produces at most (plus one line).
pub const POLL_BYTES: usize = 64 << 10;

/// memcached's reply when [`WATCHERS_MAX`] watchers are attached.
pub const TOO_MANY: &str = "WATCHER_TOO_MANY log watcher limit reached";

/// What every session of every worker shares: which kinds are watched, the rings.
#[derive(Debug)]
pub struct Hub {
    counts: Arc<Counts>,
    /// memcached's `gid`: one number per line, over all workers.
    gid: AtomicU64,
    /// Connection numbers for `cfd=` (sessions do not see their socket).
    conn_ids: AtomicU64,
    rings: Box<[Ring]>,
}

/// Who watches; each [`Watcher`] holds it and gives its place back when dropped.
#[derive(Debug, Default)]
struct Counts {
    watchers: AtomicU32,
    /// Watchers per kind bit (fetchers, mutations, evictions, connevents).
    watching: [AtomicU32; 4],
}

#[derive(Debug, Default)]
struct Ring {
    lines: Mutex<Lines>,
    /// Lines lost because a watcher held the lock at that moment.
    lost: AtomicU64,
}

#[derive(Debug, Default)]
struct Lines {
    text: Vec<Vec<u8>>,
    kinds: Vec<u8>,
    /// Lines written so far; line `n` is in slot `n % RING_LINES` until overwritten.
    next: u64,
}

/// One watcher's position in every ring.
#[derive(Debug)]
pub struct Watcher {
    counts: Arc<Counts>,
    kinds: WatchKinds,
    /// Per ring: the next line to read and the ring's `lost` count already reported.
    cursors: Vec<(u64, u64)>,
    skipped: u64,
}

fn slot_of(n: u64) -> usize {
    usize::try_from(n % RING_LINES as u64).unwrap_or(0)
}

impl Hub {
    /// Rings for `workers` worker slots and one for the store's evictions (written by
    /// whichever worker evicts).
    pub fn new(workers: usize) -> Hub {
        Hub {
            counts: Arc::default(),
            gid: AtomicU64::new(0),
            conn_ids: AtomicU64::new(0),
            rings: (0..=workers).map(|_| Ring::default()).collect(),
        }
    }

    /// True while some watcher wants events of kind `bit` (a `WatchKinds` constant).
    #[inline]
    pub fn wants(&self, bit: u8) -> bool {
        let i = bit.trailing_zeros() as usize;
        self.counts
            .watching
            .get(i)
            .is_some_and(|w| w.load(Relaxed) > 0)
    }

    /// A new connection number for a session's `cfd=`.
    pub fn conn_id(&self) -> u64 {
        self.conn_ids.fetch_add(1, Relaxed) + 1
    }

    /// Attaches a watcher of `kinds`, starting at what every ring holds now; `None` past
    /// [`WATCHERS_MAX`].
    pub fn join(&self, kinds: WatchKinds) -> Option<Watcher> {
        let taken = self
            .counts
            .watchers
            .fetch_update(Relaxed, Relaxed, |n| (n < WATCHERS_MAX).then_some(n + 1));
        taken.ok()?;
        for (i, w) in self.counts.watching.iter().enumerate() {
            if kinds.any(1 << i) {
                w.fetch_add(1, Relaxed);
            }
        }
        let cursors = self
            .rings
            .iter()
            .map(|r| {
                let next = r.lines.lock().map_or(0, |l| l.next);
                (next, r.lost.load(Relaxed))
            })
            .collect();
        Some(Watcher {
            counts: Arc::clone(&self.counts),
            kinds,
            cursors,
            skipped: 0,
        })
    }

    /// Logs one line of kind `bit` from `worker`: `ts=… gid=… ` then what `body` writes
    /// (ending in `\n`). Never waits: a ring held by a reader loses the line (counted).
    pub fn log(&self, worker: usize, bit: u8, now: Now, body: impl FnOnce(&mut Vec<u8>)) {
        if let Some(ring) = self.rings.get(worker) {
            self.log_into(ring, bit, micros_of(now), body);
        }
    }

    /// [`Hub::log`] stamped by the system clock, for events outside a request (a
    /// connection opened or closed).
    pub fn log_now(&self, worker: usize, bit: u8, body: impl FnOnce(&mut Vec<u8>)) {
        if let Some(ring) = self.rings.get(worker) {
            self.log_into(ring, bit, unix_micros(), body);
        }
    }

    /// [`Hub::log`] into `ring`, stamped `micros` (Unix time in microseconds).
    fn log_into(&self, ring: &Ring, bit: u8, micros: u64, body: impl FnOnce(&mut Vec<u8>)) {
        let Ok(mut lines) = ring.lines.try_lock() else {
            ring.lost.fetch_add(1, Relaxed);
            return;
        };
        if lines.text.is_empty() {
            lines.text = (0..RING_LINES)
                .map(|_| Vec::with_capacity(LINE_MAX))
                .collect();
            lines.kinds = vec![0; RING_LINES];
        }
        let slot = slot_of(lines.next);
        let gid = self.gid.fetch_add(1, Relaxed) + 1;
        let line = &mut lines.text[slot];
        line.clear();
        timestamp(line, micros);
        line.extend_from_slice(b" gid=");
        push_num(line, gid);
        line.push(b' ');
        body(line);
        line.truncate(LINE_MAX);
        lines.kinds[slot] = bit;
        lines.next += 1;
    }

    /// Appends to `out` the lines `watcher` has not seen yet (at most about
    /// [`POLL_BYTES`]), each lapped or lost stretch announced as `skipped=N`; true when
    /// anything was written.
    pub fn poll(&self, watcher: &mut Watcher, out: &mut Vec<u8>) -> bool {
        let start = out.len();
        for (ring, cursor) in self.rings.iter().zip(watcher.cursors.iter_mut()) {
            let lost = ring.lost.load(Relaxed);
            watcher.skipped += lost - cursor.1;
            cursor.1 = lost;
            let Ok(lines) = ring.lines.try_lock() else {
                continue; // its worker is writing: next poll
            };
            let oldest = lines.next.saturating_sub(RING_LINES as u64);
            if cursor.0 < oldest {
                watcher.skipped += oldest - cursor.0;
                cursor.0 = oldest;
            }
            while cursor.0 < lines.next && out.len() - start < POLL_BYTES {
                let slot = slot_of(cursor.0);
                if watcher.kinds.any(lines.kinds[slot]) {
                    if watcher.skipped > 0 {
                        skipped_line(out, watcher.skipped);
                        watcher.skipped = 0;
                    }
                    out.extend_from_slice(&lines.text[slot]);
                }
                cursor.0 += 1;
            }
        }
        if watcher.skipped > 0 && out.len() - start < POLL_BYTES {
            skipped_line(out, watcher.skipped);
            watcher.skipped = 0;
        }
        out.len() > start
    }
}

/// A watcher outside any connection (the appliance console's `watch`): its lines are
/// pulled with [`Feed::poll`], on the puller's own schedule.
#[derive(Debug)]
pub struct Feed {
    hub: Arc<Hub>,
    watcher: Watcher,
}

impl Feed {
    /// A watcher of what `words` (memcache `watch` words) ask for; the error is the line
    /// memcached would answer (`ERROR`, or [`TOO_MANY`]).
    pub fn join(hub: &Arc<Hub>, words: &[&[u8]]) -> Result<Feed, &'static str> {
        let kinds = ringstore_proto::memcache::misc::watch_kinds(words).ok_or("ERROR")?;
        let watcher = hub.join(kinds).ok_or(TOO_MANY)?;
        Ok(Feed {
            hub: Arc::clone(hub),
            watcher,
        })
    }

    /// Appends the lines not seen yet (bounded as a connection's poll); true when any.
    pub fn poll(&mut self, out: &mut Vec<u8>) -> bool {
        self.hub.poll(&mut self.watcher, out)
    }
}

/// `watch evictions`: the store tells of each item it evicts while a watcher wants them.
/// Several workers may evict at once: one that finds the ring held loses the line (counted,
/// so watchers are told with `skipped=N`).
impl ringstore_store::EvictionLog for Hub {
    fn wanted(&self) -> bool {
        self.wants(WatchKinds::EVICTIONS)
    }

    fn evicted(&self, item: &Evicted<'_>) {
        let Some(ring) = self.rings.last() else {
            return;
        };
        // The store has no Unix clock; the system's stamps the line.
        self.log_into(ring, WatchKinds::EVICTIONS, unix_micros(), |l| {
            eviction(l, item)
        });
    }
}

impl Drop for Watcher {
    /// Its session is gone: the place and the kinds it watched are given back.
    fn drop(&mut self) {
        for (i, w) in self.counts.watching.iter().enumerate() {
            if self.kinds.any(1 << i) {
                w.fetch_sub(1, Relaxed);
            }
        }
        self.counts.watchers.fetch_sub(1, Relaxed);
    }
}

fn skipped_line(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(b"skipped=");
    push_num(out, n);
    out.push(b'\n');
}

/// The worker's clock in Unix microseconds (millisecond resolution).
fn micros_of(now: Now) -> u64 {
    let secs = now.unix.saturating_sub(u64::from(now.store));
    secs * 1_000_000 + now.mono_ms * 1000
}

/// The system clock in Unix microseconds (a vDSO read, no syscall).
fn unix_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// memcached's `ts=SECONDS.MICROS`, the microseconds unpadded as its `%d.%d` writes them.
fn timestamp(out: &mut Vec<u8>, micros: u64) {
    let (secs, frac) = (micros / 1_000_000, micros % 1_000_000);
    let _ = write!(out, "ts={secs}.{frac}");
}

/// Writes `n` in decimal (no allocation: `Vec<u8>`'s `io::Write` cannot fail).
fn push_num(out: &mut Vec<u8>, n: u64) {
    let _ = write!(out, "{n}");
}

/// memcached's `uriencode`, as its logger and key dumps write keys: every byte but
/// `A-Z a-z 0-9 - . _ ~` as `%XX`.
pub fn push_key(out: &mut Vec<u8>, key: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for &b in key {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b);
        } else {
            out.extend_from_slice(&[b'%', HEX[usize::from(b >> 4)], HEX[usize::from(b & 15)]]);
        }
    }
}

/// `type=item_get key=K status=S clsid=C cfd=F size=N` (memcached's fetcher line).
pub fn item_get(out: &mut Vec<u8>, key: &[u8], found: bool, cfd: u64, size: usize) {
    out.extend_from_slice(b"type=item_get key=");
    push_key(out, key);
    out.extend_from_slice(if found {
        b" status=found clsid=1 cfd=".as_slice()
    } else {
        b" status=not_found clsid=0 cfd=".as_slice()
    });
    push_num(out, cfd);
    out.extend_from_slice(b" size=");
    push_num(out, size as u64);
    out.push(b'\n');
}

/// `type=item_store key=K status=S cmd=C ttl=T clsid=1 cfd=F size=N` (memcached's
/// mutation line; `ttl` 0 for an item that never expires).
pub fn item_store(out: &mut Vec<u8>, store: StoreLine<'_>, cfd: u64) {
    out.extend_from_slice(b"type=item_store key=");
    push_key(out, store.key);
    out.extend_from_slice(b" status=");
    out.extend_from_slice(store.status.as_bytes());
    out.extend_from_slice(b" cmd=");
    out.extend_from_slice(store.cmd.as_bytes());
    out.extend_from_slice(b" ttl=");
    push_num(out, store.ttl);
    out.extend_from_slice(b" clsid=1 cfd=");
    push_num(out, cfd);
    out.extend_from_slice(b" size=");
    push_num(out, store.size as u64);
    out.push(b'\n');
}

/// `type=eviction key=K fetch=yes|no ttl=T la=A clsid=1 size=N` (memcached's eviction
/// line; `ttl=-1` for an item that never expires, `la` seconds since its last access).
pub fn eviction(out: &mut Vec<u8>, item: &Evicted<'_>) {
    out.extend_from_slice(b"type=eviction key=");
    push_key(out, item.key);
    out.extend_from_slice(if item.fetched {
        b" fetch=yes ttl="
    } else {
        b" fetch=no ttl="
    });
    match item.ttl {
        Some(t) => push_num(out, u64::from(t)),
        None => out.extend_from_slice(b"-1"),
    }
    out.extend_from_slice(b" la=");
    push_num(out, u64::from(item.idle));
    out.extend_from_slice(b" clsid=1 size=");
    push_num(out, item.size as u64);
    out.push(b'\n');
}

/// `type=conn_new rip=IP rport=PORT transport=tcp cfd=F` or, when `closed`,
/// `type=conn_close rip=IP rport=PORT transport=tcp reason=normal cfd=F` (memcached's
/// connection lines; ringstore's sessions do not learn why a connection ended).
pub fn conn_event(out: &mut Vec<u8>, peer: std::net::SocketAddr, closed: bool, cfd: u64) {
    let kind = if closed { "conn_close" } else { "conn_new" };
    let reason = if closed { " reason=normal" } else { "" };
    let (ip, port) = (peer.ip(), peer.port());
    let _ = writeln!(
        out,
        "type={kind} rip={ip} rport={port} transport=tcp{reason} cfd={cfd}"
    );
}

/// What an `item_store` line says.
#[derive(Debug, Clone, Copy)]
pub struct StoreLine<'a> {
    pub key: &'a [u8],
    /// memcached's store status word: `stored`, `exists`, `not_found`, `not_stored`, ...
    pub status: &'a str,
    /// `set`, `add`, `replace`, `append`, `prepend`, `cas`.
    pub cmd: &'a str,
    pub ttl: u64,
    pub size: usize,
}

#[cfg(test)]
mod tests;
