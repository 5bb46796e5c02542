"""End-to-end `--data-key FILE` (ADR 0050): everything on the data device is sealed with
AES-256-GCM. Keys, values and a 1 MiB HTTP object written, kill -9, the data file scanned for
each (no hit), restart with the key (everything back); a wrong key, no key, or a key for a
device formatted without one exits 2 with the file unchanged (sha256); a key file others can
read, or of the wrong size, is refused; a flipped byte in a sealed record is damage (ADR 0016);
and the kill -9 and fault-injecting device tests of test_durable.py pass with a key."""

import hashlib
import os
import signal
import subprocess

import pytest

import test_durable
from conftest import BIN, io_args
from test_durable import Conn, fault_device, make_file  # noqa: F401 (fault_device: a fixture)
from test_large import MIB, block, get_hash, get_range, put_stream

KEYS = 300


def write_key(path, byte, mode=0o600, size=32):
    path.write_bytes(bytes([byte]) * size)
    os.chmod(path, mode)
    return path


def serve(factory, path, key, *extra):
    return factory("--data", str(path), "--data-key", str(key), "--cores", "2", "--memory", "64MiB", *extra)


def start_refused(path, *extra, timeout=20):
    """Starts a server on `path` that must exit at once; returns (exit code, stderr)."""
    proc = subprocess.Popen(
        [BIN, "serve", "--memcache", "127.0.0.1:0", "--http", "127.0.0.1:0", "--data", str(path),
         "--cores", "2", "--memory", "64MiB", *io_args([]), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"the server started instead of exiting: {out!r} {err!r}")
    assert b"ready" not in out, out
    return proc.returncode, err.decode()


def sha256(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def key_name(i):
    return b"dk-secret-key-%04d" % i


def value(i):
    return b"dk-secret-value-%04d-" % i + b"v" * (i % 300)


def object_probes():
    """Slices of the 1 MiB object: any of them in the file means it is stored in clear."""
    b = block(0)
    return [b[at:at + 512] for at in (0, 4096, 300_000, MIB - 512)]


def fill(s):
    c = Conn(s.mc)
    for i in range(KEYS):
        assert c.set(key_name(i), value(i)) == b"STORED"
    c.close()
    status, digest = put_stream(s.http, "dk-secret-object", MIB)
    assert status in (200, 201, 204), status
    return digest


def hits(data):
    """What of the written data the raw file shows in clear."""
    found = [k for k in (key_name(0), key_name(KEYS - 1), b"dk-secret-key", b"dk-secret-value",
                         b"dk-secret-object") if k in data]
    found += [f"object slice {n}" for n, p in enumerate(object_probes()) if p in data]
    return found


def test_the_scan_finds_data_in_clear_without_a_key(server_factory, tmp_path):
    """The control for the scan below: without a key the same writes are there in clear."""
    path = tmp_path / "plain"
    make_file(path, 64 << 20)
    s = server_factory("--data", str(path), "--cores", "2", "--memory", "64MiB")
    fill(s)
    s.stop(signal.SIGKILL)
    found = hits(path.read_bytes())
    assert b"dk-secret-key" in found and "object slice 0" in found, found


def test_nothing_in_clear_and_everything_back_with_the_key(server_factory, tmp_path):
    path = tmp_path / "data"
    make_file(path, 64 << 20)
    key = write_key(tmp_path / "data.key", 0x42)
    s = serve(server_factory, path, key)
    digest = fill(s)
    s.stop(signal.SIGKILL)
    data = path.read_bytes()
    assert data[:8] == b"RINGSTOR"
    assert hits(data) == [], "found in clear on the data file"
    assert b"RSE1" in data and b"RSR1" not in data
    s = serve(server_factory, path, key)
    c = Conn(s.mc)
    keys = [key_name(i) for i in range(KEYS)]
    got = {}
    for at in range(0, KEYS, 100):
        got.update(c.get_many(keys[at:at + 100]))
    assert got == {key_name(i): value(i) for i in range(KEYS)}
    c.close()
    assert get_hash(s.http, "dk-secret-object") == (200, MIB, digest)
    status, _, body = get_range(s.http, "dk-secret-object", 300_000, 300_999)
    assert status == 206 and body == block(0)[300_000:301_000]
    assert s.stop() == 0
    assert "sealed with the data key" in s.stderr_text()
    # After the clean stop the checkpoint (the index: every key) is on the file too, sealed.
    assert hits(path.read_bytes()) == []
    s = serve(server_factory, path, key)
    c = Conn(s.mc)
    assert c.get_many(keys[:50]) == {key_name(i): value(i) for i in range(50)}
    c.close()
    assert s.stop() == 0


def test_wrong_key_no_key_and_a_key_for_a_clear_device_exit_2_untouched(server_factory, tmp_path):
    path = tmp_path / "data"
    make_file(path, 64 << 20)
    key = write_key(tmp_path / "data.key", 0x42)
    s = serve(server_factory, path, key)
    c = Conn(s.mc)
    assert c.set(b"k", b"v") == b"STORED"
    c.close()
    s.stop(signal.SIGKILL)
    before = sha256(path)
    wrong = write_key(tmp_path / "wrong.key", 0x43)
    code, err = start_refused(path, "--data-key", str(wrong))
    assert code == 2 and "wrong data key" in err, (code, err)
    assert sha256(path) == before, "a wrong key changed the device"
    code, err = start_refused(path)
    assert code == 2 and "encrypted" in err and "--data-key" in err, (code, err)
    assert sha256(path) == before, "a start without the key changed the device"
    # A device formatted without a key does not open with one.
    plain = tmp_path / "plain"
    make_file(plain, 64 << 20)
    s = server_factory("--data", str(plain), "--cores", "2", "--memory", "64MiB")
    assert s.stop() == 0
    plain_before = sha256(plain)
    code, err = start_refused(plain, "--data-key", str(key))
    assert code == 2 and "formatted without one" in err, (code, err)
    assert sha256(plain) == plain_before
    # The right key still opens it.
    s = serve(server_factory, path, key)
    c = Conn(s.mc)
    assert c.get_many([b"k"]) == {b"k": b"v"}
    c.close()


@pytest.mark.parametrize("mode,size,why", [
    (0o644, 32, "mode 0644"),
    (0o640, 32, "mode 0640"),
    (0o600, 31, "31 bytes"),
    (0o600, 64, "64 bytes"),
])
def test_a_key_file_others_can_read_or_of_the_wrong_size_is_refused(tmp_path, mode, size, why):
    path = tmp_path / "data"
    make_file(path, 64 << 20)
    before = sha256(path)
    key = write_key(tmp_path / "data.key", 0x42, mode=mode, size=size)
    code, err = start_refused(path, "--data-key", str(key))
    assert code == 2 and why in err and "data.key" in err, (code, err)
    assert sha256(path) == before


def sealed_records(data, start):
    """8-aligned offsets of sealed record magics from `start`."""
    out = []
    at = data.find(b"RSE1", start)
    while at != -1:
        if at % 8 == 0:
            out.append(at)
        at = data.find(b"RSE1", at + 1)
    return out


def test_a_flipped_byte_in_a_sealed_record_is_damage(server_factory, tmp_path):
    """As test_durable_hardening's flipped byte, on a sealed device: the record cannot be found
    by its value, so the first sealed record (later ones say it was durable) is flipped."""
    path = tmp_path / "data"
    make_file(path, 64 << 20)
    key = write_key(tmp_path / "data.key", 0x42)
    s = serve(server_factory, path, key, "--cores", "1")
    c = Conn(s.mc)
    for k, v in [(b"k", b"value-A"), (b"d", b"value-D"), (b"f", b"value-F"), (b"k", b"value-B")]:
        assert c.set(k, v) == b"STORED"
    c.close()
    s.stop(signal.SIGKILL)
    data = bytearray(path.read_bytes())
    recs = sealed_records(data, 4096)
    assert len(recs) >= 4, recs
    data[recs[0] + 64] ^= 0x01  # inside the ciphertext of the first record (k = value-A)
    path.write_bytes(bytes(data))
    before = sha256(path)
    code, err = start_refused(path, "--data-key", str(key), "--cores", "1")
    assert code == 2 and "acknowledged history" in err, (code, err)
    assert sha256(path) == before
    s = serve(server_factory, path, key, "--cores", "1", "--data-recover", "salvage")
    c = Conn(s.mc)
    got = c.get_many([b"k", b"d", b"f"])
    assert got == {b"k": b"value-B", b"d": b"value-D", b"f": b"value-F"}, got
    c.close()
    assert s.stop() == 0
    assert "SALVAGED" in s.stderr_text()


@pytest.fixture
def sealed(monkeypatch, tmp_path):
    """Every server test_durable.py starts gets a data key."""
    key = write_key(tmp_path / "sealed.key", 0x5A)
    plain = test_durable.serve
    monkeypatch.setattr(test_durable, "serve",
                        lambda factory, path, *extra: plain(factory, path, "--data-key", str(key), *extra))
    return key


def test_kill9_under_write_load_with_a_key(sealed, server_factory, tmp_path):
    test_durable.test_kill9_under_write_load_loses_no_acknowledged_write(server_factory, tmp_path)
    data = (tmp_path / "data.img").read_bytes()
    assert b"RSE1" in data and b"RSR1" not in data


def test_failed_device_write_with_a_key(sealed, fault_device, server_factory, tmp_path):
    test_durable.test_failed_device_write_fails_only_its_request(fault_device, server_factory, tmp_path)


def test_dead_disk_with_a_key(sealed, fault_device, server_factory, tmp_path):
    test_durable.test_dead_disk_fails_pipelined_writes_and_recovers(fault_device, server_factory, tmp_path)


def test_no_reply_before_the_flush_with_a_key(sealed, fault_device, server_factory, tmp_path):
    test_durable.test_no_reply_before_the_flush_covering_the_write(fault_device, server_factory, tmp_path)
