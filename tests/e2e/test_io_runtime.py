"""`--io` (ADR 0033): which runtime serves where io_uring is denied, and the hostile clients
that matter for a readiness loop, on whichever runtime the suite runs (both in `cargo xtask
test`).

The io_uring denial is made the way a container runtime makes it: a seccomp filter that
answers io_uring_setup, io_uring_enter and io_uring_register with EPERM (seccomp_deny.py).
"Idle" is measured, not assumed: the server process's CPU time (utime + stime) over a few
seconds while the hostile clients sit there; a readiness loop that spins on a ready socket
it cannot serve shows up as a whole CPU second per second."""

import os
import resource
import socket
import subprocess
import time

import pytest

from conftest import BIN
from seccomp_deny import deny_io_uring

MiB = 1 << 20
KiB = 1 << 10
EPOLL = ("--io", "epoll")
# The hostile clients run against whichever runtime the suite runs (`RINGSTORE_IO`, which
# the fixtures pass as --io; unset: auto, io_uring here): `cargo xtask test` runs them on
# both.
SUITE_IO = ()
# CPU seconds a server with nothing to do may use per wall second (the 100 ms tick, the
# reaper; a busy loop uses ~1.0).
IDLE_CPU_PER_SEC = 0.05


def cpu_seconds(pid):
    """utime + stime of process `pid`, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_over(server, seconds):
    """The server's CPU seconds per wall second over `seconds`."""
    before = cpu_seconds(server.proc.pid)
    time.sleep(seconds)
    return (cpu_seconds(server.proc.pid) - before) / seconds


def readme_bound(memory, conn_memory, max_conns, workers=os.cpu_count()):
    """README "Memory bound": --memory + --conn-memory + max-conns x 160 KiB + 16 MiB + 4 MiB per worker."""
    return memory + conn_memory + max_conns * 160 * KiB + 16 * MiB + 4 * MiB * workers


def stats(addr):
    s = socket.create_connection(addr, timeout=10)
    s.sendall(b"stats\r\n")
    text = b""
    while not text.endswith(b"END\r\n"):
        chunk = s.recv(65536)
        assert chunk, "closed during stats"
        text += chunk
    s.close()
    return {l.split()[1]: l.split()[2] for l in text.decode().splitlines() if l.startswith("STAT ")}


def set_get(addr, key=b"k", value=b"v" * 100):
    s = socket.create_connection(addr, timeout=10)
    s.sendall(b"set %s 0 0 %d\r\n%s\r\nget %s\r\n" % (key, len(value), value, key))
    want = b"STORED\r\nVALUE %s 0 %d\r\n%s\r\nEND\r\n" % (key, len(value), value)
    got = b""
    while len(got) < len(want):
        chunk = s.recv(65536)
        assert chunk, f"closed after {got!r}"
        got += chunk
    s.close()
    assert got == want


def test_auto_where_seccomp_denies_io_uring_serves_with_epoll(server_factory):
    server = server_factory("--io", "auto", preexec_fn=deny_io_uring)
    set_get(server.mc)
    assert stats(server.mc)["io_runtime"] == "epoll"
    assert server.stop() == 0
    err = server.proc.stderr.read().decode()
    assert "ringstore: io_uring not permitted (seccomp or kernel.io_uring_disabled); serving with epoll\n" in err, err


def test_a_container_without_io_uring_keeps_durable_writes_across_kill9(server_factory, tmp_path):
    """The container case with a data device: io_uring denied, `auto` serves with epoll,
    and every acknowledged write is back after a kill -9 (the sync thread's group commit)."""
    data = tmp_path / "data.img"
    with open(data, "wb") as f:
        f.truncate(64 * MiB)
    args = ("--io", "auto", "--data", str(data), "--cores", "2", "--memory", "64MiB")
    server = server_factory(*args, preexec_fn=deny_io_uring)
    assert stats(server.mc)["io_runtime"] == "epoll"
    s = socket.create_connection(server.mc, timeout=10)
    acked = {}
    for i in range(300):
        key, value = b"d%d" % i, os.urandom(50 + i)
        s.sendall(b"set %s 0 0 %d\r\n%s\r\n" % (key, len(value), value))
        reply = b""
        while not reply.endswith(b"\r\n"):
            chunk = s.recv(64)
            assert chunk, "closed during a set"
            reply += chunk
        assert reply == b"STORED\r\n", reply
        acked[key] = value
    server.proc.kill()
    server.proc.wait(timeout=10)
    again = server_factory(*args, preexec_fn=deny_io_uring)
    for key, value in list(acked.items())[::7] + list(acked.items())[-3:]:
        s = socket.create_connection(again.mc, timeout=10)
        s.sendall(b"get %s\r\n" % key)
        want = b"VALUE %s 0 %d\r\n%s\r\nEND\r\n" % (key, len(value), value)
        got = b""
        while len(got) < len(want):
            chunk = s.recv(65536)
            assert chunk, f"closed after {got!r}"
            got += chunk
        assert got == want, key
        s.close()
    assert again.stop() == 0


def test_io_uring_where_seccomp_denies_it_fails_naming_causes_and_remedies():
    p = subprocess.run(
        [BIN, "serve", "--io", "io_uring", "--memcache", "127.0.0.1:0", "--http", "127.0.0.1:0"],
        capture_output=True,
        timeout=20,
        preexec_fn=deny_io_uring,
    )
    err = p.stderr.decode()
    assert p.returncode == 1, (p.returncode, err)
    assert p.stdout == b"", "no ready line"
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    for needed in ("--io io_uring: io_uring not permitted", "seccomp", "kernel.io_uring_disabled", "--io epoll"):
        assert needed in lines[0], (needed, err)


