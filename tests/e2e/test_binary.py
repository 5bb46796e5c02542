"""The memcache binary protocol, compared with the real memcached 1.6.18 byte for byte.

Raw frames go to both servers over a socket (and over UDP); the responses must be the same
bytes, except CAS uniques, which each server counts its own way: they are compared by the
order they first appear in (the same item must carry the same CAS in both)."""

import socket
import struct
import time

import pytest

from conftest import Server, real_memcached
from test_durable import fault_device, make_file, serve  # noqa: F401 (fault_device: a fixture)

REQ = ">BBHBBHIIQ"
# opcodes
GET, SET, ADD, REPLACE, DELETE, INCR, DECR, QUIT, FLUSH, GETQ, NOOP, VERSION = range(12)
GETK, GETKQ, APPEND, PREPEND, STAT, SETQ, ADDQ, REPLACEQ, DELETEQ, INCRQ, DECRQ = range(12, 23)
QUITQ, FLUSHQ, APPENDQ, PREPENDQ, VERBOSITY, TOUCH, GAT, GATQ = range(23, 31)
SASL_LIST, SASL_AUTH, GATK, GATKQ = 0x20, 0x21, 0x23, 0x24
END_OPAQUE = 0xFEEDF00D
# A CAS no item of either server carries.
WRONG_CAS = 0xFFFF_FFFF_FFFF_0001


def req(op, key=b"", extras=b"", value=b"", opaque=0, cas=0):
    body = extras + key + value
    return struct.pack(REQ, 0x80, op, len(key), len(extras), 0, 0, len(body), opaque, cas) + body


def header(op, key_len, extras_len, body_len, opaque=0):
    return struct.pack(REQ, 0x80, op, key_len, extras_len, 0, 0, body_len, opaque, 0)


def sset(key, value, flags=0, exptime=0, op=SET, cas=0, opaque=0):
    return req(op, key, struct.pack(">II", flags, exptime), value, opaque, cas)


def arith(op, key, delta, initial, exptime=0, cas=0):
    return req(op, key, struct.pack(">QQI", delta, initial, exptime), cas=cas)


def end_marker():
    return req(NOOP, opaque=END_OPAQUE)


def frames(data):
    """Splits a byte stream into response frames (header fields, body), plus any rest."""
    out = []
    while len(data) >= 24:
        fields = struct.unpack(REQ, data[:24])
        body_len = fields[6]
        if len(data) < 24 + body_len:
            break
        out.append((fields, data[24 : 24 + body_len]))
        data = data[24 + body_len :]
    return out, data


def canonical(data):
    """The response bytes with each CAS replaced by the order it first appeared in."""
    parsed, rest = frames(data)
    seen = {0: 0}
    canon = []
    for fields, body in parsed:
        cas = fields[8]
        seen.setdefault(cas, len(seen))
        canon.append(struct.pack(REQ, *fields[:8], seen[cas]) + body)
    return b"".join(canon) + rest


def exchange(addr, payload, wait=1.5):
    """Sends `payload`; returns (response bytes, closed) once the end marker's response, a
    close, or the wait came."""
    s = socket.create_connection(addr, timeout=5)
    try:
        s.sendall(payload)
        data = b""
        closed = False
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            parsed, _ = frames(data)
            if any(f[1] == NOOP and f[7] == END_OPAQUE for f, _ in parsed):
                break
            s.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                break
            except ConnectionResetError:
                closed = True
                break
            if not chunk:
                closed = True
                break
            data += chunk
        if not closed:
            # A close right behind the last response (quit, protocol errors).
            s.settimeout(0.05)
            try:
                closed = s.recv(1) == b""
            except socket.timeout:
                pass
            except ConnectionResetError:
                closed = True
        return data, closed
    finally:
        s.close()


@pytest.fixture(scope="module")
def memcached():
    with real_memcached(udp=True) as addr:
        yield addr


@pytest.fixture(scope="module")
def ringstore():
    s = Server("--memory", "64MiB", "--udp", "127.0.0.1:0")
    yield s
    s.stop()


def udp_addr(server):
    host, port = dict(f.split("=", 1) for f in server.ready.split()[1:])["udp"].rsplit(":", 1)
    return host, int(port)


FLUSH_FIRST = req(FLUSH)
BIG = b"x" * (2 << 20)

