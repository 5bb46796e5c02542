//! Binary protocol sessions against the real store, byte for byte. Expected frames were
//! taken from memcached 1.6.18 on loopback for the same input (raw socket); CAS uniques are
//! ringstore's own (a fresh store counts from 1). Every case also runs split at every byte.

use ringstore_proto::memcache::binary::opcode::*;

use super::super::bound_tests;
use super::super::tests::{feed, shared, TestDevice};
use crate::budget::IN_FREE;
use crate::{Flow, Now, Protocol, Session};

/// A request frame.
fn req(op: u8, key: &[u8], extras: &[u8], value: &[u8], opaque: u32, cas: u64) -> Vec<u8> {
    let mut f = vec![0x80, op];
    f.extend_from_slice(&u16::try_from(key.len()).unwrap().to_be_bytes());
    f.push(u8::try_from(extras.len()).unwrap());
    f.extend_from_slice(&[0, 0, 0]);
    f.extend_from_slice(
        &u32::try_from(extras.len() + key.len() + value.len())
            .unwrap()
            .to_be_bytes(),
    );
    f.extend_from_slice(&opaque.to_be_bytes());
    f.extend_from_slice(&cas.to_be_bytes());
    f.extend_from_slice(extras);
    f.extend_from_slice(key);
    f.extend_from_slice(value);
    f
}

/// A response frame as memcached writes it.
fn res(
    op: u8,
    status: u16,
    key: &[u8],
    extras: &[u8],
    value: &[u8],
    opaque: u32,
    cas: u64,
) -> Vec<u8> {
    let mut f = vec![0x81, op];
    f.extend_from_slice(&u16::try_from(key.len()).unwrap().to_be_bytes());
    f.push(u8::try_from(extras.len()).unwrap());
    f.push(0);
    f.extend_from_slice(&status.to_be_bytes());
    f.extend_from_slice(
        &u32::try_from(extras.len() + key.len() + value.len())
            .unwrap()
            .to_be_bytes(),
    );
    f.extend_from_slice(&opaque.to_be_bytes());
    f.extend_from_slice(&cas.to_be_bytes());
    f.extend_from_slice(extras);
    f.extend_from_slice(key);
    f.extend_from_slice(value);
    f
}

fn err(op: u8, status: u16, msg: &str) -> Vec<u8> {
    res(op, status, b"", b"", msg.as_bytes(), 0, 0)
}

fn ok(op: u8, cas: u64) -> Vec<u8> {
    res(op, 0, b"", b"", b"", 0, cas)
}

fn set(key: &[u8], flags: u32, value: &[u8]) -> Vec<u8> {
    req(
        SET,
        key,
        &[flags.to_be_bytes(), [0; 4]].concat(),
        value,
        0,
        0,
    )
}

fn arith_extras(delta: u64, initial: u64, exptime: u32) -> Vec<u8> {
    [
        &delta.to_be_bytes()[..],
        &initial.to_be_bytes(),
        &exptime.to_be_bytes(),
    ]
    .concat()
}

fn noop() -> Vec<u8> {
    req(NOOP, b"", b"", b"", 0, 0)
}

/// Checks the reply to the concatenated `input` byte for byte and its last flow, whole, split
/// at every byte boundary, and byte by byte.
fn check(input: &[&[u8]], expected: &[&[u8]], closes: bool) {
    let input = input.concat();
    let expected = expected.concat();
    let flow = if closes { Flow::Close } else { Flow::Continue };
    let (whole, f) = feed(&shared(), &[&input]);
    assert_eq!(whole, expected, "input {input:?}");
    assert_eq!(f, flow);
    for cut in 1..input.len() {
        let (split, f) = feed(&shared(), &[&input[..cut], &input[cut..]]);
        assert_eq!(split, whole, "split at {cut}");
        assert_eq!(f, flow, "split at {cut}");
    }
    let bytes: Vec<&[u8]> = input.chunks(1).collect();
    assert_eq!(feed(&shared(), &bytes), (whole, flow), "byte by byte");
}

