//! The coarse clock: read once per loop iteration and turned into the service's [`Now`].

use std::time::{SystemTime, UNIX_EPOCH};

use ringstore_service::Now;

/// Process-start reference points shared by every worker.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Clock {
    /// The monotonic reading ([`crate::sys::monotonic_ns`]) at the start.
    start: u64,
    unix_start: u64,
    /// [`crate::lend::mono_origin`]: `Now::mono_ns` counts from it.
    origin: u64,
}

impl Clock {
    pub(crate) fn start() -> Clock {
        let unix_start = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        // The latency clock's origin first, so `start` is never before it.
        let origin = crate::lend::mono_origin();
        Clock {
            start: crate::sys::monotonic_ns(),
            unix_start,
            origin,
        }
    }

    pub(crate) fn unix_start(&self) -> u64 {
        self.unix_start
    }

    /// Store time (seconds since start), Unix seconds, monotonic milliseconds and the
    /// latency histograms' nanoseconds ([`crate::lend::mono_ns`]), all from one reading.
    /// (Read on every loop iteration, several times per request at depth 1: an `Instant`
    /// and its subtraction cost about 50 instructions a reading more than this integer
    /// arithmetic, callgrind.)
    pub(crate) fn now(&self) -> Now {
        let mono = crate::sys::monotonic_ns();
        let ns = mono.saturating_sub(self.start);
        let secs = ns / 1_000_000_000;
        Now {
            store: u32::try_from(secs).unwrap_or(u32::MAX),
            unix: self.unix_start + secs,
            mono_ms: ns / 1_000_000,
            mono_ns: mono.saturating_sub(self.origin),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readings_are_consistent_and_monotonic() {
        let clock = Clock::start();
        let a = clock.now();
        std::thread::sleep(std::time::Duration::from_millis(5));
        let b = clock.now();
        assert!(b.mono_ms >= a.mono_ms + 5);
        assert!(b.mono_ns >= a.mono_ns + 5_000_000);
        // The loop's reading and the latency clock count on one scale.
        let c = crate::lend::mono_ns();
        assert!(c >= b.mono_ns && c < b.mono_ns + 1_000_000_000);
        assert_eq!(a.unix, clock.unix_start() + a.store as u64);
        assert!(clock.unix_start() > 1_600_000_000);
    }
}
