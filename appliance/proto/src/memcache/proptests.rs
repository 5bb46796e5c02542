//! Property tests: the parser never panics, never claims more bytes than it was given,
//! and gives the same answer whatever prefix of a request is buffered.

use super::{parse, Limits, Parse};
use proptest::prelude::*;

/// The flag letters memcached 1.6.18's `_meta_flag_preparse` knows (every meta command).
const KNOWN_FLAGS: &[u8] = b"CDFIJLMNOPRTbcfhklqstuv";

/// memcached 1.6.18's answer to a meta line when a flag stops the preparse at once: the first
/// repeated letter (`duplicate flag`) or unknown one (`invalid flag`), whatever came before
/// it, a `b` whose key does not decode included. `None`: no flag stops it.
fn preparse_stop(flags: &[Vec<u8>]) -> Option<&'static str> {
    let mut seen = [false; 128];
    for f in flags {
        let o = usize::from(f[0]);
        if o >= 127 || seen[o] {
            return Some("CLIENT_ERROR duplicate flag");
        }
        seen[o] = true;
        if !KNOWN_FLAGS.contains(&f[0]) {
            return Some("CLIENT_ERROR invalid flag");
        }
    }
    None
}

/// Meta flag tokens: mostly known letters, some `E` (1.6.21's) and others, with arguments.
fn meta_flags() -> impl Strategy<Value = Vec<Vec<u8>>> {
    let letter = prop_oneof![
        8 => prop::sample::select(KNOWN_FLAGS.to_vec()),
        1 => Just(b'E'),
        1 => prop::sample::select(b"AGHKQSUVWXYZadegijmnoprwxyz0+".to_vec()),
    ];
    let arg = prop::sample::select(vec![&b""[..], b"1", b"30", b"abc", b"-1"]);
    prop::collection::vec(
        (letter, arg).prop_map(|(l, a)| [&[l][..], a].concat()),
        0..12,
    )
}

/// Lines near the plain `get`/`set` forms: their words, numbers at memcached's edges,
/// doubled spaces, control bytes, every line ending, a data block right or wrong.
fn plainish() -> impl Strategy<Value = Vec<u8>> {
    let command = prop::sample::select(vec![
        &b"get "[..],
        b"gets ",
        b"set ",
        b"set  ",
        b" set ",
        b"get",
        b"sets ",
        b"gat 1 ",
    ]);
    let word = prop::sample::select(vec![
        &b"k"[..],
        b"key:0001",
        b"0",
        b"00",
        b"5",
        b"-1",
        b"-0",
        b"+5",
        b"-",
        b"3",
        b"100",
        b"4294967295",
        b"4294967296",
        b"9999999999",
        b"99999999999",
        b"2147483648",
        b"999999999",
        b"1000000000",
        b"2147483645",
        b"noreply",
        b"noreplyx",
        b"",
        b" ",
        b"a\x01",
        b"\x7f",
        b"\0",
        b"\t",
        b"\xc3\xa9",
        // Keys across the word-at-a-time scan's edges (swar.rs): 8, 13, 16 bytes, the limit.
        b"key:0001",
        b"b100:00000123",
        b"\x80\xffkey:0001\x7fxy",
        &[b'k'; 16],
        &[b'k'; 250],
        &[b'k'; 251],
    ]);
    let words = prop::collection::vec(word, 0..7);
    let end = prop::sample::select(vec![
        &b"\r\n"[..],
        b"\n",
        b"\r",
        b"",
        b"\r\r\n",
        b" \r\n",
        b"\0\r\n",
    ]);
    let data = prop::sample::select(vec![
        &b""[..],
        b"abc\r\n",
        b"abcd\r\n",
        b"ab",
        b"abc",
        b"abcxx",
        b"get k\r\n",
    ]);
    let long = prop::option::of(200usize..=260);
    (command, words, long, end, data).prop_map(|(command, words, long, end, data)| {
        let mut line = command.to_vec();
        if let Some(n) = long {
            line.extend(std::iter::repeat_n(b'k', n));
            line.push(b' ');
        }
        line.extend_from_slice(&words.join(&b' '));
        [&line[..], end, data].concat()
    })
}

/// A get's cas flag, touch, keys and bytes used.
type SplitGet<'a> = (bool, Option<i32>, Vec<&'a [u8]>, usize);

/// A parse with a get's keys split (the two paths may leave a get's key text with or
/// without its leading space: the same keys).
fn keyed(parse: Parse<'_>) -> (Option<SplitGet<'_>>, Option<Parse<'_>>) {
    match parse {
        Parse::Done {
            request: super::Request::Get(g),
            consumed,
        } => (Some((g.cas, g.touch, g.keys.collect(), consumed)), None),
        other => (None, Some(other)),
    }
}

fn limits() -> Limits {
    Limits {
        item_size_max: 64,
        max_line: 128,
    }
}

