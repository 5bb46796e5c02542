"""A fault-injecting data device for the end-to-end tests: one file on a FUSE mount.

The file passes every read, write and fsync through to a real backing file, and a test arms
faults on it the way smoltcp's FaultInjector sits between an interface and the stack: the
server under test keeps using its real code path (open, flock, size check, io_uring write and
fdatasync) and the kernel hands it a real EIO from the chosen write or flush.

It speaks the FUSE kernel protocol on /dev/fuse directly (Python standard library only; no
libfuse, no pip package). Mounting needs root (mount(2) with fd=...); without root,
`fusermount3` (Debian package fuse3) mounts it instead when installed.

    with FaultDevice(tmp_path / "backing.img", tmp_path / "mnt") as dev:
        ...start the server on dev.path...
        dev.fail_write(3)           # the 3rd write from now returns EIO
        dev.fail_flush(1, count=2)  # the next two fsync/fdatasync return EIO
        dev.fail_write(1, count=None)  # every write fails (a dead disk) until dev.heal()

The file is opened with FOPEN_DIRECT_IO: no page cache, so each write(2)/io_uring write is one
FUSE WRITE request (up to 1 MiB) and its error is reported to that write itself.
"""

import ctypes
import ctypes.util
import errno
import os
import select
import socket
import stat
import struct
import subprocess
import threading
import time

FILE_NAME = "dev.img"

# Opcodes (include/uapi/linux/fuse.h).
LOOKUP, FORGET, GETATTR, SETATTR = 1, 2, 3, 4
OPEN, READ, WRITE, STATFS, RELEASE = 14, 15, 16, 17, 18
FSYNC, GETXATTR, FLUSH, INIT = 20, 22, 25, 26
OPENDIR, READDIR, RELEASEDIR, FSYNCDIR = 27, 28, 29, 30
INTERRUPT, DESTROY, BATCH_FORGET = 36, 38, 42

ROOT_ID, FILE_ID = 1, 2
KERNEL_MAJOR, KERNEL_MINOR = 7, 31
FUSE_BIG_WRITES = 1 << 5
FUSE_MAX_PAGES = 1 << 22
MAX_PAGES = 256  # 1 MiB per WRITE request
MAX_WRITE = MAX_PAGES * 4096
FOPEN_DIRECT_IO = 1
FATTR_SIZE = 1 << 3
FSYNC_DATASYNC = 1

IN_HEADER = struct.Struct("<IIQQIIIHH")  # len, opcode, unique, nodeid, uid, gid, pid, extlen, pad
OUT_HEADER = struct.Struct("<IiQ")  # len, error, unique
ATTR = struct.Struct("<QQQQQQIIIIIIIIII")  # fuse_attr, 88 bytes
MNT_DETACH = 2
MS_NOSUID, MS_NODEV = 2, 4

# Every wait in here is bounded: the serving loop polls so it can stop, and teardown aborts the
# connection (closing /dev/fuse) so a request the server still has in flight fails, never hangs.
POLL_S = 0.1
# Longest a stalled flush waits for `heal` (the serving loop waits with it).
STALL_MAX_S = 20.0
JOIN_S = 5.0
MOUNT_WAIT_S = 5.0


class Fault:
    """One armed rule: ops number `nth` .. `nth + count - 1` after arming fail (count None: all)."""

    def __init__(self, nth, count, errno_):
        assert nth >= 1 and (count is None or count >= 1)
        self.nth, self.count, self.errno = nth, count, errno_
        self.seen = 0

    def hit(self):
        self.seen += 1
        if self.seen < self.nth:
            return False
        return self.count is None or self.seen < self.nth + self.count


