"""`watch` (issue 25): memcached's log stream. The same operations go to ringstore and to a
real memcached 1.6.18 while a watcher is attached to each; the lines of each event type
ringstore has must have memcached's shape (the same fields in the same order, values of
the same form). A watcher that does not read loses lines and is told with `skipped=N`, and
the workers do not slow down for it."""

import re
import socket
import time

from conftest import raw

KINDS = b"watch fetchers mutations evictions connevents\r\n"
OPS = (b"set a 0 0 3\r\nabc\r\nget a\r\nget nope\r\nmg a v\r\nms b 1\r\nx\r\n"
       b"add a 0 0 1\r\ny\r\nappend b 0 0 1\r\ny\r\nset k%2F 0 0 1\r\nz\r\nget k%2F\r\nversion\r\n")


def watcher(addr, words=KINDS, rcvbuf=None):
    w = socket.socket()
    if rcvbuf:
        w.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    w.connect(addr)
    w.settimeout(5)
    w.sendall(words)
    assert w.recv(4) == b"OK\r\n"
    return w


def read_lines(w, until, timeout=3.0):
    data = b""
    deadline = time.monotonic() + timeout
    w.settimeout(0.2)
    while time.monotonic() < deadline and not until(data):
        try:
            chunk = w.recv(1 << 20)
        except socket.timeout:
            continue
        if not chunk:
            break
        data += chunk
    return data.decode().splitlines()


def shape(line):
    """A line's field names and value forms: numbers become N, words stay."""
    fields = []
    for f in line.split(" "):
        name, _, value = f.partition("=")
        if name == "ts":
            # memcached writes `%d.%d`: the microseconds unpadded (`.8858` is 8858 us).
            value = re.sub(r"^\d+\.\d{1,6}$", "T", value)
        elif name == "key":
            value = "K" if re.fullmatch(r"[A-Za-z0-9._~%-]+", value) else value
        elif re.fullmatch(r"\d+", value):
            value = "N"
        fields.append(f"{name}={value}")
    return fields


def by_type(lines):
    """The shape of each (type, status, cmd) seen, and the keys of each type."""
    shapes, keys = {}, {}
    for line in lines:
        s = shape(line)
        d = dict(f.split("=", 1) for f in s)
        if d.get("type") not in ("item_get", "item_store"):
            continue
        shapes.setdefault((d["type"], d["status"], d.get("cmd")), s)
        keys.setdefault(d["type"], set()).add(re.search(r" key=(\S+)", line).group(1))
    return shapes, keys


def test_watch_lines_have_memcacheds_shape(server, memcached):
    results = []
    for addr in (server.mc, memcached):
        w = watcher(addr)
        time.sleep(0.2)
        assert raw(addr, OPS, read_until=b"VERSION").endswith(b"\r\n")
        lines = read_lines(w, lambda d: d.count(b"key=k%252F") >= 2 and d.count(b"key=b ") >= 2)
        w.close()
        results.append(by_type(lines))
    (ours, our_keys), (theirs, their_keys) = results
    # memcached 1.6.18 also logs the fetch each store makes internally; ringstore logs the
    # client's reads. Every line ringstore writes has the shape memcached writes for it.
    assert ours, "no lines"
    for kind, s in ours.items():
        assert kind in theirs, f"{kind} is not a line memcached writes"
        assert s == theirs[kind], f"{kind}: ringstore {s}, memcached {theirs[kind]}"
    assert {("item_get", "found", None), ("item_get", "not_found", None), ("item_store", "stored", "set"),
            ("item_store", "not_stored", "add"), ("item_store", "stored", "append")} <= set(ours)
    # Keys are URI-encoded the same way.
    assert our_keys["item_get"] >= {"a", "nope", "k%252F"} and "k%252F" in their_keys["item_get"]


def test_watch_words_and_refusals_match_memcached(server, memcached):
    for words in (b"watch foo\r\n", b"watch fetchers bogus\r\n"):
        assert raw(server.mc, words, read_until=b"\r\n") == raw(memcached, words, read_until=b"\r\n")
    # A watcher ignores what it is sent afterwards, as memcached's does.
    for addr in (server.mc, memcached):
        w = watcher(addr, b"watch mutations\r\nget a\r\n")
        w.sendall(b"version\r\n")
        assert read_lines(w, lambda d: False, timeout=0.5) == []
        w.close()


def test_a_slow_watcher_is_told_what_it_skipped_and_slows_nobody(server):
    slow = watcher(server.mc, b"watch fetchers\r\n", rcvbuf=4096)
    fast = watcher(server.mc, b"watch mutations\r\n")
    c = socket.create_connection(server.mc, timeout=10)
    key = b"x" * 200
    batch = b"".join(b"get %s%d\r\n" % (key, i) for i in range(2000))
    t = time.monotonic()
    for _ in range(25):  # 50000 gets, each a ~300-byte line, while the slow watcher sleeps
        c.sendall(batch)
        got = b""
        while got.count(b"END\r\n") < 2000:
            got += c.recv(1 << 20)
    elapsed = time.monotonic() - t
    # Without any watcher, for comparison.
    slow.close()
    fast.close()
    time.sleep(0.3)
    t = time.monotonic()
    for _ in range(25):
        c.sendall(batch)
        got = b""
        while got.count(b"END\r\n") < 2000:
            got += c.recv(1 << 20)
    alone = time.monotonic() - t
    assert elapsed < alone * 3 + 1, f"{elapsed:.2f} s watched, {alone:.2f} s alone"
    c.close()


