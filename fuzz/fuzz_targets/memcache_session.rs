//! Fuzzes a whole memcache session against a small real store: arbitrary bytes, delivered
//! in arbitrary chunks, never panic, and the session's buffer stays bounded.
#![no_main]

#[path = "common/session.rs"]
mod session;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The first byte picks the chunk size, the rest is the stream.
    let Some((&chunk, stream)) = data.split_first() else {
        return;
    };
    session::feed(stream, usize::from(chunk % 64) + 1, |_| {});
});
