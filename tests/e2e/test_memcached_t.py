"""memcached's own tests (its t/*.t files, run with `prove`) against Debian's memcached
1.6.18 and against ringstore with the same certificates (the repository's t/*.pem): its
TLS files, ascii-auth.t, binary-sasl.t and a protocol subset of the general suite with
SSL_TEST=1. Every file memcached passes, ringstore passes too, except EXCLUDED.

Nothing is vendored: the harness comes from Debian's source package of the memcached
installed (1.6.18-1, or its stable update 1.6.18-1+deb12u1 as here), fetched once with `apt-get source` (a deb-src entry built at run time from this machine's
own apt sources) into ~/.cache/ringstore/memcached-src and unpacked with dpkg-source
(apt checks the .dsc against the signed index, dpkg-source the tarballs against the .dsc).
The harness (t/lib/MemcachedTest.pm) starts `./memcached-debug` under `./timedrun` from
its working directory; here that directory holds t/ (the unpacked files), timedrun
(compiled from the package's timedrun.c) and memcached-debug =
tests/memcached_t/memcached_shim.py, which runs /usr/bin/memcached or translates the
flags to `ringstore serve` (docs/OPERATIONS.md "memcached's own tests").
"""

import concurrent.futures
import contextlib
import fcntl
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import BIN

PACKAGE, UPSTREAM = "memcached", "1.6.18"


def installed_version():
    """The Debian version of the memcached we compare with (1.6.18-1, or a stable update of
    it such as 1.6.18-1+deb12u1): its tests come from the same source package."""
    out = subprocess.run(["dpkg-query", "-W", "-f=${source:Version}", PACKAGE],
                         stdout=subprocess.PIPE, check=True).stdout.decode()
    assert out.startswith(UPSTREAM + "-"), f"memcached {out} installed, the comparison is with {UPSTREAM}"
    return out


VERSION = installed_version()
HERE = Path(__file__).resolve().parent
SHIM = HERE.parent / "memcached_t" / "memcached_shim.py"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "ringstore" / "memcached-src"
SOURCE = CACHE / f"{PACKAGE}-{VERSION}"

# (file, SSL_TEST): every TLS file; the auth files (ascii-auth.t in the clear and over TLS;
# binary-sasl.t in the clear, as memcached's own `make test` runs it); and the general
# files about what clients see of the protocol, over TLS. Left out: memcached internals
# (extstore, proxy, lru-crawler/maintainer, slab rebalancing, restart, dash-M, daemonize,
# idle-timeout, maxconns, stats-conns/detail), memcached-debug's `debugtime` (expirations)
# and the slowest protocol files (chunked-items, item_size_max, issue_41: 7-30 s each on a
# loaded 2-core host, covering what getset.t and binary.t already cover). issue_14 (the
# memory of expired items is reused: `total_malloced` does not grow) is run: about 5 s,
# most of it the file's own sleep, in parallel with the others.
TLS_FILES = ["ssl_ports", "ssl_settings", "ssl_verify_modes", "ssl_proto_version",
             "ssl_cert_refresh", "ssl_session_resumption"]
GENERAL_FILES = ["getset", "cas", "incrdecr", "noreply", "flags", "flush-all", "binary",
                 "binary-get", "metaget", "touch", "getandtouch", "quit", "bogus-commands",
                 "malicious-commands", "multiversioning", "line-lengths", "strtol-testing",
                 "issue_3", "issue_14", "issue_22", "issue_29", "issue_50", "issue_61", "issue_68", "issue_70",
                 "issue_104", "issue_108", "issue_152"]
RUNS = ([(f, True) for f in TLS_FILES] + [("ascii-auth", False), ("ascii-auth", True)]
        + [(f, True) for f in GENERAL_FILES])
SERIAL_RUNS = [("binary-sasl", False)]  # its sasldb is one fixed path: run alone