#[test]
fn get_and_set() {
    check(
        &[
            &req(SET, b"k", &[0, 0, 0, 5, 0, 0, 0, 0], b"abc", 7, 0),
            &req(GETK, b"k", b"", b"", 9, 0),
            &req(GET, b"k", b"", b"", 1, 0),
        ],
        &[
            &res(SET, 0, b"", b"", b"", 7, 1),
            &res(GETK, 0, b"k", &[0, 0, 0, 5], b"abc", 9, 1),
            &res(GET, 0, b"", &[0, 0, 0, 5], b"abc", 1, 1),
        ],
        false,
    );
    check(
        &[
            &req(GET, b"zz", b"", b"", 3, 0),
            &req(GETK, b"zz", b"", b"", 3, 0),
        ],
        &[
            &res(GET, 1, b"", b"", b"Not found", 3, 0),
            &res(GETK, 1, b"zz", b"", b"", 3, 0),
        ],
        false,
    );
}

/// Quiet gets answer hits only; noop answers and ends the pipeline.
#[test]
fn quiet_gets_and_noop() {
    check(
        &[
            &req(SET, b"a", &[0; 8], b"1", 1, 0),
            &req(SET, b"b", &[0, 0, 0, 3, 0, 0, 0, 0], b"22", 2, 0),
            &req(GETKQ, b"a", b"", b"", 5, 0),
            &req(GETKQ, b"x", b"", b"", 6, 0),
            &req(GETQ, b"b", b"", b"", 7, 0),
            &req(GATKQ, b"x", &[0, 0, 0, 10], b"", 8, 0),
            &req(NOOP, b"", b"", b"", 9, 0),
        ],
        &[
            &res(SET, 0, b"", b"", b"", 1, 1),
            &res(SET, 0, b"", b"", b"", 2, 2),
            &res(GETKQ, 0, b"a", &[0; 4], b"1", 5, 1),
            &res(GETQ, 0, b"", &[0, 0, 0, 3], b"22", 7, 2),
            &res(NOOP, 0, b"", b"", b"", 9, 0),
        ],
        false,
    );
}

#[test]
fn storage_statuses() {
    // add over an item, replace of nothing, CAS mismatch and CAS of nothing.
    check(
        &[
            &set(b"k", 5, b"abc"),
            &req(ADD, b"k", &[0; 8], b"abc", 0, 0),
            &req(REPLACE, b"nope", &[0; 8], b"abc", 0, 0),
            &req(SET, b"k", &[0; 8], b"abc", 0, 12345),
            &req(SET, b"nokey", &[0; 8], b"abc", 0, 12345),
            &req(REPLACE, b"k", &[0; 8], b"new", 0, 1),
        ],
        &[
            &ok(SET, 1),
            &err(ADD, 2, "Data exists for key."),
            &err(REPLACE, 1, "Not found"),
            &err(SET, 2, "Data exists for key."),
            &err(SET, 1, "Not found"),
            &ok(REPLACE, 2),
        ],
        false,
    );
    // Quiet storage answers errors only.
    check(
        &[
            &req(SETQ, b"q", &[0; 8], b"v", 0, 0),
            &req(ADDQ, b"q", &[0; 8], b"v", 0, 0),
            &noop(),
        ],
        &[&err(ADDQ, 2, "Data exists for key."), &ok(NOOP, 0)],
        false,
    );
    // append and prepend keep the flags; a CAS must match; nothing to append to.
    check(
        &[
            &set(b"p", 4, b"mid"),
            &req(PREPEND, b"p", b"", b"pre", 0, 0),
            &req(APPEND, b"p", b"", b"post", 0, 0),
            &req(APPEND, b"p", b"", b"x", 0, 1),
            &req(GETK, b"p", b"", b"", 0, 0),
            &req(APPEND, b"zz", b"", b"x", 0, 0),
            &req(APPENDQ, b"zz", b"", b"x", 0, 0),
        ],
        &[
            &ok(SET, 1),
            &ok(PREPEND, 2),
            &ok(APPEND, 3),
            &err(APPEND, 2, "Data exists for key."),
            &res(GETK, 0, b"p", &[0, 0, 0, 4], b"premidpost", 0, 3),
            &err(APPEND, 5, "Not stored."),
            &err(APPENDQ, 5, "Not stored."),
        ],
        false,
    );
}

