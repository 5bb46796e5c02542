//! Answers to object API requests: GET/HEAD (with Range and If-None-Match), PUT, DELETE,
//! written straight into the connection's output buffer.

use ringstore_durable::units::usize_from;
use ringstore_proto::http::{
    if_range_matches, none_match_hits, resolve_range, write_empty, ConnectionField, HeadWriter,
    RangeOutcome, RequestHead, Status,
};

use ringstore_durable::Manifest;

use super::backend::{Backend, Object, PutOutcome};
use super::PendingPut;
use crate::budget::{Hold, IN_FREE};
use crate::Now;

/// Room for a response head beside the body it announces.
const HEAD_ROOM: usize = 256;

/// The body of a GET still to be sent from the data device: bytes `next..end` of a large object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stream {
    pub manifest: Manifest,
    pub next: u64,
    pub end: u64,
}

/// GET or HEAD of `key`. Returns the status sent (404: a miss) and, for a large object, the
/// body to stream after the head.
///
/// A value copied into `out` past [`crate::budget::OUT_FREE`] of pending output is reserved
/// in `out_hold` first, and a large object's stream reserves the chunk it buffers at a time
/// in `stream_hold` (the session's input hold, idle during a GET); without room the answer is
/// 503 and nothing of the value is copied.
#[expect(
    clippy::too_many_arguments,
    reason = "one request's context; a struct would only rename it"
)]
pub fn get<B: Backend>(
    backend: &B,
    key: &[u8],
    head: &RequestHead<'_>,
    with_body: bool,
    connection: ConnectionField,
    now: Now,
    out: &mut Vec<u8>,
    stream_hold: &mut Hold,
    out_hold: &mut Hold,
) -> (Status, Option<Stream>) {
    backend.read(key, now, |found| match found {
        None => {
            write_empty(out, Status::NotFound, connection);
            (Status::NotFound, None)
        }
        Some(object) if object.large => match Manifest::decode(object.value) {
            Some(manifest)
                if with_body
                    && backend.conn_memory().is_some_and(|budget| {
                        // The stream buffers one chunk at a time for as long as it runs.
                        let chunk = (manifest.chunk_len as usize).saturating_sub(IN_FREE);
                        !stream_hold.set(budget, stream_hold.bytes().max(chunk))
                    }) =>
            {
                write_empty(out, Status::ServiceUnavailable, connection);
                (Status::ServiceUnavailable, None)
            }
            Some(manifest) => {
                let len = manifest.len;
                let (status, range) = write_object(object, len, head, with_body, connection, out);
                let stream = range.map(|(first, last)| Stream {
                    manifest,
                    next: first,
                    end: last + 1,
                });
                (status, stream)
            }
            None => {
                write_empty(out, Status::InternalError, ConnectionField::Close);
                (Status::InternalError, None)
            }
        },
        Some(object)
            if with_body
                && backend.conn_memory().is_some_and(|budget| {
                    !out_hold.room_for_output(budget, out.len(), object.value.len() + HEAD_ROOM)
                }) =>
        {
            write_empty(out, Status::ServiceUnavailable, connection);
            (Status::ServiceUnavailable, None)
        }
        Some(object) => {
            let len = object.value.len() as u64;
            let (status, range) = write_object(object, len, head, with_body, connection, out);
            if let Some((first, last)) = range {
                // first <= last < len == value.len(), so both fit in usize.
                out.extend_from_slice(&object.value[usize_from(first)..=usize_from(last)]);
            }
            (status, None)
        }
    })
}

/// Writes the response head for `object` (whose body is `len` bytes); returns the status and
/// the inclusive byte range of the body to send after it, if any.
fn write_object(
    object: Object<'_>,
    len: u64,
    head: &RequestHead<'_>,
    with_body: bool,
    connection: ConnectionField,
    out: &mut Vec<u8>,
) -> (Status, Option<(u64, u64)>) {
    if head
        .if_none_match
        .is_some_and(|field| none_match_hits(field, object.cas))
    {
        HeadWriter::start(out, Status::NotModified)
            .etag(object.cas)
            .flags(object.flags)
            .finish(connection);
        return (Status::NotModified, None);
    }
    // Range applies to GET only, and only while If-Range (if any) names this value.
    let range = match head.range {
        Some(field)
            if with_body
                && head
                    .if_range
                    .is_none_or(|tag| if_range_matches(tag, object.cas)) =>
        {
            resolve_range(field, len)
        }
        _ => RangeOutcome::Full,
    };
    match range {
        RangeOutcome::Full => {
            HeadWriter::start(out, Status::Ok)
                .content_length(len)
                .etag(object.cas)
                .flags(object.flags)
                .finish(connection);
            let body = (with_body && len > 0).then(|| (0, len - 1));
            (Status::Ok, body)
        }
        RangeOutcome::Partial { first, last } => {
            HeadWriter::start(out, Status::PartialContent)
                .content_length(last - first + 1)
                .etag(object.cas)
                .flags(object.flags)
                .content_range(first, last, len)
                .finish(connection);
            (Status::PartialContent, Some((first, last)))
        }
        RangeOutcome::Unsatisfiable => {
            HeadWriter::start(out, Status::RangeNotSatisfiable)
                .content_length(0)
                .content_range_unsatisfied(len)
                .finish(connection);
            (Status::RangeNotSatisfiable, None)
        }
    }
}

/// PUT: 201 Created for a new key, 204 No Content for a replaced one, both with the new ETag.
/// Returns the status sent.
pub fn put<B: Backend>(
    backend: &B,
    put: &PendingPut,
    value: &[u8],
    now: Now,
    out: &mut Vec<u8>,
) -> Status {
    let outcome = backend.put(put.key.as_bytes(), value, put.flags, put.ttl, now);
    answer_put(outcome, put.connection, out)
}

/// The response to a PUT that ended in `outcome`. Returns the status sent.
pub fn answer_put(outcome: PutOutcome, connection: ConnectionField, out: &mut Vec<u8>) -> Status {
    let status = match outcome {
        PutOutcome::Stored { created, cas } => {
            let (status, mut head) = if created {
                (Status::Created, HeadWriter::start(out, Status::Created))
            } else {
                (Status::NoContent, HeadWriter::start(out, Status::NoContent))
            };
            if !status.forbids_content_length() {
                head = head.content_length(0);
            }
            if let Some(cas) = cas {
                head = head.etag(cas);
            }
            head.finish(connection);
            return status;
        }
        PutOutcome::TooLarge => Status::PayloadTooLarge,
        PutOutcome::OutOfMemory => Status::InsufficientStorage,
    };
    write_empty(out, status, connection);
    status
}

/// DELETE: 204, or 404 when absent. Returns the status sent.
pub fn delete<B: Backend>(
    backend: &B,
    key: &[u8],
    connection: ConnectionField,
    now: Now,
    out: &mut Vec<u8>,
) -> Status {
    let status = if backend.delete(key, now) {
        Status::NoContent
    } else {
        Status::NotFound
    };
    write_empty(out, status, connection);
    status
}
