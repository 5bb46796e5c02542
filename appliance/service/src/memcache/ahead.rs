//! The `get`/`set` requests of a pipelined batch parsed once, before the first runs, so the
//! store can start loading their keys' index buckets and items (ADR 0038) from what the
//! session then executes, rather than from a second scan of the batch's lines.

use ringstore_proto::memcache::{parse, GetRequest, Limits, Parse, Request, StoreRequest};
use ringstore_store::PREFETCH_MAX;

/// A parsed request kept for its turn: only those whose execution never changes how the
/// bytes after them are read (no value to swallow, no mode change), so parsing them ahead
/// gives what parsing each in its turn would.
#[derive(Clone, Copy)]
enum Kept<'a> {
    Get(GetRequest<'a>),
    Store(StoreRequest<'a>),
}

/// The requests parsed ahead, in order, each with the input bytes it used.
pub(super) struct Ahead<'a> {
    kept: [Option<(Kept<'a>, usize)>; PREFETCH_MAX],
    len: usize,
    next: usize,
}

impl<'a> Ahead<'a> {
    /// Parses the `get`/`gets`/storage requests at the start of `buf` (up to
    /// [`PREFETCH_MAX`] of them, and up to the first of any other kind or one not whole,
    /// whose key counts if it is a storage command awaiting its value) and prefetches
    /// their keys when there are two or more. Never inlined: inlined into the session's loop
    /// its ~2 KiB result was copied once more per batch (callgrind).
    #[inline(never)]
    pub(super) fn parse(
        buf: &'a [u8],
        limits: &Limits,
        prefetch: impl FnOnce(&[&[u8]]),
    ) -> Ahead<'a> {
        let mut ahead = Ahead {
            kept: [None; PREFETCH_MAX],
            len: 0,
            next: 0,
        };
        let mut keys: [&[u8]; PREFETCH_MAX] = [&[]; PREFETCH_MAX];
        let (mut n, mut at) = (0, 0);
        // The first PREFETCH_MAX keys are prefetched, the rest not.
        let mut push = |key: &'a [u8]| {
            if let Some(slot) = keys.get_mut(n) {
                *slot = key;
                n += 1;
            }
        };
        while ahead.len < PREFETCH_MAX && at < buf.len() {
            let (kept, consumed) = match parse(&buf[at..], limits) {
                Parse::Done {
                    request: Request::Get(g),
                    consumed,
                } => {
                    g.keys.take(PREFETCH_MAX).for_each(&mut push);
                    (Kept::Get(g), consumed)
                }
                Parse::Done {
                    request: Request::Store(s),
                    consumed,
                } => {
                    push(s.key);
                    (Kept::Store(s), consumed)
                }
                Parse::AwaitingValue { key, .. } => {
                    push(key);
                    break;
                }
                _ => break,
            };
            ahead.kept[ahead.len] = Some((kept, consumed));
            ahead.len += 1;
            at += consumed;
        }
        if n > 1 {
            prefetch(&keys[..n]);
        }
        ahead
    }

    /// The next request parsed ahead, as [`parse`] gave it; `None` once they are used up.
    /// Inlined, so the request is built where the session's loop matches it.
    #[inline(always)]
    pub(super) fn next(&mut self) -> Option<Parse<'a>> {
        let (kept, consumed) = self.kept.get(self.next).copied().flatten()?;
        self.next += 1;
        let request = match kept {
            Kept::Get(g) => Request::Get(g),
            Kept::Store(s) => Request::Store(s),
        };
        Some(Parse::Done { request, consumed })
    }

    /// True when the batch's first request was not one parsed ahead.
    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.len == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owned(keys: &[&[u8]]) -> Vec<Vec<u8>> {
        keys.iter().map(|k| k.to_vec()).collect()
    }

    /// Every request the ahead parse keeps comes back as [`parse`] gives it in its turn, and
    /// the keys it prefetches are those requests' keys, in order.
    #[test]
    fn gives_what_parsing_in_turn_gives() {
        let buf: &[u8] =
            b"get a b\r\nset c 0 0 2\r\nhi\r\ngets d\r\nset  e 1 2 1\r\nx\r\nmg f v\r\nget g\r\n";
        let limits = Limits::default();
        let mut prefetched = Vec::new();
        let mut ahead = Ahead::parse(buf, &limits, |keys| prefetched = owned(keys));
        assert_eq!(prefetched, owned(&[&b"a"[..], b"b", b"c", b"d", b"e"]));
        let mut at = 0;
        while let Some(got) = ahead.next() {
            let Parse::Done { consumed, .. } = got else {
                panic!("{got:?}")
            };
            assert_eq!(got, parse(&buf[at..], &limits));
            at += consumed;
        }
        assert!(
            buf[at..].starts_with(b"mg f v"),
            "stops at what it does not keep"
        );
    }

    #[test]
    fn a_batch_of_one_prefetches_nothing_and_a_value_to_come_ends_it() {
        let limits = Limits::default();
        let mut ahead = Ahead::parse(b"get a\r\n", &limits, |_| panic!("prefetched one key"));
        assert!(!ahead.is_empty() && ahead.next().is_some() && ahead.next().is_none());
        let mut prefetched = Vec::new();
        let mut ahead = Ahead::parse(b"get a\r\nset b 0 0 9\r\nabc", &limits, |keys| {
            prefetched = owned(keys);
        });
        assert_eq!(prefetched, owned(&[&b"a"[..], b"b"]));
        assert!(ahead.next().is_some() && ahead.next().is_none());
        assert!(Ahead::parse(b"stats\r\nget a\r\n", &limits, |_| panic!()).is_empty());
    }
}
