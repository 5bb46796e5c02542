"""End-to-end hardening of the data device (issue 8, durability): one server per data file,
damage in acknowledged history refuses the start instead of serving older values (ADR 0016),
and stalled large uploads give their device space back (ADR 0013)."""

import hashlib
import signal
import socket
import subprocess
import time

from conftest import BIN, io_args, raw
from test_durable import Conn, make_file, serve
from test_large import MIB, block, device, put_until_stored  # noqa: F401 (device: a fixture)


class Refused:
    def __init__(self, returncode, stdout, stderr):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def start_refused(path, keys=(), timeout=20):
    """Starts a server on `path` that is expected to exit at once. If it serves instead, it
    is asked for `keys` (so a failure shows what it would have served) and killed."""
    proc = subprocess.Popen(
        [BIN, "serve", "--memcache", "127.0.0.1:0", "--http", "127.0.0.1:0", "--data", str(path),
         "--cores", "2", "--memory", "64MiB", *io_args([])],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        proc.wait(timeout=timeout)
        return Refused(proc.returncode, proc.stdout.read(), proc.stderr.read())
    except subprocess.TimeoutExpired:
        pass
    line = proc.stdout.readline().decode()
    served = {}
    if line.startswith("ready "):
        fields = dict(f.split("=", 1) for f in line.split()[1:])
        host, port = fields["memcache"].rsplit(":", 1)
        c = Conn((host, int(port)))
        served = c.get_many([k for k in keys]) if keys else {}
        c.close()
    proc.kill()
    _, err = proc.communicate()
    raise AssertionError(f"the server started instead of exiting: {line.strip()!r}, "
                         f"it served {served}, stderr {err.decode()!r}")


def test_a_second_server_on_the_same_data_file_exits_2_naming_the_holder(server_factory, tmp_path):
    path = tmp_path / "data"
    make_file(path, 64 << 20)
    first = serve(server_factory, path)
    c = Conn(first.mc)
    assert c.set(b"k", b"first") == b"STORED"
    second = start_refused(path, [b"k"])
    err = second.stderr.decode()
    assert second.returncode == 2, (second.returncode, second.stdout, err)
    assert b"ready" not in second.stdout
    assert "in use" in err and f"process {first.proc.pid}" in err, err
    assert len(err.strip().splitlines()) == 1, err
    # The first server never noticed and keeps its data.
    assert c.get_many([b"k"]) == {b"k": b"first"}
    c.close()
    assert first.stop() == 0
    # Once it is gone, the file opens again, with its data.
    again = serve(server_factory, path)
    c = Conn(again.mc)
    assert c.get_many([b"k"]) == {b"k": b"first"}
    c.close()


def test_a_flipped_byte_in_acknowledged_history_refuses_the_start(server_factory, tmp_path):
    """set k A; set d D; set f F; set k B; delete d; kill -9; flip one byte of f's value.
    Before ADR 0016 the restart served k=A (older) and d (deleted), f was absent, and the log
    said only "recovered by scanning the logs: 2 objects"."""
    path = tmp_path / "data"
    make_file(path, 64 << 20)
    s = serve(server_factory, path)
    c = Conn(s.mc)
    for key, value in [(b"k", b"value-A"), (b"d", b"value-D"), (b"f", b"value-F-marker"), (b"k", b"value-B")]:
        assert c.set(key, value) == b"STORED"
    c.s.sendall(b"delete d\r\n")
    assert c.line() == b"DELETED"
    c.close()
    s.stop(signal.SIGKILL)
    data = bytearray(path.read_bytes())
    at = data.find(b"value-F-marker")
    assert at > 0 and data.find(b"value-F-marker", at + 1) == -1
    data[at + 6] ^= 0x01
    path.write_bytes(bytes(data))
    before = hashlib.sha256(data).hexdigest()
    r = start_refused(path, [b"k", b"d", b"f"])
    err = r.stderr.decode()
    assert r.returncode == 2, (r.returncode, r.stdout, err)
    assert b"ready" not in r.stdout
    assert "corrupt" in err and "acknowledged history" in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before, "the device is left untouched"
    assert "--data-recover=salvage" in err, err
    # The operator's way out: salvage starts with every record that verifies and says so.
    s = serve(server_factory, path, "--data-recover", "salvage")
    c = Conn(s.mc)
    got = c.get_many([b"k", b"d", b"f"])
    assert got.get(b"k") == b"value-B", got  # never the older A
    assert b"d" not in got, got  # never the deleted value
    assert got.get(b"f") in (None, b"value-F-marker"), got  # never torn bytes
    c.close()
    assert s.stop() == 0
    assert "SALVAGED" in s.stderr_text()


def test_a_kill9_without_damage_still_starts_with_every_acknowledged_write(server_factory, tmp_path):
    path = tmp_path / "data"
    make_file(path, 64 << 20)
    s = serve(server_factory, path)
    c = Conn(s.mc)
    for i in range(200):
        assert c.set(b"key%d" % i, b"v%d" % i) == b"STORED"
    c.close()
    s.stop(signal.SIGKILL)
    s = serve(server_factory, path)
    c = Conn(s.mc)
    got = c.get_many([b"key%d" % i for i in range(200)])
    assert got == {b"key%d" % i: b"v%d" % i for i in range(200)}
    c.close()


def device_stats(addr):
    out = raw(addr, b"stats\r\n", read_until=b"END\r\n")
    return {
        f[1].decode(): int(f[2]) for f in (line.split() for line in out.split(b"\r\n"))
        if len(f) == 3 and f[0] == b"STAT" and f[1].startswith(b"data_")
    }


def stall_upload(addr, key, declared, sent, source="127.0.0.1"):
    """A PUT from `source` that declares `declared` bytes, sends `sent` of them and then
    stops (open)."""
    s = socket.create_connection(addr, timeout=60, source_address=(source, 0))
    s.sendall(b"PUT /%s HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n" % (key, declared))
    for i in range(sent // MIB):
        s.sendall(block(i))
    return s


def test_stalled_large_uploads_give_their_device_space_back_within_the_request_timeout(
    server_factory, device
):
    """Four PUTs (from four clients: one client's unfinished uploads hold at most half a
    region) that declare 400 MiB, send 36 MiB each and stop held 144 MiB of a 208 MiB
    region: before, every later large PUT got 507 until the idle timeout (300 s)."""
    timeout_s = 3
    s = server_factory("--data", device(256 * MIB), "--cores", "1", "--memory", "64MiB",
                       "--request-timeout", str(timeout_s))
    stalls = [
        stall_upload(s.http, b"stall%d" % i, 400 * MIB, 36 * MIB, source="127.0.0.%d" % (i + 1))
        for i in range(4)
    ]
    sent_at = time.monotonic()
    # The stalls' last bytes may still sit in socket buffers: staged later, they would race
    # the PUT below for the region's last quarter (a stall then got the 507, in CI). Wait,
    # bounded, until the server has staged all of them (its reservation stops growing; it
    # stays under 4 x 36 MiB, less what the uploads' open chunks hold back).
    held, deadline = device_stats(s.mc), time.monotonic() + 10
    while time.monotonic() < deadline:
        time.sleep(0.5)
        before, held = held, device_stats(s.mc)
        if held.get("data_reserved_bytes") == before.get("data_reserved_bytes"):
            break
    assert held.get("data_uploads_in_progress") == 4, held
    assert held.get("data_reserved_bytes", 0) >= 4 * 32 * MIB, held  # less what is in flight
    status, _ = put_until_stored(s, "later", 64 * MIB, limit_s=0)
    assert status == 507, "the stalled uploads do hold the space"
    # Within the request timeout (plus the timer's tick) the stalls are cut and their
    # reservations released; compaction then reclaims the chunks.
    for c in stalls:
        c.settimeout(timeout_s + 10)
        try:
            rest = c.recv(65536)
        except (ConnectionResetError, socket.timeout) as e:
            rest = repr(e).encode()
        assert rest == b"" or b"Reset" in rest, f"the server cut the stalled upload: {rest[:80]!r}"
        c.close()
    cut_s = time.monotonic() - sent_at
    assert cut_s < timeout_s + 5, cut_s
    assert device_stats(s.mc).get("data_reserved_bytes") == 0
    status, _ = put_until_stored(s, "later", 64 * MIB, limit_s=20)
    back_s = time.monotonic() - sent_at
    assert status == 201, status
    print(f"stalled uploads cut after {cut_s:.1f} s, 64 MiB PUT stored {back_s:.1f} s after the stall")
    for i in range(4):
        out = raw(s.http, b"HEAD /stall%d HTTP/1.1\r\nHost: t\r\n\r\n" % i, read_until=b"\r\n\r\n")
        assert out.startswith(b"HTTP/1.1 404"), out[:40]
