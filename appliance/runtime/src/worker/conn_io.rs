//! A connection's life on its worker: open, receive into its session, send its output, close
//! (or linger), and the slow-client bookkeeping.

use super::send_vec;
use super::*;

impl<H: Handler> Worker<H> {
    pub(super) fn open_connection(&mut self, fd: OwnedFd, endpoint: Endpoint) {
        if self.stopping_deadline.is_some() {
            drop(fd);
            self.forget_connection();
            return;
        }
        crate::sys::set_nodelay(fd.as_raw_fd());
        let own_buf = if self.bufs.is_none() {
            Some(vec![0u8; OWN_BUF_SIZE].into_boxed_slice())
        } else {
            None
        };
        let handler = &self.setup.handler;
        let mut session = if endpoint.tls {
            handler.open_tls(endpoint.protocol, self.setup.index, self.now.mono_ms)
        } else {
            handler.open(endpoint.protocol, self.setup.index)
        };
        if let Some(peer) = crate::sys::peer_addr(fd.as_raw_fd()) {
            handler.peer_known(&mut session, peer);
        }
        let (slot, _) = self
            .conns
            .insert(Conn::new(fd, session, self.now.mono_ms, own_buf));
        self.setup.handler.conn_opened(self.setup.index);
        self.peak_conns = self.peak_conns.max(self.conns.live());
        // A session with a request under way from the start (a TLS handshake, a login the
        // auth file asks for) is timed from the open: the request timeout closes a client
        // that never sends.
        self.note_partial(slot);
        self.arm_recv(slot);
    }

    /// Accounting for a connection that is gone (closed or dropped before it was served).
    pub(super) fn forget_connection(&mut self) {
        self.setup.inbox.connection_closed();
        self.setup.open.fetch_sub(1, Ordering::AcqRel);
    }

    /// Closes now if nothing is in flight; otherwise shuts the socket down so in-flight
    /// operations complete promptly and closes when the last one has.
    pub(super) fn close(&mut self, slot: u32) {
        let Some(conn) = self.conns.at_mut(slot) else {
            return;
        };
        conn.closing = true;
        if conn.in_flight() {
            crate::sys::shutdown(conn.fd.as_raw_fd(), libc::SHUT_RDWR);
        } else {
            self.finish_close(slot);
        }
    }

    /// The session is done and its last reply sent: half-close and discard what the peer
    /// still sends, within bounds, so the reply is not lost to a reset (see `linger.rs`).
    pub(super) fn linger(&mut self, slot: u32) {
        let now = self.now.mono_ms;
        let generation = self.conns.generation(slot);
        let Some(conn) = self.conns.at_mut(slot) else {
            return;
        };
        crate::sys::shutdown(conn.fd.as_raw_fd(), libc::SHUT_WR);
        conn.linger = Some(Linger::start(now));
        conn.partial_since_ms = None;
        // The session is over: let it give back what it holds now, not when the socket closes.
        let device = self.disk.as_ref().map(|d| d.for_conn(slot, generation));
        self.setup
            .handler
            .session_closed(&mut conn.session, device.as_ref().map(|d| d as &dyn Device));
        if !conn.recv_armed {
            self.arm_recv(slot);
        }
    }

    pub(super) fn finish_close(&mut self, slot: u32) {
        let generation = self.conns.generation(slot);
        if let Some(mut conn) = self.conns.remove(slot) {
            if conn.linger.is_none() {
                let device = self.disk.as_ref().map(|d| d.for_conn(slot, generation));
                self.setup
                    .handler
                    .session_closed(&mut conn.session, device.as_ref().map(|d| d as &dyn Device));
            }
            self.setup.handler.conn_closed(self.setup.index);
            self.forget_connection();
        }
    }

    /// Reads again, unless the worker is stopping and no request is half received.
    pub(super) fn continue_reading(&mut self, slot: u32) {
        let stopping = self.stopping_deadline.is_some();
        let Some(conn) = self.conns.at_mut(slot) else {
            return;
        };
        if stopping && conn.partial_since_ms.is_none() {
            self.close(slot);
        } else {
            self.arm_recv(slot);
        }
    }

