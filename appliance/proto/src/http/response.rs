//! HTTP response heads: status lines and the few fields the object API sends, formatted without allocating.
//!
//! Field order is fixed (status, Server, then the caller's fields, Connection last) so replies
//! are byte-exact and testable. No `Date` field: formatting it costs a clock read and a
//! conversion per response, and RFC 9110 lets an origin without a reliable clock omit it.

/// The statuses the object API answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Continue,
    Ok,
    Created,
    NoContent,
    PartialContent,
    NotModified,
    BadRequest,
    /// No valid bearer token (`--http-tokens`); sent with `WWW-Authenticate: Bearer`.
    Unauthorized,
    /// The token may not do this (read-only, or another key prefix).
    Forbidden,
    NotFound,
    MethodNotAllowed,
    LengthRequired,
    PayloadTooLarge,
    UriTooLong,
    RangeNotSatisfiable,
    ExpectationFailed,
    HeadersTooLarge,
    InternalError,
    NotImplemented,
    ServiceUnavailable,
    VersionNotSupported,
    InsufficientStorage,
}

impl Status {
    /// The numeric code.
    pub fn code(self) -> u16 {
        match self {
            Status::Continue => 100,
            Status::Ok => 200,
            Status::Created => 201,
            Status::NoContent => 204,
            Status::PartialContent => 206,
            Status::NotModified => 304,
            Status::BadRequest => 400,
            Status::Unauthorized => 401,
            Status::Forbidden => 403,
            Status::NotFound => 404,
            Status::MethodNotAllowed => 405,
            Status::LengthRequired => 411,
            Status::PayloadTooLarge => 413,
            Status::UriTooLong => 414,
            Status::RangeNotSatisfiable => 416,
            Status::ExpectationFailed => 417,
            Status::HeadersTooLarge => 431,
            Status::InternalError => 500,
            Status::NotImplemented => 501,
            Status::ServiceUnavailable => 503,
            Status::VersionNotSupported => 505,
            Status::InsufficientStorage => 507,
        }
    }

    /// The whole status line, CRLF included; static so writing it is one copy.
    pub fn status_line(self) -> &'static [u8] {
        match self {
            Status::Continue => b"HTTP/1.1 100 Continue\r\n",
            Status::Ok => b"HTTP/1.1 200 OK\r\n",
            Status::Created => b"HTTP/1.1 201 Created\r\n",
            Status::NoContent => b"HTTP/1.1 204 No Content\r\n",
            Status::PartialContent => b"HTTP/1.1 206 Partial Content\r\n",
            Status::NotModified => b"HTTP/1.1 304 Not Modified\r\n",
            Status::BadRequest => b"HTTP/1.1 400 Bad Request\r\n",
            Status::Unauthorized => b"HTTP/1.1 401 Unauthorized\r\n",
            Status::Forbidden => b"HTTP/1.1 403 Forbidden\r\n",
            Status::NotFound => b"HTTP/1.1 404 Not Found\r\n",
            Status::MethodNotAllowed => b"HTTP/1.1 405 Method Not Allowed\r\n",
            Status::LengthRequired => b"HTTP/1.1 411 Length Required\r\n",
            Status::PayloadTooLarge => b"HTTP/1.1 413 Content Too Large\r\n",
            Status::UriTooLong => b"HTTP/1.1 414 URI Too Long\r\n",
            Status::RangeNotSatisfiable => b"HTTP/1.1 416 Range Not Satisfiable\r\n",
            Status::ExpectationFailed => b"HTTP/1.1 417 Expectation Failed\r\n",
            Status::HeadersTooLarge => b"HTTP/1.1 431 Request Header Fields Too Large\r\n",
            Status::InternalError => b"HTTP/1.1 500 Internal Server Error\r\n",
            Status::NotImplemented => b"HTTP/1.1 501 Not Implemented\r\n",
            Status::ServiceUnavailable => b"HTTP/1.1 503 Service Unavailable\r\n",
            Status::VersionNotSupported => b"HTTP/1.1 505 HTTP Version Not Supported\r\n",
            Status::InsufficientStorage => b"HTTP/1.1 507 Insufficient Storage\r\n",
        }
    }

    /// 1xx, 204 and 304 never carry content. RFC 9110 §8.6 forbids Content-Length on 1xx and
    /// 204; on 304 it would have to repeat the 200's length, which some clients misread as a
    /// body to wait for, so we leave it out there too.
    pub fn forbids_content_length(self) -> bool {
        matches!(
            self,
            Status::Continue | Status::NoContent | Status::NotModified
        )
    }
}

