//! Fuzzes the memcache parser: arbitrary bytes never panic, never claim more than was
//! given, and an incomplete request never needs more than the declared bound.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringstore_proto::memcache::{parse, Limits, Parse, Request};

fuzz_target!(|data: &[u8]| {
    let limits = Limits {
        item_size_max: 256,
        max_line: 512,
    };
    let mut rest = data;
    // Each step consumes at least one byte, so this ends.
    loop {
        match parse(rest, &limits) {
            Parse::Incomplete => {
                assert!(rest.len() <= limits.max_buffered());
                break;
            }
            Parse::AwaitingValue {
                request_len,
                line_len,
                ..
            } => {
                assert!(line_len <= rest.len() && rest.len() < request_len);
                assert!(request_len <= limits.max_buffered());
                break;
            }
            Parse::Close { .. } => break,
            Parse::Done { request, consumed } => {
                assert!(consumed > 0 && consumed <= rest.len());
                if let Request::Get(g) = request {
                    for key in g.keys {
                        assert!(!key.is_empty() && key.len() <= 250);
                    }
                }
                rest = &rest[consumed..];
            }
        }
    }
});
