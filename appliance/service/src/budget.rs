//! The connection-memory budget: bytes of requests being received and replies waiting to be
//! sent that connections hold beyond a small fixed allowance each, bounded across all of them.
//!
//! Why one global budget: a client controls how much of a value it sends before stalling and
//! how much of a reply it reads, so per-connection caps alone multiply into
//! `max-conns × item size`. Each session holds at most [`IN_FREE`] bytes of input and
//! [`OUT_FREE`] bytes of output without asking; anything more is reserved here *before* it is
//! buffered or copied (memcached reserves a value in its slab budget when the command line
//! arrives, for the same reason). A refused reservation becomes the protocol's error
//! (`SERVER_ERROR out of memory ...`, HTTP 503), never an allocation. Holds are released when
//! the bytes are gone and, through `Drop`, when the session is.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// Input a session may buffer without a reservation: any memcache command line up to the
/// text protocol's line limit and any HTTP request head fit.
pub const IN_FREE: usize = 32 << 10;
/// Pending output a session may hold without a reservation: many small replies.
pub const OUT_FREE: usize = 64 << 10;

/// Shared by every session of a server.
#[derive(Debug)]
pub struct ConnMemory {
    limit: usize,
    used: AtomicUsize,
    peak: AtomicUsize,
    refused: AtomicU64,
}

impl ConnMemory {
    pub fn new(limit: usize) -> Arc<ConnMemory> {
        Arc::new(ConnMemory {
            limit,
            used: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
            refused: AtomicU64::new(0),
        })
    }

    /// Bytes reserved now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// The bound.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Most bytes ever reserved at once.
    pub fn peak(&self) -> usize {
        self.peak.load(Ordering::Relaxed)
    }

    /// Reservations refused since start.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    fn try_take(&self, bytes: usize) -> bool {
        let mut used = self.used.load(Ordering::Relaxed);
        loop {
            let Some(next) = used.checked_add(bytes).filter(|&n| n <= self.limit) else {
                self.refused.fetch_add(1, Ordering::Relaxed);
                return false;
            };
            match self
                .used
                .compare_exchange_weak(used, next, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => {
                    self.peak.fetch_max(next, Ordering::Relaxed);
                    return true;
                }
                Err(now) => used = now,
            }
        }
    }

    fn give_back(&self, bytes: usize) {
        let before = self.used.fetch_sub(bytes, Ordering::AcqRel);
        debug_assert!(before >= bytes, "released more than was reserved");
    }
}

/// One session's reservation (of input or of output). Empty until first used.
#[derive(Debug, Default)]
pub struct Hold {
    budget: Option<Arc<ConnMemory>>,
    bytes: usize,
}

impl Hold {
    /// Makes the reservation exactly `bytes`: shrinking always succeeds; growing takes the
    /// difference from `budget` or, when it has no room, fails and leaves the hold as it was.
    pub fn set(&mut self, budget: &Arc<ConnMemory>, bytes: usize) -> bool {
        if bytes == self.bytes {
            return true;
        }
        let held_by = self.budget.get_or_insert_with(|| Arc::clone(budget));
        debug_assert!(Arc::ptr_eq(held_by, budget), "a hold moved between budgets");
        if bytes < self.bytes {
            held_by.give_back(self.bytes - bytes);
        } else if !held_by.try_take(bytes - self.bytes) {
            return false;
        }
        self.bytes = bytes;
        true
    }

    /// Makes room for `extra` more bytes after `pending` bytes of output: true when the
    /// total stays within [`OUT_FREE`] or the excess could be reserved.
    pub fn room_for_output(
        &mut self,
        budget: &Arc<ConnMemory>,
        pending: usize,
        extra: usize,
    ) -> bool {
        let need = pending.saturating_add(extra);
        need <= OUT_FREE || self.set(budget, need - OUT_FREE)
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Gives everything back.
    pub fn release(&mut self) {
        if let Some(budget) = &self.budget {
            budget.give_back(self.bytes);
        }
        self.bytes = 0;
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_never_exceed_the_limit_and_give_back_on_drop() {
        let budget = ConnMemory::new(100);
        let mut a = Hold::default();
        let mut b = Hold::default();
        assert!(a.set(&budget, 60));
        assert!(!b.set(&budget, 41), "60 + 41 > 100");
        assert_eq!(b.bytes(), 0);
        assert!(b.set(&budget, 40));
        assert_eq!(budget.used(), 100);
        assert!(a.set(&budget, 10), "shrinking always works");
        assert!(b.set(&budget, 90));
        assert_eq!(budget.used(), 100);
        assert_eq!(budget.peak(), 100);
        assert_eq!(budget.refused(), 1);
        drop(a);
        assert_eq!(budget.used(), 90);
        b.release();
        assert_eq!(budget.used(), 0);
        drop(b);
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn concurrent_holds_stay_within_the_limit() {
        let budget = ConnMemory::new(1000);
        std::thread::scope(|s| {
            for _ in 0..4 {
                let budget = &budget;
                s.spawn(move || {
                    let mut h = Hold::default();
                    for i in 0..10_000usize {
                        let _ = h.set(budget, (i * 37) % 400);
                        assert!(budget.used() <= 1000);
                    }
                });
            }
        });
        assert_eq!(budget.used(), 0);
    }
}