# Each case starts with a flush, so it sees an empty cache on both servers, and ends with the
# end marker (a noop) unless it closes first.
CASES = {
    "set_get_getk": sset(b"k", b"abc", flags=5, opaque=7) + req(GETK, b"k", opaque=9) + req(GET, b"k", opaque=1),
    "misses": req(GET, b"zz", opaque=3) + req(GETK, b"zz", opaque=4),
    "quiet_gets": sset(b"a", b"1", opaque=1)
    + sset(b"b", b"22", flags=3, opaque=2)
    + req(GETKQ, b"a", opaque=5)
    + req(GETKQ, b"x", opaque=6)
    + req(GETQ, b"b", opaque=7)
    + req(GATKQ, b"x", struct.pack(">I", 10), opaque=8),
    "add_replace_cas": sset(b"k", b"abc")
    + sset(b"k", b"abc", op=ADD)
    + sset(b"nope", b"abc", op=REPLACE)
    + sset(b"k", b"abc", cas=WRONG_CAS)
    + sset(b"nokey", b"abc", cas=WRONG_CAS),
    "quiet_storage": sset(b"q", b"v", op=SETQ) + sset(b"q", b"v", op=ADDQ) + sset(b"r", b"v", op=REPLACEQ),
    "append_prepend": sset(b"p", b"mid", flags=4)
    + req(PREPEND, b"p", value=b"pre")
    + req(APPEND, b"p", value=b"post")
    + req(APPEND, b"p", value=b"x", cas=WRONG_CAS)
    + req(GETK, b"p")
    + req(APPEND, b"zz", value=b"x")
    + req(APPENDQ, b"zz", value=b"x")
    + req(PREPENDQ, b"p", value=b"<"),
    "too_large": sset(b"big", b"old") + sset(b"big", BIG) + req(APPEND, b"big", value=BIG) + req(GET, b"big"),
    "incr_decr": arith(INCR, b"ctr", 1, 10)
    + arith(INCR, b"ctr", 1, 10)
    + arith(DECR, b"ctr", 100, 0)
    + arith(INCR, b"nope", 1, 0, exptime=0xFFFFFFFF)
    + sset(b"s", b"abc")
    + arith(INCR, b"s", 1, 0)
    + arith(INCRQ, b"ctr", 5, 0)
    + arith(DECRQ, b"nope", 1, 0, exptime=0xFFFFFFFF)
    + sset(b"w", b"18446744073709551615")
    + arith(INCR, b"w", 2, 0)
    + sset(b"d", b"100")
    + arith(DECR, b"d", 1, 0)
    + req(GET, b"d"),
    "incr_cas": sset(b"c", b"5") + arith(INCR, b"c", 1, 0, cas=WRONG_CAS) + arith(INCR, b"c", 1, 0),
    "delete": sset(b"d", b"v")
    + req(DELETE, b"d", cas=WRONG_CAS)
    + req(DELETE, b"d")
    + req(DELETE, b"d")
    + req(DELETEQ, b"d")
    + sset(b"e", b"v")
    + req(DELETEQ, b"e")
    + req(GET, b"e"),
    "touch_gat": sset(b"t", b"abc", flags=9)
    + req(TOUCH, b"t", struct.pack(">I", 10))
    + req(GAT, b"t", struct.pack(">I", 10))
    + req(GATK, b"t", struct.pack(">I", 10))
    + req(GATQ, b"t", struct.pack(">I", 10))
    + req(TOUCH, b"zz", struct.pack(">I", 10))
    + req(GATQ, b"zz", struct.pack(">I", 10)),
    "flush_variants": sset(b"f", b"v") + req(FLUSH, extras=struct.pack(">I", 0)) + req(FLUSHQ) + req(GET, b"f"),
    "version_noop": req(VERSION, opaque=1) + req(NOOP, opaque=0xDEADBEEF),
    "stat_reset_and_unknown_key": req(STAT, b"reset", opaque=4) + req(STAT, b"bogus", opaque=5) + req(STAT, b"conns"),
    "unknown_opcode": req(0x50),
    # memcached swallows the body length after the key it read: 3 more bytes go.
    "unknown_with_body_swallows": req(0x50, b"abc") + b"..." + req(NOOP, opaque=1),
    "verbosity_is_unknown": req(VERBOSITY, extras=struct.pack(">I", 1)) + b"\0" * 4,
    "sasl_not_configured": req(SASL_LIST) + req(SASL_AUTH, b"PLAIN", value=b"\0u\0p"),
    "expiry_max": sset(b"e", b"v", exptime=0xFFFFFFFF) + req(GET, b"e"),
    "binary_key": sset(b"a b\x00\x01", b"v") + req(GETK, b"a b\x00\x01"),
    "datatype_ignored": struct.pack(REQ, 0x80, NOOP, 0, 0, 1, 5, 0, 9, 0),
}

