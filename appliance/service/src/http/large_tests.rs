//! Session tests of large objects against an in-memory device: a PUT body is staged chunk by
//! chunk with the connection held after each, the manifest only after every chunk is durable,
//! GET and Range stream from the chunks, and failures give 500/507 or a short body.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashSet};

use ringstore_durable::Manifest;

use super::*;
use crate::device::Device as DeviceApi;

const CHUNK: usize = 1000;
const ITEM_MAX: usize = 100;

/// key → (value or manifest, large, cas).
type Items = BTreeMap<Vec<u8>, (Vec<u8>, bool, u64)>;
/// (object, index) → (bytes, the call that staged them).
type Chunks = BTreeMap<(u64, u32), (Vec<u8>, u64)>;

/// A keyspace plus a chunk store that models the runtime's hold-until-durable rule: every
/// session call is numbered, and what a call staged is durable from the next call on.
#[derive(Default)]
struct Device {
    items: RefCell<Items>,
    chunks: RefCell<Chunks>,
    call: Cell<u64>,
    next_id: Cell<u64>,
    /// Chunks staged per call (the most ever, to check at most one is in RAM per call).
    staged_in_call: Cell<usize>,
    max_staged_in_call: Cell<usize>,
    fail_objects: RefCell<HashSet<u64>>,
    refuse_chunk: Cell<Option<u32>>,
    lose_chunk: Cell<Option<u32>>,
    abandoned: RefCell<Vec<(u64, u32)>>,
    out_high_water: usize,
    /// The object of each staged chunk, by token - 1.
    token_objects: RefCell<Vec<u64>>,
    /// Tokens reported settled so far.
    settled: Cell<u64>,
    /// Whole-chunk reads and range reads made.
    whole_reads: Cell<usize>,
    range_reads: Cell<usize>,
    /// The server's unfinished uploads and the region they share (`None`: unbounded).
    uploads: Option<(std::sync::Arc<UploadLedger>, u64)>,
}

