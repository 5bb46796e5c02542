"""A memcache-over-UDP client for the end-to-end tests (kernel UDP, AF_XDP, memcached -U).

memcached's UDP framing: every datagram starts with an 8-byte header, request id, sequence
number, datagram count and a reserved field (big-endian u16 each). A request is one whole
datagram; a reply may span several, each echoing the request id and the total count.

    c = UdpClient(("127.0.0.1", port))
    c.request(b"get k\\r\\n")          # -> the reply bytes, datagrams joined in order
    c.datagrams(b"get k\\r\\n")        # -> the raw reply datagrams (headers included)

memcached frames each response of a request separately (one per command, one per key of
a multi-key get; a missed key that is not the last is a header-only datagram with count 0),
each numbered from 0 with its own count, all with the request's id. `datagrams` and
`request` read response after response until none follows within `settle` seconds.
    c.close()

Also usable from another network namespace (pass `bind=("10.0.0.2", 0)`), and with a
fixed source port (`bind=(ip, port)`).
"""

import socket
import time


def header(request_id, seq=0, count=1):
    """memcached's 8-byte UDP frame header."""
    return (
        request_id.to_bytes(2, "big")
        + seq.to_bytes(2, "big")
        + count.to_bytes(2, "big")
        + b"\0\0"
    )


def parse_header(datagram):
    """(request id, sequence, count) of a reply datagram; ValueError when short."""
    if len(datagram) < 8:
        raise ValueError(f"datagram of {len(datagram)} bytes has no frame header")
    return (
        int.from_bytes(datagram[0:2], "big"),
        int.from_bytes(datagram[2:4], "big"),
        int.from_bytes(datagram[4:6], "big"),
    )


class UdpClient:
    """One UDP socket talking memcache to `addr`; request ids count up from `first_id`."""

    def __init__(self, addr, timeout=2.0, bind=None, first_id=1):
        family = socket.AF_INET6 if ":" in addr[0] else socket.AF_INET
        self.addr = addr
        self.sock = socket.socket(family, socket.SOCK_DGRAM)
        if bind is not None:
            self.sock.bind(bind)
        self.sock.settimeout(timeout)
        self.timeout = timeout
        self.next_id = first_id

    def close(self):
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def send_raw(self, datagram):
        """Sends one datagram exactly as given (no header added)."""
        self.sock.sendto(datagram, self.addr)

    def new_id(self):
        rid = self.next_id & 0xFFFF
        self.next_id += 1
        return rid

    def datagrams(self, payload, request_id=None, timeout=None, settle=0.05):
        """Sends `payload` with a frame header; returns every reply datagram of that request
        (headers included): each response in sequence order, responses in arrival order,
        until one is complete and nothing follows within `settle` seconds. Raises
        TimeoutError when nothing (or an incomplete response) arrived in time; datagrams of
        other request ids (late replies to earlier requests) are skipped."""
        rid = self.new_id() if request_id is None else request_id
        self.send_raw(header(rid) + payload)
        return self.collect(rid, timeout, settle)

    def collect(self, request_id, timeout=None, settle=0.05):
        """Reads the reply datagrams of `request_id` (see `datagrams`)."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        done = []  # complete responses' datagrams, in order
        parts, count = {}, None  # the response being read
        while True:
            complete = count is not None and len(parts) >= count
            if complete:
                done.extend(parts[i] for i in sorted(parts))
                parts, count = {}, None
            if done and count is None:
                left = settle
            else:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"request {request_id}: {len(parts)} of {count} datagrams arrived"
                    )
            self.sock.settimeout(left)
            try:
                d = self.sock.recv(65536)
            except (socket.timeout, BlockingIOError):  # BlockingIOError: settle 0
                if done and count is None:
                    return done
                continue
            rid, seq, n = parse_header(d)
            if rid != request_id:
                continue
            if n == 0:  # an empty response: the header alone
                done.append(d)
                continue
            if seq in parts:  # a new response started (memcached numbers each from 0)
                done.extend(parts[i] for i in sorted(parts))
                parts = {}
            count = n
            parts[seq] = d

    def request(self, payload, request_id=None, timeout=None, settle=0.05):
        """Sends `payload`; returns the reply bytes (datagrams joined, headers stripped)."""
        return b"".join(d[8:] for d in self.datagrams(payload, request_id, timeout, settle))

    def silence(self, payload=None, wait=0.3, raw=None):
        """Sends `payload` (with a header) or `raw` (as is) and returns whatever arrives within
        `wait` seconds (the test expects nothing: dropped or noreply)."""
        if raw is not None:
            self.send_raw(raw)
        else:
            self.send_raw(header(self.new_id()) + payload)
        got = []
        deadline = time.monotonic() + wait
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return got
            self.sock.settimeout(left)
            try:
                got.append(self.sock.recv(65536))
            except socket.timeout:
                return got


def udp_addr_of(ready_line):
    """The `udp=HOST:PORT` address of a ringstore ready line."""
    fields = dict(f.split("=", 1) for f in ready_line.split()[1:])
    host, port = fields["udp"].rsplit(":", 1)
    return (host.strip("[]"), int(port))
