//! HTTP/1.x request heads: an incremental scanner that enforces the size limits as bytes
//! arrive, and a parser that turns a complete head into a borrowed [`RequestHead`].
//!
//! The scanner decides every limit from a lower bound on the final size, so a request split
//! at any byte boundary is refused with the same status as the same request in one piece.
//! Nothing here allocates; all values borrow from the caller's buffer.
//!
//! The parts: `scan` (where a head ends, limits), `request_line`, `fields` (header field
//! lines and how they combine), `host` (Host values), `syntax` (lines, tokens, lists,
//! numbers). This file holds the types and the entry points.

use super::response::Status;

mod fields;
mod host;
mod request_line;
mod scan;
mod syntax;

use fields::Fields;
use request_line::parse_request_line;
pub use scan::{HeadScanner, Scan};
pub use syntax::is_tchar;
use syntax::Lines;
pub(crate) use syntax::{list_items, parse_u64_saturating, trim_ows};

/// Size limits of one request head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Longest request line, line terminator excluded (414 beyond).
    pub max_request_line: usize,
    /// Largest header section: the bytes after the request line through the blank line (431 beyond).
    pub max_header_bytes: usize,
    /// Most header field lines (431 beyond).
    pub max_headers: usize,
}

impl Limits {
    pub const DEFAULT: Limits = Limits {
        max_request_line: 8 * 1024,
        max_header_bytes: 16 * 1024,
        max_headers: 100,
    };
}

impl Default for Limits {
    fn default() -> Self {
        Limits::DEFAULT
    }
}

/// Longest method token accepted as a method at all. A first token that is longer, or holds a
/// byte no method can hold, is refused at once, so garbage (a TLS hello, a binary protocol)
/// gets its 400 on its first bytes instead of after 8 KiB.
pub const METHOD_MAX: usize = 32;

/// Why a head was refused; each maps to one status via [`HeadError::status`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HeadError {
    #[error("malformed request head")]
    Malformed,
    #[error("request line too long")]
    RequestLineTooLong,
    #[error("header section too large")]
    HeadersTooLarge,
    #[error("too many header fields")]
    TooManyHeaders,
    #[error("HTTP version not supported")]
    VersionNotSupported,
    #[error("transfer coding not implemented")]
    UnsupportedTransferCoding,
    #[error("expectation not supported")]
    UnsupportedExpectation,
    /// An HTTP/1.1 request without `Host` (RFC 9112 §3.2).
    #[error("HTTP/1.1 request without Host")]
    MissingHost,
    /// More than one `Host` field line (RFC 9112 §3.2).
    #[error("more than one Host field")]
    DuplicateHost,
    /// A `Host` value that is not `uri-host [ ":" port ]` (RFC 9112 §3.2, RFC 3986 §3.2.2).
    #[error("invalid Host field")]
    InvalidHost,
}

impl HeadError {
    pub fn status(self) -> Status {
        match self {
            HeadError::Malformed
            | HeadError::MissingHost
            | HeadError::DuplicateHost
            | HeadError::InvalidHost => Status::BadRequest,
            HeadError::RequestLineTooLong => Status::UriTooLong,
            HeadError::HeadersTooLarge | HeadError::TooManyHeaders => Status::HeadersTooLarge,
            HeadError::VersionNotSupported => Status::VersionNotSupported,
            HeadError::UnsupportedTransferCoding => Status::NotImplemented,
            HeadError::UnsupportedExpectation => Status::ExpectationFailed,
        }
    }
}

/// The methods the object API knows; everything else is `Other` (405).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Get,
    Head,
    Put,
    Delete,
    Other,
}

/// The version a request is served as. `HTTP/1.2` to `HTTP/1.9` are served as 1.1: RFC 9110
/// §2.5 says a minor version higher than the recipient implements is processed as the
/// highest minor of that major. Other majors (`HTTP/0.9`, `HTTP/2.0`) get 505.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    Http10,
    Http11,
}

/// How the request body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyFraming {
    /// Neither Content-Length nor Transfer-Encoding: no body.
    None,
    /// `Content-Length: n` (saturated at `u64::MAX`; the caller compares it with its limit).
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
}

/// A parsed request head, borrowing from the input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestHead<'a> {
    pub method: Method,
    /// The request target exactly as sent (origin-form or absolute-form).
    pub target: &'a [u8],
    pub version: Version,
    pub body: BodyFraming,
    /// Whether the connection stays open after the response (version default + `Connection`).
    pub keep_alive: bool,
    /// `Expect: 100-continue` on HTTP/1.1 (ignored on HTTP/1.0, as RFC 9110 requires).
    pub expect_continue: bool,
    pub range: Option<&'a [u8]>,
    pub if_none_match: Option<&'a [u8]>,
    pub if_range: Option<&'a [u8]>,
    /// TTL in memcache exptime form: `X-TTL`, else `Cache-Control: max-age`.
    pub ttl: Option<i64>,
    /// `X-Flags`.
    pub flags: Option<u32>,
    /// `Authorization` (its value; `--http-tokens` reads `Bearer TOKEN`).
    pub authorization: Option<&'a [u8]>,
}

/// Bytes of empty lines (CRLF or LF) before a request line, which RFC 9112 §2.2 says to ignore.
pub fn skip_empty_lines(buf: &[u8]) -> usize {
    let mut at = 0;
    loop {
        match &buf[at..] {
            [b'\r', b'\n', ..] => at += 2,
            [b'\n', ..] => at += 1,
            _ => return at,
        }
    }
}

/// One-shot parse of the head at the start of `buf` (empty lines before it skipped).
/// `Ok(None)`: incomplete. `Ok(Some((head, n)))`: the head and the bytes it took, skipped
/// empty lines included.
pub fn parse_head<'a>(
    buf: &'a [u8],
    limits: &Limits,
) -> Result<Option<(RequestHead<'a>, usize)>, HeadError> {
    let skipped = skip_empty_lines(buf);
    let rest = &buf[skipped..];
    if rest == b"\r" {
        return Ok(None);
    }
    match HeadScanner::new().scan(rest, limits)? {
        Scan::Partial => Ok(None),
        Scan::Complete(n) => Ok(Some((RequestHead::parse(&rest[..n])?, skipped + n))),
    }
}

impl<'a> RequestHead<'a> {
    /// Parses a complete head as [`HeadScanner`] delimited it (limits already enforced).
    pub fn parse(head: &'a [u8]) -> Result<RequestHead<'a>, HeadError> {
        let mut lines = Lines { rest: head };
        let (method, target, version) =
            parse_request_line(lines.next().ok_or(HeadError::Malformed)?)?;
        let mut fields = Fields::default();
        for line in lines {
            if line.is_empty() {
                break;
            }
            fields.add(line)?;
        }
        fields.finish(method, target, version)
    }
}

#[cfg(test)]
#[path = "head_tests.rs"]
mod tests;
