"""GET /metrics (issue 33, docs/METRICS.md, ADR 0042): memcached_exporter's series from the
same server's `stats`, latency histograms that count every request, the token rule, hostile
scrapers, and a real Prometheus scraping `ringstore serve`."""

import hashlib
import http.client
import json
import os
import resource
import selectors
import shutil
import socket
import struct
import subprocess
import threading
import time
import urllib.parse
import urllib.request

import pytest

from test_tls import certs, client_context, fields, tls_server  # noqa: F401 (certs: a fixture)

# ---- the exposition, parsed


def parse_exposition(text):
    """{(name, labels tuple): float} and {family: type} of a Prometheus text exposition."""
    samples, types = {}, {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, family, kind = line.split(" ", 3)
            types[family] = kind
            continue
        if not line or line.startswith("#"):
            continue
        head, value = line.rsplit(" ", 1)
        labels = ()
        if "{" in head:
            name, rest = head.split("{", 1)
            pairs = []
            for part in rest.rstrip("}").split('",'):
                k, v = part.split("=", 1)
                pairs.append((k, v.strip('"')))
            labels = tuple(sorted(pairs))
        else:
            name = head
        key = (name, labels)
        assert key not in samples, f"duplicate series {key}"
        samples[key] = float(value)
    return samples, types


def scrape(conn, accept=None, token=None):
    headers = {}
    if accept:
        headers["Accept"] = accept
    if token:
        headers["Authorization"] = f"Bearer {token}"
    conn.request("GET", "/metrics", headers=headers)
    r = conn.getresponse()
    body = r.read().decode()
    return r.status, r.getheader("Content-Type"), body


def metrics(srv):
    c = http.client.HTTPConnection(*srv.http, timeout=10)
    status, _, body = scrape(c)
    c.close()
    assert status == 200, body
    return parse_exposition(body)[0]


# ---- memcache over a socket


class Mc:
    def __init__(self, addr):
        self.s = socket.create_connection(addr, timeout=10)
        self.buf = b""

    def line(self):
        while b"\r\n" not in self.buf:
            chunk = self.s.recv(65536)
            assert chunk, "connection closed"
            self.buf += chunk
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line.decode()

    def cmd(self, text):
        self.s.sendall(text.encode() + b"\r\n")
        return self.line()

    def stats(self, sub=""):
        self.s.sendall(f"stats {sub}".strip().encode() + b"\r\n")
        out = {}
        while True:
            line = self.line()
            if line == "END":
                return out
            _, name, value = line.split(" ", 2)
            out[name] = value

    def get(self, key):
        self.s.sendall(f"get {key}\r\n".encode())
        line = self.line()
        if line == "END":
            return None
        n = int(line.split()[3])
        while len(self.buf) < n + 2:
            self.buf += self.s.recv(65536)
        value, self.buf = self.buf[:n], self.buf[n + 2:]
        assert self.line() == "END"
        return value

    def close(self):
        self.s.close()


# ---- memcached_exporter's mapping (prometheus/memcached_exporter, pkg/exporter/exporter.go,
# its default collectors), written here from its source, independently of the server's table.

EXPORTER_GENERAL = {
    # stat: (metric, type)
    "uptime": ("memcached_uptime_seconds", "counter"),
    "time": ("memcached_time_seconds", "gauge"),
    "rusage_user": ("memcached_process_user_cpu_seconds_total", "counter"),
    "rusage_system": ("memcached_process_system_cpu_seconds_total", "counter"),
    "bytes": ("memcached_current_bytes", "gauge"),
    "limit_maxbytes": ("memcached_limit_bytes", "gauge"),
    "curr_items": ("memcached_current_items", "gauge"),
    "total_items": ("memcached_items_total", "counter"),
    "bytes_read": ("memcached_read_bytes_total", "counter"),
    "bytes_written": ("memcached_written_bytes_total", "counter"),
    "curr_connections": ("memcached_current_connections", "gauge"),
    "total_connections": ("memcached_connections_total", "counter"),
    "rejected_connections": ("memcached_connections_rejected_total", "counter"),
    "conn_yields": ("memcached_connections_yielded_total", "counter"),
    "listen_disabled_num": ("memcached_connections_listener_disabled_total", "counter"),
    "evictions": ("memcached_items_evicted_total", "counter"),
    "reclaimed": ("memcached_items_reclaimed_total", "counter"),
    "store_too_large": ("memcached_item_too_large_total", "counter"),
    "store_no_memory": ("memcached_item_no_memory_total", "counter"),
    "lru_crawler_starts": ("memcached_lru_crawler_starts_total", "counter"),
    "direct_reclaims": ("memcached_direct_reclaims_total", "counter"),
    "crawler_items_checked": ("memcached_lru_crawler_items_checked_total", "counter"),
    "crawler_reclaimed": ("memcached_lru_crawler_reclaimed_total", "counter"),
    "moves_to_cold": ("memcached_lru_crawler_moves_to_cold_total", "counter"),
    "moves_to_warm": ("memcached_lru_crawler_moves_to_warm_total", "counter"),
    "moves_within_lru": ("memcached_lru_crawler_moves_within_lru_total", "counter"),
    "total_malloced": ("memcached_malloced_bytes", "gauge"),
    "accepting_conns": ("memcached_accepting_connections", "gauge"),
}
EXPORTER_ITEMS_COUNTERS = {
    "crawler_reclaimed": "memcached_slab_items_crawler_reclaimed_total",
    "evicted": "memcached_slab_items_evicted_total",
    "evicted_nonzero": "memcached_slab_items_evicted_nonzero_total",
    "evicted_time": "memcached_slab_items_evicted_time_seconds",
    "evicted_unfetched": "memcached_slab_items_evicted_unfetched_total",
    "expired_unfetched": "memcached_slab_items_expired_unfetched_total",
    "outofmemory": "memcached_slab_items_outofmemory_total",
    "reclaimed": "memcached_slab_items_reclaimed_total",
    "tailrepairs": "memcached_slab_items_tailrepairs_total",
    "mem_requested": "memcached_slab_mem_requested_bytes",
    "moves_to_cold": "memcached_slab_items_moves_to_cold",
    "moves_to_warm": "memcached_slab_items_moves_to_warm",
    "moves_within_lru": "memcached_slab_items_moves_within_lru",
}
EXPORTER_ITEMS_GAUGES = {
    "number": "memcached_slab_current_items",
    "age": "memcached_slab_items_age_seconds",
    "number_hot": "memcached_slab_hot_items",
    "number_warm": "memcached_slab_warm_items",
    "number_cold": "memcached_slab_cold_items",
    "number_temp": "memcached_slab_temporary_items",
    "age_hot": "memcached_slab_hot_age_seconds",
    "age_warm": "memcached_slab_warm_age_seconds",
}


def exporter_mapping(stats, settings, items):
    """{(name, labels): value} and {name: type}, as memcached_exporter reports them."""
    out, types = {}, {}

    def put(name, kind, value, **labels):
        out[(name, tuple(sorted(labels.items())))] = float(value)
        types[name] = kind

    put("memcached_up", "gauge", 1)
    put("memcached_version", "gauge", 1, version=stats["version"])
    for op in ("get", "delete", "incr", "decr", "cas", "touch"):
        for suffix, status in (("_hits", "hit"), ("_misses", "miss")):
            if op + suffix in stats:
                put("memcached_commands_total", "counter", stats[op + suffix], command=op, status=status)
    if "cas_badval" in stats:
        put("memcached_commands_total", "counter", stats["cas_badval"], command="cas", status="badval")
    if "cmd_flush" in stats:
        put("memcached_commands_total", "counter", stats["cmd_flush"], command="flush", status="hit")
    cas = sum(float(stats[k]) for k in ("cas_misses", "cas_hits", "cas_badval"))
    put("memcached_commands_total", "counter", float(stats["cmd_set"]) - cas, command="set", status="hit")
    for stat, (name, kind) in EXPORTER_GENERAL.items():
        if stat in stats:
            value = stats[stat]
            if stat.startswith("rusage_"):
                s, us = value.split(".")
                value = float(s) + float(us) / 1e6
            put(name, kind, value)
    put("memcached_max_connections", "gauge", settings["maxconns"])
    if settings.get("lru_crawler") == "yes":
        put("memcached_lru_crawler_enabled", "gauge", 1)
        # lru_crawler_sleep, _tocrawl, lru_maintainer_thread, hot/warm pct and factors:
        # mapped the same way when present.
        for stat, name in (("lru_crawler_sleep", "memcached_lru_crawler_sleep"),
                           ("lru_crawler_tocrawl", "memcached_lru_crawler_to_crawl"),
                           ("hot_lru_pct", "memcached_lru_crawler_hot_percent"),
                           ("warm_lru_pct", "memcached_lru_crawler_warm_percent"),
                           ("hot_max_factor", "memcached_lru_crawler_hot_max_factor"),
                           ("warm_max_factor", "memcached_lru_crawler_warm_max_factor")):
            if stat in settings:
                put(name, "gauge", settings[stat])
    for key, value in items.items():
        _, slab, field = key.split(":", 2)
        if field in EXPORTER_ITEMS_GAUGES:
            put(EXPORTER_ITEMS_GAUGES[field], "gauge", value, slab=slab)
        elif field in EXPORTER_ITEMS_COUNTERS:
            put(EXPORTER_ITEMS_COUNTERS[field], "counter", value, slab=slab)
        elif field.startswith("hits_to_"):
            lru = {"hot": "hot", "warm": "warm", "cold": "cold", "temp": "temporary"}[field[8:]]
            put("memcached_slab_lru_hits_total", "counter", value, slab=slab, lru=lru)
    return out, types


def workload(mc):
    """A known mix touching every memcached_commands_total series."""
    for i in range(40):
        assert mc.cmd(f"set k{i} 0 0 5\r\nvalue") == "STORED"
    for i in range(60):
        mc.get(f"k{i}")  # 40 hits, 20 misses
    assert mc.cmd("delete k1") == "DELETED"
    assert mc.cmd("delete nope") == "NOT_FOUND"
    assert mc.cmd("set n 0 0 1\r\n5") == "STORED"
    assert mc.cmd("incr n 2") == "7"
    assert mc.cmd("decr n 1") == "6"
    assert mc.cmd("incr nope 1") == "NOT_FOUND"
    assert mc.cmd("decr nope 1") == "NOT_FOUND"
    mc.s.sendall(b"gets k2\r\n")
    cas = int(mc.line().split()[4])
    mc.line(), mc.line()
    assert mc.cmd(f"cas k2 0 0 1 {cas}\r\nx") == "STORED"
    assert mc.cmd(f"cas k2 0 0 1 {cas}\r\ny") == "EXISTS"
    assert mc.cmd("cas nope 0 0 1 1\r\nz") == "NOT_FOUND"
    assert mc.cmd("touch k3 100") == "TOUCHED"
    assert mc.cmd("touch nope 100") == "NOT_FOUND"
    big = 2 * 1024 * 1024
    assert mc.cmd(f"set big 0 0 {big}\r\n" + "x" * big).startswith("SERVER_ERROR")
    assert mc.cmd("flush_all") == "OK"
    assert mc.cmd("set after 0 0 2\r\nok") == "STORED"


def test_memcached_series_are_the_exporters_mapping_of_stats(server):
    mc = Mc(server.mc)
    workload(mc)
    http_conn = http.client.HTTPConnection(*server.http, timeout=10)
    # One scrape before and one after the stats commands: every series must lie between
    # the two (counters and clocks move only forward; the rest does not move at all).
    status, ctype, first = scrape(http_conn)
    assert status == 200 and ctype == "text/plain; version=0.0.4; charset=utf-8"
    stats, settings, items = mc.stats(), mc.stats("settings"), mc.stats("items")
    _, _, second = scrape(http_conn)
    before, types = parse_exposition(first)
    after, _ = parse_exposition(second)
    want, want_types = exporter_mapping(stats, settings, items)
    got = {k: v for k, v in before.items() if k[0].startswith("memcached_")}
    assert set(got) == set(want), (set(got) ^ set(want))
    for name, kind in want_types.items():
        assert types.get(name) == kind, name
    for key, value in want.items():
        lo, hi = sorted((before[key], after[key]))
        assert lo - 1e-9 <= value <= hi + 1e-9, (key, before[key], value, after[key])
    # The workload's own counts, not just agreement: the series say what was done.
    cmd = lambda c, s: before[("memcached_commands_total", (("command", c), ("status", s)))]
    assert (cmd("get", "hit"), cmd("get", "miss")) == (40 + 1, 20 + 0)  # + the gets line
    assert (cmd("cas", "hit"), cmd("cas", "badval"), cmd("cas", "miss")) == (1, 1, 1)
    assert cmd("flush", "hit") == 1 and cmd("touch", "hit") == 1
    assert before[("memcached_item_too_large_total", ())] == 1
    mc.close()
    http_conn.close()


def family_count(samples, protocol, command):
    return samples[("ringstore_request_duration_seconds_count",
                    (("command", command), ("protocol", protocol)))]


def test_latency_histograms_count_every_request(server):
    mc = Mc(server.mc)
    for i in range(30):
        assert mc.cmd(f"set h{i} 0 0 1\r\nv") == "STORED"
    for i in range(50):
        mc.get(f"h{i % 40}")
    # Pipelined in one write: each request counts once.
    mc.s.sendall(b"".join(b"get h%d\r\n" % i for i in range(20)))
    got = 0
    while got < 20:
        line = mc.line()
        if line == "END":
            got += 1
    for i in range(7):
        mc.cmd(f"delete h{i}")
    assert mc.cmd("set n 0 0 1\r\n1") == "STORED"
    for _ in range(5):
        mc.cmd("incr n 1")
    for i in range(4):
        assert mc.cmd(f"mg h{20 + i} v").startswith("VA")
        mc.line()
    # Binary: three no-ops, one frame each.
    b = socket.create_connection(server.mc, timeout=10)
    for _ in range(3):
        b.sendall(struct.pack(">BBHBBHIIQ", 0x80, 0x0A, 0, 0, 0, 0, 0, 0, 0))
        assert len(b.recv(24)) == 24
    b.close()
    c = http.client.HTTPConnection(*server.http, timeout=10)
    for i in range(4):
        c.request("PUT", f"/p{i}", body=b"x")
        c.getresponse().read()
    for i in range(6):
        c.request("GET", f"/p{i}")
        c.getresponse().read()
    for i in range(2):
        c.request("DELETE", f"/p{i}")
        c.getresponse().read()
    c.close()
    s = metrics(server)
    assert family_count(s, "memcache", "set") == 31
    assert family_count(s, "memcache", "get") == 70
    assert family_count(s, "memcache", "delete") == 7
    assert family_count(s, "memcache", "arith") == 5
    assert family_count(s, "memcache", "meta") == 4
    assert family_count(s, "memcache", "binary") == 3
    assert family_count(s, "http", "PUT") == 4
    assert family_count(s, "http", "GET") == 6
    assert family_count(s, "http", "DELETE") == 2
    # Buckets are cumulative and end at the count; the sum is a plausible time.
    labels = (("command", "get"), ("protocol", "memcache"))
    buckets = sorted(
        (float(dict(k[1])["le"]), v) for k, v in s.items()
        if k[0] == "ringstore_request_duration_seconds_bucket"
        and (("command", "get") in k[1]) and (("protocol", "memcache") in k[1])
    )
    counts = [v for _, v in buckets]
    assert counts == sorted(counts) and counts[-1] == 70 and buckets[-1][0] == float("inf")
    total = s[("ringstore_request_duration_seconds_sum", labels)]
    assert 0 < total < 70 * 1.0
    mc.close()


def test_latency_histograms_and_hot_keys_switch_off(server_factory):
    """`--latency-histograms off --hotkeys off` (what the bench's "without" runs): the same
    requests leave no histogram in /metrics and no key in `stats hotkeys`, and the rest of
    the exposition is there."""
    srv = server_factory("--memory", "64MiB", "--latency-histograms", "off", "--hotkeys", "off")
    mc = Mc(srv.mc)
    assert mc.cmd("set k 0 0 1\r\nv") == "STORED"
    for _ in range(64):
        mc.get("k")
    mc.s.sendall(b"stats hotkeys\r\n")
    assert mc.line() == "END"
    mc.close()
    s = metrics(srv)
    assert not [k for k in s if k[0].startswith("ringstore_request_duration_seconds")]
    assert s[("memcached_commands_total", (("command", "get"), ("status", "hit")))] == 64


def histogram(samples, name):
    """(cumulative buckets sorted by le, sum, count) of an unlabelled histogram."""
    buckets = sorted((float(dict(k[1])["le"]), v) for k, v in samples.items()
                     if k[0] == name + "_bucket")
    return buckets, samples[(name + "_sum", ())], samples[(name + "_count", ())]


def test_durable_commit_histograms_count_every_write(server_factory, tmp_path):
    """With --data, each acknowledged write is one observation of the commit latency, and the
    group sizes add up to the writes; without a data device neither family is served."""
    assert not any(k[0].startswith("ringstore_data_commit")
                   for k in metrics(server_factory("--memory", "64MiB")))
    path = tmp_path / "data.img"
    with open(path, "wb") as f:
        f.truncate(64 << 20)
    srv = server_factory("--data", str(path), "--cores", "1", "--memory", "64MiB")
    before = metrics(srv)
    assert histogram(before, "ringstore_data_commit_group_records")[2] == 0
    mc = Mc(srv.mc)
    sequential = 20
    for i in range(sequential):
        assert mc.cmd(f"set d{i} 0 0 1\r\nv") == "STORED"
    # 100 writes in one send: staged in one pass, they share few groups.
    pipelined = 100
    mc.s.sendall(b"".join(b"set p%d 0 0 2\r\nvv\r\n" % i for i in range(pipelined)))
    for _ in range(pipelined):
        assert mc.line() == "STORED"
    mc.close()
    writes = sequential + pipelined
    s = metrics(srv)
    lat, lat_sum, lat_count = histogram(s, "ringstore_data_commit_duration_seconds")
    assert lat_count == writes, lat
    assert [v for _, v in lat] == sorted(v for _, v in lat) and lat[-1] == (float("inf"), writes)
    assert 0 < lat_sum < writes * 5.0
    sizes, records, groups = histogram(s, "ringstore_data_commit_group_records")
    assert records == writes, sizes
    assert sequential <= groups <= sequential + 10, f"{groups} groups for {writes} writes"
    assert sizes[0] == (1.0, sizes[0][1]) and sizes[0][1] >= sequential - 1, sizes
    assert sizes[-1] == (float("inf"), groups)
    print(f"commit: {writes} writes in {groups:.0f} groups, "
          f"mean {lat_sum / lat_count * 1e6:.0f} µs to durable")


def test_open_metrics_when_accept_asks(server):
    c = http.client.HTTPConnection(*server.http, timeout=10)
    status, ctype, body = scrape(c, accept="application/openmetrics-text; version=1.0.0,text/plain;q=0.5")
    assert status == 200
    assert ctype == "application/openmetrics-text; version=1.0.0; charset=utf-8"
    assert body.endswith("# EOF\n")
    assert "# TYPE memcached_uptime_seconds counter" in body
    assert "\nmemcached_uptime_seconds_total " in body
    assert "# TYPE memcached_commands counter" in body
    # HEAD: the head alone, same length.
    c.request("HEAD", "/metrics")
    r = c.getresponse()
    assert r.status == 200 and r.read() == b"" and int(r.getheader("Content-Length")) > 1000
    c.close()


def test_metrics_need_a_token_allowed_every_key(server_factory, tmp_path):
    def h(token):
        return hashlib.sha256(token.encode()).hexdigest()

    tokens = tmp_path / "tokens"
    tokens.write_text(
        f"reader {h('rtok')} read\nwriter {h('wtok')} write\ntenant {h('ttok')} write tenant/\n"
    )
    srv = server_factory("--http-tokens", str(tokens))

    def ask(token):
        c = http.client.HTTPConnection(*srv.http, timeout=10)
        status, _, body = scrape(c, token=token)
        c.close()
        return status, body

    assert ask(None)[0] == 401
    assert ask("nope")[0] == 401
    assert ask("ttok")[0] == 403, "a token confined to a prefix sees no server-wide series"
    status, body = ask("rtok")
    assert status == 200 and "memcached_up 1" in body
    status, body = ask("wtok")
    assert status == 200
    samples, _ = parse_exposition(body)
    assert samples[("ringstore_auth_failures_total", (("protocol", "http"),))] == 2
    # An object named "metrics" stays reachable, percent-encoded.
    c = http.client.HTTPConnection(*srv.http, timeout=10)
    c.request("PUT", "/%6Detrics", body=b"obj", headers={"Authorization": "Bearer wtok"})
    assert c.getresponse().read() == b""
    c.request("GET", "/%6Detrics", headers={"Authorization": "Bearer rtok"})
    assert c.getresponse().read() == b"obj"
    c.close()


# ---- hostile scrapers


def raise_fd_limit(n):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < n:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(n, hard), hard))


