//! HTTP/1.1 object API sessions: one connection's bytes in, responses out, in request order.
//!
//! Behaviour (the contract clients and tests rely on):
//! - Key = request path without its leading '/', percent-decoded, memcache key rules (400 otherwise).
//! - `PUT` needs `Content-Length` (411 without) or `Transfer-Encoding: chunked` (decoded, held to
//!   `item_size_max`); a declared length over the limit is 413 before any body byte is read.
//!   201 Created for a new key, 204 No Content for a replaced one; both carry the new `ETag`.
//!   TTL from `X-TTL`, else `Cache-Control: max-age`, both with memcache exptime rules (0 = never).
//! - `GET`/`HEAD`: 200 with `Content-Length`, `ETag: "<cas>"`, `X-Flags`; 404 when absent;
//!   `If-None-Match` → 304; one `Range` → 206, unsatisfiable → 416 `bytes */len`, several → 200.
//! - `DELETE`: 204, or 404. Other methods: 405 with `Allow`.
//! - Framing and head errors (400, 411, 413, 414, 417, 431, 501, 505) are answered with
//!   `Connection: close` and end the connection; 404, 405, 416, 304 keep it.
//! - HTTP/1.1 keeps the connection unless `Connection: close`; HTTP/1.0 closes unless
//!   `Connection: keep-alive` (answered with `Connection: keep-alive`).
//! - `Expect: 100-continue` on an acceptable PUT gets `100 Continue` first, always, so the
//!   output does not depend on how the request was split into reads.
//! - No `Date` field (a clock read and format per response); `Content-Length` on every
//!   response except 204 and 304, where RFC 9110 forbids or discourages it.
//! - A body on GET/HEAD/DELETE/other is read and dropped (up to `item_size_max`; longer or
//!   chunked ones are answered and the connection closed).
//! - Large objects (only with a data device, [`Backend::large`]): a PUT body over
//!   `item_size_max` (declared, or a chunked one that grows past it), up to `object_size_max`,
//!   is cut into chunks staged to the device one at a time; the runtime holds the connection
//!   (reads nothing more) until each is durable, so at most about one chunk of the body is in
//!   RAM. Once every chunk is durable the manifest (head + object id) is stored under the key
//!   and answered 201/204 like any PUT; a chunk that failed makes it a 500, device full a 507
//!   (and the connection closes, the rest of the body unread). A GET streams the body from
//!   the device a chunk at a time whenever the output is below its high-water mark; a chunk
//!   that cannot be read (device error, object replaced meanwhile) ends the connection, so
//!   the client sees a short body, never wrong bytes.

mod access;
#[cfg(test)]
mod access_tests;
mod backend;
mod direct;
mod hotkeys;
mod large;
#[cfg(test)]
mod large_tests;
mod reply;
mod request;
#[cfg(test)]
mod store_tests;
#[cfg(test)]
mod tests;
mod uploads;

pub use backend::{Backend, Event, LargeLimits, Object, PutOutcome, StoreBackend};
pub use uploads::{UploadLedger, UploadShare};

use ringstore_proto::http::{
    decode_key, write_empty, BodyFraming, ChunkError, ChunkedDecoder, ConnectionField, HeadScanner,
    KeyBuf, Limits, Method, RequestHead, Scan, Status, Version, CONTINUE,
};

use crate::budget::{Hold, IN_FREE, OUT_FREE};
use crate::device::Device;
use crate::held::HeldReplies;
use crate::{Flow, Now, Shared};

/// Capacity kept by an idle session's buffers; larger ones are released after use so a
/// connection that once sent a big PUT does not hold its memory forever.
const RETAINED_CAPACITY: usize = 16 * 1024;

/// One HTTP connection's protocol state. Sans-IO.
pub struct HttpSession {
    worker: usize,
    limits: Limits,
    /// Unconsumed input: a partial request, or requests left when output hit the high-water mark.
    pending: Vec<u8>,
    scanner: HeadScanner,
    state: State,
    /// Decoded chunked PUT body.
    chunked_body: Vec<u8>,
    /// Connection-memory reservation for buffered input beyond [`IN_FREE`].
    in_hold: Hold,
    /// Connection-memory reservation for pending output beyond [`crate::budget::OUT_FREE`].
    out_hold: Hold,
    /// Responses waiting for the data device.
    held: HeldReplies,
    /// The subject of the verified client certificate of a TLS connection (`--http-tokens`
    /// `subject:` lines): stands in for a bearer token.
    client: Option<Box<ringstore_tls::Subject>>,
    /// The peer's address: the client whose unfinished uploads are bounded together.
    peer: Option<std::net::IpAddr>,
    /// Requests answered in the current call, for the latency histograms.
    tally: crate::latency::Tally,
    /// PUT bodies may be received into the item (`direct.rs`): a connection's session.
    direct_on: bool,
}

