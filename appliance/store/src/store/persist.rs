//! An arena that outlives the process (ADR 0052): the store over a caller's region (a
//! MAP_SHARED file on tmpfs or hugetlbfs, or memory PID 1 reserved), sealed at a clean
//! stop and resumed in place at the next start, or started cold with the reason.
//!
//! Region layout: a metadata area of [`meta_len`] bytes (the footer, then the segment
//! table), then the segments, segment `i` at `meta_len + i * seg_size`. The footer's
//! first word says whether the rest can be trusted: [`MAGIC_SEALED`] only between a seal
//! and the next start, which overwrites it with [`MAGIC_OPEN`] before it changes anything.

use std::hash::BuildHasher;
use std::sync::Mutex;

use foldhash::fast::FixedState;

use super::Geometry;
use crate::arena::{Segment, HUGE_PAGE};
use crate::shard::{check_chain, SealedSeg, Shift};
use crate::{Backing, Store, StoreConfig, StoreError, Time};

/// The region format this build writes and reads; another one starts cold.
pub const FORMAT_VERSION: u64 = 1;
/// The footer's first word after a seal.
const MAGIC_SEALED: u64 = u64::from_le_bytes(*b"RSSEALED");
/// The footer's first word while a run uses the region (a crash leaves it so).
const MAGIC_OPEN: u64 = u64::from_le_bytes(*b"RSOPEN\0\0");
/// Bytes of the footer (its words, the rest zero).
const FOOTER: usize = 4096;
/// Bytes of one segment-table entry: segment number, shard, bytes written, flags (u32 each).
const ENTRY: usize = 16;
/// Entry flag: the shard's active segment.
const ACTIVE: u32 = 1;
/// Hashed with the sealed seed and compared: another hash function starts cold.
const PROBE: &[u8] = b"ringstore arena probe";

/// Footer words (little-endian u64 at `8 * W`). Words 2 to 7 are the layout
/// ([`layout_words`]: segment size, segments, shards, memory, item_size_max,
/// external_threshold).
const W_MAGIC: usize = 0;
const W_VERSION: usize = 1;
const W_SEG_SIZE: usize = 2;
const W_SEED: usize = 8;
const W_PROBE: usize = 9;
const W_CAS: usize = 10;
const W_SEALED_UNIX: usize = 11;
const W_SEALED_NOW: usize = 12;
const W_ENTRIES: usize = 13;
const W_CHECKSUM: usize = 14;
const WORDS: usize = 15;

/// The wall clock (Unix seconds) and the store time at the same moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WallTime {
    pub unix_secs: u64,
    pub now: Time,
}

/// Memory for the arena that outlives the process.
#[derive(Debug)]
pub struct Region {
    /// At least [`Store::region_len`] bytes; only the store uses them from now on.
    pub bytes: &'static mut [u8],
    /// What backs them (hugetlbfs: [`Backing::HugeTlb`]).
    pub backing: Backing,
    /// What to call it in the log and `stats settings` (the file's path).
    pub source: String,
}

/// How the last start over a region went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The sealed items were taken back; `expired` of them had expired while down.
    Resumed {
        items: u64,
        expired: u64,
        /// Wall-clock seconds between the seal and this start.
        down_secs: u64,
        /// Time the check and the index rebuild took.
        micros: u64,
    },
    /// Nothing was kept, for `reason`.
    Cold { reason: String },
}

/// A start over a region, as `stats` and the log report it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restart {
    pub source: String,
    pub outcome: Outcome,
}

/// What a seal wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SealReport {
    pub items: u64,
    pub segments: usize,
    /// Bytes the checksum covers (metadata and every used segment byte).
    pub checked_bytes: u64,
    pub micros: u64,
}

/// A store's region: its metadata area, where its segments start, how it started.
pub(crate) struct Persist {
    meta: Mutex<&'static mut [u8]>,
    base: usize,
    restart: Restart,
}

/// One segment-table entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    seg: usize,
    shard: usize,
    write: usize,
    active: bool,
}

/// What a valid seal hands to the start.
struct Sealed {
    seed: u64,
    cas: u64,
    shift_from: i64,
    sealed_unix: u64,
    entries: Vec<Entry>,
    /// Live items sealed per shard ([`check_chains`]).
    live: Vec<usize>,
}

