"""Real clients over TLS (issue 19): ruby-dalli 3.0.6 with `ssl_context` against ringstore and
memcached 1.6.18 `-Z` on the same certificates, aria2c and wget over HTTPS with the CA,
Python `ssl` with a client certificate under `--tls-verify require` against both servers,
and a verified client certificate standing in for an HTTP bearer token (`--http-tokens`
`subject:` lines). Debian ships Dalli 3.0.6, not Dalli 4: that is the version tested here.
"""

import datetime
import hashlib
import http.client
import os
import shutil
import socket
import ssl
import subprocess
import time

import pytest

from test_tls import ask, certs, client_context, fields, tls_connect, tls_server  # noqa: F401

from cryptography import x509  # noqa: E402
from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID  # noqa: E402


def memcached_tls(certs, *options):
    """memcached -Z on the server certificate; `options` join its `-o` list."""
    path = shutil.which("memcached")
    if path is None:
        pytest.skip("memcached is not installed")
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    opts = ",".join([f"ssl_chain_cert={certs['server.pem']}", f"ssl_key={certs['server.key']}", *options])
    args = [path, "-U", "0", "-l", "127.0.0.1", "-p", str(port), "-Z", "-o", opts]
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


DALLI = r"""
require 'dalli'
require 'openssl'
host, ca = ARGV
ctx = OpenSSL::SSL::SSLContext.new
ctx.ca_file = ca
ctx.verify_mode = OpenSSL::SSL::VERIFY_PEER
ctx.verify_hostname = false
c = Dalli::Client.new(host, ssl_context: ctx, socket_timeout: 5, socket_max_failures: 1)
big = 'x' * (300 * 1024)
got = []
got << c.set('dalli', 'v1')
got << c.get('dalli')
got << c.add('dalli', 'v2')
got << c.set('n', '10', 0, raw: true)
got << c.incr('n', 5)
got << c.set('big', big)
got << (c.get('big') == big)
# get_multi is not used: Dalli 3.0.6's fails on Debian's Ruby 3.1 before it sends anything
# (NoMethodError `server' in Client#get_multi_yielder), on either server.
got << c.get('n')
got << c.append('n', '0')
got << c.delete('dalli')
got << c.get('dalli').inspect
puts "got #{got.map(&:to_s).join('|')}"
"""


def dalli(addr, ca):
    if shutil.which("ruby") is None or subprocess.run(["ruby", "-e", "require 'dalli'"],
                                                      capture_output=True).returncode:
        pytest.skip("ruby-dalli is not installed")
    out = subprocess.run(["ruby", "-e", DALLI, f"{addr[0]}:{addr[1]}", ca],
                         capture_output=True, text=True, timeout=60)
    lines = [line for line in out.stdout.splitlines() if line.startswith("got ")]
    assert lines, (out.stdout[-500:], out.stderr[:1500])
    return lines[-1]


def test_dalli_with_ssl_context_answers_as_memcached_does(server_factory, certs):
    server = tls_server(server_factory, certs)
    ours = dalli(fields(server)["memcache_tls"], certs["ca.pem"])
    proc, addr = memcached_tls(certs)
    try:
        theirs = dalli(addr, certs["ca.pem"])
    finally:
        proc.kill()
        proc.wait()
    assert ours == theirs
    assert ours.split("|")[6] == "true", ours


def put(server, certs, key, body):
    host, port = fields(server)["https"]
    conn = http.client.HTTPSConnection("localhost", port, context=client_context(certs), timeout=10)
    conn.request("PUT", f"/{key}", body=body)
    status = conn.getresponse().status
    conn.close()
    return status


