"""`--log-sink` end to end (issue 33, ADR 0045): a real rsyslog (Debian's `rsyslog`, and
`rsyslog-gnutls` for TLS), started here with its own configuration as a foreground process,
receives RFC 5424 lines from `ringstore serve` over UDP, TCP (octet counting) and TLS; a
receiver that never reads and one that is not there cost the server nothing but dropped
lines, counted in `stats` (`log_lines_dropped`) and reported once a receiver takes lines again.

The TLS receiver's CA and certificate are made here, at test time (test_tls.py's helpers).
"""

import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time

import pytest
from pymemcache.client.base import Client

from test_tls import _cert, _write, ec, stats

RSYSLOGD = shutil.which("rsyslogd") or ("/usr/sbin/rsyslogd" if os.path.exists("/usr/sbin/rsyslogd") else None)
GTLS = "/usr/lib/x86_64-linux-gnu/rsyslog/lmnsd_gtls.so"

# <PRI>1 TIMESTAMP HOSTNAME APP-NAME PROCID MSGID [SD] MSG (RFC 5424), as ringstore writes it.
LINE = re.compile(
    r'^<(\d+)>1 (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z) (\S+) ringstore (\d+) (\S+) '
    r'\[ringstore@32473 boot="([^"]*)" component="([^"]*)"\] (.*)$'
)
DROPPED = re.compile(rb"\] (\d+) lines dropped")


def free_port(kind=socket.SOCK_STREAM):
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what, check, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def need_rsyslog(tls=False):
    # Under CI=true a skip fails the test (conftest): `cargo xtask test` installs both packages.
    if RSYSLOGD is None:
        pytest.skip("rsyslogd is not installed (Debian: rsyslog)")
    if tls and not os.path.exists(GTLS):
        pytest.skip("rsyslog's gtls driver is not installed (Debian: rsyslog-gnutls)")


