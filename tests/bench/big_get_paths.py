#!/usr/bin/env python3
"""Big GETs per server CPU-second on each GET path (BENCHMARKS, issue 24, ADR 0027): text
`get`, meta `mg <key> v` and binary GET, 100 KiB and 512 KiB values, against each named
ringstore binary (and memcached as a yardstick). Every server runs on CPU 0
(`--cores 1`, `memcached -t 1`), the clients on CPU 1: CONNS processes, one connection each
at depth 1, each reply read to its exact length and compared byte for byte with the value.
Server CPU is the process's utime+stime (/proc/PID/stat) over the timed
windows; the figure is requests completed in them per server CPU-second. All subjects run at
once and each cell alternates them in short slices (as `cargo xtask bench --compare-binary`
does), so they share the load from whatever else runs on the machine.

Usage (from the repository root, with the e2e venv or any python3):
  python3 tests/bench/big_get_paths.py [--rounds 3] [--seconds 6] [--slices 4] [--sizes 102400,524288]
      [--paths "get,mg v,binary get"] NAME=BINARY ... [memcached]
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
TICK = os.sysconf("SC_CLK_TCK")
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
    """utime+stime of the whole process from /proc/PID/stat: unlike a sum over the live
    threads it keeps the time of threads that exited (io_uring's iou-wrk workers come and go)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


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


def slice_once(proc, addr, path, size, seconds):
    """CONNS clients for `seconds` (after a short warm-up): (requests, server CPU seconds)."""
    counts = multiprocessing.Array("q", CONNS)
    now = time.monotonic()
    warm_at, start_at = now + 0.2, now + 0.5
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
    return sum(counts), cpu1 - cpu0


def cell(servers, path, size, seconds, slices):
    """One cell for every subject, in `slices` alternating slices of seconds/slices each (the
    order reversed every other slice), so they share the machine's load: name -> (req/s,
    requests per server CPU-second)."""
    totals = {name: [0, 0.0] for name in servers}
    names = list(servers)
    for k in range(slices):
        for name in names if k % 2 == 0 else names[::-1]:
            proc, addr = servers[name]
            reqs, cpu = slice_once(proc, addr, path, size, seconds / slices)
            totals[name][0] += reqs
            totals[name][1] += cpu
    return {name: (reqs / seconds, reqs / max(cpu, 1e-6)) for name, (reqs, cpu) in totals.items()}


values_cache = {}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=6.0, help="per cell and subject")
    ap.add_argument("--slices", type=int, default=4, help="alternating slices per cell")
    ap.add_argument("--sizes", default="102400,524288", help="value bytes, comma-separated")
    ap.add_argument("--paths", default=",".join(PATHS), help=f"comma-separated, of {list(PATHS)}")
    ap.add_argument("subjects", nargs="+", help="NAME=BINARY, or memcached")
    a = ap.parse_args()
    global SIZES
    SIZES = tuple(int(n) for n in a.sizes.split(","))
    paths = a.paths.split(",")
    unknown = set(paths) - set(PATHS)
    if unknown:
        ap.error(f"unknown paths {sorted(unknown)}")
    for size in SIZES:
        values_cache[size] = values(size)
    subjects = [s.split("=", 1) if "=" in s else (s, None) for s in a.subjects]
    results = {}
    for r in range(a.rounds):
        servers = {}
        try:
            for name, binary in subjects:
                servers[name] = start(name, binary)
                store_all(servers[name][1])
            for path in paths:
                for size in SIZES:
                    for name, (rps, per_cpu) in cell(servers, path, size, a.seconds, a.slices).items():
                        results.setdefault((path, size, name), []).append(per_cpu)
                        print(f"round {r + 1} {name:>10} {path:>10} {size >> 10:>4} KiB: "
                              f"{rps:8.0f} req/s, {per_cpu:8.0f} req per server CPU-s", flush=True)
        finally:
            for proc, _ in servers.values():
                proc.kill()
                proc.wait()
    print("\nmedian (min-max) GETs per server CPU-second, load average", os.getloadavg())
    for path in paths:
        for size in SIZES:
            row = []
            for name, _ in subjects:
                v = results[(path, size, name)]
                row.append(f"{name} {statistics.median(v):.0f} ({min(v):.0f}-{max(v):.0f})")
            print(f"{path:>10} {size >> 10:>4} KiB: " + " | ".join(row))


if __name__ == "__main__":
    main()
