//! Binary parser tests: every request type, every split point, hostile lengths.

use super::opcode::*;
use super::*;

const LIMITS: Limits = Limits {
    item_size_max: 100,
    max_line: 2048,
};

/// A request frame as a client writes it.
fn frame(op: u8, key: &[u8], extras: &[u8], value: &[u8], opaque: u32, cas: u64) -> Vec<u8> {
    let body = extras.len() + key.len() + value.len();
    raw(
        op,
        u16::try_from(key.len()).unwrap(),
        u8::try_from(extras.len()).unwrap(),
        u32::try_from(body).unwrap(),
        opaque,
        cas,
    )
    .into_iter()
    .chain(extras.iter().copied())
    .chain(key.iter().copied())
    .chain(value.iter().copied())
    .collect()
}

/// A bare header with any lengths.
fn raw(op: u8, key_len: u16, extras_len: u8, body_len: u32, opaque: u32, cas: u64) -> Vec<u8> {
    let mut h = vec![REQUEST_MAGIC, op];
    h.extend_from_slice(&key_len.to_be_bytes());
    h.push(extras_len);
    h.extend_from_slice(&[0, 0, 0]);
    h.extend_from_slice(&body_len.to_be_bytes());
    h.extend_from_slice(&opaque.to_be_bytes());
    h.extend_from_slice(&cas.to_be_bytes());
    h
}

fn done(input: &[u8]) -> (Head, Request<'_>, usize) {
    match parse(input, &LIMITS) {
        Parse::Done {
            head,
            request,
            consumed,
        } => (head, request, consumed),
        other => panic!("{other:?}"),
    }
}

fn req(input: &[u8]) -> Request<'_> {
    done(input).1
}

fn closes_with(input: &[u8], status: Status) {
    assert_eq!(
        req(input),
        Request::Error {
            status,
            swallow: 0,
            close: true
        },
        "{input:?}"
    );
}

fn set_extras(flags: u32, exptime: u32) -> Vec<u8> {
    [flags.to_be_bytes(), exptime.to_be_bytes()].concat()
}

/// Every read request type parses to what it says, with its opaque echoed.
#[test]
fn every_read_request_type() {
    let get = |op| frame(op, b"k", &[], &[], 9, 0);
    for (op, with_key, quiet) in [
        (GET, false, false),
        (GETQ, false, true),
        (GETK, true, false),
        (GETKQ, true, true),
    ] {
        let input = get(op);
        let (head, request, consumed) = done(&input);
        assert_eq!(
            (head, consumed),
            (
                Head {
                    opcode: op,
                    opaque: 9
                },
                25
            )
        );
        assert_eq!(
            request,
            Request::Get(GetRequest {
                key: b"k",
                with_key,
                with_value: true,
                quiet,
                touch: None
            })
        );
    }
    for (op, with_key, with_value, quiet) in [
        (TOUCH, false, false, false),
        (GAT, false, true, false),
        (GATQ, false, true, true),
        (GATK, true, true, false),
        (GATKQ, true, true, true),
    ] {
        let input = frame(op, b"k", &77u32.to_be_bytes(), &[], 0, 0);
        assert_eq!(
            req(&input),
            Request::Get(GetRequest {
                key: b"k",
                with_key,
                with_value,
                quiet,
                touch: Some(77)
            })
        );
    }
}

/// Every storage request type parses to what it says.
#[test]
fn every_storage_request_type() {
    for (op, kind, quiet) in [
        (SET, StoreKind::Set, false),
        (SETQ, StoreKind::Set, true),
        (ADD, StoreKind::Add, false),
        (ADDQ, StoreKind::Add, true),
        (REPLACE, StoreKind::Replace, false),
        (REPLACEQ, StoreKind::Replace, true),
    ] {
        let input = frame(op, b"key", &set_extras(5, 60), b"value", 1, 33);
        let (_, request, consumed) = done(&input);
        assert_eq!(consumed, input.len());
        assert_eq!(
            request,
            Request::Store(StoreRequest {
                kind,
                key: b"key",
                flags: 5,
                exptime: 60,
                data: b"value",
                cas: 33,
                quiet
            })
        );
    }
    for (op, kind, quiet) in [
        (APPEND, StoreKind::Append, false),
        (APPENDQ, StoreKind::Append, true),
        (PREPEND, StoreKind::Prepend, false),
        (PREPENDQ, StoreKind::Prepend, true),
    ] {
        let input = frame(op, b"key", &[], b"xy", 0, 0);
        let Request::Store(s) = req(&input) else {
            panic!()
        };
        assert_eq!((s.kind, s.data, s.quiet), (kind, &b"xy"[..], quiet));
    }
}

