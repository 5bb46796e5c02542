//! What each mode of the load generator puts on the wire and how it reads the answers: the
//! core (engine.rs) hands a mode a key to encode and a receive buffer to decode, and does
//! everything else (connections, pacing, depth, timing).

use super::Mode;
use crate::mcwire::{split_reply_for, write_request, Op, Reply};
use crate::tls_wire::Wire;
use anyhow::{bail, Result};

/// How one reply counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Tally {
    /// The expected answer (a hit, `STORED`, `VERSION`, a 200).
    Fine,
    /// A memcache miss (the memcache cells count these apart from errors).
    Miss,
    /// Anything else.
    Error,
}

/// One decoded unit of a receive buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Decoded {
    /// A reply to a request of the connection's batch in flight.
    Reply(Tally),
    /// Bytes that answer nothing in flight (a UDP reply to a request already counted lost).
    Stale,
}

/// The UDP request: the 8-byte frame header (request id, sequence 0, 1 datagram) and this.
pub(super) const UDP_GET: &[u8] = b"get bench\r\n";
/// The UDP frame header's length.
const UDP_HEADER: usize = 8;
/// UDP request ids are 16 bits: one owner slot per id.
const UDP_IDS: usize = 1 << 16;

/// A mode's encoder and decoder with the state they keep.
pub(super) enum Codec {
    /// TCP memcache: text get/set, meta `mg`, binary GET/GETK (and RESP SET), per `op`.
    Memcache {
        op: Op,
        value_len: usize,
        value: Vec<u8>,
    },
    /// The TLS part's requests (over TLS or plain TCP): memcache text, `version`, HTTP GET.
    Wire { wire: Wire, value: Vec<u8> },
    /// memcache GET over UDP: ids run on across every connection of the generator, and each
    /// id in flight remembers its connection so a late reply to a lost one is not counted.
    Udp {
        next_id: u16,
        owner: Vec<Option<u32>>,
    },
}

impl Codec {
    pub(super) fn new(mode: &Mode) -> Codec {
        match mode {
            Mode::Memcache { op, value_len } => Codec::Memcache {
                op: *op,
                value_len: *value_len,
                value: vec![b'v'; *value_len],
            },
            Mode::Tls { wire, .. } => Codec::Wire {
                value: wire.value(),
                wire: wire.clone(),
            },
            Mode::Udp { .. } => Codec::Udp {
                next_id: 0,
                owner: vec![None; UDP_IDS],
            },
        }
    }

    /// Whether each request and reply is a datagram of its own.
    pub(super) fn datagrams(&self) -> bool {
        matches!(self, Codec::Udp { .. })
    }

    /// Appends connection `conn`'s request for key `key` to `out`.
    pub(super) fn encode(&mut self, conn: usize, out: &mut Vec<u8>, key: usize) {
        match self {
            Codec::Memcache { op, value, .. } => write_request(out, *op, value, key),
            Codec::Wire { wire, value } => wire.request(out, value, key),
            Codec::Udp { next_id, owner } => {
                *next_id = next_id.wrapping_add(1);
                out.extend_from_slice(&next_id.to_be_bytes());
                out.extend_from_slice(&[0, 0, 0, 1, 0, 0]);
                out.extend_from_slice(UDP_GET);
                owner[usize::from(*next_id)] = u32::try_from(conn).ok();
            }
        }
    }

    /// The first whole unit of `buf` and its length; `None` while it is incomplete. A wrong
    /// answer where the cell demands a hit (`mg`, `bget`, `bgetk`) fails the cell.
    pub(super) fn decode(&mut self, buf: &[u8]) -> Result<Option<(Decoded, usize)>> {
        match self {
            Codec::Memcache {
                op,
                value_len,
                value: _,
            } => {
                let Some((reply, used)) = split_reply_for(*op, *value_len, buf) else {
                    return Ok(None);
                };
                if op.is_extra_get() && reply != Reply::Hit {
                    bail!(
                        "{} {value_len} B: a wrong answer ({reply:?}, {used} bytes), not a hit of {value_len} bytes",
                        op.name()
                    );
                }
                let tally = match reply {
                    Reply::Hit | Reply::Stored => Tally::Fine,
                    Reply::Miss => Tally::Miss,
                    Reply::Other => Tally::Error,
                };
                Ok(Some((Decoded::Reply(tally), used)))
            }
            Codec::Wire { wire, .. } => Ok(wire.split(buf).map(|whole| {
                let tally = if whole.ok { Tally::Fine } else { Tally::Error };
                (Decoded::Reply(tally), whole.len)
            })),
            Codec::Udp { owner, .. } => Ok(Some((decode_datagram(owner, buf), buf.len()))),
        }
    }

