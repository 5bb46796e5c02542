#!/usr/bin/env python3
"""What one scrape of /metrics costs a box holding many keys (issue 33: at most 5 ms of server
CPU, an answer under 64 KiB): starts `ringstore serve`, stores N 100-byte items (pipelined
`set ... noreply`), then reads the server's CPU time (utime + stime of every thread, from
/proc/PID/stat) around an idle stretch and around SCRAPES scrapes of the same length, and
prints the CPU per scrape (idle subtracted) and the answer's size.

Usage: metrics_scrape.py RINGSTORE_BINARY [N] [SCRAPES]   (N defaults to 1 000 000, SCRAPES 1 000:
the kernel counts CPU time in clock ticks of 10 ms, so 20 scrapes of well under a millisecond
each would read as 0)
"""
import http.client
import os
import socket
import subprocess
import sys
import time

import items_in_budget  # the same fill: N pipelined 100-byte sets

TICK = os.sysconf("SC_CLK_TCK")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime (fields 14, 15)


def wait_listening(port, proc):
    deadline = time.time() + 30
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit(f"ringstore exited ({proc.returncode})")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    sys.exit("ringstore did not listen")


def fill(port, n):
    lines = items_in_budget.fill(port, n)
    items = [l for l in lines if l.startswith(b"STAT curr_items ")]
    return int(items[0].split()[2]) if items else 0


def scrape(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", "/metrics")
    r = c.getresponse()
    body = r.read()
    c.close()
    if r.status != 200:
        sys.exit(f"/metrics answered {r.status}")
    return len(body)


def main():
    binary = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 1_000_000
    scrapes = int(sys.argv[3]) if len(sys.argv) > 3 else 1000
    mc, web = free_port(), free_port()
    proc = subprocess.Popen(
        [binary, "serve", "--memcache", f"127.0.0.1:{mc}", "--http", f"127.0.0.1:{web}",
         "--memory", "1GiB", "--cores", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_listening(mc, proc)
        wait_listening(web, proc)
        items = fill(mc, n)
        scrape(web)  # first-use work (buffers) is not what a steady scrape costs
        before = cpu_seconds(proc.pid)
        t0 = time.time()
        sizes = [scrape(web) for _ in range(scrapes)]
        wall = time.time() - t0
        busy = cpu_seconds(proc.pid) - before
        before = cpu_seconds(proc.pid)
        time.sleep(wall)
        idle = cpu_seconds(proc.pid) - before
        per = (busy - idle) / scrapes * 1000
        print(f"items: {items}")
        print(f"scrapes: {scrapes} in {wall:.2f} s wall")
        print(f"server CPU: {busy * 1000:.0f} ms scraping, {idle * 1000:.0f} ms idle for as long")
        print(f"server CPU per scrape: {per:.2f} ms (clock tick {1000 / TICK:.0f} ms)")
        print(f"answer: {max(sizes)} bytes ({max(sizes) / 1024:.1f} KiB)")
    finally:
        proc.kill()
        proc.wait()


if __name__ == "__main__":
    main()
