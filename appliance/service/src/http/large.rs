//! Large objects over HTTP: a PUT body streamed to the data device chunk by chunk, and a GET
//! body streamed back from it, each with at most about one chunk of the object in RAM.
//!
//! Order on the device (why a torn object is never served): the chunks are staged one after
//! another, each a record with its own token; the session waits after each call that staged
//! one until the runtime reported its tokens settled ([`crate::Session::on_durable`], which
//! also says whether each was made durable); the manifest, which is what makes the object
//! visible, is staged only in a later call, after the last chunk is durable and none failed.
//! A crash before the manifest is durable leaves only unreferenced chunks, which recovery
//! drops.

use ringstore_durable::units::usize_from;
use ringstore_durable::{Manifest, MANIFEST_HEAD_MAX};
use ringstore_proto::http::{write_empty, ChunkError, ChunkedDecoder, ConnectionField, Status};

use super::backend::{Backend, Event, LargeLimits};
use super::{reply, HttpSession, PendingPut, State, Step, UploadShare};
use crate::device::Device;
use crate::Now;

/// The upload `large` ended without a manifest: its staged chunks are garbage.
fn abandon<B: Backend>(backend: &B, large: &LargePut) {
    if let Some(device) = backend.device() {
        device.abandon_object(large.object, large.next_index);
    }
}

/// Body bytes a large PUT must move within each `--request-timeout` window (default 10 s,
/// so at least 25.6 KiB/s): its chunks hold device space, so one that stalls is cut at the
/// request timeout like a slow request head, not left for the idle timeout (ADR 0013).
pub const LARGE_PUT_MIN_PROGRESS: u64 = 256 << 10;

/// A PUT whose body is larger than `item_size_max`.
pub(super) struct LargePut {
    put: PendingPut,
    object: u64,
    limits: LargeLimits,
    /// Content-Length framing: body bytes still to read.
    left: Option<u64>,
    /// Chunked framing: the decoder (the body ends when it is done).
    decoder: Option<ChunkedDecoder>,
    /// Body bytes read so far.
    received: u64,
    /// Index of the next chunk to stage.
    next_index: u32,
    /// Body bytes not yet staged: less than one chunk between calls (plus one read's worth
    /// while a chunked body is decoded).
    buf: Vec<u8>,
    /// The object's first bytes, kept in RAM in its manifest.
    head: Vec<u8>,
    /// Every chunk is staged; the next call (after they are durable) publishes the manifest.
    committing: bool,
    /// Body bytes read in the current progress window (see [`LARGE_PUT_MIN_PROGRESS`]).
    window: u64,
    /// The device's newest token when the upload began: later ones of this connection
    /// settled while it runs are its chunks.
    tokens_after: u64,
    /// A chunk failed to reach the device: the PUT is answered 500 and nothing is published.
    chunk_failed: bool,
    /// What this upload holds of the device among the server's unfinished uploads; given
    /// back when the upload ends (dropped with it).
    share: Option<UploadShare>,
}

impl LargePut {
    /// A large PUT on `device` (the backend's, which every large upload has).
    pub(super) fn new(
        put: PendingPut,
        device: &dyn Device,
        limits: LargeLimits,
        content_length: Option<u64>,
        share: Option<UploadShare>,
    ) -> LargePut {
        LargePut {
            share,
            put,
            object: device.new_object_id(),
            tokens_after: device.staged(),
            chunk_failed: false,
            limits,
            left: content_length,
            decoder: None,
            received: 0,
            next_index: 0,
            buf: Vec::new(),
            head: Vec::new(),
            committing: false,
            window: 0,
        }
    }

    /// The runtime reported `token` failed (its write or flush did not reach the device).
    pub(super) fn on_chunk_failed(&mut self, token: u64) {
        if token > self.tokens_after {
            self.chunk_failed = true;
        }
    }