/// Every other request type (delete, arithmetic, quit, flush, noop, version, stat) parses to
/// what it says.
#[test]
fn every_other_request_type() {
    for (op, quiet) in [(DELETE, false), (DELETEQ, true)] {
        let input = frame(op, b"k", &[], &[], 0, 8);
        assert_eq!(
            req(&input),
            Request::Delete {
                key: b"k",
                cas: 8,
                quiet
            }
        );
    }
    for (op, incr, quiet) in [
        (INCREMENT, true, false),
        (INCREMENTQ, true, true),
        (DECREMENT, false, false),
        (DECREMENTQ, false, true),
    ] {
        let extras = [
            &3u64.to_be_bytes()[..],
            &10u64.to_be_bytes(),
            &NO_CREATE.to_be_bytes(),
        ]
        .concat();
        let input = frame(op, b"n", &extras, &[], 0, 0);
        assert_eq!(
            req(&input),
            Request::Arith(ArithRequest {
                incr,
                key: b"n",
                delta: 3,
                initial: 10,
                exptime: NO_CREATE,
                cas: 0,
                quiet
            })
        );
    }
    assert_eq!(
        req(&frame(QUIT, &[], &[], &[], 0, 0)),
        Request::Quit { quiet: false }
    );
    assert_eq!(
        req(&frame(QUITQ, &[], &[], &[], 0, 0)),
        Request::Quit { quiet: true }
    );
    assert_eq!(
        req(&frame(FLUSH, &[], &[], &[], 0, 0)),
        Request::Flush {
            exptime: 0,
            quiet: false
        }
    );
    assert_eq!(
        req(&frame(FLUSHQ, &[], &9u32.to_be_bytes(), &[], 0, 0)),
        Request::Flush {
            exptime: 9,
            quiet: true
        }
    );
    assert_eq!(req(&frame(NOOP, &[], &[], &[], 0, 0)), Request::Noop);
    assert_eq!(req(&frame(VERSION, &[], &[], &[], 0, 0)), Request::Version);
    assert_eq!(
        req(&frame(STAT, b"items", &[], &[], 0, 0)),
        Request::Stat { key: b"items" }
    );
    assert_eq!(
        req(&frame(STAT, &[], &[], &[], 0, 0)),
        Request::Stat { key: b"" }
    );
}

/// memcached without SASL, verbosity and opcodes it does not know: "Unknown command",
/// and the body length swallowed after what was read.
#[test]
fn unknown_commands_and_sasl_swallow_like_memcached() {
    let unknown = |swallow| Request::Error {
        status: Status::UnknownCommand,
        swallow,
        close: false,
    };
    assert_eq!(req(&frame(0x50, &[], &[], &[], 0, 0)), unknown(0));
    let input = frame(0x50, b"abc", &[], &[], 0, 0);
    assert_eq!(
        done(&input),
        (
            Head {
                opcode: 0x50,
                opaque: 0
            },
            unknown(3),
            27
        )
    );
    let input = frame(VERBOSITY, &[], &1u32.to_be_bytes(), &[], 0, 0);
    assert_eq!(done(&input).1, unknown(4));
    assert_eq!(
        req(&frame(SASL_LIST_MECHS, &[], &[], &[], 0, 0)),
        Request::SaslListMechs
    );
    let input = frame(SASL_AUTH, b"PLAIN", &[], b"\0u\0p", 0, 0);
    assert_eq!(
        done(&input),
        (
            Head {
                opcode: SASL_AUTH,
                opaque: 0
            },
            Request::Sasl {
                mech: b"PLAIN",
                data: b"\0u\0p",
                step: false
            },
            33
        )
    );
    assert_eq!(parse(&input[..32], &LIMITS), Parse::Incomplete);
    let input = frame(SASL_STEP, b"PLAIN", &[], &[], 0, 0);
    assert!(matches!(done(&input).1, Request::Sasl { step: true, .. }));
    // Over the bounds: refused from the header, the data swallowed, never buffered.
    let long_mech = frame(SASL_AUTH, &[b'M'; 33], &[], b"xy", 0, 0);
    assert_eq!(
        done(&long_mech).1,
        Request::SaslRefused {
            status: Status::InvalidArguments,
            swallow: 2
        }
    );
    let mut big = frame(SASL_AUTH, b"PLAIN", &[], &[], 0, 0);
    big[8..12].copy_from_slice(&u32::try_from(5 + SASL_DATA_MAX + 1).unwrap().to_be_bytes());
    assert_eq!(
        done(&big),
        (
            Head {
                opcode: SASL_AUTH,
                opaque: 0
            },
            Request::SaslRefused {
                status: Status::OutOfMemory,
                swallow: SASL_DATA_MAX + 1
            },
            29
        )
    );
    closes_with(
        &frame(SASL_AUTH, &[], &[], &[], 0, 0),
        Status::InvalidArguments,
    );
    closes_with(
        &frame(SASL_LIST_MECHS, b"k", &[], &[], 0, 0),
        Status::InvalidArguments,
    );
}

