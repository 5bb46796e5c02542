"""Scale-out on an existing engine: three ringstore servers behind nutcracker (twemproxy), the
pool and the client server list generated from an inventory by `cargo xtask scaleout`.

Each backend is a host process on its own loopback address (127.0.0.2-4; distinct addresses
stand in for distinct machines, as ketama hashes addresses). pymemcache through the proxy sets
and gets 10,000 keys; each backend's share is within 25% of a third; multi-key gets span
backends; with auto_eject_hosts a killed backend costs only its keys. Whether nutcracker and
libmemcached's ketama (pylibmc, Debian's python3-pylibmc for /usr/bin/python3) place each key
on the same server is measured, as is pymemcache's HashClient (rendezvous hashing).
"""

import json
import os
import signal
import socket
import subprocess
import time

import pytest
from pymemcache.client.base import Client
from pymemcache.client.hash import HashClient

ROOT = os.path.join(os.path.dirname(__file__), "../..")
KEYS = 10_000
SYSTEM_PYTHON = "/usr/bin/python3"

# Asks libmemcached (pylibmc) directly, per behaviour set, which of the keys it finds.
PYLIBMC_PROBE = """
import json, sys, pylibmc
servers, count = json.loads(sys.argv[1]), int(sys.argv[2])
keys = ["key:%d" % i for i in range(count)]
out = {}
for name, behaviors in [("ketama_weighted", {"ketama_weighted": True}), ("ketama", {"ketama": True})]:
    c = pylibmc.Client(servers, behaviors=behaviors)
    found = 0
    for at in range(0, count, 500):
        found += len(c.get_multi(keys[at:at + 500]))
    out[name] = found / count
print(json.dumps(out))
"""


# One port for all three backends, tried in order: the ring depends on the addresses and port,
# and for these it was measured to split 10,000 keys within 10% of a third (43211: 3373, 3425,
# 3202). With ephemeral ports the shares came out from 27% to 38%: inside the bound, but a
# ring drawn at random would leave it now and then.
PORTS = (43211, 45211, 41311)


def bindable(port):
    for n in (2, 3, 4):
        with socket.socket() as s:
            # As the server binds: a port left in TIME_WAIT by the previous run is usable.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((f"127.0.0.{n}", port))
            except OSError:
                return False
    return True


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def xtask(*args):
    """`cargo xtask ARGS` (the running xtask binary when `cargo xtask test` runs this)."""
    binary = os.environ.get("XTASK_BIN")
    command = [binary, *args] if binary else ["cargo", "xtask", *args]
    subprocess.run(command, cwd=ROOT, check=True, timeout=300)


def wait_listening(addr, timeout=10):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(addr, timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"nothing listens on {addr}")


def items(addr):
    c = Client(addr, connect_timeout=2, timeout=5)
    try:
        return int(c.stats()[b"curr_items"])
    finally:
        c.close()


def held_by(addr, keys):
    """The keys of `keys` that the server at `addr` holds itself."""
    c = Client(addr, connect_timeout=2, timeout=5)
    try:
        held = set()
        for at in range(0, len(keys), 500):
            held.update(c.get_many(keys[at:at + 500]))
        return held
    finally:
        c.close()