impl Backend for Device {
    fn item_size_max(&self) -> usize {
        ITEM_MAX
    }
    fn out_high_water(&self) -> usize {
        self.out_high_water
    }
    fn read<R>(&self, key: &[u8], _now: Now, f: impl FnOnce(Option<Object<'_>>) -> R) -> R {
        let items = self.items.borrow();
        f(items.get(key).map(|(value, large, cas)| Object {
            value,
            flags: 0,
            cas: *cas,
            large: *large,
        }))
    }
    fn put(&self, key: &[u8], value: &[u8], _flags: u32, _ttl: i64, _now: Now) -> PutOutcome {
        self.store(key, value, false)
    }
    fn delete(&self, key: &[u8], _now: Now) -> bool {
        self.items.borrow_mut().remove(key).is_some()
    }
    fn large(&self) -> Option<LargeLimits> {
        Some(LargeLimits {
            object_size_max: 1 << 20,
            chunk_len: CHUNK,
            region_len: self.uploads.as_ref().map_or(u64::MAX, |u| u.1),
        })
    }
    fn uploads(&self) -> Option<&std::sync::Arc<UploadLedger>> {
        self.uploads.as_ref().map(|u| &u.0)
    }
    fn device(&self) -> Option<&dyn DeviceApi> {
        Some(self)
    }
    fn put_large(&self, key: &[u8], manifest: &[u8], _: u32, _: i64, _: Now) -> PutOutcome {
        let m = Manifest::decode(manifest).expect("a valid manifest");
        let chunks = self.chunks.borrow();
        for index in 0..m.chunks() {
            let (_, call) = chunks.get(&(m.object, index)).expect("every chunk staged");
            assert!(
                *call < self.call.get(),
                "manifest staged before chunk {index} was durable"
            );
        }
        drop(chunks);
        self.store(key, manifest, true)
    }
}

impl ringstore_store::Journal for Device {
    fn record(&self, _: ringstore_store::Mutation<'_>) -> Result<(), ringstore_store::StoreError> {
        Ok(()) // small values go through `Backend::put`, which this keyspace models directly
    }
}

impl DeviceApi for Device {
    fn staged(&self) -> u64 {
        self.token_objects.borrow().len() as u64
    }
    fn chunk_len(&self) -> usize {
        CHUNK
    }
    fn region_len(&self) -> u64 {
        u64::MAX
    }
    fn new_object_id(&self) -> u64 {
        self.next_id.set(self.next_id.get() + 1);
        self.next_id.get()
    }
    fn stage_chunk(
        &self,
        object: u64,
        index: u32,
        bytes: &[u8],
    ) -> Result<(), ringstore_store::StoreError> {
        assert!(bytes.len() <= CHUNK && !bytes.is_empty());
        if self.refuse_chunk.get() == Some(index) {
            return Err(ringstore_store::StoreError::OutOfMemory);
        }
        self.staged_in_call.set(self.staged_in_call.get() + 1);
        let fresh = self
            .chunks
            .borrow_mut()
            .insert((object, index), (bytes.to_vec(), self.call.get()));
        assert!(fresh.is_none(), "chunk {index} staged twice");
        self.token_objects.borrow_mut().push(object);
        Ok(())
    }
    fn abandon_object(&self, object: u64, chunks: u32) {
        self.abandoned.borrow_mut().push((object, chunks));
    }
    fn read_chunk(&self, object: u64, index: u32) -> Option<Vec<u8>> {
        self.whole_reads.set(self.whole_reads.get() + 1);
        if self.lose_chunk.get() == Some(index) {
            return None;
        }
        let chunks = self.chunks.borrow();
        let (bytes, call) = chunks.get(&(object, index))?;
        assert!(*call < self.call.get(), "read of a chunk not yet durable");
        Some(bytes.clone())
    }
    fn read_chunk_range(
        &self,
        object: u64,
        index: u32,
        start: usize,
        end: usize,
    ) -> Option<Vec<u8>> {
        self.range_reads.set(self.range_reads.get() + 1);
        if self.lose_chunk.get() == Some(index) {
            return None;
        }
        let chunks = self.chunks.borrow();
        let (bytes, call) = chunks.get(&(object, index))?;
        assert!(*call < self.call.get(), "read of a chunk not yet durable");
        assert!(start < end, "an empty range is never asked for");
        bytes.get(start..end).map(<[u8]>::to_vec)
    }
    fn stats(&self, _: &mut dyn FnMut(&'static str, u64)) {}
}

impl Device {
    fn new() -> Device {
        Device {
            out_high_water: 1500,
            ..Device::default()
        }
    }

    fn store(&self, key: &[u8], value: &[u8], large: bool) -> PutOutcome {
        let cas = self.next_id.get() + 100;
        self.next_id.set(self.next_id.get() + 1);
        let old = self
            .items
            .borrow_mut()
            .insert(key.to_vec(), (value.to_vec(), large, cas));
        PutOutcome::Stored {
            created: old.is_none(),
            cas: Some(cas),
        }
    }

    /// One session call, as the runtime makes it, and then the flush that settles what it
    /// staged (a chunk of an object in `fail_objects` fails).
    fn call(&self, session: &mut HttpSession, input: &[u8], out: &mut Vec<u8>) -> Flow {
        self.call.set(self.call.get() + 1);
        self.staged_in_call.set(0);
        let flow = session.on_bytes_with(input, NOW, self, out);
        self.max_staged_in_call
            .set(self.max_staged_in_call.get().max(self.staged_in_call.get()));
        while self.settled.get() < self.staged() {
            let token = self.settled.get() + 1;
            self.settled.set(token);
            let object = self.token_objects.borrow()[usize::try_from(token).unwrap() - 1];
            let ok = !self.fail_objects.borrow().contains(&object);
            session.on_durable(token, ok, out);
        }
        assert!(!session.awaits_durable(), "every token is settled");
        flow
    }

    /// Feeds `input` in pieces of `split` bytes, resuming after every `Flow::Drain` the way
    /// the runtime does (after the flush that releases the connection, with the output sent).
    /// Returns everything written and the last flow.
    fn drive(&self, input: &[u8], split: usize) -> (Vec<u8>, Flow) {
        let mut session = HttpSession::new(0);
        let (mut sent, mut out) = (Vec::new(), Vec::new());
        let mut flow = Flow::Continue;
        for piece in input.chunks(split.max(1)) {
            flow = self.call(&mut session, piece, &mut out);
            while flow == Flow::Drain {
                assert!(
                    out.len() <= self.out_high_water + CHUNK,
                    "output bounded: {}",
                    out.len()
                );
                sent.append(&mut out);
                flow = self.call(&mut session, &[], &mut out);
            }
            sent.append(&mut out);
            if flow == Flow::Close {
                break;
            }
        }
        (sent, flow)
    }
}

const NOW: Now = Now {
    store: 10,
    unix: 1_700_000_000,
    mono_ms: 0,
    mono_ns: 0,
};

fn body(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| u8::try_from((i * 7 + i / 251) % 256).unwrap())
        .collect()
}

fn put_request(key: &str, body: &[u8]) -> Vec<u8> {
    let mut r = format!(
        "PUT /{key} HTTP/1.1\r\nHost: h\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    r.extend_from_slice(body);
    r
}

fn split_response(r: &[u8]) -> (String, &[u8]) {
    let end = r.windows(4).position(|w| w == b"\r\n\r\n").expect("a head") + 4;
    (String::from_utf8_lossy(&r[..end]).into_owned(), &r[end..])
}

#[test]
fn a_put_over_item_size_max_goes_to_the_device_and_reads_back_whole_and_in_ranges() {
    for split in [1, 7, 999, 1000, 1001, 4096, 1 << 20] {
        let dev = Device::new();
        let data = body(5 * CHUNK + 321);
        let (out, flow) = dev.drive(&put_request("big", &data), split);
        assert_eq!(flow, Flow::Continue);
        let created = "HTTP/1.1 201 Created\r\nServer: ringstore\r\nContent-Length: 0\r\nETag: \"101\"\r\n\r\n";
        assert_eq!(String::from_utf8_lossy(&out), created, "split {split}");
        // A call stages what one read completes: a full chunk, plus the last one when the body ends.
        assert!(
            dev.max_staged_in_call.get() <= 2 + split / CHUNK,
            "split {split}"
        );
        let (manifest, large, _) = dev.items.borrow()[&b"big"[..]].clone();
        assert!(large);
        let m = Manifest::decode(&manifest).unwrap();
        assert_eq!(
            (m.len, m.chunks(), m.chunk_len),
            (data.len() as u64, 6, u32::try_from(CHUNK).unwrap())
        );
        assert_eq!(m.head, data[..m.head.len()]);

        let (out, _) = dev.drive(b"GET /big HTTP/1.1\r\nHost: h\r\n\r\n", split);
        let (head, got) = split_response(&out);
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
        assert!(head.contains(&format!("Content-Length: {}\r\n", data.len())));
        assert!(got == &data[..], "split {split}: body differs");

        for (first, last) in [(0, 9), (10, 2999), (999, 1000), (4000, 5320), (5320, 5320)] {
            let req =
                format!("GET /big HTTP/1.1\r\nHost: h\r\nRange: bytes={first}-{last}\r\n\r\n");
            let (out, _) = dev.drive(req.as_bytes(), split);
            let (head, got) = split_response(&out);
            assert!(
                head.starts_with("HTTP/1.1 206 Partial Content\r\n"),
                "{head}"
            );
            assert!(head.contains(&format!("Content-Range: bytes {first}-{last}/5321\r\n")));
            assert!(got == &data[first..=last], "range {first}-{last}");
        }
        let (out, _) = dev.drive(b"HEAD /big HTTP/1.1\r\nHost: h\r\n\r\n", split);
        let (head, rest) = split_response(&out);
        assert!(head.contains("Content-Length: 5321\r\n") && rest.is_empty());
    }
}

#[test]
fn pipelined_requests_after_a_large_put_and_get_are_answered_in_order() {
    let dev = Device::new();
    let data = body(2 * CHUNK + 5);
    let mut input = put_request("a", &data);
    input.extend_from_slice(b"GET /a HTTP/1.1\r\nHost: h\r\nRange: bytes=1995-2004\r\n\r\n");
    input.extend_from_slice(
        b"GET /a HTTP/1.1\r\nHost: h\r\n\r\nDELETE /a HTTP/1.1\r\nHost: h\r\n\r\nGET /a HTTP/1.1\r\nHost: h\r\n\r\n",
    );
    let (out, flow) = dev.drive(&input, 1 << 20);
    assert_eq!(flow, Flow::Continue);
    let text = String::from_utf8_lossy(&out);
    let statuses: Vec<&str> = text
        .match_indices("HTTP/1.1 ")
        .map(|(i, _)| &text[i + 9..i + 12])
        .collect();
    assert_eq!(statuses, ["201", "206", "200", "204", "404"]);
    let mut ranged = b"\r\n\r\n".to_vec();
    ranged.extend_from_slice(&data[1995..2005]);
    assert!(out.windows(ranged.len()).any(|w| w == ranged.as_slice()));
}

#[test]
fn a_chunked_put_that_grows_past_item_size_max_becomes_large() {
    let dev = Device::new();
    let data = body(3 * CHUNK + 17);
    let mut req = b"PUT /c HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    for piece in data.chunks(333) {
        req.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
        req.extend_from_slice(piece);
        req.extend_from_slice(b"\r\n");
    }
    req.extend_from_slice(b"0\r\n\r\n");
    for split in [5, 400, 1 << 20] {
        let (out, _) = dev.drive(&req, split);
        assert!(
            String::from_utf8_lossy(&out).starts_with("HTTP/1.1 20"),
            "split {split}"
        );
        let (out, _) = dev.drive(b"GET /c HTTP/1.1\r\nHost: h\r\n\r\n", split);
        assert!(split_response(&out).1 == &data[..]);
    }
    // A short chunked body stays an ordinary value.
    let (out, _) = dev.drive(
        b"PUT /s HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
        4,
    );
    assert!(String::from_utf8_lossy(&out).starts_with("HTTP/1.1 201"));
    assert_eq!(
        dev.items.borrow()[&b"s"[..]],
        (b"abc".to_vec(), false, dev.items.borrow()[&b"s"[..]].2)
    );
}

#[test]
fn a_failed_chunk_is_a_500_and_a_refused_one_a_507_and_neither_publishes() {
    let dev = Device::new();
    dev.fail_objects.borrow_mut().insert(1);
    let (out, flow) = dev.drive(&put_request("f", &body(2500)), 300);
    assert!(String::from_utf8_lossy(&out).starts_with("HTTP/1.1 500 Internal Server Error\r\n"));
    assert_eq!(
        flow,
        Flow::Continue,
        "the body was read whole: the connection stays"
    );
    assert!(dev.items.borrow().get(&b"f"[..]).is_none());
    assert_eq!(dev.abandoned.take(), [(1, 3)], "its 3 chunks are given up");

    dev.refuse_chunk.set(Some(1));
    let (out, flow) = dev.drive(&put_request("g", &body(2500)), 300);
    assert!(String::from_utf8_lossy(&out).starts_with("HTTP/1.1 507 Insufficient Storage\r\n"));
    assert_eq!(flow, Flow::Close);
    assert!(dev.items.borrow().get(&b"g"[..]).is_none());
    assert_eq!(
        dev.abandoned.take(),
        [(2, 1)],
        "chunk 0 was staged, 1 refused"
    );
}

#[test]
fn a_connection_closed_mid_upload_gives_its_chunks_up_once() {
    let dev = Device::new();
    let mut session = HttpSession::new(0);
    let mut out = Vec::new();
    let req = put_request("h", &body(3500));
    let mut flow = dev.call(&mut session, &req[..2600], &mut out);
    while flow == Flow::Drain {
        flow = dev.call(&mut session, &[], &mut out);
    }
    assert!(out.is_empty(), "no answer before the body ends");
    session.on_close(&dev);
    session.on_close(&dev);
    assert_eq!(dev.abandoned.take(), [(1, 2)]);
    assert!(dev.items.borrow().get(&b"h"[..]).is_none());
}

#[test]
fn a_chunk_lost_mid_stream_ends_the_connection_with_a_short_body() {
    let dev = Device::new();
    let data = body(4 * CHUNK);
    dev.drive(&put_request("l", &data), 1 << 20);
    dev.lose_chunk.set(Some(2));
    let (out, flow) = dev.drive(
        b"GET /l HTTP/1.1\r\nHost: h\r\n\r\nGET /l HTTP/1.1\r\nHost: h\r\n\r\n",
        1 << 20,
    );
    assert_eq!(flow, Flow::Close);
    let (head, got) = split_response(&out);
    assert!(head.contains("Content-Length: 4000\r\n"));
    assert!(
        got == &data[..2 * CHUNK],
        "exactly the readable prefix, then nothing"
    );
}

#[test]
fn over_object_size_max_is_413_before_any_body_byte() {
    let dev = Device::new();
    let (out, flow) = dev.drive(
        b"PUT /x HTTP/1.1\r\nHost: h\r\nContent-Length: 1048577\r\n\r\n",
        1 << 20,
    );
    assert!(String::from_utf8_lossy(&out).starts_with("HTTP/1.1 413"));
    assert_eq!(flow, Flow::Close);
    assert!(dev.chunks.borrow().is_empty());
}

#[test]
fn a_range_inside_a_chunk_reads_only_that_range_and_a_whole_chunk_reads_whole() {
    let dev = Device::new();
    let data = body(4 * CHUNK + 10);
    dev.drive(&put_request("r", &data), 1 << 20);
    let get = |range: &str| {
        let req = format!("GET /r HTTP/1.1\r\nHost: h\r\nRange: bytes={range}\r\n\r\n");
        let (out, _) = dev.drive(req.as_bytes(), 1 << 20);
        split_response(&out).1.to_vec()
    };
    // Inside chunk 2: one range read, no whole-chunk read.
    assert_eq!(get("2100-2149"), &data[2100..2150]);
    assert_eq!((dev.whole_reads.take(), dev.range_reads.take()), (0, 1));
    // Exactly chunk 2: one whole read.
    assert_eq!(get("2000-2999"), &data[2000..3000]);
    assert_eq!((dev.whole_reads.take(), dev.range_reads.take()), (1, 0));
    // The end of chunk 1, all of chunk 2, the start of chunk 3: range, whole, range.
    assert_eq!(get("1500-3499"), &data[1500..3500]);
    assert_eq!((dev.whole_reads.take(), dev.range_reads.take()), (1, 2));
    // To the end of the object: the short last chunk from its start is whole.
    assert_eq!(get("3999-"), &data[3999..]);
    assert_eq!((dev.whole_reads.take(), dev.range_reads.take()), (1, 1));
    // A lost chunk fails a range inside it too: a short (empty) body and a close.
    dev.lose_chunk.set(Some(1));
    let (out, flow) = dev.drive(
        b"GET /r HTTP/1.1\r\nHost: h\r\nRange: bytes=1200-1300\r\n\r\n",
        1 << 20,
    );
    assert_eq!(flow, Flow::Close);
    let (head, got) = split_response(&out);
    assert!(head.contains("Content-Length: 101\r\n"), "{head}");
    assert!(got.is_empty());
}

#[test]
fn a_large_put_is_a_partial_request_only_while_short_of_its_progress_window() {
    let dev = Device::new();
    let mut session = HttpSession::new(0);
    let mut out = Vec::new();
    let window = usize::try_from(large::LARGE_PUT_MIN_PROGRESS).unwrap();
    let req = put_request("slow", &body(3 * window + 10));
    let head = req.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    let mut feed = |session: &mut HttpSession, bytes: &[u8]| {
        let mut flow = dev.call(session, bytes, &mut out);
        while flow == Flow::Drain {
            flow = dev.call(session, &[], &mut out);
        }
        flow
    };
    feed(&mut session, &req[..head + 10]);
    assert!(session.has_partial_request(), "a body that barely started");
    // A whole window's worth in small reads: partial until the mark, then not.
    let mut at = head + 10;
    while at < head + window - 100 {
        feed(&mut session, &req[at..at + 100]);
        at += 100;
        assert!(session.has_partial_request(), "short of the window at {at}");
    }
    feed(&mut session, &req[at..head + window + 10]);
    at = head + window + 10;
    assert!(!session.has_partial_request(), "the window was reached");
    // The next read starts a new window: a stall from here is cut by the request timeout.
    feed(&mut session, &req[at..at + 1]);
    at += 1;
    assert!(session.has_partial_request());
    feed(&mut session, &req[at..]);
    assert!(!session.has_partial_request(), "the body is complete");
    assert!(
        out.starts_with(b"HTTP/1.1 201"),
        "{:?}",
        String::from_utf8_lossy(&out)
    );
}

/// One piece of input from the client of `session`, resumed after each `Flow::Drain` as the
/// runtime does; what the session wrote.
fn feed(dev: &Device, session: &mut HttpSession, input: &[u8]) -> String {
    let mut out = Vec::new();
    let mut flow = dev.call(session, input, &mut out);
    while flow == Flow::Drain {
        flow = dev.call(session, &[], &mut out);
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn from(peer: [u8; 4]) -> HttpSession {
    let mut s = HttpSession::new(0);
    s.peer_known(std::net::IpAddr::from(peer));
    s
}

#[test]
fn one_clients_unfinished_uploads_hold_at_most_half_a_region() {
    // Region of 8 chunks: one client's uploads together 4 chunks, all together 6.
    let dev = Device {
        uploads: Some((std::sync::Arc::default(), 8 * CHUNK as u64)),
        ..Device::new()
    };
    let head = |key: &str, len: usize| {
        format!("PUT /{key} HTTP/1.1\r\nHost: h\r\nContent-Length: {len}\r\n\r\n")
    };
    // A stalled upload of 10.0.0.1 holding 3 chunks of the 9 it announced.
    let mut stalled = from([10, 0, 0, 1]);
    let part = [head("a", 9 * CHUNK).as_bytes(), &body(3 * CHUNK)].concat();
    assert_eq!(feed(&dev, &mut stalled, &part), "");
    // The same client's next upload gets one chunk, then 507.
    let mut second = from([10, 0, 0, 1]);
    let out = feed(&dev, &mut second, &put_request("b", &body(2 * CHUNK)));
    assert!(
        out.starts_with("HTTP/1.1 507 Insufficient Storage\r\n"),
        "{out}"
    );
    second.on_close(&dev);
    // Another client's upload is stored meanwhile (3 + 2.5 chunks of the 6 all may hold).
    let mut other = from([10, 0, 0, 2]);
    let out = feed(&dev, &mut other, &put_request("c", &body(2 * CHUNK + 500)));
    assert!(out.starts_with("HTTP/1.1 201 Created\r\n"), "{out}");
    // Once the stalled upload is gone, the first client has its half again.
    stalled.on_close(&dev);
    let mut again = from([10, 0, 0, 1]);
    let out = feed(&dev, &mut again, &put_request("b", &body(2 * CHUNK)));
    assert!(out.starts_with("HTTP/1.1 201 Created\r\n"), "{out}");
}
