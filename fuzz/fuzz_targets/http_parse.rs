//! Fuzz target: the HTTP request-head parser, the incremental scanner fed in two pieces, and
//! the key, range and chunked decoders on whatever the parser accepts. None may panic, and
//! the scanner must agree with the one-shot parse about where a head ends.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringstore_proto::http::{
    decode_key, parse_head, resolve_range, skip_empty_lines, ChunkedDecoder, HeadScanner, KeyBuf,
    Limits, Scan,
};

fuzz_target!(|data: &[u8]| {
    let limits = Limits {
        max_request_line: 256,
        max_header_bytes: 512,
        max_headers: 8,
    };
    let whole = parse_head(data, &limits);
    if let Ok(Some((head, used))) = whole {
        assert!(used <= data.len());
        let mut key = KeyBuf::default();
        let _ = decode_key(head.target, &mut key);
        if let Some(range) = head.range {
            let _ = resolve_range(range, data.len() as u64);
        }
        let mut body = Vec::new();
        let _ = ChunkedDecoder::new().decode(&data[used..], Some(&mut body), 1024);
        assert!(body.len() <= 1024);
    }

    // The same bytes in two pieces: a head the one-shot parse finds, the scanner finds too.
    let skipped = skip_empty_lines(data);
    let rest = &data[skipped..];
    let cut = data.first().map_or(0, |&b| usize::from(b)) % (rest.len() + 1);
    let mut scanner = HeadScanner::new();
    let mut found = None;
    for end in [cut, rest.len()] {
        if end == 0 || (&rest[..end] == b"\r" && !scanner.started()) {
            continue;
        }
        match scanner.scan(&rest[..end], &limits) {
            Ok(Scan::Complete(n)) => {
                found = Some(skipped + n);
                break;
            }
            Ok(Scan::Partial) => {}
            Err(e) => {
                assert_eq!(whole.map(|_| ()), Err(e));
                return;
            }
        }
    }
    if let Ok(Some((_, used))) = whole {
        assert_eq!(found, Some(used));
    }
});
