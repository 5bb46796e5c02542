"""`stats settings` against a real memcached 1.6.18 started with the same settings (issue 35,
ADR 0036): ringstore answers every memcached setting that has a meaning here, under
memcached's name, in memcached's order and value format; the settings left out are listed
in OMITTED, each with why. Then ringstore's own (OWN)."""

import re

from conftest import raw, real_memcached

SLABS = "slab classes and the slab mover: ringstore has one item class in a segment store (ADR 0036)"
LRU = "segmented-LRU tuning: ringstore evicts FIFO with a second chance (ADR 0003)"
EXTSTORE = ("extstore tuning (-o ext_path): ringstore's data device has its own flags "
            "(--data, --external-value-min)")
OMITTED = {
    "oldest": "the last flush_all in memcached's process clock: ringstore applies flush_all to "
              "every shard (a delayed one when it comes due) and keeps no such setting",
    "umask": "the unix socket's mode (-a): ringstore has no unix socket (domain_socket NULL)",
    "growth_factor": SLABS,
    "chunk_size": SLABS,
    "stat_key_prefix": "the key prefix delimiter of per-prefix stats: `stats detail` is always "
                       "off here (detail_enabled no)",
    "reqs_per_event": "-R: a connection here yields at the output high-water mark instead "
                      "(out_high_water, conn_yields)",
    "hashpower_init": "the initial size of memcached's hash table: ringstore's index grows "
                      "per shard within --memory",
    "slab_reassign": SLABS,
    "slab_automove": SLABS,
    "slab_automove_ratio": SLABS,
    "slab_automove_window": SLABS,
    "slab_chunk_max": SLABS,
    "lru_crawler_sleep": "the crawler's pacing: ringstore's expiry reaper steps once a second "
                         "over a bounded number of items; `lru_crawler sleep` changes nothing",
    "lru_crawler_tocrawl": "as lru_crawler_sleep: `lru_crawler tocrawl` changes nothing",
    "tail_repair_time": "memcached's repair of items leaked by a refcount: no counterpart",
    "lru_maintainer_thread": LRU,
    "lru_segmented": LRU,
    "hot_lru_pct": LRU,
    "warm_lru_pct": LRU,
    "hot_max_factor": LRU,
    "warm_max_factor": LRU,
    "temp_lru": LRU,
    "temporary_ttl": LRU,
    "watcher_logbuf_size": "a watcher's own buffer: `watch` here reads the workers' rings "
                           "(worker_logbuf_size)",
    "read_buf_mem_limit": "ringstore bounds requests and replies together: conn_memory "
                          "(--conn-memory)",
    "inline_ascii_response": "a memcached build detail (always no in 1.6)",
    "ext_item_size": EXTSTORE,
    "ext_item_age": EXTSTORE,
    "ext_low_ttl": EXTSTORE,
    "ext_recache_rate": EXTSTORE,
    "ext_wbuf_size": EXTSTORE,
    "ext_compact_under": EXTSTORE,
    "ext_drop_under": EXTSTORE,
    "ext_max_sleep": EXTSTORE,
    "ext_max_frag": EXTSTORE,
    "slab_automove_freeratio": SLABS,
    "ext_drop_unread": EXTSTORE,
    "ssl_ciphers": "OpenSSL's cipher list: rustls' default suites, not configurable",
    "ssl_wbuf_size": "OpenSSL's write buffer: rustls buffers each session within --conn-memory",
    "num_napi_ids": "-N (NAPI id routing): ringstore places workers by the NIC's IRQs",
    "memory_file": "-e (restartable memory file): ringstore restarts from its data device (--data)",
}
OWN = ["out_high_water", "conn_memory"]
# Names whose values differ by design: the ports (each server's own), worker counts, the
# hash and the watch ring's size.
DIFFERENT = {"tcpport", "udpport", "num_threads", "num_threads_per_udp", "hash_algorithm",
             "worker_logbuf_size"}


def settings(addr):
    """`stats settings` as an ordered list of (name, value)."""
    reply = raw(addr, b"stats settings\r\n", read_until=b"END\r\n").decode()
    assert reply.endswith("END\r\n"), reply
    return re.findall(r"STAT (\S+) (\S+)\r\n", reply)


def form(value):
    """The value's format: memcached prints integers, decimals, yes/no, on/off or a word."""
    for name, pattern in (("int", r"\d+"), ("decimal", r"\d+\.\d+"), ("yes/no", r"yes|no"),
                          ("on/off", r"on|off")):
        if re.fullmatch(pattern, value):
            return name
    return "word"


def test_stats_settings_names_order_and_formats_are_memcached_s(server_factory):
    server = server_factory("--memory", "64MiB", "--max-conns", "1024", "--udp", "127.0.0.1:0",
                            "--idle-timeout", "7")
    udp_port = int(re.search(r"udp=\S+:(\d+)", server.ready).group(1))
    with real_memcached(udp=True, extra=("-m", "64", "-c", "1024", "-o", "idle_timeout=7")) as addr:
        theirs = settings(addr)
    ours = settings(server.mc)
    assert len(theirs) == 76, theirs  # memcached 1.6.18 as Debian builds it (with TLS)
    unknown = set(OMITTED) - {n for n, _ in theirs}
    assert not unknown, f"OMITTED names memcached does not have: {unknown}"
    want = [n for n, _ in theirs if n not in OMITTED] + OWN
    assert [n for n, _ in ours] == want
    ours, theirs = dict(ours), dict(theirs)
    assert {n: form(ours[n]) for n in want if n in theirs} == {n: form(theirs[n]) for n in want if n in theirs}
    same = [n for n in want if n in theirs and n not in DIFFERENT]
    assert {n: ours[n] for n in same} == {n: theirs[n] for n in same}
    assert (int(ours["tcpport"]), int(ours["udpport"])) == (server.mc[1], udp_port)
    assert int(theirs["tcpport"]) == int(theirs["udpport"]) == addr[1]
    assert ours["num_threads_per_udp"] == ours["num_threads"]
    assert ours["idle_timeout"] == "7" and ours["inter"] == "127.0.0.1"


def test_stats_settings_with_udp_off_say_port_0(server):
    ours = dict(settings(server.mc))
    assert ours["udpport"] == "0" and int(ours["tcpport"]) == server.mc[1]
    assert ours["idle_timeout"] == "0" and ours["ssl_enabled"] == "no"
