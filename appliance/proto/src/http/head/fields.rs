//! Header field lines: their syntax, the fields the object API reads (Content-Length,
//! Transfer-Encoding, Connection, Expect, Range, If-None-Match, If-Range, X-TTL,
//! Cache-Control max-age, Host, X-Flags, Authorization), and the rules that combine them into a
//! [`RequestHead`] (framing, keep-alive, expectations, Host presence).
use super::host::valid_host;
use super::syntax::{
    is_tchar, list_items, parse_i64_saturating, parse_u64_saturating, strip_prefix_ignore_case,
    trim_ows,
};
use super::{BodyFraming, HeadError, Method, RequestHead, Version};

#[derive(Default)]
pub(super) struct Fields<'a> {
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
    authorization: Option<&'a [u8]>,
    /// `Authorization` field lines seen (more than one is refused: which would count?).
    authorizations: u32,
    /// `Host` field lines seen.
    hosts: u32,
    host_invalid: bool,
}

impl<'a> Fields<'a> {
    pub(super) fn add(&mut self, line: &'a [u8]) -> Result<(), HeadError> {
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
        } else if is("authorization") {
            self.authorizations += 1;
            self.authorization = Some(value);
        } else if is("host") {
            self.hosts += 1;
            self.host_invalid |= !valid_host(value);
        } else if is("x-flags") {
            let flags = parse_u64_saturating(value).and_then(|n| u32::try_from(n).ok());
            self.flags = Some(flags.ok_or(HeadError::Malformed)?);
        }
        Ok(())
    }

    pub(super) fn finish(
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
        if self.authorizations > 1 {
            return Err(HeadError::Malformed);
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
            authorization: self.authorization,
        })
    }
}
