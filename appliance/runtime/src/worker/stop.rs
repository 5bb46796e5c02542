//! The timer tick: timeouts, the reaper step, and the orderly stop.

use super::*;

impl<H: Handler> Worker<H> {
    pub(super) fn on_tick(&mut self) {
        let now = self.now.mono_ms;
        if self.setup.reaper && now >= self.last_reclaim_ms + 1000 {
            self.last_reclaim_ms = now;
            self.setup.handler.reclaim(self.now);
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
        let limits = self.setup.limits;
        let past_deadline = self.stopping_deadline.is_some_and(|d| now >= d);
        let handler = Arc::clone(&self.setup.handler);
        for slot in 0..crate::sys::u32_of(self.conns.capacity_slots()) {
            let Some(conn) = self.conns.at_mut(slot) else {
                continue;
            };
            if conn.closing {
                continue;
            }
            if conn.closed_by_tick(&*handler, now, &limits, past_deadline) {
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
            let busy =
                conn.closing || conn.linger.is_some() || conn.send_armed || conn.awaits_device;
            if busy || !conn.out.is_empty() {
                continue;
            }
            if handler.poll_output(&mut conn.session, &mut conn.out) && !conn.out.is_empty() {
                conn.after_send = Flow::Continue;
                self.arm_send(slot);
            }
        }
    }

    pub(super) fn begin_stop(&mut self) {
        self.stopping_deadline = Some(self.now.mono_ms + self.setup.limits.drain_deadline_ms);
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
        for slot in 0..crate::sys::u32_of(self.conns.capacity_slots()) {
            let Some(conn) = self.conns.at_mut(slot) else {
                continue;
            };
            // A lingering connection ends by itself well within the drain deadline.
            if !conn.send_armed
                && conn.partial_since_ms.is_none()
                && !conn.awaits_device
                && conn.linger.is_none()
            {
                self.close(slot);
            }
        }
        self.stop_udp();
        // Connections queued after the stop are dropped unserved.
        self.take_inbox();
    }
}
