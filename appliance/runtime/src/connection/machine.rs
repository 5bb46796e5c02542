//! One connection's lifecycle as an I/O-free state machine, the same for both engines (ADR 0040).
//!
//! In the manner of quinn-proto's `Connection`: the machine never touches a socket, a clock
//! or the session. An engine reports what happened — the session served input
//! ([`Machine::handle_served`]), output went out ([`Machine::handle_sent`]), the data device
//! settled a held reply (`settle_sessions`, then `handle_served` again), a tick with the time
//! ([`Machine::handle_timeout`]), a stop ([`Machine::handle_stop`]), a lingering read
//! ([`Machine::handle_linger_recv`]), an operation completed ([`Machine::handle_completed`])
//! — and gets back the one [`Step`] to carry out: send, read, drain the session, linger,
//! close, or wait. Time is passed in ([`At`]: the monotonic time and, once the worker stops,
//! its drain deadline, which the worker keeps once for all its connections), so timers are
//! inputs.
//!
//! What the machine keeps is one [`State`] instead of loose flags, the operations an
//! engine has in flight (an io_uring worker's armed receive and send; the readiness engine
//! never has any), and the clocks the tick judges (last activity, a half-received request).
//! Its invariants are asserted where they are kept (`assert!`, in release builds too: each
//! is a compare of fields already loaded):
//!
//! - nothing is sent once the connection is closing or lingering (no `Step::Send` from them,
//!   and arming a send there panics);
//! - a held reply waits for its commit: while `Held` the machine neither sends nor reads
//!   (no receive armed, no input served), and it leaves `Held` only with the session no
//!   longer holding;
//! - input is served only while the connection reads (or output it produced without input
//!   is going out), never while draining, held, lingering or closing;
//! - a lingering connection and a half-received request are bounded in time (the tick
//!   closes them), and after a stop every connection is closed by its drain deadline.

use ringstore_service::Flow;

use super::linger::{Linger, Next};

/// Where a connection is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    /// Nothing pending: waiting for input.
    Reading,
    /// Output pending; `after` is what follows once it is all out.
    Sending { after: Flow },
    /// The session was asked to go on without input (it has more to produce after a drain).
    Draining,
    /// The session holds its reply until the data device settles its records: nothing is
    /// sent or read until then; `after` is what the session asked for with it.
    Held { after: Flow },
    /// Last reply sent and the write side shut: reading only to discard (`linger.rs`).
    Lingering(Linger),
    /// Being closed: the engine closes the socket once no operation is in flight.
    /// `lingered`: the session was already told it is over (at the linger).
    Closing { lingered: bool },
}

/// What the engine does next for a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Send the pending output (from where the last send stopped).
    Send,
    /// Read: arm a receive, or read once the socket is readable.
    Read,
    /// Call the session again with no input.
    Drain,
    /// Shut the write side, tell the session it is over, read to discard: the machine is
    /// lingering already.
    Linger,
    /// Close the connection ([`Machine::close`]).
    Close,
    /// Nothing until the next input (a held reply's commit, an operation's completion).
    Wait,
}

/// The kinds of operation an engine can have in flight for a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Io {
    Recv,
    Send,
}

/// What a completed operation means for the connection ([`Machine::handle_completed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Completed {
    /// The connection is served: look at the result.
    Serve,
    /// Closing, and that was the last operation: close the socket now.
    Finish,
    /// Closing, with another operation still in flight.
    Wait,
}

/// What the session did with a call ([`Machine::handle_served`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Served {
    /// What the session asked for.
    pub flow: Flow,
    /// It has a request partly received.
    pub partial: bool,
    /// It holds its reply until the data device settles its records.
    pub held: bool,
    /// Output is pending (the buffer or values sent from the item).
    pub pending: bool,
    /// The pending output passed its hard cap: the connection is closed.
    pub over_cap: bool,
}

