//! The item arena: one anonymous mapping (huge pages when possible) cut into fixed-size segments.
//!
//! `#![forbid(unsafe_code)]` rules out carving one mapping into pieces that different shard
//! locks own. The safe way is to leak the mapping (`Box::leak` gives a `&'static mut [u8]`)
//! and split it with `split_at_mut`; each [`Segment`] then owns its bytes outright and
//! moves between shards and the free pool like any other value. A leaked mapping is never
//! unmapped, so when a [`crate::Store`] is dropped its segments go to a process-wide
//! recycle list that the next store of the same segment size takes from first. The
//! appliance creates one store for its lifetime; tests create many and reuse the memory.

use std::sync::Mutex;

use memmap2::{Advice, MmapMut, MmapOptions};

use crate::Backing;

/// Size of one explicit huge page (2 MiB); MAP_HUGETLB lengths are multiples of it.
pub(crate) const HUGE_PAGE: usize = 1 << 21;

/// A fixed-size piece of the arena, owned by one shard or by the free pool.
#[derive(Debug)]
pub(crate) struct Segment {
    pub bytes: &'static mut [u8],
    pub backing: Backing,
    /// `None`: the local arena (placed by the allocating thread's memory policy); `Some(n)`:
    /// a sub region bound to node `n` (ADR 0035). Recycled only into the same kind.
    pub home: Option<u32>,
}

/// Binds a fresh mapping's pages to a node before any is touched (the store has no
/// `unsafe`; the caller passes `ringstore_sys::mbind_bind` or a test stand-in).
pub type BindFn = fn(&mut [u8], u32) -> std::io::Result<()>;

/// Segments of dropped stores, kept for reuse because leaked mappings cannot be unmapped.
static RECYCLED: Mutex<Vec<Segment>> = Mutex::new(Vec::new());

/// Returns segments of a dropped store for later reuse.
pub(crate) fn recycle(segments: impl IntoIterator<Item = Segment>) {
    let mut list = RECYCLED.lock().unwrap_or_else(|e| e.into_inner());
    list.extend(segments);
}

/// Allocates `count` segments of `seg_size` bytes: recycled ones first, then a new mapping.
pub(crate) fn allocate(
    count: usize,
    seg_size: usize,
    huge_pages: bool,
) -> std::io::Result<Vec<Segment>> {
    allocate_at(count, seg_size, huge_pages, None)
}

/// [`allocate`] for a sub region: `home` is `(node, bind)`; the mapping is bound with
/// `bind` before its pages are touched. Sub regions use transparent huge pages, never
/// MAP_HUGETLB: a hugetlb reservation is taken at mmap under the thread's (local) policy,
/// and a fault on a node with no reserved page would be SIGBUS (ADR 0035).
pub(crate) fn allocate_at(
    count: usize,
    seg_size: usize,
    huge_pages: bool,
    home: Option<(u32, Option<BindFn>)>,
) -> std::io::Result<Vec<Segment>> {
    let node = home.map(|(n, _)| n);
    let mut out = Vec::with_capacity(count);
    {
        let mut list = RECYCLED.lock().unwrap_or_else(|e| e.into_inner());
        let mut i = 0;
        while i < list.len() && out.len() < count {
            let fits = list[i].bytes.len() == seg_size
                && list[i].home == node
                && (huge_pages || list[i].backing == Backing::Normal);
            if fits {
                out.push(list.swap_remove(i));
            } else {
                i += 1;
            }
        }
    }
    let missing = count - out.len();
    if missing > 0 {
        let (map, backing) = match home {
            None => map_arena(missing * seg_size, huge_pages)?,
            Some((n, bind)) => map_bound(missing * seg_size, huge_pages, n, bind)?,
        };
        let mut rest: &'static mut [u8] = Box::leak(Box::new(map)).as_mut();
        for _ in 0..missing {
            let (seg, tail) = rest.split_at_mut(seg_size);
            out.push(Segment {
                bytes: seg,
                backing,
                home: node,
            });
            rest = tail;
        }
    }
    Ok(out)
}

/// The address ranges `(start, length)` of `segs`, ascending, adjacent ones merged.
pub(crate) fn spans(segs: &[Segment]) -> Vec<(u64, u64)> {
    let mut ranges: Vec<(u64, u64)> = segs
        .iter()
        .map(|s| (s.bytes.as_ptr() as u64, s.bytes.len() as u64))
        .collect();
    ranges.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for (start, len) in ranges {
        match out.last_mut() {
            Some(last) if last.0 + last.1 == start => last.1 += len,
            _ => out.push((start, len)),
        }
    }
    out
}

/// Maps `len` bytes: MAP_HUGETLB, else a normal map advised MADV_HUGEPAGE, else normal pages.
fn map_arena(len: usize, huge_pages: bool) -> std::io::Result<(MmapMut, Backing)> {
    if huge_pages {
        let huge_len = len.div_ceil(HUGE_PAGE) * HUGE_PAGE;
        if let Ok(map) = MmapOptions::new().len(huge_len).huge(Some(21)).map_anon() {
            return Ok((map, Backing::HugeTlb));
        }
        let map = MmapOptions::new().len(len).map_anon()?;
        let backing = match map.advise(Advice::HugePage) {
            Ok(()) => Backing::TransparentHuge,
            Err(_) => Backing::Normal,
        };
        return Ok((map, backing));
    }
    Ok((MmapOptions::new().len(len).map_anon()?, Backing::Normal))
}

/// Maps `len` bytes of a sub region: normal pages bound to `node` by `bind` (if any), then
/// advised MADV_HUGEPAGE when `huge_pages`.
fn map_bound(
    len: usize,
    huge_pages: bool,
    node: u32,
    bind: Option<BindFn>,
) -> std::io::Result<(MmapMut, Backing)> {
    let mut map = MmapOptions::new().len(len).map_anon()?;
    if let Some(bind) = bind {
        bind(&mut map[..], node)?;
    }
    let backing = match huge_pages && map.advise(Advice::HugePage).is_ok() {
        true => Backing::TransparentHuge,
        false => Backing::Normal,
    };
    Ok((map, backing))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_are_disjoint_writable_and_recycled() {
        let seg_size = 64 * 1024 + 8;
        let mut segs = allocate(3, seg_size, false).expect("map");
        assert_eq!(segs.len(), 3);
        for (i, s) in segs.iter_mut().enumerate() {
            assert_eq!(s.bytes.len(), seg_size);
            assert_eq!(s.backing, Backing::Normal);
            s.bytes.fill(u8::try_from(i).unwrap());
        }
        for (i, s) in segs.iter().enumerate() {
            assert!(s.bytes.iter().all(|&b| b == u8::try_from(i).unwrap()));
        }
        let addrs: Vec<usize> = segs.iter().map(|s| s.bytes.as_ptr() as usize).collect();
        recycle(segs);
        let again = allocate(2, seg_size, false).expect("map");
        assert!(again
            .iter()
            .all(|s| addrs.contains(&(s.bytes.as_ptr() as usize))));
        recycle(again);
    }

    #[test]
    fn huge_page_request_falls_back_and_reports_backing() {
        let segs = allocate(2, HUGE_PAGE, true).expect("map");
        // Whatever the machine offers, the arena is usable and reports a backing.
        for s in &segs {
            assert!(matches!(
                s.backing,
                Backing::HugeTlb | Backing::TransparentHuge | Backing::Normal
            ));
            assert_eq!(s.bytes.len(), HUGE_PAGE);
        }
        recycle(segs);
    }
}
