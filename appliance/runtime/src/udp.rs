//! memcache over UDP (off by default): each datagram carries memcached's 8-byte frame header
//! (request id, sequence, datagram count, reserved) and one whole request; replies are split
//! into datagrams of at most 1400 bytes, each with its header.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::thread::JoinHandle;

use ringstore_service::{Protocol, Session, Shared};

use crate::clock::Clock;
use crate::RuntimeError;

const HEADER: usize = 8;
const DATAGRAM: usize = 1400;
/// Largest request datagram accepted.
const MAX_REQUEST: usize = 64 << 10;

/// Splits `reply` into framed datagrams for request `id`; `None` if it needs more than 65535.
pub(crate) fn frame_reply(id: u16, reply: &[u8]) -> Option<Vec<Vec<u8>>> {
    let chunk = DATAGRAM - HEADER;
    let total = reply.len().div_ceil(chunk).max(1);
    let total16 = u16::try_from(total).ok()?;
    let mut out = Vec::with_capacity(total);
    for seq in 0..total {
        let part = &reply[(seq * chunk).min(reply.len())..((seq + 1) * chunk).min(reply.len())];
        let mut datagram = Vec::with_capacity(HEADER + part.len());
        datagram.extend_from_slice(&id.to_be_bytes());
        datagram.extend_from_slice(&(seq as u16).to_be_bytes());
        datagram.extend_from_slice(&total16.to_be_bytes());
        datagram.extend_from_slice(&[0, 0]);
        datagram.extend_from_slice(part);
        out.push(datagram);
    }
    Some(out)
}

/// Starts the UDP thread; it ends once `stop_fd` is readable.
pub(crate) fn spawn(
    socket: OwnedFd,
    shared: Arc<Shared>,
    clock: Clock,
    stop_fd: RawFd,
) -> Result<JoinHandle<()>, RuntimeError> {
    std::thread::Builder::new()
        .name("ringstore-udp".into())
        .spawn(move || serve(socket, shared, clock, stop_fd))
        .map_err(|e| RuntimeError::io("spawning the UDP thread", e))
}

fn serve(socket: OwnedFd, shared: Arc<Shared>, clock: Clock, stop_fd: RawFd) {
    let fd = socket.as_raw_fd();
    let mut buf = vec![0u8; MAX_REQUEST];
    let mut out = Vec::new();
    let mut session = Session::new(Protocol::Memcache, 0);
    loop {
        let ready = crate::sys::poll_readable(&[fd, stop_fd], 1000);
        if ready[1] {
            return;
        }
        if !ready[0] {
            continue;
        }
        while let Some((len, peer)) = crate::sys::recv_from(fd, &mut buf) {
            if len < HEADER {
                continue;
            }
            let id = u16::from_be_bytes([buf[0], buf[1]]);
            let total = u16::from_be_bytes([buf[4], buf[5]]);
            if total != 1 {
                continue; // multi-datagram requests are not supported (as in memcached)
            }
            out.clear();
            let mut input = &buf[HEADER..len];
            loop {
                let flow = session.on_bytes(input, clock.now(), &shared, &mut out);
                input = &[];
                if flow != ringstore_service::Flow::Drain || out.len() > 4 << 20 {
                    break;
                }
            }
            if session.has_partial_request() {
                session = Session::new(Protocol::Memcache, 0); // a datagram is a whole request
            }
            if let Some(datagrams) = frame_reply(id, &out) {
                for datagram in datagrams.iter().filter(|_| !out.is_empty()) {
                    crate::sys::send_to(fd, datagram, &peer);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_are_framed_and_split() {
        let reply = vec![b'v'; 3000];
        let datagrams = frame_reply(7, &reply).unwrap();
        assert_eq!(datagrams.len(), 3);
        assert_eq!(&datagrams[0][..8], &[0, 7, 0, 0, 0, 3, 0, 0]);
        assert_eq!(&datagrams[2][..8], &[0, 7, 0, 2, 0, 3, 0, 0]);
        assert!(datagrams.iter().all(|d| d.len() <= DATAGRAM));
        assert_eq!(
            datagrams.iter().map(|d| d.len() - HEADER).sum::<usize>(),
            3000
        );
        assert!(frame_reply(1, &vec![0; 70_000 * 1400]).is_none());
    }
}