/// When an input happens, as the worker knows it: the monotonic time and, once the worker
/// stops, the stop's drain deadline. The worker keeps the deadline once for all its
/// connections and passes it in with the time (as quinn-proto passes `now` into every
/// input), so no connection keeps a copy of the worker's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct At {
    pub now_ms: u64,
    /// Set once the worker stops: in-flight requests may finish until then.
    pub stop_deadline_ms: Option<u64>,
}

impl At {
    /// At `now_ms` on a worker that stops by `stopping` (`None`: not stopping).
    pub(crate) fn new(now_ms: u64, stopping: Option<u64>) -> At {
        At {
            now_ms,
            stop_deadline_ms: stopping,
        }
    }

    fn stopping(&self) -> bool {
        self.stop_deadline_ms.is_some()
    }
}

/// The timeouts the tick applies ([`Machine::handle_timeout`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Timeouts {
    pub request_ms: u64,
    /// 0 = never.
    pub idle_ms: u64,
}

/// One connection's lifecycle state (module doc).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Machine {
    state: State,
    recv_in_flight: bool,
    send_in_flight: bool,
    /// Last completed receive or send (idle timeout).
    last_active_ms: u64,
    /// When the currently buffered partial request started (slow-client timeout).
    partial_since_ms: Option<u64>,
    /// The receive being made (or in flight) writes a storage value straight into its
    /// reserved item, at most this many bytes ([`Machine::receives_into_item`]).
    into_item: Option<usize>,
}

impl Machine {
    /// A connection opened at `now_ms`; `partial`: its session has a request under way from
    /// the start (a TLS handshake, a login), timed from the open.
    pub(crate) fn new(now_ms: u64, partial: bool) -> Machine {
        Machine {
            state: State::Reading,
            recv_in_flight: false,
            send_in_flight: false,
            last_active_ms: now_ms,
            partial_since_ms: partial.then_some(now_ms),
            into_item: None,
        }
    }

    pub(crate) fn state(&self) -> State {
        self.state
    }

    /// Whether an operation of kind `io` is in flight.
    pub(crate) fn in_flight(&self, io: Io) -> bool {
        match io {
            Io::Recv => self.recv_in_flight,
            Io::Send => self.send_in_flight,
        }
    }

    /// The engine armed an operation of kind `io`.
    pub(crate) fn armed(&mut self, io: Io) {
        match io {
            Io::Recv => {
                assert!(!self.recv_in_flight, "a second receive armed");
                assert!(!self.closing(), "a receive armed on a closing connection");
                assert!(
                    !self.held(),
                    "a receive armed while a reply is held: nothing is read before its commit"
                );
                self.recv_in_flight = true;
            }
            Io::Send => {
                assert!(!self.send_in_flight, "a second send armed");
                assert!(
                    !self.closing() && !self.lingering(),
                    "a send armed in {:?}: nothing is sent once the connection is over",
                    self.state
                );
                self.send_in_flight = true;
            }
        }
    }

    /// An operation of kind `io` completed.
    pub(crate) fn handle_completed(&mut self, io: Io) -> Completed {
        match io {
            Io::Recv => {
                assert!(
                    self.recv_in_flight,
                    "a receive completed that was not armed"
                );
                self.recv_in_flight = false;
            }
            Io::Send => {
                assert!(self.send_in_flight, "a send completed that was not armed");
                self.send_in_flight = false;
            }
        }
        match self.state {
            State::Closing { .. } if self.recv_in_flight || self.send_in_flight => Completed::Wait,
            State::Closing { .. } => Completed::Finish,
            _ => Completed::Serve,
        }
    }

    /// The connection is being closed. True: nothing is in flight, close the socket now;
    /// false: shut it down so the operations in flight complete, and close at the last.
    pub(crate) fn close(&mut self) -> bool {
        let lingered = self.session_over();
        self.state = State::Closing { lingered };
        !(self.recv_in_flight || self.send_in_flight)
    }

    pub(crate) fn closing(&self) -> bool {
        matches!(self.state, State::Closing { .. })
    }

    pub(crate) fn lingering(&self) -> bool {
        matches!(self.state, State::Lingering(_))
    }