    /// True while the body has moved fewer than [`LARGE_PUT_MIN_PROGRESS`] bytes since the
    /// window began: the session then reports a partial request, so the runtime's request
    /// timeout, counted from the first call that saw the window short, cuts a stalled upload
    /// (and its chunks are abandoned on close). Each window that reaches the mark clears
    /// the runtime's clock; the next call starts a new window.
    pub(super) fn short_of_progress(&self) -> bool {
        !self.committing
            && self.left != Some(0)
            && !self.decoder.as_ref().is_some_and(ChunkedDecoder::is_done)
            && self.window < LARGE_PUT_MIN_PROGRESS
    }
}

impl HttpSession {
    /// A place among the server's unfinished uploads for an upload starting now.
    pub(super) fn upload_share<B: Backend>(&self, backend: &B) -> Option<UploadShare> {
        backend.uploads().map(|l| l.open(self.peer, self.worker))
    }

    /// A chunked PUT body just grew past `item_size_max`: continue it as a large object.
    pub(super) fn go_large_chunked<B: Backend>(
        &mut self,
        limits: LargeLimits,
        device: &dyn Device,
        backend: &B,
    ) {
        let State::PutChunked { put, decoder } = std::mem::replace(&mut self.state, State::Head)
        else {
            unreachable!("called in the PutChunked state")
        };
        let share = self.upload_share(backend);
        let mut large = LargePut::new(put, device, limits, None, share);
        large.received = self.chunked_body.len() as u64;
        large.buf = std::mem::take(&mut self.chunked_body);
        large.decoder = Some(decoder);
        self.state = State::PutLarge(Box::new(large));
    }

    /// Takes body bytes from `data[pos..]` and stages every full chunk.
    pub(super) fn feed_large<B: Backend>(
        &mut self,
        data: &[u8],
        pos: usize,
        now: Now,
        backend: &B,
        out: &mut Vec<u8>,
    ) -> Step {
        let State::PutLarge(large) = &mut self.state else {
            unreachable!("called in the PutLarge state")
        };
        if large.committing {
            return self.commit_large(pos, now, backend, out);
        }
        let avail = &data[pos..];
        let before = large.buf.len();
        let (used, done) = match (&mut large.decoder, large.left) {
            (Some(decoder), _) => {
                match decoder.decode(avail, Some(&mut large.buf), large.limits.object_size_max) {
                    Ok(used) => (used, decoder.is_done()),
                    Err(e) => {
                        abandon(backend, large);
                        let status = match e {
                            ChunkError::TooLarge => Status::PayloadTooLarge,
                            ChunkError::Malformed => Status::BadRequest,
                        };
                        return self.fail(backend, out, status);
                    }
                }
            }
            (None, Some(left)) => {
                let take = usize::try_from(left).unwrap_or(usize::MAX).min(avail.len());
                large.buf.extend_from_slice(&avail[..take]);
                large.left = Some(left - take as u64);
                (take, left == take as u64)
            }
            (None, None) => unreachable!("a large PUT has a length or a decoder"),
        };
        large.received += (large.buf.len() - before) as u64;
        if large.window >= LARGE_PUT_MIN_PROGRESS {
            large.window = 0;
        }
        large.window += used as u64;
        let chunk_len = large.limits.chunk_len;
        let mut staged = false;
        while large.buf.len() >= chunk_len || (done && !large.buf.is_empty()) {
            let n = large.buf.len().min(chunk_len);
            if large.next_index == 0 {
                large.head = large.buf[..n.min(MANIFEST_HEAD_MAX)].to_vec();
            }
            // Within what unfinished uploads may hold (`uploads.rs`), then room on the device.
            let allowed = large
                .share
                .as_mut()
                .is_none_or(|s| s.take(n as u64, large.limits.region_len));
            let accepted = allowed
                && backend.device().is_some_and(|d| {
                    d.stage_chunk(large.object, large.next_index, &large.buf[..n])
                        .is_ok()
                });
            if !accepted {
                // Device full (or refused): the rest of the body is not worth reading.
                abandon(backend, large);
                return self.fail(backend, out, Status::InsufficientStorage);
            }
            large.buf.drain(..n);
            large.next_index += 1;
            staged = true;
        }
        let pos = pos + used;
        match (done, staged) {
            // Resumed (Flow::Drain) once what was staged is durable.
            (true, true) => {
                large.committing = true;
                Step::Drain(pos)
            }
            // Everything was staged by earlier calls, each held until durable.
            (true, false) => self.commit_large(pos, now, backend, out),
            (false, true) => Step::Drain(pos),
            (false, false) => Step::Wait(pos),
        }
    }

