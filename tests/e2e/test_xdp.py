"""memcache UDP through AF_XDP (`--xdp`): a veth pair whose far end is in a fresh network
namespace, the client there. Replies are compared byte for byte with memcached -U's for the
same request stream; ping, TCP to both data ports and other UDP keep working while the
program is attached; stopping ringstore leaves the interface without XDP. Needs root,
iproute2 and ethtool (the sender's TX checksum offload is turned off, as veth otherwise
leaves partial checksums); skipped otherwise."""

import contextlib
import ctypes
import itertools
import os
import shutil
import socket
import struct
import subprocess
import time

import pytest

from conftest import Server, real_memcached

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("ethtool"),
    reason="needs root, iproute2 and ethtool",
)

_libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNET = 0x40000000
_seq = itertools.count()


def sh(*args):
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


class Veth:
    """`a` here (10.79.N.1), `b` in namespace `ns` (10.79.N.2); names unique per process
    and test, removed by `close` (deleting one end removes the pair)."""

    def __init__(self):
        n = next(_seq)
        tag = f"{os.getpid() % 100000}x{n}"
        self.ns = f"rs-xdp-{os.getpid()}-{n}"
        self.a, self.b = f"rxa{tag}", f"rxb{tag}"
        net = (os.getpid() + 7 * n) % 250 + 1
        self.ip_a, self.ip_b = f"10.79.{net}.1", f"10.79.{net}.2"
        try:
            sh("ip", "netns", "add", self.ns)
            sh("ip", "link", "add", self.a, "type", "veth", "peer", "name", self.b)
            sh("ip", "link", "set", self.b, "netns", self.ns)
            sh("ip", "addr", "add", f"{self.ip_a}/24", "dev", self.a)
            sh("ip", "link", "set", self.a, "up")
            sh("ip", "-n", self.ns, "addr", "add", f"{self.ip_b}/24", "dev", self.b)
            sh("ip", "-n", self.ns, "link", "set", self.b, "up")
            sh("ip", "-n", self.ns, "link", "set", "lo", "up")
            sh("ip", "netns", "exec", self.ns, "ethtool", "-K", self.b, "tx", "off")
        except BaseException:
            self.close()
            raise

    def close(self):
        subprocess.run(["ip", "link", "del", self.a], stderr=subprocess.DEVNULL)
        subprocess.run(["ip", "netns", "del", self.ns], stderr=subprocess.DEVNULL)

    @contextlib.contextmanager
    def inside(self):
        """Runs the block with this thread in the namespace (sockets made there stay there)."""
        with open("/proc/self/ns/net") as home, open(f"/run/netns/{self.ns}") as there:
            assert _libc.setns(there.fileno(), CLONE_NEWNET) == 0, os.strerror(ctypes.get_errno())
            try:
                yield
            finally:
                assert _libc.setns(home.fileno(), CLONE_NEWNET) == 0

    def socket(self, kind=socket.SOCK_DGRAM):
        with self.inside():
            s = socket.socket(socket.AF_INET, kind)
        s.settimeout(3)
        return s

    def xdp_attached(self):
        out = subprocess.run(["ip", "link", "show", self.a], capture_output=True, text=True).stdout
        return "prog/xdp" in out


@pytest.fixture
def veth():
    v = Veth()
    try:
        yield v
    finally:
        v.close()


@pytest.fixture
def xdp_server(veth):
    s = Server(
        "--memcache", f"{veth.ip_a}:0", "--http", f"{veth.ip_a}:0",
        "--udp", "0.0.0.0:0", "--xdp", veth.a, "--cores", "1", "--memory", "64MiB",
    )
    try:
        s.udp_port = int(dict(f.split("=", 1) for f in s.ready.split()[1:])["udp"].rsplit(":", 1)[1])
        yield s
    finally:
        if s.proc.poll() is None:
            s.proc.kill()
            s.proc.wait()


def udp_message(sock, rid):
    """One reply message: its datagrams (whole, frame header included) in sequence order,
    once all `count` of them arrived."""
    got, count = {}, None
    while count is None or len(got) < count:
        data, _ = sock.recvfrom(65536)
        r, seq, count, _ = struct.unpack(">HHHH", data[:8])
        if r == rid:
            got[seq] = data
    return [got[i] for i in range(count)]


