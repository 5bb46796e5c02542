//! memcache UDP on a readiness worker (ADR 0033): the worker's own socket of the
//! SO_REUSEPORT group, read with one nonblocking `recvmmsg` per burst, each datagram through
//! the same `datapath::serve_datagram` and `Handler::udp_request` as the io_uring worker,
//! the replies of a burst sent with `sendmmsg`.
//!
//! Bounds: one receive buffer of [`BURST`] slots of `REQUEST_MAX` bytes, allocated with the
//! worker (a longer datagram arrives truncated and is dropped); [`BURST`] datagrams, one
//! `recvmmsg`, per readiness event (the socket is watched level-triggered, so what
//! is left is reported by the next wait, after the connections had their turn); at most
//! [`TX_MAX`] reply datagrams queued per burst (a reply that does not fit is dropped,
//! counted, as the io_uring worker drops one when its send slots are full). A reply the
//! kernel cannot take at once (socket buffer full) is dropped and counted: memcached's UDP
//! drops under pressure too. Writes over UDP with a data device are not served here yet
//! (refused at start): their replies would have to be held.

use std::net::SocketAddr;

use ringstore_proto::wire::frame;

use super::*;
use crate::datapath::kernel_udp::{count_served, REQUEST_MAX};
use crate::datapath::{self, Peer, ReplySink};
use crate::handler::UdpEvent;
use crate::sys::{RecvBatch, Transfer};

/// Datagrams received (one `recvmmsg`) and served per readiness event.
const BURST: usize = crate::sys::RECVMMSG_MAX;
/// Reply datagrams queued for one `sendmmsg` round at most.
const TX_MAX: usize = 256;

/// A readiness worker's UDP socket and its buffers.
pub(super) struct Udp {
    fd: OwnedFd,
    allow: Vec<ipnet::IpNet>,
    /// A slot per datagram of a burst, each as long as the largest request.
    rx: RecvBatch,
    reply: datapath::Reply,
    /// Reply datagrams of this burst: destination, bytes (a header and its body).
    tx: Vec<(SocketAddr, Vec<u8>)>,
    /// Buffers of sent datagrams, reused.
    spare: Vec<Vec<u8>>,
    errors_logged: u32,
}

impl Udp {
    pub(super) fn new(fd: OwnedFd, allow: Vec<ipnet::IpNet>) -> std::io::Result<Udp> {
        crate::sys::set_nonblocking(fd.as_raw_fd())?;
        Ok(Udp {
            fd,
            allow,
            rx: RecvBatch::new(BURST, REQUEST_MAX),
            reply: datapath::Reply::default(),
            tx: Vec::with_capacity(TX_MAX),
            spare: Vec::new(),
            errors_logged: 0,
        })
    }

    pub(super) fn fd(&self) -> std::os::fd::RawFd {
        self.fd.as_raw_fd()
    }
}

/// Collects one request's reply datagrams addressed to its peer.
struct Queue<'a> {
    tx: &'a mut Vec<(SocketAddr, Vec<u8>)>,
    spare: &'a mut Vec<Vec<u8>>,
    to: SocketAddr,
}

impl ReplySink for Queue<'_> {
    fn has_room(&mut self, count: usize) -> bool {
        self.tx.len() + count <= TX_MAX
    }

    fn datagram(&mut self, header: &[u8; frame::HEADER_LEN], body: &[u8]) {
        let mut bytes = self.spare.pop().unwrap_or_default();
        bytes.clear();
        bytes.extend_from_slice(header);
        bytes.extend_from_slice(body);
        self.tx.push((self.to, bytes));
    }
}

impl<H: Handler> Worker<H> {
    /// The UDP socket is readable: serves a burst of datagrams, then sends their replies.
    pub(super) fn on_udp(&mut self) {
        let worker = self.core.setup.index;
        let handler = &*self.core.setup.handler;
        let now = self.core.now;
        let Some(udp) = self.udp.as_mut() else {
            return;
        };
        match crate::sys::recvmmsg_nowait(udp.fd.as_raw_fd(), &mut udp.rx) {
            Transfer::Done(_) => {}
            Transfer::WouldBlock => return,
            Transfer::Failed => {
                if udp.errors_logged < 3 {
                    udp.errors_logged += 1;
                    eprintln!("ringstore: worker {worker}: UDP receive failed");
                }
                return;
            }
        }
        for (got, bytes) in udp.rx.datagrams() {
            handler.hooks().udp_count(worker, UdpEvent::Rx, 1);
            let (false, Some(from)) = (got.truncated, got.from) else {
                handler.hooks().udp_count(worker, UdpEvent::Dropped, 1);
                continue;
            };
            let mut queue = Queue {
                tx: &mut udp.tx,
                spare: &mut udp.spare,
                to: from,
            };
            let served = datapath::serve_datagram(
                bytes,
                &Peer::Socket(from),
                &udp.allow,
                &mut udp.reply,
                |_, request, out| {
                    handler.udp_request(worker, request, now, None, out);
                    datapath::Answer::Now
                },
                &mut queue,
            );
            count_served(handler, worker, served);
        }
        send_all(handler, worker, udp);
    }
}

/// Sends the queued reply datagrams, `sendmmsg` by `sendmmsg`; what the socket cannot take
/// now is dropped (counted).
fn send_all<H: Handler>(handler: &H, worker: usize, udp: &mut Udp) {
    let mut at = 0;
    while at < udp.tx.len() {
        let batch: Vec<(SocketAddr, &[u8])> = udp.tx[at..]
            .iter()
            .take(crate::sys::SENDMMSG_MAX)
            .map(|(to, bytes)| (*to, bytes.as_slice()))
            .collect();
        match crate::sys::sendmmsg_nowait(udp.fd.as_raw_fd(), &batch) {
            Transfer::Done(n) if n > 0 => {
                handler.hooks().udp_count(worker, UdpEvent::Tx, n as u64);
                at += n;
            }
            _ => {
                let left = (udp.tx.len() - at) as u64;
                handler.hooks().udp_count(worker, UdpEvent::Dropped, left);
                break;
            }
        }
    }
    for (_, bytes) in udp.tx.drain(..) {
        if udp.spare.len() < TX_MAX {
            udp.spare.push(bytes);
        }
    }
}
