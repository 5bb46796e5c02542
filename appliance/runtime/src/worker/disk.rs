//! Data-device completions: settle writes and flushes, fail or release the connections held on them.

use super::*;

impl<H: Handler> Worker<H> {
    /// A data-device write or flush completed: settle it, fail or release held connections.
    pub(super) fn on_disk(&mut self, op: u64, id: u64, res: i32) {
        let Some(disk) = &mut self.disk else { return };
        let outcome = disk.complete(op, id, res);
        for (key, cas) in &outcome.forget {
            self.setup.handler.forget_if_cas(key, *cas, self.now);
        }
        let mut failed: HashMap<(u32, u32), crate::durable::FailedSpans> = HashMap::new();
        for (slot, generation, protocol, start, end) in outcome.failed_replies {
            failed
                .entry((slot, generation))
                .or_insert_with(|| (protocol, Vec::new()))
                .1
                .push((start, end));
        }
        for ((slot, generation), (protocol, spans)) in failed {
            if let Some(conn) = self.conns.get_mut(slot, generation) {
                crate::durable::rewrite_failed(&mut conn.out, spans, protocol);
            }
        }
        let mut release = Vec::new();
        while let Some(&(slot, generation, gate)) = disk.waiting.front() {
            if gate > outcome.settled_through {
                break;
            }
            disk.waiting.pop_front();
            release.push((slot, generation));
        }
        for (slot, generation) in release {
            let Some(conn) = self.conns.get_mut(slot, generation) else {
                continue;
            };
            conn.gate = 0;
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

/// After a session call: if it staged records, hold the connection's output until they are durable.
pub(super) fn hold<S>(disk: &mut DiskWorker, conn: &mut Conn<S>, slot: u32, generation: u32) {
    let token = DiskWorker::end_call();
    if token != 0 {
        conn.gate = token;
        disk.waiting.push_back((slot, generation, token));
    }
}
