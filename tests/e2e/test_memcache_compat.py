"""memcached 1.6 compatibility beyond the basics (issue 13): meta-command details, the key
dump, admin commands and counters. The same command stream goes to ringstore and to a fresh
real memcached (1.6.18) over raw sockets, and the replies are compared byte for byte after
normalising what depends on the clock (access and expiry times, TTLs). Both servers start
fresh, so their CAS uniques count alike and are compared as they are. The `E` flag
(memcached 1.6.21+) is refused as 1.6.18 refuses it."""

import re
import socket
import time

from conftest import raw

MN = b"mn\r\n"


class Conn:
    """One raw connection; each `ask` sends a request and reads its whole reply."""

    def __init__(self, addr):
        self.s = socket.create_connection(addr, timeout=5)
        self.buf = b""

    def read_until(self, marker):
        while marker not in self.buf:
            chunk = self.s.recv(65536)
            assert chunk, f"closed before {marker!r}; got {self.buf[-200:]!r}"
            self.buf += chunk
        end = self.buf.index(marker) + len(marker)
        out, self.buf = self.buf[:end], self.buf[end:]
        return out

    def ask(self, payload):
        """The reply to `payload`, delimited by an `mn` sent after it."""
        self.s.sendall(payload + MN)
        return self.read_until(b"MN\r\n")[: -len(b"MN\r\n")]

    def dump(self, payload):
        """A listing ended by END (memcached answers what is pipelined behind a metadump only
        once more input arrives, so nothing is)."""
        self.s.sendall(payload)
        return self.read_until(b"END\r\n")

    def close(self):
        self.s.close()


def both(server, memcached, steps):
    """Each step's reply from ringstore and from memcached, in order."""
    replies = []
    for addr in (server.mc, memcached):
        c = Conn(addr)
        try:
            replies.append([c.ask(step) for step in steps])
        finally:
            c.close()
    return replies


TIMES = [
    (re.compile(rb"\bla=\d+"), b"la=N"),
    (re.compile(rb"\bexp=\d+"), b"exp=T"),
    (re.compile(rb"(?<= )t\d+\b"), b"tN"),
    (re.compile(rb"(\[\d+ b; )[1-9]\d* s\]"), rb"\1T s]"),
]


def normalised(reply):
    for pattern, repl in TIMES:
        reply = pattern.sub(repl, reply)
    return reply


def lines_sorted(listing):
    """A listing's lines in a fixed order (memcached walks its hash table, ringstore its
    segments), END last."""
    assert listing.endswith(b"END\r\n"), listing[-100:]
    body = listing[: -len(b"END\r\n")]
    return sorted(normalised(body).split(b"\n")), listing[-5:]


def assert_same(server, memcached, steps):
    ours, theirs = both(server, memcached, steps)
    for step, a, b in zip(steps, ours, theirs):
        assert normalised(a) == normalised(b), f"{step!r}: ringstore {a!r}, memcached {b!r}"


def test_ms_invalidate_with_an_older_cas_stores_stale_like_memcached(server, memcached):
    assert_same(server, memcached, [
        b"set k 0 0 1\r\na\r\n",
        b"md k I T30\r\n",
        b"mg k v c\r\n",
        b"ms k 1 I T90 C1\r\nb\r\n",  # older CAS, I: stored stale, old TTL kept
        b"mg k v c t\r\n",
        b"mg k v c\r\n",
        b"ms k 1 C1\r\nc\r\n",  # without I: EX
        b"ms k 1 I C999999\r\nd\r\n",  # newer CAS: EX
        b"ms k 1 I C0\r\nd\r\n",  # 0 is no older CAS: EX
        b"mg k v\r\n",
        b"ms n 1 I C1\r\nx\r\n",  # no item: NF
        b"set j 0 0 1\r\na\r\n",
        b"ms j 1 I C1\r\nx\r\n",  # j was not stale: now it is, and mg wins the token
        b"mg j v c\r\n",
        b"mg j v c\r\n",
        b"ms j 1 C9\r\ny\r\n",  # matching CAS: a plain store, no longer stale
        b"mg j v c\r\n",
    ])


