//! The few memcache text-protocol bytes the benchmark speaks: `get`/`set` requests and a
//! reply splitter that finds complete replies in a receive buffer without copying; and one
//! RESP request, Redis's `SET`, for the durable cell against Redis (bench/redis.rs).

use std::io::Write;

/// What the benchmark asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Get,
    Set,
    /// `SET key value` in RESP (Redis), answered `+OK`.
    RespSet,
}

impl Op {
    pub fn name(self) -> &'static str {
        match self {
            Op::Get => "GET",
            Op::Set | Op::RespSet => "SET",
        }
    }
}

/// One complete reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reply {
    /// `VALUE ...` + data + `END`.
    Hit,
    /// A bare `END` (the key was not there).
    Miss,
    Stored,
    /// Any other line (`ERROR`, `CLIENT_ERROR ...`, `SERVER_ERROR ...`, `NOT_STORED`, ...).
    Other,
}

/// The key for index `index` of the keyspace of values of `value_len` bytes. Fixed width,
/// so every request of a cell has the same size on both servers.
#[expect(clippy::expect_used, reason = "io::Write for Vec<u8> never fails")]
pub fn write_key(out: &mut Vec<u8>, value_len: usize, index: usize) {
    write!(out, "b{value_len}:{index:08}").expect("writing to a Vec");
}

/// Appends one request for `index` to `out`; `value` is the value for sets.
#[expect(clippy::expect_used, reason = "io::Write for Vec<u8> never fails")]
pub fn write_request(out: &mut Vec<u8>, op: Op, value: &[u8], index: usize) {
    match op {
        Op::Get => {
            out.extend_from_slice(b"get ");
            write_key(out, value.len(), index);
            out.extend_from_slice(b"\r\n");
        }
        Op::Set => {
            out.extend_from_slice(b"set ");
            write_key(out, value.len(), index);
            write!(out, " 0 0 {}\r\n", value.len()).expect("writing to a Vec");
            out.extend_from_slice(value);
            out.extend_from_slice(b"\r\n");
        }
        Op::RespSet => {
            let mut key = Vec::new();
            write_key(&mut key, value.len(), index);
            write!(out, "*3\r\n$3\r\nSET\r\n${}\r\n", key.len()).expect("writing to a Vec");
            out.extend_from_slice(&key);
            write!(out, "\r\n${}\r\n", value.len()).expect("writing to a Vec");
            out.extend_from_slice(value);
            out.extend_from_slice(b"\r\n");
        }
    }
}

fn find_crlf(buf: &[u8]) -> Option<usize> {
    buf.windows(2).position(|w| w == b"\r\n")
}

/// The first complete reply in `buf` and how many bytes it takes; `None` while incomplete.
pub fn split_reply(buf: &[u8]) -> Option<(Reply, usize)> {
    let eol = find_crlf(buf)?;
    let line = &buf[..eol];
    let head = eol + 2;
    if let Some(rest) = line.strip_prefix(b"VALUE ") {
        // VALUE <key> <flags> <bytes> [<cas>]
        let bytes: usize = rest
            .split(|&b| b == b' ')
            .nth(2)
            .and_then(|f| std::str::from_utf8(f).ok())
            .and_then(|f| f.parse().ok())
            .unwrap_or(0);
        let end = head + bytes + 2 + 5;
        if buf.len() < end {
            return None;
        }
        let reply = if &buf[end - 5..end] == b"END\r\n" {
            Reply::Hit
        } else {
            Reply::Other
        };
        return Some((reply, end));
    }
    let reply = match line {
        b"END" => Reply::Miss,
        // RESP's simple-string answer to SET.
        b"STORED" | b"+OK" => Reply::Stored,
        _ => Reply::Other,
    };
    Some((reply, head))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_have_fixed_width_keys() {
        let mut out = Vec::new();
        write_request(&mut out, Op::Get, &[b'x'; 100], 7);
        assert_eq!(out, b"get b100:00000007\r\n");
        out.clear();
        write_request(&mut out, Op::Set, b"abc", 12);
        assert_eq!(out, b"set b3:00000012 0 0 3\r\nabc\r\n");
        out.clear();
        write_request(&mut out, Op::RespSet, b"abc", 12);
        assert_eq!(
            out,
            b"*3\r\n$3\r\nSET\r\n$11\r\nb3:00000012\r\n$3\r\nabc\r\n"
        );
        let replies = b"+OK\r\n-ERR out of memory\r\n";
        assert_eq!(split_reply(replies), Some((Reply::Stored, 5)));
        assert_eq!(split_reply(&replies[5..]).map(|r| r.0), Some(Reply::Other));
    }

    #[test]
    fn splits_pipelined_replies_and_waits_for_partial_ones() {
        let buf = b"VALUE k 0 3\r\nabc\r\nEND\r\nEND\r\nSTORED\r\nSERVER_ERROR out of memory\r\nVALUE k 0 5\r\nab";
        let mut at = 0;
        let mut seen = Vec::new();
        while let Some((reply, used)) = split_reply(&buf[at..]) {
            seen.push(reply);
            at += used;
        }
        assert_eq!(seen, [Reply::Hit, Reply::Miss, Reply::Stored, Reply::Other]);
        assert_eq!(&buf[at..], b"VALUE k 0 5\r\nab");
    }

    #[test]
    fn value_bytes_may_hold_crlf_and_a_bad_trailer_is_not_a_hit() {
        assert_eq!(
            split_reply(b"VALUE k 0 4\r\n\r\n\r\n\r\nEND\r\n"),
            Some((Reply::Hit, 24))
        );
        assert_eq!(
            split_reply(b"VALUE k 0 1\r\nx\r\nXYZ\r\n").map(|r| r.0),
            Some(Reply::Other)
        );
        assert_eq!(split_reply(b"STOR"), None);
    }
}
