//! The coarse clock: read once per loop iteration and turned into the service's [`Now`].

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use ringstore_service::Now;

/// Process-start reference points shared by every worker.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Clock {
    start: Instant,
    unix_start: u64,
    /// [`crate::lend::mono_ns`] at `start`: `Now::mono_ns` is this plus the time since
    /// `start`, one subtraction of instants per reading rather than two.
    start_ns: u64,
}

impl Clock {
    pub(crate) fn start() -> Clock {
        let unix_start = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        // The latency clock's origin first, so `start` is never before it.
        let origin = crate::lend::mono_origin();
        let start = Instant::now();
        Clock {
            start,
            unix_start,
            start_ns: u64::try_from(start.duration_since(origin).as_nanos()).unwrap_or(u64::MAX),
        }
    }

    pub(crate) fn unix_start(&self) -> u64 {
        self.unix_start
    }

    /// Store time (seconds since start), Unix seconds, monotonic milliseconds and the
    /// latency histograms' nanoseconds ([`crate::lend::mono_ns`]), all from one reading.
    /// (Read on every loop iteration, several times per request at depth 1: two
    /// subtractions of instants here cost about 75 instructions a request, callgrind.)
    pub(crate) fn now(&self) -> Now {
        let elapsed = Instant::now().saturating_duration_since(self.start);
        let secs = elapsed.as_secs();
        // u64 nanoseconds since start last 584 years.
        let ns = secs
            .saturating_mul(1_000_000_000)
            .saturating_add(u64::from(elapsed.subsec_nanos()));
        Now {
            store: u32::try_from(secs).unwrap_or(u32::MAX),
            unix: self.unix_start + secs,
            mono_ms: ns / 1_000_000,
            mono_ns: self.start_ns.saturating_add(ns),
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