class FaultDevice:
    """A FUSE mount at `mountpoint` exposing `backing` as `mountpoint/dev.img` with armable faults."""

    def __init__(self, backing, mountpoint):
        self.backing = str(backing)
        self.mountpoint = str(mountpoint)
        self.path = os.path.join(self.mountpoint, FILE_NAME)
        self.lock = threading.Lock()
        self.write_fault = None
        self.flush_fault = None
        # Set: every fsync waits (the serving loop with it) until cleared by `heal` (bounded).
        self.flush_stall = threading.Event()
        # Counters since mount (for test diagnostics): ops seen and faults injected.
        self.writes = 0
        self.flushes = 0
        self.failed_writes = 0
        self.failed_flushes = 0
        self.error = None  # an exception that stopped the serving loop
        self.fd = -1
        self.bfd = -1
        self.thread = None
        self.stopping = threading.Event()
        self.mounted = False

    # ---- the fixture API -------------------------------------------------------------------

    def fail_write(self, nth=1, count=1, errno_=errno.EIO):
        """The `nth` write from now (and `count - 1` after it; count=None: every one) fails."""
        with self.lock:
            self.write_fault = Fault(nth, count, errno_)

    def fail_flush(self, nth=1, count=1, errno_=errno.EIO):
        """The `nth` fsync/fdatasync from now (and `count - 1` after it) fails."""
        with self.lock:
            self.flush_fault = Fault(nth, count, errno_)

    def stall_flush(self):
        """Every fsync/fdatasync from now waits until `heal` (at most STALL_MAX_S each): a device
        whose group commits take as long as the test wants."""
        self.flush_stall.set()

    def heal(self):
        """Disarm every fault (and release a stalled flush)."""
        with self.lock:
            self.write_fault = None
            self.flush_fault = None
        self.flush_stall.clear()

    def wait_quiet(self, quiet_s=0.2, timeout=5.0):
        """Waits (bounded) until no write or flush has arrived for `quiet_s`: the server's startup
        I/O is over, so a fault armed next counts only what the test itself causes."""
        deadline = time.monotonic() + timeout
        last, since = None, time.monotonic()
        while time.monotonic() < deadline:
            now = self.stats()
            if now != last:
                last, since = now, time.monotonic()
            elif time.monotonic() - since >= quiet_s:
                return now
            time.sleep(0.02)
        raise AssertionError(f"fault device never went quiet: {last}")

    def stats(self):
        with self.lock:
            return {
                "writes": self.writes,
                "flushes": self.flushes,
                "failed_writes": self.failed_writes,
                "failed_flushes": self.failed_flushes,
            }

    # ---- mount / unmount -------------------------------------------------------------------

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def start(self):
        os.makedirs(self.mountpoint, exist_ok=True)
        self.bfd = os.open(self.backing, os.O_RDWR)
        try:
            self.fd = self._mount()
            self.mounted = True
            self.thread = threading.Thread(target=self._serve, name="faultdev", daemon=True)
            self.thread.start()
            # The kernel sends INIT first; the mount is usable once the file is visible.
            deadline = time.monotonic() + MOUNT_WAIT_S
            while not os.path.exists(self.path):
                if time.monotonic() > deadline or self.error is not None:
                    raise RuntimeError(f"fault device did not come up: {self.error!r}")
                time.sleep(0.01)
        except BaseException:
            self.close()
            raise

    def _mount(self):
        opts_common = f"rootmode={stat.S_IFDIR | 0o755:o},user_id={os.getuid()},group_id={os.getgid()}"
        if not os.path.exists("/dev/fuse"):
            raise RuntimeError("the fault device needs /dev/fuse (modprobe fuse; in a container: --device /dev/fuse)")
        if os.geteuid() == 0:
            fd = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
            libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
            opts = f"fd={fd},{opts_common}".encode()
            rc = libc.mount(b"faultdev", self.mountpoint.encode(), b"fuse.faultdev",
                            MS_NOSUID | MS_NODEV, opts)
            if rc != 0:
                e = ctypes.get_errno()
                os.close(fd)
                raise OSError(e, f"mount fuse on {self.mountpoint}: {os.strerror(e)}")
            return fd
        # Unprivileged: fusermount3 mounts and passes the /dev/fuse fd back over a socket.
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            env = dict(os.environ, _FUSE_COMMFD=str(theirs.fileno()))
            subprocess.run(
                ["fusermount3", "-o", "fsname=faultdev,subtype=faultdev,nosuid,nodev", "--", self.mountpoint],
                env=env, pass_fds=(theirs.fileno(),), check=True, timeout=MOUNT_WAIT_S,
            )
            ours.settimeout(MOUNT_WAIT_S)
            _, fds, _, _ = socket.recv_fds(ours, 16, 1)
            if not fds:
                raise RuntimeError("fusermount3 passed no fd")
            os.set_inheritable(fds[0], False)
            return fds[0]
        finally:
            ours.close()
            theirs.close()

    def close(self):
        """Unmount (lazily), stop serving and abort the connection. Safe to call twice."""
        if self.mounted:
            self.mounted = False
            if os.geteuid() == 0:
                libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
                libc.umount2(self.mountpoint.encode(), MNT_DETACH)
            else:
                subprocess.run(["fusermount3", "-u", "-z", "--", self.mountpoint],
                               timeout=MOUNT_WAIT_S, check=False)
        self.stopping.set()
        if self.thread is not None:
            self.thread.join(JOIN_S)
            self.thread = None
        # Closing the last /dev/fuse handle aborts the connection: anything still open on the
        # detached mount now gets ENOTCONN instead of waiting for a reply.
        self._close_fuse()
        if self.bfd >= 0:
            os.close(self.bfd)
            self.bfd = -1

    # ---- the FUSE protocol -----------------------------------------------------------------

    def _serve(self):
        try:
            poller = select.poll()
            poller.register(self.fd, select.POLLIN)
            bufsize = MAX_WRITE + 64 * 1024
            while not self.stopping.is_set():
                if not poller.poll(POLL_S * 1000):
                    continue
                try:
                    req = os.read(self.fd, bufsize)
                except OSError as e:
                    if e.errno in (errno.ENOENT, errno.EINTR, errno.EAGAIN):
                        continue  # the request was interrupted before we read it
                    if e.errno == errno.ENODEV:
                        return  # unmounted
                    raise
                self._handle(req)
        except BaseException as e:  # noqa: BLE001 - reported through self.error
            self.error = e
            # Nobody answers requests any more: abort now so the server sees ENOTCONN at once.
            self._close_fuse()

    def _close_fuse(self):
        with self.lock:
            fd, self.fd = self.fd, -1
        if fd >= 0:
            try:
                os.close(fd)
            except OSError:
                pass

    def _reply(self, unique, error=0, payload=b""):
        try:
            os.write(self.fd, OUT_HEADER.pack(OUT_HEADER.size + len(payload), -error, unique) + payload)
        except OSError as e:
            if e.errno not in (errno.ENOENT, errno.ENODEV):  # interrupted / aborted
                raise

    def _attr(self, node):
        if node == ROOT_ID:
            mode, size, nlink = stat.S_IFDIR | 0o755, 0, 2
        else:
            st = os.fstat(self.bfd)
            mode, size, nlink = stat.S_IFREG | 0o644, st.st_size, 1
        now = int(time.time())
        return ATTR.pack(node, size, (size + 511) // 512, now, now, now, 0, 0, 0,
                         mode, nlink, os.getuid(), os.getgid(), 0, 4096, 0)

    def _handle(self, req):
        length, op, unique, node, _uid, _gid, _pid, _extlen, _ = IN_HEADER.unpack_from(req)
        body = req[IN_HEADER.size:length]
        if op == INIT:
            major, minor, max_readahead, _flags = struct.unpack_from("<IIII", body)
            if major != KERNEL_MAJOR:
                return self._reply(unique, payload=struct.pack("<II", KERNEL_MAJOR, KERNEL_MINOR) + bytes(56))
            out = struct.pack("<IIIIHHIIHHII", KERNEL_MAJOR, min(minor, KERNEL_MINOR), max_readahead,
                              FUSE_BIG_WRITES | FUSE_MAX_PAGES, 16, 12, MAX_WRITE, 1, MAX_PAGES, 0, 0, 0)
            return self._reply(unique, payload=out + bytes(64 - len(out)))
        if op in (FORGET, BATCH_FORGET, INTERRUPT):
            return None  # no reply expected (INTERRUPT: every request is answered promptly)
        if op == LOOKUP:
            name = body.split(b"\0", 1)[0]
            if node != ROOT_ID or name != FILE_NAME.encode():
                return self._reply(unique, errno.ENOENT)
            entry = struct.pack("<QQQQII", FILE_ID, 0, 0, 0, 0, 0) + self._attr(FILE_ID)
            return self._reply(unique, payload=entry)
        if op == GETATTR:
            if node not in (ROOT_ID, FILE_ID):
                return self._reply(unique, errno.ENOENT)
            return self._reply(unique, payload=struct.pack("<QII", 0, 0, 0) + self._attr(node))
        if op == SETATTR:
            valid, _, _fh, size = struct.unpack_from("<IIQQ", body)
            if node != FILE_ID:
                return self._reply(unique, errno.EPERM)
            if valid & FATTR_SIZE:
                os.ftruncate(self.bfd, size)
            return self._reply(unique, payload=struct.pack("<QII", 0, 0, 0) + self._attr(node))
        if op == OPEN:
            if node != FILE_ID:
                return self._reply(unique, errno.EISDIR)
            return self._reply(unique, payload=struct.pack("<QII", 0, FOPEN_DIRECT_IO, 0))
        if op == OPENDIR:
            return self._reply(unique, payload=struct.pack("<QII", 0, 0, 0))
        if op == READDIR:
            _fh, offset, size = struct.unpack_from("<QQI", body)
            out = b""
            for i, (ino, name, kind) in enumerate(
                [(ROOT_ID, b".", 4), (ROOT_ID, b"..", 4), (FILE_ID, FILE_NAME.encode(), 8)]
            ):
                if i < offset:
                    continue
                ent = struct.pack("<QQII", ino, i + 1, len(name), kind) + name
                ent += bytes(-len(ent) % 8)
                if len(out) + len(ent) > size:
                    break
                out += ent
            return self._reply(unique, payload=out)
        if op == READ:
            _fh, offset, size = struct.unpack_from("<QQI", body)
            try:
                return self._reply(unique, payload=os.pread(self.bfd, size, offset))
            except OSError as e:
                return self._reply(unique, e.errno)
        if op == WRITE:
            _fh, offset, size = struct.unpack_from("<QQI", body)
            data = body[40:40 + size]
            with self.lock:
                self.writes += 1
                fault = self.write_fault
                if fault is not None and fault.hit():
                    self.failed_writes += 1
                    return self._reply(unique, fault.errno)
            try:
                n = os.pwrite(self.bfd, data, offset)
            except OSError as e:
                return self._reply(unique, e.errno)
            return self._reply(unique, payload=struct.pack("<II", n, 0))
        if op in (FSYNC, FSYNCDIR):
            _fh, flags = struct.unpack_from("<QI", body)
            if op == FSYNC:
                with self.lock:
                    self.flushes += 1
                    fault = self.flush_fault
                    if fault is not None and fault.hit():
                        self.failed_flushes += 1
                        return self._reply(unique, fault.errno)
                deadline = time.monotonic() + STALL_MAX_S
                while self.flush_stall.is_set() and not self.stopping.is_set() and time.monotonic() < deadline:
                    time.sleep(0.01)
                try:
                    (os.fdatasync if flags & FSYNC_DATASYNC else os.fsync)(self.bfd)
                except OSError as e:
                    return self._reply(unique, e.errno)
            return self._reply(unique)
        if op == STATFS:
            st = os.fstatvfs(self.bfd)
            out = struct.pack("<QQQQQIIII", st.f_blocks, st.f_bfree, st.f_bavail, st.f_files,
                              st.f_ffree, st.f_bsize, 255, st.f_frsize, 0)
            return self._reply(unique, payload=out + bytes(24))
        if op in (FLUSH, RELEASE, RELEASEDIR):
            return self._reply(unique)
        if op == DESTROY:
            self._reply(unique)
            self.stopping.set()
            return None
        # Everything else (xattrs, access, locks, create, ...) is not supported; the kernel
        # remembers ENOSYS and handles what it can itself (flock stays local to the kernel).
        return self._reply(unique, errno.ENOSYS)
