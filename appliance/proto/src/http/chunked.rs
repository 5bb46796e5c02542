//! `Transfer-Encoding: chunked` request bodies, decoded incrementally with bounded state:
//! a size line holds at most 16 hex digits and 1 KiB of extensions, trailers at most 16 KiB,
//! and the decoded body at most the caller's limit.

use super::key::hex;

/// Longest chunk extension text on one size line.
pub const EXTENSION_MAX: usize = 1024;
/// Largest trailer section.
pub const TRAILERS_MAX: usize = 16 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ChunkError {
    /// Bad framing (400).
    #[error("malformed chunked body")]
    Malformed,
    /// The decoded body would exceed the limit (413).
    #[error("chunked body too large")]
    TooLarge,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum State {
    /// Before the first hex digit of a size line.
    #[default]
    SizeStart,
    Size {
        value: u64,
        digits: u32,
    },
    Extension {
        value: u64,
        len: usize,
    },
    /// Saw the CR that ends a size line.
    SizeLf {
        value: u64,
    },
    Data {
        left: u64,
    },
    /// After a chunk's data: its CRLF.
    DataCr,
    DataLf,
    Trailer {
        line: usize,
    },
    TrailerLf {
        line: usize,
    },
    Done,
}

/// Resumable chunked decoder; feed it successive input slices.
#[derive(Debug, Clone, Default)]
pub struct ChunkedDecoder {
    state: State,
    /// Decoded bytes so far.
    total: u64,
    trailer_bytes: usize,
}

impl ChunkedDecoder {
    pub fn new() -> ChunkedDecoder {
        ChunkedDecoder::default()
    }

    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Decoded body bytes so far.
    pub fn decoded(&self) -> u64 {
        self.total
    }

    /// Decodes from `input`, appending data to `body` (or dropping it when `None`), with the
    /// decoded total held to `max_body`. Returns the bytes of `input` consumed; once
    /// [`ChunkedDecoder::is_done`], the rest of `input` belongs to the next request.
    pub fn decode(
        &mut self,
        input: &[u8],
        mut body: Option<&mut Vec<u8>>,
        max_body: u64,
    ) -> Result<usize, ChunkError> {
        let mut at = 0;
        while at < input.len() {
            let b = input[at];
            self.state = match self.state {
                State::Done => return Ok(at),
                State::Data { left } => {
                    let take = usize::try_from(left)
                        .unwrap_or(usize::MAX)
                        .min(input.len() - at);
                    if let Some(body) = body.as_deref_mut() {
                        body.extend_from_slice(&input[at..at + take]);
                    }
                    at += take;
                    let left = left - take as u64;
                    self.state = if left == 0 {
                        State::DataCr
                    } else {
                        State::Data { left }
                    };
                    continue;
                }
                State::SizeStart => match hex(b) {
                    Some(d) => State::Size {
                        value: u64::from(d),
                        digits: 1,
                    },
                    None => return Err(ChunkError::Malformed),
                },
                State::Size { value, digits } => match (b, hex(b)) {
                    (_, Some(d)) => {
                        if digits == 16 {
                            return Err(ChunkError::Malformed);
                        }
                        State::Size {
                            value: value << 4 | u64::from(d),
                            digits: digits + 1,
                        }
                    }
                    (b';' | b' ' | b'\t', None) => State::Extension { value, len: 1 },
                    (b'\r', None) => State::SizeLf { value },
                    (b'\n', None) => self.size_line_done(value, max_body)?,
                    _ => return Err(ChunkError::Malformed),
                },
                State::Extension { value, len } => match b {
                    b'\r' => State::SizeLf { value },
                    b'\n' => self.size_line_done(value, max_body)?,
                    _ if b == b'\t' || b >= b' ' && b != 0x7f => {
                        if len == EXTENSION_MAX {
                            return Err(ChunkError::Malformed);
                        }
                        State::Extension {
                            value,
                            len: len + 1,
                        }
                    }
                    _ => return Err(ChunkError::Malformed),
                },
                State::SizeLf { value } => match b {
                    b'\n' => self.size_line_done(value, max_body)?,
                    _ => return Err(ChunkError::Malformed),
                },
                State::DataCr => match b {
                    b'\r' => State::DataLf,
                    b'\n' => State::SizeStart,
                    _ => return Err(ChunkError::Malformed),
                },
                State::DataLf => match b {
                    b'\n' => State::SizeStart,
                    _ => return Err(ChunkError::Malformed),
                },
                State::Trailer { line } => match b {
                    b'\r' => State::TrailerLf { line },
                    b'\n' => trailer_line_done(line),
                    _ if b == b'\t' || b >= b' ' && b != 0x7f => {
                        self.trailer_bytes += 1;
                        if self.trailer_bytes > TRAILERS_MAX {
                            return Err(ChunkError::Malformed);
                        }
                        State::Trailer { line: line + 1 }
                    }
                    _ => return Err(ChunkError::Malformed),
                },
                State::TrailerLf { line } => match b {
                    b'\n' => trailer_line_done(line),
                    _ => return Err(ChunkError::Malformed),
                },
            };
            at += 1;
        }
        Ok(at)
    }

    fn size_line_done(&mut self, size: u64, max_body: u64) -> Result<State, ChunkError> {
        if size == 0 {
            return Ok(State::Trailer { line: 0 });
        }
        self.total = self
            .total
            .checked_add(size)
            .filter(|&t| t <= max_body)
            .ok_or(ChunkError::TooLarge)?;
        Ok(State::Data { left: size })
    }
}

fn trailer_line_done(line: usize) -> State {
    if line == 0 {
        State::Done
    } else {
        State::Trailer { line: 0 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_split(input: &[u8], split: usize, max: u64) -> Result<(Vec<u8>, usize), ChunkError> {
        let mut dec = ChunkedDecoder::new();
        let mut body = Vec::new();
        let mut used = dec.decode(&input[..split], Some(&mut body), max)?;
        if !dec.is_done() {
            assert_eq!(used, split);
            used += dec.decode(&input[split..], Some(&mut body), max)?;
        }
        assert!(dec.is_done(), "not done");
        Ok((body, used))
    }

    #[test]
    fn decodes_at_every_split() {
        let input = b"5;name=v\r\nhello\r\n1\r\n \r\nA\r\n0123456789\r\n0\r\nX-T: 1\r\n\r\nNEXT";
        for split in 0..=input.len() - 4 {
            let (body, used) = decode_split(input, split, 100).unwrap();
            assert_eq!(body, b"hello 0123456789");
            assert_eq!(used, input.len() - 4);
        }
    }

    #[test]
    fn bare_lf_and_no_trailers() {
        let (body, used) = decode_split(b"2\nab\n0\n\n", 3, 10).unwrap();
        assert_eq!((body.as_slice(), used), (&b"ab"[..], 8));
    }

    #[test]
    fn limits_and_errors() {
        let mut dec = ChunkedDecoder::new();
        assert_eq!(
            dec.decode(b"b\r\nhello world\r\n0\r\n\r\n", None, 10),
            Err(ChunkError::TooLarge)
        );
        let mut dec = ChunkedDecoder::new();
        assert_eq!(
            dec.decode(b"ffffffffffffffff0\r\n", None, u64::MAX),
            Err(ChunkError::Malformed)
        );
        let mut dec = ChunkedDecoder::new();
        assert_eq!(
            dec.decode(b"ffffffffffffffff\r\n", None, 10),
            Err(ChunkError::TooLarge)
        );
        for bad in [
            &b"\r\n"[..],
            b"g\r\n",
            b"1\r\nab\r\n",
            b"1\rx",
            b"1\r\na\rx",
            b"0\r\nbad\0\r\n",
        ] {
            let mut dec = ChunkedDecoder::new();
            assert_eq!(
                dec.decode(bad, None, 10),
                Err(ChunkError::Malformed),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        let mut dec = ChunkedDecoder::new();
        let long_ext = [b"1;".as_slice(), &[b'x'; EXTENSION_MAX]].concat();
        assert_eq!(dec.decode(&long_ext, None, 10), Err(ChunkError::Malformed));
    }

    #[test]
    fn trailer_limit() {
        let mut dec = ChunkedDecoder::new();
        let mut input = b"0\r\n".to_vec();
        for _ in 0..(TRAILERS_MAX / 9 + 1) {
            input.extend_from_slice(b"X-A: 1234\r\n");
        }
        assert_eq!(dec.decode(&input, None, 10), Err(ChunkError::Malformed));
    }
}
