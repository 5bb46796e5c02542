//! Shard-lock contention counters for measuring the store's serial fraction (cargo feature
//! `contention`): lock acquisitions, those that had to wait, and the time spent waiting and
//! holding. Without the feature the guard is the plain `MutexGuard` and nothing is counted.

use crate::shard::Shard;
use std::sync::{Mutex, MutexGuard};

/// What the counters hold, summed over every thread ([`snapshot`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Contention {
    /// Shard-lock acquisitions on the request paths.
    pub acquisitions: u64,
    /// Those that found the lock held and had to wait.
    pub waited: u64,
    /// Nanoseconds spent waiting for a held lock.
    pub wait_ns: u64,
    /// Nanoseconds between acquiring and releasing.
    pub held_ns: u64,
}

#[cfg(not(feature = "contention"))]
pub(crate) type ShardGuard<'a> = MutexGuard<'a, Shard>;

/// Locks `m` (no counting without the feature).
#[cfg(not(feature = "contention"))]
#[inline]
pub(crate) fn lock(m: &Mutex<Shard>) -> ShardGuard<'_> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Nothing is counted without the feature.
#[cfg(not(feature = "contention"))]
pub fn snapshot() -> Contention {
    Contention::default()
}

#[cfg(feature = "contention")]
pub use counted::snapshot;
#[cfg(feature = "contention")]
pub(crate) use counted::{lock, ShardGuard};

#[cfg(feature = "contention")]
mod counted {
    use super::{Contention, Mutex, MutexGuard, Shard};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, TryLockError};
    use std::time::Instant;

    /// One thread's counters: written by that thread only, so counting adds no shared cache
    /// line to the paths it measures; read by [`snapshot`] from any thread.
    #[derive(Default)]
    struct Counters([AtomicU64; 4]);

    /// Every thread's counters (one entry per thread that ever locked a shard: bounded by
    /// the threads of the process).
    static ALL: Mutex<Vec<Arc<Counters>>> = Mutex::new(Vec::new());

    thread_local! {
        static MINE: Arc<Counters> = {
            let c = Arc::new(Counters::default());
            ALL.lock().unwrap_or_else(|e| e.into_inner()).push(Arc::clone(&c));
            c
        };
    }

    fn add(field: usize, n: u64) {
        MINE.with(|c| c.0[field].fetch_add(n, Ordering::Relaxed));
    }

    fn nanos(since: Instant) -> u64 {
        u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// A shard guard that adds its hold time to the thread's counters when dropped.
    pub(crate) struct ShardGuard<'a> {
        guard: MutexGuard<'a, Shard>,
        since: Instant,
    }

    impl std::ops::Deref for ShardGuard<'_> {
        type Target = Shard;
        fn deref(&self) -> &Shard {
            &self.guard
        }
    }

    impl std::ops::DerefMut for ShardGuard<'_> {
        fn deref_mut(&mut self) -> &mut Shard {
            &mut self.guard
        }
    }

    impl Drop for ShardGuard<'_> {
        fn drop(&mut self) {
            add(3, nanos(self.since));
        }
    }

    pub(crate) fn lock(m: &Mutex<Shard>) -> ShardGuard<'_> {
        add(0, 1);
        let guard = match m.try_lock() {
            Ok(g) => g,
            Err(TryLockError::Poisoned(e)) => e.into_inner(),
            Err(TryLockError::WouldBlock) => {
                // Counted before blocking, so a reader sees a waiter while it waits.
                add(1, 1);
                let start = Instant::now();
                let g = m.lock().unwrap_or_else(|e| e.into_inner());
                add(2, nanos(start));
                g
            }
        };
        ShardGuard {
            guard,
            since: Instant::now(),
        }
    }

    /// The counters summed over every thread.
    pub fn snapshot() -> Contention {
        let all = ALL.lock().unwrap_or_else(|e| e.into_inner());
        let sum = |i: usize| {
            all.iter()
                .map(|c| c.0[i].load(Ordering::Relaxed))
                .sum::<u64>()
        };
        Contention {
            acquisitions: sum(0),
            waited: sum(1),
            wait_ns: sum(2),
            held_ns: sum(3),
        }
    }
}

#[cfg(all(test, feature = "contention"))]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    /// Counters are process-wide and only grow, so parallel tests can only add to them:
    /// each assertion is a lower bound on what this test itself caused.
    #[test]
    fn a_wait_for_a_held_shard_is_counted_with_its_hold_time() {
        let m = Mutex::new(Shard::new(1 << 20, 0));
        let before = snapshot();
        std::thread::scope(|s| {
            let guard = lock(&m);
            s.spawn(|| drop(lock(&m))); // waits for the guard below
                                        // Held until the waiter has been counted (it counts itself before blocking).
            let give_up = Instant::now() + Duration::from_secs(30);
            while snapshot().waited == before.waited && Instant::now() < give_up {
                std::thread::sleep(Duration::from_millis(10));
            }
            std::thread::sleep(Duration::from_millis(50));
            drop(guard);
        });
        let after = snapshot();
        assert!(after.acquisitions >= before.acquisitions + 2);
        assert!(after.waited > before.waited, "{before:?} {after:?}");
        assert!(after.held_ns >= before.held_ns + 40_000_000);
        assert!(after.wait_ns > before.wait_ns);
    }
}
