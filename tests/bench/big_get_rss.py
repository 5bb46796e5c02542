#!/usr/bin/env python3
"""Peak RSS of ringstore binaries serving 512 KiB GETs (BENCHMARKS, issue 14, ADR 0027):
each binary is started with `--memory 1024MiB --cores 1`, given 64 values of 512 KiB, then
50 connections GET them for 4 s; prints VmHWM/VmRSS (MiB) after the preload and after.

Usage (from the repository root, with the e2e venv):
  /work/main/target/py/bin/python tests/bench/big_get_rss.py BINARY [BINARY...]
"""
import os
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "../e2e"))
import conftest  # noqa: E402
from test_memory_bounds import mc, recv_exact, store  # noqa: E402


def mem(pid):
    d = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmHWM", "VmRSS")):
                d[line.split(":")[0]] = int(line.split()[1]) // 1024
    return d


def main():
    for binary in sys.argv[1:]:
        conftest.BIN = binary
        server = conftest.Server("--memory", "1024MiB", "--cores", "1")
        value = os.urandom(512 << 10)
        for i in range(64):
            store(server, b"k%d" % i, value)
        before = mem(server.proc.pid)
        stop = time.monotonic() + 4
        done = [0]

        def run(j):
            c = mc(server)
            head = b"VALUE k%d 0 %d\r\n" % (j % 64, len(value))
            while time.monotonic() < stop:
                c.sendall(b"get k%d\r\n" % (j % 64))
                recv_exact(c, len(head) + len(value) + 7)
                done[0] += 1
            c.close()

        threads = [threading.Thread(target=run, args=(j,)) for j in range(50)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        print(binary, "after preload", before, "after the GETs", mem(server.proc.pid), "gets", done[0])
        server.proc.kill()
        server.proc.wait()


if __name__ == "__main__":
    main()
