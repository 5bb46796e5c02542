"""Fixtures for the end-to-end tests: a real `ringstore serve` process on loopback."""

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time

import pytest

BIN = os.environ.get("RINGSTORE_BIN", os.path.join(os.path.dirname(__file__), "../../target/release/ringstore"))
# The I/O runtime every server here runs (`--io`; unset: the server's default, auto).
# `cargo xtask test` runs the suite a second time with RINGSTORE_IO=epoll (ADR 0033).
IO = os.environ.get("RINGSTORE_IO")
# What the epoll runtime refuses at start (ADR 0033): tests that need it are skipped there
# (--udp only together with --data: held UDP replies).
EPOLL_REFUSES = ("--xdp",)


def io_args(extra):
    """The `--io` flag for a server started with `extra` (none when it names one itself);
    skips the test when the chosen runtime does not serve what `extra` asks for."""
    if IO is None or any(str(a).startswith("--io") for a in extra):
        return []
    if IO == "epoll":
        def has(flag):
            return any(str(a) == flag or str(a).startswith(flag + "=") for a in extra)

        for flag in EPOLL_REFUSES:
            if has(flag):
                pytest.skip(f"{flag} is not served by the epoll runtime")
        if has("--udp") and has("--data"):
            pytest.skip("--udp with --data is not served by the epoll runtime")
    return ["--io", IO]