    /// Forgets connection `conn`'s requests in flight (its batch was given up as lost);
    /// returns how many there were.
    pub(super) fn forget(&mut self, conn: usize) -> u64 {
        let Codec::Udp { owner, .. } = self else {
            return 0;
        };
        let conn = u32::try_from(conn).ok();
        let mut forgotten = 0;
        for slot in owner.iter_mut().filter(|slot| **slot == conn) {
            *slot = None;
            forgotten += 1;
        }
        forgotten
    }
}

/// One whole reply datagram: counted once for the request id it names, if that is in flight.
fn decode_datagram(owner: &mut [Option<u32>], datagram: &[u8]) -> Decoded {
    if datagram.len() < UDP_HEADER {
        return Decoded::Stale;
    }
    let id = usize::from(u16::from_be_bytes([datagram[0], datagram[1]]));
    if owner[id].take().is_none() {
        return Decoded::Stale;
    }
    let tally = if datagram[UDP_HEADER..].starts_with(b"VALUE ") {
        Tally::Fine
    } else {
        Tally::Error
    };
    Decoded::Reply(tally)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memcache_replies_count_hits_misses_and_errors() {
        let mut get = Codec::new(&Mode::Memcache {
            op: Op::Get,
            value_len: 3,
        });
        let buf = b"VALUE k 0 3\r\nabc\r\nEND\r\nEND\r\nERROR\r\nVALUE k 0 3\r\nab";
        let mut at = 0;
        let mut seen = Vec::new();
        while let Some((decoded, used)) = get.decode(&buf[at..]).unwrap() {
            seen.push(decoded);
            at += used;
        }
        assert_eq!(
            seen,
            [Tally::Fine, Tally::Miss, Tally::Error].map(Decoded::Reply)
        );
        assert_eq!(&buf[at..], b"VALUE k 0 3\r\nab", "the partial reply waits");
    }

    #[test]
    fn a_wrong_answer_to_an_extra_get_fails() {
        let mut mg = Codec::new(&Mode::Memcache {
            op: Op::MetaGet,
            value_len: 4,
        });
        assert!(mg.decode(b"EN\r\n").is_err());
    }

    #[test]
    fn udp_ids_run_on_and_late_replies_are_stale() {
        let mut udp = Codec::new(&Mode::Udp {
            from: std::net::Ipv4Addr::LOCALHOST.into(),
            to: ([127, 0, 0, 1], 1).into(),
        });
        let (mut a, mut b) = (Vec::new(), Vec::new());
        udp.encode(0, &mut a, 0);
        udp.encode(1, &mut b, 0);
        assert_eq!(&a[..8], &[0, 1, 0, 0, 0, 1, 0, 0]);
        assert_eq!(&b[..2], &[0, 2], "ids run on across connections");
        assert_eq!(&a[8..], UDP_GET);
        let reply = |id: u8| {
            [
                &[0, id, 0, 0, 0, 1, 0, 0][..],
                b"VALUE bench 0 1\r\nv\r\nEND\r\n",
            ]
            .concat()
        };
        assert_eq!(
            udp.decode(&reply(1)).unwrap(),
            Some((Decoded::Reply(Tally::Fine), reply(1).len()))
        );
        assert_eq!(
            udp.decode(&reply(1)).unwrap().map(|d| d.0),
            Some(Decoded::Stale),
            "one reply per id"
        );
        assert_eq!(udp.forget(1), 1);
        assert_eq!(
            udp.decode(&reply(2)).unwrap().map(|d| d.0),
            Some(Decoded::Stale)
        );
        assert_eq!(
            udp.decode(&[0, 3]).unwrap().map(|d| d.0),
            Some(Decoded::Stale)
        );
    }
}
