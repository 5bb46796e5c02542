//! memcache sessions: buffered bytes in, requests parsed by `ringstore_proto::memcache`,
//! executed against the store, replies appended to the runtime's output buffer.
//!
//! Buffering: when nothing is pending, requests are parsed straight from the runtime's
//! input (zero copy); only the tail of an incomplete request, or what is left when the
//! output passes the high-water mark, is copied into `pending`. `pending` never holds more
//! than one request's bound ([`Limits::max_buffered`]) plus one delivered chunk.
//!
//! Execution lives in one file per command family: [`get`], [`storage`], [`arith`],
//! [`admin`] (delete, touch, flush_all, verbosity), [`stats`], [`meta`] (mg ms md ma me),
//! [`dump`] (key listings), with the exptime rules in [`expiry`]. A connection whose first
//! byte is the binary protocol's request magic (0x80) speaks it from then on, as with
//! memcached: [`binary`].

mod admin;
mod ahead;
pub use admin::CertRefreshGate;
mod arith;
mod ascii_auth;
#[cfg(test)]
mod ascii_auth_tests;
mod binary;
#[cfg(test)]
mod bound_tests;
#[cfg(test)]
mod compat_tests;
mod direct;
pub(crate) use direct::DIRECT_MIN;
#[cfg(test)]
mod direct_tests;
mod dump;
pub mod expiry;
mod get;
mod meta;
mod sasl;
mod stats;
mod storage;
#[cfg(test)]
mod tests;
pub mod udp;

use ringstore_proto::memcache::binary::{response, Head, Status, REQUEST_MAGIC};
use ringstore_proto::memcache::misc::WatchKinds;
use ringstore_proto::memcache::{parse, reply, Limits, Parse, Request, OUT_OF_MEMORY, TOO_LARGE};

use ringstore_store::Journaled;

use crate::budget::{Hold, IN_FREE, OUT_FREE};
use crate::device::Device;
use crate::held::{Failure, HeldReplies};
use crate::zero_copy::ZeroCopy;
use crate::{durable_failure_reply, Flow, Now, Protocol, Shared, WorkerStats};
use ahead::Ahead;

/// memcached's answer when it cannot grow a connection's read buffer (then it closes).
const OUT_OF_MEMORY_READING: &str = "SERVER_ERROR out of memory reading request";

/// The memcached version ringstore answers as (`version`, `stats version`): clients pick
/// features (meta commands) by it.
pub const COMPAT_VERSION: &str = "1.6.18";

/// Capacity kept by an idle session's buffer; a connection that once sent a large value
/// gives the memory back.
const RETAINED_CAPACITY: usize = 16 * 1024;

/// Everything a command needs while it runs.
pub(crate) struct Ctx<'s> {
    pub shared: &'s Shared,
    /// The worker serving the session (its `watch` ring).
    pub worker: usize,
    /// The session's connection number in `watch` lines (0 until one is logged).
    pub cfd: &'s std::cell::Cell<u64>,
    pub stats: &'s WorkerStats,
    pub now: Now,
    /// The worker's data device, when one is attached.
    pub device: Option<&'s dyn Device>,
}

impl<'s> Ctx<'s> {
    /// Logs a `watch` fetcher line for `key` (`size`: the value's length on a hit), and
    /// counts the read for `stats hotkeys`. Inline, with the logging out of line: called
    /// as a function, its frame (saving the registers the log call needs) cost every GET
    /// about 20 instructions more than the countdown and the check (callgrind).
    #[inline]
    pub fn watch_get(&self, key: &[u8], found: bool, size: usize) {
        self.shared.hotkeys.record(self.worker, key);
        if self.shared.watch.wants(WatchKinds::FETCHERS) {
            self.log_get(key, found, size);
        }
    }

    #[cold]
    #[inline(never)]
    fn log_get(&self, key: &[u8], found: bool, size: usize) {
        let cfd = self.cfd();
        self.shared
            .watch
            .log(self.worker, WatchKinds::FETCHERS, self.now, |l| {
                crate::watch::item_get(l, key, found, cfd, size)
            });
    }

    /// Logs a `watch` mutation line, and counts the write for `stats hotkeys`. (Not inline
    /// as [`Ctx::watch_get`] is: inlined into the storage commands it moved the store's
    /// update out of line, and a SET cost 35–39 instructions more.)
    pub fn watch_store(&self, line: crate::watch::StoreLine<'_>) {
        self.shared.hotkeys.record(self.worker, line.key);
        let hub = &self.shared.watch;
        if hub.wants(WatchKinds::MUTATIONS) {
            let cfd = self.cfd();
            hub.log(self.worker, WatchKinds::MUTATIONS, self.now, |l| {
                crate::watch::item_store(l, line, cfd)
            });
        }
    }

