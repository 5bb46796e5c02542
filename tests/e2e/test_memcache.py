"""memcache protocol end to end through pymemcache, a real client, and raw sockets."""

from pymemcache.client.base import Client
from pymemcache.exceptions import MemcacheClientError, MemcacheServerError

from conftest import raw


def client(server):
    return Client(server.mc, connect_timeout=5, timeout=5)


def test_set_get_delete(server):
    c = client(server)
    assert c.set("alpha", b"one") is True
    assert c.get("alpha") == b"one"
    assert c.get("missing") is None
    assert c.delete("alpha") is True
    assert c.get("alpha") is None


def test_multi_get_and_flags(server):
    c = client(server)
    for i in range(50):
        c.set(f"k{i}", f"v{i}".encode() * (i + 1))
    got = c.get_many([f"k{i}" for i in range(60)])
    assert len(got) == 50
    assert got["k7"] == b"v7" * 8


def test_add_replace_append_prepend(server):
    c = client(server)
    assert c.add("a", b"1", noreply=False) is True
    assert c.add("a", b"2", noreply=False) is False
    assert c.replace("a", b"3", noreply=False) is True
    assert c.replace("nope", b"3", noreply=False) is False
    assert c.append("a", b"4", noreply=False) is True
    assert c.prepend("a", b"0", noreply=False) is True
    assert c.get("a") == b"034"


def test_cas(server):
    c = client(server)
    c.set("c", b"x")
    value, token = c.gets("c")
    assert value == b"x"
    assert c.cas("c", b"y", token, noreply=False) is True
    assert c.cas("c", b"z", token, noreply=False) is False
    assert c.get("c") == b"y"


def test_incr_decr(server):
    c = client(server)
    c.set("n", b"10")
    assert c.incr("n", 5) == 15
    assert c.decr("n", 100) == 0
    c.set("big", b"18446744073709551615")
    assert c.incr("big", 1) == 0
    assert c.incr("absent", 1) is None


def test_touch_and_expiry_negative(server):
    c = client(server)
    c.set("t", b"v", expire=100)
    assert c.touch("t", expire=-1, noreply=False) is True
    assert c.get("t") is None


def test_large_value_and_limit(server):
    c = client(server)
    big = b"x" * (1024 * 1024 - 512)
    assert c.set("big", big) is True
    assert c.get("big") == big
    try:
        c.set("toobig", b"y" * (2 * 1024 * 1024), noreply=False)
        raise AssertionError("server accepted an object over the limit")
    except MemcacheServerError as e:
        assert b"too large" in str(e).encode() or "too large" in str(e)
    # The connection stays usable after the swallowed data block.
    assert c.get("big") == big


def test_bad_key_is_client_error(server):
    out = raw(server.mc, b"get " + b"k" * 251 + b"\r\n", read_until=b"\r\n")
    assert out.startswith(b"CLIENT_ERROR"), out


def test_unknown_command(server):
    out = raw(server.mc, b"bogus\r\n", read_until=b"\r\n")
    assert out == b"ERROR\r\n"


def test_bad_data_chunk(server):
    out = raw(server.mc, b"set k 0 0 3\r\nabcdef\r\nget k\r\n", read_until=b"END\r\n")
    assert out.startswith(b"CLIENT_ERROR bad data chunk\r\n"), out
    assert out.endswith(b"END\r\n"), out


def test_meta_commands(server):
    out = raw(server.mc, b"ms mk 2 T0 F5\r\nhi\r\nmg mk v f s c\r\nmn\r\n", read_until=b"MN\r\n")
    lines = out.split(b"\r\n")
    assert lines[0] == b"HD", out
    assert lines[1].startswith(b"VA 2 "), out
    assert b" f5" in lines[1] and b" s2" in lines[1], out
    assert lines[2] == b"hi", out


def test_quiet_pipeline(server):
    out = raw(server.mc, b"mg miss1 v q\r\nmg miss2 v q\r\nmn\r\n", read_until=b"MN\r\n")
    assert out == b"MN\r\n"


def test_stats_topology(server):
    c = client(server)
    stats = {k.decode(): v for k, v in c.stats().items()}
    for name in ("pid", "uptime", "curr_connections", "total_connections", "cmd_get", "cmd_set",
                 "get_hits", "get_misses", "curr_items", "bytes", "limit_maxbytes", "evictions",
                 "threads", "numa_node", "worker_cpus", "hugepage_bytes"):
        assert name in stats, name
    assert int(stats["limit_maxbytes"]) == 64 * 1024 * 1024


def test_version(server):
    c = client(server)
    assert c.version()


def test_cross_protocol(server):
    import subprocess
    c = client(server)
    # noreply=False: pymemcache's default is noreply, and the HTTP GET could then overtake it.
    assert c.set("shared", b"from-memcache", flags=7, noreply=False)
    out = subprocess.run(["curl", "-s", "-i", f"{server.base}/shared"], capture_output=True, check=True).stdout
    assert out.startswith(b"HTTP/1.1 200"), out
    assert out.endswith(b"from-memcache"), out
    assert b"X-Flags: 7" in out or b"x-flags: 7" in out.lower(), out
    subprocess.run(["curl", "-s", "-X", "PUT", "--data-binary", "from-http", f"{server.base}/h"], check=True)
    assert c.get("h") == b"from-http"
