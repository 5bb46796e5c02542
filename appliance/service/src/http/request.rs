//! Starting a request from its parsed head: routing by method, the PUT body's framing and
//! budget, and answering a PUT whose body arrived whole.

use super::*;
use crate::latency::Family;
use ringstore_proto::http::HeadWriter;

impl HttpSession {
    /// Parses and answers (or starts) the request at `data[pos..]`.
    pub(super) fn next_head<B: Backend>(
        &mut self,
        data: &[u8],
        mut pos: usize,
        now: Now,
        backend: &B,
        out: &mut Vec<u8>,
    ) -> Step {
        if out.len() > backend.out_high_water() {
            return Step::Drain(pos);
        }
        if !self.scanner.started() {
            pos += ringstore_proto::http::skip_empty_lines(&data[pos..]);
            if matches!(&data[pos..], b"" | b"\r") {
                return Step::Wait(pos);
            }
        }
        let rest = &data[pos..];
        let head_len = match self.scanner.scan(rest, &self.limits) {
            Ok(Scan::Partial) => return Step::Wait(pos),
            Ok(Scan::Complete(n)) => n,
            Err(e) => return self.fail(backend, out, e.status()),
        };
        self.scanner.reset();
        let head = match RequestHead::parse(&rest[..head_len]) {
            Ok(head) => head,
            Err(e) => return self.fail(backend, out, e.status()),
        };
        pos += head_len;
        if head.target == crate::metrics::PATH && matches!(head.method, Method::Get | Method::Head)
        {
            let open_metrics = crate::metrics::wants_open_metrics(&rest[..head_len]);
            if let Some(step) = self.metrics(&head, open_metrics, pos, now, backend, out) {
                return step;
            }
        }
        self.start_request(&head, pos, now, backend, out)
    }

    fn start_request<B: Backend>(
        &mut self,
        head: &RequestHead<'_>,
        pos: usize,
        now: Now,
        backend: &B,
        out: &mut Vec<u8>,
    ) -> Step {
        let max = backend.item_size_max();
        let mut key = KeyBuf::default();
        if head.method != Method::Other && decode_key(head.target, &mut key).is_err() {
            return self.fail(backend, out, Status::BadRequest);
        }
        if key.as_bytes() == hotkeys::PATH_KEY {
            return self.hot_keys(head, pos, now, backend, out);
        }
        if let Err(status) =
            access::check(backend, head, key.as_bytes(), self.client.as_deref(), now)
        {
            return self.refuse_access(backend, head, pos, out, status);
        }
        if matches!(head.method, Method::Get | Method::Head | Method::Put) {
            backend.count_key(self.worker, key.as_bytes());
        }
        if head.method == Method::Put {
            return self.start_put(head, key, pos, backend, out);
        }
        // Any other request is answered now; a body it carries is dropped afterwards.
        let (keep_alive, discard) = match head.body {
            BodyFraming::None => (head.keep_alive, 0),
            BodyFraming::Length(n) if n <= max as u64 => (head.keep_alive, n),
            BodyFraming::Length(_) | BodyFraming::Chunked => (false, 0),
        };
        let connection = connection_field(keep_alive, head.version);
        match head.method {
            Method::Get | Method::Head => {
                let (status, stream) = reply::get(
                    backend,
                    key.as_bytes(),
                    head,
                    head.method == Method::Get,
                    connection,
                    now,
                    out,
                    &mut self.in_hold,
                    &mut self.out_hold,
                );
                backend.record(
                    self.worker,
                    Event::Get {
                        hit: status != Status::NotFound,
                    },
                );
                self.tally.note(Family::HttpGet);
                backend.record(self.worker, Event::Response(status));
                if let Some(stream) = stream {
                    // A body to drop after a streamed one is not worth the state: close instead.
                    let connection = if discard > 0 {
                        ConnectionField::Close
                    } else {
                        connection
                    };
                    self.state = State::Stream { stream, connection };
                    return Step::Next(pos);
                }
            }
            Method::Delete => {
                let status = reply::delete(backend, key.as_bytes(), connection, now, out);
                backend.record(
                    self.worker,
                    Event::Delete {
                        hit: status != Status::NotFound,
                    },
                );
                self.tally.note(Family::HttpDelete);
                backend.record(self.worker, Event::Response(status));
            }
            Method::Put | Method::Other => {
                write_empty(out, Status::MethodNotAllowed, connection);
                backend.record(self.worker, Event::Response(Status::MethodNotAllowed));
            }
        }
        if !keep_alive {
            return Step::Close;
        }
        if discard > 0 {
            self.state = State::Discard { left: discard };
        }
        Step::Next(pos)
    }