    /// Every chunk is durable: publish the manifest and answer the PUT.
    fn commit_large<B: Backend>(
        &mut self,
        pos: usize,
        now: Now,
        backend: &B,
        out: &mut Vec<u8>,
    ) -> Step {
        let State::PutLarge(large) = std::mem::replace(&mut self.state, State::Head) else {
            unreachable!("called in the PutLarge state")
        };
        let connection = large.put.connection;
        let status = if large.chunk_failed {
            abandon(backend, &large);
            write_empty(out, Status::InternalError, connection);
            Status::InternalError
        } else {
            let manifest = Manifest {
                object: large.object,
                len: large.received,
                chunk_len: u32::try_from(large.limits.chunk_len).unwrap_or(u32::MAX),
                head: large.head,
            };
            let outcome = backend.put_large(
                large.put.key.as_bytes(),
                &manifest.encode(),
                large.put.flags,
                large.put.ttl,
                now,
            );
            reply::answer_put(outcome, connection, out)
        };
        backend.record(self.worker, Event::Set);
        self.tally.note(crate::latency::Family::HttpPut);
        backend.record(self.worker, Event::Response(status));
        if connection == ConnectionField::Close {
            self.state = State::Closed;
            return Step::Close;
        }
        Step::Next(pos)
    }

    /// The connection is gone: an upload in progress will never get its manifest.
    pub fn on_close<B: Backend>(&mut self, backend: &B) {
        self.abandon_direct(backend);
        if let State::PutLarge(large) = &self.state {
            abandon(backend, large);
        }
        self.state = State::Closed;
    }

    /// Appends the next part of a large object's body while the output is below its
    /// high-water mark; `pos` is where the next request's bytes start.
    pub(super) fn stream_step<B: Backend>(
        &mut self,
        pos: usize,
        backend: &B,
        out: &mut Vec<u8>,
    ) -> Step {
        let State::Stream { stream, connection } = &mut self.state else {
            unreachable!("called in the Stream state")
        };
        let m = &stream.manifest;
        while stream.next < stream.end {
            if out.len() > backend.out_high_water() {
                return Step::Drain(pos);
            }
            let head_len = m.head.len() as u64;
            if stream.next < head_len {
                let to = stream.end.min(head_len);
                out.extend_from_slice(&m.head[usize_from(stream.next)..usize_from(to)]);
                stream.next = to;
                continue;
            }
            let index = u32::try_from(stream.next / u64::from(m.chunk_len)).unwrap_or(u32::MAX);
            let (start, stop) = m.chunk_range(index);
            let to = stream.end.min(stop);
            let (from, upto) = (usize_from(stream.next - start), usize_from(to - start));
            // The whole chunk: one read, verified by the record's crc. Part of it (a range, or
            // the rest of the first chunk after the head): only the pieces that part covers,
            // each verified by its own crc.
            let part = if stream.next == start && to == stop {
                backend
                    .device()
                    .and_then(|d| d.read_chunk(m.object, index))
                    .filter(|c| c.len() as u64 == stop - start)
            } else {
                backend
                    .device()
                    .and_then(|d| d.read_chunk_range(m.object, index, from, upto))
                    .filter(|c| c.len() == upto - from)
            };
            let Some(part) = part else {
                // Replaced meanwhile, or unreadable: end the connection mid-body, so the
                // client sees a short body and never wrong bytes.
                return Step::Close;
            };
            out.extend_from_slice(&part);
            stream.next = to;
        }
        let close = *connection == ConnectionField::Close;
        self.state = State::Head;
        if close {
            Step::Close
        } else {
            Step::Next(pos)
        }
    }
}
