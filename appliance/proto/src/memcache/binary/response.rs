//! Binary protocol responses: the header (opcode and opaque echoed, status, CAS) and the
//! bodies memcached sends, written straight into the output buffer.

use super::{Head, Status, HEADER_LEN, RESPONSE_MAGIC};

/// Lengths over the wire's fields never occur (values are bounded by `item_size_max`); they
/// are clamped rather than trusted to wrap.
fn len32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Appends a response header. `body_len` counts extras, key and value.
pub fn header(
    out: &mut Vec<u8>,
    head: Head,
    status: Status,
    key_len: usize,
    extras_len: u8,
    body_len: usize,
    cas: u64,
) {
    let mut h = [0u8; HEADER_LEN];
    h[0] = RESPONSE_MAGIC;
    h[1] = head.opcode;
    h[2..4].copy_from_slice(&u16::try_from(key_len).unwrap_or(u16::MAX).to_be_bytes());
    h[4] = extras_len;
    h[6..8].copy_from_slice(&status.code().to_be_bytes());
    h[8..12].copy_from_slice(&len32(body_len).to_be_bytes());
    h[12..16].copy_from_slice(&head.opaque.to_be_bytes());
    h[16..24].copy_from_slice(&cas.to_be_bytes());
    out.extend_from_slice(&h);
}

/// A success without a body (stored, deleted, flushed, noop, quit), with the item's CAS.
pub fn ok(out: &mut Vec<u8>, head: Head, cas: u64) {
    header(out, head, Status::Success, 0, 0, 0, cas);
}

/// An error: the status and memcached's message as the body, CAS 0.
pub fn error(out: &mut Vec<u8>, head: Head, status: Status) {
    let msg = status.message().as_bytes();
    header(out, head, status, 0, 0, msg.len(), 0);
    out.extend_from_slice(msg);
}

/// A success whose body is `text` (version).
pub fn text(out: &mut Vec<u8>, head: Head, text: &[u8]) {
    header(out, head, Status::Success, 0, 0, text.len(), 0);
    out.extend_from_slice(text);
}

/// A get hit: the flags as extras, the key when asked for (getk, gatk), then the value
/// (empty for touch).
pub fn value(out: &mut Vec<u8>, head: Head, cas: u64, flags: u32, key: &[u8], data: &[u8]) {
    out.reserve(HEADER_LEN + 4 + key.len() + data.len());
    value_header(out, head, cas, flags, key, data.len());
    out.extend_from_slice(data);
}

/// A hit's frame up to its value: the header for a value of `data_len` bytes, the flags and
/// the key. The caller sends the value's bytes right after it.
pub fn value_header(
    out: &mut Vec<u8>,
    head: Head,
    cas: u64,
    flags: u32,
    key: &[u8],
    data_len: usize,
) {
    header(
        out,
        head,
        Status::Success,
        key.len(),
        4,
        4 + key.len() + data_len,
        cas,
    );
    out.extend_from_slice(&flags.to_be_bytes());
    out.extend_from_slice(key);
}

/// A getk / gatk miss: "not found" with the key as the whole body (no message).
pub fn miss_with_key(out: &mut Vec<u8>, head: Head, key: &[u8]) {
    header(out, head, Status::KeyNotFound, key.len(), 0, key.len(), 0);
    out.extend_from_slice(key);
}

/// An increment / decrement result: the new value as 8 big-endian bytes.
pub fn number(out: &mut Vec<u8>, head: Head, cas: u64, value: u64) {
    header(out, head, Status::Success, 0, 0, 8, cas);
    out.extend_from_slice(&value.to_be_bytes());
}

/// One statistic: its name as the key and its value as the body. An empty name and value
/// end a stat response.
pub fn stat(out: &mut Vec<u8>, head: Head, name: &[u8], value: &[u8]) {
    header(
        out,
        head,
        Status::Success,
        name.len(),
        0,
        name.len() + value.len(),
        0,
    );
    out.extend_from_slice(name);
    out.extend_from_slice(value);
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEAD: Head = Head {
        opcode: 0x0c,
        opaque: 0xdead_beef,
    };

    /// Bytes as memcached 1.6.18 sent them for the same requests.
    #[test]
    fn frames_match_memcached() {
        let mut out = Vec::new();
        value(&mut out, HEAD, 1, 5, b"k", b"abc");
        assert_eq!(
            out,
            [
                &[0x81, 0x0c, 0, 1, 4, 0, 0, 0, 0, 0, 0, 8, 0xde, 0xad, 0xbe, 0xef][..],
                &[0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 5],
                b"kabc",
            ]
            .concat()
        );
        out.clear();
        error(
            &mut out,
            Head {
                opcode: 0,
                opaque: 3,
            },
            Status::KeyNotFound,
        );
        assert_eq!(
            out,
            [
                &[0x81, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 9, 0, 0, 0, 3][..],
                &[0; 8],
                b"Not found"
            ]
            .concat()
        );
        out.clear();
        miss_with_key(&mut out, HEAD, b"zz");
        assert_eq!(&out[6..12], &[0, 1, 0, 0, 0, 2]);
        assert_eq!(&out[2..4], &[0, 2]);
        assert_eq!(&out[24..], b"zz");
        out.clear();
        number(&mut out, HEAD, 3, 10);
        assert_eq!(&out[8..12], &[0, 0, 0, 8]);
        assert_eq!(&out[24..], &10u64.to_be_bytes());
        out.clear();
        stat(&mut out, HEAD, b"pid", b"42");
        assert_eq!((&out[2..4], &out[8..12]), (&[0, 3][..], &[0, 0, 0, 5][..]));
        assert_eq!(&out[24..], b"pid42");
    }

    #[test]
    fn status_codes_are_memcacheds() {
        let codes = [
            (Status::Success, 0),
            (Status::KeyNotFound, 1),
            (Status::KeyExists, 2),
            (Status::TooLarge, 3),
            (Status::InvalidArguments, 4),
            (Status::NotStored, 5),
            (Status::NonNumeric, 6),
            (Status::UnknownCommand, 0x81),
            (Status::OutOfMemory, 0x82),
            (Status::Internal, 0x84),
        ];
        for (s, c) in codes {
            assert_eq!(s.code(), c);
        }
    }
}