    fn start_put<B: Backend>(
        &mut self,
        head: &RequestHead<'_>,
        key: KeyBuf,
        pos: usize,
        backend: &B,
        out: &mut Vec<u8>,
    ) -> Step {
        let max = backend.item_size_max();
        if let (BodyFraming::Length(n), Some(budget)) = (head.body, backend.conn_memory()) {
            // Reserve a body of known size (or, for a large object, the one chunk buffered
            // at a time) before reading it, as memcached reserves a value when its command
            // line arrives; the reservation is then kept by `hold_input`.
            let len = usize::try_from(n).unwrap_or(usize::MAX);
            let buffered = if len <= max {
                len
            } else {
                backend.large().map_or(0, |l| l.chunk_len)
            };
            if !self.in_hold.set(budget, buffered.saturating_sub(IN_FREE)) {
                return self.fail(backend, out, Status::ServiceUnavailable);
            }
        }
        let put = PendingPut {
            key,
            flags: head.flags.unwrap_or(0),
            ttl: head.ttl.unwrap_or(0),
            connection: connection_field(head.keep_alive, head.version),
        };
        self.state = match head.body {
            BodyFraming::None => return self.fail(backend, out, Status::LengthRequired),
            BodyFraming::Length(n) => {
                match (usize::try_from(n), backend.large().zip(backend.device())) {
                    (Ok(len), _) if len <= max => State::PutLength { put, len },
                    (_, Some((limits, device))) if n <= limits.object_size_max => {
                        let share = self.upload_share(backend);
                        State::PutLarge(Box::new(large::LargePut::new(
                            put,
                            device,
                            limits,
                            Some(n),
                            share,
                        )))
                    }
                    _ => return self.fail(backend, out, Status::PayloadTooLarge),
                }
            }
            BodyFraming::Chunked => State::PutChunked {
                put,
                decoder: ChunkedDecoder::new(),
            },
        };
        if head.expect_continue {
            out.extend_from_slice(CONTINUE);
        }
        Step::Next(pos)
    }

    pub(super) fn finish_put<B: Backend>(
        &mut self,
        put: &PendingPut,
        value: &[u8],
        now: Now,
        backend: &B,
        out: &mut Vec<u8>,
    ) {
        let status = reply::put(backend, put, value, now, out);
        self.put_answered(put, status, backend);
    }

    /// PUT `put` was answered with `status`: counted, and the connection closed after it
    /// when the request asked (both ways a body arrives: buffered, or into the item).
    pub(super) fn put_answered<B: Backend>(
        &mut self,
        put: &PendingPut,
        status: Status,
        backend: &B,
    ) {
        backend.record(self.worker, Event::Set);
        self.tally.note(Family::HttpPut);
        backend.record(self.worker, Event::Response(status));
        if put.connection == ConnectionField::Close {
            self.state = State::Closed;
        }
    }
}

/// Bytes of the metrics reply's head (status, `Server`, `Content-Type`, `Content-Length`,
/// `Connection`), at most.
const METRICS_HEAD_ROOM: usize = 256;

impl HttpSession {
    /// `GET /metrics` (or HEAD): the exposition, after the token check; `None` when the
    /// backend has no metrics (a key named `metrics`, as in unit tests).
    fn metrics<B: Backend>(
        &mut self,
        head: &RequestHead<'_>,
        open_metrics: bool,
        pos: usize,
        now: Now,
        backend: &B,
        out: &mut Vec<u8>,
    ) -> Option<Step> {
        if let Err(status) = access::check_metrics(backend, head, self.client.as_deref(), now) {
            return Some(self.refuse_access(backend, head, pos, out, status));
        }
        if !matches!(head.body, BodyFraming::None) {
            // A scrape carries no body; one that does is not worth skipping.
            return Some(self.fail(backend, out, Status::BadRequest));
        }
        let mut body = Vec::new();
        if !backend.metrics(self.worker, now, open_metrics, &mut body) {
            return None;
        }
        // Output past the free allowance is reserved in the connection-memory budget, as a
        // GET's value is; without room the scrape is refused like one.
        let connection = connection_field(head.keep_alive, head.version);
        let fits = backend.conn_memory().is_none_or(|budget| {
            self.out_hold
                .room_for_output(budget, out.len(), body.len() + METRICS_HEAD_ROOM)
        });
        if !fits {
            backend.record(self.worker, Event::Response(Status::ServiceUnavailable));
            write_empty(out, Status::ServiceUnavailable, connection);
            return Some(if head.keep_alive {
                Step::Next(pos)
            } else {
                Step::Close
            });
        }
        let content_type = if open_metrics {
            crate::metrics::OPEN_METRICS_TYPE
        } else {
            crate::metrics::TEXT_TYPE
        };
        metrics_head(out, content_type, body.len(), connection);
        if head.method == Method::Get {
            out.extend_from_slice(&body);
        }
        backend.record(self.worker, Event::Response(Status::Ok));
        Some(if head.keep_alive {
            Step::Next(pos)
        } else {
            Step::Close
        })
    }

    /// An error response that ends the connection.
    pub(super) fn fail<B: Backend>(&self, backend: &B, out: &mut Vec<u8>, status: Status) -> Step {
        backend.record(self.worker, Event::Response(status));
        write_empty(out, status, ConnectionField::Close);
        Step::Close
    }
}

/// The head of a metrics reply: 200, `Content-Type`, the body's length, `Connection`.
fn metrics_head(out: &mut Vec<u8>, content_type: &str, len: usize, connection: ConnectionField) {
    let start = out.len();
    HeadWriter::start(out, Status::Ok)
        .content_length(len as u64)
        .finish(connection);
    // The head writer has no Content-Type (objects are untyped): it goes after the status line.
    let at = start + Status::Ok.status_line().len();
    let field = [b"Content-Type: ", content_type.as_bytes(), b"\r\n"].concat();
    out.splice(at..at, field);
}

pub(super) fn connection_field(keep_alive: bool, version: Version) -> ConnectionField {
    match (keep_alive, version) {
        (false, _) => ConnectionField::Close,
        (true, Version::Http10) => ConnectionField::KeepAlive,
        (true, Version::Http11) => ConnectionField::Omit,
    }
}