/// A fresh random seed for a store's key hashes.
pub(crate) fn random_seed() -> u64 {
    foldhash::fast::RandomState::default().hash_one(0x5eed_u64)
}

/// Bytes of the metadata area for `segments` (whole huge pages, so the segments after it
/// stay 2 MiB aligned on hugetlbfs).
fn meta_len(segments: usize) -> usize {
    (FOOTER + segments * ENTRY).next_multiple_of(HUGE_PAGE)
}

fn word(meta: &[u8], w: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&meta[8 * w..8 * w + 8]);
    u64::from_le_bytes(b)
}

fn set_word(meta: &mut [u8], w: usize, v: u64) {
    meta[8 * w..8 * w + 8].copy_from_slice(&v.to_le_bytes());
}

/// The layout words this start expects, in footer order from [`W_SEG_SIZE`].
fn layout_words(config: &StoreConfig, geo: &Geometry) -> [u64; 6] {
    [
        geo.seg_size as u64,
        geo.segments as u64,
        geo.shard_count as u64,
        config.memory_bytes as u64,
        config.item_size_max as u64,
        config.external_threshold as u64,
    ]
}

/// Checksum of the footer words (checksum word as zero), the table and `bytes`.
fn checksum<'a>(meta: &[u8], entries: usize, bytes: impl Iterator<Item = &'a [u8]>) -> u64 {
    let mut words = meta[..8 * WORDS].to_vec();
    set_word(&mut words, W_CHECKSUM, 0);
    let mut crc = crc32c::crc32c(&words[8..]);
    crc = crc32c::crc32c_append(crc, &meta[FOOTER..FOOTER + entries * ENTRY]);
    for b in bytes {
        crc = crc32c::crc32c_append(crc, b);
    }
    u64::from(crc)
}

fn u32_at(meta: &[u8], at: usize) -> usize {
    let mut b = [0u8; 4];
    b.copy_from_slice(&meta[at..at + 4]);
    u32::from_le_bytes(b) as usize
}

/// The segment table, each entry checked against `geo` (bounds, one use per segment, at
/// most one active segment per shard, listed last).
fn read_table(meta: &[u8], n: usize, geo: &Geometry) -> Result<Vec<Entry>, String> {
    let mut used = vec![false; geo.segments];
    let mut active = vec![false; geo.shard_count];
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let at = FOOTER + i * ENTRY;
        let e = Entry {
            seg: u32_at(meta, at),
            shard: u32_at(meta, at + 4),
            write: u32_at(meta, at + 8),
            active: u32_at(meta, at + 12) == ACTIVE as usize,
        };
        if e.seg >= geo.segments || e.shard >= geo.shard_count || e.write > geo.seg_size {
            return Err(format!("segment table entry {i} out of bounds"));
        }
        if std::mem::replace(&mut used[e.seg], true) || active[e.shard] {
            return Err(format!(
                "segment table entry {i} repeats a segment or follows the active one"
            ));
        }
        active[e.shard] = e.active;
        out.push(e);
    }
    Ok(out)
}

/// Whether the footer holds a seal this start may trust; the reason it does not otherwise.
fn check_footer(
    meta: &[u8],
    want: [u64; 6],
    geo: &Geometry,
    segs: &[Segment],
) -> Result<Sealed, String> {
    match word(meta, W_MAGIC) {
        MAGIC_SEALED => {}
        MAGIC_OPEN => {
            return Err(
                "not sealed: the last run stopped without a seal (crash, kill -9 or power loss)"
                    .into(),
            )
        }
        0 => return Err("no seal: the region is new or blank".into()),
        _ => return Err("no seal: the region holds something else".into()),
    }
    let version = word(meta, W_VERSION);
    if version != FORMAT_VERSION {
        return Err(format!(
            "format version {version}, this build reads {FORMAT_VERSION}"
        ));
    }
    let got: Vec<u64> = (W_SEG_SIZE..W_SEG_SIZE + 6)
        .map(|w| word(meta, w))
        .collect();
    if got != want {
        return Err(format!(
            "layout changed: sealed with segment size, segments, shards, memory, item_size_max, external_threshold = {got:?}, this start has {want:?}"
        ));
    }
    let n = usize::try_from(word(meta, W_ENTRIES)).unwrap_or(usize::MAX);
    if n > geo.segments {
        return Err(format!(
            "segment table of {n} entries, the arena has {} segments",
            geo.segments
        ));
    }
    let entries = read_table(meta, n, geo)?;
    let sum = checksum(
        meta,
        n,
        entries.iter().map(|e| &segs[e.seg].bytes[..e.write]),
    );
    if sum != word(meta, W_CHECKSUM) {
        return Err("checksum mismatch: the region changed after the seal".into());
    }
    let seed = word(meta, W_SEED);
    if FixedState::with_seed(seed).hash_one(PROBE) != word(meta, W_PROBE) {
        return Err("the key hash differs from the sealing build's".into());
    }
    let sealed_unix = word(meta, W_SEALED_UNIX);
    let epoch = i64::try_from(sealed_unix).unwrap_or(i64::MAX) - word(meta, W_SEALED_NOW) as i64;
    Ok(Sealed {
        seed,
        cas: word(meta, W_CAS),
        shift_from: epoch,
        sealed_unix,
        entries,
        live: Vec::new(),
    })
}