    fn cfd(&self) -> u64 {
        if self.cfd.get() == 0 {
            self.cfd.set(self.shared.watch.conn_id());
        }
        self.cfd.get()
    }

    /// The store, with writes logged to the data device first.
    pub fn store(&self) -> Journaled<'s> {
        self.shared
            .store
            .journaled(self.device.map(|d| d as &dyn ringstore_store::Journal))
    }

    /// The parser's bounds, from the configuration.
    pub fn limits(&self) -> Limits {
        Limits {
            item_size_max: self.shared.config.item_size_max,
            max_line: self.shared.config.max_line,
        }
    }

    /// The device's newest token (0 without a device).
    pub fn staged(&self) -> u64 {
        self.device.map_or(0, |d| d.staged())
    }
}

/// One memcache connection's protocol state. Sans-IO.
#[derive(Debug)]
pub struct MemcacheSession {
    worker: usize,
    /// Unconsumed input: an incomplete request, or what was left at the high-water mark.
    pending: Vec<u8>,
    /// Bytes of a refused data block still to discard (memcached's `conn_swallow`).
    swallow: usize,
    /// Keys of the get at the head of `pending` already answered (0: none paused).
    get_cursor: usize,
    /// Where the key listing at the head of `pending` resumes (`None`: none paused).
    dump: Option<dump::DumpState>,
    /// Length of the storage request whose data block is arriving (0: none).
    awaiting: usize,
    /// Connection-memory reservation for `pending` beyond [`IN_FREE`].
    in_hold: Hold,
    /// Connection-memory reservation for pending output beyond [`OUT_FREE`].
    out_hold: Hold,
    /// Replies waiting for the data device.
    held: HeldReplies,
    /// Which protocol the connection speaks, decided by its first byte.
    mode: Mode,
    /// Response boundaries in the output, when asked for (memcache over UDP frames each
    /// response as memcached does): see [`MemcacheSession::mark_responses`].
    marks: Option<Vec<ResponseMark>>,
    /// GET values sent from the item (`zero_copy.rs`).
    pub(crate) zc: ZeroCopy,
    /// `--auth-file`: whether the connection must still log in (`ascii_auth.rs`).
    gate: ascii_auth::Gate,
    /// Set once the connection sent `watch`: it then only receives log lines.
    watcher: Option<Box<crate::watch::Watcher>>,
    /// The connection number its `watch` lines carry (`cfd=`), given when first needed.
    cfd: u64,
    /// The peer's address, when the runtime told it (`watch connevents`).
    peer: Option<std::net::SocketAddr>,
    /// Requests answered in the current call, for the latency histograms.
    pub(crate) tally: crate::latency::Tally,
    /// The storage request whose value is being received into its item (`direct.rs`).
    direct: Option<Box<direct::Direct>>,
    /// Values may be received into the item (a connection's session, not a datagram's).
    direct_on: bool,
}

/// The end of one response in a session's output (memcached frames each of its UDP
/// responses separately: one per command, one per key of a multi-key get).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResponseMark {
    /// Output offset where the response ends.
    pub end: usize,
    /// An empty response still goes out (memcached's header-only datagram for a missed key
    /// that is not a get's last); otherwise an empty one (noreply) sends nothing.
    pub keep_empty: bool,
}

/// Response marks a session keeps at most (more: the rest of the output is one response).
pub const RESPONSE_MARKS_MAX: usize = 4096;

/// Notes a response ending at `out.len()` (if marking, and within the bound).
pub(crate) fn mark(marks: &mut Option<Vec<ResponseMark>>, end: usize, keep_empty: bool) {
    if let Some(m) = marks {
        if m.len() < RESPONSE_MARKS_MAX {
            m.push(ResponseMark { end, keep_empty });
        }
    }
}

/// The protocol of a memcache connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// No byte seen yet.
    Undecided,
    /// Text and meta commands.
    Text,
    /// The binary protocol (first byte 0x80).
    Binary,
}