@pytest.mark.parametrize("tool", ["aria2c", "wget"])
def test_aria2c_and_wget_over_https_with_the_ca(server_factory, certs, tmp_path, tool):
    if shutil.which(tool) is None:
        pytest.skip(f"{tool} is not installed")
    server = tls_server(server_factory, certs)
    body = os.urandom(200 * 1024 + 7)
    assert put(server, certs, "obj", body) in (201, 204)
    port = fields(server)["https"][1]
    url = f"https://localhost:{port}/obj"
    dest = tmp_path / "got"
    if tool == "aria2c":
        cmd = ["aria2c", "-q", "--ca-certificate", certs["ca.pem"], "--check-certificate=true",
               "--allow-overwrite=true", "--max-tries=1", "--timeout=10", "-d", str(tmp_path),
               "-o", "got", url]
    else:
        cmd = ["wget", "-q", "--ca-certificate", certs["ca.pem"], "--tries=1", "--timeout=10",
               "-O", str(dest), url]
    out = subprocess.run(cmd, capture_output=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert dest.read_bytes() == body
    # Without the CA the server's certificate is not trusted: the tool refuses.
    bad = [a for a in cmd if a != certs["ca.pem"] and a != "--ca-certificate"]
    dest.unlink()
    out = subprocess.run(bad, capture_output=True, timeout=30)
    assert out.returncode != 0 and not (dest.exists() and dest.read_bytes() == body)
    # A missing key: both tools see the 404 and fail.
    out = subprocess.run([a.replace("/obj", "/missing") for a in cmd], capture_output=True, timeout=30)
    assert out.returncode != 0


def verdict(addr, ctx):
    """What a memcache client with `ctx` gets: the version line, or the error type."""
    try:
        with tls_connect(addr, ctx) as s:
            # TLS 1.3: the verdict on the client's certificate comes after the client's side
            # of the handshake; the first read sees it.
            reply = ask(s, b"version\r\n")
            return "ok" if reply.startswith(b"VERSION ") else f"closed {reply!r}"
    except (ssl.SSLError, ConnectionError, socket.timeout) as e:
        return "refused" if not isinstance(e, socket.timeout) else "timeout"


def test_python_ssl_client_certificates_under_require_on_both_servers(server_factory, certs):
    server = tls_server(server_factory, certs, "--tls-ca", certs["ca.pem"], "--tls-verify", "require")
    # memcached's ssl_verify_mode=2: require a peer certificate, signed by ssl_ca_cert.
    proc, addr = memcached_tls(certs, f"ssl_ca_cert={certs['ca.pem']}", "ssl_verify_mode=2")
    try:
        got = {}
        for who in ("client", None, "stranger", "expired"):
            ctx = client_context(certs, who)
            got[who] = (verdict(fields(server)["memcache_tls"], ctx), verdict(addr, ctx))
    finally:
        proc.kill()
        proc.wait()
    assert got == {
        "client": ("ok", "ok"),
        None: ("refused", "refused"),
        "stranger": ("refused", "refused"),
        "expired": ("refused", "refused"),
    }, got


# ---- a client certificate in place of a token

def _client_cert(d, name, subject, ca_key, ca_name, days=(-1, 2)):
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, ca_name)]))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now + datetime.timedelta(days=days[0]))
        .not_valid_after(now + datetime.timedelta(days=days[1]))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem, keyfile = d / f"{name}.pem", d / f"{name}.key"
    pem.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    keyfile.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    return cert.subject.rfc4514_string(), str(pem), str(keyfile)


def https(port, ctx, method, key, body=None, token=None):
    conn = http.client.HTTPSConnection("localhost", port, context=ctx, timeout=10)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    conn.request(method, f"/{key}", body=body, headers=headers)
    r = conn.getresponse()
    r.read()
    conn.close()
    return r.status, r.getheader("WWW-Authenticate")


