"""`--auth-file` (issue 19, "Authentication"): the text login compared byte for byte with
memcached 1.6.18 `-Y` on the same users file, the bounds on connections that have not
logged in (request timeout, half a login, a flood of bad logins and the log rate), and the
binary protocol before a login.

Each case is one byte stream sent in one write to each server on a fresh connection; what
comes back before the server goes quiet (or closes) is compared, with whether it closed."""

import os
import pathlib
import shutil
import socket
import subprocess
import tempfile
import time

import pytest

from conftest import real_memcached

USERS = b"alice:secret\nbob:hunter2\n"

# (name, bytes sent in one write)
CASES = [
    ("good login", b"set k 0 0 12\r\nalice secret\r\n"),
    ("good login, noreply ignored", b"set k 0 0 12 noreply\r\nalice secret\r\n"),
    ("second user", b"set any 5 7 11\r\nbob hunter2\r\n"),
    ("bad password", b"set k 0 0 9\r\nalice bad\r\n"),
    ("unknown user", b"set k 0 0 10\r\nmallory pw\r\n"),
    ("password of another user", b"set k 0 0 13\r\nalice hunter2\r\n"),
    ("wrong first command", b"get foo\r\n"),
    ("upper-case SET", b"SET k 0 0 12\r\nalice secret\r\n"),
    ("set with too few words", b"set k 0 0\r\n"),
    ("negative length", b"set k 0 0 -1\r\n"),
    ("tab between words", b"set k 0\t0 12\r\nalice secret\r\n"),
    ("meta get before login", b"mg foo v\r\n"),
    ("meta noop before login", b"mn\r\n"),
    ("meta set before login", b"ms foo 2\r\nhi\r\n"),
    ("quit before login", b"quit\r\n"),
    ("version before login", b"version\r\n"),
    ("stats before login", b"stats\r\n"),
    ("empty line", b"\r\n"),
    ("bad data termination", b"set k 0 0 12\r\nalice secretXX"),
    ("one token in the data", b"set k 0 0 5\r\nalice\r\n"),
    ("NUL in the data", b"set k 0 0 12\r\nalice\0secret\r\n"),
    ("two spaces", b"set k 0 0 13\r\nalice  secret\r\n"),
    ("pipelined login and commands", b"set k 0 0 12\r\nalice secret\r\nget k\r\nversion\r\nmn\r\n"),
    ("login then quit", b"set k 0 0 12\r\nalice secret\r\nquit\r\n"),
    ("failure then good login", b"set k 0 0 9\r\nalice bad\r\nset k 0 0 12\r\nalice secret\r\nmn\r\n"),
    ("failure replaced by the next reply", b"set k 0 0 9\r\nalice bad\r\nversion\r\n"),
    ("command before the login", b"get x\r\nset k 0 0 12\r\nalice secret\r\nget x\r\n"),
    ("21 commands: one reply", b"get a\r\n" * 21),
    ("22 commands: two replies", b"get a\r\n" * 22),
    ("42 commands: three replies", b"get a\r\n" * 42),
    ("overlong line", b"x" * 3000),
    ("long line under the junk limit", b"x" * 1500),
    ("long line with its end", b"x" * 3000 + b"\n"),
    ("login block over 16 KiB", b"set k 0 0 17000\r\n" + b"a" * 16990 + b" b\r\n"),
]


def exchange(addr, payload, quiet=0.4):
    """Sends `payload` in one write on a fresh connection; returns (reply, closed)."""
    s = socket.create_connection(addr, timeout=5)
    try:
        s.sendall(payload)
        s.settimeout(quiet)
        data, closed = b"", False
        while True:
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                break
            except ConnectionResetError:
                closed = True
                break
            if not chunk:
                closed = True
                break
            data += chunk
        return data, closed
    finally:
        s.close()


