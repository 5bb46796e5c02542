"""Runs a fixed script of memcache operations through pylibmc (libmemcached) with binary=True
against HOST:PORT and prints one normalised line per operation: "PASS name: got" or
"FAIL name: got (want: expected)". The expectations are memcached 1.6.18's answers.

Run with Debian's /usr/bin/python3 (python3-pylibmc), not the test virtual environment."""

import random
import sys
import time
import zlib

import pylibmc

ADDR = sys.argv[1]
BEHAVIORS = {
    "cas": True,
    "connect_timeout": 1000,
    "_poll_timeout": 1000,
    "retry_timeout": 0,
    "tcp_nodelay": True,
}
mc = pylibmc.Client([ADDR], binary=True, behaviors=BEHAVIORS)
# The same server through libmemcached's quiet (noreply) binary opcodes (SETQ, DELETEQ...).
quiet = pylibmc.Client([ADDR], binary=True, behaviors={**BEHAVIORS, "_noreply": True})
failed = 0


def norm(value):
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {norm(v)}" for k, v in sorted(value.items())) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(norm(v) for v in value) + "]"
    return repr(value)


def op(name, want, fn):
    global failed
    try:
        got = norm(fn())
    except Exception as e:  # the class is the result; the message names addresses
        got = f"err:{type(e).__name__}"
    if got == want:
        print(f"PASS {name}: {got}", flush=True)
    else:
        failed += 1
        print(f"FAIL {name}: {got} (want: {want})", flush=True)


def pattern(n):
    return random.Random(7).randbytes(n)


def digest(v):
    return None if v is None else f"len={len(v)} crc={zlib.crc32(v):08x}"


def cas_of(key):
    got = mc.gets(key)
    return got[1] if got and got[1] else None


def seq(*steps):
    """Runs the steps in order and returns the last result."""
    out = None
    for step in steps:
        out = step()
    return out


op("flush_all", "True", mc.flush_all)
op("stats", "[True, True, True]", lambda: [k in mc.get_stats()[0][1] for k in ("pid", "curr_items", "version")])
op("get missing", "None", lambda: mc.get("pl:missing"))
op("set", "True", lambda: mc.set("pl:a", b"alpha"))
op("get", "b'alpha'", lambda: mc.get("pl:a"))
op("set str", "True", lambda: mc.set("pl:s", "text"))
op("get str", "'text'", lambda: mc.get("pl:s"))
op("set int", "True", lambda: mc.set("pl:i", 42))
op("get int", "42", lambda: mc.get("pl:i"))
op("set object", "True", lambda: mc.set("pl:o", {"n": [1, 2, 3]}))
op("get object", "{'n': [1, 2, 3]}", lambda: mc.get("pl:o"))
op("add existing", "False", lambda: mc.add("pl:a", b"x"))
op("add new", "True", lambda: mc.add("pl:b", b"bee"))
op("replace missing", "err:NotFound", lambda: mc.replace("pl:missing", b"x"))
op("replace existing", "True", lambda: mc.replace("pl:b", b"bee2"))
op("get replaced", "b'bee2'", lambda: mc.get("pl:b"))
op("append", "True", lambda: mc.append("pl:a", b"-tail"))
op("prepend", "True", lambda: mc.prepend("pl:a", b"head-"))
op("get appended", "b'head-alpha-tail'", lambda: mc.get("pl:a"))
op("append missing", "False", lambda: mc.append("pl:missing", b"x"))
op("prepend missing", "False", lambda: mc.prepend("pl:missing", b"x"))
op("delete", "True", lambda: mc.delete("pl:b"))
op("delete missing", "False", lambda: mc.delete("pl:b"))
op("get deleted", "None", lambda: mc.get("pl:b"))

# Multi operations.
op("set_multi", "[]", lambda: mc.set_multi({"m1": b"one", "m2": b"two", "m3": b"three"}, key_prefix="pl:"))
op("get_multi", "{'m1': b'one', 'm3': b'three'}", lambda: mc.get_multi(["m1", "m3", "missing"], key_prefix="pl:"))
op("get_multi all missing", "{}", lambda: mc.get_multi(["pl:x1", "pl:x2"]))
op("add_multi", "['pl:m1']", lambda: mc.add_multi({"pl:m1": b"no", "pl:m4": b"four"}))
op("delete_multi", "True", lambda: mc.delete_multi(["pl:m3", "pl:m4"]))
op("get_multi after delete_multi", "{'pl:m1': b'one', 'pl:m2': b'two'}", lambda: mc.get_multi(["pl:m1", "pl:m2", "pl:m3", "pl:m4"]))
op("get_multi 200 keys", "200", lambda: seq(
    lambda: mc.set_multi({f"pl:many{i}": str(i).encode() * 10 for i in range(200)}),
    lambda: len(mc.get_multi([f"pl:many{i}" for i in range(200)]))))
