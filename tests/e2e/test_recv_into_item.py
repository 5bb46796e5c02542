"""Storage values received straight into the item (issue 38): a text set/add/replace/cas whose
value is 4 KiB or more is reserved in the store once its command line is whole, and the rest
of the value is received into the item's memory. These tests split such requests at every
boundary against the command line and against the servers' receive buffers, stall and
abandon values mid-way, send values longer than announced, and compare the replies byte for
byte with a real memcached. Run on both runtimes (RINGSTORE_IO=io_uring and epoll)."""

import os
import random
import socket
import time

from conftest import real_memcached

KiB = 1024


def stats(addr):
    s = socket.create_connection(addr, timeout=5)
    try:
        s.sendall(b"stats\r\n")
        data = b""
        while not data.endswith(b"END\r\n"):
            chunk = s.recv(65536)
            assert chunk, data
            data += chunk
    finally:
        s.close()
    out = {}
    for line in data.decode().splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "STAT":
            out[parts[1]] = parts[2]
    return out


def read_exactly(s, n):
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        assert chunk, f"closed after {len(data)} of {n} bytes: {data[-100:]!r}"
        data += chunk
    return data


def read_until(s, marker):
    data = b""
    while not data.endswith(marker):
        chunk = s.recv(65536)
        assert chunk, f"closed before {marker!r}: {data[-200:]!r}"
        data += chunk
    return data


def send_in(s, payload, cuts):
    """Sends `payload` in pieces ending at the offsets `cuts` (sorted), a pause between."""
    start = 0
    for cut in list(cuts) + [len(payload)]:
        if cut > start:
            s.sendall(payload[start:cut])
            time.sleep(0.0005)
            start = cut
    return start


def get(s, key):
    s.sendall(b"get " + key + b"\r\n")
    return read_until(s, b"END\r\n")


def value_of(seed, n):
    return bytes((i * 31 + seed) & 0xFF for i in range(n))


def test_a_set_split_at_every_boundary_against_its_line_stores_it_whole(server_factory):
    server = server_factory("--memory", "64MiB")
    s = socket.create_connection(server.mc, timeout=10)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    value = value_of(1, 4096)
    request = b"set k 3 0 4096\r\n" + value + b"\r\n"
    line = request.index(b"\n") + 1
    # Every cut in and around the line, and in the value's first and last bytes and trailer.
    cuts = list(range(1, line + 40)) + list(range(len(request) - 40, len(request)))
    for i, cut in enumerate(cuts):
        v = value_of(i, 4096)
        req = b"set k%d 3 0 4096\r\n" % i + v + b"\r\n"
        cut = min(cut + (len(req) - len(request)) * (cut >= line), len(req) - 1)
        send_in(s, req, [cut])
        assert read_exactly(s, 8) == b"STORED\r\n", cut
        got = get(s, b"k%d" % i)
        assert got == b"VALUE k%d 3 4096\r\n" % i + v + b"\r\nEND\r\n", cut


def test_values_sent_byte_by_byte_and_in_random_pieces_arrive_whole(server_factory):
    server = server_factory("--memory", "64MiB")
    rng = random.Random(38)
    s = socket.create_connection(server.mc, timeout=30)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    value = os.urandom(4096 + 7)
    req = b"set bytewise 0 0 %d\r\n" % len(value) + value + b"\r\n"
    for b in range(len(req)):
        s.sendall(req[b:b + 1])
    assert read_exactly(s, 8) == b"STORED\r\n"
    assert get(s, b"bytewise") == b"VALUE bytewise 0 %d\r\n" % len(value) + value + b"\r\nEND\r\n"
    for n in (4096, 70 * KiB, 100 * KiB, 300 * KiB):
        value = os.urandom(n)
        req = b"set r%d 0 0 %d\r\n" % (n, n) + value + b"\r\n" + b"get r%d\r\n" % n
        cuts = sorted(rng.sample(range(1, len(req)), 12))
        send_in(s, req, cuts)
        want = b"STORED\r\nVALUE r%d 0 %d\r\n" % (n, n) + value + b"\r\nEND\r\n"
        assert read_exactly(s, len(want)) == want, n


def test_a_pipeline_of_sets_across_receive_buffers_is_stored_and_answered_in_order(server_factory):
    server = server_factory("--memory", "64MiB")
    s = socket.create_connection(server.mc, timeout=30)
    values = [os.urandom(n) for n in [4096] * 40 + [5000, 65536, 65535, 16384, 16383, 100 * KiB]]
    batch = b"".join(b"set p%d 0 0 %d\r\n" % (i, len(v)) + v + b"\r\n" for i, v in enumerate(values))
    batch += b"set tiny 0 0 1\r\nx\r\n"
    s.sendall(batch)
    assert read_exactly(s, 8 * (len(values) + 1)) == b"STORED\r\n" * (len(values) + 1)
    for i, v in enumerate(values):
        assert get(s, b"p%d" % i) == b"VALUE p%d 0 %d\r\n" % (i, len(v)) + v + b"\r\nEND\r\n", i