class Rsyslog:
    """rsyslogd in the foreground (`-n`) with its own configuration in a temporary folder,
    writing each message it receives, as received, to `received.log` there."""

    def __init__(self, transport, port):
        self.dir = tempfile.mkdtemp(prefix="ringstore-rsyslog-")
        self.port = port
        self.out = os.path.join(self.dir, "received.log")
        conf = os.path.join(self.dir, "rsyslog.conf")
        with open(conf, "w") as f:
            f.write(self._config(transport))
        self.proc = subprocess.Popen(
            [RSYSLOGD, "-n", "-f", conf, "-i", os.path.join(self.dir, "rsyslogd.pid")],
            stdout=subprocess.DEVNULL,
            stderr=open(os.path.join(self.dir, "rsyslogd.stderr"), "wb"),
        )
        wait_for("rsyslogd to listen", lambda: self._listening(transport), timeout=15)

    def _config(self, transport):
        d = self.dir
        head = (
            f'global(workDirectory="{d}" net.enableDNS="off")\n'
            'template(name="raw" type="string" string="%rawmsg%\\n")\n'
        )
        if transport == "udp":
            inputs = f'module(load="imudp")\ninput(type="imudp" address="127.0.0.1" port="{self.port}")\n'
        elif transport == "tcp":
            inputs = f'module(load="imtcp")\ninput(type="imtcp" address="127.0.0.1" port="{self.port}")\n'
        else:
            make_receiver_certs(d)
            inputs = (
                f'global(DefaultNetstreamDriver="gtls" DefaultNetstreamDriverCAFile="{d}/ca.pem" '
                f'DefaultNetstreamDriverCertFile="{d}/receiver.pem" DefaultNetstreamDriverKeyFile="{d}/receiver.key")\n'
                'module(load="imtcp" StreamDriver.Name="gtls" StreamDriver.Mode="1" StreamDriver.AuthMode="anon")\n'
                f'input(type="imtcp" address="127.0.0.1" port="{self.port}")\n'
            )
        action = f'action(type="omfile" file="{self.out}" template="raw" flushOnTXEnd="on" asyncWriting="off")\n'
        return head + inputs + action

    def _listening(self, transport):
        if self.proc.poll() is not None:
            raise AssertionError(f"rsyslogd exited: {self.stderr()}")
        table = "/proc/net/udp" if transport == "udp" else "/proc/net/tcp"
        with open(table) as f:
            return any(f":{self.port:04X} " in line.split()[1] + " " for line in list(f)[1:])

    def stderr(self):
        with open(os.path.join(self.dir, "rsyslogd.stderr"), errors="replace") as f:
            return f.read()

    def lines(self):
        try:
            with open(self.out, errors="replace") as f:
                return [l.rstrip("\n") for l in f if " ringstore " in l]
        except FileNotFoundError:
            return []

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def make_receiver_certs(d):
    """A throwaway CA (`ca.pem`) and the receiver's certificate for 127.0.0.1 signed by it."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    _write(os.path.join(d, "ca"), _cert("ca", ca_key, "ca", ca_key, ca=True), ca_key)
    key = ec.generate_private_key(ec.SECP256R1())
    _write(os.path.join(d, "receiver"), _cert("receiver", key, "ca", ca_key, server=True), key)


@pytest.fixture
def rsyslog():
    started = []

    def start(transport, port=None):
        need_rsyslog(tls=transport == "tls")
        r = Rsyslog(transport, port or free_port(socket.SOCK_DGRAM if transport == "udp" else socket.SOCK_STREAM))
        started.append(r)
        return r

    yield start
    for r in started:
        r.stop()


def quiet_stderr():
    # The server's own stderr goes nowhere here: the fixture's pipe is read only at exit, and
    # a flood of lines would fill it (the sink's tee passes every line on to it first).
    fd = os.open(os.devnull, os.O_WRONLY)
    os.dup2(fd, 2)


def check_line(line, server, component="server"):
    m = LINE.match(line)
    assert m, f"not an RFC 5424 line as ringstore writes it: {line!r}"
    pri, stamp, host, procid, msgid, boot, comp, _ = m.groups()
    assert int(pri) in (27, 28, 29, 30), line  # daemon facility, error..info
    assert host == socket.gethostname(), line
    assert int(procid) == server.proc.pid, line
    assert msgid == comp == component, line
    with open("/proc/sys/kernel/random/boot_id") as f:
        assert boot == f.read().strip(), line
    sent = time.mktime(time.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S")) - time.timezone
    assert abs(sent - time.time()) < 300, f"timestamp {stamp} is not now"


@pytest.mark.parametrize("transport", ["udp", "tcp", "tls"])
def test_rsyslog_receives_rfc5424_lines(server_factory, rsyslog, transport):
    receiver = rsyslog(transport)
    extra = ["--log-sink", f"{transport}://127.0.0.1:{receiver.port}"]
    if transport == "tls":
        extra += ["--tls-ca", os.path.join(receiver.dir, "ca.pem")]
    server = server_factory("--memory", "64MiB", *extra, "--http-tokens", tokens_file(receiver.dir))
    shipped = wait_for(
        "the server's start line at rsyslog",
        lambda: [l for l in receiver.lines() if "log-sink: shipping this log to" in l],
    )
    check_line(shipped[0], server)
    # A line written while serving arrives too: a SIGHUP's reload outcome.
    server.proc.send_signal(signal.SIGHUP)
    reload = wait_for("the reload line", lambda: [l for l in receiver.lines() if "http-tokens reloaded: 1 tokens" in l])
    check_line(reload[-1], server)
    client = Client(server.mc)
    assert client.set("k", b"v", noreply=False) and client.get("k") == b"v"
    assert stats(server.mc)["log_lines_dropped"] == "0"


def tokens_file(d):
    path = os.path.join(d, "tokens")
    with open(path, "w") as f:
        f.write("reader " + "0" * 64 + " read\n")
    return path


def flood(server, least=2.0, most=20.0):
    """Makes the server log as fast as its signal loop runs (each SIGHUP writes a reload line)
    for at least `least` seconds and until the sink's queue overflowed (bounded by `most`)."""
    start = time.monotonic()
    while server.alive() and time.monotonic() - start < most:
        for _ in range(200):
            server.proc.send_signal(signal.SIGHUP)
            time.sleep(0.0005)
        if time.monotonic() - start >= least and stats(server.mc)["log_lines_dropped"] != "0":
            return


