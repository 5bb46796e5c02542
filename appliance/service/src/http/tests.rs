//! Session tests against an in-memory backend: every status byte-exact, splits at every byte
//! boundary, pipelining, HTTP/1.0, chunked bodies, backpressure.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;

use super::*;

/// value, flags, cas, ttl as sent.
type Entry = (Vec<u8>, u32, u64, i64);

/// A map standing in for the store.
struct MemBackend {
    items: RefCell<BTreeMap<Vec<u8>, Entry>>,
    next_cas: Cell<u64>,
    events: RefCell<Vec<Event>>,
    item_size_max: usize,
    out_high_water: usize,
}

impl MemBackend {
    fn new() -> MemBackend {
        MemBackend {
            items: RefCell::default(),
            next_cas: Cell::new(1),
            events: RefCell::default(),
            item_size_max: 64,
            out_high_water: 1 << 20,
        }
    }

    fn item(&self, key: &[u8]) -> Option<Entry> {
        self.items.borrow().get(key).cloned()
    }
}

impl Backend for MemBackend {
    fn record(&self, worker: usize, event: Event) {
        assert_eq!(worker, 0);
        self.events.borrow_mut().push(event);
    }
    fn item_size_max(&self) -> usize {
        self.item_size_max
    }
    fn out_high_water(&self) -> usize {
        self.out_high_water
    }
    fn read<R>(&self, key: &[u8], _now: Now, f: impl FnOnce(Option<Object<'_>>) -> R) -> R {
        let items = self.items.borrow();
        f(items.get(key).map(|(value, flags, cas, _)| Object {
            value,
            flags: *flags,
            cas: *cas,
            large: false,
        }))
    }
    fn put(&self, key: &[u8], value: &[u8], flags: u32, ttl: i64, _now: Now) -> PutOutcome {
        if value == b"NOMEM" {
            return PutOutcome::OutOfMemory;
        }
        if value == b"BIG" {
            return PutOutcome::TooLarge;
        }
        let cas = self.next_cas.get();
        self.next_cas.set(cas + 1);
        let old = self
            .items
            .borrow_mut()
            .insert(key.to_vec(), (value.to_vec(), flags, cas, ttl));
        PutOutcome::Stored {
            created: old.is_none(),
            cas: Some(cas),
        }
    }
    fn delete(&self, key: &[u8], _now: Now) -> bool {
        self.items.borrow_mut().remove(key).is_some()
    }
}

const NOW: Now = Now {
    store: 10,
    unix: 1_700_000_000,
    mono_ms: 0,
    mono_ns: 0,
};

/// Feeds `input` in one piece; returns the output and the last flow.
fn run(backend: &MemBackend, input: &[u8]) -> (String, Flow) {
    let mut session = HttpSession::new(0);
    let mut out = Vec::new();
    let flow = session.on_bytes_with(input, NOW, backend, &mut out);
    (String::from_utf8_lossy(&out).into_owned(), flow)
}

fn seeded() -> MemBackend {
    let backend = MemBackend::new();
    backend.put(b"k", b"0123456789", 42, 0, NOW);
    backend
}

const H404: &str = "HTTP/1.1 404 Not Found\r\nServer: ringstore\r\nContent-Length: 0\r\n\r\n";

fn error(status: &str) -> String {
    format!(
        "HTTP/1.1 {status}\r\nServer: ringstore\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
}

#[test]
fn get_miss_is_404_and_keeps_the_connection() {
    assert_eq!(
        run(&MemBackend::new(), b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n"),
        (H404.to_string(), Flow::Continue)
    );
}

#[test]
fn put_get_head_delete() {
    let b = MemBackend::new();
    let (out, flow) = run(
        &b,
        b"PUT /a%2Fb HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nX-Flags: 7\r\nX-TTL: 60\r\n\r\nhello",
    );
    assert_eq!(
        out,
        "HTTP/1.1 201 Created\r\nServer: ringstore\r\nContent-Length: 0\r\nETag: \"1\"\r\n\r\n"
    );
    assert_eq!(flow, Flow::Continue);
    assert_eq!(b.item(b"a/b"), Some((b"hello".to_vec(), 7, 1, 60)));

    let (out, _) = run(
        &b,
        b"PUT /a%2Fb HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nCache-Control: max-age=5\r\n\r\nbye",
    );
    assert_eq!(
        out,
        "HTTP/1.1 204 No Content\r\nServer: ringstore\r\nETag: \"2\"\r\n\r\n"
    );
    assert_eq!(b.item(b"a/b"), Some((b"bye".to_vec(), 0, 2, 5)));

    let (out, _) = run(&b, b"GET /a/b HTTP/1.1\r\nHost: h\r\n\r\n");
    assert_eq!(out, "HTTP/1.1 200 OK\r\nServer: ringstore\r\nContent-Length: 3\r\nETag: \"2\"\r\nX-Flags: 0\r\n\r\nbye");
    let (out, _) = run(
        &b,
        b"HEAD /a/b HTTP/1.1\r\nHost: h\r\nRange: bytes=0-0\r\n\r\n",
    );
    assert_eq!(out, "HTTP/1.1 200 OK\r\nServer: ringstore\r\nContent-Length: 3\r\nETag: \"2\"\r\nX-Flags: 0\r\n\r\n");

    let (out, _) = run(&b, b"DELETE /a/b HTTP/1.1\r\nHost: h\r\n\r\n");
    assert_eq!(out, "HTTP/1.1 204 No Content\r\nServer: ringstore\r\n\r\n");
    assert_eq!(run(&b, b"DELETE /a/b HTTP/1.1\r\nHost: h\r\n\r\n").0, H404);
    assert_eq!(run(&b, b"HEAD /a/b HTTP/1.1\r\nHost: h\r\n\r\n").0, H404);
}

#[test]
fn other_methods_are_405_with_allow() {
    let (out, flow) = run(
        &MemBackend::new(),
        b"POST /k HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\n\r\nxyGET /k HTTP/1.1\r\nHost: h\r\n\r\n",
    );
    assert_eq!(
        out,
        format!("HTTP/1.1 405 Method Not Allowed\r\nServer: ringstore\r\nContent-Length: 0\r\nAllow: GET, HEAD, PUT, DELETE\r\n\r\n{H404}")
    );
    assert_eq!(flow, Flow::Continue);
}

#[test]
fn ranges() {
    let b = seeded();
    let head = |status: &str, len: usize, extra: &str| {
        format!("HTTP/1.1 {status}\r\nServer: ringstore\r\nContent-Length: {len}\r\nETag: \"1\"\r\nX-Flags: 42\r\n{extra}\r\n")
    };
    assert_eq!(
        run(
            &b,
            b"GET /k HTTP/1.1\r\nHost: h\r\nRange: bytes=2-4\r\n\r\n"
        )
        .0,
        head("206 Partial Content", 3, "Content-Range: bytes 2-4/10\r\n") + "234"
    );
    assert_eq!(
        run(&b, b"GET /k HTTP/1.1\r\nHost: h\r\nRange: bytes=7-\r\n\r\n").0,
        head("206 Partial Content", 3, "Content-Range: bytes 7-9/10\r\n") + "789"
    );
    assert_eq!(
        run(&b, b"GET /k HTTP/1.1\r\nHost: h\r\nRange: bytes=-2\r\n\r\n").0,
        head("206 Partial Content", 2, "Content-Range: bytes 8-9/10\r\n") + "89"
    );
    assert_eq!(
        run(
            &b,
            b"GET /k HTTP/1.1\r\nHost: h\r\nRange: bytes=0-1,4-5\r\n\r\n"
        )
        .0,
        head("200 OK", 10, "") + "0123456789"
    );
    assert_eq!(
        run(&b, b"GET /k HTTP/1.1\r\nHost: h\r\nRange: bytes=10-\r\n\r\n"),
        ("HTTP/1.1 416 Range Not Satisfiable\r\nServer: ringstore\r\nContent-Length: 0\r\nContent-Range: bytes */10\r\n\r\n".into(), Flow::Continue)
    );
    assert_eq!(
        run(
            &b,
            b"GET /k HTTP/1.1\r\nHost: h\r\nRange: bytes=0-0\r\nIf-Range: \"9\"\r\n\r\n"
        )
        .0,
        head("200 OK", 10, "") + "0123456789"
    );
    assert_eq!(
        run(
            &b,
            b"GET /k HTTP/1.1\r\nHost: h\r\nRange: bytes=0-0\r\nIf-Range: \"1\"\r\n\r\n"
        )
        .0,
        head("206 Partial Content", 1, "Content-Range: bytes 0-0/10\r\n") + "0"
    );
}

#[test]
fn if_none_match_gives_304() {
    let b = seeded();
    let not_modified =
        "HTTP/1.1 304 Not Modified\r\nServer: ringstore\r\nETag: \"1\"\r\nX-Flags: 42\r\n\r\n";
    assert_eq!(
        run(
            &b,
            b"GET /k HTTP/1.1\r\nHost: h\r\nIf-None-Match: \"5\", W/\"1\"\r\n\r\n"
        )
        .0,
        not_modified
    );
    assert_eq!(
        run(
            &b,
            b"HEAD /k HTTP/1.1\r\nHost: h\r\nIf-None-Match: *\r\n\r\n"
        )
        .0,
        not_modified
    );
    assert!(run(
        &b,
        b"GET /k HTTP/1.1\r\nHost: h\r\nIf-None-Match: \"2\"\r\n\r\n"
    )
    .0
    .starts_with("HTTP/1.1 200 OK\r\n"));
}

#[test]
fn put_framing_errors() {
    let b = MemBackend::new();
    assert_eq!(
        run(
            &b,
            b"PUT /k HTTP/1.1\r\nHost: h\r\n\r\nGET /k HTTP/1.1\r\nHost: h\r\n\r\n"
        ),
        (error("411 Length Required"), Flow::Close)
    );
    assert_eq!(
        run(
            &b,
            b"PUT /k HTTP/1.1\r\nHost: h\r\nContent-Length: 65\r\n\r\n"
        ),
        (error("413 Content Too Large"), Flow::Close)
    );
    assert_eq!(
        run(
            &b,
            b"PUT /k HTTP/1.1\r\nHost: h\r\nContent-Length: 65\r\nExpect: 100-continue\r\n\r\n"
        ),
        (error("413 Content Too Large"), Flow::Close)
    );
    assert_eq!(
        run(
            &b,
            b"PUT /k HTTP/1.1\r\nHost: h\r\nContent-Length: 99999999999999999999999\r\n\r\n"
        )
        .0,
        error("413 Content Too Large")
    );
    assert_eq!(b.item(b"k"), None);
}

#[test]
fn expect_100_continue() {
    let b = MemBackend::new();
    let mut session = HttpSession::new(0);
    let mut out = Vec::new();
    let flow = session.on_bytes_with(
        b"PUT /k HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n",
        NOW,
        &b,
        &mut out,
    );
    assert_eq!(
        (out.as_slice(), flow),
        (&b"HTTP/1.1 100 Continue\r\n\r\n"[..], Flow::Continue)
    );
    assert!(session.has_partial_request());
    session.on_bytes_with(b"hi", NOW, &b, &mut out);
    assert_eq!(
        String::from_utf8_lossy(&out),
        "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nServer: ringstore\r\nContent-Length: 0\r\nETag: \"1\"\r\n\r\n"
    );
    assert!(!session.has_partial_request());
}

#[test]
fn store_refusals() {
    let b = MemBackend::new();
    assert_eq!(
        run(
            &b,
            b"PUT /k HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nBIG"
        ),
        (
            "HTTP/1.1 413 Content Too Large\r\nServer: ringstore\r\nContent-Length: 0\r\n\r\n"
                .into(),
            Flow::Continue
        )
    );
    assert_eq!(
        run(
            &b,
            b"PUT /k HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nNOMEM"
        )
        .0,
        "HTTP/1.1 507 Insufficient Storage\r\nServer: ringstore\r\nContent-Length: 0\r\n\r\n"
    );
}

#[test]
fn head_errors_close_the_connection() {
    let b = MemBackend::new();
    let long_line = [
        b"GET /".as_slice(),
        &[b'a'; 9000],
        b" HTTP/1.1\r\nHost: h\r\n\r\n",
    ]
    .concat();
    let mut big_headers = b"GET /k HTTP/1.1\r\nHost: h\r\n".to_vec();
    for _ in 0..200 {
        big_headers.extend_from_slice(format!("X-Filler: {}\r\n", "v".repeat(100)).as_bytes());
    }
    big_headers.extend_from_slice(b"\r\n");
    let mut many_headers = b"GET /k HTTP/1.1\r\nHost: h\r\n".to_vec();
    for _ in 0..101 {
        many_headers.extend_from_slice(b"A: b\r\n");
    }
    many_headers.extend_from_slice(b"\r\n");
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (b"GARBAGE\r\n\r\n".to_vec(), "400 Bad Request"),
        (b"\x16\x03\x01\x00".to_vec(), "400 Bad Request"),
        (
            b"GET / HTTP/1.1\r\nHost: h\r\n\r\n".to_vec(),
            "400 Bad Request",
        ),
        (
            b"GET /a%20b HTTP/1.1\r\nHost: h\r\n\r\n".to_vec(),
            "400 Bad Request",
        ),
        (
            b"GET /a%zz HTTP/1.1\r\nHost: h\r\n\r\n".to_vec(),
            "400 Bad Request",
        ),
        (
            [
                b"GET /".as_slice(),
                &[b'k'; 251],
                b" HTTP/1.1\r\nHost: h\r\n\r\n",
            ]
            .concat(),
            "400 Bad Request",
        ),
        (
            b"GET /k HTTP/1.1\r\nHost: h\r\nBad Header: x\r\n\r\n".to_vec(),
            "400 Bad Request",
        ),
        (long_line, "414 URI Too Long"),
        (big_headers, "431 Request Header Fields Too Large"),
        (many_headers, "431 Request Header Fields Too Large"),
        (
            b"GET /k HTTP/2.0\r\n\r\n".to_vec(),
            "505 HTTP Version Not Supported",
        ),
        (
            b"PUT /k HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip\r\n\r\n".to_vec(),
            "501 Not Implemented",
        ),
        (
            b"PUT /k HTTP/1.1\r\nHost: h\r\nExpect: tea\r\nContent-Length: 1\r\n\r\nx".to_vec(),
            "417 Expectation Failed",
        ),
    ];
    for (input, status) in cases {
        let mut session = HttpSession::new(0);
        let mut out = Vec::new();
        let mut with_next = input.clone();
        with_next.extend_from_slice(b"GET /k HTTP/1.1\r\nHost: h\r\n\r\n");
        let flow = session.on_bytes_with(&with_next, NOW, &b, &mut out);
        assert_eq!(
            (String::from_utf8_lossy(&out).into_owned(), flow),
            (error(status), Flow::Close),
            "{status}"
        );
        assert_eq!(
            session.on_bytes_with(b"GET /k HTTP/1.1\r\nHost: h\r\n\r\n", NOW, &b, &mut out),
            Flow::Close
        );
        assert_eq!(
            String::from_utf8_lossy(&out),
            error(status),
            "nothing after the error"
        );
    }
}

#[test]
fn pipelining_answers_in_order() {
    let b = MemBackend::new();
    let input = b"PUT /x HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\n\r\n1GET /x HTTP/1.1\r\nHost: h\r\n\r\nDELETE /x HTTP/1.1\r\nHost: h\r\n\r\nGET /x HTTP/1.1\r\nHost: h\r\n\r\n";
    let (out, flow) = run(&b, input);
    let expected = [
        "HTTP/1.1 201 Created\r\nServer: ringstore\r\nContent-Length: 0\r\nETag: \"1\"\r\n\r\n",
        "HTTP/1.1 200 OK\r\nServer: ringstore\r\nContent-Length: 1\r\nETag: \"1\"\r\nX-Flags: 0\r\n\r\n1",
        "HTTP/1.1 204 No Content\r\nServer: ringstore\r\n\r\n",
        H404,
    ]
    .concat();
    assert_eq!((out, flow), (expected, Flow::Continue));
    let events = b.events.borrow().clone();
    assert_eq!(
        events,
        [
            Event::Set,
            Event::Response(Status::Created),
            Event::Get { hit: true },
            Event::Response(Status::Ok),
            Event::Delete { hit: true },
            Event::Response(Status::NoContent),
            Event::Get { hit: false },
            Event::Response(Status::NotFound),
        ]
    );
}

#[test]
fn connection_close_and_http10() {
    let b = seeded();
    let (out, flow) = run(
        &b,
        b"GET /nope HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\nGET /k HTTP/1.1\r\nHost: h\r\n\r\n",
    );
    assert_eq!((out, flow), ("HTTP/1.1 404 Not Found\r\nServer: ringstore\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".into(), Flow::Close));

    let (out, flow) = run(&b, b"GET /nope HTTP/1.0\r\n\r\n");
    assert_eq!((out, flow), ("HTTP/1.1 404 Not Found\r\nServer: ringstore\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".into(), Flow::Close));

    let (out, flow) = run(
        &b,
        b"GET /nope HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET /nope HTTP/1.0\r\n\r\n",
    );
    let keep = "HTTP/1.1 404 Not Found\r\nServer: ringstore\r\nContent-Length: 0\r\nConnection: keep-alive\r\n\r\n";
    let close = "HTTP/1.1 404 Not Found\r\nServer: ringstore\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
    assert_eq!((out, flow), (format!("{keep}{close}"), Flow::Close));

    let (out, flow) = run(&b, b"PUT /k HTTP/1.0\r\nContent-Length: 1\r\n\r\nz");
    assert_eq!((out, flow), ("HTTP/1.1 204 No Content\r\nServer: ringstore\r\nETag: \"2\"\r\nConnection: close\r\n\r\n".into(), Flow::Close));
}

#[test]
fn chunked_put() {
    let b = MemBackend::new();
    let (out, flow) = run(&b, b"PUT /c HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\nGET /c HTTP/1.1\r\nHost: h\r\n\r\n");
    assert_eq!(
        (out, flow),
        (
            "HTTP/1.1 201 Created\r\nServer: ringstore\r\nContent-Length: 0\r\nETag: \"1\"\r\n\r\nHTTP/1.1 200 OK\r\nServer: ringstore\r\nContent-Length: 5\r\nETag: \"1\"\r\nX-Flags: 0\r\n\r\nabcde".into(),
            Flow::Continue
        )
    );
    let too_big = format!(
        "PUT /c HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n41\r\n{}\r\n0\r\n\r\n",
        "x".repeat(65)
    );
    assert_eq!(
        run(&b, too_big.as_bytes()),
        (error("413 Content Too Large"), Flow::Close)
    );
    assert_eq!(
        run(
            &b,
            b"PUT /c HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"
        ),
        (error("400 Bad Request"), Flow::Close)
    );
    assert_eq!(
        run(
            &b,
            b"PUT /c HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
        ),
        (error("400 Bad Request"), Flow::Close)
    );
}

#[test]
fn bodies_of_other_methods_are_dropped() {
    let b = seeded();
    let (out, flow) = run(
        &b,
        b"GET /nope HTTP/1.1\r\nHost: h\r\nContent-Length: 4\r\n\r\nGET GET /nope HTTP/1.1\r\nHost: h\r\n\r\n",
    );
    assert_eq!((out, flow), (format!("{H404}{H404}"), Flow::Continue));
    let (out, flow) = run(
        &b,
        b"DELETE /nope HTTP/1.1\r\nHost: h\r\nContent-Length: 65\r\n\r\n",
    );
    assert_eq!((out, flow), ("HTTP/1.1 404 Not Found\r\nServer: ringstore\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".into(), Flow::Close));
}

/// A conversation touching every path; its output must not depend on how it is split.
fn script() -> Vec<u8> {
    [
        &b"\r\nPUT /s HTTP/1.1\r\nHost: h\r\nContent-Length: 4\r\nX-Flags: 9\r\nExpect: 100-continue\r\n\r\nabcd"[..],
        b"GET /s HTTP/1.1\r\nHost: h\r\nRange: bytes=1-2\r\n\r\n",
        b"PUT /t HTTP/1.1\nHost: h\nTransfer-Encoding: chunked\n\n2\nxy\n0\n\n",
        b"HEAD /t HTTP/1.1\r\nHost: h\r\nIf-None-Match: \"2\"\r\n\r\n",
        b"GET /missing HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabc",
        b"OPTIONS * HTTP/1.1\r\nHost: h\r\n\r\n",
        b"DELETE /s HTTP/1.1\r\nHost: h\r\n\r\n",
        b"GET /s HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
        b"GET /t HTTP/1.1\r\nHost: h\r\nRange: bytes=5-\r\n\r\n",
        b"GET /t HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n",
        b"GET /after-close HTTP/1.1\r\nHost: h\r\n\r\n",
    ]
    .concat()
}

fn run_pieces(pieces: &[&[u8]]) -> (Vec<u8>, Flow, MemBackend) {
    let b = MemBackend::new();
    let mut session = HttpSession::new(0);
    let mut out = Vec::new();
    let mut flow = Flow::Continue;
    for piece in pieces {
        flow = session.on_bytes_with(piece, NOW, &b, &mut out);
        if flow == Flow::Close {
            break;
        }
    }
    (out, flow, b)
}

#[test]
fn splits_at_every_byte_give_the_same_output() {
    let input = script();
    let (whole, flow, _) = run_pieces(&[&input]);
    assert_eq!(flow, Flow::Close);
    assert_eq!(
        whole
            .windows(12)
            .filter(|w| w.starts_with(b"HTTP/1.1 "))
            .count(),
        11,
        "{}",
        String::from_utf8_lossy(&whole)
    );
    for cut in 0..=input.len() {
        let (out, flow, _) = run_pieces(&[&input[..cut], &input[cut..]]);
        assert_eq!(
            (String::from_utf8_lossy(&out), flow),
            (String::from_utf8_lossy(&whole), Flow::Close),
            "cut at {cut}"
        );
    }
    let bytes: Vec<&[u8]> = input.chunks(1).collect();
    assert_eq!(run_pieces(&bytes).0, whole);
}

#[test]
fn errors_are_the_same_at_every_split() {
    let long_line = [
        b"GET /".as_slice(),
        &[b'a'; 8300],
        b" HTTP/1.1\r\nHost: h\r\n\r\n",
    ]
    .concat();
    let mut wide = b"GET /k HTTP/1.1\r\nHost: h\r\n".to_vec();
    wide.extend_from_slice(format!("X: {}\r\n\r\n", "v".repeat(16_400)).as_bytes());
    for input in [
        long_line,
        wide,
        b"GET /k HTTP/1.1\r\nHost: h\r\n\rX: y\r\n\r\n".to_vec(),
        b"\r\r\n".to_vec(),
    ] {
        let (whole, flow, _) = run_pieces(&[&input]);
        assert_eq!(flow, Flow::Close);
        for cut in (0..=input.len()).step_by(97).chain([1, 2, input.len() - 1]) {
            assert_eq!(
                run_pieces(&[&input[..cut], &input[cut..]]).0,
                whole,
                "cut at {cut}"
            );
        }
    }
}

#[test]
fn backpressure_drains_and_resumes() {
    let mut b = seeded();
    b.out_high_water = 100;
    let one = b"GET /k HTTP/1.1\r\nHost: h\r\n\r\n";
    let input = one.repeat(5);
    let mut session = HttpSession::new(0);
    let mut out = Vec::new();
    let mut flows = vec![session.on_bytes_with(&input, NOW, &b, &mut out)];
    let mut sent = Vec::new();
    while *flows.last().unwrap() == Flow::Drain {
        assert!(session.has_partial_request());
        sent.append(&mut out);
        flows.push(session.on_bytes_with(b"", NOW, &b, &mut out));
        assert!(flows.len() < 20);
    }
    sent.append(&mut out);
    assert!(flows.len() > 2, "{flows:?}");
    assert!(!session.has_partial_request());
    let reply = "HTTP/1.1 200 OK\r\nServer: ringstore\r\nContent-Length: 10\r\nETag: \"1\"\r\nX-Flags: 42\r\n\r\n0123456789";
    assert_eq!(String::from_utf8_lossy(&sent), reply.repeat(5));
}

#[test]
fn partial_request_tracking() {
    let b = MemBackend::new();
    let mut session = HttpSession::new(0);
    let mut out = Vec::new();
    assert!(!session.has_partial_request());
    session.on_bytes_with(b"GET /k HT", NOW, &b, &mut out);
    assert!(session.has_partial_request());
    session.on_bytes_with(b"TP/1.1\r\nHost: h\r\n\r\n", NOW, &b, &mut out);
    assert!(!session.has_partial_request());
    assert_eq!(String::from_utf8_lossy(&out), H404);
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    fn conversation() -> impl Strategy<Value = Vec<u8>> {
        let pieces = prop::sample::select(vec![
            &b"GET /k HTTP/1.1\r\nHost: h\r\n\r\n"[..],
            b"HEAD /k HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
            b"PUT /k HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabc",
            b"PUT /k HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\nz",
            b"PUT /j HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nq\r\n0\r\n\r\n",
            b"DELETE /k HTTP/1.1\r\nHost: h\r\n\r\n",
            b"GET /k HTTP/1.1\r\nHost: h\r\nRange: bytes=1-\r\n\r\n",
            b"GET /j HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\n\r\nxx",
            b"\r\n",
            b"GET",
            b"\r",
            b"\n",
            b" ",
            b"\0",
        ]);
        prop::collection::vec(pieces, 0..12).prop_map(|ps| ps.concat())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 500, ..ProptestConfig::default() })]

