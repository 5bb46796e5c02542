"""Limits and hostile clients: connection floods, slow clients, disconnects, memory, signals."""

import os
import signal
import socket
import subprocess
import time

from pymemcache.client.base import Client

from conftest import BIN, raw


def test_max_conns_refusal(server_factory):
    s = server_factory("--max-conns", "8", "--memory", "16MiB")
    held = []
    try:
        for _ in range(8):
            c = socket.create_connection(s.mc, timeout=5)
            c.sendall(b"version\r\n")
            assert c.recv(100).startswith(b"VERSION"), "a connection under the limit must be served"
            held.append(c)
        refused = 0
        for _ in range(50):
            out = raw(s.mc, b"version\r\n", timeout=2)
            if not out.startswith(b"VERSION"):
                refused += 1
        assert refused == 50, f"only {refused}/50 connections past --max-conns were refused"
    finally:
        for c in held:
            c.close()
    # Once the flood is gone the server serves again.
    time.sleep(0.3)
    assert raw(s.mc, b"version\r\n", read_until=b"\r\n").startswith(b"VERSION")
    assert s.alive()


def test_slow_client_is_closed(server_factory):
    s = server_factory("--request-timeout", "2", "--memory", "16MiB")
    c = socket.create_connection(s.mc, timeout=10)
    start = time.monotonic()
    closed = False
    # Trickle a request one byte every 0.5 s; the server must close us within its timeout.
    for b in b"set slowkey 0 0 100000\r\n" + b"x" * 40:
        try:
            c.sendall(bytes([b]))
        except (BrokenPipeError, ConnectionResetError):
            closed = True
            break
        c.settimeout(0.5)
        try:
            if c.recv(100) == b"":
                closed = True
                break
        except socket.timeout:
            pass
        except ConnectionResetError:
            closed = True
            break
        if time.monotonic() - start > 8:
            break
    assert closed, "a byte-by-byte client was not closed"
    assert time.monotonic() - start < 8
    assert s.alive()


def test_idle_client_is_closed(server_factory):
    s = server_factory("--idle-timeout", "1", "--memory", "16MiB")
    c = socket.create_connection(s.mc, timeout=5)
    assert c.recv(10) == b"", "idle connection was not closed"


def test_disconnect_mid_value(server):
    for _ in range(20):
        c = socket.create_connection(server.mc, timeout=5)
        c.sendall(b"set half 0 0 1000\r\n" + b"x" * 300)
        c.close()
    cl = Client(server.mc, timeout=5)
    assert cl.get("half") is None
    assert cl.set("after", b"ok", noreply=False)
    assert server.alive()


def test_rss_stays_within_budget(server_factory):
    budget = 32 * 1024 * 1024
    overhead = 64 * 1024 * 1024  # binary, thread stacks, ring buffers, per-connection buffers
    s = server_factory("--memory", "32MiB")
    c = Client(s.mc, timeout=10)
    value = b"v" * 4000
    for i in range(30000):  # ~120 MB offered to a 32 MiB cache
        c.set(f"key{i}", value)
    stats = {k.decode(): v for k, v in c.stats().items()}
    assert int(stats["evictions"]) > 0
    rss = s.rss_bytes()
    assert rss < budget + overhead, f"RSS {rss} exceeds budget {budget} + overhead {overhead}"
    assert c.get("key29999") == value


def test_sigterm_exits_zero(server_factory):
    s = server_factory("--memory", "16MiB")
    assert s.stop(signal.SIGTERM) == 0


def test_sigint_exits_zero(server_factory):
    s = server_factory("--memory", "16MiB")
    assert s.stop(signal.SIGINT) == 0


def test_bad_flag_exits_two():
    p = subprocess.run([BIN, "serve", "--memory", "lots"], capture_output=True, timeout=10)
    assert p.returncode == 2
    lines = p.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and "memory" in lines[0], p.stderr
    p = subprocess.run([BIN, "serve", "--no-such-flag"], capture_output=True, timeout=10)
    assert p.returncode == 2