impl MemcacheSession {
    pub fn new(worker: usize) -> MemcacheSession {
        MemcacheSession {
            worker,
            pending: Vec::new(),
            swallow: 0,
            get_cursor: 0,
            dump: None,
            awaiting: 0,
            in_hold: Hold::default(),
            out_hold: Hold::default(),
            held: HeldReplies::default(),
            mode: Mode::Undecided,
            marks: None,
            zc: ZeroCopy::default(),
            gate: ascii_auth::Gate::Unresolved,
            watcher: None,
            cfd: 0,
            peer: None,
            tally: crate::latency::Tally::default(),
            direct: None,
            direct_on: false,
        }
    }

    /// From now on, a storage value with [`direct::DIRECT_MIN`] bytes and more still to come is received
    /// into its item (`direct.rs`): a connection's session, whose runtime asks
    /// [`MemcacheSession::recv_target`] before each receive.
    pub fn enable_direct(&mut self) {
        self.direct_on = true;
    }

    /// Where the runtime receives the next input: the missing bytes of a value being
    /// received into its item (their first byte and how many), or `None` (the usual
    /// receive). The bytes stay valid until the session is called again or closed.
    pub fn recv_target(&self) -> Option<(*mut u8, usize)> {
        self.direct.as_ref().and_then(|d| d.target())
    }

    /// `n` bytes were received at [`MemcacheSession::recv_target`]. [`Flow::Drain`] when
    /// they made the request whole (a binary value: nothing follows it): the session is to
    /// be called again, with no input, to answer it.
    pub fn received_into(&mut self, n: usize, shared: &Shared) -> Flow {
        let Some(d) = &mut self.direct else {
            return Flow::Continue;
        };
        shared.stats(self.worker).bytes_read.add(n as u64);
        if d.received(n) {
            Flow::Drain
        } else {
            Flow::Continue
        }
    }

    /// The connection is gone: a value being received into its item never will be.
    pub fn abandon_direct(&mut self, shared: &Shared) {
        if let Some(d) = self.direct.take() {
            d.abandon(&shared.store);
        }
    }

    /// A storage request at the start of `request` (its command line `line_len` bytes) whose
    /// value is arriving: true when the value is received into its item from here on
    /// (`direct.rs`), all of `request` used; false: it is buffered in `pending` as before.
    /// Not while a reply is held or with a data device (its journal records whole values).
    fn start_direct(
        &mut self,
        ctx: &Ctx<'_>,
        held: &HeldReplies,
        request: &[u8],
        line_len: usize,
    ) -> bool {
        if !self.direct_on || held.is_holding() || ctx.device.is_some() {
            return false;
        }
        let binary = self.mode == Mode::Binary;
        match direct::Direct::start(ctx, request, line_len, binary) {
            Some(d) => {
                self.direct = Some(Box::new(d));
                true
            }
            None => false,
        }
    }