def serving_stays_normal(server, during):
    """Round trips while `during` runs: every one answered, none slow (a bound, not a benchmark)."""
    client = Client(server.mc, connect_timeout=5, timeout=5)
    assert client.set("probe", b"x" * 100, noreply=False)
    worst = 0.0
    t = threading.Thread(target=during)
    rss_before = server.rss_bytes()
    t.start()
    n = 0
    while t.is_alive() or n < 200:
        start = time.monotonic()
        assert client.get("probe") == b"x" * 100
        worst = max(worst, time.monotonic() - start)
        n += 1
    t.join()
    assert worst < 0.5, f"a round trip took {worst:.3f}s while the log sink was stuck"
    # The queue holds at most 1024 lines of at most 2 KiB.
    grown = server.rss_bytes() - rss_before
    assert grown < 16 << 20, f"RSS grew {grown} bytes"


class NeverReads:
    """A TCP receiver that accepts and never reads (until `drain`), with small buffers."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.conns = []
        self.stop = False
        self.data = b""
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self):
        self.sock.settimeout(0.2)
        while not self.stop:
            try:
                conn, _ = self.sock.accept()
            except socket.timeout:
                continue
            self.conns.append(conn)

    def drain(self, timeout=15):
        """Reads every connection, new ones too, until a drop report arrives."""

        def report():
            for c in list(self.conns):
                c.setblocking(False)
                try:
                    while chunk := c.recv(65536):
                        self.data += chunk
                except (BlockingIOError, ConnectionError):
                    pass
            return DROPPED.search(self.data)

        return wait_for("a 'lines dropped' report", report, timeout=timeout)

    def close(self):
        self.stop = True
        self.thread.join()
        for c in self.conns:
            c.close()
        self.sock.close()


def flooded_server(server_factory, port, d):
    """A server shipping to `port` that logged a flood while it served (its tokens file in the
    test's own directory `d`); its dropped count."""
    server = server_factory(
        "--memory", "64MiB", "--log-sink", f"tcp://127.0.0.1:{port}",
        "--http-tokens", tokens_file(d), preexec_fn=quiet_stderr,
    )
    serving_stays_normal(server, lambda: flood(server))
    dropped = int(stats(server.mc)["log_lines_dropped"])
    assert dropped > 0, "the flood filled the queue: lines must have been dropped"
    return server, dropped


def test_a_receiver_that_never_reads_costs_dropped_lines_only(server_factory, tmp_path):
    receiver = NeverReads()
    try:
        server, dropped = flooded_server(server_factory, receiver.port, tmp_path)
        report = receiver.drain()
        # Lines of SIGHUPs still pending when the flood ended may be dropped after `dropped`.
        assert 0 < int(report.group(1)) <= int(stats(server.mc)["log_lines_dropped"])
        assert server.alive()
    finally:
        receiver.close()


def test_an_unreachable_receiver_costs_dropped_lines_then_they_are_reported(server_factory, rsyslog, tmp_path):
    need_rsyslog()
    port = free_port()
    server, dropped = flooded_server(server_factory, port, tmp_path)
    receiver = rsyslog("tcp", port)
    report = wait_for("the drop report at rsyslog", lambda: [l for l in receiver.lines() if "lines dropped" in l])
    check_line(report[0], server, component="log-sink")
    reported = int(DROPPED.search(report[0].encode()).group(1))
    assert 0 < reported <= int(stats(server.mc)["log_lines_dropped"]) and dropped > 0
    # The queue kept the oldest lines: the start line comes right after the report.
    lines = receiver.lines()
    assert any("log-sink: shipping this log to" in l for l in lines), lines[:3]
    assert server.alive()
