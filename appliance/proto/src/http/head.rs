//! HTTP/1.x request heads: an incremental scanner that enforces the size limits as bytes
//! arrive, and a parser that turns a complete head into a borrowed [`RequestHead`].
//!
//! The scanner decides every limit from a lower bound on the final size, so a request split
//! at any byte boundary is refused with the same status as the same request in one piece.
//! Nothing here allocates; all values borrow from the caller's buffer.

use super::response::Status;

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
}

/// Progress of the scanner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scan {
    /// More bytes are needed.
    Partial,
    /// The head is complete and is the first `n` bytes of the buffer.
    Complete(usize),
}

/// Finds the end of a request head incrementally. Feed it the same buffer, grown, on every
/// call; it resumes where it stopped, so a head trickling in byte by byte costs linear time.
#[derive(Debug, Clone, Default)]
pub struct HeadScanner {
    /// Index just past the request line's LF, once seen.
    line_end: Option<usize>,
    /// Start of the header line being scanned.
    line_start: usize,
    /// Next byte to examine.
    pos: usize,
    headers: usize,
}

impl HeadScanner {
    pub fn new() -> HeadScanner {
        HeadScanner::default()
    }

    /// Forgets the progress, for the next request.
    pub fn reset(&mut self) {
        *self = HeadScanner::default();
    }

    /// True once any byte of the current head has been examined.
    pub fn started(&self) -> bool {
        self.pos > 0
    }

    /// Scans `buf`, which starts at the request line (run [`skip_empty_lines`] first) and
    /// extends what the previous call saw.
    pub fn scan(&mut self, buf: &[u8], limits: &Limits) -> Result<Scan, HeadError> {
        let line_end = match self.line_end {
            Some(end) => end,
            None => {
                check_method_prefix(buf)?;
                match find_lf(buf, self.pos) {
                    None => {
                        self.pos = buf.len();
                        // The line is at least this long even if the next byte is its LF.
                        if buf.len().saturating_sub(1) > limits.max_request_line {
                            return Err(HeadError::RequestLineTooLong);
                        }
                        return Ok(Scan::Partial);
                    }
                    Some(lf) => {
                        if strip_cr(&buf[..lf]).len() > limits.max_request_line {
                            return Err(HeadError::RequestLineTooLong);
                        }
                        self.line_end = Some(lf + 1);
                        self.line_start = lf + 1;
                        self.pos = lf + 1;
                        lf + 1
                    }
                }
            }
        };
        loop {
            match find_lf(buf, self.pos) {
                None => {
                    self.pos = buf.len();
                    // The blank line can end no earlier than one byte from now.
                    if buf.len() + 1 - line_end > limits.max_header_bytes {
                        return Err(HeadError::HeadersTooLarge);
                    }
                    return Ok(Scan::Partial);
                }
                Some(lf) => {
                    let end = lf + 1;
                    if end - line_end > limits.max_header_bytes {
                        return Err(HeadError::HeadersTooLarge);
                    }
                    self.pos = end;
                    if strip_cr(&buf[self.line_start..lf]).is_empty() {
                        return Ok(Scan::Complete(end));
                    }
                    self.headers += 1;
                    if self.headers > limits.max_headers {
                        return Err(HeadError::TooManyHeaders);
                    }
                    self.line_start = end;
                }
            }
        }
    }
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

#[derive(Default)]
struct Fields<'a> {
    content_length: Option<u64>,
    transfer_encoding: bool,
    chunked: u32,
    unknown_coding: bool,
    close: bool,
    keep_alive: bool,
    expect_continue: bool,
    unknown_expectation: bool,
    range: Option<&'a [u8]>,
    if_none_match: Option<&'a [u8]>,
    if_range: Option<&'a [u8]>,
    x_ttl: Option<i64>,
    max_age: Option<i64>,
    flags: Option<u32>,
    /// `Host` field lines seen.
    hosts: u32,
    host_invalid: bool,
}

