"""TLS end to end (issue 19, ADR 0031): memcache over TLS with pymemcache beside memcached
1.6.18 `-Z`, HTTPS with curl, client certificates under `--tls-verify require`, what a hostile
or confused client gets (plaintext to the TLS port, TLS to the plain port, handshakes that
never finish), and certificate reload (`refresh_certs`, SIGHUP).

Every certificate and key is made here, at test time, with `cryptography` (a throwaway CA;
nothing is committed).
"""

import datetime
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time

import pytest
from pymemcache.client.base import Client

from conftest import raw

crypto = pytest.importorskip("cryptography")
from cryptography import x509  # noqa: E402
from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID  # noqa: E402

MiB = 1 << 20


def _name(cn):
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _cert(subject, key, issuer, issuer_key, *, ca=False, server=False, days=(-1, 2)):
    now = datetime.datetime.now(datetime.timezone.utc)
    b = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(_name(issuer))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now + datetime.timedelta(days=days[0]))
        .not_valid_after(now + datetime.timedelta(days=days[1]))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        b = b.add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
    elif server:
        b = b.add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(__import__("ipaddress").ip_address("127.0.0.1"))]
            ),
            critical=False,
        ).add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    else:
        b = b.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
    return b.sign(issuer_key, hashes.SHA256())


