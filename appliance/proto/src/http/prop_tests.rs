//! Property tests of the HTTP head parser: random bytes and random splits never panic, never
//! read past the limits, and never change the outcome.

use super::head::{parse_head, skip_empty_lines, HeadError, HeadScanner, Limits, Scan};
use proptest::prelude::*;

/// Feeds `input` to a scanner in pieces cut at `cuts`, as the session does.
fn scan_in_pieces(
    input: &[u8],
    cuts: &[usize],
    limits: &Limits,
) -> Result<Option<usize>, HeadError> {
    let skipped = skip_empty_lines(input);
    let rest = &input[skipped..];
    let mut scanner = HeadScanner::new();
    let mut ends: Vec<usize> = cuts.iter().map(|c| c % (rest.len() + 1)).collect();
    ends.push(rest.len());
    ends.sort_unstable();
    for end in ends {
        if end == 0 || (&rest[..end] == b"\r" && !scanner.started()) {
            continue;
        }
        if let Scan::Complete(n) = scanner.scan(&rest[..end], limits)? {
            return Ok(Some(skipped + n));
        }
    }
    Ok(None)
}

fn request_like() -> impl Strategy<Value = Vec<u8>> {
    let pieces = prop::sample::select(vec![
        &b"GET "[..],
        b"PUT ",
        b"HEAD ",
        b"/key",
        b"%41",
        b"%",
        b" HTTP/1.1",
        b" HTTP/1.0",
        b" HTTP/1.2",
        b"Host: h",
        b"Host: [::1]:80",
        b" HTTP/2.0",
        b"\r\n",
        b"\n",
        b"\r",
        b"Content-Length: 5",
        b"Transfer-Encoding: chunked",
        b"Connection: close",
        b"Range: bytes=0-1",
        b"X-Flags: 3",
        b"X-TTL: -1",
        b"Expect: 100-continue",
        b": ",
        b" ",
        b"\t",
        b"\0",
        b"\xff",
        b"a",
    ]);
    prop::collection::vec(pieces, 0..40).prop_map(|ps| ps.concat())
}

fn small_limits() -> Limits {
    Limits {
        max_request_line: 40,
        max_header_bytes: 60,
        max_headers: 3,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(input in prop::collection::vec(any::<u8>(), 0..300)) {
        let _ = parse_head(&input, &Limits::DEFAULT);
        let _ = parse_head(&input, &small_limits());
    }

    #[test]
    fn splits_do_not_change_the_outcome(input in request_like(), cuts in prop::collection::vec(any::<usize>(), 0..6)) {
        for limits in [Limits::DEFAULT, small_limits()] {
            let whole = parse_head(&input, &limits).map(|r| r.map(|(_, n)| n));
            let pieces = scan_in_pieces(&input, &cuts, &limits);
            // The scanner refuses limits; the full parse may also refuse content (400/505...).
            match (&whole, &pieces) {
                (Ok(a), Ok(b)) => prop_assert_eq!(a, b),
                (Err(a), Err(b)) => prop_assert_eq!(a, b),
                (Err(_), Ok(Some(_))) => {}
                _ => prop_assert!(false, "whole {:?} pieces {:?}", whole, pieces),
            }
            if let Ok(Some((head, n))) = parse_head(&input, &limits) {
                prop_assert!(n <= input.len());
                prop_assert!(head.target.len() <= limits.max_request_line);
            }
        }
    }
}