impl<'a> Fields<'a> {
    fn add(&mut self, line: &'a [u8]) -> Result<(), HeadError> {
        let colon = line
            .iter()
            .position(|&b| b == b':')
            .ok_or(HeadError::Malformed)?;
        let name = &line[..colon];
        // Also refuses obs-fold (a line starting with SP/HT) and space before the colon.
        if name.is_empty() || !name.iter().all(|&b| is_tchar(b)) {
            return Err(HeadError::Malformed);
        }
        let value = trim_ows(&line[colon + 1..]);
        if !value
            .iter()
            .all(|&b| b == b'\t' || (b' '..=b'~').contains(&b) || b >= 0x80)
        {
            return Err(HeadError::Malformed);
        }
        let is = |known: &str| name.eq_ignore_ascii_case(known.as_bytes());
        if is("content-length") {
            let n = parse_u64_saturating(value).ok_or(HeadError::Malformed)?;
            if self.content_length.is_some_and(|old| old != n) {
                return Err(HeadError::Malformed);
            }
            self.content_length = Some(n);
        } else if is("transfer-encoding") {
            self.transfer_encoding = true;
            for coding in list_items(value) {
                if coding.eq_ignore_ascii_case(b"chunked") {
                    self.chunked += 1;
                } else {
                    self.unknown_coding = true;
                }
            }
        } else if is("connection") {
            for option in list_items(value) {
                if option.eq_ignore_ascii_case(b"close") {
                    self.close = true;
                } else if option.eq_ignore_ascii_case(b"keep-alive") {
                    self.keep_alive = true;
                }
            }
        } else if is("expect") {
            if value.eq_ignore_ascii_case(b"100-continue") {
                self.expect_continue = true;
            } else {
                self.unknown_expectation = true;
            }
        } else if is("range") {
            self.range = Some(value);
        } else if is("if-none-match") {
            self.if_none_match = Some(value);
        } else if is("if-range") {
            self.if_range = Some(value);
        } else if is("x-ttl") {
            self.x_ttl = Some(parse_i64_saturating(value).ok_or(HeadError::Malformed)?);
        } else if is("cache-control") {
            for directive in list_items(value) {
                let Some(arg) = strip_prefix_ignore_case(directive, b"max-age") else {
                    continue;
                };
                let Some(arg) = trim_ows(arg).strip_prefix(b"=") else {
                    continue;
                };
                let arg = trim_ows(arg);
                let arg = arg
                    .strip_prefix(b"\"")
                    .and_then(|a| a.strip_suffix(b"\""))
                    .unwrap_or(arg);
                // Signed: memcache exptime rules apply, so a negative age stores an expired item.
                self.max_age = Some(parse_i64_saturating(arg).ok_or(HeadError::Malformed)?);
            }
        } else if is("host") {
            self.hosts += 1;
            self.host_invalid |= !valid_host(value);
        } else if is("x-flags") {
            let flags = parse_u64_saturating(value).and_then(|n| u32::try_from(n).ok());
            self.flags = Some(flags.ok_or(HeadError::Malformed)?);
        }
        Ok(())
    }

    fn finish(
        self,
        method: Method,
        target: &'a [u8],
        version: Version,
    ) -> Result<RequestHead<'a>, HeadError> {
        // RFC 9112 §3.2: 400 for an HTTP/1.1 request without Host, and for any request with
        // more than one Host line or an invalid one (HTTP/1.0 may omit it).
        if self.hosts > 1 {
            return Err(HeadError::DuplicateHost);
        }
        if self.host_invalid {
            return Err(HeadError::InvalidHost);
        }
        if self.hosts == 0 && version == Version::Http11 {
            return Err(HeadError::MissingHost);
        }
        let body = if self.transfer_encoding {
            // RFC 9112 §6.1: a 1.0 request with Transfer-Encoding, or one with both framings,
            // has untrustworthy framing; refusing it closes request-smuggling doors.
            if version == Version::Http10 || self.content_length.is_some() {
                return Err(HeadError::Malformed);
            }
            if self.unknown_coding {
                return Err(HeadError::UnsupportedTransferCoding);
            }
            if self.chunked != 1 {
                return Err(HeadError::Malformed);
            }
            BodyFraming::Chunked
        } else {
            match self.content_length {
                Some(n) => BodyFraming::Length(n),
                None => BodyFraming::None,
            }
        };
        let http11 = version == Version::Http11;
        if http11 && self.unknown_expectation {
            return Err(HeadError::UnsupportedExpectation);
        }
        Ok(RequestHead {
            method,
            target,
            version,
            body,
            keep_alive: if http11 {
                !self.close
            } else {
                self.keep_alive && !self.close
            },
            expect_continue: http11 && self.expect_continue,
            range: self.range,
            if_none_match: self.if_none_match,
            if_range: self.if_range,
            ttl: self.x_ttl.or(self.max_age),
            flags: self.flags,
        })
    }
}

