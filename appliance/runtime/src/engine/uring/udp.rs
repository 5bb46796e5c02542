//! The kernel-UDP backend on the worker's ring: its multishot receive, each datagram through
//! `datapath::serve_datagram`, reply datagrams as `sendmsg`s (same-size ones to one peer as the
//! GSO segments of one, queued before each submission), and UDP writes held until the
//! data device settles them (state and bounds: `datapath/kernel_udp.rs`).

use super::*;
use crate::datapath::kernel_udp::{count_served, Held, SendSink, HELD_MAX, HELD_SLOT, NAME_LEN};
use crate::datapath::{self, Answer, DropReason, Served};
use crate::handler::UdpEvent;

/// Bytes of a request kept with a held reply (a binary header: what a "too large" reply
/// echoes).
const REQUEST_HEAD: usize = 24;

/// The held table's id of index `index` at generation `generation`.
fn held_id(index: usize, generation: u32) -> u32 {
    (generation << HELD_MAX.trailing_zeros()) | crate::sys::u32_of(index)
}

impl<H: Handler> Worker<H> {
    /// Arms the multishot receive if it is not (and the worker is not stopping).
    pub(super) fn arm_udp(&mut self) {
        if self.core.stopping_deadline.is_some() {
            return;
        }
        if let Some(udp) = self.udp.as_mut() {
            if !udp.recv_armed {
                let entry = udp.recv_entry();
                self.pending.push(entry);
            }
        }
    }

    pub(super) fn on_udp_recv(&mut self, res: i32, flags: u32) {
        let Some(udp) = self.udp.as_mut() else {
            return;
        };
        let more = cqueue::more(flags);
        if !more {
            udp.recv_armed = false;
        }
        let bid = cqueue::buffer_select(flags);
        match (res, bid) {
            (len, Some(bid)) if len >= 0 => self.serve_udp(bid, len as usize),
            (_, Some(bid)) => udp.bufs.recycle(bid),
            _ => {}
        }
        // Out of buffers (all given back by now) or a datagram that ended the multishot:
        // re-arm at once. Any other error waits for the next tick (no spin on a broken socket).
        if !more && (res >= 0 || res == -libc::ENOBUFS) {
            self.arm_udp();
        } else if !more && res != -libc::ECANCELED && self.udp_errors_logged < 3 {
            self.udp_errors_logged += 1;
            eprintln!(
                "ringstore: worker {}: UDP receive failed: {}",
                self.core.setup.index,
                std::io::Error::from_raw_os_error(-res)
            );
        }
    }

