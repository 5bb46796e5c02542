//! The connection's receive-into-item step ([`Conn::recv_target`], [`Conn::received`])
//! driven as an engine drives it, against a model of the byte stream: values announced by
//! a line (`into N`, the echo handler's storage command) arrive split at random points and
//! are received with random buffer sizes. The model says, before every receive, whether
//! its bytes belong in the value's memory (and how many are missing there) or in a receive
//! buffer; afterwards every value must be whole, byte for byte, and every reply in order.

use proptest::prelude::*;

use super::*;
use crate::handler::echo::{Echo, EchoSession, KEPT_VALUES};
use machine::Timeouts;
use ringstore_service::Protocol;

/// The output cap and no data device, as both engines pass them.
const RULES: (usize, bool) = (1 << 20, false);
const TIMEOUTS: Timeouts = Timeouts {
    request_ms: 5_000,
    idle_ms: 0,
};

/// One request of the stream: a value of this many bytes (`into N`), or a line echoed back.
#[derive(Debug, Clone)]
enum Request {
    Value(usize),
    Line,
}

/// A connection and its session, with an engine in miniature around them.
struct Harness {
    echo: Echo,
    conn: Conn<EchoSession, ()>,
    now_ms: u64,
    /// What the connection sent, in order.
    sent: Vec<u8>,
    /// Since when the session has had a request partly received, as the machine times it.
    partial_since_ms: Option<u64>,
}

impl Harness {
    fn new() -> Harness {
        let echo = Echo::default();
        let session = echo.open(Protocol::Memcache, 0);
        let fd = crate::sys::eventfd().unwrap();
        let conn = Conn::new(fd, session, Machine::new(0, false), ());
        Harness {
            echo,
            conn,
            now_ms: 0,
            sent: Vec::new(),
            partial_since_ms: None,
        }
    }

    fn at(&self) -> At {
        At::new(self.now_ms, None)
    }

    fn now(&self) -> Now {
        Now {
            store: 0,
            unix: 0,
            mono_ms: self.now_ms,
            mono_ns: 0,
        }
    }

    /// One receive of at most `buf` bytes from `wire` (what has arrived and is not yet
    /// read) as an engine makes it: where [`Conn::recv_target`] says. Returns the bytes
    /// read and the missing bytes of the value they went into (`None`: a buffer).
    fn receive(&mut self, wire: &[u8], buf: usize) -> (usize, Option<usize>) {
        let target = self.conn.recv_target(&self.echo);
        let n = target.map_or(buf, |(_, len)| len).min(wire.len());
        if let Some((at, _)) = target {
            #[allow(unsafe_code, reason = "a test: the kernel's write into the target")]
            // SAFETY: `at` is the session's value, `n` at most its missing bytes, and nothing
            // else touches it until the session is next called.
            unsafe {
                std::ptr::copy_nonoverlapping(wire.as_ptr(), at, n);
            }
        }
        let (at, now) = (self.at(), self.now());
        let step = match self.conn.received(&self.echo, n, at, RULES) {
            Some(step) => {
                assert!(target.is_some(), "bytes of a buffer taken as the item's");
                step
            }
            None => {
                assert!(target.is_none(), "bytes of the item fed as input");
                let ((session, out), _) = self.conn.session_and_out();
                let flow = self.echo.on_bytes(session, &wire[..n], now, None, out);
                self.conn.machine.handle_received(self.now_ms);
                self.conn.served(&self.echo, flow, at, RULES)
            }
        };
        self.carry_out(step);
        if self.echo.has_partial_request(&self.conn.session) {
            self.partial_since_ms.get_or_insert(self.now_ms);
        } else {
            self.partial_since_ms = None;
        }
        (n, target.map(|(_, len)| len))
    }

    /// Sends whatever the machine asks for until it reads again.
    fn carry_out(&mut self, mut step: Step) {
        loop {
            match step {
                Step::Read => return,
                Step::Send => {
                    self.sent
                        .extend_from_slice(&self.conn.out[self.conn.sent..]);
                    let left = self.conn.out.len() - self.conn.sent;
                    assert!(self.conn.bytes_sent(&self.echo, left));
                    step = self.conn.machine.handle_sent(self.at(), true);
                }
                other => panic!("the machine said {other:?} to a well-behaved stream"),
            }
        }
    }
}

/// Where each value lies in the stream, and the stream and the replies it must get.
struct Model {
    stream: Vec<u8>,
    values: Vec<std::ops::Range<usize>>,
    replies: Vec<u8>,
}