fn parse_request_line(line: &[u8]) -> Result<(Method, &[u8], Version), HeadError> {
    let sp = line
        .iter()
        .position(|&b| b == b' ')
        .ok_or(HeadError::Malformed)?;
    let method_bytes = &line[..sp];
    if method_bytes.is_empty()
        || method_bytes.len() > METHOD_MAX
        || !method_bytes.iter().all(|&b| is_tchar(b))
    {
        return Err(HeadError::Malformed);
    }
    let rest = &line[sp + 1..];
    let sp = rest
        .iter()
        .position(|&b| b == b' ')
        .ok_or(HeadError::Malformed)?;
    let target = &rest[..sp];
    if target.is_empty() || !target.iter().all(|&b| (b'!'..=b'~').contains(&b)) {
        return Err(HeadError::Malformed);
    }
    let version = match &rest[sp + 1..] {
        b"HTTP/1.0" => Version::Http10,
        // 1.1, and higher minors of major 1 served as 1.1 (RFC 9110 §2.5).
        [b'H', b'T', b'T', b'P', b'/', b'1', b'.', minor] if (b'1'..=b'9').contains(minor) => {
            Version::Http11
        }
        [b'H', b'T', b'T', b'P', b'/', major, b'.', minor]
            if major.is_ascii_digit() && minor.is_ascii_digit() =>
        {
            return Err(HeadError::VersionNotSupported)
        }
        _ => return Err(HeadError::Malformed),
    };
    let method = match method_bytes {
        b"GET" => Method::Get,
        b"HEAD" => Method::Head,
        b"PUT" => Method::Put,
        b"DELETE" => Method::Delete,
        _ => Method::Other,
    };
    Ok((method, target, version))
}

/// RFC 9112 §3.2 `Host = uri-host [ ":" port ]`, with RFC 3986's `uri-host = IP-literal /
/// IPv4address / reg-name` (an IPv4 address is also a reg-name) and `port = *DIGIT`. An
/// empty value is valid: a client sends one when the target has no authority.
fn valid_host(value: &[u8]) -> bool {
    let (host, port) = match value.strip_prefix(b"[") {
        Some(literal) => {
            let Some(close) = literal.iter().position(|&b| b == b']') else {
                return false;
            };
            if !valid_ip_literal(&literal[..close]) {
                return false;
            }
            match &literal[close + 1..] {
                [] => (&b""[..], None),
                [b':', port @ ..] => (&b""[..], Some(port)),
                _ => return false,
            }
        }
        None => match value.iter().rposition(|&b| b == b':') {
            Some(colon) => (&value[..colon], Some(&value[colon + 1..])),
            None => (value, None),
        },
    };
    port.is_none_or(|p| p.iter().all(u8::is_ascii_digit)) && valid_reg_name(host)
}

/// `reg-name = *( unreserved / pct-encoded / sub-delims )`.
fn valid_reg_name(name: &[u8]) -> bool {
    let mut i = 0;
    while i < name.len() {
        let b = name[i];
        if b == b'%' {
            match name.get(i + 1..i + 3) {
                Some([h, l]) if h.is_ascii_hexdigit() && l.is_ascii_hexdigit() => i += 3,
                _ => return false,
            }
            continue;
        }
        if !(b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=".contains(&b)) {
            return false;
        }
        i += 1;
    }
    true
}

