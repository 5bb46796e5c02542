//! HTTP/1.1 object API codec: request-head parsing with bounded inputs, chunked bodies, keys, ranges, response heads.
//!
//! Sans-IO: every function here takes bytes and returns typed values or appends bytes to a
//! caller's buffer. Nothing allocates on the request path except the caller's output `Vec`.
//! The service crate (`ringstore_service::http`) drives these pieces per connection.

pub mod chunked;
pub mod etag;
pub mod head;
pub mod key;
pub mod range;
pub mod response;

pub use chunked::{ChunkError, ChunkedDecoder};
pub use etag::{if_range_matches, none_match_hits};
pub use head::{
    parse_head, skip_empty_lines, BodyFraming, HeadError, HeadScanner, Limits, Method, RequestHead,
    Scan, Version,
};
pub use key::{decode_key, KeyBuf, KeyError, KEY_LEN_MAX};
pub use range::{resolve_range, RangeOutcome};
pub use response::{write_empty, ConnectionField, HeadWriter, Status, CONTINUE};

#[cfg(test)]
mod prop_tests;
