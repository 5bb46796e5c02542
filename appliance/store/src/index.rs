//! The hash index of one shard: one 8-byte word per bucket, open addressing with linear
//! probing kept in Robin Hood order, and backward-shift deletion (no tombstones).
//!
//! A word packs, from the top: the top 16–47 bits of the key's hash (the tag), the
//! segment slot plus one (16 bits, so a used word is never 0 and 0 means empty), and the
//! byte offset in the segment (`off_bits`, just enough for the segment size). A key's home
//! bucket is computed from its tag alone (the tag as a fraction of 2^64, times the
//! capacity), so the table can be resized without reading a single key, and a word's
//! distance from its home is known from the word itself, which is what Robin Hood order and
//! backward-shift deletion need. Words with one home are in tag order, so a run that does
//! not wrap round the table's end is sorted by tag and a look-up stops at a larger tag.
//!
//! Nothing is ever left behind by a delete, so the table only grows with live entries: at
//! most 7/8 full, it grows by a quarter when an insert would pass that (docs/BENCHMARKS.md,
//! "Issue 14", has the bytes this saves over a doubling table with tombstones).

/// Where an item lives: the slot of its segment in the shard and the byte offset in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Loc {
    slot: u16,
    off: u32,
}

impl Loc {
    pub(crate) fn new(slot: u16, off: u32) -> Loc {
        debug_assert!(usize::from(slot) < SLOTS_MAX);
        Loc { slot, off }
    }
    /// The location of byte `off` of segment slot `slot`, both in-range indices of a held
    /// segment (slots below [`SLOTS_MAX`], offsets below [`SEGMENT_MAX`]).
    #[expect(
        clippy::cast_possible_truncation,
        reason = "slot < SLOTS_MAX (u16) and off < SEGMENT_MAX (2^32) by construction, asserted"
    )]
    pub(crate) fn at(slot: usize, off: usize) -> Loc {
        debug_assert!(off < SEGMENT_MAX);
        Loc::new(slot_id(slot), off as u32)
    }
    pub(crate) fn slot(self) -> usize {
        usize::from(self.slot)
    }
    pub(crate) fn off(self) -> usize {
        self.off as usize
    }
}

/// The 16-bit number of segment slot `slot` (below [`SLOTS_MAX`]: the shard never holds more).
#[expect(
    clippy::cast_possible_truncation,
    reason = "a shard holds fewer than SLOTS_MAX (u16::MAX) segments, asserted"
)]
pub(crate) fn slot_id(slot: usize) -> u16 {
    debug_assert!(slot < SLOTS_MAX);
    slot as u16
}

/// Most segments one shard can hold: slot numbers are 16 bits and the word stores slot + 1.
pub(crate) const SLOTS_MAX: usize = u16::MAX as usize;

const SLOT_BITS: u32 = 16;

/// Buckets [`Index::guess`] looks at from a tag's home (runs are short at 7/8 load at most).
const GUESS_PROBES: usize = 4;
/// Largest segment whose offsets fit in a word (32 offset bits leave 16 tag bits).
pub(crate) const SEGMENT_MAX: usize = 1 << 32;
/// The table is at most `LOAD_NUM / LOAD_DEN` full.
const LOAD_NUM: usize = 7;
const LOAD_DEN: usize = 8;
/// Buckets of the first allocation.
const MIN_CAPACITY: usize = 64;

/// One shard's index. See the module documentation for the layout.
pub(crate) struct Index {
    words: Vec<u64>,
    len: usize,
    off_bits: u32,
    /// The word's tag bits in place (its top `64 - 16 - off_bits` bits).
    tag_mask: u64,
}