def udp_request(sock, addr, rid, request):
    """Sends one request datagram; returns the reply's messages. memcached 1.6 sends a
    multi-key get as one message per value plus one for END (each numbered from 0), and
    so does ringstore; so a get reply is read until END."""
    sock.sendto(struct.pack(">HHHH", rid, 0, 1, 0) + request, addr)
    messages = [udp_message(sock, rid)]
    if request.startswith(b"get"):
        while not b"".join(d[8:] for d in messages[-1]).endswith(b"END\r\n"):
            messages.append(udp_message(sock, rid))
    return messages


def payload(messages):
    return b"".join(d[8:] for m in messages for d in m)


STREAM = [
    b"set a 0 0 5\r\nhello\r\n",
    b"get a\r\n",
    b"gets a\r\n",
    b"set b 7 0 3\r\nbee\r\n",
    b"get a b c\r\n",
    b"delete b\r\n",
    b"delete b\r\n",
    b"set n 0 0 2\r\n10\r\n",
    b"incr n 5\r\n",
    b"decr n 20\r\n",
    b"incr missing 1\r\n",
    b"set big 0 0 5000\r\n" + bytes(range(256)) * 19 + b"x" * 136 + b"\r\n",
    b"get big\r\n",
    b"get nothing\r\n",
    b"bogus command\r\n",
]


def stat(s, name):
    reply = b""
    with socket.create_connection(s.mc, timeout=3) as c:
        c.sendall(b"stats\r\n")
        while not reply.endswith(b"END\r\n"):
            reply += c.recv(65536)
    for line in reply.decode().split("\r\n"):
        if line.startswith(f"STAT {name} "):
            return line.split(" ", 2)[2]
    raise AssertionError(f"no stat {name}")


def test_udp_through_xdp_matches_memcached_byte_for_byte(veth, xdp_server):
    assert veth.xdp_attached()
    assert stat(xdp_server, "xdp_mode") == f"{veth.a}:xdp-copy"
    client = veth.socket()
    ours = [udp_request(client, (veth.ip_a, xdp_server.udp_port), i + 1, r) for i, r in enumerate(STREAM)]
    with real_memcached(udp=True) as mc:
        ref = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        ref.settimeout(3)
        theirs = [udp_request(ref, mc, i + 1, r) for i, r in enumerate(STREAM)]
    for req, a, b in zip(STREAM, ours, theirs):
        # Every datagram: frame headers, split points, one message per value as memcached.
        assert a == b, f"{req[:40]!r}: {a!r} != {b!r}"
    big = ours[STREAM.index(b"get big\r\n")]
    assert [len(d) for d in big[0]][:3] == [1400] * 3 and len(big[0]) == 4, "four datagrams"
    # Served by the XDP path, not the kernel socket on the same port, except the 5000-byte
    # set: IP fragments it, and fragments pass to the kernel (which reassembles them).
    assert int(stat(xdp_server, "xdp_rx")) >= len(STREAM) - 1
    assert int(stat(xdp_server, "xdp_tx")) >= len(STREAM) - 1 + 3


def test_other_traffic_passes_and_stop_detaches(veth, xdp_server):
    # ICMP and ARP.
    ping = subprocess.run(
        ["ip", "netns", "exec", veth.ns, "ping", "-c", "1", "-W", "2", veth.ip_a],
        capture_output=True,
    )
    if shutil.which("ping"):
        assert ping.returncode == 0, ping.stdout
    # TCP to both data ports.
    for host, port in (xdp_server.mc, xdp_server.http):
        c = veth.socket(socket.SOCK_STREAM)
        c.connect((host, port))
        c.close()
    c = veth.socket(socket.SOCK_STREAM)
    c.connect(xdp_server.mc)
    c.sendall(b"version\r\n")
    assert c.recv(100).startswith(b"VERSION")
    c.close()
    # Other UDP reaches the kernel: an echo on another port.
    echo = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    echo.bind((veth.ip_a, 0))
    echo.settimeout(3)
    client = veth.socket()
    client.sendto(b"ping", echo.getsockname())
    data, peer = echo.recvfrom(100)
    assert data == b"ping"
    echo.sendto(b"pong", peer)
    assert client.recvfrom(100)[0] == b"pong"
    # memcache UDP still answered after the other traffic.
    reply = udp_request(client, (veth.ip_a, xdp_server.udp_port), 9, b"version\r\n")
    assert payload(reply).startswith(b"VERSION")
    assert xdp_server.stop() == 0
    assert not veth.xdp_attached(), "stopping ringstore detaches the program"