def test_meta_details_match_memcached(server, memcached):
    assert_same(server, memcached, [
        b"mg miss v k Oabc\r\n",
        b"mg miss v q\r\n",
        b"mg vv N30 c v t s\r\n",  # autovivify: the win token
        b"mg vv N30 c v\r\n",
        b"ms f 3 F7 T0\r\nabc\r\n",
        b"mg f s f v c h l t k\r\n",
        b"mg f h l\r\n",
        b"ms f 2 MA\r\nde\r\n",
        b"ms f 1 MP\r\nz\r\n",
        b"ms f 1 ME\r\nz\r\n",
        b"ms nf 1 MR\r\nz\r\n",
        b"mg f v\r\n",
        b"ma cnt N0 J10 v c\r\n",
        b"ma cnt MD D3 v\r\n",
        b"ma cnt q D2\r\n",
        b"ma cnt v t\r\n",
        b"md cnt q\r\n",
        b"md cnt\r\n",
        b"ms Zm9v b 1\r\nx\r\n",
        b"mg Zm9v b k v\r\n",
        b"me foo\r\n",
        b"md Zm9v b I T10\r\n",
        b"mg Zm9v b v c\r\n",
    ])


def test_explicit_cas_is_an_invalid_flag_as_in_memcached(server, memcached):
    # `E` came with memcached 1.6.21; ringstore reports 1.6.18 and answers as it does.
    steps = [
        b"ms a 1 E40\r\nx\r\nmg a c\r\n",
        b"mg v N30 E77 c v\r\n",
        b"ma n N0 J5 E88 c v\r\n",
        b"set d 0 0 1\r\nx\r\nmd d I E55\r\nmg d c\r\n",
    ]
    ours, theirs = both(server, memcached, steps)
    assert ours == theirs
    assert ours[0] == b"CLIENT_ERROR invalid flag\r\nEN\r\n"


def test_admin_commands_match_memcached(server, memcached):
    assert_same(server, memcached, [
        b"shutdown\r\n",
        b"shutdown graceful\r\n",
        b"lru_crawler\r\n",
        b"lru_crawler foo\r\n",
        b"lru_crawler metadump\r\n",
        b"lru_crawler metadump all extra\r\n",
        b"lru_crawler metadump 0\r\n",
        b"lru_crawler metadump 64\r\n",
        b"lru_crawler metadump x\r\n",
        b"lru_crawler metadump 1,x\r\n",
        b"lru_crawler metadump ,\r\n",
        b"lru_crawler sleep 10\r\n",
        b"lru_crawler sleep 1000001\r\n",
        b"lru_crawler sleep x\r\n",
        b"lru_crawler tocrawl 5\r\n",
        b"lru_crawler enable\r\n",  # memcached's crawler already runs, like the reaper
        b"stats detail\r\n",
        b"stats detail on\r\n",
        b"stats detail off\r\n",
        b"stats cachedump 1\r\n",
        b"stats cachedump 99 0\r\n",
        b"stats cachedump 2 0\r\n",
        b"stats cachedump 1 0\r\n",  # nothing stored yet (memcached lists only its cold LRU)
        b"stats nosuch\r\n",
        b"lru_crawler crawl x\r\n",
        b"lru_crawler crawl all\r\n",  # last: memcached is slow to answer what follows it
    ])


def load_keys(conn, keys):
    for i, k in enumerate(keys):
        conn.s.sendall(b"set %s %d %d 3 noreply\r\nabc\r\n" % (k, i % 3, 0 if i % 2 else 1000))
    assert conn.ask(b"") == b""


def test_key_dump_matches_memcached(server, memcached):
    # Short items only: memcached puts them all in slab class 1, the class ringstore reports.
    keys = [b"plain", b"a/b%c:d~e_f.g-h", b"k%20"] + [b"key%d" % i for i in range(300)]
    dumps = []
    for addr in (server.mc, memcached):
        c = Conn(addr)
        try:
            load_keys(c, keys)
            assert c.ask(b"ms AAEC 2 b\r\nhi\r\nget plain key7\r\nmg key8 v\r\n").startswith(b"HD\r\n")
            listings = [c.dump(b"lru_crawler metadump all\r\n"), c.dump(b"lru_crawler metadump hash\r\n"),
                        c.dump(b"lru_crawler metadump 1\r\n")]
            dumps.append([lines_sorted(x) for x in listings])
            assert c.dump(b"lru_crawler metadump 2\r\n") == b"END\r\n"
            assert c.ask(b"version\r\n").startswith(b"VERSION ")  # the connection goes on
        finally:
            c.close()
    ours, theirs = dumps
    assert len(ours[0][0]) == len(keys) + 2  # every key, the binary one, and "" before END
    assert ours == theirs
    # mgdump (memcached 1.6.19+, not in 1.6.18): the same keys as mg lines, then EN.
    c = Conn(server.mc)
    try:
        c.s.sendall(b"lru_crawler mgdump all\r\n")
        lines = sorted(c.read_until(b"EN\r\n")[:-4].split(b"\r\n"))
    finally:
        c.close()
    assert lines == sorted([b""] + [b"mg " + k for k in keys] + [b"mg AAEC b"])


