"""Hot keys (issue 33, ADR 0044): memcache `stats hotkeys`, HTTP `GET /_hotkeys` as JSON (a
token needed where `--http-tokens` asks for one), found from the sampled per-worker sketches
among many cold keys, and a flood of distinct keys (long ones too) does not grow them."""

import hashlib
import http.client
import json
import random
import re
import socket
import threading

# One worker sketch: 512 entries of a 255-byte key and their fields, and its index
# (`SKETCH_BYTES` in appliance/service/src/hotkeys.rs).
SKETCH_BYTES = 512 * (255 + 3 * 8 + 1 + 2 + 2) + 1024 * 2


def connect(addr):
    s = socket.create_connection(addr, timeout=30)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def ask(addr, request, end=b"END\r\n"):
    """One request, its whole reply (up to `end`)."""
    with connect(addr) as s:
        s.sendall(request)
        data = b""
        while not (data.endswith(end) or data.endswith(b"ERROR\r\n")):
            chunk = s.recv(1 << 16)
            assert chunk, data
            data += chunk
        return data


def hotkeys(addr, n=None):
    """`stats hotkeys [n]` as [(rank, key, count, base64)]."""
    reply = ask(addr, b"stats hotkeys\r\n" if n is None else f"stats hotkeys {n}\r\n".encode())
    ranks = {}
    for line in reply.decode().split("\r\n"):
        m = re.fullmatch(r"STAT hotkey:(\d+):(key|count|base64) (\S+)", line)
        if m:
            ranks.setdefault(int(m[1]), {})[m[2]] = m[3]
        else:
            assert line in ("END", ""), line
    assert sorted(ranks) == list(range(1, len(ranks) + 1)), ranks
    return [(r, v["key"], int(v["count"]), v.get("base64") == "1") for r, v in sorted(ranks.items())]


class Drain:
    """Reads and drops a connection's replies in the background (the server never waits on us)."""

    def __init__(self, sock):
        self.sock = sock
        self.tail = b""
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while True:
            try:
                chunk = self.sock.recv(1 << 20)
            except OSError:
                return
            if not chunk:
                return
            self.tail = (self.tail + chunk)[-64:]


def send_all(addr, lines, conns=4):
    """Sends the request lines (any iterable) over `conns` connections, round robin in
    batches, and waits for every reply."""
    socks = [connect(addr) for _ in range(conns)]
    drains = [Drain(s) for s in socks]
    batch, n = [], 0
    for line in lines:
        batch.append(line)
        if len(batch) == 200:
            socks[n % conns].sendall(b"".join(batch))
            batch, n = [], n + 1
    socks[n % conns].sendall(b"".join(batch))
    for s, d in zip(socks, drains):
        s.sendall(b"mn\r\n")
        s.shutdown(socket.SHUT_WR)
        d.thread.join(timeout=120)
        assert not d.thread.is_alive()
        assert d.tail.endswith(b"MN\r\n"), d.tail
        s.close()


def test_ten_hot_keys_among_twenty_thousand_cold_are_ranked_first(server_factory):
    # The workload: 10 keys read 2,000 times each among 20,000 keys read once, in
    # random order; at least 9 of the 10 must be the top 10. Several orders, fresh servers.
    for seed in (1, 2, 3):
        srv = server_factory("--memory", "64MiB")
        reads = [f"hot{k}".encode() for k in range(10) for _ in range(2000)]
        reads += [f"cold{k}".encode() for k in range(20000)]
        random.Random(seed).shuffle(reads)
        # Misses count as reads: nothing needs to be stored.
        send_all(srv.mc, [b"get " + k + b"\r\n" for k in reads])
        top = hotkeys(srv.mc)
        assert len(top) == 10, top
        hot = [t for t in top if t[1].startswith("hot")]
        assert len(hot) >= 9, (seed, top)
        for _, key, count, b64 in hot:
            # Estimated requests: the sampled count scaled back to all requests. One in 128
            # (the default) samples a hot key about 16 times (sd 4): at least 2 samples.
            assert 256 <= count <= 8000 and not b64, (seed, top)
        assert [t[0] for t in hotkeys(srv.mc, 3)] == [1, 2, 3]
        assert len(hotkeys(srv.mc, 5000)) <= 100
        assert ask(srv.mc, b"stats hotkeys 0\r\n", b"\r\n") == b"CLIENT_ERROR bad command line format\r\n"
        srv.stop()


