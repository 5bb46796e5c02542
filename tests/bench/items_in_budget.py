#!/usr/bin/env python3
"""How many 100-byte items a memcache server keeps in its budget: N pipelined
`set key:%08d 0 0 100 noreply`, then the `stats` lines that say where the memory went.

Usage: items_in_budget.py PORT [N]   (N defaults to 1 500 000). Start the servers first, e.g.
  ringstore serve --memcache 127.0.0.1:22001 --http 127.0.0.1:22002 --memory 64MiB --cores 1
  memcached -p 22003 -U 0 -m 64 -t 1
"""
import socket
import sys

WANTED = (b"curr_items", b"evictions", b"hash_bytes", b"bytes", b"limit_maxbytes")


def fill(port, n):
    """Stores `key:%08d` = 100 bytes for i in 0..n (pipelined `set ... noreply`), then asks
    `stats`; returns its reply lines."""
    s = socket.create_connection(("127.0.0.1", port))
    value = b"x" * 100
    batch = []
    for i in range(n):
        batch.append(b"set key:%08d 0 0 100 noreply\r\n%s\r\n" % (i, value))
        if len(batch) == 500:
            s.sendall(b"".join(batch))
            batch = []
    s.sendall(b"".join(batch) + b"stats\r\n")
    buf = b""
    while not buf.endswith(b"END\r\n"):
        chunk = s.recv(65536)
        if not chunk:
            break
        buf += chunk
    s.close()
    return buf.split(b"\r\n")


def main():
    port = int(sys.argv[1])
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 1_500_000
    for line in fill(port, n):
        parts = line.split()
        if len(parts) == 3 and parts[1] in WANTED:
            print(line.decode())


if __name__ == "__main__":
    main()
