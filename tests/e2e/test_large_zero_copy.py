"""Big GET values sent from the item (ADR 0027): a value of 4 KiB or more is pinned in the
arena while its send is in flight instead of being copied per connection. Overwrites,
evictions and flushes of a pinned value must not change a byte a slow reader still gets;
the orphaned segment counts against --memory; and no number of clients that never read can
pin more than the stated caps (64 MiB per worker, 2 MiB per connection, an eighth of the
arena), past which values are copied (`zero_copy_fallbacks`)."""

import os
import socket
import struct
import time

import pytest

from test_memory_bounds import CONSTANT, MiB, mc, recv_exact, stats, store


def slow_client(server):
    """A connection with a tiny receive buffer: what it does not read stays in the server."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.settimeout(20)
    s.connect(server.mc)
    return s


def churn(server, rounds, size, tag):
    """`rounds` sets of `size`-byte values (noreply, pipelined), then a round trip."""
    s = mc(server)
    value = bytes([tag]) * size
    batch = b"".join(b"set %s%d 0 0 %d noreply\r\n%s\r\n" % (b"c", i, size, value) for i in range(rounds))
    s.sendall(batch)
    s.sendall(b"version\r\n")
    got = b""
    while not got.endswith(b"\r\n"):
        got += s.recv(4096)
    assert got.startswith(b"VERSION"), got[:200]
    s.close()


def wait_for(server, watcher, pred, what, timeout=10):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = stats(server, watcher)
        if pred(st):
            return st
        time.sleep(0.1)
    raise AssertionError(f"{what}: {st}")


def read_reply(sock):
    """The VALUE blocks of a get's reply, up to END."""
    values, buf = [], b""
    while True:
        while b"\r\n" not in buf:
            buf += sock.recv(1 << 20)
        line, buf = buf.split(b"\r\n", 1)
        if line == b"END":
            assert buf == b"", buf[:100]
            return values
        assert line.startswith(b"VALUE big 0 "), line[:100]
        n = int(line.split()[3])
        while len(buf) < n + 2:
            buf += sock.recv(1 << 20)
        assert buf[n : n + 2] == b"\r\n"
        values.append(buf[:n])
        buf = buf[n + 2 :]


# The kernel takes about 2.5 MB of a loopback reply before a reader that does not read
# stalls the sender; this many 512 KiB values outrun that, so a send stays in flight.
REPEAT = 16


def test_a_pinned_value_survives_overwrite_eviction_and_flush_until_read(server_factory):
    server = server_factory("--memory", "64MiB", "--cores", "1")
    original = os.urandom(512 << 10)
    store(server, b"big", original)
    watcher = mc(server)
    reader = slow_client(server)
    reader.sendall(b"get" + b" big" * REPEAT + b"\r\n")
    # Stalled: one value pinned, and no further one sent for half a second.
    deadline, last = time.monotonic() + 15, None
    while True:
        st = stats(server, watcher)
        now = (st["zero_copy_sends"], st["pinned_bytes"])
        if now == last and int(st["pinned_bytes"]) == len(original):
            break
        assert time.monotonic() < deadline, f"the reader never stalled: {st}"
        last = now
        time.sleep(0.5)
    stuck = int(st["zero_copy_sends"])
    store(server, b"big", b"y" * len(original))
    churn(server, 1200, 100 << 10, ord("z"))  # ~120 MB through a 64 MiB store
    st = stats(server, watcher)
    assert int(st["evictions"]) > 0, st
    assert st["pinned_segments"] == "1" and st["orphaned_segments"] == "1", st
    assert int(st["pinned_bytes"]) == len(original), st
    assert server.rss_bytes() < 64 * MiB + CONSTANT, server.rss_bytes()
    watcher.sendall(b"flush_all\r\n")
    assert recv_exact(watcher, 4) == b"OK\r\n"
    churn(server, 300, 100 << 10, ord("w"))
    assert stats(server, watcher)["orphaned_segments"] == "1"
    values = read_reply(reader)
    # Every value sent before the overwrite, the stalled pinned one last, is the original
    # byte for byte; the keys looked up after the flush miss.
    assert len(values) == stuck, (len(values), stuck)
    for i, v in enumerate(values):
        assert v == original, f"value {i} of {stuck} changed"
    st = wait_for(server, watcher, lambda s: s["pinned_bytes"] == "0", "pin kept after the send")
    assert st["pinned_segments"] == "0" and st["orphaned_segments"] == "0", st
    reader.sendall(b"get big\r\n")
    assert read_reply(reader) == []
    reader.close()
    watcher.close()


