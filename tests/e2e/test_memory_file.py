"""`ringstore serve --memory-file` (issue 34, ADR 0052): the item arena in a file mapped
shared, sealed at SIGTERM and resumed at the next start with every item (value, flags,
CAS, TTL); every other start (kill -9, flipped bytes, another --memory) is cold, with the
reason in `stats`, and never serves a wrong value."""

import os
import random
import shutil
import signal
import socket
import subprocess
import time

import pytest

from conftest import Server

MEMORY = "64MiB"


@pytest.fixture
def memfile(tmp_path):
    """A path on tmpfs (/dev/shm where there is one), removed afterwards."""
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else str(tmp_path)
    path = os.path.join(base, f"ringstore-memfile-{os.getpid()}-{random.getrandbits(32):08x}")
    yield path
    for p in (path, path + ".meta"):
        if os.path.exists(p):
            os.unlink(p)


class Conn:
    """One memcache text connection with line-oriented reads."""

    def __init__(self, addr):
        self.sock = socket.create_connection(addr, timeout=30)
        self.buf = b""

    def send(self, data):
        self.sock.sendall(data)

    def line(self):
        while b"\r\n" not in self.buf:
            chunk = self.sock.recv(1 << 20)
            assert chunk, "connection closed"
            self.buf += chunk
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def exact(self, n):
        while len(self.buf) < n:
            chunk = self.sock.recv(1 << 20)
            assert chunk, "connection closed"
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def stats(self, arg=b""):
        self.send(b"stats " + arg + b"\r\n" if arg else b"stats\r\n")
        out = {}
        while True:
            line = self.line()
            if line == b"END":
                return out
            _, name, value = line.decode().split(" ", 2)
            out[name] = value

    def mg(self, key):
        """(value, flags, remaining ttl, cas) of `key`, or None."""
        self.send(b"mg " + key + b" v f t c\r\n")
        head = self.line()
        if head == b"EN":
            return None
        parts = head.split()
        assert parts[0] == b"VA", head
        value = self.exact(int(parts[1]) + 2)[:-2]
        fields = {p[:1]: p[1:] for p in parts[2:]}
        return value, int(fields[b"f"]), int(fields[b"t"]), int(fields[b"c"])

    def multiget(self, keys):
        """{key: value} of the keys present."""
        self.send(b"get " + b" ".join(keys) + b"\r\n")
        out = {}
        while True:
            line = self.line()
            if line == b"END":
                return out
            _, key, _flags, size = line.split()[:4]
            out[key] = self.exact(int(size) + 2)[:-2]

    def fill(self, items, chunk=2000):
        """Sets every (key, value, flags, ttl) with noreply, then waits for them all."""
        for i in range(0, len(items), chunk):
            batch = b"".join(
                b"set %s %d %d %d noreply\r\n%s\r\n" % (k, f, t, len(v), v) for k, v, f, t in items[i : i + chunk]
            )
            self.send(batch)
        self.send(b"mn\r\n")
        assert self.line() == b"MN"

    def close(self):
        self.sock.close()


def value_of(i, size=None):
    v = (b"v%d-" % i) * 40
    return v[: size if size is not None else 10 + i % 90]


def start(memfile, *extra, memory=MEMORY):
    return Server("--memory", memory, "--memory-file", memfile, *extra)


def stopped(server, sig=signal.SIGTERM):
    rc = server.stop(sig)
    return rc, server.proc.stderr.read().decode(errors="replace")


