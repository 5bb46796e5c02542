//! A connection's I/O on a readiness worker: read into its session, write its output until
//! EAGAIN, linger (opening, registered once edge-triggered, and closing are the shared steps
//! of `engine/worker.rs`).

use std::os::fd::AsFd;

use ringstore_service::{Device, Flow};

use super::*;
use crate::connection::machine::{At, State, Step};
use crate::connection::output::Iovecs;
use crate::connection::Conn;
use crate::durable::ConnDevice;
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
            .core
            .conns
            .get_mut(slot, generation)
            .is_some_and(|c| c.io.ready_in)
        {
            self.runnable.push((slot, generation));
        }
    }

    /// One step of [`Worker::drive`], as the connection machine's state says; false when
    /// the connection must wait for an edge (or is gone).
    fn step(&mut self, slot: u32, generation: u32) -> bool {
        let at = self.core.at();
        let handler = &*self.core.setup.handler;
        let Some(conn) = self.core.conns.get_mut(slot, generation) else {
            return false;
        };
        let next = match conn.machine.state() {
            State::Lingering(_) => return self.discard_lingering(slot),
            // Resumed once its records are settled (device.rs); a closing one is gone already.
            State::Held { .. } | State::Closing { .. } => return false,
            State::Draining => Step::Drain,
            State::Reading => Step::Read,
            State::Sending { .. } => match flush(handler, conn) {
                Flushed::All => conn.machine.handle_sent(at, true),
                Flushed::Blocked => return false,
                Flushed::Failed => {
                    self.finish_close(slot);
                    return false;
                }
            },
        };
        self.carry_out(slot, generation, next)
    }

    /// Carries out what the machine says next; false when the connection must wait.
    fn carry_out(&mut self, slot: u32, generation: u32, step: Step) -> bool {
        match step {
            Step::Send => true, // the next turn writes
            Step::Read => {
                let ready = self
                    .core
                    .conns
                    .get_mut(slot, generation)
                    .is_some_and(|c| c.io.ready_in);
                ready && self.read(slot, generation)
            }
            Step::Drain => {
                let handler = &*self.core.setup.handler;
                let Some(conn) = self.core.conns.get_mut(slot, generation) else {
                    return false;
                };
                let device = self
                    .device
                    .as_ref()
                    .map(|d| d.log.for_conn(slot, generation));
                let flow = feed(handler, device.as_ref(), conn, &[], self.core.now);
                self.served(slot, flow)
            }
            Step::Linger => {
                // Half-close and discard what the peer still sends, within bounds, so the
                // last reply is not lost to a reset (`connection/linger.rs`).
                let Some(conn) = self.core.conns.get_mut(slot, generation) else {
                    return false;
                };
                let device = self
                    .device
                    .as_ref()
                    .map(|d| d.log.for_conn(slot, generation));
                conn.start_linger(
                    &*self.core.setup.handler,
                    device.as_ref().map(|d| d as &dyn Device),
                );
                true
            }
            Step::Close => {
                self.finish_close(slot);
                false
            }
            Step::Wait => false,
        }
    }

    /// One nonblocking read into the worker's buffer, fed to the session, or, while a
    /// storage value is received into its item, into the item ([`Conn::recv_target`]).
    fn read(&mut self, slot: u32, generation: u32) -> bool {
        let handler = &*self.core.setup.handler;
        let Some(conn) = self.core.conns.get_mut(slot, generation) else {
            return false;
        };
        let got = match conn.recv_target(handler) {
            None => crate::sys::recv_nowait(conn.fd.as_raw_fd(), &mut self.read_buf),
            Some((at, len)) => {
                #[allow(
                    unsafe_code,
                    reason = "the kernel writes a reserved item's pinned range (Handler::recv_target)"
                )]
                // SAFETY: `at..at + len` is `Handler::recv_target`'s range, which stays mapped
                // and untouched by anything else until the session is next called or closed;
                // neither happens before this call returns.
                unsafe {
                    crate::sys::recv_into_nowait(conn.fd.as_raw_fd(), at, len)
                }
            }
        };
        match got {
            Transfer::Done(0) | Transfer::Failed => {
                // The peer closed (possibly mid-request or mid-value: the close gives a
                // reservation back) or reset.
                self.finish_close(slot);
                false
            }
            Transfer::WouldBlock => {
                conn.io.ready_in = false;
                false
            }
            Transfer::Done(n) => {
                let at = At::new(self.core.now.mono_ms, self.core.stopping_deadline);
                let rules = (self.core.setup.limits.out_hard_cap, self.device.is_some());
                if let Some(step) = conn.received(handler, n, at, rules) {
                    return self.went_on(slot, step);
                }
                let device = self
                    .device
                    .as_ref()
                    .map(|d| d.log.for_conn(slot, generation));
                let flow = feed(
                    handler,
                    device.as_ref(),
                    conn,
                    &self.read_buf[..n],
                    self.core.now,
                );
                conn.machine.handle_received(self.core.now.mono_ms);
                self.served(slot, flow)
            }
        }
    }

    /// The session was called (with input, to drain, or after its held reply's commit) and
    /// answered `flow` ([`Conn::served`]). True when the connection goes on at its next turn
    /// (the machine's state says with what).
    pub(super) fn served(&mut self, slot: u32, flow: Flow) -> bool {
        let at = self.core.at();
        let rules = (self.core.setup.limits.out_hard_cap, self.device.is_some());
        let Some(conn) = self.core.conns.at_mut(slot) else {
            return false;
        };
        let step = conn.served(&*self.core.setup.handler, flow, at, rules);
        self.went_on(slot, step)
    }

    /// The machine said `step` after the session was served: true when the connection goes
    /// on at its next turn.
    fn went_on(&mut self, slot: u32, step: Step) -> bool {
        match step {
            // The next turn does it (the machine's state says what).
            Step::Send | Step::Read | Step::Drain => true,
            step => {
                let generation = self.core.conns.generation(slot);
                self.carry_out(slot, generation, step)
            }
        }
    }

    /// A lingering connection: read and throw away until the peer closes or a bound is hit.
    fn discard_lingering(&mut self, slot: u32) -> bool {
        let now = self.core.now.mono_ms;
        let Some(conn) = self.core.conns.at_mut(slot) else {
            return false;
        };
        if !conn.io.ready_in {
            return false;
        }
        let res = match crate::sys::recv_nowait(conn.fd.as_raw_fd(), &mut self.read_buf) {
            Transfer::Done(n) => i32::try_from(n).unwrap_or(i32::MAX),
            Transfer::WouldBlock => {
                conn.io.ready_in = false;
                -libc::EAGAIN
            }
            Transfer::Failed => -libc::ECONNRESET,
        };
        match conn.machine.handle_linger_recv(res, now) {
            Step::Close => {
                self.finish_close(slot);
                false
            }
            _ => conn.io.ready_in,
        }
    }
}