/// Lengths a command does not take are "Invalid arguments" and a close, as in memcached.
#[test]
fn wrong_lengths_close_with_invalid_arguments() {
    let inval = Status::InvalidArguments;
    closes_with(&frame(GET, b"k", b"xxxx", &[], 0, 0), inval);
    closes_with(&frame(GET, &[], &[], &[], 0, 0), inval);
    closes_with(&frame(GET, b"k", &[], b"zz", 0, 0), inval);
    closes_with(&frame(SET, &[], &set_extras(0, 0), b"v", 0, 0), inval);
    closes_with(&frame(SET, b"k", &[0; 4], b"v", 0, 0), inval);
    closes_with(&frame(APPEND, b"k", &[0; 4], b"v", 0, 0), inval);
    closes_with(&frame(DELETE, b"k", &[], b"v", 0, 0), inval);
    closes_with(&frame(INCREMENT, b"k", &[0; 8], &[], 0, 0), inval);
    closes_with(&frame(FLUSH, &[], b"ab", &[], 0, 0), inval);
    closes_with(&frame(VERSION, b"k", &[], &[], 0, 0), inval);
    closes_with(&frame(NOOP, &[], &[], b"x", 0, 0), inval);
    closes_with(&frame(QUIT, &[], &[], b"x", 0, 0), inval);
    closes_with(&frame(TOUCH, &[], &[0; 4], &[], 0, 0), inval);
    closes_with(&frame(STAT, &[], &[0; 4], &[], 0, 0), inval);
    closes_with(&frame(GET, &[b'k'; 251], &[], &[], 0, 0), inval);
}

/// A key and extras longer than the body: "Unknown command" and a close.
#[test]
fn lengths_that_do_not_add_up_close() {
    let mut input = raw(GET, 5, 0, 2, 0, 0);
    assert_eq!(
        parse(&input, &LIMITS),
        Parse::Incomplete,
        "memcached waits for the key"
    );
    input.extend_from_slice(b"abcde");
    closes_with(&input, Status::UnknownCommand);
    // A key over 250 bytes is refused from the header alone.
    closes_with(&raw(0x50, 300, 0, 10, 0, 0), Status::UnknownCommand);
    closes_with(&raw(0x50, 300, 0, 300, 0, 0), Status::InvalidArguments);
    closes_with(&raw(GET, u16::MAX, 255, 0, 0, 0), Status::UnknownCommand);
}

#[test]
fn other_magic_closes() {
    let mut header = raw(NOOP, 0, 0, 0, 0, 0);
    header[0] = RESPONSE_MAGIC;
    assert_eq!(parse(&header, &LIMITS), Parse::Close);
    assert_eq!(
        parse(b"get k\r\nget k\r\nget k\r\nget k\r\n", &LIMITS),
        Parse::Close
    );
    // memcached looks at the magic only once the header is whole.
    assert_eq!(parse(&header[..23], &LIMITS), Parse::Incomplete);
    assert_eq!(parse(b"", &LIMITS), Parse::Incomplete);
}