op("quiet set_multi", "[]", lambda: quiet.set_multi({"pl:q1": b"q-one", "pl:q2": b"q-two"}))
op("quiet delete", "True", lambda: quiet.delete("pl:q2"))
op("quiet set", "True", lambda: quiet.set("pl:q3", b"q-three"))
# Read back on the same connection: a quiet write has no reply to wait for, so another
# connection could overtake it.
op("get after quiet ops", "{'pl:q1': b'q-one', 'pl:q3': b'q-three'}", lambda: quiet.get_multi(["pl:q1", "pl:q2", "pl:q3"]))
op("get after quiet ops elsewhere", "b'q-three'", lambda: mc.get("pl:q3"))

# CAS.
op("gets", "[b'one', True]", lambda: (lambda g: [g[0], isinstance(g[1], int) and g[1] > 0])(mc.gets("pl:m1")))
op("gets missing", "[None, None]", lambda: mc.gets("pl:missing"))
op("cas with token", "True", lambda: mc.cas("pl:m1", b"one-cas", cas_of("pl:m1")))
op("get after cas", "b'one-cas'", lambda: mc.get("pl:m1"))
op("cas stale token", "False", lambda: (lambda t: seq(lambda: mc.set("pl:m1", b"changed"),
                                                      lambda: mc.cas("pl:m1", b"stale", t)))(cas_of("pl:m1")))
op("get after stale cas", "b'changed'", lambda: mc.get("pl:m1"))
op("cas missing key", "err:NotFound", lambda: mc.cas("pl:missing", b"x", 12345))

# Counters.
op("incr missing", "err:NotFound", lambda: mc.incr("pl:n"))
op("set counter", "True", lambda: mc.set("pl:n", b"10"))
op("incr", "15", lambda: mc.incr("pl:n", 5))
op("decr", "12", lambda: mc.decr("pl:n", 3))
op("decr below zero", "0", lambda: mc.decr("pl:n", 100))
op("get counter", "b'0 '", lambda: mc.get("pl:n"))
op("decr missing", "err:NotFound", lambda: mc.decr("pl:down", 1))
op("incr non-numeric", "err:UnknownReadFailure", lambda: mc.incr("pl:a", 1))
op("incr wraps", "1", lambda: seq(lambda: mc.set("pl:big", b"18446744073709551615"), lambda: mc.incr("pl:big", 2)))
op("incr_multi", "None", lambda: seq(lambda: mc.set_multi({"pl:c1": b"1", "pl:c2": b"2"}),
                                     lambda: mc.incr_multi(["pl:c1", "pl:c2"], delta=10)))
op("get after incr_multi", "{'pl:c1': b'11', 'pl:c2': b'12'}", lambda: mc.get_multi(["pl:c1", "pl:c2"]))

# Large values: just under the 1 MiB item limit, and over it (refused by the server).
LARGE = pattern(1_000_000)
op("set ~1MB", "True", lambda: mc.set("pl:large", LARGE))
op("get ~1MB", repr(digest(LARGE)), lambda: digest(mc.get("pl:large")))
op("set 2MiB too large", "err:TooBig", lambda: mc.set("pl:huge", pattern(2 << 20)))
op("get after too large", "None", lambda: mc.get("pl:huge"))
op("connection fine after too large", "b'two'", lambda: mc.get("pl:m2"))

# Touch and expiry (one 2 s wait for every short TTL).
op("touch", "True", lambda: mc.touch("pl:m2", 100))
op("touch missing", "False", lambda: mc.touch("pl:missing", 100))
op("set ttl 1", "True", lambda: mc.set("pl:ttl", b"short", time=1))
op("set ttl 100", "True", lambda: mc.set("pl:long", b"long", time=100))
op("set_multi ttl 1", "[]", lambda: mc.set_multi({"pl:t1": b"1", "pl:t2": b"2"}, time=1))
op("touch to 1s", "True", lambda: seq(lambda: mc.set("pl:touched", b"t"), lambda: mc.touch("pl:touched", 1)))
# TTL 1 may lapse at the server's next clock tick, even right away; TTL 2 lives past 1 s.
op("get ttl 2 right away", "b'two'", lambda: seq(lambda: mc.set("pl:ttl2", b"two", time=2), lambda: mc.get("pl:ttl2")))
time.sleep(2.0)
op("get expired", "None", lambda: mc.get("pl:ttl"))
op("get_multi expired", "{}", lambda: mc.get_multi(["pl:t1", "pl:t2"]))
op("get touched expired", "None", lambda: mc.get("pl:touched"))
op("get not expired", "b'long'", lambda: mc.get("pl:long"))

op("flush_all at the end", "True", mc.flush_all)
op("get after flush", "None", lambda: mc.get("pl:long"))
sys.exit(1 if failed else 0)