    /// The session was told it is over (at the linger): it is not told again at the close.
    pub(crate) fn session_over(&self) -> bool {
        matches!(
            self.state,
            State::Lingering(_) | State::Closing { lingered: true }
        )
    }

    /// The session holds its reply for the data device.
    pub(crate) fn held(&self) -> bool {
        matches!(self.state, State::Held { .. })
    }

    /// What a held connection goes on with once its records are settled.
    pub(crate) fn held_flow(&self) -> Option<Flow> {
        match self.state {
            State::Held { after } => Some(after),
            _ => None,
        }
    }

    /// The receive may go in the same submission as the send, linked behind it: the
    /// connection reads next, none is armed, and the worker is not stopping (`at`).
    pub(crate) fn links_recv(&self, at: At) -> bool {
        self.state
            == State::Sending {
                after: Flow::Continue,
            }
            && !self.recv_in_flight
            && !at.stopping()
    }

    /// The session may be asked for output it produces without input (`watch`): nothing
    /// pending, held, lingering or closing.
    pub(crate) fn may_poll_output(&self) -> bool {
        self.state == State::Reading && !self.send_in_flight
    }

    /// Input arrived at `now_ms` (idle timeout).
    pub(crate) fn handle_received(&mut self, now_ms: u64) {
        assert!(
            matches!(self.state, State::Reading | State::Sending { .. }),
            "input served in {:?}: only a reading connection (or one whose `watch` output \
             is going out) reads",
            self.state
        );
        self.last_active_ms = now_ms;
    }

    /// The next receive goes into a storage value's reserved item (`Some(len)`: at most
    /// `len` bytes, the value's missing ones) or into a receive buffer (`None`). Both
    /// engines record it here before they receive; the io_uring one keeps it across the
    /// receive in flight.
    #[inline]
    pub(crate) fn receives_into_item(&mut self, len: Option<usize>) {
        self.into_item = len;
    }

    /// A receive put `n` bytes (`n > 0`) where [`Machine::receives_into_item`] said: true
    /// when they went into the item (the session is told, no input to serve), false when
    /// into a receive buffer. Either way the next receive is recorded afresh.
    #[inline]
    pub(crate) fn took_into_item(&mut self, n: usize) -> bool {
        let Some(len) = self.into_item.take() else {
            return false;
        };
        assert!(
            n <= len,
            "{n} bytes received into an item that missed {len}"
        );
        assert!(
            matches!(self.state, State::Reading | State::Sending { .. }),
            "a value received into its item in {:?}: only a reading connection reads",
            self.state
        );
        true
    }

    /// The session was called (with input, with none to drain, or again after its held
    /// reply's commit) and did `served`.
    pub(crate) fn handle_served(&mut self, at: At, mut served: Served) -> Step {
        assert!(
            !self.closing() && !self.lingering(),
            "the session is never called once the connection is over ({:?})",
            self.state
        );
        assert!(
            !(self.held() && served.held),
            "a held connection resumed while its session still holds the reply"
        );
        if served.partial {
            self.partial_since_ms.get_or_insert(at.now_ms);
        } else {
            self.partial_since_ms = None;
        }
        if served.over_cap {
            return Step::Close;
        }
        let nothing_to_drain = !served.pending && !served.held;
        if self.state == State::Draining && served.flow == Flow::Drain && nothing_to_drain {
            // Nothing to drain after all: a session bug must not spin the worker.
            served.flow = Flow::Continue;
        }
        if served.held {
            // Nothing is read while the reply is held: the input that led here completed.
            assert!(
                !self.recv_in_flight,
                "a reply held with a receive in flight"
            );
            self.state = State::Held { after: served.flow };
            return Step::Wait;
        }
        if served.pending {
            self.state = State::Sending { after: served.flow };
            // Output the session produced without input (`watch`) is still going out while a
            // request came in: that send's completion sends the rest.
            return if self.send_in_flight {
                Step::Wait
            } else {
                Step::Send
            };
        }
        self.go_on(at, served.flow)
    }

