#!/usr/bin/env python3
"""memcached's command line, translated to `ringstore serve`: the `memcached-debug` that
memcached's own test harness (t/lib/MemcachedTest.pm) starts when its t/*.t files run
against ringstore (tests/e2e/test_memcached_t.py).

Only the flags those files pass are mapped; any other flag, or a value ringstore cannot
honour, exits 64 with one line on stderr saying which, so the harness's new_memcached()
fails loudly instead of testing a server configured otherwise than the file asked.
The ringstore binary is $RINGSTORE_BIN. The process execs ringstore (same pid, so the
harness's SIGINT/SIGTERM reach the server itself), with its stdout (the ready line) sent
to stderr so the TAP stream stays clean.

With $MEMCACHED_BIN set it runs that memcached instead, dropping only the harness's
`-o relaxed_privileges` (which only memcached-debug builds know).
"""

import os
import sys

HELP = """ringstore behind memcached's command line (tests/memcached_t/memcached_shim.py)
-p, --port=<num>          TCP port (memcache); with -Z the port is TLS (--memcache-tls)
-U, --udp-port=<num>      UDP port (--udp); 0 = off
-l, --listen=<addr>       [notls:]IP[:PORT][,...]: at most one plain and one TLS listener
-m, --memory-limit=<num>  item memory in megabytes (--memory)
-c, --conn-limit=<num>    --max-conns
-t, --threads=<num>       --cores
-I, --max-item-size=<num> --item-size-max (k/m suffixes)
-Y, --auth-file=<file>    --auth-file (ASCII authentication and binary SASL PLAIN)
-S, --enable-sasl         refused: ringstore's SASL users come from --auth-file, not a Cyrus sasldb
-Z, --enable-ssl          enable TLS/SSL (--memcache-tls)
-u, -o relaxed_privileges accepted, no effect (ringstore drops no privileges)
-o ssl_chain_cert, ssl_key, ssl_ca_cert, ssl_verify_mode, ssl_min_version, idle_timeout
"""

EX_USAGE = 64


def refuse(what):
    sys.stderr.write(f"memcached_shim: cannot map {what} to ringstore serve\n")
    sys.exit(EX_USAGE)


def size_arg(text):
    """memcached's -I value: bytes, or with a k/m suffix."""
    units = {"k": 1024, "m": 1024 * 1024}
    last = text[-1:].lower()
    if last in units:
        return int(text[:-1]) * units[last]
    return int(text)


# memcached's slab-allocator and LRU tuning: no counterpart in ringstore's segment store, no
# effect on what the protocol answers; accepted and ignored (a file that asserts their
# effect, e.g. slab class numbers, fails on its assertions instead).
IGNORED_TUNING = {"no_modern", "slab_chunk_max"}

VERIFY = {"0": "none", "1": "request", "2": "require", "3": "require"}
MIN_VERSION = {"2": "1.2", "3": "1.3"}


def option(key, value, out):
    """One `-o key=value` item."""
    if value is None and key == "relaxed_privileges":
        return  # memcached-debug's seccomp relaxation: ringstore installs no filter
    if value is None and key == "ssl_session_cache":
        return  # ringstore always resumes sessions (rustls' cache of 256; TLS 1.3 tickets)
    if key in IGNORED_TUNING:
        return
    if value is None:
        refuse(f"-o {key}")
    if key == "ssl_chain_cert":
        out["tls-cert"] = value
    elif key == "ssl_key":
        out["tls-key"] = value
    elif key == "ssl_ca_cert":
        out["tls-ca"] = value
    elif key == "ssl_verify_mode" and value in VERIFY:
        out["tls-verify"] = VERIFY[value]
    elif key == "ssl_min_version" and value in MIN_VERSION:
        out["tls-min-version"] = MIN_VERSION[value]
    elif key == "idle_timeout":
        out["idle-timeout"] = value
    else:
        refuse(f"-o {key}={value}")