def test_sigterm_keeps_items_flags_cas_and_ttl(memfile):
    s = start(memfile)
    c = Conn(s.mc)
    items = [(b"k%d" % i, value_of(i), i * 13 % 65536, 0 if i % 4 else 3000) for i in range(3000)]
    c.fill(items)
    before = {k: c.mg(k) for k, *_ in items}
    # Items that expire while the server is down (or just before the seal, on a slow box).
    c.fill([(b"short%d" % i, b"gone", 1, 2) for i in range(50)])
    assert c.stats(b"settings")["memory_file"] == memfile
    assert c.stats()["memory_file_restart"] == "cold"
    c.close()
    rc, err = stopped(s)
    assert rc == 0, err
    sealed = int(err.split("memory-file: sealed ")[1].split()[0])
    assert 3000 <= sealed <= 3050, err
    time.sleep(2.5)
    s = start(memfile)
    c = Conn(s.mc)
    st = c.stats()
    assert st["memory_file_restart"] == "resumed", st
    assert int(st["memory_file_items_kept"]) == 3000, st
    assert int(st["memory_file_items_expired"]) == sealed - 3000, st
    for k, (value, flags, ttl, cas) in before.items():
        got = c.mg(k)
        assert got is not None, k
        assert got[0] == value and got[1] == flags and got[3] == cas, (k, got, before[k])
        if ttl == -1:
            assert got[2] == -1, (k, got)
        else:
            # Counted against the wall clock: the time down is gone from it.
            assert ttl - 30 <= got[2] <= ttl - 2, (k, got, ttl)
    for i in range(50):
        assert c.mg(b"short%d" % i) is None
    c.send(b"set fresh 0 0 1\r\nx\r\n")
    assert c.line() == b"STORED"
    assert c.mg(b"fresh")[3] > max(v[3] for v in before.values()), "the CAS counter continues above"
    c.close()
    s.stop()


def test_kill_9_starts_cold_and_serves_no_old_value(memfile):
    s = start(memfile)
    c = Conn(s.mc)
    c.fill([(b"k%d" % i, value_of(i), 0, 0) for i in range(500)])
    c.close()
    s.stop(signal.SIGKILL)
    s = start(memfile)
    c = Conn(s.mc)
    st = c.stats()
    assert st["memory_file_restart"] == "cold", st
    assert st["memory_file_cold_reason"].startswith("not sealed"), st
    assert c.multiget([b"k%d" % i for i in range(500)]) == {}
    c.close()
    rc, err = stopped(s)
    assert "cold start: not sealed" in err, err


def test_flipped_bytes_never_give_a_wrong_value(memfile):
    s = start(memfile)
    c = Conn(s.mc)
    want = {b"k%d" % i: value_of(i) for i in range(2000)}
    c.fill([(k, v, 0, 0) for k, v in want.items()])
    c.close()
    assert stopped(s)[0] == 0
    with open(memfile, "rb") as f:
        image = bytearray(f.read())
    # The metadata area is 2 MiB here (ADR 0052); the segments follow it. The file is new,
    # so every non-zero byte after it is an item byte the seal's checksum covers.
    meta = 2 << 20
    pages = [i for i in range(meta, len(image), 4096) if any(image[i : i + 4096])]
    rng = random.Random(34)
    for round_ in range(9):
        bad = bytearray(image)
        kind = ("footer", "item", "anywhere")[round_ % 3]
        for _ in range(1 + round_ % 2):
            if kind == "footer":
                at = rng.randrange(8 * 15)  # the footer's words
            elif kind == "item":
                page = pages[rng.randrange(len(pages))]
                at = rng.choice([page + j for j in range(4096) if image[page + j]])
            else:
                at = rng.randrange(len(image))
            bad[at] ^= 1 << rng.randrange(8)
        with open(memfile, "r+b") as f:
            f.write(bad)
        s = start(memfile)
        c = Conn(s.mc)
        st = c.stats()
        if kind != "anywhere":
            assert st["memory_file_restart"] == "cold", (kind, st)
        keys = list(want)
        for i in range(0, len(keys), 100):
            for k, v in c.multiget(keys[i : i + 100]).items():
                assert v == want[k], (round_, k)
        c.close()
        assert stopped(s)[0] == 0


def test_another_memory_starts_cold_and_says_why(memfile):
    s = start(memfile)
    c = Conn(s.mc)
    c.fill([(b"k%d" % i, value_of(i), 0, 0) for i in range(100)])
    c.close()
    assert stopped(s)[0] == 0
    s = start(memfile, memory="128MiB")
    c = Conn(s.mc)
    st = c.stats()
    assert st["memory_file_restart"] == "cold", st
    assert st["memory_file_cold_reason"].startswith("layout changed"), st
    assert c.multiget([b"k%d" % i for i in range(100)]) == {}
    c.close()
    rc, err = stopped(s)
    assert "cold start: layout changed" in err, err