/// What may sit between `[` and `]`: an IPv6 address (checked by its characters and by
/// having a colon; a full RFC 4291 check is beyond what routing a request needs) or
/// `IPvFuture = "v" 1*HEXDIG "." 1*( unreserved / sub-delims / ":" )`.
fn valid_ip_literal(inner: &[u8]) -> bool {
    if let Some(future) = inner
        .strip_prefix(b"v")
        .or_else(|| inner.strip_prefix(b"V"))
    {
        let Some(dot) = future.iter().position(|&b| b == b'.') else {
            return false;
        };
        let (version, rest) = (&future[..dot], &future[dot + 1..]);
        return !version.is_empty()
            && version.iter().all(u8::is_ascii_hexdigit)
            && !rest.is_empty()
            && rest
                .iter()
                .all(|&b| b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:".contains(&b));
    }
    inner.contains(&b':')
        && inner
            .iter()
            .all(|&b| b.is_ascii_hexdigit() || b == b':' || b == b'.')
}

/// Refuses a request whose first bytes cannot begin a method (see [`METHOD_MAX`]).
fn check_method_prefix(buf: &[u8]) -> Result<(), HeadError> {
    for (i, &b) in buf.iter().enumerate().take(METHOD_MAX + 1) {
        if b == b' ' {
            return if i == 0 {
                Err(HeadError::Malformed)
            } else {
                Ok(())
            };
        }
        if !is_tchar(b) {
            return Err(HeadError::Malformed);
        }
    }
    if buf.len() > METHOD_MAX {
        return Err(HeadError::Malformed);
    }
    Ok(())
}

/// Lines of a head without their CRLF or LF; a CR elsewhere stays and fails validation.
struct Lines<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for Lines<'a> {
    type Item = &'a [u8];
    fn next(&mut self) -> Option<&'a [u8]> {
        let lf = memchr::memchr(b'\n', self.rest)?;
        let line = &self.rest[..lf];
        self.rest = &self.rest[lf + 1..];
        Some(strip_cr(line))
    }
}

fn find_lf(buf: &[u8], from: usize) -> Option<usize> {
    memchr::memchr(b'\n', buf.get(from..)?).map(|i| i + from)
}

fn strip_cr(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// RFC 9110 token characters.
pub fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

pub(crate) fn trim_ows(mut v: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = v {
        v = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = v {
        v = rest;
    }
    v
}

/// The non-empty, trimmed elements of a comma-separated field value.
pub(crate) fn list_items(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value
        .split(|&b| b == b',')
        .map(trim_ows)
        .filter(|item| !item.is_empty())
}

fn strip_prefix_ignore_case<'v>(v: &'v [u8], prefix: &[u8]) -> Option<&'v [u8]> {
    let head = v.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &v[prefix.len()..])
}

/// Decimal digits only, at least one; values past `u64::MAX` saturate (callers treat them as too large).
pub(crate) fn parse_u64_saturating(v: &[u8]) -> Option<u64> {
    if v.is_empty() {
        return None;
    }
    let mut n: u64 = 0;
    for &b in v {
        if !b.is_ascii_digit() {
            return None;
        }
        n = n.saturating_mul(10).saturating_add(u64::from(b - b'0'));
    }
    Some(n)
}

