//! A connection's life on a readiness worker: open (registered once, edge-triggered), read
//! into its session, write its output until EAGAIN, linger, close.

use std::os::fd::AsFd;

use ringstore_service::{Device, Flow};

use super::*;
use crate::conn::Conn;
use crate::durable::ConnDevice;
use crate::linger::{Linger, Next};
use crate::sys::Transfer;

/// What an attempt to write a connection's pending output did.
enum Flushed {
    /// Everything is out.
    All,
    /// The socket is full: the rest goes at the next writable edge.
    Blocked,
    /// The peer is gone: close.
    Failed,
}

impl<H: Handler> Worker<H> {
    pub(super) fn open_connection(&mut self, fd: OwnedFd, endpoint: Endpoint) {
        if self.stopping_deadline.is_some() {
            drop(fd);
            return self.forget_connection();
        }
        crate::sys::set_nodelay(fd.as_raw_fd());
        if let Err(err) = crate::sys::set_nonblocking(fd.as_raw_fd()) {
            eprintln!("ringstore: a connection could not be made nonblocking: {err}");
            drop(fd);
            return self.forget_connection();
        }
        let raw = fd.as_raw_fd();
        let handler = &self.setup.handler;
        let mut session = if endpoint.tls {
            handler.open_tls(endpoint.protocol, self.setup.index, self.now.mono_ms)
        } else {
            handler.open(endpoint.protocol, self.setup.index)
        };
        if let Some(peer) = crate::sys::peer_addr(fd.as_raw_fd()) {
            handler.peer_known(&mut session, peer);
        }
        let (slot, generation) = self
            .conns
            .insert(Conn::new(fd, session, self.now.mono_ms, None));
        self.setup.handler.conn_opened(self.setup.index);
        if let Err(err) = self
            .epoll
            .add(raw, conn_key(slot, generation), Watch::EdgeReadWrite)
        {
            eprintln!("ringstore: epoll_ctl failed for a connection: {err}");
            return self.finish_close(slot);
        }
        self.peak_conns = self.peak_conns.max(self.conns.live());
        // A session with a request under way from the start (a TLS handshake, a login the
        // auth file asks for) is timed from the open: the request timeout closes a client
        // that never sends.
        let now = self.now.mono_ms;
        let handler = &self.setup.handler;
        if let Some(conn) = self.conns.get_mut(slot, generation) {
            if handler.has_partial_request(&conn.session) {
                conn.partial_since_ms = Some(now);
            }
        }
        // Input that arrived before the registration is reported by it (the first edge).
    }

    /// Accounting for a connection that is gone (closed or dropped before it was served).
    fn forget_connection(&mut self) {
        self.setup.inbox.connection_closed();
        self.setup.open.fetch_sub(1, Ordering::AcqRel);
    }

    /// Closes at once (nothing is ever in flight in this runtime; closing the socket also
    /// takes it out of the epoll set).
    pub(super) fn finish_close(&mut self, slot: u32) {
        let generation = self.conns.generation(slot);
        if let Some(mut conn) = self.conns.remove(slot) {
            if conn.linger.is_none() {
                let device = self.disk.as_ref().map(|d| d.log.for_conn(slot, generation));
                self.setup
                    .handler
                    .session_closed(&mut conn.session, device.as_ref().map(|d| d as &dyn Device));
            }
            self.setup.handler.conn_closed(self.setup.index);
            self.forget_connection();
        }
    }

    /// The session is done and its last reply sent: half-close and discard what the peer
    /// still sends, within bounds (`linger.rs`), so the reply is not lost to a reset.
    fn linger(&mut self, slot: u32) {
        let now = self.now.mono_ms;
        let generation = self.conns.generation(slot);
        let Some(conn) = self.conns.at_mut(slot) else {
            return;
        };
        crate::sys::shutdown(conn.fd.as_raw_fd(), libc::SHUT_WR);
        conn.linger = Some(Linger::start(now));
        conn.partial_since_ms = None;
        let device = self.disk.as_ref().map(|d| d.log.for_conn(slot, generation));
        self.setup
            .handler
            .session_closed(&mut conn.session, device.as_ref().map(|d| d as &dyn Device));
    }

    /// Serves connection `(slot, generation)` as far as its socket allows: sends what is
    /// pending, then reads and feeds its session, at most [`TURNS`] reads; with input left,
    /// it goes on the run list.
    pub(super) fn drive(&mut self, slot: u32, generation: u32) {
        for _ in 0..TURNS {
            if !self.step(slot, generation) {
                return;
            }
        }
        if self
            .conns
            .get_mut(slot, generation)
            .is_some_and(|c| c.ready_in)
        {
            self.runnable.push((slot, generation));
        }
    }

    /// One step of [`Worker::drive`]; false when the connection must wait for an edge (or is gone).
    fn step(&mut self, slot: u32, generation: u32) -> bool {
        let stopping = self.stopping_deadline.is_some();
        let handler = &*self.setup.handler;
        let Some(conn) = self.conns.get_mut(slot, generation) else {
            return false;
        };
        if conn.linger.is_some() {
            return self.discard_lingering(slot);
        }
        if conn.awaits_device {
            return false; // resumed once its records are settled (disk.rs)
        }
        if !conn.out.is_empty() || !handler.splices(&conn.session).is_empty() {
            match flush(handler, conn) {
                Flushed::All => {
                    conn.last_active_ms = self.now.mono_ms;
                    conn.output_flushed();
                    handler.output_flushed(&mut conn.session);
                }
                Flushed::Blocked => return false,
                Flushed::Failed => {
                    self.finish_close(slot);
                    return false;
                }
            }
        }
        match conn.after_send {
            Flow::Close => {
                self.linger(slot);
                true
            }
            Flow::Drain => {
                let device = self.disk.as_ref().map(|d| d.log.for_conn(slot, generation));
                let flow = feed(handler, device.as_ref(), conn, &[], self.now);
                self.after_input(slot, flow)
            }
            Flow::Continue if stopping && conn.partial_since_ms.is_none() => {
                self.finish_close(slot);
                false
            }
            Flow::Continue if !conn.ready_in => false,
            Flow::Continue => self.read(slot, generation),
        }
    }