/// A value over the item limit (1 KiB here) is refused from its header and swallowed; the
/// old value of a set goes, as in memcached.
#[test]
fn too_large_is_swallowed() {
    let big = vec![b'x'; 2048];
    check(
        &[
            &set(b"big", 0, b"old"),
            &req(SET, b"big", &[0; 8], &big, 0, 0),
            &req(APPENDQ, b"big", b"", &big, 0, 0),
            &req(GET, b"big", b"", b"", 0, 0),
        ],
        &[
            &ok(SET, 1),
            &err(SET, 3, "Too large."),
            &err(APPENDQ, 3, "Too large."),
            &err(GET, 1, "Not found"),
        ],
        false,
    );
}

#[test]
fn increment_and_decrement() {
    let create = arith_extras(1, 10, 0);
    check(
        &[
            &req(INCREMENT, b"ctr", &create, b"", 0, 0),
            &req(INCREMENT, b"ctr", &create, b"", 0, 0),
            &req(INCREMENT, b"ctr", &create, b"", 0, 999),
            &req(DECREMENT, b"ctr", &arith_extras(100, 0, 0), b"", 0, 0),
            &req(
                INCREMENT,
                b"nope",
                &arith_extras(1, 0, 0xffff_ffff),
                b"",
                0,
                0,
            ),
            &set(b"s", 0, b"abc"),
            &req(INCREMENT, b"s", &create, b"", 0, 0),
            &req(INCREMENTQ, b"ctr", &create, b"", 0, 0),
            &noop(),
        ],
        &[
            &res(INCREMENT, 0, b"", b"", &10u64.to_be_bytes(), 0, 1),
            &res(INCREMENT, 0, b"", b"", &11u64.to_be_bytes(), 0, 2),
            &err(INCREMENT, 2, "Data exists for key."),
            &res(DECREMENT, 0, b"", b"", &0u64.to_be_bytes(), 0, 3),
            &err(INCREMENT, 1, "Not found"),
            &ok(SET, 4),
            &err(
                INCREMENT,
                6,
                "Non-numeric server-side value for incr or decr",
            ),
            &ok(NOOP, 0),
        ],
        false,
    );
    // 64-bit wrap, and a shorter result padded in place as memcached leaves it.
    check(
        &[
            &set(b"w", 0, b"18446744073709551615"),
            &req(INCREMENT, b"w", &arith_extras(2, 0, 0), b"", 0, 0),
            &set(b"d", 0, b"100"),
            &req(DECREMENT, b"d", &arith_extras(1, 0, 0), b"", 0, 0),
            &req(GET, b"d", b"", b"", 0, 0),
        ],
        &[
            &ok(SET, 1),
            &res(INCREMENT, 0, b"", b"", &1u64.to_be_bytes(), 0, 2),
            &ok(SET, 3),
            &res(DECREMENT, 0, b"", b"", &99u64.to_be_bytes(), 0, 4),
            &res(GET, 0, b"", &[0; 4], b"99 ", 0, 4),
        ],
        false,
    );
}