def parse(argv):
    """memcached's flags (short forms, as the harness and the chosen files give them)."""
    state = {"port": None, "udp": None, "listen": None, "tls": False, "opts": {}}
    flags = {}
    takes_value = {"-p", "-U", "-l", "-m", "-c", "-t", "-I", "-Y", "-o", "-u", "-B"}
    i = 0
    while i < len(argv):
        flag = argv[i]
        if flag in ("-h", "--help"):
            sys.stdout.write(HELP)
            sys.exit(0)
        if flag == "-Z":
            state["tls"] = True
            i += 1
            continue
        if flag not in takes_value or i + 1 >= len(argv):
            refuse(flag)
        value = argv[i + 1]
        i += 2
        if flag == "-p":
            state["port"] = int(value)
        elif flag == "-U":
            state["udp"] = int(value)
        elif flag == "-l":
            state["listen"] = value
        elif flag == "-o":
            for item in value.split(","):
                key, _, val = item.partition("=")
                option(key, val if "=" in item else None, state["opts"])
        elif flag == "-u":
            pass  # the user to run as: ringstore runs as whoever starts it
        elif flag == "-B":
            if value != "auto":
                refuse(f"-B {value} (ringstore always tells text from binary by the first byte)")
        else:
            flags[flag] = value
    return state, flags


def listeners(state):
    """(plain, tls) addresses from -l/-p/-Z: memcached's -Z makes every listener not
    prefixed `notls:` TLS; ringstore has one plain and one TLS memcache listener."""
    port = state["port"] if state["port"] is not None else 11211
    plain, tls = None, None
    host = "127.0.0.1"
    for entry in (state["listen"] or host).split(","):
        no_tls = entry.startswith("notls:")
        entry = entry[len("notls:"):] if no_tls else entry
        addr_host, _, addr_port = entry.rpartition(":") if entry.count(":") == 1 else (entry, "", "")
        addr = f"{addr_host or entry}:{addr_port or port}"
        host = addr_host or entry
        if state["tls"] and not no_tls:
            if tls is not None:
                refuse("-l with two TLS listeners")
            tls = addr
        else:
            if plain is not None:
                refuse("-l with two plain listeners")
            plain = addr
    return plain, tls, host


SIMPLE = {"-c": "--max-conns", "-t": "--cores", "-Y": "--auth-file"}


def serve_args(state, flags):
    plain, tls, host = listeners(state)
    args = ["serve", "--http", "off", "--memcache", plain or "off"]
    # memcached's defaults where ringstore's differ: -c 1024 (ringstore: 4096); -m 64 is
    # ringstore's default too, given explicitly.
    flags.setdefault("-c", "1024")
    flags.setdefault("-m", "64")
    if tls:
        args += ["--memcache-tls", tls]
    if state["udp"]:
        args += ["--udp", f"{host}:{state['udp']}"]
    for key, value in state["opts"].items():
        args += [f"--{key}", value]
    for flag, value in flags.items():
        if flag == "-m":
            args += ["--memory", f"{int(value)}MiB"]
        elif flag == "-I":
            args += ["--item-size-max", str(size_arg(value))]
        elif flag in SIMPLE:
            args += [SIMPLE[flag], value]
        else:
            refuse(flag)
    return args


def memcached(binary, argv):
    """Debian's memcached itself: `-o relaxed_privileges` (the harness always passes it) is a
    suboption of memcached-debug builds only; everything else passes through unchanged."""
    out, i = [], 0
    while i < len(argv):
        if argv[i] == "-o" and i + 1 < len(argv):
            items = [o for o in argv[i + 1].split(",") if o != "relaxed_privileges"]
            if items:
                out += ["-o", ",".join(items)]
            i += 2
            continue
        out.append(argv[i])
        i += 1
    if "-h" not in out:
        os.dup2(2, 1)
    os.execv(binary, [binary, *out])


def main():
    if os.environ.get("MEMCACHED_BIN"):
        memcached(os.environ["MEMCACHED_BIN"], sys.argv[1:])
    state, flags = parse(sys.argv[1:])
    binary = os.environ.get("RINGSTORE_BIN")
    if not binary:
        sys.stderr.write("memcached_shim: RINGSTORE_BIN is not set\n")
        sys.exit(EX_USAGE)
    args = serve_args(state, flags)
    io = os.environ.get("RINGSTORE_IO")
    if io:
        args += ["--io", io]
    os.dup2(2, 1)
    os.execv(binary, [binary, *args])


if __name__ == "__main__":
    main()