def test_a_thousand_parallel_scrapes(server_factory):
    raise_fd_limit(4096)
    srv = server_factory("--max-conns", "2000")
    mc = Mc(srv.mc)
    assert mc.cmd("set live 0 0 2\r\nok") == "STORED"
    rss_before = srv.rss_bytes()
    socks = []
    for _ in range(1000):
        s = socket.create_connection(srv.http, timeout=10)
        s.setblocking(False)
        socks.append(s)
    request = b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    sel = selectors.DefaultSelector()
    for s in socks:
        s.sendall(request)
        sel.register(s, selectors.EVENT_READ, bytearray())
    # The data path keeps serving while every scrape is answered.
    assert mc.get("live") == b"ok"
    done, ok = 0, 0
    deadline = time.monotonic() + 60
    while done < len(socks) and time.monotonic() < deadline:
        for key, _ in sel.select(timeout=1):
            chunk = key.fileobj.recv(65536)
            if chunk:
                key.data.extend(chunk)
                continue
            sel.unregister(key.fileobj)
            key.fileobj.close()
            done += 1
            ok += key.data.startswith(b"HTTP/1.1 200 OK") and key.data.endswith(b"\n")
    assert done == 1000 and ok == 1000, (done, ok)
    assert mc.get("live") == b"ok"
    assert srv.rss_bytes() < rss_before + 64 * 1024 * 1024
    # Every scrape's connection is closed and let go (the closes may trail the replies).
    deadline = time.monotonic() + 20
    while metrics(srv)[("memcached_current_connections", ())] > 2:
        assert time.monotonic() < deadline, metrics(srv)[("memcached_current_connections", ())]
        time.sleep(0.2)
    mc.close()


