"""SIGHUP reloads `--auth-file` and `--http-tokens` (issue 35, docs/OPERATIONS.md
"Authentication"): a memcache connection logged in as a removed user (or one whose password
changed) is closed at the reload without sending anything more, a kept user's connection is
still served, new logins and requests see the new files, a removed token's next request on
a keep-alive connection is 401, and a file that does not parse keeps the one in force with
one log line saying why. `cargo xtask test` runs this on both runtimes (RINGSTORE_IO=epoll)."""

import hashlib
import http.client
import os
import signal
import socket
import ssl
import time

import pytest

from test_tls import certs, client_context, fields, tls_connect, tls_server  # noqa: F401

USERS = b"alice:secret\nbob:hunter2\ncarol:pw1\n"


def sha(token):
    return hashlib.sha256(token.encode()).hexdigest()


TOKENS = f"keep {sha('keeptok')} write\ngone {sha('gonetok')} write\n"


class Log:
    """The server's stderr, read while it runs (non-blocking)."""

    def __init__(self, proc):
        self.fd = proc.stderr.fileno()
        os.set_blocking(self.fd, False)
        self.text = ""

    def read(self):
        while True:
            try:
                chunk = os.read(self.fd, 65536)
            except BlockingIOError:
                break
            if not chunk:
                break
            self.text += chunk.decode(errors="replace")
        return self.text

    def wait_for(self, needle, count=1, timeout=5.0):
        """Waits until `needle` is in the log `count` times; returns the matching lines."""
        deadline = time.monotonic() + timeout
        while True:
            lines = [line for line in self.read().splitlines() if needle in line]
            if len(lines) >= count:
                return lines
            assert time.monotonic() < deadline, f"no {needle!r} in the log: {self.text!r}"
            time.sleep(0.02)


@pytest.fixture
def files(tmp_path):
    users, tokens = tmp_path / "users", tmp_path / "tokens"
    users.write_bytes(USERS)
    tokens.write_text(TOKENS)
    return users, tokens


@pytest.fixture
def srv(server_factory, files):
    users, tokens = files
    server = server_factory("--memory", "64MiB", "--auth-file", str(users), "--http-tokens", str(tokens))
    server.log = Log(server.proc)
    server.log.wait_for("auth-file: 3 users")
    return server


def login(addr, user, password):
    s = socket.create_connection(addr, timeout=5)
    data = f"{user} {password}".encode()
    s.sendall(b"set k 0 0 %d\r\n%s\r\n" % (len(data), data))
    return s, s.recv(100)


def logged_in(addr, user, password):
    s, reply = login(addr, user, password)
    assert reply == b"STORED\r\n", (user, reply)
    return s


def one_login(addr, user, password):
    s, reply = login(addr, user, password)
    s.close()
    return reply


def sasl_plain(user, password):
    """A binary `SASL auth` request, mechanism PLAIN."""
    key, value = b"PLAIN", b"\0" + user + b"\0" + password
    body = len(key) + len(value)
    return (bytes([0x80, 0x21]) + len(key).to_bytes(2, "big") + bytes(4)
            + body.to_bytes(4, "big") + bytes(12) + key + value)


def closed_without_sending(s, within):
    """True when the server closes `s` within `within` seconds while the client is silent."""
    s.settimeout(within)
    try:
        return s.recv(100) == b""
    except socket.timeout:
        return False
    except (ConnectionResetError, ssl.SSLError):
        # A TLS session closed without close_notify.
        return True


def served(s):
    s.settimeout(5)
    s.sendall(b"mn\r\n")
    return s.recv(100) == b"MN\r\n"


def test_sighup_closes_the_sessions_of_removed_users_and_keeps_the_others(srv, files):
    users, _ = files
    alice = logged_in(srv.mc, "alice", "secret")
    bob = logged_in(srv.mc, "bob", "hunter2")
    carol = logged_in(srv.mc, "carol", "pw1")
    bob_binary = socket.create_connection(srv.mc, timeout=5)
    bob_binary.sendall(sasl_plain(b"bob", b"hunter2"))
    assert bob_binary.recv(100).endswith(b"Authenticated")
    # bob removed, carol's password changed, dave added; alice kept.
    users.write_bytes(b"alice:secret\ncarol:pw2\ndave:pw3\n")
    srv.proc.send_signal(signal.SIGHUP)
    reloaded = time.monotonic()
    assert srv.log.wait_for("auth-file reloaded: 3 users") != []
    for name, s in (("bob", bob), ("bob over SASL", bob_binary), ("carol", carol)):
        # The worker's next tick (100 ms) closes it; the client sends nothing.
        assert closed_without_sending(s, 2.0), f"{name}'s connection is still open"
    assert time.monotonic() - reloaded < 2.0
    assert served(alice), "a kept user's connection is served"
    assert one_login(srv.mc, "bob", "hunter2") == b"CLIENT_ERROR authentication failure\r\n"
    assert one_login(srv.mc, "carol", "pw1") == b"CLIENT_ERROR authentication failure\r\n"
    assert one_login(srv.mc, "carol", "pw2") == b"STORED\r\n"
    assert one_login(srv.mc, "dave", "pw3") == b"STORED\r\n"
    assert served(alice)
    for s in (alice, bob, carol, bob_binary):
        s.close()
    assert "hunter2" not in srv.log.read() and "pw2" not in srv.log.text