    /// Serves the datagram in receive buffer `bid` (`len` bytes with the recvmsg header).
    fn serve_udp(&mut self, bid: u16, len: usize) {
        let worker = self.core.setup.index;
        let handler = &*self.core.setup.handler;
        let now = self.core.now;
        let Some(udp) = self.udp.as_mut() else {
            return;
        };
        handler.hooks().udp_count(worker, UdpEvent::Rx, 1);
        let device = self.device.as_ref();
        let pending = &mut self.pending;
        let served = 'served: {
            let buf = udp.bufs.filled(bid, len);
            let msg = match types::RecvMsgOut::parse(buf, &udp.recv_msg) {
                Ok(msg) if !msg.is_payload_truncated() && !msg.is_name_data_truncated() => msg,
                // Longer than a receive buffer, or a peer address that does not fit.
                _ => break 'served Served::Dropped(DropReason::Lost),
            };
            let name = msg.name_data();
            let Some(peer) = datapath::kernel_udp::peer_of(name) else {
                break 'served Served::Dropped(DropReason::NotOurs);
            };
            let mut sink = SendSink::new(&mut udp.sends, name, pending);
            let held = &mut udp.held;
            let held_free = &mut udp.held_free;
            let held_gen = &mut udp.held_gen;
            datapath::serve_datagram(
                msg.payload_data(),
                &peer,
                &udp.allow,
                &mut udp.out,
                |head, request, out| {
                    let Some(device) = device else {
                        handler.udp_request(worker, request, now, None, out);
                        return Answer::Now;
                    };
                    let Some(&index) = held_free.last() else {
                        return Answer::HeldFull;
                    };
                    let index = index as usize;
                    let id = held_id(index, held_gen[index]);
                    let device = device.for_conn(HELD_SLOT, id);
                    let Some(session) =
                        handler.udp_request(worker, request, now, Some(&device), out)
                    else {
                        return Answer::Now;
                    };
                    held_free.pop();
                    held[index] = Some(held_entry(session, head, name, request, out));
                    Answer::Held
                },
                &mut sink,
            )
        };
        udp.bufs.recycle(bid);
        count_served(handler, worker, served);
    }

    /// A reply datagram's send completed.
    pub(super) fn on_udp_send(&mut self, slot: u32, res: i32) {
        let Some(udp) = self.udp.as_mut() else {
            return;
        };
        let datagrams = udp.sends.send_done(slot, res, &mut self.pending);
        let event = if res >= 0 {
            UdpEvent::Tx
        } else {
            UdpEvent::Dropped
        };
        if datagrams > 0 {
            let count = u64::try_from(datagrams).unwrap_or(u64::MAX);
            self.core
                .setup
                .handler
                .hooks()
                .udp_count(self.core.setup.index, event, count);
        }
        if !udp.ready.is_empty() {
            self.send_ready_udp();
        }
    }

    /// The data device settled `token` of held UDP request `id`: its reply goes out once
    /// every record it waits for is settled.
    pub(super) fn on_udp_durable(&mut self, id: u32, token: u64, ok: bool) {
        let handler = &*self.core.setup.handler;
        let Some(udp) = self.udp.as_mut() else {
            return;
        };
        let index = (id as usize) & (HELD_MAX - 1);
        if held_id(index, udp.held_gen[index]) != id {
            return; // a request that is gone
        }
        let Some(entry) = udp.held[index].as_mut() else {
            return;
        };
        handler.on_durable(&mut entry.session, token, ok, &mut entry.out.bytes);
        if handler.awaits_durable(&entry.session) {
            return;
        }
        handler
            .hooks()
            .udp_bound_reply(&entry.request_head, &mut entry.out.bytes);
        handler.output_flushed(&mut entry.session);
        handler.session_closed(&mut entry.session, None);
        // Released: it leaves the table once its datagrams have send slots (one group commit
        // may release the whole table at once; at most 256 datagrams are in flight).
        udp.ready.push_back(crate::sys::u32_of(index));
        self.send_ready_udp();
    }

    /// Sends released held replies, oldest first, while the send slots take each whole.
    pub(super) fn send_ready_udp(&mut self) {
        let worker = self.core.setup.index;
        let handler = &*self.core.setup.handler;
        let Some(udp) = self.udp.as_mut() else {
            return;
        };
        while let Some(&index) = udp.ready.front() {
            let index = index as usize;
            let Some(entry) = udp.held[index].as_ref() else {
                udp.ready.pop_front();
                continue;
            };
            let needed = datapath::datagrams_of(entry.head, &entry.out);
            if needed > udp.sends.free.len() && udp.sends_in_flight() > 0 {
                return; // retried as sends complete
            }
            udp.ready.pop_front();
            let Some(entry) = udp.held[index].take() else {
                continue;
            };
            udp.held_gen[index] = udp.held_gen[index].wrapping_add(1) & (u32::MAX >> 10);
            udp.held_free.push(crate::sys::u32_of(index));
            let name = &entry.name[..entry.name_len as usize];
            let mut sink = SendSink::new(&mut udp.sends, name, &mut self.pending);
            let served = datapath::emit(entry.head, &entry.out, &mut sink);
            count_served(handler, worker, served);
        }
    }

    /// Queues the reply `sendmsg` still open for more GSO segments: called before each
    /// submission, so replies wait at most for the end of the completions being reaped.
    pub(super) fn queue_udp_sends(&mut self) {
        if let Some(udp) = self.udp.as_mut() {
            udp.sends.queue_open(&mut self.pending);
        }
    }

    /// At stop: the multishot receive is cancelled (held requests still get their replies).
    pub(super) fn stop_udp(&mut self) {
        if self.udp.as_ref().is_some_and(|u| u.recv_armed) {
            self.pending.push(
                opcode::AsyncCancel::new(Op::UdpRecv.encode())
                    .build()
                    .user_data(Op::Cancel.encode()),
            );
        }
    }
}

/// The held-table entry of `request` from peer `name` (a raw sockaddr), whose reply waits in
/// `session` for the data device; `out` holds the replies to the commands before the held
/// one, which the held ones follow.
fn held_entry<S>(
    session: S,
    head: ringstore_proto::wire::frame::Frame,
    name: &[u8],
    request: &[u8],
    out: &mut datapath::Reply,
) -> Held<S> {
    let mut saved = [0u8; NAME_LEN];
    let name_len = name.len().min(NAME_LEN);
    saved[..name_len].copy_from_slice(&name[..name_len]);
    Held {
        session,
        head,
        name: saved,
        name_len: crate::sys::u32_of(name_len),
        request_head: request[..request.len().min(REQUEST_HEAD)].to_vec(),
        out: datapath::Reply {
            bytes: std::mem::take(&mut out.bytes),
            marks: Vec::new(),
        },
    }
}
