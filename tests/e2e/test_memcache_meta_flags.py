"""Meta-command flags checked as memcached 1.6.18 checks them (issue 35): every flag letter,
with and without an argument, on `mg`, `ms`, `md` and `ma`, with a plain key and with a
base64 one (`b`) that decodes or not, plus repeated and unknown letters before and after the
key's decoding. The same stream goes to ringstore and to a fresh real memcached 1.6.18 and
the replies are compared byte for byte."""

import string

from test_memcache_compat import Conn

# What makes every line's reply end: `mn` after it.
SETUP = b"ms k 1 T0\r\n1\r\nms Zm9v 1 b\r\n1\r\n"

LETTERS = string.ascii_letters + string.digits + "+-_:"

COMMANDS = [
    b"mg k %s\r\n",
    b"ms k 1 %s\r\nx\r\n",
    b"md k %s\r\n",
    b"ma k %s\r\n",
    b"mg Zm9v b %s\r\n",
    b"mg k b %s\r\n",
    b"md k b %s\r\n",
    b"ms k 1 b %s\r\nx\r\n",
]

# Issue 35's lines, and others where a flag that stops the preparse comes after a `b` whose
# key does not decode, or several errors meet.
LINES = [
    b"mg k b c f h k l O123 q s t v u E5 N30 R30 T30\r\n",
    b"mg k s v f t c k O1 h l q u T1 N1 R1 E1 F1 P1\r\n",
    b"mg k b v v\r\n",
    b"mg k b Tabc Z\r\n",
    b"mg k Tabc b\r\n",
    b"mg k Tabc Nabc Fx\r\n",
    b"md k b q q\r\n",
    b"ma k b MX\r\n",
    b"ma k MX b\r\n",
    b"ms k 1 b E1\r\nx\r\n",
    b"ms k 1 MX b\r\nx\r\n",
    b"ms k 1 b MX\r\nx\r\n",
    b"ms k 1 O1 O2\r\nx\r\n",
    b"mn k v\r\n",
    b"me k\r\n",
    b"me k b\r\n",
    b"me Zm9v b\r\n",
    b"mg k " + b"O" + b"x" * 40 + b" b\r\n",
    b"mg k a b c d e f g h i j k l m n o p q r s\r\n",
]


def stream():
    steps = []
    for cmd in COMMANDS:
        for letter in LETTERS:
            for arg in ("", "1", "abc"):
                steps.append(SETUP + cmd % (letter + arg).encode())
    return steps + [SETUP + line for line in LINES]


def replies(addr, steps):
    c = Conn(addr)
    try:
        return [c.ask(step) for step in steps]
    finally:
        c.close()


def test_every_flag_letter_answers_as_memcached(server, memcached):
    steps = stream()
    ours, theirs = replies(server.mc, steps), replies(memcached, steps)
    diff = [(s, o, t) for s, o, t in zip(steps, ours, theirs) if o != t]
    assert not diff, f"{len(diff)} of {len(steps)} differ, first: {diff[:5]}"
    assert ours[len(steps) - len(LINES)].endswith(b"CLIENT_ERROR invalid flag\r\n")