def test_cachedump_lists_every_item(server):
    # memcached 1.6 lists only the items its LRU maintainer has moved to the cold LRU by
    # then, so the lines are checked against the format rather than compared.
    c = Conn(server.mc)
    try:
        assert c.ask(b"set a 0 0 1\r\nx\r\nset b 3 1000 2\r\nxy\r\n") == b"STORED\r\nSTORED\r\n"
        listing = c.dump(b"stats cachedump 1 0\r\n")
        lines = sorted(listing[:-5].split(b"\r\n"))
        assert lines[0] == b"" and lines[1] == b"ITEM a [1 b; 0 s]", lines
        unix = int(re.fullmatch(rb"ITEM b \[2 b; (\d+) s\]", lines[2]).group(1))
        assert abs(unix - (time.time() + 1000)) < 5
        assert len(c.dump(b"stats cachedump 1 1\r\n").split(b"\r\n")) == 3  # one ITEM, END, ""
    finally:
        c.close()


def test_key_dump_streams_to_a_slow_reader(server):
    n = 30000
    c = Conn(server.mc)
    try:
        load_keys(c, [b"streamed-key-%06d" % i for i in range(n)])
        c.s.sendall(b"lru_crawler metadump all\r\n")
        got = b""
        first = True
        while not got.endswith(b"END\r\n"):
            chunk = c.s.recv(4096)
            assert chunk
            got += chunk
            if first:
                time.sleep(0.3)  # the server stops at its high-water mark meanwhile
                first = False
        keys = [line.split(b" ", 1)[0] for line in got[:-5].split(b"\n") if line]
        assert len(keys) == n and len(set(keys)) == n
        stats = dict(l.split(b" ")[1:3] for l in c.ask(b"stats\r\n").split(b"\r\n") if l.startswith(b"STAT "))
        assert int(stats[b"conn_yields"]) > 0, "the dump paused for the reader"
    finally:
        c.close()
    assert server.alive()


COUNTERS = [b"cmd_get", b"cmd_set", b"cmd_flush", b"cmd_touch", b"cmd_meta", b"get_hits", b"get_misses",
            b"get_flushed", b"delete_misses", b"delete_hits", b"incr_misses", b"incr_hits",
            b"decr_misses", b"decr_hits", b"cas_misses", b"cas_hits", b"cas_badval", b"touch_hits",
            b"touch_misses", b"store_too_large", b"store_no_memory", b"auth_cmds", b"auth_errors",
            b"accepting_conns", b"listen_disabled_num", b"time_in_listen_disabled_us"]

PRESENT = [b"rusage_user", b"rusage_system", b"connection_structures", b"conn_yields", b"threads",
           b"hash_bytes", b"hash_is_expanding", b"total_items", b"reclaimed", b"evictions"]


def stats_of(reply):
    return dict(l.split(b" ", 2)[1:3] for l in reply.split(b"\r\n") if l.startswith(b"STAT "))


