//! memcached's UDP frame header: request id, sequence number, datagram count and a reserved
//! field, each a big-endian u16, in front of every datagram. A request must fit in one
//! datagram (memcached drops the others); a reply is split into as many datagrams as needed,
//! numbered from 0, each carrying the request's id and the total count.

/// Bytes of the frame header.
pub const HEADER_LEN: usize = 8;

/// Largest reply datagram memcached sends (header included), so replies pass typical paths
/// without IP fragmentation.
pub const DATAGRAM_MAX: usize = 1400;

/// Why a request datagram is not served (memcached drops it silently).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// Shorter than the frame header.
    #[error("datagram shorter than the 8-byte frame header")]
    Short,
    /// Part of a multi-datagram request, which memcached does not accept.
    #[error("multi-datagram request (count {count}, sequence {seq})")]
    MultiDatagram { seq: u16, count: u16 },
}

/// The frame header of a request datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame {
    /// Echoed in every datagram of the reply.
    pub request_id: u16,
}

/// Splits a request datagram into its header and the request bytes.
pub fn parse_request(datagram: &[u8]) -> Result<(Frame, &[u8]), FrameError> {
    let header = datagram.get(..HEADER_LEN).ok_or(FrameError::Short)?;
    let field = |i: usize| u16::from_be_bytes([header[i], header[i + 1]]);
    let (seq, count) = (field(2), field(4));
    if count != 1 || seq != 0 {
        return Err(FrameError::MultiDatagram { seq, count });
    }
    Ok((
        Frame {
            request_id: field(0),
        },
        &datagram[HEADER_LEN..],
    ))
}

/// The datagrams of a reply of `reply_len` bytes: how many, and each one's header and slice
/// of the reply. `None` when more than 65535 datagrams would be needed.
#[derive(Debug, Clone, Copy)]
pub struct ReplyFrames {
    request_id: u16,
    reply_len: usize,
    /// Reply bytes per datagram.
    chunk: usize,
    count: u16,
}

impl ReplyFrames {
    /// The framing of a `reply_len`-byte reply to `frame` in datagrams of at most
    /// `datagram_max` bytes (header included; at least `HEADER_LEN + 1`).
    pub fn new(frame: Frame, reply_len: usize, datagram_max: usize) -> Option<ReplyFrames> {
        let chunk = datagram_max.checked_sub(HEADER_LEN).filter(|&c| c > 0)?;
        let count = u16::try_from(reply_len.div_ceil(chunk).max(1)).ok()?;
        Some(ReplyFrames {
            request_id: frame.request_id,
            reply_len,
            chunk,
            count,
        })
    }

    /// Datagrams in the reply (an empty reply is one header-only datagram).
    pub fn count(&self) -> u16 {
        self.count
    }

    /// Datagram `seq`: its header and the range of the reply it carries.
    pub fn datagram(&self, seq: u16) -> ([u8; HEADER_LEN], std::ops::Range<usize>) {
        debug_assert!(seq < self.count);
        let start = (usize::from(seq) * self.chunk).min(self.reply_len);
        let end = (start + self.chunk).min(self.reply_len);
        let mut header = [0u8; HEADER_LEN];
        header[0..2].copy_from_slice(&self.request_id.to_be_bytes());
        header[2..4].copy_from_slice(&seq.to_be_bytes());
        header[4..6].copy_from_slice(&self.count.to_be_bytes());
        (header, start..end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_one_whole_datagram() {
        let d = [0, 7, 0, 0, 0, 1, 0, 0, b'g', b'e', b't'];
        assert_eq!(
            parse_request(&d),
            Ok((Frame { request_id: 7 }, &b"get"[..]))
        );
        assert_eq!(parse_request(&d[..7]), Err(FrameError::Short));
        let second = [0, 7, 0, 1, 0, 2, 0, 0];
        assert_eq!(
            parse_request(&second),
            Err(FrameError::MultiDatagram { seq: 1, count: 2 })
        );
        assert!(parse_request(&[0, 7, 0, 0, 0, 0, 0, 0]).is_err(), "count 0");
    }

    #[test]
    fn replies_are_split_into_numbered_datagrams() {
        let f = ReplyFrames::new(Frame { request_id: 7 }, 3000, DATAGRAM_MAX).unwrap();
        assert_eq!(f.count(), 3);
        assert_eq!(f.datagram(0), ([0, 7, 0, 0, 0, 3, 0, 0], 0..1392));
        assert_eq!(f.datagram(2), ([0, 7, 0, 2, 0, 3, 0, 0], 2784..3000));
        let total: usize = (0..f.count()).map(|s| f.datagram(s).1.len()).sum();
        assert_eq!(total, 3000);
        let empty = ReplyFrames::new(Frame { request_id: 1 }, 0, DATAGRAM_MAX).unwrap();
        assert_eq!((empty.count(), empty.datagram(0).1), (1, 0..0));
        assert!(ReplyFrames::new(Frame { request_id: 1 }, 70_000 * 1392, DATAGRAM_MAX).is_none());
        assert!(ReplyFrames::new(Frame { request_id: 1 }, 10, HEADER_LEN).is_none());
    }
}
