//! The connection machine driven by random event orders, as each engine delivers them,
//! against its invariants: nothing sent after close, held replies wait for their commit,
//! lingering and half-received requests bounded in time, every connection closed by the
//! stop's drain deadline, and operations armed and completed in pairs.

use proptest::prelude::*;

use super::*;
use crate::connection::linger::LINGER_MS;

const TIMEOUTS: Timeouts = Timeouts {
    request_ms: 5_000,
    idle_ms: 60_000,
};
const DRAIN_MS: u64 = 3_000;

/// How an engine moves bytes: with operations in flight (io_uring) or never (epoll).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Engine {
    Uring,
    Epoll,
}

/// What can happen to a connection, in any order; the harness delivers each one only
/// where the engine could (a receive completes only if one is armed, and so on).
#[derive(Debug, Clone)]
enum Event {
    /// Input served by the session.
    Input(Served),
    /// A send put bytes out; `all`: the output is all sent.
    Sent {
        all: bool,
    },
    /// The data device settled the held records; the session answered with `Served`.
    Settled(Served),
    /// A lingering read with this result.
    LingerRecv(i32),
    /// A receive failed (the peer reset or closed).
    PeerGone,
    /// A session produced output without input.
    PollOutput,
    Advance(u64),
    Tick,
    Stop,
}

fn flow() -> impl Strategy<Value = Flow> {
    prop_oneof![Just(Flow::Continue), Just(Flow::Drain), Just(Flow::Close)]
}

fn served() -> impl Strategy<Value = Served> {
    (flow(), any::<bool>(), any::<bool>(), any::<bool>(), 0u8..20).prop_map(
        |(flow, partial, held, pending, cap)| Served {
            flow,
            partial,
            held,
            pending,
            over_cap: cap == 0,
        },
    )
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        4 => served().prop_map(Event::Input),
        3 => any::<bool>().prop_map(|all| Event::Sent { all }),
        2 => served().prop_map(Event::Settled),
        1 => prop_oneof![Just(0), Just(512), Just(-libc::EAGAIN), Just(-libc::ECONNRESET)]
            .prop_map(Event::LingerRecv),
        1 => Just(Event::PeerGone),
        1 => Just(Event::PollOutput),
        2 => (1u64..3_000).prop_map(Event::Advance),
        2 => Just(Event::Tick),
        1 => Just(Event::Stop),
    ]
}

/// One connection on a simulated engine, checking the invariants as it goes.
struct Harness {
    engine: Engine,
    m: Machine,
    now: u64,
    /// The socket is closed: nothing more may happen.
    finished: bool,
    close_requested: bool,
    linger_since: Option<u64>,
    partial_since: Option<u64>,
    stop_deadline: Option<u64>,
    /// Answers the session gives when asked to drain, in turn.
    drains: Vec<Served>,
    next_drain: usize,
}

impl Harness {
    /// Now, with the stop's deadline as the worker keeps it.
    fn at(&self) -> At {
        At::new(self.now, self.stop_deadline)
    }

    fn new(engine: Engine, partial: bool, drains: Vec<Served>) -> Harness {
        let mut h = Harness {
            engine,
            m: Machine::new(0, partial),
            now: 0,
            finished: false,
            close_requested: false,
            linger_since: None,
            partial_since: partial.then_some(0),
            stop_deadline: None,
            drains,
            next_drain: 0,
        };
        h.carry_out(Step::Read);
        h
    }

    fn carry_out(&mut self, step: Step) {
        assert!(!self.finished);
        if self.close_requested {
            assert!(
                !matches!(step, Step::Send | Step::Read | Step::Drain | Step::Linger),
                "{step:?} after close"
            );
        }
        match step {
            Step::Send => {
                assert!(!self.m.held(), "a held reply sent before its commit");
                // As the io_uring engine does: every Send arms one (the machine refuses a
                // second one in flight).
                if self.engine == Engine::Uring {
                    self.m.armed(Io::Send);
                }
            }
            Step::Read | Step::Linger => {
                assert!(!self.m.held(), "read while a reply is held");
                if step == Step::Linger {
                    assert!(self.m.lingering());
                    self.linger_since = Some(self.now);
                    self.partial_since = None;
                }
                if self.engine == Engine::Uring && !self.m.in_flight(Io::Recv) {
                    self.m.armed(Io::Recv);
                }
            }
            Step::Drain => {
                assert_eq!(self.m.state(), State::Draining);
                let mut served = self.drains[self.next_drain % self.drains.len()];
                self.next_drain += 1;
                // A drain that keeps asking to drain with nothing out must end.
                if self.next_drain > 4 * self.drains.len() {
                    served.flow = Flow::Continue;
                }
                self.serve(served);
            }
            Step::Close => self.close(),
            Step::Wait => {}
        }
    }

