//! Fuzzes the batch key scan (the prefetch hint): arbitrary bytes never panic, the keys are
//! words of the input and never more than the room given, and where the parser's first
//! request is a whole `get`, `gets`, `mg` or storage command on a line of plain text the
//! scan's first key is its key.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringstore_proto::memcache::scan::batch_keys;
use ringstore_proto::memcache::{parse, Limits, Parse, Request};

fuzz_target!(|data: &[u8]| {
    let mut keys = [&[][..]; 32];
    let n = batch_keys(data, &mut keys);
    assert!(n <= keys.len());
    let range = data.as_ptr_range();
    for key in &keys[..n] {
        assert!(!key.is_empty() && !key.contains(&b' ') && !key.contains(&b'\n'));
        assert!(range.start <= key.as_ptr() && key.as_ptr_range().end <= range.end);
    }
    let first = match parse(data, &Limits::default()) {
        Parse::Done {
            request: Request::Get(mut g),
            ..
        } if !data.starts_with(b"gat") => g.keys.next(),
        Parse::Done {
            request: Request::Store(s),
            ..
        } => Some(s.key),
        Parse::Done {
            request: Request::MetaGet(m),
            ..
        } => Some(m.key.raw()),
        Parse::Done {
            request: Request::MetaSet(m),
            ..
        } => Some(m.key.raw()),
        _ => None,
    };
    // The scan is a hint: it splits as the parser does on plain text lines, not on every
    // byte the parser treats as C does (a NUL ends memcached's key).
    let line = data.split(|&b| b == b'\n').next().unwrap_or_default();
    let plain = line
        .iter()
        .all(|&b| b == b' ' || b == b'\r' || b.is_ascii_graphic());
    if let (Some(first), true) = (first, n > 0 && plain) {
        assert_eq!(keys[0], first);
    }
});