impl Index {
    /// An empty index for a shard whose segments are `seg_size` bytes (at most
    /// [`SEGMENT_MAX`]). Allocates nothing until the first insert.
    pub(crate) fn new(seg_size: usize) -> Index {
        assert!(
            (1..=SEGMENT_MAX).contains(&seg_size),
            "segment size checked by Store::new"
        );
        let off_bits = (usize::BITS - (seg_size - 1).leading_zeros()).max(1);
        let tag_bits = u64::BITS - SLOT_BITS - off_bits;
        Index {
            words: Vec::new(),
            len: 0,
            off_bits,
            tag_mask: !0 << (u64::BITS - tag_bits),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Buckets allocated.
    #[cfg(test)]
    pub(crate) fn capacity(&self) -> usize {
        self.words.len()
    }

    /// Bytes of the table's allocation (what the budget is charged).
    pub(crate) fn allocation_size(&self) -> usize {
        self.words.capacity() * std::mem::size_of::<u64>()
    }

    /// Whether one more insert needs the table to grow first.
    pub(crate) fn full(&self) -> bool {
        (self.len + 1) * LOAD_DEN > self.words.len() * LOAD_NUM
    }

    /// The tag of `hash`, in place: its top bits, the rest zero.
    fn tag_of(&self, hash: u64) -> u64 {
        hash & self.tag_mask
    }

    /// The tag of a word, in place.
    fn word_tag(&self, w: u64) -> u64 {
        w & self.tag_mask
    }

    fn encode(&self, tag: u64, loc: Loc) -> u64 {
        debug_assert!((loc.off as u64) < 1 << self.off_bits);
        tag | ((u64::from(loc.slot) + 1) << self.off_bits) | u64::from(loc.off)
    }

    #[expect(
        clippy::cast_possible_truncation,
        reason = "masked to SLOT_BITS (16) and off_bits (at most 32) bits first"
    )]
    fn decode(&self, w: u64) -> Loc {
        let slot = (w >> self.off_bits) & ((1 << SLOT_BITS) - 1);
        Loc {
            slot: (slot - 1) as u16,
            off: (w & ((1 << self.off_bits) - 1)) as u32,
        }
    }

