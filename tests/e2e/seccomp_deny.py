"""A seccomp launcher that denies io_uring as a container runtime does (ADR 0033).

Docker's default profile (moby PR 46762), podman's and containerd 2.0's RuntimeDefault leave
io_uring_setup, io_uring_enter and io_uring_register out of their allow lists, so those calls
fail with EPERM (the profile's defaultErrnoRet 1). This installs a classic-BPF filter that
returns exactly that for those three calls and allows everything else, with no_new_privs (so
it needs no privilege), in the child between fork and exec:

    subprocess.Popen([...], preexec_fn=seccomp_deny.deny_io_uring)

or as a command: `python3 tests/e2e/seccomp_deny.py PROGRAM ARGS...` execs PROGRAM under it.
The syscall numbers 425-427 are the same on every Linux architecture (the unified table).
"""

import ctypes
import os
import struct
import sys

IO_URING_SYSCALLS = (425, 426, 427)  # io_uring_setup, io_uring_enter, io_uring_register

PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ERRNO = 0x00050000
EPERM = 1

BPF_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
BPF_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
BPF_RET_K = 0x06  # BPF_RET | BPF_K


def _filter():
    """The program: load the syscall number (seccomp_data.nr at offset 0); each io_uring
    number jumps to the EPERM return; anything else is allowed."""
    n = len(IO_URING_SYSCALLS)
    insns = [(BPF_LD_W_ABS, 0, 0, 0)]
    for i, nr in enumerate(IO_URING_SYSCALLS):
        insns.append((BPF_JEQ_K, n - i, 0, nr))
    insns.append((BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW))
    insns.append((BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | EPERM))
    return insns


def deny_io_uring():
    """Installs the filter on the calling process (irreversible; children inherit it)."""
    libc = ctypes.CDLL(None, use_errno=True)
    insns = _filter()
    raw = b"".join(struct.pack("=HBBI", *insn) for insn in insns)
    buf = ctypes.create_string_buffer(raw, len(raw))

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    prog = SockFprog(len(insns), ctypes.cast(buf, ctypes.c_void_p))
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: seccomp_deny.py PROGRAM [ARGS...]")
    deny_io_uring()
    os.execvp(sys.argv[1], sys.argv[1:])