#[test]
fn delete_touch_gat_flush() {
    check(
        &[
            &set(b"d", 0, b"v"),
            &req(DELETE, b"d", b"", b"", 0, 7),
            &req(DELETE, b"d", b"", b"", 0, 0),
            &req(DELETE, b"d", b"", b"", 0, 0),
            &req(DELETEQ, b"d", b"", b"", 0, 0),
        ],
        &[
            &ok(SET, 1),
            &err(DELETE, 2, "Data exists for key."),
            &ok(DELETE, 0),
            &err(DELETE, 1, "Not found"),
            &err(DELETEQ, 1, "Not found"),
        ],
        false,
    );
    check(
        &[
            &set(b"t", 9, b"abc"),
            &req(TOUCH, b"t", &[0, 0, 0, 10], b"", 0, 0),
            &req(GAT, b"t", &[0, 0, 0, 10], b"", 0, 0),
            &req(GATK, b"t", &[0, 0, 0, 10], b"", 0, 0),
            &req(TOUCH, b"zz", &[0, 0, 0, 10], b"", 0, 0),
            &req(GATQ, b"zz", &[0, 0, 0, 10], b"", 0, 0),
            &req(FLUSH, b"", &[0; 4], b"", 0, 0),
            &req(FLUSHQ, b"", b"", b"", 0, 0),
            &req(GET, b"t", b"", b"", 0, 0),
        ],
        &[
            &ok(SET, 1),
            &res(TOUCH, 0, b"", &[0, 0, 0, 9], b"", 0, 1),
            &res(GAT, 0, b"", &[0, 0, 0, 9], b"abc", 0, 1),
            &res(GATK, 0, b"t", &[0, 0, 0, 9], b"abc", 0, 1),
            &err(TOUCH, 1, "Not found"),
            &ok(FLUSH, 0),
            &err(GET, 1, "Not found"),
        ],
        false,
    );
}

#[test]
fn version_noop_quit() {
    check(
        &[
            &req(VERSION, b"", b"", b"", 1, 0),
            &req(NOOP, b"", b"", b"", 0xdead_beef, 0),
        ],
        &[
            &res(VERSION, 0, b"", b"", b"1.6.18", 1, 0),
            &res(NOOP, 0, b"", b"", b"", 0xdead_beef, 0),
        ],
        false,
    );
    check(
        &[
            &req(NOOP, b"", b"", b"", 1, 0),
            &req(QUIT, b"", b"", b"", 2, 0),
            &noop(),
        ],
        &[
            &res(NOOP, 0, b"", b"", b"", 1, 0),
            &res(QUIT, 0, b"", b"", b"", 2, 0),
        ],
        true,
    );
    check(&[&req(QUITQ, b"", b"", b"", 0, 0)], &[], true);
}

/// memcached's protocol errors: invalid lengths close after "Invalid arguments"; a key
/// longer than the body closes after "Unknown command"; another magic closes silently.
#[test]
fn protocol_errors_close() {
    let inval = err(GET, 4, "Invalid arguments");
    check(
        &[&req(GET, b"k", b"xxxx", b"", 0, 0), &noop()],
        &[&inval],
        true,
    );
    check(&[&req(GET, &[b'k'; 251], b"", b"", 0, 0)], &[&inval], true);
    check(
        &[&req(SET, b"", &[0; 8], b"v", 0, 0)],
        &[&err(SET, 4, "Invalid arguments")],
        true,
    );
    let mut short = req(GET, b"abcde", b"", b"", 0, 0);
    short[8..12].copy_from_slice(&2u32.to_be_bytes());
    check(&[&short], &[&err(GET, 0x81, "Unknown command")], true);
    let mut bad_magic = noop();
    bad_magic[0] = 0x81;
    check(&[&noop(), &bad_magic, &noop()], &[&ok(NOOP, 0)], true);
}

/// Unknown opcodes, verbosity and SASL (not configured) are "Unknown command"; the body
/// length is swallowed after the key, eating as many bytes of the next request (memcached).
#[test]
fn unknown_commands() {
    let unknown = |op| err(op, 0x81, "Unknown command");
    check(
        &[&req(0x50, b"", b"", b"", 0, 0), &noop()],
        &[&unknown(0x50), &ok(NOOP, 0)],
        false,
    );
    // "abc" is read as the key, then 3 more bytes go: the noop is cut and never answered.
    check(
        &[&req(0x50, b"abc", b"", b"", 0, 0), &noop()],
        &[&unknown(0x50)],
        false,
    );
    check(
        &[
            &req(VERBOSITY, b"", &[0, 0, 0, 1], b"", 0, 0),
            &[0; 4],
            &noop(),
        ],
        &[&unknown(VERBOSITY), &ok(NOOP, 0)],
        false,
    );
    check(
        &[
            &req(SASL_LIST_MECHS, b"", b"", b"", 0, 0),
            &req(SASL_AUTH, b"PLAIN", b"", b"\0u\0p", 0, 0),
            &noop(),
        ],
        &[&unknown(SASL_LIST_MECHS), &unknown(SASL_AUTH), &ok(NOOP, 0)],
        false,
    );
}