@pytest.fixture
def pool(server_factory, tmp_path):
    port = next((p for p in PORTS if bindable(p)), 0)
    print(f"backends on port {port} of 127.0.0.2-4")
    backends = []
    for n in (2, 3, 4):
        backends.append(server_factory(
            "--memcache", f"127.0.0.{n}:{port}", "--http", f"127.0.0.{n}:0",
            "--memory", "64MiB", "--cores", "1", "--hostname", f"shard-{n}",
        ))
    proxy = ("127.0.0.1", free_port())
    hosts = "".join(
        f'[[host]]\nmac = "02:00:00:00:00:0{i}"\nhostname = "shard-{i + 2}"\n'
        f'ringstore = {{ memcache = "{s.mc[0]}:{s.mc[1]}" }}\n'
        for i, s in enumerate(backends)
    )
    inventory = tmp_path / "inventory.toml"
    inventory.write_text(
        "[scaleout]\n"
        f'listen = "{proxy[0]}:{proxy[1]}"\n'
        "timeout_ms = 500\nserver_retry_timeout_ms = 60000\nserver_failure_limit = 1\n\n" + hosts
    )
    out = tmp_path / "scaleout"
    xtask("scaleout", "--inventory", str(inventory), "--out", str(out))
    servers = (out / "servers.txt").read_text().split()
    assert servers == [f"{s.mc[0]}:{s.mc[1]}" for s in backends]
    nutcracker = subprocess.Popen(
        ["nutcracker", "-c", str(out / "nutcracker.yml"), "-s", str(free_port()), "-a", "127.0.0.1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    try:
        wait_listening(proxy)
        yield backends, proxy, servers
    finally:
        nutcracker.kill()
        nutcracker.wait()


def test_three_backends_behind_nutcracker(pool):
    backends, proxy, servers = pool
    keys = [f"key:{i}" for i in range(KEYS)]
    value = {k: f"v-{k}".encode() for k in keys}
    client = Client(proxy, connect_timeout=2, timeout=5)
    for at in range(0, KEYS, 500):
        failed = client.set_many({k: value[k] for k in keys[at:at + 500]}, noreply=False)
        assert failed == [], f"{len(failed)} sets failed through the proxy"

    # Every key back through the proxy, 100 per multi-key get (each spans the backends).
    for at in range(0, KEYS, 100):
        got = client.get_many(keys[at:at + 100])
        assert got == {k: value[k] for k in keys[at:at + 100]}

    # Each backend holds a share within 25% of a third; together exactly every key once.
    shares = [items(s.mc) for s in backends]
    assert sum(shares) == KEYS, shares
    for share in shares:
        assert abs(share - KEYS / 3) <= 0.25 * KEYS / 3, shares
    owner = {}
    for s in backends:
        for k in held_by(s.mc, keys):
            owner[k] = s
    assert len(owner) == KEYS
    spanning = keys[:30]
    assert len({owner[k] for k in spanning}) == 3, "the first 30 keys should span all three"
    assert client.get_many(spanning) == {k: value[k] for k in spanning}

    # Same server for each key? libmemcached's weighted ketama (pylibmc) and pymemcache's
    # HashClient (rendezvous), both talking to the backends directly.
    probe = subprocess.run(
        [SYSTEM_PYTHON, "-c", PYLIBMC_PROBE, json.dumps(servers), str(KEYS)],
        check=True, capture_output=True, text=True, timeout=60,
    )
    agree = json.loads(probe.stdout)
    hashing = HashClient([(s.mc[0], s.mc[1]) for s in backends], connect_timeout=2, timeout=5)
    found = 0
    for at in range(0, KEYS, 500):
        found += len(hashing.get_many(keys[at:at + 500]))
    agree["pymemcache_hashclient"] = found / KEYS
    hashing.close()
    print(f"placement agreement with nutcracker (md5, ketama): {agree}")
    assert agree["ketama_weighted"] >= 0.999, agree
    # Plain (unweighted) ketama and rendezvous hashing agree only by chance (about a third).
    assert agree["ketama"] < 0.7 and agree["pymemcache_hashclient"] < 0.7, agree

    # A killed backend costs only its own keys; the other two keep serving through the proxy.
    victim = backends[1]
    lost = {k for k, s in owner.items() if s is victim}
    victim.stop(signal.SIGKILL)
    errors = served = missed = 0
    for k in keys:
        try:
            got = client.get(k)
        except Exception:  # the request that finds the backend dead: an error, then ejection
            errors += 1
            assert k in lost, f"{k} is not on the killed backend but failed"
            continue
        if got is None:
            missed += 1
            assert k in lost, f"{k} is not on the killed backend but missed"
        else:
            assert got == value[k]
            served += 1
    assert served == KEYS - len(lost), (served, len(lost))
    assert errors <= 2, f"{errors} errors: ejection should follow the first failure"
    print(f"shares {shares}; after the kill: {served} served, {missed} missed, {errors} errors")
    # The ejected backend's keys hash to the survivors now: writes and multi-key gets work.
    orphan = sorted(lost)[:50]
    assert client.set_many({k: b"again" for k in orphan}, noreply=False) == []
    assert client.get_many(orphan) == {k: b"again" for k in orphan}
    kept = [k for k in keys[:60] if k not in lost]
    assert client.get_many(kept) == {k: value[k] for k in kept}
    for s in (backends[0], backends[2]):
        stats = Client(s.mc, connect_timeout=2, timeout=5).stats()
        assert stats[b"hostname"].decode().startswith("shard-")
    client.close()