class Server:
    """A running `ringstore serve` with free loopback ports, parsed from its ready line."""

    def __init__(self, *extra, preexec_fn=None):
        self.proc = subprocess.Popen(
            [BIN, "serve", "--memcache", "127.0.0.1:0", "--http", "127.0.0.1:0", *io_args(extra), *extra],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            preexec_fn=preexec_fn,
        )
        deadline = time.monotonic() + 20
        line = b""
        # The ready line is the first line on stdout; bounded wait.
        os.set_blocking(self.proc.stdout.fileno(), False)
        while time.monotonic() < deadline and not line.endswith(b"\n"):
            chunk = self.proc.stdout.read(256) or b""
            line += chunk
            if self.proc.poll() is not None:
                break
            if not chunk:
                time.sleep(0.02)
        text = line.decode().strip()
        assert text.startswith("ready "), f"no ready line, got {text!r}, stderr={self.stderr_text()!r}"
        self.ready = text
        fields = dict(f.split("=", 1) for f in text.split()[1:])
        host, port = fields["memcache"].rsplit(":", 1)
        self.mc = (host, int(port))
        host, port = fields["http"].rsplit(":", 1)
        self.http = (host, int(port))
        self.base = f"http://{host}:{port}"

    def stderr_text(self):
        if self.proc.poll() is None:
            return ""
        return self.proc.stderr.read().decode(errors="replace")

    def alive(self):
        return self.proc.poll() is None

    def rss_bytes(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")

    def stop(self, sig=signal.SIGTERM, timeout=10):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                return self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise
        return self.proc.returncode


@pytest.fixture
def server_factory():
    started = []

    def start(*extra, **kwargs):
        s = Server(*extra, **kwargs)
        started.append(s)
        return s

    yield start
    for s in started:
        if s.proc.poll() is None:
            s.proc.kill()
            s.proc.wait()


@pytest.fixture
def server(server_factory):
    return server_factory("--memory", "64MiB")


@pytest.fixture
def memcached():
    """A fresh real memcached (1.6.18 here) on a free loopback port, for side-by-side tests."""
    with real_memcached() as addr:
        yield addr


def raw(addr, payload, expect_close=False, timeout=5.0, read_until=None):
    """Sends raw bytes and returns what the server answered (until close, timeout or marker)."""
    s = socket.create_connection(addr, timeout=timeout)
    try:
        s.sendall(payload)
        data = b""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if read_until is not None and read_until in data:
                break
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                break
            if not chunk:
                break
            data += chunk
        return data
    finally:
        s.close()


@contextlib.contextmanager
def real_memcached(udp=False, extra=(), env=None):
    """A real memcached on a free loopback port (also on UDP, same port, when `udp`), with
    `extra` arguments and `env` as its environment; yields its address. Skips the test when
    memcached is not installed."""
    path = shutil.which("memcached")
    if path is None:
        pytest.skip("memcached is not installed")
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    args = [path, "-U", str(port) if udp else "0", "-l", "127.0.0.1", "-p", str(port)]
    if os.geteuid() == 0:
        args += ["-u", "nobody"]
    args += list(extra)
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "memcached did not start"
                time.sleep(0.05)
        yield ("127.0.0.1", port)
    finally:
        proc.kill()
        proc.wait()


LONG_IDLE_S = 310  # past ringstore's old default idle timeout (300 s)


class LongIdle:
    """The Perl idle-connection clients against ringstore (default idle timeout) and a real
    memcached, started when `test_idle.py`'s long test is collected, so their 310 s sleep
    runs beside the rest of the suite."""

    def __init__(self):
        import test_idle  # the script's runner lives beside the tests that use it

        self.stack = contextlib.ExitStack()
        self.server = Server("--memory", "16MiB")
        self.stack.callback(self.server.proc.kill)
        theirs = self.stack.enter_context(real_memcached())
        self.procs = [test_idle.perl_idle(addr, LONG_IDLE_S) for addr in (self.server.mc, theirs)]
        for p in self.procs:
            self.stack.callback(p.kill)

    def results(self):
        """Each client run's sorted lines (ringstore's, memcached's), waiting for them."""
        import test_idle

        try:
            return [test_idle.perl_lines(p, timeout=LONG_IDLE_S + 60) for p in self.procs]
        finally:
            self.close()

    def close(self):
        self.stack.close()


_long_idle = []


def pytest_configure(config):
    config.addinivalue_line("markers", "long_idle: waits for the background idle clients; runs last")


@pytest.hookimpl(trylast=True)  # after `-k`/`-m` deselection
def pytest_collection_modifyitems(session, config, items):
    """Moves the `long_idle` test to the end and starts its clients now."""
    _skip_for_epoll(items)
    long = [i for i in items if i.get_closest_marker("long_idle")]
    if not long:
        return
    items[:] = [i for i in items if not i.get_closest_marker("long_idle")] + long
    _long_idle.append(LongIdle())


def pytest_sessionfinish(session, exitstatus):
    for background in _long_idle:
        background.close()


@pytest.fixture
def long_idle():
    assert _long_idle, "started at collection"
    return _long_idle[0]


# Whole modules about what the epoll runtime refuses (AF_XDP), or that start their servers
# elsewhere (`xtask scaleout`, memcached's own t/ harness): on RINGSTORE_IO=epoll they
# would only repeat the io_uring run. The data device and UDP are served by both (durable, hardening, external, udp run
# twice).
EPOLL_SKIPS_MODULES = ("test_xdp.py", "test_scaleout.py", "test_memcached_t.py")


def _skip_for_epoll(items):
    """On RINGSTORE_IO=epoll: skips what that run would only repeat (the 310 s idle wait
    too: the idle timeout is the shared connection table's, run once on io_uring)."""
    if IO != "epoll":
        return
    items[:] = [i for i in items if not i.get_closest_marker("long_idle")]
    skip = pytest.mark.skip(reason="not served by the epoll runtime, or not started through these fixtures")
    for item in items:
        if os.path.basename(str(item.fspath)) in EPOLL_SKIPS_MODULES:
            item.add_marker(skip)


# Under CI=true a skipped test is a failure (`cargo xtask test` installs every tool these
# tests use, so a skip there means a check that passed without checking), except for these
# deliberate skips, each by the start of its reason and why it is one:
CI_ALLOWED_SKIPS = {
    # EPOLL_SKIPS_MODULES above: whole modules the RINGSTORE_IO=epoll run would only repeat.
    "not served by the epoll runtime, or not started through these fixtures": "EPOLL_SKIPS_MODULES",
    # EPOLL_REFUSES and --udp with --data: the epoll runtime refuses them at start (ADR 0033),
    # and the io_uring run of the same suite serves them.
    "--xdp is not served by the epoll runtime": "the epoll runtime refuses --xdp (ADR 0033)",
    "--udp with --data is not served by the epoll runtime": "the epoll runtime refuses it (ADR 0033)",
    # The host kernel decides which of two paths a TLS session takes: with the tls module
    # loaded, the user-space paths are proved in QEMU (`tls_kernel_offload_and_rotation`,
    # its boot with tls_kernel_offload off); without it, these tests run here.
    "this kernel has TLS offload": "user-space TLS is proved in QEMU on such a host",
}


def _ci():
    return os.environ.get("CI", "").lower() in ("true", "1")


def _skip_reason(report):
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return text.removeprefix("Skipped: ")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under CI=true: a skip whose reason is not in CI_ALLOWED_SKIPS fails the test."""
    outcome = yield
    report = outcome.get_result()
    if not (_ci() and report.skipped) or hasattr(report, "wasxfail"):
        return
    reason = _skip_reason(report)
    if any(reason.startswith(allowed) for allowed in CI_ALLOWED_SKIPS):
        return
    report.outcome = "failed"
    report.longrepr = (
        f"skipped under CI=true, which fails instead (cargo xtask test installs every tool; "
        f"deliberate skips are listed in conftest.CI_ALLOWED_SKIPS): {reason}"
    )