/// A PUT whose head was accepted and whose body is being read.
struct PendingPut {
    key: KeyBuf,
    flags: u32,
    ttl: i64,
    connection: ConnectionField,
}

enum State {
    /// Waiting for a request head.
    Head,
    /// Reading a PUT body of a known length (kept contiguous in the input).
    PutLength { put: PendingPut, len: usize },
    /// Decoding a chunked PUT body into `chunked_body`.
    PutChunked {
        put: PendingPut,
        decoder: ChunkedDecoder,
    },
    /// Dropping the body of a request already answered.
    Discard { left: u64 },
    /// Receiving a PUT body straight into its reserved item (`direct.rs`).
    PutDirect(Box<direct::PutDirect>),
    /// Streaming a PUT body over `item_size_max` to the data device.
    PutLarge(Box<large::LargePut>),
    /// Sending a large object's body from the data device.
    Stream {
        stream: reply::Stream,
        connection: ConnectionField,
    },
    /// The last response is written; nothing more is read.
    Closed,
}

/// What processing one request did.
enum Step {
    /// Consumed up to this position; keep going.
    Next(usize),
    /// Need more input; keep everything from this position.
    Wait(usize),
    Drain(usize),
    Close,
}

impl HttpSession {
    pub fn new(worker: usize) -> HttpSession {
        HttpSession {
            worker,
            limits: Limits::DEFAULT,
            pending: Vec::new(),
            scanner: HeadScanner::new(),
            state: State::Head,
            chunked_body: Vec::new(),
            in_hold: Hold::default(),
            out_hold: Hold::default(),
            held: HeldReplies::default(),
            client: None,
            peer: None,
            tally: crate::latency::Tally::default(),
            direct_on: false,
        }
    }

    /// The connection's peer, told once after it opened.
    pub fn peer_known(&mut self, peer: std::net::IpAddr) {
        self.peer = Some(peer);
    }

    /// The TLS layer verified the client certificate `der` (against `--tls-ca`): its subject
    /// may stand in for a bearer token. A certificate whose subject cannot be read maps to
    /// no line.
    pub fn client_certificate(&mut self, der: &[u8]) {
        self.client = ringstore_tls::Subject::from_certificate(der).map(Box::new);
    }

    /// True while a response waits for the data device.
    pub fn awaits_durable(&self) -> bool {
        self.held.is_holding()
    }

    /// The runtime settled `token`, one this session staged: a large upload in progress
    /// learns whether its chunk reached the device; responses now complete go to `out`.
    /// Returns the bytes added to `out`.
    pub fn on_durable(&mut self, token: u64, ok: bool, out: &mut Vec<u8>) -> usize {
        if !ok {
            if let State::PutLarge(large) = &mut self.state {
                large.on_chunk_failed(token);
            }
        }
        let failure = crate::durable_failure_reply(crate::Protocol::Http);
        self.held.on_durable(token, ok, out, failure)
    }

    /// Every pending output byte was sent: the output reservation goes back.
    pub fn on_output_flushed(&mut self) {
        self.out_hold.release();
    }

    /// The worker this session runs on.
    pub fn worker(&self) -> usize {
        self.worker
    }

    /// Consumes `input` (empty to resume after [`Flow::Drain`]), appends responses to `out`.
    pub fn on_bytes(
        &mut self,
        input: &[u8],
        now: Now,
        shared: &Shared,
        device: Option<&dyn Device>,
        out: &mut Vec<u8>,
    ) -> Flow {
        let backend = StoreBackend::of(shared, self.worker, device);
        let out_start = out.len();
        self.tally.begin(&shared.metrics.latency, now);
        let flow = self.on_bytes_with(input, now, &backend, out);
        if let Some(stats) = backend.stats {
            stats.bytes_read.add(input.len() as u64);
            stats.bytes_written.add((out.len() - out_start) as u64);
        }
        let partial = self.has_partial_request();
        self.tally
            .end(&shared.metrics.latency, self.worker, partial);
        flow
    }

