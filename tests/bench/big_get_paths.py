#!/usr/bin/env python3
"""Big GETs per server CPU-second on each GET path (BENCHMARKS, issue 24, ADR 0027): text
`get`, meta `mg <key> v` and binary GET, 100 KiB and 512 KiB values, against each named
ringstore binary (and memcached as a yardstick). Every server runs on CPU 0
(`--cores 1`, `memcached -t 1`), the clients on CPU 1: CONNS processes, one connection each
at depth 1, each reply read to its exact length and compared byte for byte with the value.
Server CPU is the run time of its threads (/proc/PID/task/*/schedstat) over the timed window; the figure is requests
completed in that window per server CPU-second. Runs are interleaved (every subject once per
round), so the subjects see the same load from whatever else runs on the machine.

Usage (from the repository root, with the e2e venv or any python3):
  python3 tests/bench/big_get_paths.py [--rounds 3] [--seconds 4] NAME=BINARY ... [memcached]
Prints one line per cell and round, then the medians with min-max.
"""
import argparse
import multiprocessing
import os
import socket
import statistics
import struct
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "../e2e"))
import conftest  # noqa: E402

SIZES = (100 << 10, 512 << 10)
KEYS = 32
CONNS = 4


def binary_frame(key):
    """A binary GET request on `key`."""
    return struct.pack(">BBHBBHIIQ", 0x80, 0x00, len(key), 0, 0, 0, len(key), 0, 0) + key


def binary_reply(value):
    """The binary GET response ringstore and memcached send for `value` (flags 0, cas
    masked out by the caller: the 8 bytes at 16..24)."""
    body = 4 + len(value)
    return struct.pack(">BBHBBHIIQ", 0x81, 0x00, 0, 4, 0, 0, body, 0, 0) + b"\0\0\0\0" + value


# path -> (request for key, expected reply for key and value)
PATHS = {
    "get": (lambda k: b"get %s\r\n" % k, lambda k, v: b"VALUE %s 0 %d\r\n%s\r\nEND\r\n" % (k, len(v), v)),
    "mg v": (lambda k: b"mg %s v\r\n" % k, lambda k, v: b"VA %d\r\n%s\r\n" % (len(v), v)),
    "binary get": (binary_frame, lambda k, v: binary_reply(v)),
}


def values(size):
    """The value of each key of a size: distinct per key, so a wrong key is caught."""
    base = os.urandom(size)
    return {b"s%dk%d" % (size, i): bytes([i]) + base[1:] for i in range(KEYS)}


def recv_into_exact(sock, view):
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if n == 0:
            raise ConnectionError("server closed")
        got += n


def client(addr, path, size, seed, warm_at, start_at, stop_at, counts, slot):
    """One connection GETting keys of `size` round robin until `stop_at`; counts the
    replies completed inside [start_at, stop_at]."""
    os.sched_setaffinity(0, {1})
    request, reply = PATHS[path]
    vals = values_cache[size]
    keys = sorted(vals)
    expected = {k: reply(k, vals[k]) for k in keys}
    buf = bytearray(max(len(e) for e in expected.values()))
    s = socket.create_connection(addr)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while time.monotonic() < warm_at:
        time.sleep(0.01)
    done, i = 0, seed
    while True:
        k = keys[i % KEYS]
        i += 1
        want = expected[k]
        view = memoryview(buf)[: len(want)]
        s.sendall(request(k))
        recv_into_exact(s, view)
        if path == "binary get":
            ok = view[:16] == want[:16] and view[24:] == want[24:]
        else:
            ok = view == want
        if not ok:
            raise AssertionError(f"{path} {size}: reply for {k!r} differs")
        now = time.monotonic()
        if now >= stop_at:
            break
        if now >= start_at:
            done += 1
    s.close()
    counts[slot] = done


def cpu_seconds(pid):
    """CPU time of all the process's threads, in ns resolution (schedstat's run time)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except FileNotFoundError:
            pass
    return total / 1e9


def store_all(addr):
    s = socket.create_connection(addr)
    for size in SIZES:
        for k, v in values_cache[size].items():
            s.sendall(b"set %s 0 0 %d\r\n%s\r\n" % (k, len(v), v))
            line = b""
            while not line.endswith(b"\r\n"):
                line += s.recv(64)
            assert line == b"STORED\r\n", line
    s.close()


def start(name, binary):
    """A server on CPU 0: (process, memcache address)."""
    if name == "memcached":
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        proc = subprocess.Popen(["taskset", "-c", "0", "memcached", "-U", "0", "-t", "1", "-m", "1024",
                                 "-l", "127.0.0.1", "-p", str(port), "-u", "root"])
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port)).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "memcached did not start"
                time.sleep(0.05)
        return proc, ("127.0.0.1", port)
    conftest.BIN = binary
    server = conftest.Server("--memory", "1024MiB", "--cores", "1", preexec_fn=lambda: os.sched_setaffinity(0, {0}))
    return server.proc, server.mc


def cell(proc, addr, path, size, seconds):
    counts = multiprocessing.Array("q", CONNS)
    now = time.monotonic()
    warm_at, start_at = now + 0.3, now + 1.0
    stop_at = start_at + seconds
    procs = [multiprocessing.Process(target=client, args=(addr, path, size, j * 7, warm_at, start_at, stop_at, counts, j))
             for j in range(CONNS)]
    for p in procs:
        p.start()
    time.sleep(max(0.0, start_at - time.monotonic()))
    cpu0 = cpu_seconds(proc.pid)
    time.sleep(max(0.0, stop_at - time.monotonic()))
    cpu1 = cpu_seconds(proc.pid)
    for p in procs:
        p.join()
        assert p.exitcode == 0, f"a client of {path} {size} failed"
    reqs = sum(counts)
    return reqs / seconds, reqs / max(cpu1 - cpu0, 1e-6)


values_cache = {}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("subjects", nargs="+", help="NAME=BINARY, or memcached")
    a = ap.parse_args()
    for size in SIZES:
        values_cache[size] = values(size)
    subjects = [s.split("=", 1) if "=" in s else (s, None) for s in a.subjects]
    results = {}
    for r in range(a.rounds):
        order = subjects[r % len(subjects):] + subjects[: r % len(subjects)]
        for name, binary in order:
            proc, addr = start(name, binary)
            try:
                store_all(addr)
                for path in PATHS:
                    for size in SIZES:
                        rps, per_cpu = cell(proc, addr, path, size, a.seconds)
                        results.setdefault((path, size, name), []).append(per_cpu)
                        print(f"round {r + 1} {name:>10} {path:>10} {size >> 10:>4} KiB: "
                              f"{rps:8.0f} req/s, {per_cpu:8.0f} req per server CPU-s", flush=True)
            finally:
                proc.kill()
                proc.wait()
    print("\nmedian (min-max) GETs per server CPU-second, load average", os.getloadavg())
    for path in PATHS:
        for size in SIZES:
            row = []
            for name, _ in subjects:
                v = results[(path, size, name)]
                row.append(f"{name} {statistics.median(v):.0f} ({min(v):.0f}-{max(v):.0f})")
            print(f"{path:>10} {size >> 10:>4} KiB: " + " | ".join(row))


if __name__ == "__main__":
    main()