def test_skipped_lines_are_announced(server):
    slow = watcher(server.mc, b"watch fetchers\r\n", rcvbuf=4096)
    c = socket.create_connection(server.mc, timeout=10)
    batch = b"".join(b"get %s%d\r\n" % (b"y" * 200, i) for i in range(2000))
    for _ in range(10):
        c.sendall(batch)
        got = b""
        while got.count(b"END\r\n") < 2000:
            got += c.recv(1 << 20)
    time.sleep(0.5)
    lines = read_lines(slow, lambda d: False, timeout=2)
    skipped = [int(l.split("=")[1]) for l in lines if l.startswith("skipped=")]
    gets = [l for l in lines if " type=item_get " in l]
    assert skipped and sum(skipped) > 0, lines[:3]
    # Every one of the 20000 fetches is either delivered or counted as skipped.
    assert len(gets) + sum(skipped) == 20000, (len(gets), sum(skipped))
    # A watcher's backlog is bounded: what it got is far less than what happened.
    assert len(gets) < 20000
    c.close()


def fill(addr, count, size=5000):
    """`count` sets of `size` bytes, every other one with a TTL; returns when all answered."""
    c = socket.create_connection(addr, timeout=10)
    value = b"v" * size
    for start in range(0, count, 100):
        batch = b"".join(b"set fill%d 0 %d %d\r\n%s\r\n" % (i, 100 * (i % 2), size, value)
                         for i in range(start, min(count, start + 100)))
        c.sendall(batch)
        got = b""
        while got.count(b"\r\n") < min(100, count - start):
            got += c.recv(1 << 16)
        assert set(got.split()) == {b"STORED"}, got[:80]
    c.close()


def eviction_shapes(lines):
    shapes = {}
    for line in lines:
        d = dict(f.split("=", 1) for f in shape(line))
        if d.get("type") == "eviction":
            shapes.setdefault((d["fetch"], d["ttl"]), shape(line))
    return shapes


def test_eviction_lines_have_memcacheds_shape(server_factory):
    from conftest import real_memcached
    small = server_factory("--memory", "8MiB")
    with real_memcached(extra=("-m", "2", "-I", "512k")) as theirs:
        results = []
        for addr, count in ((small.mc, 4000), (theirs, 2000)):
            w = watcher(addr, b"watch evictions\r\n")
            time.sleep(0.2)
            fill(addr, count)
            lines = read_lines(w, lambda d: d.count(b"type=eviction") >= 200)
            w.close()
            results.append((eviction_shapes(lines), lines))
    (ours, our_lines), (theirs_shapes, _) = results
    # memcached writes `ttl=-1` for an item that never expires, the seconds left otherwise.
    assert ("no", "-1") in ours and ("no", "N") in ours, our_lines[:3]
    for kind, s in ours.items():
        assert kind in theirs_shapes, f"{kind} is not a line memcached writes"
        # memcached's clsid is its slab class; ringstore's is always 1. Both are numbers.
        assert s == theirs_shapes[kind], f"ringstore {s}, memcached {theirs_shapes[kind]}"
    assert all(re.search(r" key=fill\d+ ", l) and l.endswith(" size=5000") for l in our_lines
               if "type=eviction" in l)


def test_evictions_are_logged_only_while_watched(server_factory):
    small = server_factory("--memory", "8MiB")
    w = watcher(small.mc, b"watch fetchers\r\n")
    fill(small.mc, 4000)
    assert b"evictions " in raw(small.mc, b"stats\r\n", read_until=b"END\r\n")
    assert read_lines(w, lambda d: False, timeout=0.5) == [], "no eviction line for a fetcher watcher"
    w.close()


def test_connection_lines_have_memcacheds_shape(server):
    from conftest import real_memcached
    with real_memcached() as theirs:
        results = []
        for addr in (server.mc, theirs):
            w = watcher(addr, b"watch connevents\r\n")
            time.sleep(0.2)
            c = socket.create_connection(addr, timeout=5)
            port = c.getsockname()[1]
            c.sendall(b"version\r\n")
            assert c.recv(100).startswith(b"VERSION")
            c.close()
            lines = read_lines(w, lambda d: b"conn_close" in d)
            w.close()
            mine = [l for l in lines if f" rport={port} " in l]
            results.append(mine)
            assert [l.split(" type=")[1].split()[0] for l in mine] == ["conn_new", "conn_close"], lines
            cfds = {l.rsplit(" cfd=", 1)[1] for l in mine}
            assert len(cfds) == 1, "both lines name the same connection"
        ours, theirs_lines = results
        assert [shape(l) for l in ours] == [shape(l) for l in theirs_lines]
        assert " rip=127.0.0.1 " in ours[0] and " transport=tcp " in ours[0]


def test_no_connection_lines_for_other_watchers(server):
    w = watcher(server.mc, b"watch mutations\r\n")
    socket.create_connection(server.mc, timeout=5).close()
    assert read_lines(w, lambda d: False, timeout=0.5) == []
    w.close()