    fn serve(&mut self, served: Served) {
        if served.partial {
            self.partial_since.get_or_insert(self.now);
        } else {
            self.partial_since = None;
        }
        let step = self.m.handle_served(self.at(), served);
        if served.held && !served.over_cap {
            assert_eq!(step, Step::Wait, "a held reply waits");
        }
        self.carry_out(step);
    }

    fn close(&mut self) {
        self.close_requested = true;
        if self.m.close() {
            self.finished = true;
        }
    }

    /// The io_uring engine's completion of `io` (after a close too).
    fn complete(&mut self, io: Io) -> bool {
        if !self.m.in_flight(io) {
            return false;
        }
        match self.m.handle_completed(io) {
            Completed::Serve => true,
            Completed::Finish => {
                self.finished = true;
                false
            }
            Completed::Wait => false,
        }
    }

    /// Input can arrive: the connection reads (io_uring: its receive completes, also while
    /// output the session produced without input is going out).
    fn reading(&mut self) -> bool {
        match self.engine {
            Engine::Epoll => self.m.state() == State::Reading,
            Engine::Uring => {
                let serving = matches!(self.m.state(), State::Reading | State::Sending { .. });
                serving && self.m.in_flight(Io::Recv) && self.complete(Io::Recv)
            }
        }
    }

    fn apply(&mut self, event: &Event) {
        match *event {
            Event::Input(served) if !self.close_requested && self.reading() => {
                self.m.handle_received(self.now);
                self.serve(served);
            }
            Event::Sent { all } if matches!(self.m.state(), State::Sending { .. }) => {
                if self.engine == Engine::Uring && !self.complete(Io::Send) {
                    return;
                }
                let step = self.m.handle_sent(self.at(), all);
                self.carry_out(step);
            }
            Event::Settled(served) if self.m.held() => {
                self.serve(Served {
                    held: false,
                    ..served
                });
            }
            Event::LingerRecv(res) if self.m.lingering() => {
                if self.engine == Engine::Uring && !self.complete(Io::Recv) {
                    return;
                }
                let step = self.m.handle_linger_recv(res, self.now);
                self.carry_out(step);
            }
            Event::PeerGone if !self.close_requested => {
                if self.engine == Engine::Uring {
                    for io in [Io::Recv, Io::Send] {
                        if self.m.in_flight(io) && !self.complete(io) {
                            break;
                        }
                    }
                    if self.finished {
                        return;
                    }
                }
                self.close();
            }
            Event::PollOutput if self.m.may_poll_output() => {
                assert!(!self.close_requested && !self.m.held());
                let step = self.m.handle_polled_output();
                self.carry_out(step);
            }
            Event::Advance(ms) => {
                self.now += ms;
                self.check_bounds();
            }
            Event::Tick => {
                let due = self.m.handle_timeout(self.at(), TIMEOUTS);
                if self.close_requested {
                    assert!(!due, "a closing connection is not closed again");
                } else if due {
                    self.close();
                }
            }
            Event::Stop if self.stop_deadline.is_none() => {
                let deadline = self.now + DRAIN_MS;
                self.stop_deadline = Some(deadline);
                let idle = self.m.handle_stop(self.at());
                if idle && !self.close_requested {
                    assert_eq!(self.m.state(), State::Reading);
                    self.close();
                }
            }
            _ => {}
        }
        self.settle_in_flight_after_close();
    }

    /// After a close the io_uring engine shuts the socket down: what is in flight completes.
    fn settle_in_flight_after_close(&mut self) {
        if self.close_requested && !self.finished && self.engine == Engine::Uring {
            assert!(self.m.closing());
            for io in [Io::Recv, Io::Send] {
                if !self.finished {
                    self.complete(io);
                }
            }
        }
        if self.close_requested && self.engine == Engine::Epoll {
            assert!(
                self.finished,
                "the readiness engine never has anything in flight"
            );
        }
    }

    /// The tick would close a connection past any of its time bounds.
    fn check_bounds(&self) {
        if self.close_requested {
            return;
        }
        let due = self.m.handle_timeout(self.at(), TIMEOUTS);
        if let Some(since) = self.linger_since {
            assert!(self.m.lingering());
            if self.now >= since + LINGER_MS {
                assert!(due, "lingered past {LINGER_MS} ms");
            }
        }
        if let Some(since) = self.partial_since {
            if self.now >= since + TIMEOUTS.request_ms {
                assert!(due, "a half-received request outlived the request timeout");
            }
        }
        if self.stop_deadline.is_some_and(|d| self.now >= d) {
            assert!(due, "a connection outlived the stop's drain deadline");
        }
    }
}