def test_a_client_certificate_stands_in_for_a_token(server_factory, certs, tmp_path):
    def load(name):
        with open(certs[f"{name}.key"], "rb") as f:
            return serialization.load_pem_private_key(f.read(), None)

    ca_key, other_key = load("ca"), load("otherca")

    def name(*pairs):
        return x509.Name([x509.NameAttribute(oid, v) for oid, v in pairs])

    app1 = _client_cert(tmp_path, "app1", name((NameOID.ORGANIZATION_NAME, "Example, Inc"),
                                               (NameOID.COMMON_NAME, "app1")), ca_key, "ca")
    reader = _client_cert(tmp_path, "reader", name((NameOID.COMMON_NAME, "reader")), ca_key, "ca")
    unmapped = _client_cert(tmp_path, "unmapped", name((NameOID.COMMON_NAME, "nobody")), ca_key, "ca")
    # The mapped subject, signed by another CA: never verified, so never mapped.
    forged = _client_cert(tmp_path, "forged", name((NameOID.ORGANIZATION_NAME, "Example, Inc"),
                                                   (NameOID.COMMON_NAME, "app1")), other_key, "otherca")
    expired = _client_cert(tmp_path, "expired", name((NameOID.COMMON_NAME, "reader")), ca_key, "ca",
                           days=(-10, -1))
    assert app1[0] == r"CN=app1,O=Example\, Inc"
    token = "t0k3n-for-writers"
    tokens = tmp_path / "tokens"
    tokens.write_text(
        f"# issue 19: certificates in place of tokens\n"
        # Fields are split on spaces: a space in the subject is written \20.
        f"app1 subject:{app1[0].replace(' ', chr(92) + '20')} write app1/\n"
        f"reader subject:{reader[0]} read\n"
        f"writer {hashlib.sha256(token.encode()).hexdigest()} write\n"
    )
    for verify in ("require", "request"):
        server = tls_server(server_factory, certs, "--tls-ca", certs["ca.pem"], "--tls-verify", verify,
                            "--http-tokens", str(tokens))
        port = fields(server)["https"][1]

        def ctx(cert):
            c = client_context(certs)
            c.load_cert_chain(cert[1], cert[2])
            return c

        assert https(port, ctx(app1), "PUT", "app1/a", b"v1") == (201, None)
        assert https(port, ctx(app1), "GET", "app1/a")[0] == 200
        # Outside its prefix.
        assert https(port, ctx(app1), "PUT", "other", b"v")[0] == 403
        assert https(port, ctx(app1), "GET", "other")[0] == 403
        # Read only.
        assert https(port, ctx(reader), "GET", "app1/a")[0] == 200
        assert https(port, ctx(reader), "PUT", "app1/a", b"v2")[0] == 403
        assert https(port, ctx(reader), "DELETE", "app1/a")[0] == 403
        # A verified certificate the file does not map.
        assert https(port, ctx(unmapped), "GET", "app1/a") == (401, "Bearer")
        # A token still works, with or without a certificate; a wrong token is not rescued
        # by a mapped certificate.
        assert https(port, ctx(reader), "PUT", "w", b"v", token=token)[0] == 201
        assert https(port, ctx(app1), "GET", "app1/a", token="wrong")[0] == 401
        # The plain HTTP port has no certificate: a token or nothing.
        plain = http.client.HTTPConnection(*server.http, timeout=10)
        plain.request("GET", "/app1/a")
        assert plain.getresponse().status == 401
        plain.close()
        for bad in (forged, expired):
            with pytest.raises((ssl.SSLError, ConnectionError)):
                https(port, ctx(bad), "GET", "app1/a")
        if verify == "request":
            # No certificate at all: served, as any client without a token.
            assert https(port, client_context(certs), "GET", "app1/a") == (401, "Bearer")
            assert https(port, client_context(certs), "GET", "app1/a", token=token)[0] == 200
        else:
            with pytest.raises((ssl.SSLError, ConnectionError)):
                https(port, client_context(certs), "GET", "app1/a", token=token)
        server.stop()


def test_a_bad_subject_line_refuses_the_start(certs, tmp_path):
    from conftest import BIN

    tokens = tmp_path / "tokens"
    tokens.write_text("app1 subject:CN=app 1 write\n")
    p = subprocess.run([BIN, "serve", "--memcache", "127.0.0.1:0", "--http", "127.0.0.1:0",
                        "--http-tokens", str(tokens)], capture_output=True, timeout=20)
    assert p.returncode == 2, p.stderr
    tokens.write_text("app1 subject:XX=1 write\n")
    p = subprocess.run([BIN, "serve", "--memcache", "127.0.0.1:0", "--http", "127.0.0.1:0",
                        "--http-tokens", str(tokens)], capture_output=True, timeout=20)
    assert p.returncode == 2 and b"line 1" in p.stderr and b"subject" in p.stderr, p.stderr