/// Request-like bytes: fragments of real commands glued with random bytes.
fn requestish() -> impl Strategy<Value = Vec<u8>> {
    let frag = prop_oneof![
        Just(b"get a b\r\n".to_vec()),
        Just(b"set k 0 0 3\r\nabc\r\n".to_vec()),
        Just(b"set k 0 0 3 noreply\r\nabcd\r\n".to_vec()),
        Just(b"ms k 2 T10 F3 c k v\r\nhi\r\n".to_vec()),
        Just(b"mg k v c f t s k O1 q\r\n".to_vec()),
        Just(b"ma k N0 J5 MD D2\r\n".to_vec()),
        Just(b"md k q I T5\r\n".to_vec()),
        Just(b"incr k 18446744073709551615\r\n".to_vec()),
        Just(b"gat 10 a\r\n".to_vec()),
        Just(b"set k 0 0 100\r\n".to_vec()),
        Just(b"\r\n".to_vec()),
        prop::collection::vec(any::<u8>(), 0..40),
    ];
    prop::collection::vec(frag, 0..8).prop_map(|v| v.concat())
}

/// The plain paths do answer the forms a client sends (so the property above is not empty).
#[test]
fn the_plain_paths_answer_the_usual_forms() {
    let l = Limits::default();
    for input in [
        &b"get a\r\n"[..],
        b"gets a b\n",
        b"get key:0001 k\r\nget",
        b"set k 0 0 3\r\nabc\r\n",
        b"set k 4294967296 -1 3 noreply\r\nabc\r\n",
        b"set k 5 9999999999 0\nxy",
        b"set k 0 0 3\r\na",
        b"set k 0 0 300\r\n",
    ] {
        let fast = super::plain(input, &l);
        assert!(fast.is_some(), "{:?}", String::from_utf8_lossy(input));
        assert_eq!(fast.map(keyed), Some(keyed(super::general(input, &l))));
    }
    for input in [
        &b"set k 0 0 3 \r\nabc\r\n"[..],
        b"get a",
        b"set k +1 0 3\r\nabc\r\n",
    ] {
        assert!(super::plain(input, &l).is_none());
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, .. ProptestConfig::default() })]

    #[test]
    fn never_panics_or_overreads(input in requestish()) {
        let l = limits();
        let mut rest: &[u8] = &input;
        let mut steps = 0;
        while steps < 64 {
            steps += 1;
            match parse(rest, &l) {
                Parse::Incomplete | Parse::AwaitingValue { .. } | Parse::Close { .. } => break,
                Parse::Done { consumed, .. } => {
                    prop_assert!(consumed > 0 && consumed <= rest.len());
                    rest = &rest[consumed..];
                }
            }
        }
    }

    #[test]
    fn prefixes_are_incomplete_or_agree(input in requestish(), cut in 0usize..200) {
        let l = limits();
        let full = parse(&input, &l);
        let cut = cut.min(input.len());
        match parse(&input[..cut], &l) {
            Parse::Incomplete => {}
            Parse::AwaitingValue { request_len, line_len, .. } => {
                // The whole input completes the request, or is itself still short of it.
                prop_assert!(line_len <= cut && cut < request_len);
                prop_assert!(request_len <= l.max_buffered());
            }
            Parse::Done { request, consumed } => {
                // A request complete in the prefix is the same request in the whole.
                prop_assert_eq!(full, Parse::Done { request, consumed });
            }
            Parse::Close { reply } => prop_assert_eq!(full, Parse::Close { reply }),
        }
    }

    #[test]
    fn a_flag_that_stops_the_preparse_wins_over_the_key(flags in meta_flags()) {
        let l = limits();
        let Some(stop) = preparse_stop(&flags) else {
            return Ok(());
        };
        let tail = flags.join(&b' ');
        // The same answer whether the key decodes (`Zm9v`) or not (`k`, `a`) when the flags
        // hold a `b` somewhere, before or after the offending one.
        for key in [&b"Zm9v"[..], b"k", b"a"] {
            let mg = [&b"mg "[..], key, b" ", &tail, b"\r\n"].concat();
            let Parse::Done { request: super::Request::Reply { line, .. }, .. } = parse(&mg, &l)
            else {
                return Err(TestCaseError::fail(format!("{mg:?} was served")));
            };
            prop_assert_eq!(line, stop);
        }
    }

    /// The plain paths answer every request exactly as the token array's path does (where
    /// they answer at all), under tight limits and the defaults.
    #[test]
    fn the_plain_paths_agree_with_the_general_one(input in plainish()) {
        for l in [limits(), Limits::default(), Limits { item_size_max: 3, max_line: 12 }] {
            if let Some(fast) = super::plain(&input, &l) {
                prop_assert_eq!(keyed(fast), keyed(super::general(&input, &l)), "{:?}", input);
            }
        }
    }

    #[test]
    fn incomplete_input_stays_bounded(input in prop::collection::vec(any::<u8>(), 0..600)) {
        let l = limits();
        match parse(&input, &l) {
            Parse::Incomplete => prop_assert!(input.len() <= l.max_buffered()),
            Parse::AwaitingValue { request_len, .. } => {
                prop_assert!(input.len() < request_len && request_len <= l.max_buffered());
            }
            _ => {}
        }
    }
}