    /// True while part of a request (or unprocessed pipelined input) is buffered.
    ///
    /// A large PUT or GET in progress is not partial: it moves in chunk-sized steps and may
    /// take longer than a request is allowed to; the idle timeout still ends a stalled GET. A
    /// large PUT is partial while its body is short of its progress window
    /// ([`large::LARGE_PUT_MIN_PROGRESS`]), so the request timeout cuts a stalled upload.
    pub fn has_partial_request(&self) -> bool {
        !self.pending.is_empty()
            || matches!(
                self.state,
                State::PutLength { .. }
                    | State::PutDirect(_)
                    | State::PutChunked { .. }
                    | State::Discard { .. }
            )
            || matches!(&self.state, State::PutLarge(l) if l.short_of_progress())
    }

    /// [`HttpSession::on_bytes`] against any [`Backend`].
    pub fn on_bytes_with<B: Backend>(
        &mut self,
        input: &[u8],
        now: Now,
        backend: &B,
        out: &mut Vec<u8>,
    ) -> Flow {
        if matches!(self.state, State::Closed) {
            return Flow::Close;
        }
        if let Some(budget) = backend.conn_memory() {
            // What is still pending from earlier calls keeps its reservation; the rest goes back.
            let keep = self
                .out_hold
                .bytes()
                .min(out.len().saturating_sub(OUT_FREE));
            let _ = self.out_hold.set(budget, keep);
        }
        let flow = self.buffer_and_process(input, now, backend, out);
        if flow == Flow::Close {
            self.in_hold.release();
            return flow;
        }
        self.hold_input(backend, out, flow)
    }

    /// Keeps the input reservation equal to what the session buffers beyond [`IN_FREE`]
    /// (for a body of known length, the whole body from its head on); without room the
    /// request is answered 503 and the connection closes.
    fn hold_input<B: Backend>(&mut self, backend: &B, out: &mut Vec<u8>, flow: Flow) -> Flow {
        let Some(budget) = backend.conn_memory() else {
            return flow;
        };
        let body = match &self.state {
            State::PutLength { len, .. } => *len,
            State::PutLarge(_) => backend.large().map_or(0, |l| l.chunk_len),
            State::Stream { stream, .. } => stream.manifest.chunk_len as usize,
            _ => 0,
        };
        let want = (self.pending.len().max(body) + self.chunked_body.len()).saturating_sub(IN_FREE);
        if self.in_hold.set(budget, want) {
            return flow;
        }
        self.in_hold.release();
        self.pending = Vec::new();
        self.chunked_body = Vec::new();
        self.state = State::Closed;
        backend.record(self.worker, Event::Response(Status::ServiceUnavailable));
        self.held.write(out, |out| {
            write_empty(out, Status::ServiceUnavailable, ConnectionField::Close)
        });
        Flow::Close
    }

    fn buffer_and_process<B: Backend>(
        &mut self,
        input: &[u8],
        now: Now,
        backend: &B,
        out: &mut Vec<u8>,
    ) -> Flow {
        if self.pending.is_empty() {
            // Fast path: parse straight from the runtime's buffer, keep only a remainder.
            let (used, flow) = self.process(input, now, backend, out);
            if flow != Flow::Close {
                let rest = &input[used..];
                if let State::PutLength { len, .. } = &self.state {
                    // The body is coming: buffer it once, at its final size.
                    self.pending.reserve_exact((*len).max(rest.len()));
                }
                self.pending.extend_from_slice(rest);
            }
            return flow;
        }
        self.pending.extend_from_slice(input);
        let pending = std::mem::take(&mut self.pending);
        let (used, flow) = self.process(&pending, now, backend, out);
        self.pending = pending;
        if flow == Flow::Close {
            self.pending = Vec::new();
        } else {
            self.pending.drain(..used);
            if self.pending.is_empty() && self.pending.capacity() > RETAINED_CAPACITY {
                self.pending = Vec::new();
            }
        }
        flow
    }

    /// Runs every complete request in `data`; returns the bytes consumed and the flow.
    fn process<B: Backend>(
        &mut self,
        data: &[u8],
        now: Now,
        backend: &B,
        out: &mut Vec<u8>,
    ) -> (usize, Flow) {
        let mut held = std::mem::take(&mut self.held);
        let done = self.process_held(data, now, backend, out, &mut held);
        self.held = held;
        done
    }