    /// Input while a value is received into its item: value bytes and the `\r\n` behind
    /// it go to the item; once whole, the request is done. Returns the input left.
    fn continue_direct<'i>(
        &mut self,
        input: &'i [u8],
        ctx: &Ctx<'_>,
        out: &mut Vec<u8>,
    ) -> &'i [u8] {
        let Some(d) = &mut self.direct else {
            return input;
        };
        let (used, whole) = d.absorb(&ctx.shared.store, input);
        if whole {
            if let Some(d) = self.direct.take() {
                d.finish(ctx, out);
                self.tally.note(crate::latency::Family::Set);
                mark(&mut self.marks, out.len(), false);
            }
        }
        &input[used..]
    }

    /// The connection's peer: memcached's `conn_new` line when connevents are watched.
    pub fn peer_known(&mut self, shared: &Shared, peer: std::net::SocketAddr) {
        self.peer = Some(peer);
        self.log_conn_event(shared, false);
    }

    /// Logs `conn_new` (or `conn_close` when `closed`) while connevents are watched; a
    /// watcher's own close is not logged (memcached's watchers are not connections then).
    pub fn log_conn_event(&mut self, shared: &Shared, closed: bool) {
        let hub = &shared.watch;
        let Some(peer) = self.peer.filter(|_| hub.wants(WatchKinds::CONNEVENTS)) else {
            return;
        };
        if self.watcher.is_some() {
            return;
        }
        if self.cfd == 0 {
            self.cfd = hub.conn_id();
        }
        let cfd = self.cfd;
        hub.log_now(self.worker, WatchKinds::CONNEVENTS, |l| {
            crate::watch::conn_event(l, peer, closed, cfd)
        });
    }

    /// A watcher's new log lines (`watch.rs`); false for any other connection.
    pub fn poll_watch(&mut self, shared: &Shared, out: &mut Vec<u8>) -> bool {
        match &mut self.watcher {
            Some(w) => shared.watch.poll(w, out),
            None => false,
        }
    }

    /// Decides from `shared` whether this connection must log in (once; later calls keep
    /// what was decided).
    pub fn resolve_gate(&mut self, shared: &Shared) {
        if matches!(self.gate, ascii_auth::Gate::Unresolved) {
            self.gate = ascii_auth::Gate::for_shared(shared);
        }
    }

    /// The connection logged in (text `set` login or binary SASL) as `standing`.
    fn log_in(&mut self, standing: Box<crate::auth::Standing>) {
        self.gate = ascii_auth::Gate::LoggedIn(standing);
    }

    /// True when the connection logged in as a user that a reload of the users file
    /// removed (or whose password it changed): the runtime closes it, and
    /// [`MemcacheSession::on_bytes`] closes it before it reads another request.
    pub fn revoked(&mut self, shared: &Shared) -> bool {
        self.gate.revoked(shared)
    }

    /// A failed SASL attempt: the connection must log in again.
    fn log_out(&mut self) {
        self.gate = ascii_auth::Gate::Locked(ascii_auth::Login::default());
    }

    /// True while the connection has not logged in under `--auth-file`.
    pub fn locked(&self) -> bool {
        !matches!(
            self.gate,
            ascii_auth::Gate::Open | ascii_auth::Gate::LoggedIn(_)
        )
    }

    /// From now on, note where each response ends in the output (text protocol, while no
    /// reply is held); [`MemcacheSession::take_response_marks`] returns them.
    pub fn mark_responses(&mut self) {
        self.marks = Some(Vec::new());
    }

    /// The response ends noted so far (offsets into the output of the calls since marking
    /// began), emptied.
    pub fn take_response_marks(&mut self) -> Vec<ResponseMark> {
        self.marks.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// True while a reply waits for the data device ([`MemcacheSession::on_durable`]).
    pub fn awaits_durable(&self) -> bool {
        self.held.is_holding()
    }

    /// The runtime settled `token`, one this session staged: replies now complete go to `out`.
    pub fn on_durable(&mut self, token: u64, ok: bool, shared: &Shared, out: &mut Vec<u8>) {
        let failure = durable_failure_reply(Protocol::Memcache);
        let n = self.held.on_durable(token, ok, out, failure);
        shared.stats(self.worker).bytes_written.add(n as u64);
    }

    /// The runtime sent every pending output byte: the output reservation goes back.
    pub fn on_output_flushed(&mut self) {
        self.out_hold.release();
    }

    /// The output's spliced values were sent (or never will be): unpin them.
    pub fn release_splices(&mut self, shared: &Shared) {
        if !self.zc.splices.is_empty() {
            self.zc.release_from(shared, shared.stats(self.worker), 0);
        }
    }

    /// See [`crate::Session::on_bytes`].
    pub fn on_bytes(
        &mut self,
        input: &[u8],
        now: Now,
        shared: &Shared,
        device: Option<&dyn Device>,
        out: &mut Vec<u8>,
    ) -> Flow {
        let stats = shared.stats(self.worker);
        stats.bytes_read.add(input.len() as u64);
        self.tally.begin(&shared.metrics.latency, now);
        let out_start = out.len();
        // What is still pending from earlier calls keeps its reservation; the rest goes back.
        let _ = self.out_hold.set(
            &shared.conn_memory,
            self.out_hold
                .bytes()
                .min(out.len().saturating_sub(OUT_FREE)),
        );
        let cfd = std::cell::Cell::new(self.cfd);
        let ctx = Ctx {
            shared,
            worker: self.worker,
            cfd: &cfd,
            stats,
            now,
            device,
        };
        let input = self.continue_direct(input, &ctx, out);
        let mut flow = if self.direct.is_some() {
            Flow::Continue
        } else if self.pending.is_empty() {
            self.run_in_place(input, &ctx, out)
        } else {
            self.run_after_pending(input, &ctx, out)
        };
        self.cfd = cfd.get();
        if flow != Flow::Close {
            flow = self.hold_input(shared, out, flow);
        }
        if flow == Flow::Drain {
            stats.conn_yields.inc();
        }
        if flow == Flow::Close
            || (self.pending.is_empty() && self.pending.capacity() > RETAINED_CAPACITY)
        {
            self.pending = Vec::new();
        }
        if flow == Flow::Close {
            self.in_hold.release();
        }
        stats.bytes_written.add((out.len() - out_start) as u64);
        let partial = !self.pending.is_empty();
        self.tally
            .end(&shared.metrics.latency, self.worker, partial);
        flow
    }

    /// Runs the requests in `input` where they lie (nothing pending); what is left of it
    /// goes to `pending`.
    fn run_in_place(&mut self, input: &[u8], ctx: &Ctx<'_>, out: &mut Vec<u8>) -> Flow {
        let (used, flow) = self.run(input, ctx, out);
        if flow != Flow::Close {
            let rest = &input[used..];
            if self.awaiting > rest.len() {
                // The data block is coming: buffer it once, at its final size.
                self.pending.reserve_exact(self.awaiting);
            }
            self.pending.extend_from_slice(rest);
        }
        flow
    }

    /// Runs `input` behind what is pending. When the request at the head of `pending` is a
    /// storage request whose block this input completes, only the bytes it lacks are
    /// copied: that request runs from `pending`, the rest of the input where it lies. At
    /// 16 KiB receive buffers a pipelined 4 KiB SET stream ends nearly every chunk inside a
    /// value, and copying the whole chunk in (then shifting its tail out) was a copy of
    /// every byte received.
    fn run_after_pending(&mut self, input: &[u8], ctx: &Ctx<'_>, out: &mut Vec<u8>) -> Flow {
        let lacking = self.awaiting.saturating_sub(self.pending.len());
        if lacking == 0 || lacking >= input.len() {
            return self.run_pending(input, ctx, out);
        }
        let (head, rest) = input.split_at(lacking);
        match self.run_pending(head, ctx, out) {
            Flow::Continue if self.pending.is_empty() => self.run_in_place(rest, ctx, out),
            Flow::Continue => self.run_pending(rest, ctx, out),
            Flow::Drain => {
                // Stopped at the high-water mark or a paused get: the rest waits, unparsed.
                self.pending.extend_from_slice(rest);
                Flow::Drain
            }
            Flow::Close => Flow::Close,
        }
    }

    /// Appends `input` to `pending` and runs what that makes; `pending` keeps what is left.
    fn run_pending(&mut self, input: &[u8], ctx: &Ctx<'_>, out: &mut Vec<u8>) -> Flow {
        let mut buf = std::mem::take(&mut self.pending);
        buf.extend_from_slice(input);
        let (used, flow) = self.run(&buf, ctx, out);
        buf.drain(..used);
        self.pending = buf;
        flow
    }

    /// Keeps the input reservation equal to what `pending` holds (or will hold, for an
    /// arriving data block) beyond [`IN_FREE`]. A storage request was already refused in
    /// [`MemcacheSession::run`] when its block did not fit; what is left is a long `get` line
    /// growing without room, which memcached answers with an error before it closes.
    fn hold_input(&mut self, shared: &Shared, out: &mut Vec<u8>, flow: Flow) -> Flow {
        let want = self
            .pending
            .len()
            .max(self.awaiting)
            .saturating_sub(IN_FREE);
        if self.in_hold.set(&shared.conn_memory, want) {
            return flow;
        }
        let binary_head = (self.mode == Mode::Binary).then(|| binary_head(&self.pending));
        self.pending.clear();
        self.held.write(out, |out| match binary_head {
            Some(head) => response::error(out, head, Status::OutOfMemory),
            None => reply::line(out, OUT_OF_MEMORY_READING),
        });
        Flow::Close
    }

    /// True while part of a request is buffered or a refused value is being swallowed.
    ///
    /// A paused get is not partial: its request is whole and what it waits for is the client
    /// reading, which the idle timeout bounds (every send that makes progress counts as
    /// activity, so a slow reader is served and one that never reads is cut).
    pub fn has_partial_request(&self) -> bool {
        (!self.pending.is_empty() && self.get_cursor == 0 && self.dump.is_none())
            || self.swallow > 0
            || matches!(self.gate, ascii_auth::Gate::Locked(_))
            || self.direct.is_some()
    }

    /// Parses and executes requests from `buf`; returns the bytes used and the next step.
    fn run(&mut self, buf: &[u8], ctx: &Ctx<'_>, out: &mut Vec<u8>) -> (usize, Flow) {
        if self.gate.revoked(ctx.shared) {
            // Its user left the users file at a reload: no further request is served.
            return (buf.len(), Flow::Close);
        }
        let mut held = std::mem::take(&mut self.held);
        let done = self.run_held(buf, ctx, out, &mut held);
        self.held = held;
        done
    }

    /// The `-Y` login gate of a text session: where the requests start in `buf` (after a
    /// login that completed in it), or what to return now (login still under way, or refused).
    fn pass_gate(
        &mut self,
        buf: &[u8],
        ctx: &Ctx<'_>,
        out: &mut Vec<u8>,
    ) -> Result<usize, (usize, Flow)> {
        let ascii_auth::Gate::Locked(login) = &mut self.gate else {
            return Ok(0);
        };
        let (used, step) = login.run(buf, ctx, out);
        match step {
            ascii_auth::Step::More => Err((used, Flow::Continue)),
            ascii_auth::Step::Close => Err((buf.len(), Flow::Close)),
            ascii_auth::Step::LoggedIn(standing) => {
                self.log_in(standing);
                Ok(used)
            }
        }
    }

    /// [`MemcacheSession::run`], with the held replies taken out of the session so the
    /// commands can write into them.
    fn run_held(
        &mut self,
        buf: &[u8],
        ctx: &Ctx<'_>,
        out: &mut Vec<u8>,
        held: &mut HeldReplies,
    ) -> (usize, Flow) {
        if self.watcher.is_some() {
            return (buf.len(), Flow::Continue); // a watcher's input is ignored, as memcached's
        }
        if self.mode == Mode::Undecided {
            match buf.first() {
                None => return (0, Flow::Continue),
                Some(&REQUEST_MAGIC) => self.mode = Mode::Binary,
                Some(_) => self.mode = Mode::Text,
            }
        }
        self.resolve_gate(ctx.shared);
        if self.mode == Mode::Binary {
            return self.run_binary(buf, ctx, out, held);
        }
        let mut pos = match self.pass_gate(buf, ctx, out) {
            Ok(pos) => pos,
            Err(done) => return done,
        };
        let limits = ctx.limits();
        self.awaiting = 0;
        let mut ahead = self.parse_ahead(ctx, &buf[pos..], &limits);
        loop {
            if let Some(flow) = self.before_request(
                ctx,
                buf.len(),
                &mut pos,
                out.len() + held.len() + self.zc.pinned,
            ) {
                return (pos, flow);
            }
            let parsed = match ahead.as_mut().and_then(Ahead::next) {
                Some(parsed) => parsed,
                None => parse(&buf[pos..], &limits),
            };
            match parsed {
                Parse::Incomplete => return (pos, Flow::Continue),
                Parse::AwaitingValue {
                    request_len,
                    line_len,
                    key,
                    remove_old,
                    noreply,
                } => {
                    if self.start_direct(ctx, held, &buf[pos..], line_len) {
                        return (buf.len(), Flow::Continue);
                    }
                    let Some(used) = self.value_or_refuse(
                        ctx,
                        (held, out),
                        buf.len() - pos,
                        Failure::Fixed,
                        (line_len, request_len),
                        |target| {
                            storage::refuse_value(
                                ctx,
                                target,
                                key,
                                remove_old,
                                noreply,
                                OUT_OF_MEMORY,
                            );
                        },
                    ) else {
                        return (pos, Flow::Continue);
                    };
                    pos += used;
                }
                Parse::Close { reply: line } => {
                    if let Some(line) = line {
                        held.write(out, |out| reply::line(out, line));
                    }
                    return (buf.len(), Flow::Close);
                }
                Parse::Done { request, consumed } => {
                    // A reply to a request that staged records waits for the device, and
                    // every later one waits behind it.
                    let flow = held.around(
                        out,
                        || ctx.staged(),
                        Failure::Fixed,
                        |target| self.execute_counted(&request, ctx, target),
                    );
                    match flow {
                        Flow::Close => return (buf.len(), Flow::Close),
                        // A paused get: it stays unconsumed at the head of the input.
                        Flow::Drain => return (pos, Flow::Drain),
                        Flow::Continue => pos += consumed,
                    }
                    if self.watcher.is_some() {
                        return (buf.len(), Flow::Continue);
                    }
                    if !held.is_holding() {
                        mark(&mut self.marks, out.len(), false);
                    }
                }
            }
        }
    }

    /// The batch's `get`/`set` requests at the start of `buf`, parsed once before the first
    /// runs so the store loads their keys meanwhile; other batches (meta) get their keys
    /// prefetched from a scan of their lines. A batch of one has nothing to load (and is
    /// parsed in its turn). Not while a refused value is still being swallowed: the requests
    /// start after it.
    fn parse_ahead<'a>(&self, ctx: &Ctx<'_>, buf: &'a [u8], limits: &Limits) -> Option<Ahead<'a>> {
        if ringstore_proto::memcache::scan::single_request(buf) {
            return None;
        }
        if self.swallow == 0 && matches!(buf.first(), Some(b'g' | b's')) {
            return Some(Ahead::parse(buf, limits, |keys| {
                ctx.shared.store.prefetch(keys);
            }));
        }
        prefetch_batch(ctx, buf);
        None
    }

    /// Before each request of a run over `len` bytes, at `pos`: skips what is left of a
    /// refused value, and says when to stop: input used up (or swallowed), or the output
    /// (`pending` bytes, held ones included) over the high-water mark.
    fn before_request(
        &mut self,
        ctx: &Ctx<'_>,
        len: usize,
        pos: &mut usize,
        pending: usize,
    ) -> Option<Flow> {
        let n = self.swallow.min(len - *pos);
        self.swallow -= n;
        *pos += n;
        if self.swallow > 0 || *pos == len {
            return Some(Flow::Continue);
        }
        (pending > ctx.shared.config.out_high_water).then_some(Flow::Drain)
    }

    /// A storage request whose value is arriving (`buffered` bytes of it from its start are
    /// here): `None` when there is room to buffer it, so the session waits for the rest.
    /// Otherwise it is refused before its value is read (`refuse` writes the refusal, in order
    /// behind any held reply) and the value, after the `head_len` bytes already parsed, is
    /// swallowed as it arrives (memcached's `conn_swallow`): `Some(head_len)`, the input used.
    fn value_or_refuse(
        &mut self,
        ctx: &Ctx<'_>,
        (held, out): (&mut HeldReplies, &mut Vec<u8>),
        buffered: usize,
        failure: Failure,
        (head_len, request_len): (usize, usize),
        refuse: impl FnOnce(&mut Vec<u8>),
    ) -> Option<usize> {
        debug_assert!(head_len <= request_len);
        if self.reserve_value(ctx, request_len, buffered) {
            return None;
        }
        held.around(out, || ctx.staged(), failure, refuse);
        self.swallow = request_len - head_len;
        Some(head_len)
    }

    /// Reserves room for a storage request of `request_len` bytes whose value is arriving
    /// (`buffered` bytes of input from its start are here): true when it may be buffered.
    fn reserve_value(&mut self, ctx: &Ctx<'_>, request_len: usize, buffered: usize) -> bool {
        let room = request_len.max(buffered).saturating_sub(IN_FREE);
        if !self.in_hold.set(&ctx.shared.conn_memory, room) {
            return false;
        }
        self.awaiting = request_len;
        true
    }

    /// [`MemcacheSession::execute`], counting a request that finished in its latency family
    /// (a paused get counts when it finishes).
    /// By reference: a `Request` is as large as its largest (meta) form, and moving one into
    /// the call cost a GET a memcpy call (~30 instructions, callgrind).
    /// Never inlined: inlined into the session's loop it made every request's code larger
    /// (SET 100 B ~60 instructions more per request at depth 1, callgrind).
    #[inline(never)]
    fn execute_counted(&mut self, request: &Request<'_>, ctx: &Ctx<'_>, out: &mut Vec<u8>) -> Flow {
        let family = family(request);
        let flow = self.execute(request, ctx, out);
        if flow == Flow::Continue {
            self.tally.note(family);
        }
        flow
    }

    fn execute(&mut self, request: &Request<'_>, ctx: &Ctx<'_>, out: &mut Vec<u8>) -> Flow {
        match *request {
            Request::Get(g) => match get::get(
                ctx,
                out,
                &mut self.out_hold,
                g,
                self.get_cursor,
                &mut self.marks,
                &mut self.zc,
            ) {
                get::Progress::Done => self.get_cursor = 0,
                get::Progress::Paused(next) => {
                    self.get_cursor = next;
                    return Flow::Drain;
                }
            },
            Request::Store(s) => storage::store(ctx, out, &s),
            Request::TooLarge {
                key,
                remove_old,
                noreply,
                swallow,
            } => {
                storage::refuse_value(ctx, out, key, remove_old, noreply, TOO_LARGE);
                self.swallow = swallow;
            }
            Request::Arith {
                incr,
                key,
                delta,
                noreply,
            } => arith::arith(ctx, out, incr, key, delta, noreply),
            Request::Delete { key, noreply } => admin::delete(ctx, out, key, noreply),
            Request::Touch {
                key,
                exptime,
                noreply,
            } => admin::touch(ctx, out, key, exptime, noreply),
            Request::FlushAll { delay, noreply } => admin::flush_all(ctx, out, delay, noreply),
            Request::Stats(s) => stats::stats(ctx, out, s),
            Request::Version => {
                out.extend_from_slice(b"VERSION ");
                reply::line(out, COMPAT_VERSION);
            }
            Request::Watch(kinds) => match ctx.shared.watch.join(kinds) {
                Some(w) => {
                    self.watcher = Some(Box::new(w));
                    reply::line(out, "OK");
                }
                None => reply::line(out, crate::watch::TOO_MANY),
            },
            Request::Verbosity { noreply } => {
                if !noreply {
                    reply::line(out, "OK");
                }
            }
            Request::Quit => return Flow::Close,
            Request::RefreshCerts { noreply } => {
                // Only memcache over UDP marks its responses (one request per datagram).
                let datagram = self.marks.is_some();
                admin::refresh_certs(ctx, out, noreply, datagram);
            }
            Request::MetaGet(m) => meta::mg(ctx, out, &mut self.out_hold, &mut self.zc, &m),
            Request::MetaSet(m) => meta::ms(ctx, out, &m),
            Request::MetaDelete(m) => meta::md(ctx, out, &m),
            Request::MetaArith(m) => meta::ma(ctx, out, &m),
            Request::KeyDump(kind) => {
                match dump::dump(ctx, out, &mut self.out_hold, kind, self.dump.take()) {
                    dump::Progress::Done => {}
                    dump::Progress::Paused(state) => {
                        self.dump = Some(state);
                        return Flow::Drain;
                    }
                }
            }
            Request::MetaNoop => reply::line(out, "MN"),
            Request::MetaDebug { key } => meta::me(ctx, out, &key),
            Request::Reply {
                line,
                noreply,
                swallow,
            } => {
                if !noreply {
                    reply::line(out, line);
                }
                self.swallow = swallow;
            }
        }
        Flow::Continue
    }
}

