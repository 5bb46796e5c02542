//! The timer tick: timeouts, the reaper step, and the orderly stop.

use super::*;

impl<H: Handler> Worker<H> {
    pub(super) fn on_tick(&mut self) {
        let now = self.now.mono_ms;
        if self.setup.reaper && now >= self.last_reclaim_ms + 1000 {
            self.last_reclaim_ms = now;
            self.setup.handler.hooks().reclaim(self.now);
        }
        if self.stopping_deadline.is_none() && now >= self.accept_backoff_until {
            // Re-arm accepts that backed off (EMFILE).
            for i in 0..self.accept_armed.len() {
                if !self.accept_armed[i] {
                    self.arm_accept(i);
                }
            }
        }
        self.check_timeouts();
        // What sessions produce without input (`watch`) goes out.
        for (slot, _) in self.conns.poll_output(&*self.setup.handler) {
            self.carry_out(slot, Step::Send);
        }
        self.arm_udp();
        self.arm_tick();
    }

    pub(super) fn check_timeouts(&mut self) {
        let (at, timeouts) = (self.at(), self.setup.limits.timeouts());
        let handler = Arc::clone(&self.setup.handler);
        for slot in 0..crate::sys::u32_of(self.conns.capacity_slots()) {
            let Some(conn) = self.conns.at_mut(slot) else {
                continue;
            };
            if conn.closed_by_tick(&*handler, at, timeouts) {
                self.close(slot);
            }
        }
    }

    /// The time inputs to the connection machine happen at: now, and the stop's drain
    /// deadline that this worker keeps once for all its connections.
    pub(super) fn at(&self) -> At {
        At::new(self.now.mono_ms, self.stopping_deadline)
    }

    pub(super) fn begin_stop(&mut self) {
        let deadline = self.now.mono_ms + self.setup.limits.drain_deadline_ms;
        self.stopping_deadline = Some(deadline);
        for i in 0..self.setup.listeners.len() {
            let target = Op::Accept {
                index: crate::sys::u32_of(i),
            }
            .encode();
            self.pending.push(
                opcode::AsyncCancel::new(target)
                    .build()
                    .user_data(Op::Cancel.encode()),
            );
        }
        for slot in self.conns.stop(self.at()) {
            self.close(slot);
        }
        self.stop_udp();
        // Connections queued after the stop are dropped unserved.
        self.take_inbox();
    }
}