def test_never_reading_clients_cannot_pin_past_the_cap(server_factory):
    server = server_factory("--memory", "64MiB", "--cores", "1", "--max-conns", "1000")
    value = os.urandom(512 << 10)
    store(server, b"big", value)
    watcher = mc(server)
    hogs = []
    for _ in range(300):  # each stalls with one 512 KiB value pinned: 150 MiB wanted
        s = slow_client(server)
        s.sendall(b"get" + b" big" * REPEAT + b"\r\n")  # and never reads
        hogs.append(s)
    st = wait_for(server, watcher, lambda s: int(s["zero_copy_fallbacks"]) > 0, "no fallback", 30)
    time.sleep(1)
    st = stats(server, watcher)
    assert 0 < int(st["pinned_bytes"]) <= 64 * MiB, st
    assert int(st["pinned_segments"]) == 1, st
    assert server.rss_bytes() < 64 * MiB + 64 * MiB + CONSTANT, server.rss_bytes()
    # With the pins and --conn-memory both taken by the hogs, a reader gets memcached's
    # out-of-memory answer, never a torn value.
    r = mc(server)
    r.sendall(b"get big\r\n")
    first = recv_exact(r, 12)
    if first == b"SERVER_ERROR":
        assert recv_exact(r, 37) == b" out of memory writing get response\r\n"
    else:
        head = b"VALUE big 0 %d\r\n" % len(value)
        rest = recv_exact(r, len(head) + len(value) + 7 - 12)
        assert (first + rest)[len(head) : -7] == value
    r.close()
    for s in hogs:
        s.close()
    st = wait_for(server, watcher, lambda s: s["pinned_bytes"] == "0" and s["curr_connections"] == "1",
                  "pins kept after the clients left", 30)
    assert st["pinned_segments"] == "0", st
    watcher.close()


def binary_get(opcode, key, extras=b""):
    """A binary-protocol request frame `opcode` on `key` (get, getk, gat ...)."""
    body = len(extras) + len(key)
    return struct.pack(">BBHBBHIIQ", 0x80, opcode, len(key), len(extras), 0, 0, body, 7, 0) + extras + key


def read_binary_value(sock):
    """One binary response frame's value (after its flags and key)."""
    head = recv_exact(sock, 24)
    magic, _op, key_len, extras_len, _t, status, body = struct.unpack(">BBHBBHI", head[:12])
    assert magic == 0x81 and status == 0, head
    payload = recv_exact(sock, body)
    return payload[extras_len + key_len :]


def read_meta_value(sock):
    """One `VA <len> ...` reply's value."""
    line = b""
    while not line.endswith(b"\r\n"):
        line += sock.recv(1)
    assert line.startswith(b"VA "), line[:100]
    n = int(line.split()[1])
    data = recv_exact(sock, n + 2)
    assert data[n:] == b"\r\n"
    return data[:n]


