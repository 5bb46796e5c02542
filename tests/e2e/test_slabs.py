"""`stats slabs` (issue 25): memcached's per-class lines for class 1, the class `stats items`
reports, read by libmemcached's `memcstat --args=slabs` over text and binary, beside a real
memcached 1.6.18 given the same operations. The names and the per-class counters agree;
sizes follow ringstore's segment store (ADR 0036: a page is a segment, a chunk an item of
the mean live size). No node client runs in the e2e suite, so node's `slabs()` is not run."""

import re
import shutil
import subprocess
import time

import pytest

from conftest import raw

OPS = (b"set a 0 0 10\r\n0123456789\r\nset b 0 0 3\r\nabc\r\nset c 0 0 1\r\nx\r\n"
       b"get a b nope\r\ndelete c\r\nincr a 2\r\ndecr a 1\r\ntouch b 100\r\n"
       b"gets b\r\ncas b 0 0 1 999\r\ny\r\nversion\r\n")
SAME = ["1:used_chunks", "1:get_hits", "1:cmd_set", "1:delete_hits", "1:incr_hits", "1:decr_hits",
        "1:cas_hits", "1:cas_badval", "1:touch_hits", "active_slabs"]
NAMES = ["1:chunk_size", "1:chunks_per_page", "1:total_pages", "1:total_chunks", "1:used_chunks",
         "1:free_chunks", "1:free_chunks_end"] + SAME[1:-1] + ["active_slabs", "total_malloced"]


def memcstat(addr, binary):
    """`memcstat --args=slabs` as name -> value (its `\tname: value` lines)."""
    if shutil.which("memcstat") is None:
        pytest.skip("libmemcached-tools is not installed")
    args = ["memcstat", "--servers=%s:%d" % addr, "--args=slabs"] + (["--binary"] if binary else [])
    out = subprocess.run(args, capture_output=True, text=True, timeout=20, check=True).stdout
    return dict(re.findall(r"^\t(\S+): (\S+)$", out, re.M))


@pytest.mark.parametrize("binary", [False, True])
def test_memcstat_slabs_matches_memcached(server, memcached, binary):
    for addr in (server.mc, memcached):
        assert raw(addr, OPS, read_until=b"VERSION").count(b"\r\n") > 5
    ours, theirs = memcstat(server.mc, binary), memcstat(memcached, binary)
    assert list(ours) == NAMES == list(theirs), (ours, theirs)
    assert {k: ours[k] for k in SAME} == {k: theirs[k] for k in SAME}
    assert ours["1:used_chunks"] == "2" and ours["1:cmd_set"] == "4", ours
    n = {k: int(v) for k, v in ours.items()}
    assert n["1:total_chunks"] == n["1:total_pages"] * n["1:chunks_per_page"] > 0
    assert n["1:free_chunks"] == n["1:total_chunks"] - n["1:used_chunks"]
    assert 0 < n["1:free_chunks_end"] <= n["1:free_chunks"]
    assert n["total_malloced"] % n["1:total_pages"] == 0 and n["total_malloced"] > 0
    assert n["1:chunk_size"] % 8 == 0


def test_stats_slabs_is_empty_like_items_on_an_empty_store(server, memcached):
    ours = raw(server.mc, b"stats slabs\r\nstats items\r\n", read_until=b"END\r\nEND\r\n")
    theirs = raw(memcached, b"stats slabs\r\nstats items\r\n", read_until=b"END\r\nEND\r\n")
    strip = lambda r: re.sub(rb"total_malloced \d+", b"total_malloced N", r)
    assert strip(ours) == strip(theirs) == b"STAT active_slabs 0\r\nSTAT total_malloced N\r\nEND\r\nEND\r\n"


def slabs(addr):
    """`stats slabs` as name -> int."""
    reply = raw(addr, b"stats slabs\r\n", read_until=b"END\r\n")
    return {k.decode(): int(v) for k, v in re.findall(rb"STAT (\S+) (\d+)\r\n", reply)}


def test_expired_items_room_is_reused_as_memcached_issue_14_asserts(server, memcached):
    """memcached's t/issue_14.t (issue 35): 10 items of 65 KiB with a 2 s TTL, 10 more after
    they expired; `total_malloced` stays, and on ringstore no page (segment) is added and
    only the 10 live items are used chunks: the expired items' memory was reused, not only
    left out of a statistic."""
    value = b"B" * 66560
    batch = lambda first: b"".join(b"set key%d 0 2 66560\r\n%s\r\n" % (k, value)
                                   for k in range(first, first + 10))
    servers = (server.mc, memcached)
    for addr in servers:
        assert raw(addr, batch(0), read_until=b"STORED\r\n" * 10).count(b"STORED") == 10
    before = [slabs(addr) for addr in servers]
    time.sleep(4)
    for addr in servers:
        assert raw(addr, batch(10), read_until=b"STORED\r\n" * 10).count(b"STORED") == 10
    after = [slabs(addr) for addr in servers]
    for b, a in zip(before, after):
        assert a["total_malloced"] == b["total_malloced"], (b, a)
    ours_before, ours_after = before[0], after[0]
    assert ours_after["1:total_pages"] == ours_before["1:total_pages"] == 1, ours_after
    assert ours_after["1:used_chunks"] == 10, ours_after