# Cases that end with a close: no end marker is answered.
CLOSING = {
    "quit": req(NOOP, opaque=1) + req(QUIT, opaque=2) + req(NOOP, opaque=3),
    "quitq": req(QUITQ) + req(NOOP),
    "get_with_extras": req(GET, b"k", extras=b"xxxx"),
    "get_with_value": req(GET, b"k", value=b"zz"),
    "key_too_long": req(GET, b"k" * 251),
    "key_longer_than_body": header(GET, 5, 0, 2) + b"abcde",
    "big_key_longer_than_body": header(0x50, 300, 0, 10) + b"k" * 300,
    "big_key": header(0x50, 300, 0, 300) + b"k" * 300,
    "set_without_key": sset(b"", b"v"),
    "set_short_extras": req(SET, b"k", struct.pack(">I", 0), b"v"),
    "incr_short_extras": req(INCR, b"k", extras=b"x" * 8),
    "flush_bad_extras": req(FLUSH, extras=b"ab"),
    "version_with_key": req(VERSION, b"k"),
    "touch_without_key": req(TOUCH, extras=struct.pack(">I", 10)),
    "stat_with_extras": req(STAT, extras=b"xxxx"),
    "sasl_list_with_key": req(SASL_LIST, b"k"),
    "bad_magic_mid_connection": req(NOOP) + b"\x81" + bytes(23) + req(NOOP),
}


def compare(memcached, ringstore, payload):
    want, want_closed = exchange(memcached, payload)
    got, got_closed = exchange(ringstore.mc, payload)
    assert canonical(got) == canonical(want), f"memcached {frames(want)}\nringstore {frames(got)}"
    assert got_closed == want_closed
    return got


@pytest.mark.parametrize("name", sorted(CASES))
def test_same_bytes_as_memcached(memcached, ringstore, name):
    got = compare(memcached, ringstore, FLUSH_FIRST + CASES[name] + end_marker())
    parsed, _ = frames(got)
    assert parsed, "no response at all"
    assert parsed[0][0][1] == FLUSH


@pytest.mark.parametrize("name", sorted(CLOSING))
def test_protocol_errors_close_like_memcached(memcached, ringstore, name):
    compare(memcached, ringstore, FLUSH_FIRST + CLOSING[name] + end_marker())


def test_a_value_stored_already_expired_is_gone(memcached, ringstore):
    """As memcached: stored, then a miss. (memcached's reply carries the CAS of the item it
    stored and dropped; ringstore's is 0, as it stores nothing.)"""
    payload = sset(b"e", b"v", exptime=1_000_000_000) + req(GET, b"e") + end_marker()
    for addr in (memcached, ringstore.mc):
        data, _ = exchange(addr, payload)
        statuses = [(f[1], f[5]) for f, _ in frames(data)[0]]
        assert statuses == [(SET, 0), (GET, 1), (NOOP, 0)]


def test_stats_are_frames_ending_with_an_empty_one(memcached, ringstore):
    for addr in (memcached, ringstore.mc):
        data, closed = exchange(addr, req(STAT, opaque=3) + end_marker())
        parsed, rest = frames(data)
        assert not closed and rest == b""
        stats = {body[: f[2]]: body[f[2] :] for f, body in parsed if f[1] == STAT and f[2]}
        assert stats[b"version"] == b"1.6.18"
        assert int(stats[b"pid"]) > 0
        terminator = [f for f, body in parsed if f[1] == STAT and f[6] == 0]
        assert len(terminator) == 1 and terminator[0][7] == 3


def test_text_connections_are_untouched(memcached, ringstore):
    for addr in (memcached, ringstore.mc):
        data, _ = exchange(addr, b"version\r\n", wait=0.3)
        assert data == b"VERSION 1.6.18\r\n"


def test_values_set_in_binary_read_back_in_text(ringstore):
    exchange(ringstore.mc, sset(b"shared", b"hello", flags=3) + end_marker())
    data, _ = exchange(ringstore.mc, b"get shared\r\n", wait=0.3)
    assert data == b"VALUE shared 3 5\r\nhello\r\nEND\r\n"


