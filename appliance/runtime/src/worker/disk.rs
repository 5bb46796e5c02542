//! Data-device completions: settle writes and flushes, report each settled record to its
//! session, and resume the connections no longer waiting.

use super::*;

impl<H: Handler> Worker<H> {
    /// A data-device batch write (`flush` false) or flush completed.
    pub(super) fn on_disk(&mut self, flush: bool, id: u64, res: i32) {
        let Some(disk) = &mut self.disk else { return };
        let outcome = disk.complete(flush, id, res);
        // A failed write's RAM copy goes before its session answers, so no read sees it.
        for (key, cas) in &outcome.forget {
            self.setup.handler.forget_if_cas(key, *cas, self.now);
        }
        let mut touched: Vec<(u32, u32)> = Vec::new();
        for &(slot, generation, token, ok) in &outcome.settled {
            if slot == crate::datapath::kernel_udp::HELD_SLOT {
                self.on_udp_durable(generation, token, ok);
                continue;
            }
            let Some(conn) = self.conns.get_mut(slot, generation) else {
                continue; // closed meanwhile: nobody waits for the reply
            };
            self.setup
                .handler
                .on_durable(&mut conn.session, token, ok, &mut conn.out);
            if touched.last() != Some(&(slot, generation)) {
                touched.push((slot, generation));
            }
        }
        touched.sort_unstable();
        touched.dedup();
        for (slot, generation) in touched {
            let Some(conn) = self.conns.get_mut(slot, generation) else {
                continue;
            };
            if !conn.awaits_device || self.setup.handler.awaits_durable(&conn.session) {
                continue;
            }
            conn.awaits_device = false;
            if conn.closing {
                if !conn.in_flight() {
                    self.finish_close(slot);
                }
                continue;
            }
            let flow = conn.after_send;
            self.after_input(slot, flow);
        }
    }
}
