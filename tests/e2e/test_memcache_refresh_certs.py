"""`refresh_certs` (issue 35): without `--auth-file` any memcache client may send it, and each
one made the server read the certificate files, build its TLS configurations and drop the
session-resumption caches. Over UDP (any spoofed datagram) it is refused; over TCP the server
reloads at most once a second for all clients together. Reloads are counted in `stats`
(`tls_cert_refreshes`, `tls_cert_refreshes_refused`)."""

import time

from conftest import raw
from test_tls import certs, fields, stats, tls_server  # noqa: F401 (certs: a fixture)
from udpclient import UdpClient, udp_addr_of

TOO_SOON = b"Error refreshing certificates: too soon, at most one refresh a second\r\n"
NOT_OVER_UDP = b"CLIENT_ERROR refresh_certs is not accepted over UDP\r\n"


def counts(server):
    s = stats(server.mc)
    return int(s["tls_cert_refreshes"]), int(s["tls_cert_refreshes_refused"])


def test_refresh_certs_runs_once_a_second_and_never_over_udp(server_factory, certs):  # noqa: F811
    server = tls_server(server_factory, certs, "--udp", "127.0.0.1:0")
    assert "memcache_tls" in fields(server)
    with UdpClient(udp_addr_of(server.ready)) as udp:
        assert b"".join(udp.datagrams(b"refresh_certs\r\n")).endswith(NOT_OVER_UDP)
    assert counts(server) == (0, 1)
    # TCP: the first reloads, those within the next second (any connection) do no work.
    assert raw(server.mc, b"refresh_certs\r\n", read_until=b"\r\n") == b"OK\r\n"
    assert raw(server.mc, b"refresh_certs\r\n", read_until=b"\r\n") == TOO_SOON
    assert raw(server.mc, b"refresh_certs noreply\r\nmn\r\n", read_until=b"MN\r\n") == b"MN\r\n"
    assert counts(server) == (1, 3)
    time.sleep(1.1)
    assert raw(server.mc, b"refresh_certs\r\n", read_until=b"\r\n") == b"OK\r\n"
    assert counts(server) == (2, 3)
    # A flood of them: still at most one reload a second.
    t0 = time.monotonic()
    replies = raw(server.mc, b"refresh_certs\r\n" * 200 + b"mn\r\n", read_until=b"MN\r\n")
    took = time.monotonic() - t0
    reloads = replies.count(b"OK\r\n")
    assert reloads <= 1 + int(took), (reloads, took)
    assert replies.count(TOO_SOON) == 200 - reloads
    assert server.alive()