def test_a_scrape_that_never_reads_its_answer(server_factory):
    srv = server_factory()
    mc = Mc(srv.mc)
    assert mc.cmd("set live 0 0 2\r\nok") == "STORED"
    rss_before = srv.rss_bytes()
    stuck = socket.create_connection(srv.http, timeout=10)
    stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    request = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
    stuck.setblocking(False)
    sent = 0
    deadline = time.monotonic() + 10
    # Pipelined scrapes until the server stops reading them (its output over the high-water
    # mark, the socket buffers full): the server holds a bounded amount for this client.
    while time.monotonic() < deadline:
        try:
            sent += stuck.send(request * 64)
        except BlockingIOError:
            time.sleep(0.05)
            try:
                sent += stuck.send(request)
            except BlockingIOError:
                break
    assert sent > 0
    for _ in range(100):
        assert mc.get("live") == b"ok"
    other = metrics(srv)
    assert other[("memcached_up", ())] == 1
    assert srv.rss_bytes() < rss_before + 32 * 1024 * 1024
    stuck.close()
    assert mc.get("live") == b"ok"
    mc.close()


# ---- a real Prometheus

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prom_query(base, query):
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    with urllib.request.urlopen(url, timeout=10) as r:
        data = json.load(r)
    assert data["status"] == "success", data
    result = data["data"]["result"]
    assert len(result) == 1, (query, result)
    return float(result[0]["value"][1])