/// An optional `-` and decimal digits, saturating at the i64 range.
fn parse_i64_saturating(v: &[u8]) -> Option<i64> {
    match v.strip_prefix(b"-") {
        Some(digits) => {
            parse_u64_saturating(digits).map(|n| i64::try_from(n).map_or(i64::MIN, |n| -n))
        }
        None => parse_u64_saturating(v).map(|n| i64::try_from(n).unwrap_or(i64::MAX)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(input: &[u8]) -> Result<Option<(RequestHead<'_>, usize)>, HeadError> {
        parse_head(input, &Limits::DEFAULT)
    }

    fn head(input: &[u8]) -> RequestHead<'_> {
        match parse(input) {
            Ok(Some((head, n))) => {
                assert_eq!(n, input.len());
                head
            }
            other => panic!("{:?} -> {other:?}", String::from_utf8_lossy(input)),
        }
    }

    fn err(input: &[u8]) -> HeadError {
        match parse(input) {
            Err(e) => e,
            other => panic!("{:?} -> {other:?}", String::from_utf8_lossy(input)),
        }
    }

    #[test]
    fn simple_get() {
        let h = head(b"GET /k HTTP/1.1\r\nHost: x\r\n\r\n");
        assert_eq!(
            (h.method, h.target, h.version, h.body, h.keep_alive),
            (
                Method::Get,
                &b"/k"[..],
                Version::Http11,
                BodyFraming::None,
                true
            )
        );
        assert_eq!(
            (h.range, h.if_none_match, h.ttl, h.flags, h.expect_continue),
            (None, None, None, None, false)
        );
    }

    #[test]
    fn methods_and_versions() {
        assert_eq!(head(b"HEAD / HTTP/1.0\r\n\r\n").method, Method::Head);
        assert_eq!(head(b"PUT / HTTP/1.0\r\n\r\n").method, Method::Put);
        assert_eq!(head(b"DELETE / HTTP/1.0\r\n\r\n").method, Method::Delete);
        assert_eq!(head(b"get / HTTP/1.0\r\n\r\n").method, Method::Other);
        assert_eq!(head(b"POST / HTTP/1.0\r\n\r\n").method, Method::Other);
        assert_eq!(head(b"GET / HTTP/1.0\r\n\r\n").version, Version::Http10);
        assert_eq!(
            err(b"GET / HTTP/2.0\r\n\r\n"),
            HeadError::VersionNotSupported
        );
        assert_eq!(
            head(b"GET / HTTP/1.2\r\nHost: h\r\n\r\n").version,
            Version::Http11
        );
        assert_eq!(
            err(b"GET / HTTP/0.9\r\n\r\n"),
            HeadError::VersionNotSupported
        );
        assert_eq!(err(b"GET / HTTP/1.10\r\n\r\n"), HeadError::Malformed);
        assert_eq!(err(b"GET / http/1.1\r\n\r\n"), HeadError::Malformed);
        assert_eq!(err(b"GET /\r\n\r\n"), HeadError::Malformed);
    }

    #[test]
    fn connection_rules() {
        assert!(!head(b"GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n").keep_alive);
        assert!(
            !head(b"GET / HTTP/1.1\r\nHost: h\r\nConnection: Keep-Alive, CLOSE\r\n\r\n").keep_alive
        );
        assert!(!head(b"GET / HTTP/1.0\r\n\r\n").keep_alive);
        assert!(head(b"GET / HTTP/1.0\r\nconnection: keep-alive\r\n\r\n").keep_alive);
        assert!(head(b"GET / HTTP/1.1\r\nHost: h\r\nConnection: upgrade\r\n\r\n").keep_alive);
    }

    #[test]
    fn bodies() {
        assert_eq!(
            head(b"PUT /k HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\n").body,
            BodyFraming::Length(5)
        );
        assert_eq!(
            head(b"PUT /k HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\ncontent-length: 5\r\n\r\n")
                .body,
            BodyFraming::Length(5)
        );
        assert_eq!(
            head(b"PUT /k HTTP/1.1\r\nHost: h\r\nContent-Length: 99999999999999999999999\r\n\r\n")
                .body,
            BodyFraming::Length(u64::MAX)
        );
        assert_eq!(
            head(b"PUT /k HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: Chunked\r\n\r\n").body,
            BodyFraming::Chunked
        );
        assert_eq!(
            err(b"PUT /k HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n"),
            HeadError::Malformed
        );
        assert_eq!(
            err(b"PUT /k HTTP/1.1\r\nHost: h\r\nContent-Length: -5\r\n\r\n"),
            HeadError::Malformed
        );
        assert_eq!(
            err(b"PUT /k HTTP/1.1\r\nHost: h\r\nContent-Length: 5, 5\r\n\r\n"),
            HeadError::Malformed
        );
        assert_eq!(
            err(b"PUT /k HTTP/1.1\r\nHost: h\r\nContent-Length:\r\n\r\n"),
            HeadError::Malformed
        );
        assert_eq!(
            err(b"PUT /k HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n"),
            HeadError::Malformed
        );
        assert_eq!(
            err(b"PUT /k HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n"),
            HeadError::Malformed
        );
        assert_eq!(
            err(b"PUT /k HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"),
            HeadError::UnsupportedTransferCoding
        );
        assert_eq!(
            err(b"PUT /k HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked, chunked\r\n\r\n"),
            HeadError::Malformed
        );
        assert_eq!(
            err(b"PUT /k HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: \r\n\r\n"),
            HeadError::Malformed
        );
    }

    #[test]
    fn object_fields() {
        let h = head(b"PUT /k HTTP/1.1\r\nHost: h\r\nX-TTL: -1\r\nCache-Control: no-store, max-age=60\r\nX-Flags: 4294967295\r\n\r\n");
        assert_eq!((h.ttl, h.flags), (Some(-1), Some(u32::MAX)));
        assert_eq!(
            head(b"PUT /k HTTP/1.1\r\nHost: h\r\ncache-control: MAX-AGE=\"60\"\r\n\r\n").ttl,
            Some(60)
        );
        assert_eq!(
            head(b"PUT /k HTTP/1.1\r\nHost: h\r\nCache-Control: no-cache\r\n\r\n").ttl,
            None
        );
        assert_eq!(
            err(b"PUT /k HTTP/1.1\r\nHost: h\r\nX-Flags: 4294967296\r\n\r\n"),
            HeadError::Malformed
        );
        assert_eq!(
            err(b"PUT /k HTTP/1.1\r\nHost: h\r\nX-Flags: 1x\r\n\r\n"),
            HeadError::Malformed
        );
        assert_eq!(
            err(b"PUT /k HTTP/1.1\r\nHost: h\r\nX-TTL: ten\r\n\r\n"),
            HeadError::Malformed
        );
        assert_eq!(
            head(b"PUT /k HTTP/1.1\r\nHost: h\r\nCache-Control: max-age=-1\r\n\r\n").ttl,
            Some(-1)
        );
        assert_eq!(
            err(b"PUT /k HTTP/1.1\r\nHost: h\r\nCache-Control: max-age=soon\r\n\r\n"),
            HeadError::Malformed
        );
        let h = head(b"GET /k HTTP/1.1\r\nHost: h\r\nRange:  bytes=0-1 \r\nIf-None-Match: \"3\"\r\nIf-Range: \"3\"\r\n\r\n");
        assert_eq!(
            (h.range, h.if_none_match, h.if_range),
            (
                Some(&b"bytes=0-1"[..]),
                Some(&b"\"3\""[..]),
                Some(&b"\"3\""[..])
            )
        );
    }

    #[test]
    fn expectations() {
        assert!(
            head(b"PUT /k HTTP/1.1\r\nHost: h\r\nExpect: 100-Continue\r\n\r\n").expect_continue
        );
        assert!(!head(b"PUT /k HTTP/1.0\r\nExpect: 100-continue\r\n\r\n").expect_continue);
        assert_eq!(
            err(b"PUT /k HTTP/1.1\r\nHost: h\r\nExpect: tea\r\n\r\n"),
            HeadError::UnsupportedExpectation
        );
    }

    #[test]
    fn malformed_heads() {
        for bad in [
            &b" GET / HTTP/1.1\r\nHost: h\r\n\r\n"[..],
            b"GET  / HTTP/1.1\r\nHost: h\r\n\r\n",
            b"GET / HTTP/1.1 \r\n\r\n",
            b"GET /a b HTTP/1.1\r\nHost: h\r\n\r\n",
            b"GET /\x7f HTTP/1.1\r\nHost: h\r\n\r\n",
            b"G(T / HTTP/1.1\r\nHost: h\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: h\r\nNo-Colon\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: h\r\nName : v\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: h\r\n: v\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: h\r\nA: b\r\n folded\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: h\r\nA: b\rc\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: h\r\nA: b\0c\r\n\r\n",
            b"\x16\x03\x01\x02\x00\x01",
            b"ABCDEFGHIJKLMNOPQRSTUVWXYZABCDEFG",
        ] {
            assert_eq!(
                err(bad),
                HeadError::Malformed,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn lenient_forms() {
        // Bare LF line ends, empty lines before the request, obs-text in values, OWS around values.
        let h = head(b"\r\n\nGET /k HTTP/1.1\nHost: h\nX-Flags:\t7 \nA: caf\xc3\xa9\n\n");
        assert_eq!((h.target, h.flags), (&b"/k"[..], Some(7)));
        assert_eq!(parse(b"\r\n\r"), Ok(None));
        assert_eq!(parse(b"GET / HTTP/1.1\r\nHost: h\r\n\r"), Ok(None));
        assert_eq!(parse(b"GE"), Ok(None));
    }

    #[test]
    fn request_line_limit() {
        let limits = Limits::DEFAULT;
        let ok = [
            b"GET /".as_slice(),
            &vec![b'a'; limits.max_request_line - 14],
            b" HTTP/1.1\r\nHost: h\r\n\r\n",
        ]
        .concat();
        assert_eq!(
            ok.iter().position(|&b| b == b'\r'),
            Some(limits.max_request_line)
        );
        assert!(parse(&ok).unwrap().is_some());
        let long = [
            b"GET /".as_slice(),
            &vec![b'a'; limits.max_request_line - 13],
            b" HTTP/1.1\r\nHost: h\r\n\r\n",
        ]
        .concat();
        assert_eq!(err(&long), HeadError::RequestLineTooLong);
        // Refused before the line ends.
        assert_eq!(
            err(&long[..limits.max_request_line + 2]),
            HeadError::RequestLineTooLong
        );
        assert_eq!(parse(&long[..limits.max_request_line + 1]), Ok(None));
    }

    #[test]
    fn header_limits() {
        let limits = Limits::DEFAULT;
        let mut many = b"GET / HTTP/1.1\r\nHost: h\r\n".to_vec();
        for _ in 1..limits.max_headers {
            many.extend_from_slice(b"A: b\r\n");
        }
        let mut too_many = many.clone();
        many.extend_from_slice(b"\r\n");
        assert!(parse(&many).unwrap().is_some());
        too_many.extend_from_slice(b"A: b\r\n");
        assert_eq!(err(&too_many), HeadError::TooManyHeaders);

        // Exactly max_header_bytes after the request line, blank line included.
        let filler = limits.max_header_bytes - b"Host: h\r\nX: \r\n\r\n".len();
        let fits = [
            b"GET / HTTP/1.1\r\nHost: h\r\nX: ".as_slice(),
            &vec![b'v'; filler],
            b"\r\n\r\n",
        ]
        .concat();
        assert!(parse(&fits).unwrap().is_some());
        let over = [
            b"GET / HTTP/1.1\r\nHost: h\r\nX: ".as_slice(),
            &vec![b'v'; filler + 1],
            b"\r\n\r\n",
        ]
        .concat();
        assert_eq!(err(&over), HeadError::HeadersTooLarge);
        assert_eq!(err(&over[..over.len() - 1]), HeadError::HeadersTooLarge);
        assert_eq!(parse(&over[..over.len() - 2]), Ok(None));
    }

    #[test]
    fn scanner_resumes() {
        let input = b"PUT /k HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabc";
        let mut scanner = HeadScanner::new();
        for end in 0..input.len() {
            let got = scanner.scan(&input[..end], &Limits::DEFAULT).unwrap();
            if end < input.len() - 3 {
                assert_eq!(got, Scan::Partial, "at {end}");
            } else {
                assert_eq!(got, Scan::Complete(input.len() - 3));
                break;
            }
        }
    }

    #[test]
    fn host_rules() {
        // RFC 9112 §3.2: HTTP/1.1 needs exactly one valid Host; HTTP/1.0 may omit it.
        assert_eq!(err(b"GET / HTTP/1.1\r\n\r\n"), HeadError::MissingHost);
        assert_eq!(
            err(b"GET / HTTP/1.1\r\nHost: a\r\nHost: a\r\n\r\n"),
            HeadError::DuplicateHost
        );
        assert_eq!(
            err(b"GET / HTTP/1.0\r\nHost: a\r\nhost: b\r\n\r\n"),
            HeadError::DuplicateHost
        );
        assert_eq!(
            err(b"GET / HTTP/1.0\r\nHost: a b\r\n\r\n"),
            HeadError::InvalidHost
        );
        assert_eq!(head(b"GET / HTTP/1.0\r\n\r\n").version, Version::Http10);
        assert_eq!(
            head(b"GET / HTTP/1.1\r\nhOsT: x\r\n\r\n").version,
            Version::Http11
        );
        for status in [
            HeadError::MissingHost,
            HeadError::DuplicateHost,
            HeadError::InvalidHost,
        ] {
            assert_eq!(status.status().code(), 400);
        }
        for good in [
            &b""[..],
            b"example.com",
            b"example.com:8080",
            b"EXAMPLE.com:",
            b"127.0.0.1:80",
            b"[::1]",
            b"[::1]:8080",
            b"[2001:db8::1]",
            b"[v1.fe80::a+en1]",
            b"a%20b",
            b"x-y_z~!$&'()*+,;=",
        ] {
            let req = [b"GET / HTTP/1.1\r\nHost: ", good, b"\r\n\r\n"].concat();
            assert!(
                parse(&req).is_ok_and(|h| h.is_some()),
                "{:?}",
                String::from_utf8_lossy(good)
            );
        }
        for bad in [
            &b"a b"[..],
            b"a/b",
            b"user@host",
            b"host:port",
            b"a:1:2",
            b"[::1",
            b"[::1]x",
            b"[::1]:x",
            b"[]",
            b"[zz::1]",
            b"[v.x]",
            b"%zz",
            b"a%2",
            b"caf\xc3\xa9",
            b"a\tb",
            b"a?b",
            b"a#b",
        ] {
            let req = [b"GET / HTTP/1.1\r\nHost: ", bad, b"\r\n\r\n"].concat();
            assert_eq!(
                parse(&req),
                Err(HeadError::InvalidHost),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn higher_minor_versions_are_served_as_1_1() {
        // RFC 9110 §2.5: a higher minor of a major we implement is processed as its highest minor.
        for minor in b'2'..=b'9' {
            let req = [b"GET / HTTP/1.", &[minor][..], b"\r\nHost: h\r\n\r\n"].concat();
            let h = head(&req);
            assert_eq!((h.version, h.keep_alive), (Version::Http11, true));
            let no_host = [b"GET / HTTP/1.", &[minor][..], b"\r\n\r\n"].concat();
            assert_eq!(err(&no_host), HeadError::MissingHost);
        }
        for other in [
            &b"HTTP/2.0"[..],
            b"HTTP/3.0",
            b"HTTP/2.1",
            b"HTTP/9.9",
            b"HTTP/0.9",
        ] {
            let req = [b"GET / ", other, b"\r\nHost: h\r\n\r\n"].concat();
            assert_eq!(err(&req), HeadError::VersionNotSupported);
        }
    }

    #[test]
    fn error_statuses() {
        assert_eq!(HeadError::Malformed.status().code(), 400);
        assert_eq!(HeadError::RequestLineTooLong.status().code(), 414);
        assert_eq!(HeadError::HeadersTooLarge.status().code(), 431);
        assert_eq!(HeadError::TooManyHeaders.status().code(), 431);
        assert_eq!(HeadError::VersionNotSupported.status().code(), 505);
        assert_eq!(HeadError::UnsupportedTransferCoding.status().code(), 501);
        assert_eq!(HeadError::UnsupportedExpectation.status().code(), 417);
    }
}
