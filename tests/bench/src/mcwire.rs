//! The few memcache bytes the benchmark speaks: text `get`/`set`, meta `mg <key> v` and the
//! binary protocol's GET/GETK requests, and reply splitters that find complete replies in a
//! receive buffer without copying (checking each GET hit's framing and value length); and one
//! RESP request, Redis's `SET`, for the durable cell against Redis (redis.rs).

use std::io::Write;

/// What the benchmark asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Get,
    Set,
    /// `SET key value` in RESP (Redis), answered `+OK`.
    RespSet,
    /// `mg <key> v`, answered `VA <bytes>` + data, or `EN` (meta protocol).
    MetaGet,
    /// Binary protocol GET (opcode 0x00): the reply carries flags and the value.
    BinGet,
    /// Binary protocol GETK (opcode 0x0c): the reply carries flags, the key and the value.
    BinGetK,
}

/// The memcache ops of `--cells` and `bench-floor --op`, by their spelling there.
const TOKENS: [(&str, Op); 5] = [
    ("get", Op::Get),
    ("set", Op::Set),
    ("mg", Op::MetaGet),
    ("bget", Op::BinGet),
    ("bgetk", Op::BinGetK),
];

/// The binary protocol's request and response magic bytes.
const BIN_REQUEST: u8 = 0x80;
const BIN_RESPONSE: u8 = 0x81;
/// A binary header's length, and the flags extras of a GET reply.
const BIN_HEADER: usize = 24;
const BIN_GET_EXTRAS: usize = 4;
/// Binary status "key not found".
const BIN_NOT_FOUND: usize = 1;