/// The interim reply to `Expect: 100-continue`.
pub const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

/// The methods the object API implements, for `Allow` on 405.
pub const ALLOW: &[u8] = b"GET, HEAD, PUT, DELETE";

/// How the `Connection` field of a response reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectionField {
    /// HTTP/1.1 keep-alive: the default, no field sent.
    Omit,
    /// An HTTP/1.0 client asked for keep-alive and gets it.
    KeepAlive,
    /// The connection closes after this response.
    Close,
}

/// Appends one response head to an output buffer, field by field, in a fixed order.
pub struct HeadWriter<'a> {
    out: &'a mut Vec<u8>,
}

impl<'a> HeadWriter<'a> {
    /// Writes the status line and `Server`.
    pub fn start(out: &'a mut Vec<u8>, status: Status) -> HeadWriter<'a> {
        out.extend_from_slice(status.status_line());
        out.extend_from_slice(b"Server: ringstore\r\n");
        HeadWriter { out }
    }

    pub fn content_length(self, len: u64) -> Self {
        self.field_u64(b"Content-Length: ", len)
    }

    /// `ETag: "<cas>"`: the CAS unique is the strong validator of a stored value.
    pub fn etag(self, cas: u64) -> Self {
        self.out.extend_from_slice(b"ETag: \"");
        push_u64(self.out, cas);
        self.out.extend_from_slice(b"\"\r\n");
        self
    }

    /// `Content-Type` (answers that are not stored objects: `/_hotkeys`).
    pub fn content_type(self, value: &[u8]) -> Self {
        self.out.extend_from_slice(b"Content-Type: ");
        self.out.extend_from_slice(value);
        self.out.extend_from_slice(b"\r\n");
        self
    }

    pub fn flags(self, flags: u32) -> Self {
        self.field_u64(b"X-Flags: ", u64::from(flags))
    }

    /// `Content-Range: bytes first-last/len` for a 206.
    pub fn content_range(self, first: u64, last: u64, len: u64) -> Self {
        self.out.extend_from_slice(b"Content-Range: bytes ");
        push_u64(self.out, first);
        self.out.push(b'-');
        push_u64(self.out, last);
        self.out.push(b'/');
        push_u64(self.out, len);
        self.out.extend_from_slice(b"\r\n");
        self
    }

    /// `Content-Range: bytes */len` for a 416.
    pub fn content_range_unsatisfied(self, len: u64) -> Self {
        self.field_u64(b"Content-Range: bytes */", len)
    }

    pub fn allow(self) -> Self {
        self.out.extend_from_slice(b"Allow: ");
        self.out.extend_from_slice(ALLOW);
        self.out.extend_from_slice(b"\r\n");
        self
    }

    /// `WWW-Authenticate: Bearer` on a 401 (RFC 6750 §3).
    pub fn www_authenticate(self) -> Self {
        self.out.extend_from_slice(b"WWW-Authenticate: Bearer\r\n");
        self
    }

    /// Writes `Connection` (if any) and the blank line that ends the head.
    pub fn finish(self, connection: ConnectionField) {
        match connection {
            ConnectionField::Omit => {}
            ConnectionField::KeepAlive => self.out.extend_from_slice(b"Connection: keep-alive\r\n"),
            ConnectionField::Close => self.out.extend_from_slice(b"Connection: close\r\n"),
        }
        self.out.extend_from_slice(b"\r\n");
    }

    fn field_u64(self, name: &[u8], value: u64) -> Self {
        self.out.extend_from_slice(name);
        push_u64(self.out, value);
        self.out.extend_from_slice(b"\r\n");
        self
    }
}

/// A complete bodiless reply: status, `Server`, `Content-Length: 0` (unless the status forbids
/// it), `Allow` for 405, and `Connection`.
pub fn write_empty(out: &mut Vec<u8>, status: Status, connection: ConnectionField) {
    let mut head = HeadWriter::start(out, status);
    if !status.forbids_content_length() {
        head = head.content_length(0);
    }
    if status == Status::MethodNotAllowed {
        head = head.allow();
    }
    if status == Status::Unauthorized {
        head = head.www_authenticate();
    }
    head.finish(connection);
}

/// Appends the decimal digits of a number without allocating (the memcache replies' own).
pub use crate::memcache::reply::push_u64;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_u64_formats_edges() {
        for (v, s) in [
            (0u64, "0"),
            (9, "9"),
            (10, "10"),
            (1234567890, "1234567890"),
            (u64::MAX, "18446744073709551615"),
        ] {
            let mut out = Vec::new();
            push_u64(&mut out, v);
            assert_eq!(out, s.as_bytes());
        }
    }

