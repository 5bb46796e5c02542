//! Fuzzes the memcache binary protocol: the parser on arbitrary bytes (never panics, never
//! claims more than it was given, never asks to buffer more than its bound), and a whole
//! binary session against a small real store, fed in arbitrary chunks.
#![no_main]

#[path = "common/session.rs"]
mod session;

use libfuzzer_sys::fuzz_target;
use ringstore_proto::memcache::binary::{max_buffered, parse, Parse, Request, HEADER_LEN};
use ringstore_proto::memcache::{Limits, KEY_LEN_MAX};
use session::{HIGH_WATER, ITEM_MAX};

fn check_parser(data: &[u8]) {
    let limits = Limits {
        item_size_max: ITEM_MAX,
        max_line: 512,
    };
    let bound = max_buffered(&limits);
    let mut rest = data;
    // Each step consumes at least a header, so this ends.
    loop {
        match parse(rest, &limits) {
            Parse::Incomplete => {
                assert!(rest.len() < bound);
                break;
            }
            Parse::AwaitingValue {
                request_len,
                head_len,
                ..
            } => {
                assert!(head_len <= rest.len() && rest.len() < request_len);
                assert!(request_len <= bound);
                break;
            }
            Parse::Close => break,
            Parse::Done {
                request, consumed, ..
            } => {
                assert!(consumed >= HEADER_LEN && consumed <= rest.len());
                match request {
                    Request::Get(g) => assert!(!g.key.is_empty() && g.key.len() <= KEY_LEN_MAX),
                    Request::Store(s) => assert!(s.data.len() <= ITEM_MAX),
                    Request::TooLarge { swallow, .. } => assert!(swallow > ITEM_MAX),
                    _ => {}
                }
                rest = &rest[consumed..];
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    check_parser(data);
    // The first byte picks the chunk size; a noop first makes the session speak binary.
    let Some((&chunk, stream)) = data.split_first() else {
        return;
    };
    let chunk = usize::from(chunk % 64) + 1;
    let mut noop = [0u8; HEADER_LEN];
    noop[0] = 0x80;
    noop[1] = 0x0a;
    let input: Vec<u8> = noop.iter().chain(stream).copied().collect();
    session::feed(&input, chunk, |out| {
        // One value past the high-water mark at most, and binary frames only.
        assert!(out.len() <= HIGH_WATER + ITEM_MAX + 512);
        assert!(out.is_empty() || out[0] == 0x81, "binary replies only");
    });
});
