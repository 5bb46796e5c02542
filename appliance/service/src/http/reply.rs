//! Answers to object API requests: GET/HEAD (with Range and If-None-Match), PUT, DELETE,
//! written straight into the connection's output buffer.

use ringstore_proto::http::{
    if_range_matches, none_match_hits, resolve_range, write_empty, ConnectionField, HeadWriter,
    RangeOutcome, RequestHead, Status,
};

use super::backend::{Backend, Object, PutOutcome};
use super::PendingPut;
use crate::Now;

/// GET or HEAD of `key`. Returns the status sent (404: a miss).
pub fn get<B: Backend>(
    backend: &B,
    key: &[u8],
    head: &RequestHead<'_>,
    with_body: bool,
    connection: ConnectionField,
    now: Now,
    out: &mut Vec<u8>,
) -> Status {
    backend.read(key, now, |found| match found {
        None => {
            write_empty(out, Status::NotFound, connection);
            Status::NotFound
        }
        Some(object) => write_object(object, head, with_body, connection, out),
    })
}

fn write_object(
    object: Object<'_>,
    head: &RequestHead<'_>,
    with_body: bool,
    connection: ConnectionField,
    out: &mut Vec<u8>,
) -> Status {
    let len = object.value.len() as u64;
    if head
        .if_none_match
        .is_some_and(|field| none_match_hits(field, object.cas))
    {
        HeadWriter::start(out, Status::NotModified)
            .etag(object.cas)
            .flags(object.flags)
            .finish(connection);
        return Status::NotModified;
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
            if with_body {
                out.extend_from_slice(object.value);
            }
            Status::Ok
        }
        RangeOutcome::Partial { first, last } => {
            HeadWriter::start(out, Status::PartialContent)
                .content_length(last - first + 1)
                .etag(object.cas)
                .flags(object.flags)
                .content_range(first, last, len)
                .finish(connection);
            // first <= last < len == value.len(), so both fit in usize.
            out.extend_from_slice(&object.value[first as usize..=last as usize]);
            Status::PartialContent
        }
        RangeOutcome::Unsatisfiable => {
            HeadWriter::start(out, Status::RangeNotSatisfiable)
                .content_length(0)
                .content_range_unsatisfied(len)
                .finish(connection);
            Status::RangeNotSatisfiable
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
    let connection = put.connection;
    let status = match backend.put(put.key.as_bytes(), value, put.flags, put.ttl, now) {
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
