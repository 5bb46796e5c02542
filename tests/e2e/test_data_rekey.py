"""End-to-end `data rekey` for `ringstore serve --data-key FILE` (ADR 0055): keys, values and
a 1 MiB object written under one key; `FILE.next` written and SIGHUP: the server switches to
it (new records under the new key at once, `FILE.next` renamed over FILE), compaction rewrites
the old records in the background and the old key is retired (the superblock back to format
version 2, the retirement logged); more writes; kill -9; the data file scanned (nothing in
clear); restart with FILE (now the new key) alone: everything back; the old key is refused
with exit 2 (as replaced while the old key is kept, as wrong after), the file unchanged; and a
kill right after the switch starts with the new key, or finishes a rename not done."""

import os
import signal
import time

from test_data_key import (
    KEYS, fill, hits, key_name, serve, sha256, start_refused, value, write_key,
)
from test_durable import Conn, make_file
from test_large import MIB, get_hash


def version(path):
    with open(path, "rb") as f:
        f.seek(8)
        return int.from_bytes(f.read(4), "little")


class Log:
    """The server's stderr, read as it comes (without blocking)."""

    def __init__(self, s):
        self.s = s
        self.text = ""
        os.set_blocking(s.proc.stderr.fileno(), False)

    def wait_for(self, what, timeout, poke=None):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            chunk = self.s.proc.stderr.read(65536)
            if chunk:
                self.text += chunk.decode(errors="replace")
            if what in self.text:
                return self.text
            if poke:
                poke()
            time.sleep(0.1)
        raise AssertionError(f"no {what!r} in {timeout} s; stderr: {self.text!r}")


def check_all(s, digest, newer):
    c = Conn(s.mc)
    keys = [key_name(i) for i in range(KEYS)]
    got = {}
    for at in range(0, KEYS, 100):
        got.update(c.get_many(keys[at:at + 100]))
    want = {key_name(i): value(i) for i in range(KEYS)}
    want.update(newer)
    for k in newer:
        got.update(c.get_many([k]))
    assert got == want
    c.close()
    assert get_hash(s.http, "dk-secret-object") == (200, MIB, digest)


def start_and_rekey(server_factory, tmp_path, old_byte):
    """A server on a new data file with key `old_byte`, filled, then rekeyed the operator's
    way: the new key (`old_byte + 1`) in FILE.next, then SIGHUP. Returns what the tests use."""
    path = tmp_path / "data"
    make_file(path, 64 << 20)
    key = write_key(tmp_path / "data.key", old_byte)
    old = write_key(tmp_path / "old.key", old_byte)
    s = serve(server_factory, path, key)
    log = Log(s)
    digest = fill(s)
    assert version(path) == 2
    write_key(tmp_path / "data.key.next", old_byte + 1)
    s.proc.send_signal(signal.SIGHUP)
    log.wait_for("data device rekeyed", 20)
    return path, key, old, s, log, digest


def test_rekey_rewrites_everything_and_retires_the_old_key(server_factory, tmp_path):
    path, key, old, s, log, digest = start_and_rekey(server_factory, tmp_path, 0x42)
    assert not (tmp_path / "data.key.next").exists()
    assert (tmp_path / "data.key").read_bytes() == bytes([0x43]) * 32
    # New records from now on are under the new key; the old ones are rewritten.
    c = Conn(s.mc)
    newer = {b"dk-secret-after-%03d" % i: b"dk-secret-newvalue-%03d" % i for i in range(50)}
    for k, v in newer.items():
        assert c.set(k, v) == b"STORED"
    c.close()

    def poke():
        # Traffic wakes every worker, so each takes its compaction steps.
        c = Conn(s.mc)
        c.get_many([key_name(i) for i in range(8)])
        c.close()

    log.wait_for("old data key is retired", 60, poke)
    assert version(path) == 2
    # A second SIGHUP with no FILE.next changes nothing.
    s.proc.send_signal(signal.SIGHUP)
    s.stop(signal.SIGKILL)
    data = path.read_bytes()
    assert hits(data) == [] and b"dk-secret-after" not in data and b"dk-secret-newvalue" not in data
    # The key used before the rekey no longer opens the device; the file is unchanged.
    before = sha256(path)
    code, err = start_refused(path, "--data-key", str(old))
    assert code == 2 and "wrong data key" in err, err
    assert sha256(path) == before
    s = serve(server_factory, path, key)
    check_all(s, digest, newer)
    assert s.stop() == 0


def test_a_kill_right_after_the_switch_starts_with_either_file(server_factory, tmp_path):
    """Killed while the old key is still kept (before the retirement): the key replaced is
    refused as replaced (exit 2, file unchanged); FILE (the new key) opens and serves both
    records under the old key and under the new one; and a start that finds the rename not
    done yet (FILE still the old key, FILE.next the new one) finishes it."""
    path, key, old, s, _, digest = start_and_rekey(server_factory, tmp_path, 0x52)
    c = Conn(s.mc)
    assert c.set(b"dk-secret-late", b"dk-secret-late-value") == b"STORED"
    c.close()
    s.stop(signal.SIGKILL)
    # Compaction usually retired the old key already (version 2); if not, it is refused as
    # replaced rather than as a wrong key.
    told = {3: "replaced by a rekey", 2: "wrong data key"}[version(path)]
    before = sha256(path)
    code, err = start_refused(path, "--data-key", str(old))
    assert code == 2 and told in err, err
    assert sha256(path) == before
    # The rename undone by hand: the start finds FILE.next and finishes the rotation.
    os.rename(key, tmp_path / "data.key.next")
    write_key(key, 0x52)
    s = serve(server_factory, path, key)
    assert key.read_bytes() == bytes([0x53]) * 32
    assert not (tmp_path / "data.key.next").exists()
    check_all(s, digest, {b"dk-secret-late": b"dk-secret-late-value"})
    assert s.stop() == 0
    assert hits(path.read_bytes()) == []