def test_a_declared_2gib_body_is_refused_without_ram_growth(ringstore):
    """memcached answers such a set only after it swallowed the 2 GiB; ringstore answers at
    once from the header, then swallows what comes without buffering it."""
    before = ringstore.rss_bytes()
    s = socket.create_connection(ringstore.mc, timeout=5)
    try:
        s.sendall(header(SET, 1, 8, 1 << 31, opaque=11) + struct.pack(">II", 0, 0) + b"k")
        data = b""
        while len(data) < 24 + 10:
            chunk = s.recv(4096)
            assert chunk, "closed"
            data += chunk
        (fields, body), = frames(data)[0]
        assert (fields[1], fields[5], fields[7], body) == (SET, 3, 11, b"Too large.")
        chunk = b"\0" * (1 << 20)
        for _ in range(32):
            s.sendall(chunk)
        # Still open: more of the body is taken (and dropped).
        s.sendall(chunk)
    finally:
        s.close()
    grown = ringstore.rss_bytes() - before
    assert grown < 8 << 20, f"RSS grew by {grown} bytes"
    assert exchange(ringstore.mc, req(VERSION) + end_marker())[0].startswith(b"\x81\x0b")


def test_a_declared_4gib_unknown_command_is_swallowed_without_ram_growth(ringstore):
    before = ringstore.rss_bytes()
    s = socket.create_connection(ringstore.mc, timeout=5)
    try:
        s.sendall(header(0x50, 0, 0, 0xFFFFFFFF, opaque=12))
        data = s.recv(4096)
        (fields, body), = frames(data)[0]
        assert (fields[5], body) == (0x81, b"Unknown command")
        for _ in range(16):
            s.sendall(b"\0" * (1 << 20))
    finally:
        s.close()
    assert ringstore.rss_bytes() - before < 8 << 20


def udp_exchange(addr, payload, request_id):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(1.0)
    try:
        s.sendto(struct.pack(">HHHH", request_id, 0, 1, 0) + payload, addr)
        data, _ = s.recvfrom(65536)
        return data
    finally:
        s.close()


def test_binary_over_udp_like_memcached(memcached, ringstore):
    """memcached serves binary over UDP, choosing the protocol per datagram."""
    ours = udp_addr(ringstore)
    for payload in (req(VERSION, opaque=5), req(NOOP, opaque=6), req(GET, b"udp-miss", opaque=7)):
        want = udp_exchange(memcached, payload, 3)
        got = udp_exchange(ours, payload, 3)
        assert got == want
    exchange(ringstore.mc, sset(b"udpk", b"val", flags=1) + end_marker())
    got = udp_exchange(ours, req(GETK, b"udpk", opaque=9), 4)
    assert got[:8] == struct.pack(">HHHH", 4, 0, 1, 0)
    (fields, body), = frames(got[8:])[0]
    assert (fields[1], fields[5], fields[7], body) == (GETK, 0, 9, b"\0\0\0\1udpkval")
    # The next datagram may be text again.
    assert udp_exchange(ours, b"version\r\n", 5)[8:] == b"VERSION 1.6.18\r\n"


def test_a_udp_reply_over_the_bound_is_a_binary_too_large(ringstore):
    exchange(ringstore.mc, sset(b"udpbig", b"v" * (100 << 10)) + end_marker())
    got = udp_exchange(udp_addr(ringstore), req(GETKQ, b"udpbig", opaque=21), 6)
    (fields, body), = frames(got[8:])[0]
    assert (fields[1], fields[5], fields[7], body) == (GETKQ, 3, 21, b"Too large.")


def test_a_failed_device_write_is_an_internal_error_frame(fault_device, server_factory, tmp_path):
    """With --data, a binary write whose record the device fails (a real EIO through the fault
    device) is answered status 0x84 with its own opcode and opaque, also a quiet one; the
    failed value is not served, and the writes around it are."""
    backing = tmp_path / "bin.img"
    make_file(backing, 32 << 20)
    dev = fault_device(backing)
    s = serve(server_factory, dev.path, "--cores", "1")
    dev.wait_quiet()
    dev.fail_write(2)
    data, _ = exchange(s.mc, sset(b"k", b"v1", opaque=1) + end_marker())
    assert frames(data)[0][0][0][5] == 0
    data, _ = exchange(s.mc, sset(b"k", b"bad", op=SETQ, opaque=2) + end_marker())
    (fields, body), _noop = frames(data)[0]
    assert (fields[1], fields[5], fields[7], body) == (SETQ, 0x84, 2, b"Data device write failed")
    data, _ = exchange(s.mc, req(GET, b"k", opaque=3) + end_marker())
    (fields, body), _noop = frames(data)[0]
    assert (fields[5], body) == (0, b"\0\0\0\0v1")
    assert s.alive()