/// Every sealed segment's items walk cleanly and hash to their shard; records how many
/// live items each shard has (its index is sized for them at once).
fn check_chains(sealed: &mut Sealed, segs: &[Segment], shards: usize) -> Result<(), String> {
    let hasher = FixedState::with_seed(sealed.seed);
    let mut per_shard: Vec<Vec<Entry>> = vec![Vec::new(); shards];
    for e in &sealed.entries {
        per_shard[e.shard].push(*e);
    }
    let counted: Vec<Result<(usize, usize), String>> =
        on_threads(per_shard, |shard, entries: Vec<Entry>| {
            let mut live = 0;
            for e in entries {
                live += check_chain(segs[e.seg].bytes, e.write, |key| {
                    super::shard_index(hasher.hash_one(key), shards) == shard
                })
                .map_err(|why| format!("segment {}: {why}", e.seg))?;
            }
            Ok((shard, usize::try_from(live).unwrap_or(usize::MAX)))
        });
    sealed.live = vec![0; shards];
    for c in counted {
        let (shard, live) = c?;
        sealed.live[shard] = live;
    }
    Ok(())
}

/// Most threads a resume checks and restores shards on (they are independent).
const RESUME_THREADS: usize = 8;

/// `f(i, work[i])` for every shard `i`, spread over up to [`RESUME_THREADS`] scoped threads
/// (inherit the caller's CPU and memory binding); the results in no particular order.
fn on_threads<W: Send, R: Send>(work: Vec<W>, f: impl Fn(usize, W) -> R + Sync) -> Vec<R> {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, RESUME_THREADS)
        .min(work.len().max(1));
    let mut buckets: Vec<Vec<(usize, W)>> = (0..threads).map(|_| Vec::new()).collect();
    for (i, w) in work.into_iter().enumerate() {
        buckets[i % threads].push((i, w));
    }
    let f = &f;
    std::thread::scope(|scope| {
        let handles: Vec<_> = buckets
            .into_iter()
            .map(|b| scope.spawn(move || b.into_iter().map(|(i, w)| f(i, w)).collect::<Vec<R>>()))
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    })
}

/// Writes the segment table: each `(shard, segment)` as its number, shard, bytes written
/// and flags.
fn write_table(meta: &mut [u8], entries: &[(usize, SealedSeg)], base: usize, seg_size: usize) {
    for (n, (shard, s)) in entries.iter().enumerate() {
        let at = FOOTER + n * ENTRY;
        let fields = [
            (s.addr - base) / seg_size,
            *shard,
            s.write,
            usize::from(s.active),
        ];
        for (k, f) in fields.iter().enumerate() {
            let v = u32::try_from(*f).unwrap_or(u32::MAX);
            meta[at + 4 * k..at + 4 * k + 4].copy_from_slice(&v.to_le_bytes());
        }
    }
}

/// Cuts the arena part of a region into `geo.segments` segments.
fn cut(arena: &'static mut [u8], geo: &Geometry, backing: Backing) -> Vec<Segment> {
    let mut rest = arena;
    let mut out = Vec::with_capacity(geo.segments);
    for _ in 0..geo.segments {
        let (seg, tail) = rest.split_at_mut(geo.seg_size);
        out.push(Segment {
            bytes: seg,
            backing,
            home: None,
        });
        rest = tail;
    }
    out
}

