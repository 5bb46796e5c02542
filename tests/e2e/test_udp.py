"""memcache over UDP on the worker rings (kernel-UDP datapath backend, ADR 0021): the same
replies as memcached -U byte for byte, requests spread over workers, an attacker's garbage
and a never-read flood leave the server bounded and serving, and with --data UDP writes are
answered after their group commit and survive kill -9."""

import re
import signal
import socket
import time

from conftest import raw, real_memcached
from test_durable import fault_device, make_file  # noqa: F401 (fault_device: a fixture)
from udpclient import UdpClient, header, udp_addr_of


def udp_server(factory, *extra):
    s = factory("--memory", "64MiB", "--udp", "127.0.0.1:0", *extra)
    return s, udp_addr_of(s.ready)


def stats(server):
    out = raw(server.mc, b"stats\r\n", read_until=b"END\r\n").decode()
    return {m[0]: m[1] for m in re.findall(r"STAT (\S+) (\S+)", out)}


def stats_once_sent(server, n, timeout):
    """`stats` once `udp_tx_datagrams` reaches `n` (or `timeout` passed): a reply datagram is
    counted when its send's completion is reaped, which can be after the client holds it."""
    deadline = time.monotonic() + timeout
    st = stats(server)
    while int(st["udp_tx_datagrams"]) < n and time.monotonic() < deadline:
        time.sleep(0.01)
        st = stats(server)
    return st


BIG = b"".join(b"%06d" % i for i in range(1000))  # 6000 bytes: a 5-datagram reply

# One stream of requests; replies must match memcached's datagram for datagram.
STREAM = [
    b"get nothere\r\n",
    b"set k1 5 0 3\r\nabc\r\n",
    b"get k1\r\n",
    b"set k2 0 0 2\r\nxy\r\n",
    b"get k1 k2 nothere\r\n",
    b"gets k1\r\n",
    b"add k1 0 0 1\r\nz\r\n",
    b"replace k2 0 0 3\r\nnew\r\n",
    b"append k2 0 0 2\r\n++\r\n",
    b"prepend k2 0 0 2\r\n--\r\n",
    b"get k2\r\n",
    b"set n 0 0 2\r\n10\r\n",
    b"incr n 5\r\n",
    b"decr n 20\r\n",
    b"incr nothere 1\r\n",
    b"touch k1 100\r\n",
    b"delete k1\r\n",
    b"delete k1\r\n",
    b"get k1\r\n",
    b"set big 0 0 %d\r\n%s\r\n" % (len(BIG), BIG),
    b"get big\r\n",
    b"get big k2 big\r\n",
    b"get nothere k2 nothere big\r\n",
    b"get x k2 x x\r\n",
    b"get x y z\r\n",
    b"gets k2 nothere k2\r\n",
    b"get k2\r\nget nothere\r\ndelete nothere\r\n",
    b"set quiet 0 0 1 noreply\r\nq\r\n",
    b"get quiet\r\n",
    b"bogus command\r\n",
    b"set k3 0 0 1\r\n1\r\nget k3\r\n",
]


def normalize(datagrams):
    # CAS values are each server's own counter.
    return [re.sub(rb"(VALUE \S+ \d+ \d+) \d+", rb"\1 CAS", d) for d in datagrams]


def run_stream(addr):
    got = []
    with UdpClient(addr, first_id=100) as c:
        for payload in STREAM:
            if b"noreply" in payload:
                assert c.silence(payload) == []
                continue
            got.append(normalize(c.datagrams(payload)))
    return got


def test_udp_replies_match_memcached_datagram_for_datagram(server_factory):
    with real_memcached(udp=True) as mc:
        want = run_stream(mc)
    _, addr = udp_server(server_factory)
    got = run_stream(addr)
    for payload, w, g in zip(STREAM, want, got):
        assert g == w, f"{payload[:40]!r}: memcached {w!r}, ringstore {g!r}"
    # The big value came back in several datagrams, numbered, each within 1400 bytes.
    big = got[STREAM.index(b"get big\r\n")]
    assert len(big) == 5 and all(len(d) <= 1400 for d in big)


# Requests sent back to back from one socket, without waiting: their replies are the same
# size to the same peer, so ringstore sends each burst's replies as the GSO segments of one
# sendmsg (kernel_udp.rs); the client still gets one datagram per reply datagram.
BURST = [b"get k\r\n", b"get k\r\n", b"get big\r\n", b"get k\r\n", b"get nothere\r\n"] * 12