# Each GET path beyond text get/gets/gat/gats (issue 24): the request, and how to read one
# reply's value.
# Every flag here leaves the value as it is, so each is a plain read that may pin.
TTL = (600).to_bytes(4, "big")
PATHS = {
    "mg v": (lambda: b"mg big v f c\r\n", read_meta_value),
    "mg v T": (lambda: b"mg big v T600\r\n", read_meta_value),
    "mg v k O s t h l q": (lambda: b"mg big v k Oab12 s t h l q\r\n", read_meta_value),
    "mg b v k": (lambda: b"mg Ymln b v k\r\n", read_meta_value),
    "binary get": (lambda: binary_get(0x00, b"big"), read_binary_value),
    "binary getq": (lambda: binary_get(0x09, b"big"), read_binary_value),
    "binary getk": (lambda: binary_get(0x0C, b"big"), read_binary_value),
    "binary getkq": (lambda: binary_get(0x0D, b"big"), read_binary_value),
    "binary gat": (lambda: binary_get(0x1D, b"big", TTL), read_binary_value),
    "binary gatq": (lambda: binary_get(0x1E, b"big", TTL), read_binary_value),
    "binary gatk": (lambda: binary_get(0x23, b"big", TTL), read_binary_value),
    "binary gatkq": (lambda: binary_get(0x24, b"big", TTL), read_binary_value),
}


@pytest.mark.parametrize("path", sorted(PATHS))
def test_every_get_path_sends_a_big_value_from_the_item_unchanged(server_factory, path):
    request, read_value = PATHS[path]
    server = server_factory("--memory", "64MiB", "--cores", "1")
    original = os.urandom(512 << 10)
    store(server, b"big", original)
    watcher = mc(server)
    before = int(stats(server, watcher)["zero_copy_sends"])
    reader = slow_client(server)
    reader.sendall(request() * REPEAT)
    # Stalled with a value pinned, the value is overwritten: what the reader gets is the
    # original, byte for byte, until its requests see the new value.
    wait_for(server, watcher, lambda s: int(s["pinned_bytes"]) > 0, "nothing pinned", 15)
    store(server, b"big", b"y" * len(original))
    values = [read_value(reader) for _ in range(REPEAT)]
    assert values[0] == original
    assert all(v in (original, b"y" * len(original)) for v in values), "a torn value"
    st = wait_for(server, watcher, lambda s: s["pinned_bytes"] == "0", "pin kept after the send")
    assert int(st["zero_copy_sends"]) > before, st
    assert st["pinned_segments"] == "0" and st["orphaned_segments"] == "0", st
    reader.close()
    watcher.close()


def test_values_from_4_kib_go_from_the_item_in_a_pipelined_batch(server_factory):
    """The threshold (4 KiB since issue 24) and a depth-16-like batch: 4095-byte values are
    copied, 4096-byte ones spliced, many splices in one reply (more than one 64-entry iovec),
    the whole stream byte for byte what the values say."""
    server = server_factory("--memory", "64MiB", "--cores", "1")
    values = {b"under": os.urandom(4095), b"at": os.urandom(4096), b"small": b"s" * 100}
    for key, value in values.items():
        store(server, key, value)
    watcher = mc(server)
    before = int(stats(server, watcher)["zero_copy_sends"])
    keys = [b"at", b"under", b"small", b"at", b"at"] * 12  # 36 splices in one get
    requests = [b"get " + b" ".join(keys) + b"\r\n"] + [b"get at\r\n", b"get under\r\n"] * 8
    expected = b"".join(
        b"".join(b"VALUE %s 0 %d\r\n%s\r\n" % (k, len(values[k]), values[k]) for k in ks) + b"END\r\n"
        for ks in [keys] + [[b"at"], [b"under"]] * 8
    )
    s = mc(server)
    s.sendall(b"".join(requests))
    assert recv_exact(s, len(expected)) == expected
    spliced = keys.count(b"at") + 8
    st = wait_for(server, watcher, lambda st: st["pinned_bytes"] == "0", "pin kept after the send")
    assert int(st["zero_copy_sends"]) - before == spliced, st
    assert st["pinned_segments"] == "0", st
    s.close()
    watcher.close()