impl Store {
    /// Bytes a [`Region`] for `config` needs: the metadata area and the segments.
    pub fn region_len(config: &StoreConfig) -> Result<usize, StoreError> {
        let geo = Geometry::of(config, &[])?;
        Ok(meta_len(geo.segments) + geo.segments * geo.seg_size)
    }

    /// A store whose arena lives in `region`: resumed from its seal when the seal is valid
    /// and the layout matches, else cold ([`Store::restart`] says which and why). `cold`
    /// forces a cold start with that reason. From here on the region reads as unsealed
    /// until [`Store::seal`]. Sub regions are not used with a region.
    pub fn open_region(
        config: StoreConfig,
        region: Region,
        at: WallTime,
        cold: Option<String>,
    ) -> Result<Store, StoreError> {
        let started = std::time::Instant::now();
        let geo = Geometry::of(&config, &[])?;
        let need = meta_len(geo.segments) + geo.segments * geo.seg_size;
        if region.bytes.len() < need {
            return Err(StoreError::Config(format!(
                "the region {} holds {} bytes, this configuration needs {need}",
                region.source,
                region.bytes.len()
            )));
        }
        let (meta, arena) = region.bytes.split_at_mut(meta_len(geo.segments));
        let base = arena.as_ptr() as usize;
        let segs = cut(arena, &geo, region.backing);
        let sealed = match cold {
            Some(reason) => Err(reason),
            None => check_footer(meta, layout_words(&config, &geo), &geo, &segs)
                .and_then(|mut s| check_chains(&mut s, &segs, geo.shard_count).map(|()| s)),
        };
        // Whatever happens next, this region's old seal is spent.
        set_word(meta, W_MAGIC, MAGIC_OPEN);
        let seed = sealed.as_ref().map_or_else(|_| random_seed(), |s| s.seed);
        let mut store = Store::assemble(config, &[], &geo, segs, seed)?;
        let outcome = match sealed {
            Ok(s) => store.take_back(&s, at, base, started),
            Err(reason) => Outcome::Cold { reason },
        };
        store.persist = Some(Persist {
            meta: Mutex::new(meta),
            base,
            restart: Restart {
                source: region.source,
                outcome,
            },
        });
        Ok(store)
    }