/// The batch's keys, found before any of its requests runs, so the store starts loading
/// their index buckets and items at once (ADR 0038). Out of line: its key array is set up
/// only for a batch.
#[inline(never)]
fn prefetch_batch(ctx: &Ctx<'_>, buf: &[u8]) {
    let mut keys: [&[u8]; ringstore_store::PREFETCH_MAX] = [&[]; ringstore_store::PREFETCH_MAX];
    let n = ringstore_proto::memcache::scan::batch_keys(buf, &mut keys);
    if n > 1 {
        ctx.shared.store.prefetch(&keys[..n]);
    }
}

/// The latency histogram a text request counts in.
fn family(request: &Request<'_>) -> crate::latency::Family {
    use crate::latency::Family;
    match request {
        Request::Get(_) => Family::Get,
        Request::Store(_) | Request::TooLarge { .. } => Family::Set,
        Request::Delete { .. } => Family::Delete,
        Request::Arith { .. } => Family::Arith,
        Request::MetaGet(_)
        | Request::MetaSet(_)
        | Request::MetaDelete(_)
        | Request::MetaArith(_)
        | Request::MetaNoop
        | Request::MetaDebug { .. } => Family::Meta,
        _ => Family::Other,
    }
}

/// A `stats` reply (`req`: general, settings, items) as worker `worker` would answer it,
/// for `/metrics` (which maps those lines as memcached_exporter does).
pub(crate) fn stats_text(
    shared: &Shared,
    worker: usize,
    device: Option<&dyn Device>,
    now: Now,
    req: ringstore_proto::memcache::misc::StatsRequest,
    out: &mut Vec<u8>,
) {
    let cfd = std::cell::Cell::new(0);
    let ctx = Ctx {
        shared,
        worker,
        cfd: &cfd,
        stats: shared.stats(worker),
        now,
        device,
    };
    stats::stats(&ctx, out, req);
}

/// The reply to `request` (one whole request) when the transport cannot carry its real one
/// (memcache over UDP past its bound): `text` for a text request, a "Too large." frame
/// echoing a binary request's opcode and opaque.
pub fn reply_too_large(request: &[u8], text: &[u8], out: &mut Vec<u8>) {
    if request.first() == Some(&REQUEST_MAGIC) {
        response::error(out, binary_head(request), Status::TooLarge);
    } else {
        out.extend_from_slice(text);
    }
}

/// The opcode and opaque of the binary request at the head of `pending` (zeros while its
/// header is incomplete), for an error that answers it.
fn binary_head(pending: &[u8]) -> Head {
    match pending.get(..16) {
        Some(h) => Head {
            opcode: h[1],
            opaque: u32::from_be_bytes([h[12], h[13], h[14], h[15]]),
        },
        None => Head {
            opcode: 0,
            opaque: 0,
        },
    }
}