        #[test]
        fn split_conversations_answer_identically(input in conversation(), cuts in prop::collection::vec(any::<usize>(), 0..5)) {
            let (whole, whole_flow, _) = run_pieces(&[&input]);
            let mut ends: Vec<usize> = cuts.iter().map(|c| c % (input.len() + 1)).collect();
            ends.push(0);
            ends.push(input.len());
            ends.sort_unstable();
            let pieces: Vec<&[u8]> = ends.windows(2).map(|w| &input[w[0]..w[1]]).collect();
            let (split, split_flow, _) = run_pieces(&pieces);
            prop_assert_eq!(String::from_utf8_lossy(&split), String::from_utf8_lossy(&whole));
            prop_assert_eq!(split_flow == Flow::Close, whole_flow == Flow::Close);
        }

        #[test]
        fn random_bytes_never_panic_and_stay_bounded(input in prop::collection::vec(any::<u8>(), 0..400), cut in any::<usize>()) {
            let b = MemBackend::new();
            let mut session = HttpSession::new(0);
            let mut out = Vec::new();
            let cut = cut % (input.len() + 1);
            session.on_bytes_with(&input[..cut], NOW, &b, &mut out);
            session.on_bytes_with(&input[cut..], NOW, &b, &mut out);
            prop_assert!(session.pending.len() <= input.len());
            prop_assert!(out.is_empty() || out.starts_with(b"HTTP/1.1 "));
        }
    }
}
