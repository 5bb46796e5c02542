"""A full data device (ADR 0039): by default it evicts its oldest records as a cache does, so
writes of 0.1-8 KiB values far beyond the device keep being stored, counted in `evictions`
and extstore's `extstore_objects_evicted`; a key whose newest record was evicted is a miss,
also after kill -9 (never an older value of it brought back by recovery). `--data-full
refuse` keeps every acknowledged write and answers "data device full" to every client write,
whatever its key, while deletes still fit."""

import random
import signal
import threading
import time

from test_durable import Conn, make_file


def serve(factory, path, *extra):
    return factory("--data", str(path), "--cores", "2", "--memory", "256MiB", *extra)


def stats(addr):
    c = Conn(addr)
    c.s.sendall(b"stats\r\n")
    out = {}
    while True:
        line = c.line()
        if line == b"END":
            c.close()
            return out
        _, name, value = line.split(b" ", 2)
        out[name.decode()] = value.decode()


def value_of(key, size):
    return (key + b":") * (size // (len(key) + 1)) + b"v" * (size % (len(key) + 1))


def fill(addrs, prefix, count, rnd, history, conns=4):
    """Sets `count` keys of 0.1-8 KiB over `conns` connections; returns the replies."""
    cs = [Conn(addrs) for _ in range(conns)]
    replies = {}
    for i in range(count):
        key = b"%s%d" % (prefix, i)
        value = value_of(key, rnd.randint(100, 8192))
        r = cs[i % conns].set(key, value)
        replies[r] = replies.get(r, 0) + 1
        if r == b"STORED":
            history.setdefault(key, []).append(value)
    for c in cs:
        c.close()
    return replies


def each_hit(addr, keys, check):
    """Gets `keys` in batches and calls `check(key, value)` for each hit; returns the hits."""
    c = Conn(addr)
    keys = list(keys)
    hits = 0
    for i in range(0, len(keys), 100):
        for k, v in c.get_many(keys[i : i + 100]).items():
            check(k, v)
            hits += 1
    c.close()
    return hits


def newest_or_miss(addr, history, what):
    """Every key answers its newest acknowledged value or a miss; returns the hit count."""

    def check(k, v):
        assert v == history[k][-1], f"{what}: {k!r} answered an older or wrong value ({len(v)} bytes)"

    return each_hit(addr, history, check)


def test_full_device_evicts_oldest_and_never_brings_an_older_value_back(server_factory, tmp_path):
    path = tmp_path / "data.img"
    make_file(path, 48 << 20)
    s = serve(server_factory, path)
    rnd = random.Random(36)
    history = {}
    # Keys written on one connection, then overwritten on another: with two workers the two
    # records are often in different regions, so evicting the newer one leaves the older one
    # on the device (what recovery must not bring back).
    a, b = Conn(s.mc), Conn(s.mc)
    for i in range(300):
        key = b"over%d" % i
        for c, tag in ((a, b"old"), (b, b"new")):
            value = value_of(key + tag, rnd.randint(100, 2000))
            assert c.set(key, value) == b"STORED"
            history.setdefault(key, []).append(value)
    a.close()
    b.close()
    # 0.1-8 KiB values, about three times the device: every one is stored.
    replies = fill(s.mc, b"fill", 36_000, rnd, history)
    assert replies == {b"STORED": 36_000}, replies
    st = stats(s.mc)
    evicted = int(st["extstore_objects_evicted"])
    assert evicted > 10_000, st
    assert int(st["evictions"]) >= evicted
    assert int(st["extstore_page_evictions"]) > 10, st
    hits = newest_or_miss(s.mc, history, "serving")
    assert hits < len(history) - 10_000, "old keys are evicted"
    recent = [b"fill%d" % i for i in range(35_800, 36_000)]
    assert len(Conn(s.mc).get_many(recent)) == len(recent), "the newest keys are kept"
    over = Conn(s.mc).get_many([b"over%d" % i for i in range(300)])
    assert len(over) < 300, "some overwritten keys were evicted"
    # kill -9: recovery scans the log; evicted keys stay misses, none answers its older value.
    s.proc.send_signal(signal.SIGKILL)
    s.proc.wait()
    s = serve(server_factory, path)
    hits_after = newest_or_miss(s.mc, history, "after kill -9")
    assert hits_after <= hits + 50, (hits, hits_after)
    assert len(Conn(s.mc).get_many(recent)) == len(recent)
    assert s.stop() == 0


def test_an_evicted_overwrite_stays_a_miss_after_kill9(server_factory, tmp_path):
    """Old values on one worker's region, their overwrites on the other's, which then fills
    and evicts them: the old values stay on the device, so only the tombstones the eviction
    writes keep recovery from answering them."""
    path = tmp_path / "data.img"
    make_file(path, 48 << 20)
    s = serve(server_factory, path)
    rnd = random.Random(39)
    # Both stay open, so the least-loaded hand-off puts them on different workers.
    c0, c1 = Conn(s.mc), Conn(s.mc)
    keys = [b"over%d" % i for i in range(300)]
    old = {k: value_of(k + b"old", 1000) for k in keys}
    new = {k: value_of(k + b"new", 1000) for k in keys}
    for k in keys:
        assert c0.set(k, old[k]) == b"STORED"
        assert c1.set(k, new[k]) == b"STORED"
    i = 0
    while c1.get_many(keys) and i < 40_000:
        for _ in range(1000):
            assert c1.set(b"fill%d" % i, b"f" * rnd.randint(100, 8192)) == b"STORED"
            i += 1
    assert c1.get_many(keys) == {}, "the overwrites were never evicted"
    assert c0.get_many(keys) == {}, "RAM dropped the evicted keys too"
    s.proc.send_signal(signal.SIGKILL)
    s.proc.wait()
    s = serve(server_factory, path)
    got = Conn(s.mc).get_many(keys)
    resurrected = [k for k, v in got.items() if v == old[k]]
    assert not resurrected, f"{len(resurrected)} evicted keys came back with their older value"
    assert got == {}, "evicted keys are misses after kill -9"
    assert s.stop() == 0


def writer(addr, t, stop, acked, errors):
    rnd = random.Random(t)
    try:
        c = Conn(addr)
        i = 0
        while not stop.is_set():
            key = b"w%d-%d" % (t, i % 3000)  # overwritten every 3000 writes
            value = value_of(key + b"%d" % i, rnd.randint(100, 8192))
            acked.setdefault(key, [])
            acked[key].append((value, False))
            r = c.set(key, value)
            if r != b"STORED":
                errors.append(r)
                return
            acked[key][-1] = (value, True)
            i += 1
    except (OSError, ConnectionError):
        return  # killed mid-request: that write is unacknowledged


def test_kill9_while_evicting_serves_newest_or_miss(server_factory, tmp_path):
    path = tmp_path / "data.img"
    make_file(path, 24 << 20)
    s = serve(server_factory, path)
    acked, errors = {}, []
    evicted = 0
    for cycle in range(4):
        stop = threading.Event()
        threads = [threading.Thread(target=writer, args=(s.mc, 10 * cycle + t, stop, acked, errors)) for t in range(4)]
        for th in threads:
            th.start()
        time.sleep(3)
        evicted += int(stats(s.mc)["extstore_objects_evicted"])
        s.proc.send_signal(signal.SIGKILL)
        s.proc.wait()
        stop.set()
        for th in threads:
            th.join(timeout=10)
        assert not errors, errors
        s = serve(server_factory, path)

        def check(k, v):
            versions = acked[k]
            newest_acked = max((j for j, (_, ok) in enumerate(versions) if ok), default=0)
            allowed = [val for val, _ in versions[newest_acked:]]
            assert v in allowed, f"cycle {cycle}: {k!r} answered an older value"

        each_hit(s.mc, acked, check)
    total = sum(len(v) for v in acked.values())
    assert evicted > 1000, f"the device never evicted under load: {evicted} evictions, {total} writes"
    assert s.stop() == 0


def test_refuse_mode_keeps_every_write_and_says_the_device_is_full(server_factory, tmp_path):
    path = tmp_path / "small.img"
    make_file(path, 16 << 20)
    s = serve(server_factory, path, "--cores", "1", "--data-full", "refuse")
    c = Conn(s.mc)
    value = b"y" * 100_000
    stored, refusals = [], 0
    while len(stored) < 400 and refusals < 3:
        key = b"fill%d" % len(stored)
        r = c.set(key, value)
        if r == b"STORED":
            stored.append(key)
            refusals = 0
        else:
            assert r == b"SERVER_ERROR data device full storing object", r
            refusals += 1
            time.sleep(0.2)
    assert refusals == 3, "the 16 MiB device never filled"
    st = stats(s.mc)
    assert (st["evictions"], st["extstore_objects_evicted"]) == ("0", "0"), st
    assert c.get_many(stored) == {k: value for k in stored}, "every acknowledged write is kept"
    # Smaller values fill what the big ones left, until a 2-byte value is refused too.
    for size in (10_000, 1_000, 100, 2):
        for i in range(20_000):
            if c.set(b"pad%d-%d" % (size, i), b"p" * size) != b"STORED":
                break
        else:
            raise AssertionError(f"{size}-byte values never filled the device")
    # A client's write is refused whatever its key: the update canary's names take none of the
    # space kept for deletes (ADR 0039), so a delete still succeeds after them.
    for key in (b"ringstore-canary-x", b"ringstore-update-canary", b"pad2-0"):
        r = c.set(key, b"ok")
        assert r == b"SERVER_ERROR data device full storing object", (key, r)
    c.s.sendall(b"delete fill0\r\n")
    assert c.line() == b"DELETED"
    assert c.get_many([b"fill0"]) == {}
    stored.remove(b"fill0")
    c.close()
    s.proc.send_signal(signal.SIGKILL)
    s.proc.wait()
    s = serve(server_factory, path, "--cores", "1", "--data-full", "refuse")
    assert Conn(s.mc).get_many(stored) == {k: value for k in stored}
    assert s.stop() == 0


def test_full_device_with_the_default_keeps_storing_on_one_connection(server_factory, tmp_path):
    """The issue's reproduction: a 90 MB file, 0.1-8 KiB values on one connection."""
    path = tmp_path / "data.img"
    make_file(path, 90 * 1000 * 1000)
    s = serve(server_factory, path)
    rnd = random.Random(7)
    c = Conn(s.mc)
    for i in range(25_000):
        r = c.set(b"k%d" % i, b"x" * rnd.randint(100, 8192))
        assert r == b"STORED", (i, r)
    assert int(stats(s.mc)["evictions"]) > 0
    c.close()
    assert s.stop() == 0