    /// One nonblocking read into the worker's buffer, fed to the session.
    fn read(&mut self, slot: u32, generation: u32) -> bool {
        let handler = &*self.setup.handler;
        let Some(conn) = self.conns.get_mut(slot, generation) else {
            return false;
        };
        match crate::sys::recv_nowait(conn.fd.as_raw_fd(), &mut self.read_buf) {
            Transfer::Done(0) | Transfer::Failed => {
                // The peer closed (possibly mid-request) or reset.
                self.finish_close(slot);
                false
            }
            Transfer::WouldBlock => {
                conn.ready_in = false;
                false
            }
            Transfer::Done(n) => {
                let device = self.disk.as_ref().map(|d| d.log.for_conn(slot, generation));
                let flow = feed(
                    handler,
                    device.as_ref(),
                    conn,
                    &self.read_buf[..n],
                    self.now,
                );
                conn.last_active_ms = self.now.mono_ms;
                self.after_input(slot, flow)
            }
        }
    }

    /// After the session consumed input (or resumed a drain): notes a half-received request,
    /// enforces the output cap, and remembers what to do once the output is out.
    fn after_input(&mut self, slot: u32, flow: Flow) -> bool {
        let now = self.now.mono_ms;
        let cap = self.setup.limits.out_hard_cap;
        let handler = &*self.setup.handler;
        let Some(conn) = self.conns.at_mut(slot) else {
            return false;
        };
        if handler.has_partial_request(&conn.session) {
            conn.partial_since_ms.get_or_insert(now);
        } else {
            conn.partial_since_ms = None;
        }
        if conn.out.len() > cap {
            eprintln!("ringstore: closing a connection whose pending output passed {cap} bytes");
            self.finish_close(slot);
            return false;
        }
        conn.after_send = flow;
        if flow == Flow::Drain
            && conn.out.is_empty()
            && handler.splices(&conn.session).is_empty()
            && !conn.awaits_device
        {
            // Nothing to drain: a session bug must not spin the worker.
            conn.after_send = Flow::Continue;
        }
        true
    }

    /// A lingering connection: read and throw away until the peer closes or a bound is hit.
    fn discard_lingering(&mut self, slot: u32) -> bool {
        let now = self.now.mono_ms;
        let Some(conn) = self.conns.at_mut(slot) else {
            return false;
        };
        if !conn.ready_in {
            return false;
        }
        let res = match crate::sys::recv_nowait(conn.fd.as_raw_fd(), &mut self.read_buf) {
            Transfer::Done(n) => i32::try_from(n).unwrap_or(i32::MAX),
            Transfer::WouldBlock => {
                conn.ready_in = false;
                -libc::EAGAIN
            }
            Transfer::Failed => -libc::ECONNRESET,
        };
        let Some(linger) = &mut conn.linger else {
            return false;
        };
        match linger.on_recv(res, now) {
            Next::Read => conn.ready_in,
            Next::Close => {
                self.finish_close(slot);
                false
            }
        }
    }
}

/// One call into a connection's session. The one place this runtime hands a session its
/// input: what must happen right after `on_bytes` (a TLS layer's kernel key install, say)
/// goes here. With a data device the session gets the worker's log on behalf of this
/// connection; if it then holds a reply until its records are settled, the connection waits
/// (`awaits_device`) and [`Worker::on_disk`] resumes it.
fn feed<H: Handler>(
    handler: &H,
    device: Option<&ConnDevice<'_>>,
    conn: &mut Conn<H::Session>,
    input: &[u8],
    now: Now,
) -> Flow {
    let device = device.map(|d| d as &dyn Device);
    let mut flow = handler.on_bytes(&mut conn.session, input, now, device, &mut conn.out);
    conn.awaits_device = device.is_some() && handler.awaits_durable(&conn.session);
    // Nothing of this output is sent yet and no read is under way: the moment a TLS session
    // may go to the kernel (tls.rs), as on the io_uring worker.
    if !input.is_empty() && !handler.after_bytes(&mut conn.session, conn.fd.as_fd(), &mut conn.out)
    {
        flow = Flow::Close;
    }
    flow
}

/// Writes `conn`'s pending output (with spliced values: one `sendmsg` per round) until it
/// is all out or the socket is full.
fn flush<H: Handler>(handler: &H, conn: &mut Conn<H::Session>) -> Flushed {
    loop {
        let splices = handler.splices(&conn.session);
        let total = crate::worker::send_vec::output_len(&conn.out, splices);
        if conn.sent >= total {
            return Flushed::All;
        }
        let fd = conn.fd.as_raw_fd();
        let result = if splices.is_empty() {
            crate::sys::send_nowait(fd, &conn.out[conn.sent..])
        } else {
            send_iov::send(fd, &conn.out, splices, conn.sent)
        };
        match result {
            Transfer::Done(0) | Transfer::Failed => return Flushed::Failed,
            Transfer::Done(n) => conn.sent += n,
            Transfer::WouldBlock => return Flushed::Blocked,
        }
    }
}
