"""End-to-end external values (extstore-like) with `--data FILE`: values of at least
`--external-value-min` keep only key and metadata in RAM and are read from the device, so far
more data than `--memory` stays resident and exact, also after kill -9; with the knob off the
same load evicts and reads still find every value through the read-through."""

import random
import signal
import socket
import urllib.request

VALUE_LEN = 512 << 10
COUNT = 300  # 150 MiB of values, more than --memory 64MiB


class Conn:
    def __init__(self, addr):
        self.s = socket.create_connection(addr, timeout=20)
        self.buf = b""

    def fill(self, n):
        while len(self.buf) < n:
            chunk = self.s.recv(1 << 20)
            if not chunk:
                raise ConnectionError("closed")
            self.buf += chunk

    def line(self):
        while b"\r\n" not in self.buf:
            chunk = self.s.recv(1 << 20)
            if not chunk:
                raise ConnectionError("closed")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def set_many(self, items):
        self.s.sendall(b"".join(b"set %s 7 0 %d\r\n%s\r\n" % (k, len(v), v) for k, v in items))
        return [self.line() for _ in items]

    def get_many(self, keys):
        self.s.sendall(b"get " + b" ".join(keys) + b"\r\n")
        found = {}
        while True:
            line = self.line()
            if line == b"END":
                return found
            _, key, flags, n = line.split()
            assert flags == b"7", line
            self.fill(int(n) + 2)
            found[key] = self.buf[: int(n)]
            self.buf = self.buf[int(n) + 2 :]

    def stats(self):
        self.s.sendall(b"stats\r\n")
        out = {}
        while True:
            line = self.line()
            if line == b"END":
                return out
            _, name, value = line.split(b" ", 2)
            out[name.decode()] = value.decode()

    def close(self):
        self.s.close()


def key(i):
    return b"ext-%d" % i


def value(i):
    # Distinct per key and not one repeated byte, so a mixed-up or torn value is caught.
    return random.Random(i).randbytes(4096) * (VALUE_LEN // 4096)


def make_file(path, size):
    with open(path, "wb") as f:
        f.truncate(size)


def serve(factory, path, *extra):
    return factory(
        "--data", str(path), "--memory", "64MiB", "--cores", "2", "--item-size-max", "1MiB", *extra
    )


def load(s):
    c = Conn(s.mc)
    for i in range(0, COUNT, 10):
        replies = c.set_many([(key(j), value(j)) for j in range(i, min(i + 10, COUNT))])
        assert replies == [b"STORED"] * len(replies), replies
    c.close()


def check_all(s):
    c = Conn(s.mc)
    # 4 values per get: the server closes a connection whose pending output passes
    # 4 MiB + item-size-max.
    for i in range(0, COUNT, 4):
        keys = [key(j) for j in range(i, min(i + 4, COUNT))]
        got = c.get_many(keys)
        for j, k in zip(range(i, i + 4), keys):
            assert got.get(k) == value(j), f"{k!r} missing or wrong ({len(got.get(k) or b'')} bytes)"
    stats = c.stats()
    c.close()
    return stats


def test_more_data_than_memory_stays_resident_and_exact_across_kill9(server_factory, tmp_path):
    path = tmp_path / "data.img"
    make_file(path, 1 << 30)
    s = serve(server_factory, path)
    load(s)
    c = Conn(s.mc)
    stats = c.stats()
    c.close()
    # 150 MiB of values in a 64 MiB store: only possible with the values on the device.
    assert int(stats["curr_items"]) == COUNT, stats
    assert int(stats["evictions"]) == 0, stats
    assert int(stats["bytes"]) < COUNT * 1024, stats
    rss = s.rss_bytes()
    stats = check_all(s)
    assert int(stats["curr_items"]) == COUNT, stats
    # The HTTP API reads the same external values (with Range, from the fetched copy).
    with urllib.request.urlopen(s.base + "/" + key(5).decode(), timeout=10) as r:
        assert r.read() == value(5)
    req = urllib.request.Request(s.base + "/" + key(6).decode(), headers={"Range": "bytes=4096-4105"})
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 206 and r.read() == value(6)[4096:4106]
    print(f"external: RSS {rss >> 20} MiB after loading {COUNT * VALUE_LEN >> 20} MiB of values")
    # The process does not hold the values: 150 MiB of them, RSS below even --memory.
    assert rss < 64 << 20, f"RSS {rss >> 20} MiB"

    s.proc.send_signal(signal.SIGKILL)
    s.proc.wait()
    s = serve(server_factory, path)
    c = Conn(s.mc)
    stats = c.stats()
    c.close()
    assert int(stats["curr_items"]) == COUNT, f"the warm-up keeps every key as a stub: {stats}"
    stats = check_all(s)
    assert int(stats["curr_items"]) == COUNT, stats
    assert s.stop() == 0


def test_with_external_values_off_the_same_load_evicts_and_reads_through(server_factory, tmp_path):
    path = tmp_path / "data.img"
    make_file(path, 1 << 30)
    s = serve(server_factory, path, "--external-value-min", "0")
    load(s)
    c = Conn(s.mc)
    stats = c.stats()
    c.close()
    assert int(stats["curr_items"]) < COUNT, stats
    assert int(stats["evictions"]) > 0, stats
    print(f"external off: RSS {s.rss_bytes() >> 20} MiB, {stats['curr_items']} items resident")
    check_all(s)  # every value still comes back, through the read-through
    assert s.stop() == 0