/// One call into a connection's session. The one place this runtime hands a session its
/// input: what must happen right after `on_bytes` (a TLS layer's kernel key install, say)
/// goes here. With a data device the session gets the worker's log on behalf of this
/// connection; if it then holds a reply until its records are settled, the machine holds the
/// connection and [`Worker::on_device`] resumes it.
fn feed<H: Handler>(
    handler: &H,
    device: Option<&ConnDevice<'_>>,
    conn: &mut Conn<H::Session, EpollIo>,
    input: &[u8],
    now: Now,
) -> Flow {
    let device = device.map(|d| d as &dyn Device);
    let mut flow = handler.on_bytes(&mut conn.session, input, now, device, &mut conn.out);
    // Nothing of this output is sent yet and no read is under way: the moment a TLS session
    // may go to the kernel (tls.rs), as on the io_uring worker.
    if !input.is_empty() && !handler.after_bytes(&mut conn.session, conn.fd.as_fd(), &mut conn.out)
    {
        flow = Flow::Close;
    }
    flow
}

/// Writes `conn`'s pending output (with spliced values: one `sendmsg` per round, its iovecs
/// on the stack) until it is all out or the socket is full.
fn flush<H: Handler>(handler: &H, conn: &mut Conn<H::Session, EpollIo>) -> Flushed {
    // Made only when a value is spliced: zeroing its array on every flush cost a GET of
    // 100 B 77 instructions in memset (callgrind), about 2% of it.
    let mut iov: Option<Iovecs> = None;
    let mut sent = 0;
    loop {
        if conn.bytes_sent(handler, sent) {
            return Flushed::All;
        }
        let splices = handler.splices(&conn.session);
        let fd = conn.fd.as_raw_fd();
        let result = if splices.is_empty() {
            crate::sys::send_nowait(fd, &conn.out[conn.sent..])
        } else {
            let iov = iov.get_or_insert_with(Iovecs::new);
            iov.fill(&conn.out, splices, conn.sent);
            crate::sys::sendmsg_iovecs_nowait(fd, iov.as_slice())
        };
        match result {
            Transfer::Done(0) | Transfer::Failed => return Flushed::Failed,
            Transfer::Done(n) => sent = n,
            Transfer::WouldBlock => return Flushed::Blocked,
        }
    }
}
