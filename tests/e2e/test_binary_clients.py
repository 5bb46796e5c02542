"""End-to-end with real binary-protocol memcache clients: Dalli (Debian's ruby-dalli 3.0.6, binary
only), pylibmc with binary=True, php-memcached with OPT_BINARY_PROTOCOL, and the Rust `memcache`
crate in its default (binary) mode. Each runs one script of operations (tests/clients/) against
memcached 1.6.18 and against ringstore in the same test; every operation prints one normalised
line, and ringstore's lines must equal memcached's. The scripts hold memcached's answers as
their expectations, so the per-server pass counts ("binary client ... memcached N/N, ringstore
M/N") say how far ringstore is from the reference, and a hang fails within SCRIPT_TIMEOUT."""

import os
import shutil
import subprocess
import time

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "../.."))
CLIENTS_DIR = os.path.join(ROOT, "tests/clients")
RUST_PROJECT = os.path.join(CLIENTS_DIR, "rust-memcache")
RUST_TARGET = os.path.join(ROOT, "target/clients")
RUST_BIN = os.path.join(RUST_TARGET, "release/rust-memcache-ops")
# One script's bound on one server; each script takes about 2.5 s (2 s of it expiry waits).
SCRIPT_TIMEOUT = 30


def _interpreted(program, probe, script, package):
    """The command that runs a client script, or a skip when the client is not installed."""
    path = shutil.which(program)
    if path is None or subprocess.run([path, *probe], capture_output=True).returncode:
        pytest.skip(f"{package} is not installed (cargo xtask test installs it)")
    return [path, os.path.join(CLIENTS_DIR, script)]


def _rust():
    cargo = shutil.which("cargo")
    if cargo is None:
        pytest.skip("cargo is not on PATH")
    # Built once into target/clients (a no-op when up to date); the lock file is committed.
    build = subprocess.run(
        [cargo, "build", "--release", "--locked", "--quiet", "--manifest-path",
         os.path.join(RUST_PROJECT, "Cargo.toml"), "--target-dir", RUST_TARGET],
        capture_output=True, text=True, timeout=600,
    )
    assert build.returncode == 0, f"building tests/clients/rust-memcache failed:\n{build.stderr}"
    return [RUST_BIN]


CLIENTS = {
    "dalli": lambda: _interpreted("ruby", ["-e", "require 'dalli'"], "dalli_ops.rb", "ruby with ruby-dalli"),
    # Debian's python3-pylibmc lives in the system interpreter, not in the test venv.
    "pylibmc": lambda: _interpreted("/usr/bin/python3", ["-c", "import pylibmc"], "pylibmc_ops.py", "python3-pylibmc"),
    "php-memcached": lambda: _interpreted(
        "php", ["-r", "exit(class_exists('Memcached') ? 0 : 1);"], "php_memcached_ops.php", "php-cli with php-memcached"
    ),
    "rust-memcache": _rust,
}


def parse(stdout):
    """[(name, result, passed)] from the script's "PASS name: got" / "FAIL name: got (want: x)"."""
    ops = []
    for line in stdout.splitlines():
        verdict, _, rest = line.partition(" ")
        if verdict not in ("PASS", "FAIL"):
            continue
        if verdict == "FAIL":
            rest = rest.rsplit(" (want: ", 1)[0]
        name, _, got = rest.partition(": ")
        ops.append((name, got, verdict == "PASS"))
    return ops


def run_both(cmd, servers):
    """Runs the script against every server at once; {label: (ops, stdout, stderr, timed_out)}."""
    procs = {
        label: subprocess.Popen(cmd + [f"{host}:{port}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, cwd=ROOT)
        for label, (host, port) in servers.items()
    }
    deadline = time.monotonic() + SCRIPT_TIMEOUT
    out = {}
    for label, proc in procs.items():
        timed_out = False
        try:
            stdout, stderr = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
            proc.kill()
            stdout, stderr = proc.communicate()
        out[label] = (parse(stdout), stdout, stderr, timed_out)
    return out


@pytest.mark.parametrize("client", list(CLIENTS))
def test_binary_client_matches_memcached(client, memcached, server, record_property):
    cmd = CLIENTS[client]()
    res = run_both(cmd, {"memcached": memcached, "ringstore": server.mc})
    want, want_out, want_err, want_timeout = res["memcached"]
    got, _, got_err, got_timeout = res["ringstore"]

    # The reference run: the script completes and memcached gives every expected answer.
    assert not want_timeout, f"{client} against memcached ran past {SCRIPT_TIMEOUT}s:\n{want_out}{want_err}"
    assert want, f"{client} printed nothing against memcached:\n{want_err}"
    assert all(ok for _, _, ok in want), f"{client} expectations differ from memcached:\n{want_out}"

    total = len(want)
    answers = {name: result for name, result, _ in got}
    want_names = {name for name, _, _ in want}
    passed = sum(1 for name, result, _ in want if answers.get(name) == result)
    summary = f"binary client {client}: memcached {total}/{total}, ringstore {passed}/{total}"
    record_property("pass_counts", summary)
    print(summary)
    lines = [
        f"  {name}: memcached {result!r}, ringstore {answers[name]!r}" if name in answers
        else f"  {name}: memcached {result!r}, ringstore (no answer)"
        for name, result, _ in want
        if answers.get(name) != result
    ]
    lines += [f"  {name}: only ringstore answered {result!r}" for name, result, _ in got if name not in want_names]
    note = f" (ran past {SCRIPT_TIMEOUT}s)" if got_timeout else ""
    assert not lines, (
        f"{summary}{note}; differences:\n" + "\n".join(lines) + f"\nringstore stderr: {got_err[-2000:]}"
    )
    assert server.alive(), "ringstore exited during the run"