#[test]
fn stats_frames() {
    check(
        &[
            &req(STAT, b"reset", b"", b"", 4, 0),
            &req(STAT, b"bogus", b"", b"", 5, 0),
            &req(STAT, b"detail dump", b"", b"", 7, 0),
            &req(STAT, b"detail on", b"", b"", 8, 0),
            &req(STAT, b"detail bogus", b"", b"", 9, 0),
        ],
        &[
            &res(STAT, 0, b"", b"", b"", 4, 0),
            &res(STAT, 1, b"", b"", b"Not found", 5, 0),
            // memcached 1.6.18 with no prefix recorded: `detailed` = "END\r\n", then the end.
            &res(STAT, 0, b"detailed", b"", b"END\r\n", 7, 0),
            &res(STAT, 0, b"", b"", b"", 7, 0),
            &res(STAT, 0, b"", b"", b"", 8, 0),
            &res(STAT, 1, b"", b"", b"Not found", 9, 0),
        ],
        false,
    );
    let (out, _) = feed(&shared(), &[&req(STAT, b"", b"", b"", 6, 0)]);
    let frame = res(STAT, 0, b"version", b"", b"1.6.18", 6, 0);
    assert!(out.windows(frame.len()).any(|w| w == frame));
    assert!(out.ends_with(&res(STAT, 0, b"", b"", b"", 6, 0)));
    let frames = out.len() / 24;
    assert!(frames > 20, "{frames}");
}

/// The first byte decides: a text connection never turns binary, and text on a binary
/// connection is not a command.
#[test]
fn protocol_is_chosen_by_the_first_byte() {
    let mut text = b"version\r\n".to_vec();
    text.extend_from_slice(&noop());
    let (out, _) = feed(&shared(), &[&text]);
    assert!(out.starts_with(b"VERSION 1.6.18\r\n"), "{out:?}");
    assert_eq!(feed(&shared(), &[&noop(), b"version\r\n"]).0, ok(NOOP, 0));
}

const NOW: Now = Now {
    store: 100,
    unix: 1_700_000_100,
    mono_ms: 0,
    mono_ns: 0,
};

/// A value that does not fit the connection-memory budget is refused with "Out of memory"
/// before it is read, swallowed, and the set's old value goes.
#[test]
fn a_value_without_room_is_refused_and_swallowed() {
    let shared = bound_tests::shared(IN_FREE);
    let value = vec![b'v'; 2 * IN_FREE + 10];
    let mut s = Session::new(Protocol::Memcache, 0);
    let mut out = Vec::new();
    let _ = s.on_bytes(&set(b"k", 0, b"old"), NOW, &shared, None, &mut out);
    let frame = set(b"k", 0, &value);
    // The header and some of the value arrive: the whole request cannot be reserved.
    let (first, rest) = frame.split_at(100);
    out.clear();
    assert_eq!(
        s.on_bytes(first, NOW, &shared, None, &mut out),
        Flow::Continue
    );
    assert_eq!(out, err(SET, 0x82, "Out of memory"));
    assert!(s.has_partial_request(), "the value is being swallowed");
    out.clear();
    for piece in rest.chunks(4096) {
        assert_eq!(
            s.on_bytes(piece, NOW, &shared, None, &mut out),
            Flow::Continue
        );
    }
    assert!(out.is_empty());
    let _ = s.on_bytes(
        &req(GET, b"k", b"", b"", 0, 0),
        NOW,
        &shared,
        None,
        &mut out,
    );
    assert_eq!(out, err(GET, 1, "Not found"));
    assert_eq!(shared.conn_memory.used(), 0);
}