    /// The session produced output without input (`poll_output`).
    pub(crate) fn handle_polled_output(&mut self) -> Step {
        assert!(self.may_poll_output(), "polled in {:?}", self.state);
        self.state = State::Sending {
            after: Flow::Continue,
        };
        Step::Send
    }

    /// A send put bytes out (`at`); `all_out`: the pending output is all sent.
    pub(crate) fn handle_sent(&mut self, at: At, all_out: bool) -> Step {
        self.last_active_ms = at.now_ms;
        let State::Sending { after } = self.state else {
            // A send armed before the session held a reply (output it produced without
            // input went out while a request came in): the commit resumes the connection.
            assert!(self.held(), "a send reported in {:?}", self.state);
            return Step::Wait;
        };
        if !all_out {
            return Step::Send; // a short send: the rest goes next
        }
        self.go_on(at, after)
    }

    /// A receive was cancelled (the send it was linked behind came up short): reading
    /// resumes, unless the connection has moved on (a send in flight resumes it).
    pub(crate) fn handle_recv_cancelled(&mut self, at: At) -> Step {
        match self.state {
            State::Reading if !self.send_in_flight => self.go_on(at, Flow::Continue),
            _ => Step::Wait,
        }
    }

    /// Nothing is pending and the session asked for `flow`.
    fn go_on(&mut self, at: At, flow: Flow) -> Step {
        assert!(
            !self.closing() && !self.lingering(),
            "a connection that is over went on ({:?})",
            self.state
        );
        match flow {
            Flow::Continue if at.stopping() && self.partial_since_ms.is_none() => Step::Close,
            Flow::Continue => {
                self.state = State::Reading;
                Step::Read
            }
            Flow::Close => {
                self.state = State::Lingering(Linger::start(at.now_ms));
                self.partial_since_ms = None;
                Step::Linger
            }
            Flow::Drain => {
                self.state = State::Draining;
                Step::Drain
            }
        }
    }

    /// A lingering connection's receive completed with `res` (bytes, 0, or `-errno`).
    pub(crate) fn handle_linger_recv(&mut self, res: i32, now_ms: u64) -> Step {
        let State::Lingering(linger) = &mut self.state else {
            panic!("a lingering read in {:?}", self.state);
        };
        match linger.on_recv(res, now_ms) {
            Next::Read => Step::Read,
            Next::Close => Step::Close,
        }
    }

    /// The tick `at`: true when the connection is closed for time — its linger ran out, its
    /// started request is older than the request timeout (a slow client), it sat idle past
    /// the idle timeout, or the stop's drain deadline passed.
    pub(crate) fn handle_timeout(&self, at: At, timeouts: Timeouts) -> bool {
        let now_ms = at.now_ms;
        let past_deadline = at.stop_deadline_ms.is_some_and(|d| now_ms >= d);
        match &self.state {
            State::Closing { .. } => false,
            State::Lingering(linger) => linger.expired(now_ms) || past_deadline,
            _ => {
                let slow = self
                    .partial_since_ms
                    .is_some_and(|since| now_ms.saturating_sub(since) >= timeouts.request_ms);
                let idle = timeouts.idle_ms > 0
                    && self.partial_since_ms.is_none()
                    && now_ms.saturating_sub(self.last_active_ms) >= timeouts.idle_ms;
                slow || idle || past_deadline
            }
        }
    }

    /// The worker stops (`at` carries its drain deadline, until which in-flight requests
    /// may finish). True: the connection is idle (nothing pending, held or half received)
    /// and is closed now; a lingering one ends by itself well within the deadline. The
    /// machine keeps nothing of the stop: every later input gets the deadline in its `at`.
    pub(crate) fn handle_stop(&self, at: At) -> bool {
        assert!(at.stopping(), "a stop without a drain deadline");
        self.state == State::Reading && self.partial_since_ms.is_none()
    }
}

#[cfg(test)]
mod tests;