fn run(engine: Engine, partial: bool, drains: Vec<Served>, events: &[Event]) {
    let mut h = Harness::new(engine, partial, drains);
    for event in events {
        if h.finished {
            return;
        }
        h.apply(event);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn io_uring_event_orders_keep_the_invariants(
        partial in any::<bool>(),
        drains in proptest::collection::vec(served(), 1..4),
        events in proptest::collection::vec(event(), 0..80),
    ) {
        run(Engine::Uring, partial, drains, &events);
    }

    #[test]
    fn epoll_event_orders_keep_the_invariants(
        partial in any::<bool>(),
        drains in proptest::collection::vec(served(), 1..4),
        events in proptest::collection::vec(event(), 0..80),
    ) {
        run(Engine::Epoll, partial, drains, &events);
    }
}

/// A session's answer that holds its reply for the data device.
fn held_reply(pending: bool) -> Served {
    Served {
        flow: Flow::Continue,
        partial: false,
        held: true,
        pending,
        over_cap: false,
    }
}

#[test]
fn a_held_reply_waits_for_its_commit_then_goes_out() {
    let mut m = Machine::new(0, false);
    let held = held_reply(true);
    assert_eq!(m.handle_served(At::new(1, None), held), Step::Wait);
    assert!(!m.may_poll_output(), "nothing is asked of a held session");
    assert_eq!(m.held_flow(), Some(Flow::Continue));
    let settled = Served {
        held: false,
        ..held
    };
    assert_eq!(m.handle_served(At::new(2, None), settled), Step::Send);
    assert_eq!(m.handle_sent(At::new(3, None), true), Step::Read);
}

#[test]
fn the_stop_closes_only_idle_connections() {
    let stopping = |now| At::new(now, Some(100));
    let idle = Machine::new(0, false);
    assert!(idle.handle_stop(stopping(0)));
    let half = Machine::new(0, true);
    assert!(
        !half.handle_stop(stopping(0)),
        "a half-received request may finish"
    );
    assert!(
        !half.handle_timeout(stopping(99), TIMEOUTS),
        "until the deadline"
    );
    assert!(
        half.handle_timeout(stopping(100), TIMEOUTS),
        "but not past it"
    );
    let mut sending = Machine::new(0, false);
    let reply = Served {
        flow: Flow::Continue,
        partial: false,
        held: false,
        pending: true,
        over_cap: false,
    };
    assert_eq!(sending.handle_served(At::new(1, None), reply), Step::Send);
    assert!(!sending.handle_stop(stopping(1)));
    assert_eq!(
        sending.handle_sent(stopping(2), true),
        Step::Close,
        "once its reply is out a stopping connection closes"
    );
}

#[test]
#[should_panic(expected = "a send armed")]
fn arming_a_send_after_close_is_refused() {
    let mut m = Machine::new(0, false);
    assert!(m.close());
    m.armed(Io::Send);
}

#[test]
#[should_panic(expected = "a receive armed while a reply is held")]
fn arming_a_receive_while_a_reply_is_held_is_refused() {
    let mut m = Machine::new(0, false);
    let held = held_reply(true);
    assert_eq!(m.handle_served(At::new(1, None), held), Step::Wait);
    m.armed(Io::Recv);
}

#[test]
#[should_panic(expected = "input served in Held")]
fn input_for_a_held_connection_is_refused() {
    let mut m = Machine::new(0, false);
    let held = held_reply(false);
    m.handle_served(At::new(1, None), held);
    m.handle_received(2);
}

#[test]
#[should_panic(expected = "still holds the reply")]
fn a_held_connection_is_not_resumed_before_its_commit() {
    let mut m = Machine::new(0, false);
    let held = held_reply(false);
    m.handle_served(At::new(1, None), held);
    m.handle_served(At::new(2, None), held);
}

/// Every `.rs` file under `dir`, recursively.
fn sources(dir: &std::path::Path, found: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, found);
        } else if path.extension().is_some_and(|e| e == "rs") {
            found.push(path);
        }
    }
}

#[test]
fn no_engine_keeps_a_lifecycle_of_its_own() {
    // What the machine alone keeps and decides (ADR 0040): an engine that names one of
    // these again has started a second lifecycle.
    const MACHINE_ONLY: &[&str] = &[
        "partial_since",
        "last_active",
        "after_send",
        "awaits_device",
        "Linger::start",
        "linger.on_recv",
        "Served {",
        "fn due_to_close",
    ];
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/engine");
    let mut files = Vec::new();
    sources(&root, &mut files);
    assert!(
        files.len() >= 10,
        "the engines' sources were not found under {root:?}"
    );
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for word in MACHINE_ONLY {
            assert!(
                !text.contains(word),
                "{file:?} names `{word}`: the connection machine decides that (ADR 0040)"
            );
        }
    }
}