fn model(requests: &[Request], seed: u8) -> Model {
    let mut m = Model {
        stream: Vec::new(),
        values: Vec::new(),
        replies: Vec::new(),
    };
    for (i, r) in requests.iter().enumerate() {
        match *r {
            Request::Value(len) => {
                m.stream
                    .extend_from_slice(format!("into {len}\n").as_bytes());
                let start = m.stream.len();
                let bytes = (0..len)
                    .map(|j| (j.to_le_bytes()[0]).wrapping_mul(31) ^ seed ^ i.to_le_bytes()[0]);
                m.stream.extend(bytes);
                let sum: u64 = m.stream[start..].iter().map(|&b| u64::from(b)).sum();
                m.values.push(start..m.stream.len());
                m.replies
                    .extend_from_slice(format!("into {len} {sum}\n").as_bytes());
            }
            Request::Line => {
                let line = format!("line {i}\n");
                m.stream.extend_from_slice(line.as_bytes());
                m.replies.extend_from_slice(line.as_bytes());
            }
        }
    }
    // A last line: the echo answers a whole value with its next input, as the service
    // does once the `\r\n` behind it arrives.
    m.stream.extend_from_slice(b"done\n");
    m.replies.extend_from_slice(b"done\n");
    m
}

impl Model {
    /// The value bytes still missing when the stream has been read up to `pos`: those of
    /// the value `pos` lies in, once its line has been read (the session knows of it).
    fn missing_at(&self, pos: usize) -> Option<usize> {
        self.values
            .iter()
            .find(|v| v.start <= pos && pos < v.end)
            .map(|v| v.end - pos)
    }
}

fn request() -> impl Strategy<Value = Request> {
    prop_oneof![
        3 => (1usize..20_000).prop_map(Request::Value),
        1 => Just(Request::Line),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Values split at random points against their lines and the receive buffers: before
    /// each receive the connection targets the value exactly when the model says its line
    /// was read, with exactly the missing bytes; every value ends whole, byte for byte; the
    /// replies come in order; and a value stalled mid-way is cut at the request timeout.
    #[test]
    fn values_received_into_the_item_match_the_model(
        requests in prop::collection::vec(request(), 1..6),
        seed in any::<u8>(),
        arrivals in prop::collection::vec(1usize..9000, 1..40),
        bufs in prop::collection::vec(1usize..20_000, 1..8),
        stall_at in any::<prop::sample::Index>(),
    ) {
        let m = model(&requests, seed);
        let mut h = Harness::new();
        let (mut arrived, mut read, mut turn) = (0, 0, 0);
        let stall_at = stall_at.index(m.stream.len());
        let mut stalled = false;
        while read < m.stream.len() {
            // The peer's next piece arrives; the engine reads until the socket is empty.
            arrived = (arrived + arrivals[turn % arrivals.len()]).min(m.stream.len());
            while read < arrived {
                let (n, into) = h.receive(&m.stream[read..arrived], bufs[turn % bufs.len()]);
                prop_assert_eq!(into, m.missing_at(read), "target at stream byte {}", read);
                read += n;
                turn += 1;
            }
            if !stalled && read >= stall_at && m.missing_at(read).is_some() {
                // The client stalls mid-value: the tick cuts it once the request timeout
                // passed, never before (the reservation goes back with the close).
                stalled = true;
                let since = h.partial_since_ms.ok_or_else(|| {
                    TestCaseError::fail("mid-value without a partial request")
                })?;
                let before = At::new(since + TIMEOUTS.request_ms - 1, None);
                prop_assert!(!h.conn.machine.handle_timeout(before, TIMEOUTS), "cut too early");
                let due = At::new(since + TIMEOUTS.request_ms, None);
                prop_assert!(h.conn.machine.handle_timeout(due, TIMEOUTS), "a stalled value held on");
            }
            h.now_ms += 1;
        }
        prop_assert_eq!(&h.sent, &m.replies);
        let values: Vec<&[u8]> = m.values.iter().map(|v| &m.stream[v.clone()]).collect();
        let kept = values.len().min(KEPT_VALUES);
        let whole: Vec<&[u8]> = h.conn.session.whole.iter().map(|v| &v[..]).collect();
        prop_assert_eq!(&whole[..], &values[values.len() - kept..]);
        let total: usize = m.values.iter().map(ExactSizeIterator::len).sum();
        let into = h.echo.received_into.load(std::sync::atomic::Ordering::Relaxed);
        prop_assert_eq!(into + h.conn.session.copied, total, "every value byte once");
        prop_assert!(!h.echo.has_partial_request(&h.conn.session));
    }
}

/// A receive reported as longer than the value's missing bytes is refused where the
/// machine keeps them: nothing past the reserved item is ever taken as written.
#[test]
fn a_receive_past_the_missing_bytes_is_refused() {
    let mut h = Harness::new();
    h.receive(b"into 10\n", 100);
    let target = h.conn.recv_target(&h.echo);
    assert_eq!(target.map(|(_, len)| len), Some(10));
    let at = h.at();
    let past = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        h.conn.received(&h.echo, 11, at, RULES)
    }));
    assert!(past.is_err(), "11 bytes taken into a value that missed 10");
}

/// A receive made into a buffer is fed as input, even after one into the item: the
/// machine records afresh where each receive goes.
#[test]
fn each_receive_is_recorded_afresh() {
    let mut h = Harness::new();
    h.receive(b"into 4\n", 100);
    assert_eq!(h.receive(b"ab", 100), (2, Some(4)));
    assert_eq!(h.receive(b"cd", 100), (2, Some(2)));
    assert_eq!(h.receive(b"x\n", 100), (2, None));
    assert_eq!(h.sent, b"into 4 394\nx\n");
}