def test_data_device_makes_the_ram_tier_cold(memfile, tmp_path):
    data = ["--data", str(tmp_path / "data"), "--data-size", "64MiB"]
    s = start(memfile, *data)
    c = Conn(s.mc)
    c.fill([(b"k%d" % i, value_of(i), 0, 0) for i in range(100)])
    c.close()
    assert stopped(s)[0] == 0
    s = start(memfile, *data)
    c = Conn(s.mc)
    st = c.stats()
    assert st["memory_file_restart"] == "cold", st
    assert "data device is attached" in st["memory_file_cold_reason"], st
    # The device's recovery serves them.
    got = c.multiget([b"k%d" % i for i in range(100)])
    assert got == {b"k%d" % i: value_of(i) for i in range(100)}
    c.close()
    s.stop()


MILLION = 1_000_000


def million_items():
    return [(b"key:%07d" % i, value_of(i, 100), 0, 0) for i in range(MILLION)]


def serving_after(spawn, addr_of):
    """Starts a server with `spawn()`, returns (handle, seconds until a get is answered)."""
    t0 = time.monotonic()
    handle = spawn()
    addr = addr_of(handle)
    while True:
        try:
            c = Conn(addr)
            c.send(b"get key:0000000\r\n")
            c.line()
            c.close()
            return handle, time.monotonic() - t0
        except OSError:
            assert time.monotonic() - t0 < 60, "never served"
            time.sleep(0.005)


def count_kept(addr, items):
    c = Conn(addr)
    kept = 0
    for i in range(0, len(items), 200):
        batch = items[i : i + 200]
        got = c.multiget([k for k, *_ in batch])
        for k, v, *_ in batch:
            if k in got:
                assert got[k] == v, k
                kept += 1
    c.close()
    return kept


def test_million_items_restart_beside_memcached(memfile):
    items = million_items()
    s = start(memfile, memory="512MiB")
    c = Conn(s.mc)
    c.fill(items)
    c.close()
    rc, err = stopped(s)
    assert rc == 0, err
    seal = next(line for line in err.splitlines() if "memory-file: sealed" in line)
    s, rs_secs = serving_after(lambda: start(memfile, memory="512MiB"), lambda h: h.mc)
    rs_kept = count_kept(s.mc, items)
    st = Conn(s.mc).stats()
    s.stop()
    mc_secs, mc_kept = memcached_restart(items, memfile + ".mc")
    print(
        f"\n1M items of 100 B restart: ringstore {rs_kept} kept, serving after {rs_secs:.3f} s "
        f"(resume {int(st['memory_file_resume_us']) / 1000:.0f} ms); "
        f"memcached -e {mc_kept} kept, serving after {mc_secs:.3f} s; seal: {seal}"
    )
    assert rs_kept == MILLION
    assert st["memory_file_restart"] == "resumed"
    # The goal is 2 s on a quiet machine (docs/BENCHMARKS.md); a loaded CI box gets room.
    assert rs_secs < 15, rs_secs


def memcached_restart(items, path):
    """memcached 1.6 `-e` on the same workload: fill, graceful stop (SIGUSR1), restart;
    (seconds until serving, items kept)."""
    binary = shutil.which("memcached") or "/usr/bin/memcached"
    assert os.path.exists(binary), "memcached is not installed"
    help_text = subprocess.run([binary, "-h"], capture_output=True, text=True).stdout
    assert "--memory-file" in help_text, "this memcached has no -e"
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    args = [binary, "-U", "0", "-l", "127.0.0.1", "-p", str(port), "-m", "512", "-e", path]
    if os.geteuid() == 0:
        args += ["-u", "root"]

    def spawn():
        return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    try:
        proc, _ = serving_after(spawn, lambda p: ("127.0.0.1", port))
        c = Conn(("127.0.0.1", port))
        c.fill(items)
        c.close()
        proc.send_signal(signal.SIGUSR1)
        proc.wait(timeout=60)
        # memcached 1.6.18 refuses its own save when restarted within the second it stopped
        # ("restart incompatible due to setting for [stop_time]"): not counted in its time.
        time.sleep(2)
        proc, secs = serving_after(spawn, lambda p: ("127.0.0.1", port))
        kept = count_kept(("127.0.0.1", port), items)
        proc.kill()
        proc.wait()
        return secs, kept
    finally:
        for p in (path, path + ".meta"):
            if os.path.exists(p):
                os.unlink(p)