def wait_scrapes(base, job, n, timeout=60):
    """Waits until Prometheus has scraped the target `n` more times."""
    def count():
        try:
            return prom_query(base, f'count_over_time(up{{job="{job}"}}[10m])')
        except (AssertionError, OSError):
            return 0

    start = count()
    deadline = time.monotonic() + timeout
    while count() < start + n:
        assert time.monotonic() < deadline, "Prometheus did not scrape"
        time.sleep(0.3)


def quantile_from_buckets(q, buckets):
    """Prometheus's histogram_quantile over cumulative (le, count) pairs."""
    buckets = sorted(buckets)
    total = buckets[-1][1]
    rank = q * total
    prev_le, prev_count = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if le == float("inf"):
                return prev_le
            return prev_le + (le - prev_le) * (rank - prev_count) / (count - prev_count)
        prev_le, prev_count = le, count
    return prev_le


def test_prometheus_scrapes_ringstore(server_factory, tmp_path):
    if not os.path.exists(PROMETHEUS):
        pytest.skip("prometheus is not installed (Debian's prometheus package; cargo xtask deps)")
    srv = server_factory("--memory", "16MiB")
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: ringstore\n"
        f"    static_configs:\n      - targets: ['{srv.http[0]}:{srv.http[1]}']\n"
    )
    prom = subprocess.Popen(
        [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_scrapes(base, "ringstore", 2)
        mc = Mc(srv.mc)
        # Fill past the limit: evictions.
        value = "v" * 100_000
        for i in range(400):
            assert mc.cmd(f"set fill{i} 0 0 {len(value)}\r\n{value}") == "STORED"
        for i in range(100):
            assert mc.cmd(f"set hot{i} 0 0 3\r\nabc") == "STORED"
        hits = misses = 0
        for i in range(300):
            if mc.get(f"hot{i % 150}") is None:
                misses += 1
            else:
                hits += 1
        stats = mc.stats()
        assert int(stats["evictions"]) > 0 and hits == 200 and misses == 100
        wait_scrapes(base, "ringstore", 3)
        ratio = prom_query(
            base,
            'sum(rate(memcached_commands_total{command="get",status="hit"}[10m]))'
            ' / sum(rate(memcached_commands_total{command="get"}[10m]))',
        )
        assert abs(ratio - hits / (hits + misses)) < 1e-6, ratio
        assert prom_query(base, "memcached_items_evicted_total") == float(stats["evictions"])
        used = prom_query(base, "memcached_current_bytes / memcached_limit_bytes")
        assert abs(used - int(stats["bytes"]) / int(stats["limit_maxbytes"])) < 1e-9
        assert 0 < used <= 1
        # The median GET latency as Prometheus estimates it, against the buckets the
        # server reports and what the test itself saw (a reply can take no longer than the
        # round trip the client timed, to the bucket's bound).
        p50 = prom_query(
            base,
            'histogram_quantile(0.5, sum by (le) (rate(ringstore_request_duration_seconds_bucket'
            '{protocol="memcache",command="get"}[10m])))',
        )
        s = metrics(srv)
        buckets = [(float(dict(k[1])["le"]), v) for k, v in s.items()
                   if k[0] == "ringstore_request_duration_seconds_bucket"
                   and ("command", "get") in k[1] and ("protocol", "memcache") in k[1]]
        assert max(v for _, v in buckets) == 300
        assert abs(p50 - quantile_from_buckets(0.5, buckets)) <= 1e-6 * p50, p50
        t0 = time.monotonic()
        for _ in range(50):
            mc.get("hot1")
        rtt = (time.monotonic() - t0) / 50
        bounds = sorted(le for le, _ in buckets)
        bound = next(le for le in bounds if le >= rtt * 20)
        assert 0 < p50 <= bound, (p50, rtt)
        mc.close()
    finally:
        prom.terminate()
        try:
            prom.wait(timeout=10)
        except subprocess.TimeoutExpired:
            prom.kill()
            prom.wait()


def test_metrics_over_https(server_factory, certs):
    srv = tls_server(server_factory, certs)
    host, port = fields(srv)["https"]
    c = http.client.HTTPSConnection("localhost", port, context=client_context(certs), timeout=10)
    status, ctype, body = scrape(c)
    c.close()
    assert status == 200 and ctype.startswith("text/plain; version=0.0.4")
    s, types = parse_exposition(body)
    # The handshake of this very connection is counted before its request is answered.
    assert s[("ringstore_tls_handshakes_total", ())] >= 1
    assert types["ringstore_tls_kernel_offload_total"] == "counter"
    assert ("ringstore_tls_kernel_offload_total", (("direction", "tx"),)) in s
