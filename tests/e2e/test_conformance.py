"""Conformance that clients and security depend on: error replies survive a client that is
still sending (lingering close), Host and version rules (RFC 9112 §3.2, RFC 9110 §2.5), and
memcached's hang-up on HTTP-looking commands, compared with the real memcached."""

import socket
import time

import pytest

from conftest import raw

TRIES = 30


def status_of(out):
    line = out.split(b"\r\n", 1)[0]
    parts = line.split()
    return int(parts[1]) if len(parts) > 1 and line.startswith(b"HTTP/") else None


def send_then_read(addr, pieces, timeout=10.0):
    """Writes `pieces` one send each, as a client that reads only once its request is out
    (most do), then reads until the server closes. Returns (whether every byte was written,
    what was read). A write that fails with a reset is what a real client sees as a lost
    reply: `http.client`, `requests` and curl report the write error and never read."""
    s = socket.create_connection(addr, timeout=timeout)
    try:
        written = True
        try:
            for piece in pieces:
                s.sendall(piece)
        except OSError:
            written = False
        data = b""
        while True:
            try:
                chunk = s.recv(65536)
            except OSError:
                break
            if not chunk:
                break
            data += chunk
        return written, data
    finally:
        s.close()


# Each request makes the server answer before it has read everything the client writes.
PAD_22K = b"X-Pad: " + b"p" * 22000 + b"\r\n"
CASES = {
    # 22 KB of headers in one write (all of it is in flight before the server answers).
    "431-22KB-of-headers": ([b"GET /a HTTP/1.1\r\nHost: h\r\n" + PAD_22K + b"\r\n"], 431),
    # The same as a PUT whose body follows the headers.
    "431-22KB-of-headers-then-1MB-body": (
        [b"PUT /a HTTP/1.1\r\nHost: h\r\nContent-Length: 1000000\r\n" + PAD_22K + b"\r\n"]
        + [b"b" * 10000] * 100,
        431,
    ),
    # 200 headers of 110 bytes, one write per line.
    "431-200-headers-line-by-line": (
        [b"GET /a HTTP/1.1\r\nHost: h\r\n"]
        + [b"X-H%03d: %s\r\n" % (i, b"v" * 100) for i in range(200)]
        + [b"\r\n"],
        431,
    ),
    # A body over --item-size-max, written whole before reading.
    "413-3MB-body": (
        [b"PUT /a HTTP/1.1\r\nHost: h\r\nContent-Length: 3000000\r\n\r\n", b"b" * 3000000],
        413,
    ),
    # A bad Content-Length, with the body the client meant to send, in 1 KB writes.
    "400-bad-length-then-300KB": (
        [b"PUT /a HTTP/1.1\r\nHost: h\r\nContent-Length: 1x\r\n\r\n"] + [b"b" * 1000] * 300,
        400,
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_error_reply_reaches_a_client_that_is_still_sending(server, case):
    pieces, status = CASES[case]
    results = [send_then_read(server.http, pieces) for _ in range(TRIES)]
    received = sum(1 for written, out in results if written and status_of(out) == status)
    assert received == TRIES, (
        f"{status} received {received}/{TRIES}; "
        f"writes cut by a reset: {sum(1 for w, _ in results if not w)}"
    )
    assert server.alive()


def test_http_client_sees_413_for_a_large_put(server):
    # The standard library client writes the whole body, then reads the status.
    import http.client

    host, port = server.http
    statuses = []
    for _ in range(TRIES):
        conn = http.client.HTTPConnection(host, port, timeout=10)
        try:
            conn.request("PUT", "/big", body=b"b" * 3000000)
            statuses.append(conn.getresponse().status)
        except OSError as err:
            statuses.append(type(err).__name__)
        finally:
            conn.close()
    assert statuses == [413] * TRIES, statuses


def test_memcache_error_reaches_a_client_that_is_still_sending(server):
    # A 4 MB get line is refused with CLIENT_ERROR and a close after about 1 MiB, while the
    # client is still writing the rest.
    pieces = [b"get "] + [b"k " * 5000] * 400 + [b"\r\n"]
    results = [send_then_read(server.mc, pieces) for _ in range(TRIES)]
    received = sum(1 for written, out in results if written and out == b"CLIENT_ERROR line too long\r\n")
    assert received == TRIES, f"CLIENT_ERROR received {received}/{TRIES}"


def flood_after_error(addr, pace_s, chunk, limit_s):
    """Triggers a 431, then keeps sending `chunk` every `pace_s` without reading. Returns
    (seconds until the server cut the connection or None, bytes sent, what was read)."""
    s = socket.create_connection(addr, timeout=5)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 << 10)
    sent = 0
    start = time.monotonic()
    cut = None
    try:
        s.sendall(CASES["431-22KB-of-headers"][0][0])
        while time.monotonic() - start < limit_s:
            try:
                sent += s.send(chunk)
            except (BrokenPipeError, ConnectionResetError):
                cut = time.monotonic() - start
                break
            except socket.timeout:
                continue
            if pace_s:
                time.sleep(pace_s)
        s.settimeout(1)
        data = b""
        try:
            while True:
                c = s.recv(65536)
                if not c:
                    break
                data += c
        except OSError:
            pass
        return cut, sent, data
    finally:
        s.close()


def test_lingering_is_bounded_in_bytes(server):
    # Sending as fast as loopback allows: cut once 16 MiB have been discarded.
    cut, sent, data = flood_after_error(server.http, 0, b"z" * 65536, limit_s=20)
    assert cut is not None, f"still accepted after {sent} bytes in 20 s"
    assert sent < (16 << 20) + (8 << 20), sent
    assert status_of(data) == 431, data[:100]
    assert server.alive()


def test_lingering_is_bounded_in_time(server):
    # A slow sender that never stops: cut about 2 s after the reply.
    cut, sent, data = flood_after_error(server.http, 0.05, b"z" * 1024, limit_s=15)
    assert cut is not None, f"still accepted after {sent} bytes in 15 s"
    assert 1.5 <= cut <= 5, cut
    assert status_of(data) == 431, data[:100]
    assert server.alive()


def test_lingering_ends_when_the_client_closes(server):
    # A client that reads the reply and closes frees its connection at once, not after 2 s.
    closed_at = time.monotonic()
    written, out = send_then_read(server.http, CASES["431-22KB-of-headers"][0])
    assert written and status_of(out) == 431
    while True:
        out = raw(server.mc, b"stats\r\n", read_until=b"END\r\n")
        stats = dict(l.split()[1:3] for l in out.decode().splitlines() if l.startswith("STAT "))
        if int(stats["curr_connections"]) == 1:  # the stats connection itself
            break
        assert time.monotonic() - closed_at < 1.0, stats
        time.sleep(0.05)


def http_status(server, request):
    return status_of(raw(server.http, request, read_until=b"\r\n\r\n"))


def test_host_is_required_on_http11_and_must_be_single_and_valid(server):
    raw(server.http, b"PUT /h HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\nConnection: close\r\n\r\nx")
    assert http_status(server, b"GET /h HTTP/1.1\r\n\r\n") == 400
    assert http_status(server, b"GET /h HTTP/1.1\r\nHost: a\r\nHost: a\r\n\r\n") == 400
    assert http_status(server, b"GET /h HTTP/1.1\r\nHost: a b\r\n\r\n") == 400
    assert http_status(server, b"GET /h HTTP/1.1\r\nHost: a/b\r\n\r\n") == 400
    assert http_status(server, b"GET /h HTTP/1.0\r\nHost: x\r\nHost: y\r\n\r\n") == 400
    assert http_status(server, b"GET /h HTTP/1.1\r\nHost: example.com:8080\r\n\r\n") == 200
    assert http_status(server, b"GET /h HTTP/1.1\r\nHost: [::1]\r\n\r\n") == 200
    assert http_status(server, b"GET /h HTTP/1.1\r\nHost:\r\n\r\n") == 200
    assert http_status(server, b"GET /h HTTP/1.0\r\n\r\n") == 200


def test_higher_minor_versions_are_served_as_http11(server):
    raw(server.http, b"PUT /v HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
    out = raw(server.http, b"GET /v HTTP/1.2\r\nHost: h\r\n\r\n", read_until=b"ok")
    assert out.startswith(b"HTTP/1.1 200 OK\r\n") and out.endswith(b"ok"), out
    # Kept alive as 1.1: a second request on the same connection is answered.
    out = raw(server.http, b"GET /v HTTP/1.9\r\nHost: h\r\n\r\nGET /v HTTP/1.1\r\nHost: h\r\n\r\n",
              read_until=b"okHTTP/1.1 200 OK\r\n")
    assert out.count(b"HTTP/1.1 200 OK\r\n") == 2, out
    assert http_status(server, b"GET /v HTTP/1.2\r\n\r\n") == 400
    for version in (b"HTTP/2.0", b"HTTP/3.0", b"HTTP/0.9"):
        assert http_status(server, b"GET /v " + version + b"\r\nHost: h\r\n\r\n") == 505, version


# ---- memcache: HTTP-looking commands, compared with the real memcached ----

MEMCACHE_LINES = [
    b"GET / HTTP/1.0\r\n",
    b"PUT /x HTTP/1.1\r\n",
    b"DELETE HTTP/1.1\r\n",
    b"POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabc",
    b"OPTIONS * HTTP/1.1\r\n",
    b"HTTP/1.1\r\n",
    b"get / HTTP/1.1\r\n",
    b"gx / HTTP/1.1\r\n",
    b"POST / http/1.1\r\n",
    b"bogus HTTP\r\n",
    b"mx HTTP/1.1\r\n",
    b"version HTTP/1.1\r\n",
]


def exchange(addr, payload):
    """(reply bytes, whether the server closed) within a short wait."""
    s = socket.create_connection(addr, timeout=2)
    try:
        s.sendall(payload)
        s.settimeout(0.5)
        data = b""
        while True:
            try:
                chunk = s.recv(4096)
            except socket.timeout:
                return data, False
            except ConnectionResetError:
                return data, True
            if not chunk:
                return data, True
            data += chunk
    finally:
        s.close()


@pytest.mark.parametrize("line", MEMCACHE_LINES, ids=lambda l: l.split(b"\r\n")[0].decode())
def test_http_looking_commands_match_memcached(server, memcached, line):
    want = exchange(memcached, line)
    got = exchange(server.mc, line)
    assert got == want, f"memcached {want}, ringstore {got}"


def test_http_looking_commands_close_without_a_reply(server):
    for line in (b"GET / HTTP/1.0\r\n", b"PUT /x HTTP/1.1\r\n", b"DELETE HTTP/1.1\r\n"):
        assert exchange(server.mc, line) == (b"", True), line