impl Op {
    /// How a table names the op's cells.
    pub fn name(self) -> &'static str {
        match self {
            Op::Get => "GET",
            Op::Set | Op::RespSet => "SET",
            Op::MetaGet => "mg v",
            Op::BinGet => "binary GET",
            Op::BinGetK => "binary GETK",
        }
    }

    /// The spelling in `--cells` (`mg-524288-1`) and `bench-floor --op`; none for RESP.
    pub fn token(self) -> Option<&'static str> {
        TOKENS.iter().find(|(_, op)| *op == self).map(|(t, _)| *t)
    }

    /// The op spelled `token` (any case).
    pub fn from_token(token: &str) -> Option<Op> {
        let token = token.to_ascii_lowercase();
        TOKENS.iter().find(|(t, _)| *t == token).map(|(_, op)| *op)
    }

    /// Every memcache op by its token, for messages.
    pub fn tokens() -> String {
        TOKENS.map(|(t, _)| t).join(", ")
    }

    /// The GETs that only run when named in `--cells` (not part of the default matrix), whose
    /// every reply must be a hit of the right length: anything else fails the cell.
    pub fn is_extra_get(self) -> bool {
        matches!(self, Op::MetaGet | Op::BinGet | Op::BinGetK)
    }

    fn bin_opcode(self) -> u8 {
        if self == Op::BinGetK {
            0x0c
        } else {
            0x00
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

/// `head`, the key, `tail`: a one-line request.
fn write_key_line(out: &mut Vec<u8>, head: &[u8], value_len: usize, index: usize, tail: &[u8]) {
    out.extend_from_slice(head);
    write_key(out, value_len, index);
    out.extend_from_slice(tail);
}

/// The value's length ending a header line, the value, `tail`.
#[expect(clippy::expect_used, reason = "io::Write for Vec<u8> never fails")]
fn write_data_block(out: &mut Vec<u8>, value: &[u8], tail: &[u8]) {
    write!(out, "{}\r\n", value.len()).expect("writing to a Vec");
    out.extend_from_slice(value);
    out.extend_from_slice(tail);
}

/// Appends one request for `index` to `out`; `value` is the value for sets (and its length
/// names the keyspace for gets).
#[expect(clippy::expect_used, reason = "io::Write for Vec<u8> never fails")]
pub fn write_request(out: &mut Vec<u8>, op: Op, value: &[u8], index: usize) {
    match op {
        Op::Get => write_key_line(out, b"get ", value.len(), index, b"\r\n"),
        Op::MetaGet => write_key_line(out, b"mg ", value.len(), index, b" v\r\n"),
        Op::BinGet | Op::BinGetK => write_binary_get(out, op.bin_opcode(), value.len(), index),
        Op::Set => {
            write_key_line(out, b"set ", value.len(), index, b" 0 0 ");
            write_data_block(out, value, b"\r\n");
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

/// A binary GET/GETK: the 24-byte header (no extras, the key as the body, the index as the
/// opaque, CAS 0), then the key.
fn write_binary_get(out: &mut Vec<u8>, opcode: u8, value_len: usize, index: usize) {
    let mut key = Vec::new();
    write_key(&mut key, value_len, index);
    let head = BinHead {
        magic: BIN_REQUEST,
        opcode,
        key_len: key.len(),
        extras_len: 0,
        status: 0,
        body_len: key.len(),
        opaque: index,
    };
    head.write(out);
    out.extend_from_slice(&key);
}

/// The fields of a binary header the benchmark sets (data type, vbucket and CAS are 0).
struct BinHead {
    magic: u8,
    opcode: u8,
    key_len: usize,
    extras_len: usize,
    status: u16,
    body_len: usize,
    opaque: usize,
}

impl BinHead {
    fn write(&self, out: &mut Vec<u8>) {
        let key_len = u16::try_from(self.key_len).unwrap_or(u16::MAX);
        let extras_len = u8::try_from(self.extras_len).unwrap_or(u8::MAX);
        out.extend_from_slice(&[self.magic, self.opcode]);
        out.extend_from_slice(&key_len.to_be_bytes());
        out.extend_from_slice(&[extras_len, 0]);
        out.extend_from_slice(&self.status.to_be_bytes());
        let body_len = u32::try_from(self.body_len).unwrap_or(u32::MAX);
        out.extend_from_slice(&body_len.to_be_bytes());
        let opaque = u32::try_from(self.opaque).unwrap_or(u32::MAX);
        out.extend_from_slice(&opaque.to_be_bytes());
        out.extend_from_slice(&[0; 8]);
    }
}

/// Appends the reply a server gives the request `write_request` writes for `index` when it
/// succeeds (a GET hit with `value`, or the store's acknowledgement): what the floor server
/// sends, byte for byte as long as the real servers' (flags 0, no CAS).
pub fn write_reply(out: &mut Vec<u8>, op: Op, value: &[u8], index: usize) {
    match op {
        Op::Get => {
            write_key_line(out, b"VALUE ", value.len(), index, b" 0 ");
            write_data_block(out, value, b"\r\nEND\r\n");
        }
        Op::MetaGet => {
            out.extend_from_slice(b"VA ");
            write_data_block(out, value, b"\r\n");
        }
        Op::BinGet | Op::BinGetK => {
            let mut key = Vec::new();
            if op == Op::BinGetK {
                write_key(&mut key, value.len(), index);
            }
            let head = BinHead {
                magic: BIN_RESPONSE,
                opcode: op.bin_opcode(),
                key_len: key.len(),
                extras_len: BIN_GET_EXTRAS,
                status: 0,
                body_len: BIN_GET_EXTRAS + key.len() + value.len(),
                opaque: index,
            };
            head.write(out);
            out.extend_from_slice(&[0; BIN_GET_EXTRAS]);
            out.extend_from_slice(&key);
            out.extend_from_slice(value);
        }
        Op::Set => out.extend_from_slice(b"STORED\r\n"),
        Op::RespSet => out.extend_from_slice(b"+OK\r\n"),
    }
}

fn find_crlf(buf: &[u8]) -> Option<usize> {
    buf.windows(2).position(|w| w == b"\r\n")
}

/// The `n`th space-separated field of `line` as a number.
fn field(line: &[u8], n: usize) -> Option<usize> {
    line.split(|&b| b == b' ')
        .filter(|f| !f.is_empty())
        .nth(n)
        .and_then(|f| std::str::from_utf8(f).ok())
        .and_then(|f| f.parse().ok())
}

/// The first complete reply in `buf` and how many bytes it takes; `None` while incomplete.
pub fn split_reply(buf: &[u8]) -> Option<(Reply, usize)> {
    split_text(buf).map(|(reply, used, _)| (reply, used))
}

/// The first complete reply in `buf` to a request of `op` for a value of `value_len` bytes,
/// and how many bytes it takes; `None` while incomplete. A GET hit whose value is not
/// `value_len` bytes long is `Other`, as is a binary reply that is not a GET's.
pub fn split_reply_for(op: Op, value_len: usize, buf: &[u8]) -> Option<(Reply, usize)> {
    let (reply, used, bytes) = match op {
        Op::MetaGet => split_meta(buf)?,
        Op::BinGet | Op::BinGetK => split_binary(op, value_len, buf)?,
        Op::Get | Op::Set | Op::RespSet => split_text(buf)?,
    };
    if reply == Reply::Hit && bytes != value_len {
        return Some((Reply::Other, used));
    }
    Some((reply, used))
}

/// A meta reply: `VA <bytes> [flags]` + data + CRLF (a hit), `EN` (a miss) or another line.
fn split_meta(buf: &[u8]) -> Option<(Reply, usize, usize)> {
    let eol = find_crlf(buf)?;
    let line = &buf[..eol];
    let head = eol + 2;
    if line == b"EN" {
        return Some((Reply::Miss, head, 0));
    }
    if !line.starts_with(b"VA ") {
        return Some((Reply::Other, head, 0));
    }
    let Some(bytes) = field(line, 1) else {
        return Some((Reply::Other, head, 0));
    };
    data_block(buf, head, bytes, b"\r\n")
}

/// A hit's `bytes` of data from `head` on, then `trailer`: `None` while incomplete, `Other`
/// if the trailer is not there.
fn data_block(
    buf: &[u8],
    head: usize,
    bytes: usize,
    trailer: &[u8],
) -> Option<(Reply, usize, usize)> {
    let end = head + bytes + trailer.len();
    let got = buf.get(head + bytes..end)?;
    let reply = if got == trailer {
        Reply::Hit
    } else {
        Reply::Other
    };
    Some((reply, end, bytes))
}

/// A binary reply: the header, then its body (extras, key, value). A reply whose magic is
/// wrong takes the whole buffer (nothing after it can be framed); a hit must echo the
/// opcode and carry the flags (and for GETK the key) of a key of `value_len`'s keyspace.
fn split_binary(op: Op, value_len: usize, buf: &[u8]) -> Option<(Reply, usize, usize)> {
    let header = buf.get(..BIN_HEADER)?;
    if header[0] != BIN_RESPONSE {
        return Some((Reply::Other, buf.len(), 0));
    }
    let be = |at: usize, n: usize| {
        header[at..at + n]
            .iter()
            .fold(0usize, |acc, &b| acc << 8 | usize::from(b))
    };
    let (key_len, extras_len, status, body) = (be(2, 2), be(4, 1), be(6, 2), be(8, 4));
    let end = BIN_HEADER + body;
    if buf.len() < end {
        return None;
    }
    let key_want = if op == Op::BinGetK {
        let mut key = Vec::new();
        write_key(&mut key, value_len, 0);
        key.len()
    } else {
        0
    };
    let reply = if header[1] != op.bin_opcode() {
        Reply::Other
    } else if status == 0 && extras_len == BIN_GET_EXTRAS && key_len == key_want {
        Reply::Hit
    } else if status == BIN_NOT_FOUND {
        Reply::Miss
    } else {
        Reply::Other
    };
    Some((reply, end, body.saturating_sub(extras_len + key_len)))
}

/// A text reply, and for a hit its value's length.
fn split_text(buf: &[u8]) -> Option<(Reply, usize, usize)> {
    let eol = find_crlf(buf)?;
    let line = &buf[..eol];
    let head = eol + 2;
    if let Some(rest) = line.strip_prefix(b"VALUE ") {
        // VALUE <key> <flags> <bytes> [<cas>]
        let bytes = field(rest, 2).unwrap_or(0);
        return data_block(buf, head, bytes, b"\r\nEND\r\n");
    }
    let reply = match line {
        b"END" => Reply::Miss,
        // RESP's simple-string answer to SET.
        b"STORED" | b"+OK" => Reply::Stored,
        _ => Reply::Other,
    };
    Some((reply, head, 0))
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

    #[test]
    fn meta_and_binary_get_requests() {
        let mut out = Vec::new();
        write_request(&mut out, Op::MetaGet, &[b'v'; 100], 7);
        assert_eq!(out, b"mg b100:00000007 v\r\n");
        out.clear();
        write_request(&mut out, Op::BinGet, &[b'v'; 100], 7);
        let mut want = vec![0x80, 0x00, 0, 13, 0, 0, 0, 0, 0, 0, 0, 13, 0, 0, 0, 7];
        want.extend_from_slice(&[0; 8]);
        want.extend_from_slice(b"b100:00000007");
        assert_eq!(out, want);
        out.clear();
        write_request(&mut out, Op::BinGetK, &[b'v'; 100], 7);
        assert_eq!(out[1], 0x0c, "GETK's opcode");
        assert_eq!(out.len(), want.len());
    }

    #[test]
    fn meta_replies_are_checked_for_framing_and_length() {
        let mut hit = Vec::new();
        write_reply(&mut hit, Op::MetaGet, b"a\r\nb", 0);
        assert_eq!(hit, b"VA 4\r\na\r\nb\r\n");
        assert_eq!(
            split_reply_for(Op::MetaGet, 4, &hit),
            Some((Reply::Hit, 12))
        );
        assert_eq!(
            split_reply_for(Op::MetaGet, 5, &hit),
            Some((Reply::Other, 12)),
            "a value of the wrong length is no hit"
        );
        assert_eq!(split_reply_for(Op::MetaGet, 4, &hit[..11]), None);
        assert_eq!(
            split_reply_for(Op::MetaGet, 2, b"VA 2 f0 \r\nabXY").map(|r| r.0),
            Some(Reply::Other),
            "flags are allowed, a missing CRLF after the data is not"
        );
        assert_eq!(
            split_reply_for(Op::MetaGet, 4, b"EN\r\nVA"),
            Some((Reply::Miss, 4))
        );
        assert_eq!(
            split_reply_for(Op::MetaGet, 4, b"SERVER_ERROR out of memory\r\n").map(|r| r.0),
            Some(Reply::Other)
        );
        assert_eq!(
            split_reply_for(Op::MetaGet, 4, b"VALUE b4:00000000 0 4\r\n").map(|r| r.0),
            Some(Reply::Other),
            "a text reply is not a meta hit"
        );
    }

    #[test]
    fn binary_replies_are_checked_for_framing_and_length() {
        let value = [b'v'; 300];
        for op in [Op::BinGet, Op::BinGetK] {
            let mut hit = Vec::new();
            write_reply(&mut hit, op, &value, 3);
            let whole = Some((Reply::Hit, hit.len()));
            assert_eq!(split_reply_for(op, 300, &hit), whole, "{op:?}");
            assert_eq!(split_reply_for(op, 300, &hit[..hit.len() - 1]), None);
            assert_eq!(split_reply_for(op, 300, &hit[..23]), None);
            assert_eq!(
                split_reply_for(op, 299, &hit).map(|r| r.0),
                Some(Reply::Other),
                "{op:?}: a value of the wrong length is no hit"
            );
        }
        let mut get = Vec::new();
        write_reply(&mut get, Op::BinGet, &value, 3);
        assert_eq!(
            split_reply_for(Op::BinGetK, 300, &get).map(|r| r.0),
            Some(Reply::Other),
            "GET's reply (opcode 0, no key) does not answer a GETK"
        );
        let mut miss = get[..24].to_vec();
        miss[4] = 0;
        miss[7] = 1; // status: key not found
        miss[8..12].copy_from_slice(&9u32.to_be_bytes());
        miss.extend_from_slice(b"Not found");
        assert_eq!(
            split_reply_for(Op::BinGet, 300, &miss),
            Some((Reply::Miss, 33))
        );
        let garbled = b"VALUE b300:00000003 0 300\r\n....................";
        assert_eq!(
            split_reply_for(Op::BinGet, 300, garbled),
            Some((Reply::Other, garbled.len())),
            "a wrong magic takes the buffer: nothing after it can be framed"
        );
    }

    #[test]
    fn a_text_hit_of_the_wrong_length_is_no_hit() {
        let mut hit = Vec::new();
        write_reply(&mut hit, Op::Get, b"abc", 0);
        assert_eq!(hit, b"VALUE b3:00000000 0 3\r\nabc\r\nEND\r\n");
        assert_eq!(split_reply_for(Op::Get, 3, &hit), Some((Reply::Hit, 33)));
        assert_eq!(split_reply_for(Op::Get, 4, &hit), Some((Reply::Other, 33)));
        assert_eq!(split_reply(&hit), Some((Reply::Hit, 33)));
    }
}
