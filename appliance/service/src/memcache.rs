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
//! with the exptime rules in [`expiry`].

mod admin;
mod arith;
#[cfg(test)]
mod bound_tests;
pub mod expiry;
mod get;
mod meta;
mod stats;
mod storage;
#[cfg(test)]
mod tests;

use ringstore_proto::memcache::{parse, reply, Limits, Parse, Request, OUT_OF_MEMORY, TOO_LARGE};

use crate::budget::{Hold, IN_FREE, OUT_FREE};
use crate::{Flow, Now, Shared, WorkerStats};

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
    pub stats: &'s WorkerStats,
    pub now: Now,
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
    /// Length of the storage request whose data block is arriving (0: none).
    awaiting: usize,
    /// Connection-memory reservation for `pending` beyond [`IN_FREE`].
    in_hold: Hold,
    /// Connection-memory reservation for pending output beyond [`OUT_FREE`].
    out_hold: Hold,
}

impl MemcacheSession {
    pub fn new(worker: usize) -> MemcacheSession {
        MemcacheSession {
            worker,
            pending: Vec::new(),
            swallow: 0,
            get_cursor: 0,
            awaiting: 0,
            in_hold: Hold::default(),
            out_hold: Hold::default(),
        }
    }

    /// The runtime sent every pending output byte: the output reservation goes back.
    pub fn on_output_flushed(&mut self) {
        self.out_hold.release();
    }

    /// See [`crate::Session::on_bytes`].
    pub fn on_bytes(&mut self, input: &[u8], now: Now, shared: &Shared, out: &mut Vec<u8>) -> Flow {
        let stats = shared.stats(self.worker);
        stats.bytes_read.add(input.len() as u64);
        let out_start = out.len();
        // What is still pending from earlier calls keeps its reservation; the rest goes back.
        let _ = self.out_hold.set(
            &shared.conn_memory,
            self.out_hold
                .bytes()
                .min(out.len().saturating_sub(OUT_FREE)),
        );
        let ctx = Ctx { shared, stats, now };
        let mut flow = if self.pending.is_empty() {
            let (used, flow) = self.run(input, &ctx, out);
            if flow != Flow::Close {
                let rest = &input[used..];
                if self.awaiting > rest.len() {
                    // The data block is coming: buffer it once, at its final size.
                    self.pending.reserve_exact(self.awaiting);
                }
                self.pending.extend_from_slice(rest);
            }
            flow
        } else {
            let mut buf = std::mem::take(&mut self.pending);
            buf.extend_from_slice(input);
            let (used, flow) = self.run(&buf, &ctx, out);
            buf.drain(..used);
            self.pending = buf;
            flow
        };
        if flow != Flow::Close {
            flow = self.hold_input(shared, out, flow);
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
        self.pending.clear();
        reply::line(out, OUT_OF_MEMORY_READING);
        Flow::Close
    }

    /// True while part of a request is buffered or a refused value is being swallowed.
    ///
    /// A paused get is not partial: its request is whole and what it waits for is the client
    /// reading, which the idle timeout bounds (every send that makes progress counts as
    /// activity, so a slow reader is served and one that never reads is cut).
    pub fn has_partial_request(&self) -> bool {
        (!self.pending.is_empty() && self.get_cursor == 0) || self.swallow > 0
    }

    /// Parses and executes requests from `buf`; returns the bytes used and the next step.
    fn run(&mut self, buf: &[u8], ctx: &Ctx<'_>, out: &mut Vec<u8>) -> (usize, Flow) {
        let limits = Limits {
            item_size_max: ctx.shared.config.item_size_max,
            max_line: ctx.shared.config.max_line,
        };
        let high_water = ctx.shared.config.out_high_water;
        let mut pos = 0;
        self.awaiting = 0;
        loop {
            if self.swallow > 0 {
                let n = self.swallow.min(buf.len() - pos);
                pos += n;
                self.swallow -= n;
                if self.swallow > 0 {
                    return (pos, Flow::Continue);
                }
            }
            if pos == buf.len() {
                return (pos, Flow::Continue);
            }
            if out.len() > high_water {
                return (pos, Flow::Drain);
            }
            match parse(&buf[pos..], &limits) {
                Parse::Incomplete => return (pos, Flow::Continue),
                Parse::AwaitingValue {
                    request_len,
                    line_len,
                    key,
                    remove_old,
                    noreply,
                } => {
                    let room = request_len.max(buf.len() - pos).saturating_sub(IN_FREE);
                    if self.in_hold.set(&ctx.shared.conn_memory, room) {
                        self.awaiting = request_len;
                        return (pos, Flow::Continue);
                    }
                    // No room to buffer the block: refuse it before reading it, and swallow it.
                    storage::refuse_value(ctx, out, key, remove_old, noreply, OUT_OF_MEMORY);
                    pos += line_len;
                    self.swallow = request_len - line_len;
                }
                Parse::Close { reply: line } => {
                    if let Some(line) = line {
                        reply::line(out, line);
                    }
                    return (buf.len(), Flow::Close);
                }
                Parse::Done { request, consumed } => {
                    // With a data device, each reply's bytes are noted so a failed write can be answered with an error.
                    let journal = ctx.shared.store.journal();
                    let mark = journal.map(|j| (j.staged(), out.len()));
                    let flow = self.execute(request, ctx, out);
                    if let (Some(j), Some((since, start))) = (journal, mark) {
                        j.reply_span(since, start, out.len());
                    }
                    match flow {
                        Flow::Close => return (buf.len(), Flow::Close),
                        // A paused get: it stays unconsumed at the head of the input.
                        Flow::Drain => return (pos, Flow::Drain),
                        Flow::Continue => pos += consumed,
                    }
                }
            }
        }
    }

    fn execute(&mut self, request: Request<'_>, ctx: &Ctx<'_>, out: &mut Vec<u8>) -> Flow {
        match request {
            Request::Get(g) => match get::get(ctx, out, &mut self.out_hold, g, self.get_cursor) {
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
            Request::Verbosity { noreply } => {
                if !noreply {
                    reply::line(out, "OK");
                }
            }
            Request::Quit => return Flow::Close,
            Request::MetaGet(m) => meta::mg(ctx, out, &mut self.out_hold, &m),
            Request::MetaSet(m) => meta::ms(ctx, out, &m),
            Request::MetaDelete(m) => meta::md(ctx, out, &m),
            Request::MetaArith(m) => meta::ma(ctx, out, &m),
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
