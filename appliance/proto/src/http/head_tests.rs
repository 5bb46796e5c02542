//! Unit tests of the request-head scanner and parser.
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
        head(b"PUT /k HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\ncontent-length: 5\r\n\r\n").body,
        BodyFraming::Length(5)
    );
    assert_eq!(
        head(b"PUT /k HTTP/1.1\r\nHost: h\r\nContent-Length: 99999999999999999999999\r\n\r\n").body,
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
    assert!(head(b"PUT /k HTTP/1.1\r\nHost: h\r\nExpect: 100-Continue\r\n\r\n").expect_continue);
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