    pub(super) fn on_recv(&mut self, slot: u32, generation: u32, res: i32, flags: u32) {
        let bid = cqueue::buffer_select(flags);
        let Some(conn) = self.conns.get_mut(slot, generation) else {
            if let (Some(bid), Some(bufs)) = (bid, self.bufs.as_mut()) {
                bufs.recycle(bid);
            }
            return;
        };
        conn.recv_armed = false;
        if conn.closing {
            if let (Some(bid), Some(bufs)) = (bid, self.bufs.as_mut()) {
                bufs.recycle(bid);
            }
            if !conn.in_flight() {
                self.finish_close(slot);
            }
            return;
        }
        if let Some(linger) = &mut conn.linger {
            if let (Some(bid), Some(bufs)) = (bid, self.bufs.as_mut()) {
                bufs.recycle(bid);
            }
            return match linger.on_recv(res, self.now.mono_ms) {
                Next::Read => self.arm_recv(slot),
                Next::Close => self.close(slot),
            };
        }
        if res > 0 {
            let len = res as usize;
            // The connection's own buffer (no buffer ring) is lent out for the call.
            let own_buf = conn.own_buf.take();
            #[expect(
                clippy::expect_used,
                reason = "without a buffer pool every connection has its own buffer, lent only here"
            )]
            let input: &[u8] = match (bid, &self.bufs) {
                (Some(bid), Some(bufs)) => bufs.filled(bid, len),
                _ => &own_buf.as_deref().expect("own buffer")[..len],
            };
            let mut flow = call_session(
                &*self.setup.handler,
                self.disk.as_mut(),
                conn,
                (slot, generation),
                input,
                self.now,
            );
            // No receive is in flight and nothing of this output was sent: the moment a
            // TLS session may go to the kernel (tls.rs).
            if !self
                .setup
                .handler
                .after_bytes(&mut conn.session, conn.fd.as_fd(), &mut conn.out)
            {
                flow = Flow::Close;
            }
            conn.own_buf = own_buf;
            if let (Some(bid), Some(bufs)) = (bid, self.bufs.as_mut()) {
                bufs.recycle(bid);
            }
            conn.last_active_ms = self.now.mono_ms;
            self.note_partial(slot);
            self.after_input(slot, flow);
            return;
        }
        if let (Some(bid), Some(bufs)) = (bid, self.bufs.as_mut()) {
            bufs.recycle(bid);
        }
        match -res {
            libc::ENOBUFS | libc::EINTR | libc::EAGAIN => self.arm_recv(slot),
            // The send it was linked behind came up short; reading resumes once it is done.
            libc::ECANCELED if conn.send_armed => {}
            libc::ECANCELED => self.continue_reading(slot),
            // 0 = the peer closed (possibly mid-value), or ECONNRESET and friends.
            _ => self.close(slot),
        }
    }

    pub(super) fn note_partial(&mut self, slot: u32) {
        let now = self.now.mono_ms;
        let handler = &self.setup.handler;
        if let Some(conn) = self.conns.at_mut(slot) {
            if handler.has_partial_request(&conn.session) {
                conn.partial_since_ms.get_or_insert(now);
            } else {
                conn.partial_since_ms = None;
            }
        }
    }

    /// After the session consumed input: send what it produced, or go on per `flow`.
    pub(super) fn after_input(&mut self, slot: u32, mut flow: Flow) {
        loop {
            let cap = self.setup.limits.out_hard_cap;
            let Some(conn) = self.conns.at_mut(slot) else {
                return;
            };
            if conn.out.len() > cap {
                eprintln!(
                    "ringstore: closing a connection whose pending output passed {cap} bytes"
                );
                self.close(slot);
                return;
            }
            conn.after_send = flow;
            if conn.awaits_device {
                return; // released once its records are settled (on_disk)
            }
            if !conn.out.is_empty() {
                self.arm_send(slot);
                return;
            }
            match flow {
                Flow::Continue => return self.continue_reading(slot),
                Flow::Close => return self.linger(slot),
                Flow::Drain => {
                    let generation = self.conns.generation(slot);
                    let Some(conn) = self.conns.get_mut(slot, generation) else {
                        return;
                    };
                    flow = call_session(
                        &*self.setup.handler,
                        self.disk.as_mut(),
                        conn,
                        (slot, generation),
                        &[],
                        self.now,
                    );
                    if flow == Flow::Drain && conn.out.is_empty() && !conn.awaits_device {
                        flow = Flow::Continue; // nothing to drain: a session bug must not spin the worker
                    }
                    self.note_partial(slot);
                }
            }
        }
    }

    pub(super) fn on_send(&mut self, slot: u32, generation: u32, res: i32) {
        let now = self.now.mono_ms;
        let Some(conn) = self.conns.get_mut(slot, generation) else {
            return;
        };
        conn.send_armed = false;
        if conn.closing {
            if !conn.in_flight() {
                self.finish_close(slot);
            }
            return;
        }
        if res > 0 {
            conn.sent += res as usize;
            conn.last_active_ms = now;
            let splices = self.setup.handler.splices(&conn.session);
            if conn.sent < send_vec::output_len(&conn.out, splices) {
                return self.arm_send(slot); // short send: the rest goes next
            }
            conn.output_flushed();
            self.setup.handler.output_flushed(&mut conn.session);
            match conn.after_send {
                // The linked receive is already armed unless a short send cancelled it.
                Flow::Continue if conn.recv_armed => {
                    if self.stopping_deadline.is_some() && conn.partial_since_ms.is_none() {
                        self.close(slot);
                    }
                }
                Flow::Continue => self.continue_reading(slot),
                Flow::Close => self.linger(slot),
                Flow::Drain => {
                    let flow = call_session(
                        &*self.setup.handler,
                        self.disk.as_mut(),
                        conn,
                        (slot, generation),
                        &[],
                        self.now,
                    );
                    self.note_partial(slot);
                    self.after_input(slot, flow);
                }
            }
            return;
        }
        match -res {
            libc::EINTR | libc::EAGAIN => self.arm_send(slot),
            // EPIPE, ECONNRESET, 0: the peer is gone.
            _ => self.close(slot),
        }
    }
}

/// One call into a connection's session (new input, or none to resume after a drain).
///
/// With a data device the session gets the worker's log on behalf of this connection; if it
/// then holds a reply until its records are settled, the connection waits (`awaits_device`)
/// and [`Worker::on_disk`] resumes it.
fn call_session<H: Handler>(
    handler: &H,
    disk: Option<&mut DiskWorker>,
    conn: &mut Conn<H::Session>,
    (slot, generation): (u32, u32),
    input: &[u8],
    now: Now,
) -> Flow {
    let device = disk.as_deref().map(|d| d.for_conn(slot, generation));
    let device = device.as_ref().map(|d| d as &dyn Device);
    let flow = handler.on_bytes(&mut conn.session, input, now, device, &mut conn.out);
    conn.awaits_device = device.is_some() && handler.awaits_durable(&conn.session);
    flow
}