def run_burst(addr):
    with UdpClient(addr, first_id=1) as c:
        c.datagrams(b"set k 0 0 100\r\n%s\r\n" % (b"v" * 100))
        c.datagrams(b"set big 0 0 %d\r\n%s\r\n" % (len(BIG), BIG))
        ids = [c.new_id() for _ in BURST]
        for rid, payload in zip(ids, BURST):
            c.send_raw(header(rid) + payload)
        want = sum(5 if b"big" in p else 1 for p in BURST)
        got = {}
        for _ in range(want):
            d = c.sock.recv(2048)
            got[(d[:2], d[2:4])] = d
        return [
            [got.get((rid.to_bytes(2, "big"), seq.to_bytes(2, "big"))) for seq in range(5 if b"big" in p else 1)]
            for rid, p in zip(ids, BURST)
        ]


def test_udp_burst_replies_match_memcached_datagram_for_datagram(server_factory):
    with real_memcached(udp=True) as mc:
        want = run_burst(mc)
    _, addr = udp_server(server_factory)
    got = run_burst(addr)
    assert got == want
    assert all(d is not None and len(d) <= 1400 for r in got for d in r)


def test_udp_is_served_by_every_worker(server_factory):
    server, addr = udp_server(server_factory, "--cores", "2")
    clients = [UdpClient(addr) for _ in range(32)]
    for i, c in enumerate(clients):
        assert c.request(b"set w%d 0 0 1\r\n%d\r\n" % (i, i % 10), settle=0) == b"STORED\r\n"
    for i, c in enumerate(clients):
        got = c.request(b"get w%d\r\n" % i, settle=0)
        assert got == b"VALUE w%d 0 1\r\n%d\r\nEND\r\n" % (i, i % 10)
    st = stats_once_sent(server, 64, timeout=5)
    assert int(st["udp_rx_datagrams"]) == 64 and int(st["udp_tx_datagrams"]) == 64, st
    assert st["threads"] == "2"
    # Each worker owns one socket of the SO_REUSEPORT group: the log says so.
    for c in clients:
        c.close()
    server.stop()
    assert "udp kernel-udp on 2 workers" in server.stderr_text()


def test_udp_garbage_and_a_never_read_flood_leave_it_bounded_and_serving(server_factory):
    server, addr = udp_server(server_factory)
    rss_before = server.rss_bytes()
    attacker = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    garbage = [
        b"",
        b"short",
        header(1, 0, 2) + b"get a\r\n",  # part of a multi-datagram request
        header(1, 1, 2) + b"get b\r\n",
        header(1, 5, 1) + b"get c\r\n",  # sequence past the count
        header(1) + b"\x80" + b"\xff" * 30,  # a broken binary header
        header(1) + b"get " + b"k" * 300 + b"\r\n",  # key too long
        header(1) + b"set x 0 0 99999999\r\n",  # value over the item size
        header(1) + b"\xff" * 60000,  # near the largest datagram
    ]
    for i in range(3000):
        try:
            attacker.sendto(garbage[i % len(garbage)], addr)
        except OSError:
            pass
        if i % 20 == 0:
            time.sleep(0.001)  # paced: the kernel's socket buffer drops uncounted otherwise
    # A flood of real gets whose replies are never read.
    raw(server.mc, b"set f 0 0 1000\r\n" + b"f" * 1000 + b"\r\n", read_until=b"\r\n")
    flood = header(2) + b"get f f f f f f f f f f\r\n"
    for _ in range(20000):
        try:
            attacker.sendto(flood, addr)
        except OSError:
            pass
    time.sleep(0.5)
    assert server.alive()
    # Still serving: TCP at once, UDP within a few tries (the socket buffer may be full).
    assert raw(server.mc, b"version\r\n", read_until=b"\r\n").startswith(b"VERSION ")
    with UdpClient(addr, timeout=0.5) as c:
        for _ in range(20):
            try:
                assert c.request(b"get f\r\n").startswith(b"VALUE f 0 1000\r\n")
                break
            except TimeoutError:
                continue
        else:
            raise AssertionError("UDP no longer answered after the flood")
    st = stats(server)
    # The empty, short, multi-datagram and out-of-sequence ones (5 of 9) are counted drops.
    assert int(st["udp_dropped"]) >= 1500, st
    growth = server.rss_bytes() - rss_before
    assert growth < 32 << 20, f"RSS grew {growth} bytes under the flood"
    attacker.close()