/// A declared 2 GiB body is refused from the header: nothing is buffered while it streams.
#[test]
fn a_hostile_body_length_buffers_nothing() {
    let shared = shared();
    let mut header = set(b"k", 0, b"");
    header[8..12].copy_from_slice(&(1u32 << 31).to_be_bytes());
    let mut s = Session::new(Protocol::Memcache, 0);
    let mut out = Vec::new();
    assert_eq!(
        s.on_bytes(&header, NOW, &shared, None, &mut out),
        Flow::Continue
    );
    assert_eq!(out, err(SET, 3, "Too large."));
    let chunk = vec![0u8; 64 << 10];
    for _ in 0..64 {
        assert_eq!(
            s.on_bytes(&chunk, NOW, &shared, None, &mut out),
            Flow::Continue
        );
    }
    assert!(s.has_partial_request());
    assert_eq!(shared.conn_memory.used(), 0);
}

/// Pipelined gets of a big value are produced as the client drains them: pending output
/// stays near the high-water mark.
#[test]
fn pipelined_gets_stop_at_the_high_water_mark() {
    let shared = bound_tests::shared(64 << 20);
    let value = vec![b'x'; 256 << 10];
    let mut s = Session::new(Protocol::Memcache, 0);
    let mut out = Vec::new();
    let _ = s.on_bytes(&set(b"big", 0, &value), NOW, &shared, None, &mut out);
    assert_eq!(out, ok(SET, 1));
    let gets: Vec<u8> = (0..40)
        .flat_map(|i| req(GETQ, b"big", b"", b"", i, 0))
        .chain(noop())
        .collect();
    let (sent, most) = bound_tests::drain_all(&shared, &mut s, &gets);
    assert_eq!(sent.len(), 40 * (24 + 4 + value.len()) + 24);
    assert!(most <= (64 << 10) + 2 * (value.len() + 28), "{most}");
    assert!(sent.ends_with(&ok(NOOP, 0)));
}

/// With a data device, binary replies wait for their records like text ones, in order; a
/// failed record is answered with an internal-error frame echoing the request's opcode and
/// opaque, also for a quiet set (the binary protocol answers a quiet request's errors).
#[test]
fn replies_wait_for_the_device_and_a_failure_is_an_error_frame() {
    use crate::Device;
    let shared = shared();
    let device = TestDevice::default();
    let mut s = Session::new(Protocol::Memcache, 0);
    let mut out = Vec::new();
    let input = [
        req(GET, b"a", b"", b"", 1, 0),
        req(SET, b"a", &[0; 8], b"x", 2, 0),
        req(GETK, b"a", b"", b"", 3, 0),
        req(SETQ, b"b", &[0; 8], b"y", 4, 0),
        req(NOOP, b"", b"", b"", 5, 0),
    ]
    .concat();
    assert_eq!(
        s.on_bytes(&input, NOW, &shared, Some(&device), &mut out),
        Flow::Continue
    );
    let miss = res(GET, 1, b"", b"", b"Not found", 1, 0);
    assert_eq!(out, miss, "everything after the set waits for token 1");
    assert_eq!(device.staged(), 2);
    s.on_durable(1, true, &shared, &mut out);
    let stored = [
        miss.clone(),
        res(SET, 0, b"", b"", b"", 2, 1),
        res(GETK, 0, b"a", &[0; 4], b"x", 3, 1),
    ]
    .concat();
    assert_eq!(out, stored);
    s.on_durable(2, false, &shared, &mut out);
    let failed = [
        stored,
        res(SETQ, 0x84, b"", b"", b"Data device write failed", 4, 0),
        res(NOOP, 0, b"", b"", b"", 5, 0),
    ]
    .concat();
    assert_eq!(out, failed);
    assert!(!s.awaits_durable());
}

#[test]
fn a_reply_the_transport_cannot_carry_is_answered_in_the_request_protocol() {
    let mut out = Vec::new();
    super::super::reply_too_large(b"get k\r\n", b"TEXT\r\n", &mut out);
    assert_eq!(out, b"TEXT\r\n");
    out.clear();
    super::super::reply_too_large(&req(GETKQ, b"k", b"", b"", 9, 0), b"TEXT\r\n", &mut out);
    assert_eq!(out, res(GETKQ, 3, b"", b"", b"Too large.", 9, 0));
}