def test_a_stalled_value_holds_its_item_only_until_the_request_timeout(server_factory):
    server = server_factory("--memory", "64MiB", "--request-timeout", "2")
    before = stats(server.mc)
    s = socket.create_connection(server.mc, timeout=10)
    s.sendall(b"set stalled 0 0 524288\r\n" + b"x" * 100_000)
    time.sleep(0.5)
    during = stats(server.mc)
    assert int(during["pinned_segments"]) >= 1, "the value was not received into a reserved item"
    started = time.monotonic()
    s.settimeout(6)
    assert s.recv(100) == b"", "the stalled client was not cut"
    assert 1.0 <= time.monotonic() - started <= 4.5
    time.sleep(0.2)
    after = stats(server.mc)
    assert after["pinned_segments"] == "0"
    assert after["curr_items"] == before["curr_items"]
    assert after["bytes"] == before["bytes"]
    c = socket.create_connection(server.mc, timeout=5)
    assert get(c, b"stalled") == b"END\r\n"


def test_a_value_abandoned_mid_way_is_never_seen_and_gives_its_item_back(server_factory):
    server = server_factory("--memory", "64MiB")
    c = socket.create_connection(server.mc, timeout=5)
    c.sendall(b"set k 0 0 3\r\nold\r\n")
    assert read_exactly(c, 8) == b"STORED\r\n"
    for n in range(20):
        s = socket.create_connection(server.mc, timeout=5)
        s.sendall(b"set k 0 0 200000\r\n" + os.urandom(1000 + n * 5000))
        time.sleep(0.01)
        s.close()
    deadline = time.monotonic() + 5
    while stats(server.mc)["pinned_segments"] != "0":
        assert time.monotonic() < deadline, "an abandoned value kept its item"
        time.sleep(0.05)
    assert get(c, b"k") == b"VALUE k 0 3\r\nold\r\nEND\r\n"
    big = os.urandom(200_000)
    c.sendall(b"set k 0 0 200000\r\n" + big + b"\r\n")
    assert read_exactly(c, 8) == b"STORED\r\n"
    assert get(c, b"k") == b"VALUE k 0 200000\r\n" + big + b"\r\nEND\r\n"


STEPS = [
    b"set a 1 0 4096\r\n" + value_of(1, 4096) + b"\r\n",
    b"get a\r\n",
    b"add a 0 0 5000\r\n" + value_of(2, 5000) + b"\r\n",
    b"add b 2 0 5000\r\n" + value_of(3, 5000) + b"\r\n",
    b"replace c 0 0 8192\r\n" + value_of(4, 8192) + b"\r\n",
    b"replace b 4 0 8192\r\n" + value_of(5, 8192) + b"\r\n",
    b"get a b c\r\n",
    b"cas a 0 0 4096 999999\r\n" + value_of(6, 4096) + b"\r\n",
    b"cas missing 0 0 4096 1\r\n" + value_of(7, 4096) + b"\r\n",
    b"set n 0 0 4096 noreply\r\n" + value_of(8, 4096) + b"\r\n",
    b"get n\r\n",
    # Longer than announced: the bytes after the value are not \r\n.
    b"set long 0 0 4096\r\n" + value_of(9, 4096) + b"XY\r\n",
    b"get long\r\n",
    b"set long 0 0 4096 noreply\r\n" + value_of(9, 4096) + b"XYZ\r\n",
    b"get long\r\n",
    b"set e 0 -1 4096\r\n" + value_of(10, 4096) + b"\r\n",
    b"get e\r\n",
    b"set big 0 0 204800\r\n" + value_of(11, 204800) + b"\r\n",
    b"get big\r\n",
    b"append big 0 0 4096\r\n" + value_of(12, 4096) + b"\r\n",
    b"prepend big 0 0 4096\r\n" + value_of(13, 4096) + b"\r\n",
    b"get big\r\n",
]


def replies(addr, steps, split, mark=b"version\r\n", answer=b"VERSION "):
    """The bytes each step gets back, the steps sent in pieces by `split` (`mark` after each
    step, answered with a line that starts with `answer`, marks where its reply ends)."""
    s = socket.create_connection(addr, timeout=10)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    out = []
    try:
        for step in steps:
            payload = step + mark
            send_in(s, payload, split(payload))
            reply = read_until(s, b"\r\n")
            while not reply.startswith(answer) and b"\r\n" + answer not in reply:
                reply += read_until(s, b"\r\n")
            out.append(reply[: reply.rindex(answer)])
    finally:
        s.close()
    return out


def same_as_memcached(server_factory, run, splits):
    """`run(addr, split)` (the replies of a fixed list of steps, sent in pieces by `split`)
    gets the same from a fresh ringstore as from a fresh memcached, for each of `splits`,
    and leaves no reservation behind."""
    for n, split in enumerate(splits):
        server = server_factory("--memory", "64MiB")
        ours = run(server.mc, split)
        with real_memcached() as fresh:
            want = run(fresh, split)
        assert len(ours) == len(want)
        for i, (a, b) in enumerate(zip(ours, want)):
            assert a == b, f"split {n}, step {i}: ringstore {a[:120]!r}, memcached {b[:120]!r}"
        assert stats(server.mc)["pinned_segments"] == "0"
        server.proc.kill()


def test_replies_match_memcached_byte_for_byte_however_the_requests_are_split(server_factory):
    rng = random.Random(1138)
    splits = [
        lambda p: [],
        lambda p: [p.index(b"\n") + 1],
        lambda p: [p.index(b"\n")],
        lambda p: [p.index(b"\n") + 2, len(p) - 12],
        lambda p: sorted(rng.sample(range(1, len(p)), min(8, len(p) - 1))),
    ]
    same_as_memcached(server_factory, lambda addr, split: replies(addr, STEPS, split), splits)