def test_udp_writes_with_data_are_durable_across_kill9(server_factory, tmp_path):
    path = tmp_path / "data.img"
    make_file(path, 64 << 20)
    args = ("--data", str(path), "--cores", "2")
    server, addr = udp_server(server_factory, *args)
    acked = {}
    with UdpClient(addr) as c:
        for i in range(300):
            key, value = b"u%d" % i, b"value-%d" % i
            assert c.request(b"set %s 0 0 %d\r\n%s\r\n" % (key, len(value), value), settle=0) == b"STORED\r\n"
            acked[key] = value
        assert c.request(b"incr ctr 1\r\n") == b"NOT_FOUND\r\n"
        assert c.request(b"set ctr 0 0 1\r\n7\r\n") == b"STORED\r\n"
        assert c.request(b"incr ctr 5\r\n") == b"12\r\n"
        assert c.request(b"delete u0\r\n") == b"DELETED\r\n"
        del acked[b"u0"]
        # A write and a read in one datagram: replies in request order.
        assert c.request(b"set both 0 0 1\r\nb\r\nget both\r\n") == b"STORED\r\nVALUE both 0 1\r\nb\r\nEND\r\n"
    st = stats(server)
    assert st["udp_held_full"] == "0", st
    server.proc.send_signal(signal.SIGKILL)
    server.proc.wait()
    server, addr = udp_server(server_factory, *args)
    with UdpClient(addr) as c:
        for key, value in acked.items():
            assert c.request(b"get %s\r\n" % key, settle=0) == b"VALUE %s 0 %d\r\n%s\r\nEND\r\n" % (key, len(value), value)
        assert c.request(b"get u0 ctr both\r\n") == b"VALUE ctr 0 2\r\n12\r\nVALUE both 0 1\r\nb\r\nEND\r\n"


def test_udp_writes_waiting_for_a_stalled_device_are_bounded(fault_device, server_factory, tmp_path):
    """The held table (1024 requests per worker waiting for their group commit) is the bound:
    past it a datagram is dropped unanswered and counted; the held ones are answered once the
    device commits, and the server serves TCP reads throughout."""
    backing = tmp_path / "backing.img"
    make_file(backing, 64 << 20)
    dev = fault_device(backing)
    server, addr = udp_server(server_factory, "--data", dev.path, "--cores", "1")
    dev.wait_quiet()
    raw(server.mc, b"set before 0 0 1\r\nb\r\n", read_until=b"\r\n")
    dev.stall_flush()
    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sender.bind(("127.0.0.1", 0))
    sent = 0
    deadline = time.monotonic() + 20
    # Writes until the table overflows (the kernel may drop some datagrams before the server).
    while int(stats(server)["udp_held_full"]) == 0 and time.monotonic() < deadline:
        for _ in range(500):
            sender.sendto(header(sent & 0xFFFF) + b"set h%d 0 0 1\r\nx\r\n" % sent, addr)
            sent += 1
            if sent % 20 == 0:
                time.sleep(0.001)  # paced, so the socket buffer does not drop them first
        time.sleep(0.1)
    st = stats(server)  # over TCP, no device needed: served while the device stalls
    rx, held_full = int(st["udp_rx_datagrams"]), int(st["udp_held_full"])
    assert held_full > 0, (sent, st)
    held = rx - held_full
    assert held <= 1024 + 1, st  # 1024 held (+1: the first write's commit may be through)
    assert int(st["udp_tx_datagrams"]) == 0, st
    assert raw(server.mc, b"get before\r\n", read_until=b"END\r\n") == b"VALUE before 0 1\r\nb\r\nEND\r\n"
    dev.heal()
    # Every held request is answered once the device commits (the server's count: the
    # client's socket buffer may drop some of the burst).
    st = stats_once_sent(server, held, timeout=10)
    assert int(st["udp_tx_datagrams"]) == held, st
    sender.settimeout(1)
    assert sender.recv(64)[8:] == b"STORED\r\n"
    sender.close()