def _write(path, cert, key):
    with open(f"{path}.pem", "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
    with open(f"{path}.key", "wb") as f:
        f.write(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
    # memcached drops to `nobody` before it reads them: test material only.
    os.chmod(f"{path}.pem", 0o644)
    os.chmod(f"{path}.key", 0o644)


class Certs:
    def __init__(self, d):
        self.dir = d

    def __getitem__(self, name):
        return os.path.join(self.dir, name)


@pytest.fixture(scope="module")
def certs():
    d = tempfile.mkdtemp(prefix="ringstore-tls-")
    os.chmod(d, 0o755)
    keys = {}

    def key():
        return ec.generate_private_key(ec.SECP256R1())

    for ca in ("ca", "otherca"):
        keys[ca] = key()
        _write(os.path.join(d, ca), _cert(ca, keys[ca], ca, keys[ca], ca=True), keys[ca])
    for name, issuer, kw in [
        ("server", "ca", {"server": True}),
        ("server2", "ca", {"server": True}),
        ("client", "ca", {}),
        ("stranger", "otherca", {}),
        ("expired", "ca", {"days": (-10, -1)}),
    ]:
        k = key()
        _write(os.path.join(d, name), _cert(name, k, issuer, keys[issuer], **kw), k)
    yield Certs(d)
    shutil.rmtree(d, ignore_errors=True)


def fields(server):
    f = dict(x.split("=", 1) for x in server.ready.split()[1:])
    return {k: (v.rsplit(":", 1)[0], int(v.rsplit(":", 1)[1])) for k, v in f.items()}


def tls_server(server_factory, certs, *extra, cert="server"):
    return server_factory(
        "--memcache-tls", "127.0.0.1:0", "--https", "127.0.0.1:0",
        "--tls-cert", certs[f"{cert}.pem"], "--tls-key", certs[f"{cert}.key"], *extra,
    )


def client_context(certs, who=None):
    ctx = ssl.create_default_context(cafile=certs["ca.pem"])
    if who:
        ctx.load_cert_chain(certs[f"{who}.pem"], certs[f"{who}.key"])
    return ctx


def tls_connect(addr, ctx, timeout=5):
    s = socket.create_connection(addr, timeout=timeout)
    return ctx.wrap_socket(s, server_hostname="localhost")


def ask(sock, payload, until=b"\r\n"):
    sock.sendall(payload)
    data = b""
    while not data.endswith(until):
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def stats(addr):
    out = raw(addr, b"stats\r\n", read_until=b"END\r\n")
    return {
        p[1].decode(): p[2].decode()
        for p in (line.split(b" ", 2) for line in out.split(b"\r\n"))
        if len(p) == 3 and p[0] == b"STAT"
    }


def session(client):
    """One pymemcache session; the results, for comparing two servers."""
    big = os.urandom(300 * 1024)
    got = [
        client.set("k", b"v1"),
        client.get("k"),
        client.add("k", b"x"),
        client.set("n", b"10"),
        client.incr("n", 5),
        client.set("big", big),
        client.get("big") == big,
        sorted(client.get_many(["k", "n", "missing"]).items()),
        client.delete("k"),
        client.get("k"),
    ]
    client.close()
    return got


def memcached_tls(certs, options=""):
    path = shutil.which("memcached")
    if path is None:
        pytest.skip("memcached is not installed")
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    args = [path, "-U", "0", "-l", "127.0.0.1", "-p", str(port), "-Z",
            "-o", f"ssl_chain_cert={certs['server.pem']},ssl_key={certs['server.key']}{options}"]
    if os.geteuid() == 0:
        args += ["-u", "nobody"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, ("127.0.0.1", port)
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.skip(f"memcached -Z did not start: {proc.stderr.read()!r}")
            time.sleep(0.05)


def test_pymemcache_over_tls_answers_as_memcached_does(server_factory, certs):
    server = tls_server(server_factory, certs)
    ctx = client_context(certs)
    ours = session(Client(fields(server)["memcache_tls"], tls_context=ctx, timeout=5))
    proc, addr = memcached_tls(certs)
    try:
        theirs = session(Client(addr, tls_context=ctx, timeout=5))
    finally:
        proc.kill()
        proc.wait()
    assert ours == theirs
    assert ours[6] is True
    st = stats(server.mc)
    assert int(st["tls_handshakes"]) >= 1
    assert st["ssl_handshake_errors"] == st["tls_handshake_errors"] == "0"
    assert st["tls_ktls_tx"] == "0"  # this host's kernel has no CONFIG_TLS
    # memcached -Z says ssl_enabled yes in `stats settings` (t/ssl_settings.t's first check).
    settings = raw(server.mc, b"stats settings\r\n", read_until=b"END\r\n")
    assert b"STAT ssl_enabled yes\r\n" in settings


def ssl_settings(sock):
    out = ask(sock, b"stats settings\r\n", b"END\r\n")
    return {
        p[1]: p[2]
        for p in (line.split(b" ", 2) for line in out.split(b"\r\n"))
        if len(p) == 3 and p[1] in SSL_SETTINGS
    }


# The `stats settings` lines of memcached -Z that ringstore has a counterpart for.
SSL_SETTINGS = [b"ssl_enabled", b"ssl_chain_cert", b"ssl_key", b"ssl_verify_mode",
                b"ssl_ca_cert", b"ssl_min_version", b"auth_enabled_ascii",
                b"auth_enabled_sasl"]


@pytest.mark.parametrize("verify,mode", [("none", None), ("require", 2)])
def test_stats_settings_list_the_tls_settings_as_memcached_does(server_factory, certs, verify, mode):
    extra = ["--tls-min-version", "1.3"]
    options = ",ssl_min_version=3"
    if mode is not None:
        extra += ["--tls-ca", certs["ca.pem"], "--tls-verify", verify]
        options += f",ssl_ca_cert={certs['ca.pem']},ssl_verify_mode={mode}"
    server = tls_server(server_factory, certs, *extra)
    who = "client" if mode else None
    with tls_connect(fields(server)["memcache_tls"], client_context(certs, who)) as s:
        ours = ssl_settings(s)
    proc, addr = memcached_tls(certs, options)
    try:
        with tls_connect(addr, client_context(certs, who)) as s:
            theirs = ssl_settings(s)
    finally:
        proc.kill()
        proc.wait()
    assert ours == theirs
    assert sorted(ours) == sorted(SSL_SETTINGS)
    assert ours[b"ssl_chain_cert"] == certs["server.pem"].encode()
    assert ours[b"ssl_verify_mode"] == (b"3" if mode else b"0")


def test_tls12_and_min_version(server_factory, certs):
    server = tls_server(server_factory, certs)
    ctx = client_context(certs)
    ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    with tls_connect(fields(server)["memcache_tls"], ctx) as s:
        assert s.version() == "TLSv1.2"
        assert ask(s, b"set a 0 0 1\r\nx\r\nget a\r\n", b"END\r\n") == b"STORED\r\nVALUE a 0 1\r\nx\r\nEND\r\n"
    strict = tls_server(server_factory, certs, "--tls-min-version", "1.3")
    with pytest.raises((ssl.SSLError, ConnectionError)):
        tls_connect(fields(strict)["memcache_tls"], ctx).recv(1)


def test_client_certificates_under_require(server_factory, certs):
    server = tls_server(server_factory, certs, "--tls-ca", certs["ca.pem"], "--tls-verify", "require")
    addr = fields(server)["memcache_tls"]
    with tls_connect(addr, client_context(certs, "client")) as s:
        assert ask(s, b"version\r\n").startswith(b"VERSION ")
    for who in (None, "stranger", "expired"):
        with pytest.raises((ssl.SSLError, ConnectionError, socket.timeout)):
            s = tls_connect(addr, client_context(certs, who))
            # TLS 1.3: the server's verdict on the client's certificate comes after the
            # client's handshake is done; the first read sees the alert (or the close).
            s.sendall(b"version\r\n")
            if not s.recv(100):
                raise ConnectionError("closed")
    assert int(stats(server.mc)["ssl_handshake_errors"]) >= 3


def test_curl_over_https(server_factory, certs):
    server = tls_server(server_factory, certs)
    host, port = fields(server)["https"]
    base = f"https://localhost:{port}"

    def curl(*args):
        out = subprocess.run(
            ["curl", "-sS", "--cacert", certs["ca.pem"], "--max-time", "10", "-o", "-",
             "-w", "\n%{http_code} %{http_version}", *args],
            capture_output=True, check=True,
        )
        body, _, tail = out.stdout.rpartition(b"\n")
        code, version = tail.decode().split()
        return int(code), version, body, out.stderr

    code, _, _, _ = curl("-X", "PUT", "--data-binary", "hello tls", f"{base}/obj")
    assert code in (201, 204)
    code, version, body, _ = curl(f"{base}/obj")
    assert (code, version, body) == (200, "1.1", b"hello tls")
    v = subprocess.run(["curl", "-sv", "--cacert", certs["ca.pem"], f"{base}/obj"], capture_output=True)
    assert b"ALPN: server accepted http/1.1" in v.stderr or b"ALPN, server accepted to use http/1.1" in v.stderr
    code, _, _, _ = curl("-X", "DELETE", f"{base}/obj")
    assert code == 204
    code, _, _, _ = curl(f"{base}/obj")
    assert code == 404


def test_plaintext_to_the_tls_port_gets_an_alert_and_a_close(server_factory, certs):
    server = tls_server(server_factory, certs)
    for payload in (b"get foo\r\n", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", os.urandom(64)):
        for port in ("memcache_tls", "https"):
            got = raw(fields(server)[port], payload, timeout=3)
            # One TLS alert record (type 21, 2 bytes: fatal + reason), then the close.
            assert len(got) == 7 and got[0] == 21 and got[5] == 2, (payload, got)


def test_tls_to_the_plain_port_is_a_memcache_error(server_factory, certs):
    server = tls_server(server_factory, certs)
    with pytest.raises(ssl.SSLError):
        tls_connect(server.mc, client_context(certs))
    assert raw(server.mc, b"version\r\n").startswith(b"VERSION ")


def test_refresh_certs_and_sighup_change_new_handshakes_only(server_factory, certs, tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    shutil.copy(certs["server.pem"], cert)
    shutil.copy(certs["server.key"], key)
    server = server_factory(
        "--memcache-tls", "127.0.0.1:0", "--tls-cert", str(cert), "--tls-key", str(key)
    )
    addr = fields(server)["memcache_tls"]
    ctx = client_context(certs)

    def served_cert():
        with tls_connect(addr, ctx) as s:
            return x509.load_der_x509_certificate(s.getpeercert(binary_form=True)).subject.rfc4514_string()

    assert served_cert() == "CN=server"
    old = tls_connect(addr, ctx)
    shutil.copy(certs["server2.pem"], cert)
    shutil.copy(certs["server2.key"], key)
    assert ask(old, b"refresh_certs\r\n") == b"OK\r\n"
    assert served_cert() == "CN=server2"
    assert ask(old, b"set o 0 0 2\r\nok\r\nget o\r\n", b"END\r\n").endswith(b"ok\r\nEND\r\n")
    assert int(stats(server.mc)["time_since_server_cert_refresh"]) <= 2
    shutil.copy(certs["server.pem"], cert)
    shutil.copy(certs["server.key"], key)
    server.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 5
    while served_cert() != "CN=server":
        assert time.monotonic() < deadline, "SIGHUP did not reload"
        time.sleep(0.1)
    # A broken key: the reload fails, the certificates in use stay.
    key.write_bytes(b"not a key")
    time.sleep(1.1)  # past the one-refresh-a-second limit: this answer is the broken key's
    reply = ask(old, b"refresh_certs\r\n")
    assert reply.startswith(b"Error ") and b"too soon" not in reply, reply
    assert reply.endswith(b"\r\n") and reply.count(b"\r\n") == 1
    assert served_cert() == "CN=server"
    old.close()
    assert server.alive()


def test_refresh_certs_without_tls_answers_as_memcached(server, memcached):
    assert raw(server.mc, b"refresh_certs\r\n") == raw(memcached, b"refresh_certs\r\n")


def test_tls_only_refuses_plain_listeners(certs):
    from conftest import BIN

    base = [BIN, "serve", "--memcache-tls", "127.0.0.1:0", "--tls-cert", certs["server.pem"],
            "--tls-key", certs["server.key"], "--tls-only", "on"]
    for extra in (["--http", "off"], ["--memcache", "off", "--http", "off", "--udp", "127.0.0.1:0"]):
        p = subprocess.run(base + extra, capture_output=True, timeout=20)
        assert p.returncode == 2
        lines = p.stderr.decode().strip().splitlines()
        assert len(lines) == 1 and "tls-only" in lines[0], lines
    # A key that is not a key: one line, exit 2.
    p = subprocess.run(
        [BIN, "serve", "--memcache", "off", "--http", "off", "--memcache-tls", "127.0.0.1:0",
         "--tls-cert", certs["server.pem"], "--tls-key", certs["server.pem"]],
        capture_output=True, timeout=20,
    )
    assert p.returncode == 2 and len(p.stderr.decode().strip().splitlines()) == 1, p.stderr


def test_renegotiation_is_refused(server_factory, certs):
    server = tls_server(server_factory, certs)
    host, port = fields(server)["memcache_tls"]
    script = "printf 'version\\n'; sleep 0.5; printf 'R\\n'; sleep 0.5; printf 'version\\n'; sleep 0.5"
    out = subprocess.run(
        f"({script}) | openssl s_client -connect {host}:{port} -tls1_2 -CAfile {certs['ca.pem']}"
        " -servername localhost -crlf",
        shell=True, capture_output=True, timeout=20,
    )
    text = out.stdout + out.stderr
    assert b"RENEGOTIATING" in text
    # rustls answers the second ClientHello with a no_renegotiation alert; nothing after
    # it is served.
    assert b"no renegotiation" in text
    assert text.count(b"VERSION ") == 1
    assert raw(server.mc, b"version\r\n").startswith(b"VERSION ")


def test_the_startup_probe_alone_decides_where_sessions_run(server_factory, certs):
    """On a kernel without TLS (this host) the startup probe says so once and every session
    runs in user space; where the kernel has it, every session goes to the kernel. Never a
    per-session fallback on a loopback session that finishes normally (the QEMU test
    `tls_kernel_offload_and_rotation` has a peer whose reset makes one, counted)."""
    has_tls = os.path.exists("/sys/module/tls") or (
        shutil.which("modprobe") is not None
        and subprocess.run(["modprobe", "-q", "tls"], capture_output=True).returncode == 0
    )
    server = tls_server(server_factory, certs)
    for _ in range(3):
        with tls_connect(fields(server)["memcache_tls"], client_context(certs)) as s:
            assert ask(s, b"set u 0 0 1\r\n1\r\nget u\r\n", b"END\r\n").endswith(b"END\r\n")
    st = stats(server.mc)
    kernel = "3" if has_tls else "0"
    assert (st["tls_handshakes"], st["tls_ktls_tx"], st["tls_ktls_rx"]) == ("3", kernel, kernel)
    assert st["tls_ktls_fallbacks"] == "0"
    assert server.stop() == 0
    log = server.proc.stderr.read().decode()
    line = "tls with kernel offload" if has_tls else "tls in user space (the kernel has no TLS"
    assert log.count(line) == 1, log


def test_a_nagle_client_is_not_held_by_a_delayed_ack(server_factory, certs):
    # Without session tickets the server has nothing to say after the client's Finished; a
    # client with Nagle on (pymemcache's default) then waits for the delayed ACK (40 ms)
    # before its first request goes out. Measured before the fix: 22 handshakes/s.
    server = tls_server(server_factory, certs)
    addr = fields(server)["memcache_tls"]
    ctx = client_context(certs)
    start = time.monotonic()
    for _ in range(20):
        with tls_connect(addr, ctx) as s:
            assert ask(s, b"version\r\n").startswith(b"VERSION ")
    assert (time.monotonic() - start) / 20 < 0.025
