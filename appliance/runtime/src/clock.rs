//! The coarse clock: read once per loop iteration and turned into the service's [`Now`].

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use ringstore_service::Now;

/// Process-start reference points shared by every worker.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Clock {
    start: Instant,
    unix_start: u64,
}

impl Clock {
    pub(crate) fn start() -> Clock {
        let unix_start = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Clock {
            start: Instant::now(),
            unix_start,
        }
    }

    pub(crate) fn unix_start(&self) -> u64 {
        self.unix_start
    }

    /// Store time (seconds since start), Unix seconds, monotonic milliseconds and the
    /// latency histograms' nanoseconds ([`crate::lend::mono_ns`]), all from one reading.
    pub(crate) fn now(&self) -> Now {
        let t = Instant::now();
        let elapsed = t.saturating_duration_since(self.start);
        let secs = elapsed.as_secs();
        Now {
            store: u32::try_from(secs).unwrap_or(u32::MAX),
            unix: self.unix_start + secs,
            mono_ms: u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX),
            mono_ns: crate::lend::ns_since_origin(t),
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