def test_counters_match_memcached(server, memcached):
    first = [
        b"set e 0 1 1\r\na\r\n",
        b"set cas 0 0 1\r\na\r\n",
    ]
    later = [
        b"get e\r\n",  # expired: get_expired
        b"set big 0 0 2000000\r\n" + b"x" * 2000000 + b"\r\n",  # store_too_large
        b"ms c2 1 C5\r\nx\r\nset c3 0 0 1\r\nx\r\nms c3 1 C1\r\ny\r\ncas c3 0 0 1 99\r\nz\r\n",
        b"me c3\r\nincr c3 1\r\ndecr nope 1\r\ntouch c3 10\r\ntouch nope 10\r\ndelete nope\r\n",
        # Last among the replies that show CAS uniques: memcached's flush_all takes one.
        b"set f 0 0 1\r\nb\r\nset g 0 0 1\r\nb\r\nflush_all\r\nget f\r\nset g 0 0 1\r\nc\r\nget g\r\nget f\r\n",
        b"stats\r\n",
    ]
    conns = [Conn(server.mc), Conn(memcached)]
    try:
        for c in conns:
            for step in first:
                c.ask(step)
        time.sleep(2.2)
        ours, theirs = ([stats_of(c.ask(step)) if step == b"stats\r\n" else c.ask(step) for step in later] for c in conns)
    finally:
        for c in conns:
            c.close()
    for step, a, b in zip(later[:-1], ours, theirs):
        assert a == b, f"{step[:60]!r}: ringstore {a!r}, memcached {b!r}"
    a, b = ours[-1], theirs[-1]
    assert {k: a.get(k) for k in COUNTERS} == {k: b.get(k) for k in COUNTERS}
    # memcached counts the expired get unless its LRU maintainer reclaimed the item first
    # (it often has, 2 s on); ringstore's reaper waits 60 s, so the get always counts.
    assert a[b"get_expired"] == b"1" and b[b"get_expired"] in (b"0", b"1")
    assert a[b"get_flushed"] == b"2" and a[b"store_too_large"] == b"1"
    missing = [k for k in PRESENT if k not in a]
    assert not missing, missing
    assert float(a[b"rusage_user"]) + float(a[b"rusage_system"]) > 0


def test_stats_settings_names_memcached_has(server_factory, memcached):
    server = server_factory("--memory", "64MiB", "--max-conns", "1024")  # memcached's defaults
    ours = stats_of(raw(server.mc, b"stats settings\r\n", read_until=b"END\r\n"))
    theirs = stats_of(raw(memcached, b"stats settings\r\n", read_until=b"END\r\n"))
    same = [b"maxbytes", b"maxconns", b"evictions", b"shutdown_command", b"detail_enabled", b"cas_enabled",
            b"auth_enabled_sasl", b"auth_enabled_ascii", b"item_size_max", b"maxconns_fast", b"lru_crawler",
            b"flush_enabled", b"dump_enabled", b"ssl_enabled", b"verbosity", b"domain_socket"]
    assert {k: ours.get(k) for k in same} == {k: theirs.get(k) for k in same}


def test_key_dump_with_a_data_device_lists_ram_keys_and_external_values(server_factory, tmp_path):
    path = tmp_path / "data.img"
    with open(path, "wb") as f:
        f.truncate(256 << 20)
    args = ("--data", str(path), "--memory", "64MiB", "--cores", "1", "--external-value-min", "1KiB")
    s = server_factory(*args)
    c = Conn(s.mc)
    try:
        assert c.ask(b"set small 0 0 3\r\nabc\r\nset ext 0 0 8192\r\n" + b"e" * 8192 + b"\r\n") == b"STORED\r\nSTORED\r\n"
        lines, _ = lines_sorted(c.dump(b"lru_crawler metadump all\r\n"))
        # The external value is listed with its full size, as memcached lists extstore items.
        assert [l.split(b" ")[0] for l in lines] == [b"", b"key=ext", b"key=small"], lines
        assert lines[1].endswith(b" size=%d" % (48 + 3 + 1 + 8192 + 2 + 8)), lines
    finally:
        c.close()
    assert s.stop() == 0
    # After a restart the recovered keys are back in RAM, so they are listed again.
    s = server_factory(*args)
    c = Conn(s.mc)
    try:
        lines, _ = lines_sorted(c.dump(b"lru_crawler metadump all\r\n"))
        assert [l.split(b" ")[0] for l in lines] == [b"", b"key=ext", b"key=small"], lines
    finally:
        c.close()