@pytest.fixture
def shared_dir():
    """A folder memcached can read after it drops to `nobody` (pytest's tmp_path is 0700)."""
    path = pathlib.Path(tempfile.mkdtemp(prefix="ringstore-auth-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def users_file(shared_dir):
    path = shared_dir / "users"
    path.write_bytes(USERS)
    path.chmod(0o644)
    return str(path)


@pytest.fixture
def memcached_y(users_file):
    """memcached 1.6.18 with `-Y` on the users file."""
    with real_memcached(extra=["-Y", users_file]) as addr:
        yield addr


@pytest.fixture
def locked(server_factory, users_file):
    return server_factory("--memory", "64MiB", "--auth-file", users_file, "--request-timeout", "2")


def assert_same_replies(ours, theirs, cases):
    """Each case's (reply, closed) from both servers, equal; every difference listed."""
    differ = []
    for name, payload in cases:
        a, b = exchange(ours, payload), exchange(theirs, payload)
        if a != b:
            differ.append(f"{name}: ringstore {a!r} memcached {b!r}")
    assert not differ, "\n".join(differ)


def test_text_login_matches_memcached_byte_for_byte(locked, memcached_y):
    assert_same_replies(locked.mc, memcached_y, CASES)


def test_stats_count_attempts_without_secrets(locked, memcached_y):
    for addr in (locked.mc, memcached_y):
        exchange(addr, b"set k 0 0 9\r\nalice bad\r\n")
        exchange(addr, b"set k 0 0 9\r\nalice bad\r\n")
    ours = exchange(locked.mc, b"set k 0 0 12\r\nalice secret\r\nstats\r\n")[0]
    theirs = exchange(memcached_y, b"set k 0 0 12\r\nalice secret\r\nstats\r\n")[0]
    for stats in (ours, theirs):
        assert b"STAT auth_cmds 3\r\n" in stats, stats
        assert b"STAT auth_errors 2\r\n" in stats
    assert b"secret" not in ours and b"alice" not in ours


def test_a_silent_client_and_half_a_login_are_closed_after_the_request_timeout(locked):
    silent = socket.create_connection(locked.mc, timeout=10)
    half = socket.create_connection(locked.mc, timeout=10)
    half.sendall(b"set k 0 0 12\r\nalice se")
    logged_in = socket.create_connection(locked.mc, timeout=10)
    logged_in.sendall(b"set k 0 0 12\r\nalice secret\r\n")
    assert logged_in.recv(100) == b"STORED\r\n"
    started = time.monotonic()
    for s in (silent, half):
        assert s.recv(100) == b"", "closed without a reply"
    waited = time.monotonic() - started
    assert 1.0 <= waited < 6, waited
    # The connection that logged in is not on the request timer.
    logged_in.sendall(b"mn\r\n")
    assert logged_in.recv(100) == b"MN\r\n"
    for s in (silent, half, logged_in):
        s.close()


def test_a_flood_of_bad_logins_does_not_flood_the_log(locked):
    payload = b"set k 0 0 11\r\nalice wrong\r\n" * 20
    started = time.monotonic()
    conns = 0
    while time.monotonic() - started < 2.5:
        exchange(locked.mc, payload, quiet=0.02)
        conns += 1
    reply = exchange(locked.mc, b"set k 0 0 12\r\nalice secret\r\nstats\r\n")[0]
    assert reply.startswith(b"STORED\r\n")
    errors = int(reply.split(b"STAT auth_errors ")[1].split(b"\r\n")[0])
    assert errors >= conns, (errors, conns)
    locked.stop()
    log = locked.proc.stderr.read().decode(errors="replace")
    lines = [line for line in log.splitlines() if "authentication failed" in line]
    # One line a second at most: 2.5 s of flood makes at most 4 lines.
    assert 1 <= len(lines) <= 4, (errors, lines)
    assert "wrong" not in log and "secret" not in log


def test_binary_before_a_login_gets_auth_error_then_close(locked):
    get = bytes([0x80, 0x00, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 1, 2, 3, 4]) + bytes(8) + b"k"
    reply, closed = exchange(locked.mc, get)
    assert closed
    assert reply[:2] == b"\x81\x00" and reply[6:8] == b"\x00\x20", reply
    assert reply[12:16] == b"\x01\x02\x03\x04"
    assert reply.endswith(b"Auth failure.")


def test_a_bad_users_file_refuses_the_start(tmp_path):
    from conftest import BIN

    bad = tmp_path / "users"
    bad.write_bytes(b"alice:secret\nno colon here\n")
    out = subprocess.run(
        [BIN, "serve", "--memcache", "127.0.0.1:0", "--http", "off", "--auth-file", str(bad)],
        capture_output=True,
        timeout=30,
    )
    assert out.returncode == 2, out
    assert b"line 2 is not user:password" in out.stderr
    assert b"secret" not in out.stderr
    udp = subprocess.run(
        [BIN, "serve", "--memcache", "127.0.0.1:0", "--udp", "127.0.0.1:0", "--auth-file", str(bad)],
        capture_output=True,
        timeout=30,
    )
    assert udp.returncode == 2 and b"udp" in udp.stderr, udp


# ---- binary protocol: SASL PLAIN, compared with memcached -S (Cyrus SASL, a sasldb with the
# same users written by saslpasswd2), and real clients.

def bin_frame(opcode, key=b"", value=b"", extras=b"", opaque=0x11223344):
    body = len(extras) + len(key) + len(value)
    header = bytes([0x80, opcode]) + len(key).to_bytes(2, "big") + bytes([len(extras), 0, 0, 0])
    return header + body.to_bytes(4, "big") + opaque.to_bytes(4, "big") + bytes(8) + extras + key + value


LIST, AUTH, STEP, GET, NOOP, VERSION = 0x20, 0x21, 0x22, 0x00, 0x0A, 0x0B
SET_EXTRAS = bytes(8)

SASL_CASES = [
    ("list mechs", bin_frame(LIST)),
    ("list mechs with a key", bin_frame(LIST, b"x")),
    ("good", bin_frame(AUTH, b"PLAIN", b"\0alice\0secret")),
    ("good with authzid", bin_frame(AUTH, b"PLAIN", b"alice\0alice\0secret")),
    ("bad password", bin_frame(AUTH, b"PLAIN", b"\0alice\0bad")),
    ("malformed", bin_frame(AUTH, b"PLAIN", b"alicesecret")),
    ("unknown mechanism", bin_frame(AUTH, b"CRAM-MD5", b"")),
    ("no mechanism", bin_frame(AUTH, b"", b"\0alice\0secret")),
    ("step", bin_frame(STEP, b"PLAIN", b"\0alice\0secret")),
    ("get before auth", bin_frame(GET, b"k")),
    ("noop before auth", bin_frame(NOOP)),
    ("set before auth", bin_frame(0x01, b"k", b"v", SET_EXTRAS)),
    ("version before auth", bin_frame(VERSION)),
    ("good then get", bin_frame(AUTH, b"PLAIN", b"\0alice\0secret") + bin_frame(GET, b"k")),
    ("bad then get", bin_frame(AUTH, b"PLAIN", b"\0alice\0bad") + bin_frame(GET, b"k")),
    ("good, bad, get", bin_frame(AUTH, b"PLAIN", b"\0alice\0secret")
     + bin_frame(AUTH, b"PLAIN", b"\0alice\0bad") + bin_frame(GET, b"k")),
    ("good then list", bin_frame(AUTH, b"PLAIN", b"\0bob\0hunter2") + bin_frame(LIST)),
]


@pytest.fixture
def memcached_s(shared_dir):
    """memcached 1.6.18 `-S` checking PLAIN against a sasldb holding USERS."""
    saslpasswd2 = shutil.which("saslpasswd2")
    if saslpasswd2 is None:
        pytest.skip("saslpasswd2 (sasl2-bin) is not installed")
    tmp_path = shared_dir
    conf = tmp_path / "sasl"
    conf.mkdir()
    db = tmp_path / "sasldb2"
    for line in USERS.decode().split():
        user, password = line.split(":", 1)
        subprocess.run([saslpasswd2, "-p", "-a", "memcached", "-c", "-f", str(db), user],
                       input=password.encode(), check=True)
    db.chmod(0o644)
    (conf / "memcached.conf").write_text(f"mech_list: plain\nsasldb_path: {db}\n")
    for p in (tmp_path, conf):
        p.chmod(0o755)
    env = dict(os.environ, SASL_CONF_PATH=str(conf))
    with real_memcached(extra=["-S"], env=env) as addr:
        yield addr


def test_sasl_plain_matches_memcached_byte_for_byte(locked, memcached_s):
    assert_same_replies(locked.mc, memcached_s, SASL_CASES)


PYLIBMC = """
import sys, pylibmc
host, user, password = sys.argv[1:]
c = pylibmc.Client([host], binary=True, username=user, password=password)
try:
    c.set("sasl-key", "v1")
    print("got", c.get("sasl-key"))
except pylibmc.Error as e:
    print("error", type(e).__name__)
"""

DALLI = """
require 'dalli'
host, user, password = ARGV
c = Dalli::Client.new(host, username: user, password: password, socket_max_failovers: 0,
                      socket_timeout: 2, down_retry_delay: 0)
begin
  c.set('sasl-key', 'v1', 0, raw: true)
  puts "got #{c.get('sasl-key', raw: true)}"
rescue Dalli::DalliError, StandardError => e
  puts "error #{e.class}"
end
"""


def run_client(cmd, addr, user, password):
    host = f"{addr[0]}:{addr[1]}"
    out = subprocess.run(cmd + [host, user, password], capture_output=True, text=True, timeout=30)
    # Dalli logs its SASL steps on stdout: the script's own line is the last one.
    lines = [line for line in out.stdout.splitlines() if line.startswith(("got ", "error "))]
    return lines[-1] if lines else out.stderr.strip()[-200:]


@pytest.mark.parametrize("client", ["pylibmc", "dalli", "python-binary-memcached"])
def test_real_clients_log_in_with_sasl_plain(locked, memcached_s, client):
    if client == "pylibmc":
        if subprocess.run(["/usr/bin/python3", "-c", "import pylibmc"], capture_output=True).returncode:
            pytest.skip("python3-pylibmc is not installed")
        cmd = ["/usr/bin/python3", "-c", PYLIBMC]
    elif client == "dalli":
        if shutil.which("ruby") is None or subprocess.run(["ruby", "-e", "require 'dalli'"],
                                                          capture_output=True).returncode:
            pytest.skip("ruby-dalli is not installed")
        cmd = ["ruby", "-e", DALLI]
    else:
        bmemcached = pytest.importorskip("bmemcached")

        def cmd_bmemcached(addr, user, password):
            c = bmemcached.Client([f"{addr[0]}:{addr[1]}"], user, password)
            try:
                c.set("sasl-key", "v1")
                return f"got {c.get('sasl-key')}"
            except Exception as e:  # the client raises its own error types
                return f"error {type(e).__name__}"
            finally:
                c.disconnect_all()

    results = {}
    for label, addr in (("ringstore", locked.mc), ("memcached", memcached_s)):
        for user, password in (("alice", "secret"), ("alice", "wrong")):
            if client == "python-binary-memcached":
                results[(label, password)] = cmd_bmemcached(addr, user, password)
            else:
                results[(label, password)] = run_client(cmd, addr, user, password)
    assert results[("ringstore", "secret")] == "got v1", results
    assert results[("memcached", "secret")] == "got v1", results
    assert results[("ringstore", "wrong")] == results[("memcached", "wrong")], results
    assert not results[("ringstore", "wrong")].startswith("got"), results


# ---- HTTP bearer tokens

def test_http_tokens(server_factory, tmp_path):
    import hashlib
    import http.client

    def h(token):
        return hashlib.sha256(token.encode()).hexdigest()

    tokens = tmp_path / "tokens"
    tokens.write_text(
        f"# name hash mode prefix\nreader {h('rtok')} read\nwriter {h('wtok')} write\n"
        f"tenant {h('ttok')} write tenant/\n"
    )
    srv = server_factory("--memory", "64MiB", "--http-tokens", str(tokens))

    def ask(method, path, token=None, body=None):
        c = http.client.HTTPConnection(*srv.http, timeout=5)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        c.request(method, path, body=body, headers=headers)
        r = c.getresponse()
        r.read()
        c.close()
        return r.status, r.getheader("WWW-Authenticate")

    assert ask("GET", "/k") == (401, "Bearer")
    assert ask("GET", "/k", "nope") == (401, "Bearer")
    assert ask("GET", "/k", h("rtok")) == (401, "Bearer"), "the hash is not the token"
    assert ask("PUT", "/k", "rtok", b"v")[0] == 403
    assert ask("DELETE", "/k", "rtok")[0] == 403
    assert ask("PUT", "/k", "wtok", b"v")[0] == 201
    assert ask("GET", "/k", "rtok")[0] == 200
    assert ask("GET", "/k", "ttok")[0] == 403
    assert ask("PUT", "/tenant/a", "ttok", b"v")[0] == 201
    assert ask("GET", "/tenant/a", "ttok")[0] == 200
    assert ask("DELETE", "/k", "wtok")[0] in (200, 204)
    # memcache stays open: --http-tokens does not touch it.
    assert exchange(srv.mc, b"mn\r\n")[0] == b"MN\r\n"
    srv.stop()
    log = srv.proc.stderr.read().decode(errors="replace")
    assert "rtok" not in log and "nope" not in log
    assert "authentication failed (HTTP bearer token)" in log