/// A value over the limit is refused from the header, whatever its declared size: nothing
/// of it is asked for, and the parser's bound never depends on it.
#[test]
fn hostile_lengths_are_refused_without_buffering() {
    for body in [101 + 9, 1 << 31, u32::MAX] {
        let mut input = raw(SET, 1, 8, body, 0, 0);
        input.extend_from_slice(&set_extras(0, 0));
        input.push(b'k');
        let (_, request, consumed) = done(&input);
        assert_eq!(consumed, 33);
        assert_eq!(
            request,
            Request::TooLarge {
                key: b"k",
                remove_old: true,
                swallow: body as usize - 9
            }
        );
    }
    let mut input = raw(APPENDQ, 1, 0, 1 << 31, 0, 0);
    input.push(b'k');
    assert!(matches!(
        req(&input),
        Request::TooLarge {
            remove_old: false,
            ..
        }
    ));
    // Unknown commands swallow their body instead of buffering it.
    assert_eq!(
        req(&raw(0x50, 0, 0, u32::MAX, 0, 0)),
        Request::Error {
            status: Status::UnknownCommand,
            swallow: u32::MAX as usize,
            close: false
        }
    );
    assert_eq!(max_buffered(&LIMITS), 24 + 8 + 250 + 100);
}

#[test]
fn a_value_in_flight_can_be_refused() {
    let input = frame(SET, b"k", &set_extras(0, 0), b"abc", 4, 0);
    assert_eq!(
        parse(&input[..34], &LIMITS),
        Parse::AwaitingValue {
            head: Head {
                opcode: SET,
                opaque: 4
            },
            request_len: 36,
            head_len: 33,
            key: b"k",
            remove_old: true
        }
    );
}

/// Every request, cut at every byte: a prefix is never a different request, and the
/// whole input parses the same however it arrived.
#[test]
fn split_at_every_byte() {
    let incr = [
        &1u64.to_be_bytes()[..],
        &0u64.to_be_bytes(),
        &0u32.to_be_bytes(),
    ]
    .concat();
    let inputs = [
        frame(GETK, b"key", &[], &[], 1, 0),
        frame(GAT, b"key", &[0, 0, 0, 9], &[], 1, 0),
        frame(SET, b"key", &set_extras(1, 2), b"value", 1, 5),
        frame(APPEND, b"key", &[], b"tail", 0, 0),
        frame(DELETEQ, b"key", &[], &[], 0, 0),
        frame(INCREMENT, b"key", &incr, &[], 0, 0),
        frame(FLUSH, &[], &[0, 0, 0, 1], &[], 0, 0),
        frame(STAT, b"settings", &[], &[], 0, 0),
        frame(NOOP, &[], &[], &[], 7, 0),
        frame(0x50, b"k", &[], &[], 0, 0),
        frame(GET, b"k", &[], b"x", 0, 0),
    ];
    for input in &inputs {
        let whole = parse(input, &LIMITS);
        let Parse::Done { consumed, .. } = whole else {
            panic!("{whole:?}")
        };
        assert!(consumed <= input.len());
        for cut in 0..consumed {
            match parse(&input[..cut], &LIMITS) {
                Parse::Incomplete | Parse::AwaitingValue { .. } => {}
                other => panic!("prefix {cut} of {input:?}: {other:?}"),
            }
        }
        // Trailing bytes of a next request change nothing.
        let mut longer = input.clone();
        longer.extend_from_slice(&frame(NOOP, &[], &[], &[], 0, 0));
        assert_eq!(parse(&longer, &LIMITS), whole);
    }
}

#[test]
fn the_head_of_a_storage_request_is_read_without_its_value() {
    let mut req = vec![REQUEST_MAGIC, opcode::SETQ, 0, 1, 8, 0, 0, 0];
    req.extend_from_slice(&(8u32 + 1 + 5000).to_be_bytes());
    req.extend_from_slice(&7u32.to_be_bytes());
    req.extend_from_slice(&9u64.to_be_bytes());
    req.extend_from_slice(&3u32.to_be_bytes());
    req.extend_from_slice(&60u32.to_be_bytes());
    req.push(b'k');
    let (head, s, vlen) = super::store_head(&req).expect("a storage head");
    assert_eq!((head.opcode, head.opaque, vlen), (opcode::SETQ, 7, 5000));
    assert_eq!(
        (s.kind, s.key, s.flags, s.exptime, s.cas, s.quiet),
        (StoreKind::Set, &b"k"[..], 3, 60, 9, true)
    );
    assert!(
        super::store_head(&req[..req.len() - 1]).is_none(),
        "the key cut short"
    );
    req[1] = opcode::GET;
    assert!(super::store_head(&req).is_none());
}