# Files ringstore need not pass, with why (each fails an assertion named here, or the shim
# refuses a flag it starts with).
EXCLUDED = {
    "ssl_settings": "asserts memcached's OpenSSL knobs in `stats settings` (ssl_wbuf_size, "
                    "ssl_keyformat, ssl_ciphers, ssl_session_cache no) and restarts with "
                    "-o ssl_wbuf_size, which ringstore has no counterpart for",
    "binary-sasl": "memcached -S checks a Cyrus sasldb the file writes with saslpasswd2 after "
                   "the server started, and lists CRAM-MD5 beside PLAIN; ringstore reads its "
                   "users from --auth-file at start and offers PLAIN only: the shim refuses -S",
    "flush-all": "-C (CAS off) and -F (flush_all off): ringstore has neither switch",
    "issue_22": "asserts slab class 31's evictions (items:31:evicted); ringstore has one item class",
    "strtol-testing": "`slabs automove`: memcached's slab mover; ringstore answers ERROR (README differences)",
    "issue_50": "-B binary: ringstore always tells text from binary by the first byte",
    "issue_61": "-R (requests per event before yielding): no counterpart",
}

PROVE_TIMEOUT = 150  # seconds per file; the slowest (binary.t) takes about 40


@contextlib.contextmanager
def locked(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def deb_src_entry():
    """This machine's own apt sources as deb-src (deb822 stanzas from
    /etc/apt/sources.list.d/debian.sources, else the `deb` lines of /etc/apt/sources.list)."""
    deb822 = Path("/etc/apt/sources.list.d/debian.sources")
    if deb822.exists():
        keep = ("URIs:", "Suites:", "Components:", "Signed-By:")
        stanzas = []
        for stanza in deb822.read_text().split("\n\n"):
            lines = stanza.strip().splitlines()
            types = [l for l in lines if l.startswith("Types:")]
            if not types or "deb" not in types[0].split()[1:]:
                continue
            fields = [l for l in lines if l.startswith(keep)]
            stanzas.append("\n".join(["Types: deb-src", *fields]))
        return "sources", "\n\n".join(stanzas) + "\n"
    lines = Path("/etc/apt/sources.list").read_text().splitlines()
    src = ["deb-src " + l[4:] for l in lines if l.startswith("deb ")]
    return "list", "\n".join(src) + "\n"


def fetch_source():
    """Debian's memcached 1.6.18-1 source, downloaded once into CACHE."""
    with locked(CACHE / ".lock"):
        if (SOURCE / "t" / "lib" / "MemcachedTest.pm").exists():
            return SOURCE
        assert os.geteuid() == 0, "fetching memcached's source needs root (apt-get update)"
        kind, entry = deb_src_entry()
        assert entry.strip(), "no apt source on this machine to build a deb-src entry from"
        dl = CACHE / "download"
        shutil.rmtree(dl, ignore_errors=True)
        dl.mkdir(parents=True)
        listing = CACHE / f"ringstore-src.{kind}"
        listing.write_text(entry)
        # Only this entry, and nothing else of apt's lists removed or replaced.
        opts = ["-o", f"Dir::Etc::sourcelist={listing}", "-o", "Dir::Etc::sourceparts=-",
                "-o", "APT::Get::List-Cleanup=0"]
        subprocess.run(["apt-get", *opts, "update", "-qq"], check=True, timeout=300)
        subprocess.run(["apt-get", *opts, "source", "--download-only", f"{PACKAGE}={VERSION}"],
                       cwd=dl, check=True, timeout=300)
        unpacked = CACHE / "unpacking"
        shutil.rmtree(unpacked, ignore_errors=True)
        subprocess.run(["dpkg-source", "-x", f"{PACKAGE}_{VERSION}.dsc", str(unpacked)],
                       cwd=dl, check=True, timeout=120, stdout=subprocess.DEVNULL)
        unpacked.rename(SOURCE)
        shutil.rmtree(dl)
        for left in CACHE.glob("*.orig.tar.*"):  # dpkg-source's link beside the tree
            left.unlink()
        return SOURCE


def build_dir(root, source, name):
    """What the harness takes as memcached's build directory: t/, timedrun, memcached-debug."""
    d = root / name
    d.mkdir()
    (d / "t").symlink_to(source / "t")
    timedrun = source.parent / "timedrun"
    if not timedrun.exists():
        subprocess.run(["cc", "-O2", "-o", str(timedrun), str(source / "timedrun.c")], check=True)
    (d / "timedrun").symlink_to(timedrun)
    exe = d / "memcached-debug"
    exe.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{SHIM}" "$@"\n')
    exe.chmod(0o755)
    return d


def prove(d, env, name, ssl):
    """One file with prove; (passed, output tail)."""
    env = dict(env)
    if ssl:
        env["SSL_TEST"] = "1"
    else:
        env.pop("SSL_TEST", None)
    started = time.monotonic()
    try:
        out = subprocess.run(["prove", "-v", f"t/{name}.t"], cwd=d, env=env, timeout=PROVE_TIMEOUT,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        text = out.stdout.decode(errors="replace")
        ok = out.returncode == 0 and "Result: PASS" in text and " skipped: " not in text
    except subprocess.TimeoutExpired:
        text, ok = f"timed out after {PROVE_TIMEOUT} s", False
    lines = [l for l in text.splitlines() if not l.startswith(("ok ", "ringstore: ", "ready "))]
    return ok, time.monotonic() - started, "\n".join(lines[-25:])


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    source = fetch_source()
    root = tmp_path_factory.mktemp("memcached-t")
    base = {k: v for k, v in os.environ.items() if k not in ("MEMCACHED_BIN", "RINGSTORE_IO")}
    base["RUN_SASL_TESTS"] = "1"
    base["PYTHONDONTWRITEBYTECODE"] = "1"
    return {
        "memcached": (build_dir(root, source, "memcached"), dict(base, MEMCACHED_BIN="/usr/bin/memcached")),
        "ringstore": (build_dir(root, source, "ringstore"), dict(base, RINGSTORE_BIN=str(Path(BIN).resolve()))),
    }


def run_all(dirs):
    """Every (server, file, ssl): three at a time (the files mostly wait on sockets and
    sleeps), then SERIAL_RUNS one by one; a file that fails in the parallel pass is run
    again alone, since concurrent harnesses can race for one free_port()."""
    jobs = [(server, name, ssl) for name, ssl in RUNS for server in dirs]
    results = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=3) as pool:
        futures = {job: pool.submit(prove, *dirs[job[0]], job[1], job[2]) for job in jobs}
        for job, future in futures.items():
            results[job] = future.result()
    again = [j for j, r in results.items() if not r[0] and not (j[0] == "ringstore" and j[1] in EXCLUDED)]
    for job in again:
        print(f"again, alone: {job}")
    for job in again + [(s, n, t) for n, t in SERIAL_RUNS for s in dirs]:
        results[job] = prove(*dirs[job[0]], job[1], job[2])
    return results


@pytest.mark.skipif(shutil.which("prove") is None, reason="needs perl's prove")
def test_memcached_own_tests_pass_on_ringstore_where_they_pass_on_memcached(dirs):
    started = time.monotonic()
    results = run_all(dirs)
    for (server, name, ssl), (ok, took, _) in sorted(results.items(), key=lambda kv: kv[0][1:]):
        mark = "PASS" if ok else ("fail (excluded)" if name in EXCLUDED and server == "ringstore" else "FAIL")
        print(f"{server:9} {name:24} SSL_TEST={int(ssl)} {took:5.1f}s {mark}")
    print(f"total {time.monotonic() - started:.1f}s")
    # memcached itself passes every chosen file (else the comparison would prove nothing).
    theirs = {job[1:]: r for job, r in results.items() if job[0] == "memcached"}
    failed = {f"{n} SSL_TEST={int(s)}": r[2] for (n, s), r in theirs.items() if not r[0]}
    assert not failed, f"memcached 1.6.18 fails: {failed}"
    ours = {job[1:]: r for job, r in results.items() if job[0] == "ringstore"}
    failed = {f"{n} SSL_TEST={int(s)}": r[2] for (n, s), r in ours.items()
              if not r[0] and n not in EXCLUDED}
    assert not failed, "ringstore fails what memcached passes:\n" + "\n\n".join(
        f"== {k}\n{v}" for k, v in failed.items())


def test_the_shim_refuses_what_it_cannot_map(tmp_path):
    """A flag with no ringstore counterpart stops the start with one line and exit 64."""
    env = dict(os.environ, RINGSTORE_BIN=str(Path(BIN).resolve()))
    env.pop("MEMCACHED_BIN", None)
    for args in (["-S"], ["-C"], ["-o", "ext_path=/tmp/x:64m"], ["-B", "binary"], ["-s", "/tmp/s"]):
        out = subprocess.run([sys.executable, str(SHIM), "-p", "0", *args], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=10)
        assert out.returncode == 64, (args, out)
        assert re.match(rb"memcached_shim: cannot map .+ to ringstore serve\n$", out.stderr), out.stderr
