//! Open-loop pacing (as wrk2): each connection's batches are due on a fixed grid, and a
//! batch's latency runs from its due time, so a stall counts against every request it delayed.

use std::time::{Duration, Instant};

/// One connection's send schedule in paced mode: batch k is due `phase + k·interval` after the
/// segment's start whatever happened to batch k-1, so a slow reply delays the sends after it
/// but never moves their due times (and their latencies count from those).
#[derive(Clone, Copy, Debug)]
pub(super) struct Schedule {
    phase: Duration,
    interval: Duration,
    next: u32,
}

/// What a paced connection does with its next batch, due at `due`, when it is free at `now`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Plan {
    /// Already due: send at once, its latency counted from `since` (the due time, not now).
    SendNow { since: Instant },
    /// Not yet due: wait until then.
    WaitUntil(Instant),
}

pub(super) fn plan(due: Instant, now: Instant) -> Plan {
    if due <= now {
        Plan::SendNow { since: due }
    } else {
        Plan::WaitUntil(due)
    }
}

impl Schedule {
    /// Connection `index` of `conns` that together send `batches_per_second`: one batch every
    /// `conns / batches_per_second` s each, connection i shifted by i/conns of that interval
    /// so the sends of all connections spread evenly instead of going out in bursts.
    pub(super) fn new(index: usize, conns: usize, batches_per_second: f64) -> Self {
        let interval = Duration::from_secs_f64(conns as f64 / batches_per_second);
        Schedule {
            phase: interval.mul_f64(index as f64 / conns as f64),
            interval,
            next: 0,
        }
    }

    pub(super) fn restart(&mut self) {
        self.next = 0;
    }

    /// The next batch's due time as an offset from the segment's start; moves on one batch.
    pub(super) fn take_due(&mut self) -> Duration {
        let due = self.phase + self.interval.saturating_mul(self.next);
        self.next = self.next.saturating_add(1);
        due
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paced_batches_are_due_on_a_fixed_grid() {
        // 4 connections sending 1000 batches/s in all: each one every 4 ms.
        let mut first = Schedule::new(0, 4, 1000.0);
        let dues: Vec<Duration> = (0..3).map(|_| first.take_due()).collect();
        assert_eq!(
            dues,
            [0, 4, 8].map(Duration::from_millis),
            "connection 0 starts at once, then every conns/rate"
        );
        let mut third = Schedule::new(2, 4, 1000.0);
        assert_eq!(third.take_due(), Duration::from_millis(2));
        assert_eq!(third.take_due(), Duration::from_millis(6));
    }

    #[test]
    fn phases_spread_the_connections_over_one_interval() {
        let conns = 64;
        let mut phases: Vec<Duration> = (0..conns)
            .map(|i| Schedule::new(i, conns, 64_000.0).take_due())
            .collect();
        phases.sort();
        phases.dedup();
        assert_eq!(phases.len(), conns, "every connection has its own phase");
        let last = phases.last().copied().unwrap_or_default();
        assert!(
            last < Duration::from_millis(1),
            "all within one 1 ms interval"
        );
        assert!(
            last > Duration::from_micros(980),
            "and spread over all of it"
        );
    }

    /// One paced connection (1 ms interval) against a server that stalls 100 ms on the first
    /// request and then answers in 0.1 ms: the latencies the generator records.
    fn latencies_behind_a_stall() -> Vec<Duration> {
        let origin = Instant::now();
        let mut schedule = Schedule::new(0, 1, 1000.0);
        let mut free_at = origin;
        let mut latencies = Vec::new();
        for request in 0..200 {
            let service = if request == 0 {
                Duration::from_millis(100)
            } else {
                Duration::from_micros(100)
            };
            let (sent, since) = match plan(origin + schedule.take_due(), free_at) {
                Plan::SendNow { since } => (free_at, since),
                Plan::WaitUntil(due) => (due, due),
            };
            free_at = sent + service;
            latencies.push(free_at - since);
        }
        latencies
    }

    #[test]
    fn a_stall_counts_against_every_request_it_delayed() {
        let latencies = latencies_behind_a_stall();
        let delayed = latencies
            .iter()
            .filter(|l| **l > Duration::from_millis(1))
            .count();
        // Closed loop would record one slow request. Here request k (due at k ms) is answered
        // at 100 + 0.1·k ms until the backlog clears near k = 111: about 110 delayed.
        assert!((105..=112).contains(&delayed), "{delayed} delayed requests");
        assert_eq!(latencies[0], Duration::from_millis(100));
        assert_eq!(
            latencies[1],
            Duration::from_micros(99_100),
            "due at 1 ms, sent at 100 ms, answered at 100.1 ms"
        );
        // Once caught up, the schedule holds and the latency is the service time again.
        assert_eq!(latencies[199], Duration::from_micros(100));
    }

    #[test]
    fn due_times_do_not_slip_and_restart_per_segment() {
        let mut schedule = Schedule::new(1, 2, 100.0);
        let grid: Vec<Duration> = (0..5).map(|_| schedule.take_due()).collect();
        assert_eq!(grid[0], Duration::from_millis(10));
        assert_eq!(grid[4] - grid[3], Duration::from_millis(20));
        schedule.restart();
        assert_eq!(
            schedule.take_due(),
            grid[0],
            "a new segment starts the grid again"
        );
        let now = Instant::now();
        assert_eq!(plan(now, now), Plan::SendNow { since: now });
        let later = now + Duration::from_millis(1);
        assert_eq!(plan(later, now), Plan::WaitUntil(later));
    }
}