    /// Gives each shard its sealed segments back, in table order, and continues the CAS
    /// counter above the sealed one.
    fn take_back(
        &mut self,
        s: &Sealed,
        at: WallTime,
        base: usize,
        started: std::time::Instant,
    ) -> Outcome {
        let seg_size = self.shared.seg_size;
        let number = |seg: &Segment| (seg.bytes.as_ptr() as usize - base) / seg_size;
        let mut wanted = vec![false; self.segment_count()];
        for e in &s.entries {
            wanted[e.seg] = true;
        }
        let mut taken: Vec<Option<Segment>> = (0..wanted.len()).map(|_| None).collect();
        for seg in self.shared.pool.take_where(|seg| wanted[number(seg)]) {
            let n = number(&seg);
            taken[n] = Some(seg);
        }
        let new_epoch = i64::try_from(at.unix_secs).unwrap_or(i64::MAX) - i64::from(at.now);
        let shift = Shift {
            delta: s.shift_from - new_epoch,
            now: at.now,
        };
        let mut per_shard: Vec<Vec<(Segment, Entry)>> =
            (0..self.shards.len()).map(|_| Vec::new()).collect();
        for e in &s.entries {
            if let Some(seg) = taken[e.seg].take() {
                per_shard[e.shard].push((seg, *e));
            }
        }
        let (shards, shared) = (&self.shards, &self.shared);
        let done = on_threads(per_shard, |i, segs: Vec<(Segment, Entry)>| {
            let mut shard = shards[i].lock().unwrap_or_else(|p| p.into_inner());
            shard.reserve_index(shared, s.live.get(i).copied().unwrap_or(0));
            let (mut kept, mut expired) = (0, 0);
            for (seg, e) in segs {
                let r = shard.restore(shared, seg, e.write, e.active, shift);
                kept += r.kept;
                expired += r.expired;
            }
            (kept, expired)
        });
        let items = done.iter().map(|d| d.0).sum();
        let expired = done.iter().map(|d| d.1).sum();
        self.raise_cas_floor(s.cas);
        Outcome::Resumed {
            items,
            expired,
            down_secs: at.unix_secs.saturating_sub(s.sealed_unix),
            micros: u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX),
        }
    }

    /// Segments of the local arena.
    fn segment_count(&self) -> usize {
        usize::try_from(self.arena_bytes).unwrap_or(usize::MAX) / self.shared.seg_size
    }

    /// How the start over the region went (`None`: the arena is anonymous memory).
    pub fn restart(&self) -> Option<&Restart> {
        self.persist.as_ref().map(|p| &p.restart)
    }

    /// Seals the arena into its region for the next start: call once the workers have
    /// stopped (a write after the seal makes the next start cold, never wrong). Every shard
    /// is held while the table and the checksum are written; the seal word goes last.
    /// A pending delayed flush_all is applied first (its items would be invalid anyway).
    pub fn seal(&self, at: WallTime) -> Result<SealReport, StoreError> {
        let started = std::time::Instant::now();
        let Some(p) = &self.persist else {
            return Err(StoreError::Config("the arena has no region to seal".into()));
        };
        let mut meta = p.meta.lock().unwrap_or_else(|e| e.into_inner());
        let mut guards: Vec<_> = (0..self.shards.len())
            .map(|i| self.lock_index(i, at.now))
            .collect();
        if self.flush_pending(at.now) {
            for g in &mut guards {
                g.clear(&self.shared);
            }
        }
        let seg_size = self.shared.seg_size;
        let mut entries = Vec::new();
        for (i, g) in guards.iter().enumerate() {
            for s in g.sealed_segments() {
                entries.push((i, s));
            }
        }
        set_word(&mut meta, W_MAGIC, MAGIC_OPEN);
        write_table(&mut meta, &entries, p.base, seg_size);
        let geo = Geometry {
            seg_size,
            segments: self.segment_count(),
            shard_count: self.shards.len(),
        };
        for (k, v) in layout_words(&self.config, &geo).into_iter().enumerate() {
            set_word(&mut meta, W_SEG_SIZE + k, v);
        }
        // Each shard counts its own CAS uniques above the floor: the next start continues
        // above all of them.
        let cas = guards.iter().map(|g| g.last_cas).fold(
            self.cas.load(std::sync::atomic::Ordering::Relaxed),
            u64::max,
        );
        let words = [
            (W_VERSION, FORMAT_VERSION),
            (W_SEED, self.hash_seed),
            (W_PROBE, self.shared.hasher.hash_one(PROBE)),
            (W_CAS, cas),
            (W_SEALED_UNIX, at.unix_secs),
            (W_SEALED_NOW, u64::from(at.now)),
            (W_ENTRIES, entries.len() as u64),
        ];
        for (w, v) in words {
            set_word(&mut meta, w, v);
        }
        let bytes = entries.iter().map(|(i, s)| guards[*i].sealed_bytes(*s));
        let checked: u64 = bytes.clone().map(|b| b.len() as u64).sum();
        let sum = checksum(&meta, entries.len(), bytes);
        set_word(&mut meta, W_CHECKSUM, sum);
        let items = guards.iter().map(|g| g.usage().0).sum();
        set_word(&mut meta, W_MAGIC, MAGIC_SEALED);
        Ok(SealReport {
            items,
            segments: entries.len(),
            checked_bytes: checked + (8 * WORDS + entries.len() * ENTRY) as u64,
            micros: u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX),
        })
    }
}

#[cfg(test)]
impl Store {
    /// A copy of the whole region as it is now (tests hand it to another store, as the
    /// next process would find the file).
    pub(crate) fn region_image(&self) -> Vec<u8> {
        let p = self.persist.as_ref().expect("a region");
        let mut out = p.meta.lock().expect("meta").to_vec();
        let mut segs: Vec<(usize, Vec<u8>)> = self.shared.pool.free_copies();
        for s in self.shards.iter() {
            segs.extend(s.lock().expect("shard").segment_copies());
        }
        segs.sort_unstable_by_key(|(addr, _)| *addr);
        for (_, b) in segs {
            out.extend_from_slice(&b);
        }
        out
    }
}