    /// [`HttpSession::process`], with the held responses taken out of the session so each
    /// step can write into them.
    fn process_held<B: Backend>(
        &mut self,
        data: &[u8],
        now: Now,
        backend: &B,
        real_out: &mut Vec<u8>,
        held: &mut HeldReplies,
    ) -> (usize, Flow) {
        let mut pos = 0;
        let staged = || backend.device().map_or(0, |d| d.staged());
        loop {
            // A response to a request that staged records waits for the device, and every
            // later one waits behind it.
            let mark = held.begin(real_out, staged());
            if real_out.len() + held.len() > backend.out_high_water() && mark.held {
                return (pos, Flow::Drain);
            }
            let out = if mark.held {
                held.buf()
            } else {
                &mut *real_out
            };
            let step = match &mut self.state {
                State::Closed => Step::Close,
                State::Head => self.next_head(data, pos, now, backend, out),
                State::Discard { left } => {
                    let take = usize::try_from(*left)
                        .unwrap_or(usize::MAX)
                        .min(data.len() - pos);
                    *left -= take as u64;
                    if *left == 0 {
                        self.state = State::Head;
                        Step::Next(pos + take)
                    } else {
                        Step::Wait(pos + take)
                    }
                }
                State::PutLength { len, .. } => {
                    let len = *len;
                    let here = data.len() - pos;
                    if here < len && self.start_direct((len, here), mark.held, now, backend) {
                        self.direct_step(data, pos, now, backend, out)
                    } else if here < len {
                        Step::Wait(pos)
                    } else {
                        let State::PutLength { put, .. } =
                            std::mem::replace(&mut self.state, State::Head)
                        else {
                            unreachable!("matched above")
                        };
                        self.finish_put(&put, &data[pos..pos + len], now, backend, out);
                        Step::Next(pos + len)
                    }
                }
                State::PutDirect(_) => self.direct_step(data, pos, now, backend, out),
                State::PutLarge(_) => self.feed_large(data, pos, now, backend, out),
                State::Stream { .. } => self.stream_step(pos, backend, out),
                State::PutChunked { .. } => self.chunked_step(data, pos, now, backend, out),
            };
            held.end(mark, real_out, staged());
            match step {
                Step::Next(at) => pos = at,
                Step::Wait(at) => return (at, Flow::Continue),
                Step::Drain(at) => return (at, Flow::Drain),
                Step::Close => {
                    self.state = State::Closed;
                    return (data.len(), Flow::Close);
                }
            }
        }
    }

    /// One step of a chunked PUT body: decoded into `chunked_body`, gone large past the item
    /// limit (with a data device), or stored once the last chunk arrived.
    fn chunked_step<B: Backend>(
        &mut self,
        data: &[u8],
        pos: usize,
        now: Now,
        backend: &B,
        out: &mut Vec<u8>,
    ) -> Step {
        let State::PutChunked { decoder, .. } = &mut self.state else {
            unreachable!("called in the PutChunked state")
        };
        let large = backend.large().zip(backend.device());
        let max = large.map_or(backend.item_size_max() as u64, |(l, _)| l.object_size_max);
        match decoder.decode(&data[pos..], Some(&mut self.chunked_body), max) {
            Err(e) => {
                let status = match e {
                    ChunkError::TooLarge => Status::PayloadTooLarge,
                    ChunkError::Malformed => Status::BadRequest,
                };
                backend.record(self.worker, Event::Response(status));
                write_empty(out, status, ConnectionField::Close);
                Step::Close
            }
            Ok(used) if large.is_some() && self.chunked_body.len() > backend.item_size_max() => {
                if let Some((limits, device)) = large {
                    self.go_large_chunked(limits, device, backend);
                }
                Step::Next(pos + used)
            }
            Ok(used) if decoder.is_done() => {
                let State::PutChunked { put, .. } = std::mem::replace(&mut self.state, State::Head)
                else {
                    unreachable!("matched above")
                };
                let body = std::mem::take(&mut self.chunked_body);
                self.finish_put(&put, &body, now, backend, out);
                self.chunked_body = body;
                self.chunked_body.clear();
                if self.chunked_body.capacity() > RETAINED_CAPACITY {
                    self.chunked_body = Vec::new();
                }
                Step::Next(pos + used)
            }
            Ok(used) => Step::Wait(pos + used),
        }
    }
}