def test_huge_exptimes_and_lengths_match_memcached(server, memcached):
    # memcached 1.6.18 reads these with strtol and truncates the long to int32 unchecked:
    # 2147483648 is negative, 99999999999 is 1215752191 (an absolute time in 2008), both
    # expired at once; 4294967301 is 5 s; a length of 4294967296 is 0. memcached gives a
    # set that expires on arrival a CAS unique, ringstore does not, so `gats` CAS differ.
    steps = [
        b"set k 0 2147483648 1\r\nx\r\nget k\r\n",
        b"set k 0 99999999999 1\r\nx\r\nget k\r\n",
        b"set k 0 -99999999999 1\r\nx\r\nget k\r\n",
        b"set k 0 999999999999999999999 1\r\nx\r\nget k\r\n",  # past a long: refused
        b"set k 0 4294967301 1\r\nx\r\nmg k v t\r\n",
        b"set k 0 0 1\r\nx\r\ngats 99999999999 k\r\nget k\r\n",
        b"set k 0 0 1\r\nx\r\ngat 2147483648 k\r\nget k\r\n",
        b"set k 0 0 1\r\nx\r\ngats 4294967301 k\r\nmg k t\r\n",
        b"set k 0 0 1\r\nx\r\ntouch k 99999999999\r\nget k\r\n",
        b"set k 0 0 1\r\nx\r\nmg k v T99999999999\r\nget k\r\n",
        b"set k 0 0 1\r\nx\r\nmg k v T2147483648\r\nget k\r\n",
        b"ms k 1 T99999999999\r\nx\r\nget k\r\n",
        b"ms k 1 T4294967301\r\nx\r\nmg k v t\r\n",
        b"set k 0 0 1\r\nx\r\ngat 99999999999999999999 k\r\n",
        b"set k 0 0 4294967296\r\nx\r\n",
        b"set k 0 0 4294967296\r\n\r\nget k\r\n",
        b"set k 0 0 4294967297\r\nx\r\nget k\r\n",
        b"set k 0 0 2147483648\r\n",
        b"set k 0 0 99999999999999999999\r\n",
        b"ms k 4294967296\r\nx\r\n",
        b"ms k 4294967296\r\n\r\nmg k v\r\n",
        b"ms k 2147483648\r\n",
        b"ms k 99999999999999999999\r\n",
        b"ms k 1 T2147483648\r\nx\r\nget k\r\n",
        b"ms k 1 T-1\r\nx\r\nget k\r\n",
        b"set k 0 0 1\r\nx\r\ngats 2147483648 k\r\nget k\r\n",
        b"set k 0 0 1\r\nx\r\ntouch k 2147483648\r\nget k\r\n",
        b"add k 0 99999999999 1\r\nx\r\nget k\r\n",
        b"replace k 0 2147483648 1\r\nx\r\nget k\r\n",
        b"cas k 0 99999999999 1 1\r\nx\r\n",
        b"set k 0 0 1\r\nx\r\nappend k 0 99999999999 1\r\ny\r\nget k\r\n",
        b"set k 0 0 -1\r\nx\r\n",
        b"ms k -1\r\nx\r\n",
        # Last: memcached's flush_all takes a CAS unique, ringstore's does not.
        b"set k 0 0 1\r\nx\r\nflush_all 99999999999\r\nget k\r\n",  # before the start: nothing
        b"flush_all 2147483648\r\nget k\r\n",  # negative: everything, now
        b"set k 0 0 1\r\nx\r\nflush_all 4294967296\r\nget k\r\n",  # 0: now
        b"set k 0 0 1\r\nx\r\nflush_all 99999999999999999999\r\nget k\r\n",
        b"flush_all -1\r\nget k\r\n",
    ]
    cas = re.compile(rb"^(VALUE k \d+ \d+) \d+\r$", re.M)
    ours, theirs = both(server, memcached, steps)
    for step, a, b in zip(steps, ours, theirs):
        a, b = (cas.sub(rb"\1 C\r", normalised(x)) for x in (a, b))
        assert a == b, f"{step!r}: ringstore {a!r}, memcached {b!r}"


def test_control_byte_keys_get_memcacheds_invalid_key_error(server, memcached):
    # memcached 1.6.18 stores keys with control bytes; ringstore refuses them (the README's
    # differences) with the error memcached gives for a key it finds invalid (too long).
    long_key = b"k" * 251
    for bad in (b"a\x01b", b"a\x7fb", b"a\tb"):
        commands = [b"set %s 0 0 1\r\nx\r\n", b"get %s\r\n", b"mg %s v\r\n", b"ms %s 1\r\nx\r\n",
                    b"touch %s 0\r\n", b"gat 0 %s\r\n", b"gats 0 %s\r\n", b"incr %s 1\r\n",
                    b"ma %s\r\n", b"md %s\r\n", b"delete %s\r\n"]
        ours, theirs = both(server, memcached, [c % bad for c in commands])
        _, invalid = both(server, memcached, [c % long_key for c in commands])
        assert ours == invalid, (bad, ours, invalid)
        assert theirs[0] == b"STORED\r\n", theirs  # memcached itself takes the key