    /// Home bucket of a tag (in place) in a table of `cap` buckets: the tag as a fraction
    /// of 2^64, scaled to the table.
    #[expect(
        clippy::cast_possible_truncation,
        reason = "(tag * cap) >> 64 < cap, a usize"
    )]
    fn home(tag: u64, cap: usize) -> usize {
        ((u128::from(tag) * cap as u128) >> 64) as usize
    }

    /// How far bucket `i` is from the home of the word in it.
    fn dist(&self, w: u64, i: usize) -> usize {
        self.dist_from(Self::home(self.word_tag(w), self.words.len()), i)
    }

    /// How far bucket `i` is from bucket `h`, going forward (round the end).
    fn dist_from(&self, h: usize, i: usize) -> usize {
        if i >= h {
            i - h
        } else {
            i + self.words.len() - h
        }
    }

    fn next(&self, i: usize) -> usize {
        if i + 1 == self.words.len() {
            0
        } else {
            i + 1
        }
    }

    /// The bucket holding the entry under `hash` for which `eq` holds.
    ///
    /// Words of a run are in Robin Hood order with ties (same home) broken by tag, and a
    /// home only grows with its tag, so a run not wrapping past the table's end is sorted
    /// by tag: a probe steps over smaller tags without working out their homes, and stops
    /// at the first larger tag whose home is not behind the end of the table.
    fn position(&self, hash: u64, mut eq: impl FnMut(Loc) -> bool) -> Option<usize> {
        let tag = self.tag_of(hash);
        let cap = self.words.len();
        let home = Self::home(tag, cap);
        // Two loops rather than one over a chained iterator: the chain's per-word branch
        // costs about 5% of a SET's store instructions (callgrind).
        // From the home to the table's end: smaller tags are stepped over unexamined.
        for (i, &w) in self.words.iter().enumerate().skip(home) {
            if w == 0 {
                return None;
            }
            let t = self.word_tag(w);
            if t == tag {
                if eq(self.decode(w)) {
                    return Some(i);
                }
            } else if t > tag {
                // A larger tag ends the search unless its word wrapped round from the end.
                let h = Self::home(t, cap);
                if h <= i {
                    return None;
                }
            }
        }
        // Round the end: plain Robin Hood, stop at a word nearer its home than the probe
        // (which is `cap - home + i` from its own).
        for (i, &w) in self.words.iter().enumerate().take(home) {
            if w == 0 {
                return None;
            }
            let t = self.word_tag(w);
            if t == tag {
                if eq(self.decode(w)) {
                    return Some(i);
                }
            } else if self.dist(w, i) < cap - home + i {
                return None;
            }
        }
        None
    }

    /// The bucket a probe for `hash` reads first; `None` while the table has no buckets.
    pub(crate) fn home_word(&self, hash: u64) -> Option<&u64> {
        self.words
            .get(Self::home(self.tag_of(hash), self.words.len()))
    }

    /// The first entry near its home whose tag is `hash`'s: where the item for `hash` most
    /// likely is, without reading any key (what a prefetch needs; a wrong guess costs only
    /// a cache line).
    pub(crate) fn guess(&self, hash: u64) -> Option<Loc> {
        let tag = self.tag_of(hash);
        let home = Self::home(tag, self.words.len());
        let end = self.words.len().min(home + GUESS_PROBES);
        // A plain loop over the sub-slice: the skip/take/take_while/find chain cost the
        // batch prefetch ~25 instructions a key more (callgrind).
        for &w in self.words.get(home..end)? {
            if w == 0 {
                return None;
            }
            if self.word_tag(w) == tag {
                return Some(self.decode(w));
            }
        }
        None
    }

    /// The entry under `hash` for which `eq` holds.
    pub(crate) fn find(&self, hash: u64, eq: impl FnMut(Loc) -> bool) -> Option<Loc> {
        self.position(hash, eq).map(|i| self.decode(self.words[i]))
    }

    /// Points the entry under `hash` for which `eq` holds at `new`; returns what it held.
    pub(crate) fn replace(
        &mut self,
        hash: u64,
        eq: impl FnMut(Loc) -> bool,
        new: Loc,
    ) -> Option<Loc> {
        let i = self.position(hash, eq)?;
        let old = self.decode(self.words[i]);
        self.words[i] = self.encode(self.tag_of(hash), new);
        Some(old)
    }

    /// Removes the entry `loc` under `hash`; false if there is none.
    pub(crate) fn remove(&mut self, hash: u64, loc: Loc) -> bool {
        let Some(mut i) = self.position(hash, |l| l == loc) else {
            return false;
        };
        self.len -= 1;
        // Backward shift: pull each following word that is not at its home one bucket back.
        loop {
            let j = self.next(i);
            let w = self.words[j];
            if w == 0 || self.dist(w, j) == 0 {
                self.words[i] = 0;
                return true;
            }
            self.words[i] = w;
            i = j;
        }
    }

    /// Adds `loc` under `hash`; the caller knows no entry for its key is there. Grows the
    /// table first when it is full.
    pub(crate) fn insert_new(&mut self, hash: u64, loc: Loc) {
        if self.full() {
            self.grow();
        }
        let w = self.encode(self.tag_of(hash), loc);
        Self::place(&mut self.words, self.tag_mask, w);
        self.len += 1;
    }

    /// Puts word `w` into `words` (which has an empty bucket) in Robin Hood order, ties
    /// (the same home) broken by tag, smaller first.
    fn place(words: &mut [u64], tag_mask: u64, mut w: u64) {
        let cap = words.len();
        let home_of = |w: u64| Self::home(w & tag_mask, cap);
        let mut i = home_of(w);
        let mut d = 0;
        loop {
            let cur = words[i];
            if cur == 0 {
                words[i] = w;
                return;
            }
            let h = home_of(cur);
            let cd = if i >= h { i - h } else { i + cap - h };
            if cd < d || (cd == d && cur & tag_mask > w & tag_mask) {
                words[i] = w;
                w = cur;
                d = cd;
            }
            i = if i + 1 == cap { 0 } else { i + 1 };
            d += 1;
        }
    }

    /// Grows the table by a quarter (at least to [`MIN_CAPACITY`]), re-placing every word
    /// from its tag: no key is read.
    pub(crate) fn grow(&mut self) {
        let cap = (self.words.len() + self.words.len() / 4).max(MIN_CAPACITY);
        let mut words = vec![0u64; cap];
        for &w in self.words.iter().filter(|&&w| w != 0) {
            Self::place(&mut words, self.tag_mask, w);
        }
        self.words = words;
    }

    /// Grows the table once to the size the quarter steps of [`Index::grow`] reach for
    /// `n` entries (a sealed region's shard, ADR 0052: one re-placing instead of dozens).
    pub(crate) fn reserve(&mut self, n: usize) {
        let mut cap = self.words.len();
        while (n + 1) * LOAD_DEN > cap * LOAD_NUM {
            cap = (cap + cap / 4).max(MIN_CAPACITY);
        }
        if cap == self.words.len() {
            return;
        }
        let mut words = vec![0u64; cap];
        for &w in self.words.iter().filter(|&&w| w != 0) {
            Self::place(&mut words, self.tag_mask, w);
        }
        self.words = words;
    }

    /// Every entry, in bucket order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = Loc> + '_ {
        self.words
            .iter()
            .filter(|&&w| w != 0)
            .map(|&w| self.decode(w))
    }

    /// Removes every entry, keeping the allocation.
    pub(crate) fn clear(&mut self) {
        self.words.fill(0);
        self.len = 0;
    }
}

#[cfg(test)]
mod tests;
