//! A connection's I/O on an io_uring worker: receive into its session, send its output,
//! linger (opening and closing are the shared steps of `engine/worker.rs`).

use super::*;

impl<H: Handler> Worker<H> {
    /// Carries out what the connection machine says the connection does next.
    pub(super) fn carry_out(&mut self, slot: u32, step: Step) {
        match step {
            Step::Send => self.arm_send(slot),
            Step::Read => {
                // A receive linked behind the send may be armed already.
                let armed = self
                    .core
                    .conns
                    .at_mut(slot)
                    .is_some_and(|c| c.machine.in_flight(Io::Recv));
                if !armed {
                    self.arm_recv(slot);
                }
            }
            Step::Drain => self.drain(slot),
            Step::Linger => self.linger(slot),
            Step::Close => self.close(slot),
            Step::Wait => {}
        }
    }

    /// The session is done and its last reply sent (the machine lingers): half-close and
    /// discard what the peer still sends, within bounds, so the reply is not lost to a reset
    /// (see `connection/linger.rs`).
    pub(super) fn linger(&mut self, slot: u32) {
        let generation = self.core.conns.generation(slot);
        let Some(conn) = self.core.conns.at_mut(slot) else {
            return;
        };
        let device = self.device.as_ref().map(|d| d.for_conn(slot, generation));
        conn.start_linger(
            &*self.core.setup.handler,
            device.as_ref().map(|d| d as &dyn Device),
        );
        if !conn.machine.in_flight(Io::Recv) {
            self.arm_recv(slot);
        }
    }

    /// Gives a receive's buffer back to the pool.
    fn recycle(&mut self, bid: Option<u16>) {
        if let (Some(bid), Some(bufs)) = (bid, self.bufs.as_mut()) {
            bufs.recycle(bid);
        }
    }

    pub(super) fn on_recv(&mut self, slot: u32, generation: u32, res: i32, flags: u32) {
        let at = self.core.at();
        let bid = cqueue::buffer_select(flags);
        let Some(conn) = self.core.conns.get_mut(slot, generation) else {
            return self.recycle(bid);
        };
        match conn.machine.handle_completed(Io::Recv) {
            Completed::Serve => {}
            Completed::Finish => {
                self.recycle(bid);
                return self.finish_close(slot);
            }
            Completed::Wait => return self.recycle(bid),
        }
        if conn.machine.lingering() {
            let step = conn.machine.handle_linger_recv(res, self.core.now.mono_ms);
            self.recycle(bid);
            return self.carry_out(slot, step);
        }
        if res > 0 {
            let rules = (self.core.setup.limits.out_hard_cap, self.device.is_some());
            // Value bytes received into the item: the session counts them, nothing to copy.
            return match conn.received(&*self.core.setup.handler, res as usize, at, rules) {
                Some(step) => self.carry_out(slot, step),
                None => self.serve_input(slot, generation, res as usize, bid),
            };
        }
        let step = match -res {
            libc::ENOBUFS | libc::EINTR | libc::EAGAIN => Step::Read,
            // The send it was linked behind came up short; reading resumes once it is done.
            libc::ECANCELED => conn.machine.handle_recv_cancelled(at),
            // 0 = the peer closed (possibly mid-value), or ECONNRESET and friends.
            _ => Step::Close,
        };
        self.recycle(bid);
        self.carry_out(slot, step);
    }

    /// `len` bytes received (in pool buffer `bid`, or the connection's own buffer): the
    /// session consumes them, then the machine says what next.
    fn serve_input(&mut self, slot: u32, generation: u32, len: usize, bid: Option<u16>) {
        let Some(conn) = self.core.conns.get_mut(slot, generation) else {
            return self.recycle(bid);
        };
        // The connection's own buffer (no buffer ring) is lent out for the call.
        let own_buf = conn.io.own_buf.take();
        #[expect(
            clippy::expect_used,
            reason = "without a buffer pool every connection has its own buffer, lent only here"
        )]
        let input: &[u8] = match (bid, &self.bufs) {
            (Some(bid), Some(bufs)) => bufs.filled(bid, len),
            _ => &own_buf.as_deref().expect("own buffer")[..len],
        };
        let mut flow = call_session(
            &*self.core.setup.handler,
            self.device.as_mut(),
            conn,
            (slot, generation),
            input,
            self.core.now,
        );
        // No receive is in flight and nothing of this output was sent: the moment a
        // TLS session may go to the kernel (tls.rs).
        let ((session, out), fd) = conn.session_and_out();
        if !self.core.setup.handler.after_bytes(session, fd, out) {
            flow = Flow::Close;
        }
        conn.io.own_buf = own_buf;
        conn.machine.handle_received(self.core.now.mono_ms);
        self.recycle(bid);
        self.served(slot, flow);
    }

    /// The session was called and answered `flow` ([`Conn::served`]): the machine's next
    /// step is carried out.
    pub(super) fn served(&mut self, slot: u32, flow: Flow) {
        let at = self.core.at();
        let rules = (self.core.setup.limits.out_hard_cap, self.device.is_some());
        let Some(conn) = self.core.conns.at_mut(slot) else {
            return;
        };
        let step = conn.served(&*self.core.setup.handler, flow, at, rules);
        self.carry_out(slot, step);
    }

    /// The machine drains: the session is called with no input to go on.
    fn drain(&mut self, slot: u32) {
        let generation = self.core.conns.generation(slot);
        let Some(conn) = self.core.conns.get_mut(slot, generation) else {
            return;
        };
        let flow = call_session(
            &*self.core.setup.handler,
            self.device.as_mut(),
            conn,
            (slot, generation),
            &[],
            self.core.now,
        );
        self.served(slot, flow);
    }

    pub(super) fn on_send(&mut self, slot: u32, generation: u32, res: i32) {
        let at = self.core.at();
        let handler = &*self.core.setup.handler;
        let Some(conn) = self.core.conns.get_mut(slot, generation) else {
            return;
        };
        let completed = conn.machine.handle_completed(Io::Send);
        conn.send_completed();
        match completed {
            Completed::Serve => {}
            Completed::Finish => return self.finish_close(slot),
            Completed::Wait => return,
        }
        if res <= 0 {
            return match -res {
                libc::EINTR | libc::EAGAIN => self.arm_send(slot),
                // EPIPE, ECONNRESET, 0: the peer is gone.
                _ => self.close(slot),
            };
        }
        let all_out = conn.bytes_sent(handler, res as usize);
        let step = conn.machine.handle_sent(at, all_out);
        self.carry_out(slot, step);
    }
}

/// One call into a connection's session (new input, or none to resume after a drain).
///
/// With a data device the session gets the worker's log on behalf of this connection; if it
/// then holds a reply until its records are settled, the machine holds the connection and
/// [`Worker::on_device`] resumes it.
fn call_session<H: Handler>(
    handler: &H,
    device: Option<&mut DeviceWorker>,
    conn: &mut Conn<H::Session, UringIo>,
    (slot, generation): (u32, u32),
    input: &[u8],
    now: Now,
) -> Flow {
    let device = device.as_deref().map(|d| d.for_conn(slot, generation));
    let device = device.as_ref().map(|d| d as &dyn Device);
    let ((session, out), _) = conn.session_and_out();
    handler.on_bytes(session, input, now, device, out)
}