def test_auto_where_io_uring_is_permitted_uses_it(server_factory):
    server = server_factory("--io", "auto")
    assert stats(server.mc)["io_runtime"] == "io_uring"
    server.stop()
    assert "serving with epoll" not in server.proc.stderr.read().decode()


def test_the_epoll_runtime_refuses_what_it_does_not_serve(tmp_path):
    data = tmp_path / "data.img"
    with open(data, "wb") as f:
        f.truncate(64 << 20)
    p = subprocess.run(
        [BIN, "serve", *EPOLL, "--memcache", "127.0.0.1:0", "--http", "127.0.0.1:0", "--udp", "127.0.0.1:0",
         "--data", str(data)],
        capture_output=True,
        timeout=20,
    )
    err = p.stderr.decode()
    assert p.returncode == 2, err
    assert "--udp with --data (UDP replies held until their group commit) is not served by the epoll runtime" in err, err
    with open(data, "rb") as f:
        assert f.read(1 << 20) == bytes(1 << 20), "refused before the device is formatted"


def test_a_client_that_never_reads_leaves_the_worker_idle(server_factory):
    server = server_factory(*SUITE_IO, "--memory", "64MiB", "--conn-memory", "16MiB")
    value = os.urandom(512 * KiB)
    set_get(server.mc, b"big", value)
    stalled = socket.create_connection(server.mc, timeout=10)
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stalled.sendall(b"get big\r\n" * 200)  # ~100 MiB of replies, never read
    time.sleep(1.0)  # the server's socket buffer fills; it stops at EAGAIN
    assert cpu_over(server, 3.0) < IDLE_CPU_PER_SEC
    set_get(server.mc, b"other")
    assert server.rss_bytes() <= readme_bound(64 * MiB, 16 * MiB, 4096)
    stalled.close()


def test_ten_thousand_idle_connections_cost_little_and_no_cpu(server_factory):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < 11_000:
        pytest.skip(f"RLIMIT_NOFILE hard limit {hard} < 11000")
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    server = server_factory(*SUITE_IO, "--max-conns", "12000", "--memory", "64MiB")
    base = server.rss_bytes()
    conns = []
    try:
        for _ in range(10_000):
            conns.append(socket.create_connection(server.mc, timeout=10))
        deadline = time.monotonic() + 20
        while int(stats(server.mc)["curr_connections"]) < 10_000 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert int(stats(server.mc)["curr_connections"]) >= 10_000
        assert cpu_over(server, 2.0) < IDLE_CPU_PER_SEC
        set_get(server.mc)
        grown = server.rss_bytes() - base
        # No receive buffer per idle connection (one per worker): a few KiB each at most.
        assert grown <= 10_000 * 8 * KiB, f"{grown / 10_000:.0f} bytes per idle connection"
        assert server.rss_bytes() <= readme_bound(64 * MiB, 64 * MiB, 12000)
    finally:
        for c in conns:
            c.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_slowloris_body_is_cut_at_the_request_timeout(server_factory):
    server = server_factory(*SUITE_IO, "--request-timeout", "2")
    s = socket.create_connection(server.http, timeout=10)
    s.sendall(b"PUT /slow HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n")
    started = time.monotonic()
    closed_at = None
    while time.monotonic() - started < 8:
        try:
            s.sendall(b"a")
        except OSError:
            closed_at = time.monotonic()
            break
        s.settimeout(0.3)
        try:
            if s.recv(4096) == b"":
                closed_at = time.monotonic()
                break
        except socket.timeout:
            pass
    assert closed_at is not None, "a body trickling 3 bytes a second was never cut"
    assert 1.5 <= closed_at - started <= 4.5, closed_at - started
    assert server.rss_bytes() <= readme_bound(64 * MiB, 64 * MiB, 4096)


def test_a_reader_draining_one_byte_at_a_time_gets_the_whole_value(server_factory):
    server = server_factory(*SUITE_IO)
    value = os.urandom(64 * KiB)
    set_get(server.mc, b"v", value)
    s = socket.create_connection(server.mc, timeout=10)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.sendall(b"get v\r\n")
    want = b"VALUE v 0 %d\r\n%s\r\nEND\r\n" % (len(value), value)
    before = cpu_seconds(server.proc.pid)
    got = bytearray()
    while len(got) < len(want):
        b = s.recv(1)
        assert b, f"closed after {len(got)} bytes"
        got += b
    assert bytes(got) == want
    # Waking the server per byte drained would cost about a syscall pair per byte; the
    # kernel reports writable only once a third of the buffer is free.
    assert cpu_seconds(server.proc.pid) - before < 1.0
    assert server.rss_bytes() <= readme_bound(64 * MiB, 64 * MiB, 4096)


def test_wakeups_with_nothing_to_read_do_not_spin(server_factory):
    server = server_factory(*SUITE_IO)
    noisy = socket.create_connection(server.mc, timeout=10)
    for _ in range(200):
        # Urgent bytes wake the socket but are not in its normal stream: a read finds nothing.
        noisy.send(b"!", socket.MSG_OOB)
    half = socket.create_connection(server.mc, timeout=10)
    half.shutdown(socket.SHUT_WR)  # a FIN: readable, and the read says end of stream
    assert half.recv(16) == b"", "a half-closed idle client is closed"
    assert cpu_over(server, 2.0) < IDLE_CPU_PER_SEC
    set_get(server.mc)
    assert server.rss_bytes() <= readme_bound(64 * MiB, 64 * MiB, 4096)
    noisy.close()
