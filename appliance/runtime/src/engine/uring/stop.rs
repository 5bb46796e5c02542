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
        self.poll_output();
        self.arm_udp();
        self.arm_tick();
    }

    pub(super) fn check_timeouts(&mut self) {
        let now = self.now.mono_ms;
        let timeouts = self.setup.limits.timeouts();
        let handler = Arc::clone(&self.setup.handler);
        for slot in 0..crate::sys::u32_of(self.conns.capacity_slots()) {
            let Some(conn) = self.conns.at_mut(slot) else {
                continue;
            };
            if conn.closed_by_tick(&*handler, now, timeouts) {
                self.close(slot);
            }
        }
    }

    /// Output sessions produce without input (`watch`): asked of every connection with
    /// nothing pending, so what one holds is at most one poll's worth.
    pub(super) fn poll_output(&mut self) {
        let handler = Arc::clone(&self.setup.handler);
        for slot in 0..crate::sys::u32_of(self.conns.capacity_slots()) {
            let Some(conn) = self.conns.at_mut(slot) else {
                continue;
            };
            if !conn.machine.may_poll_output() || conn.pending(&*handler) {
                continue;
            }
            if handler.poll_output(&mut conn.session, &mut conn.out) && !conn.out.is_empty() {
                let step = conn.machine.handle_polled_output();
                self.carry_out(slot, step);
            }
        }
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
        for slot in self.conns.stop(deadline) {
            self.close(slot);
        }
        self.stop_udp();
        // Connections queued after the stop are dropped unserved.
        self.take_inbox();
    }
}