def test_sampling_every_request_counts_exactly(server_factory):
    # --hotkeys-sample 1: every request is sampled, so counts are exact while the sketch
    # has room (and the JSON listing says the rate).
    srv = server_factory("--memory", "64MiB", "--hotkeys-sample", "1")
    send_all(srv.mc, [b"get a\r\n"] * 300 + [b"get b\r\n"] * 200 + [b"get c\r\n"] * 7)
    assert [(k, n) for _, k, n, _ in hotkeys(srv.mc, 3)] == [("a", 300), ("b", 200), ("c", 7)]
    status, _, body = get_json(srv)
    assert status == 200 and json.loads(body)["sample_one_in"] == 1, body
    srv.stop()


def get_json(srv, token=None, path="/_hotkeys"):
    c = http.client.HTTPConnection(*srv.http, timeout=10)
    c.request("GET", path, headers={"Authorization": f"Bearer {token}"} if token else {})
    r = c.getresponse()
    body = r.read()
    c.close()
    return r.status, r.getheader("Content-Type"), body


def test_http_json_with_and_without_tokens(server_factory, tmp_path):
    srv = server_factory("--memory", "64MiB")
    lines = [b"set user:1 0 0 1 noreply\r\nx\r\n"] * 3000 + [b"get user:2\r\n"] * 1000
    lines += [b"mg " + b"AAH/" + b" b v\r\n"] * 3000
    random.Random(7).shuffle(lines)
    send_all(srv.mc, lines, conns=2)
    status, ctype, body = get_json(srv, path="/_hotkeys?n=3")
    assert status == 200 and ctype == "application/json", (status, body)
    doc = json.loads(body)
    assert doc["k"] == 3 and doc["sample_one_in"] >= 1, doc
    keys = {k.get("key") or "b64:" + k["key_base64"]: k for k in doc["keys"]}
    assert set(keys) == {"user:1", "user:2", "b64:AAH/"}, doc
    assert [k["rank"] for k in doc["keys"]] == [1, 2, 3]
    assert keys["user:2"]["rank"] == 3, doc
    # The same binary key in `stats hotkeys`: base64, marked.
    assert any(t[1] == "AAH/" and t[3] for t in hotkeys(srv.mc)), hotkeys(srv.mc)
    srv.stop()

    def h(token):
        return hashlib.sha256(token.encode()).hexdigest()

    tokens = tmp_path / "tokens"
    tokens.write_text(f"reader {h('rtok')} read\ntenant {h('ttok')} read tenant/\n")
    srv = server_factory("--memory", "64MiB", "--http-tokens", str(tokens))
    c = http.client.HTTPConnection(*srv.http, timeout=10)
    for i in range(4000):
        key = "/tenant/a" if i % 2 else "/other"
        c.request("GET", key, headers={"Authorization": "Bearer rtok"})
        c.getresponse().read()
    c.close()
    assert get_json(srv)[0] == 401
    assert get_json(srv, "nope")[0] == 401
    status, _, body = get_json(srv, "rtok")
    assert status == 200, body
    assert {k["key"] for k in json.loads(body)["keys"]} == {"tenant/a", "other"}, body
    status, _, body = get_json(srv, "ttok")
    assert status == 200, body
    assert [k["key"] for k in json.loads(body)["keys"]] == ["tenant/a"], body
    srv.stop()


def test_a_flood_of_distinct_keys_keeps_the_sketches_bounded_and_the_hot_keys_found(server_factory):
    srv = server_factory("--memory", "64MiB")
    threads = int(re.search(rb"STAT threads (\d+)", ask(srv.mc, b"stats\r\n"))[1])
    hot = [f"hot:{i}".encode() for i in range(5)]

    def flood():
        yield from (b"set " + k + b" 0 0 1 noreply\r\nv\r\n" for k in hot)
        for i in range(1_000_000):
            yield b"set flood:%d 0 0 1 noreply\r\nv\r\n" % i
            if i % 50 == 0:
                yield from (b"get " + k + b"\r\n" for k in hot)
        for i in range(100_000):
            # Long keys: 250 bytes each, all distinct.
            yield b"set " + (b"%07d" % i) * 35 + b"y" * 5 + b" 0 0 1 noreply\r\nv\r\n"
            if i % 10 == 0:
                yield from (b"get " + k + b"\r\n" for k in hot)

    send_all(srv.mc, flood(), conns=4)
    top = hotkeys(srv.mc, 5)
    assert sorted(t[1] for t in top) == sorted(k.decode() for k in hot), top
    doc = json.loads(get_json(srv)[2])
    assert doc["memory_bound_bytes"] == (threads + 1) * SKETCH_BYTES, (threads, doc)
    assert 0 < doc["memory_bytes"] <= doc["memory_bound_bytes"], doc
    assert srv.alive()
    srv.stop()