    #[test]
    fn full_head_is_byte_exact() {
        let mut out = Vec::new();
        HeadWriter::start(&mut out, Status::PartialContent)
            .content_length(2)
            .etag(7)
            .flags(3)
            .content_range(1, 2, 10)
            .finish(ConnectionField::KeepAlive);
        assert_eq!(
            out,
            b"HTTP/1.1 206 Partial Content\r\nServer: ringstore\r\nContent-Length: 2\r\nETag: \"7\"\r\nX-Flags: 3\r\nContent-Range: bytes 1-2/10\r\nConnection: keep-alive\r\n\r\n"
        );
    }

    #[test]
    fn empty_replies() {
        let mut out = Vec::new();
        write_empty(&mut out, Status::MethodNotAllowed, ConnectionField::Omit);
        assert_eq!(out, b"HTTP/1.1 405 Method Not Allowed\r\nServer: ringstore\r\nContent-Length: 0\r\nAllow: GET, HEAD, PUT, DELETE\r\n\r\n");
        out.clear();
        write_empty(&mut out, Status::NoContent, ConnectionField::Close);
        assert_eq!(
            out,
            b"HTTP/1.1 204 No Content\r\nServer: ringstore\r\nConnection: close\r\n\r\n"
        );
        out.clear();
        HeadWriter::start(&mut out, Status::RangeNotSatisfiable)
            .content_length(0)
            .content_range_unsatisfied(5)
            .finish(ConnectionField::Omit);
        assert_eq!(out, b"HTTP/1.1 416 Range Not Satisfiable\r\nServer: ringstore\r\nContent-Length: 0\r\nContent-Range: bytes */5\r\n\r\n");
    }

    #[test]
    fn status_lines_match_codes() {
        for s in [
            Status::Continue,
            Status::Ok,
            Status::Created,
            Status::NoContent,
            Status::PartialContent,
            Status::NotModified,
            Status::BadRequest,
            Status::NotFound,
            Status::MethodNotAllowed,
            Status::LengthRequired,
            Status::PayloadTooLarge,
            Status::UriTooLong,
            Status::RangeNotSatisfiable,
            Status::ExpectationFailed,
            Status::HeadersTooLarge,
            Status::InternalError,
            Status::NotImplemented,
            Status::ServiceUnavailable,
            Status::VersionNotSupported,
            Status::InsufficientStorage,
        ] {
            let line = s.status_line();
            assert!(line.starts_with(format!("HTTP/1.1 {} ", s.code()).as_bytes()));
            assert!(line.ends_with(b"\r\n"));
        }
    }
}