def get(conn, token):
    conn.request("GET", "/k", headers={"Authorization": f"Bearer {token}"})
    r = conn.getresponse()
    r.read()
    return r.status


def test_sighup_reloads_tokens_a_removed_tokens_next_request_is_401(srv, files):
    _, tokens = files
    keep = http.client.HTTPConnection(*srv.http, timeout=5)
    gone = http.client.HTTPConnection(*srv.http, timeout=5)
    assert get(keep, "keeptok") == 404
    assert get(gone, "gonetok") == 404
    assert get(keep, "newtok") == 401
    tokens.write_text(f"keep {sha('keeptok')} write\nnew {sha('newtok')} read\n")
    srv.proc.send_signal(signal.SIGHUP)
    srv.log.wait_for("http-tokens reloaded: 2 tokens")
    # The same keep-alive connections: the removed token's next request is refused.
    assert get(gone, "gonetok") == 401
    assert get(keep, "keeptok") == 404
    assert get(keep, "newtok") == 404
    # A refused request without a body keeps the connection: a good token is served on it.
    assert get(gone, "keeptok") == 404
    keep.close()
    gone.close()


def test_a_file_that_does_not_parse_keeps_the_one_in_force(srv, files):
    users, tokens = files
    alice = logged_in(srv.mc, "alice", "secret")
    users.write_bytes(b"alice:secret\nno colon here\n")
    tokens.write_text("keep 12 write\n")
    srv.proc.send_signal(signal.SIGHUP)
    [users_line] = srv.log.wait_for("the users in force stay")
    [tokens_line] = srv.log.wait_for("the tokens in force stay")
    assert "line 2 is not user:password" in users_line and str(users) in users_line
    assert "line 1: the hash is not 64 hex digits" in tokens_line and str(tokens) in tokens_line
    assert "reloaded" not in srv.log.read()
    # Everything in force before stays: users, their sessions, tokens.
    assert not closed_without_sending(alice, 0.5)
    assert served(alice)
    assert one_login(srv.mc, "bob", "hunter2") == b"STORED\r\n"
    gone = http.client.HTTPConnection(*srv.http, timeout=5)
    assert get(gone, "gonetok") == 404
    # A missing file is refused the same way.
    users.unlink()
    srv.proc.send_signal(signal.SIGHUP)
    srv.log.wait_for("the users in force stay", count=2)
    assert one_login(srv.mc, "carol", "pw1") == b"STORED\r\n"
    # Fixed: the next SIGHUP takes it.
    users.write_bytes(b"alice:secret\n")
    tokens.write_text(f"keep {sha('keeptok')} write\n")
    srv.proc.send_signal(signal.SIGHUP)
    srv.log.wait_for("auth-file reloaded: 1 users")
    srv.log.wait_for("http-tokens reloaded: 1 tokens")
    assert one_login(srv.mc, "bob", "hunter2") == b"CLIENT_ERROR authentication failure\r\n"
    assert get(gone, "gonetok") == 401
    assert served(alice)
    alice.close()
    gone.close()


def test_sighup_closes_a_tls_session_of_a_removed_user(server_factory, certs, files):  # noqa: F811
    users, tokens = files
    server = tls_server(server_factory, certs, "--memory", "64MiB", "--auth-file", str(users))
    log = Log(server.proc)
    addr = fields(server)["memcache_tls"]
    ctx = client_context(certs)
    sessions = {}
    for user, password in (("alice", "secret"), ("bob", "hunter2")):
        s = tls_connect(addr, ctx)
        data = f"{user} {password}".encode()
        s.sendall(b"set k 0 0 %d\r\n%s\r\n" % (len(data), data))
        assert s.recv(100) == b"STORED\r\n", user
        sessions[user] = s
    users.write_bytes(b"alice:secret\n")
    server.proc.send_signal(signal.SIGHUP)
    log.wait_for("auth-file reloaded: 1 users")
    assert closed_without_sending(sessions["bob"], 2.0), "bob's TLS session is still open"
    assert served(sessions["alice"]), "a kept user's TLS session is served"
    for s in sessions.values():
        s.close()
