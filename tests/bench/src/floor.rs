//! The floor server: the smallest io_uring responder that answers each memcache request of a
//! cell with a fixed reply of the right size, without parsing anything or touching a store.
//! What it costs per request is the kernel's TCP path plus one ring; the bench reports
//! ringstore against it so ringstore's own share of a cell's cost is visible (issue 14).
//!
//! Every request of a cell has the same length (the keys are fixed width, `mcwire`), so the
//! floor counts requests by bytes: `received / request_len`. It runs as its own process,
//! `ringstore-bench floor --port P --op get|set|mg|bget|bgetk --value-len N`, pinned like the
//! other servers.

use super::mcwire::{write_reply, write_request, Op};
use anyhow::{bail, Context, Result};
use io_uring::{opcode, types, IoUring};
use std::net::TcpListener;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// Connections served at once; more are closed at accept.
const CONNS_MAX: usize = 1024;
/// Receive buffer per connection.
const RX_LEN: usize = 64 << 10;
/// Reply bytes one send carries at most; replies owed beyond it wait for the next send.
const TX_MAX: usize = 4 << 20;
/// `user_data` of the accept.
const ACCEPT: u64 = u64::MAX;

/// The request and reply of one cell, byte for byte as long as the real ones.
pub struct Shape {
    pub request_len: usize,
    pub reply: Vec<u8>,
}

impl Shape {
    pub fn new(op: Op, value_len: usize) -> Shape {
        let value = vec![b'v'; value_len];
        let mut request = Vec::new();
        write_request(&mut request, op, &value, 0);
        let mut reply = Vec::new();
        write_reply(&mut reply, op, &value, 0);
        Shape {
            request_len: request.len(),
            reply,
        }
    }
}

/// One connection. Boxed in `Floor::conns`, so the buffers the kernel reads and writes stay
/// where they are until the connection is dropped, which waits for its ops.
struct Conn {
    fd: OwnedFd,
    rx: Box<[u8]>,
    /// Request bytes received that do not yet make a whole request.
    partial: usize,
    /// Replies owed and not yet in a send.
    owed: usize,
    tx: Vec<u8>,
    tx_done: usize,
    recv_queued: bool,
    send_queued: bool,
    closing: bool,
}

struct Floor {
    ring: IoUring,
    conns: Vec<Option<Box<Conn>>>,
    shape: Shape,
}

/// `ringstore-bench floor` arguments.
pub fn main(args: &[String]) -> Result<()> {
    let mut port = None;
    let mut op = None;
    let mut value_len = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || it.next().context("missing value");
        match a.as_str() {
            "--port" => port = Some(value()?.parse::<u16>()?),
            "--op" => {
                let token = value()?;
                op = Some(
                    Op::from_token(token)
                        .with_context(|| format!("--op {token}: one of {}", Op::tokens()))?,
                );
            }
            "--value-len" => value_len = Some(value()?.parse::<usize>()?),
            other => bail!("floor: unknown argument {other}"),
        }
    }
    let (Some(port), Some(op), Some(value_len)) = (port, op, value_len) else {
        bail!("usage: ringstore-bench floor --port P --op get|set|mg|bget|bgetk --value-len N");
    };
    let listener = TcpListener::bind(("127.0.0.1", port))?;
    println!("ready");
    serve(listener, Shape::new(op, value_len))
}

pub(crate) fn serve(listener: TcpListener, shape: Shape) -> Result<()> {
    let mut floor = Floor {
        ring: IoUring::new(4096)?,
        conns: (0..CONNS_MAX).map(|_| None).collect(),
        shape,
    };
    let lfd = listener.as_raw_fd();
    floor.push(
        opcode::Accept::new(types::Fd(lfd), std::ptr::null_mut(), std::ptr::null_mut())
            .build()
            .user_data(ACCEPT),
    )?;
    loop {
        floor.ring.submit_and_wait(1)?;
        let done: Vec<(u64, i32)> = floor
            .ring
            .completion()
            .map(|c| (c.user_data(), c.result()))
            .collect();
        for (ud, res) in done {
            if ud == ACCEPT {
                floor.accepted(res);
                floor.push(
                    opcode::Accept::new(types::Fd(lfd), std::ptr::null_mut(), std::ptr::null_mut())
                        .build()
                        .user_data(ACCEPT),
                )?;
                continue;
            }
            let (slot, is_send) = ((ud >> 1) as usize, ud & 1 == 1);
            if is_send {
                floor.sent(slot, res)?;
            } else {
                floor.received(slot, res)?;
            }
            floor.reap(slot);
        }
    }
}

impl Floor {
    fn push(&mut self, entry: io_uring::squeue::Entry) -> Result<()> {
        loop {
            // A `Conn` is dropped only once none of its ops is queued (`reap`).
            // SAFETY: every entry points into a `Conn`'s boxed buffers, or at nothing (accept).
            if unsafe { self.ring.submission().push(&entry) }.is_ok() {
                return Ok(());
            }
            self.ring.submit()?;
        }
    }

    fn accepted(&mut self, res: i32) {
        if res < 0 {
            return;
        }
        // SAFETY: a successful accept's result is a new descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(res) };
        let Some(slot) = self.conns.iter().position(Option::is_none) else {
            return; // at CONNS_MAX: dropping `fd` closes the connection
        };
        let _ = rustix::net::sockopt::set_tcp_nodelay(&fd, true);
        self.conns[slot] = Some(Box::new(Conn {
            fd,
            rx: vec![0u8; RX_LEN].into_boxed_slice(),
            partial: 0,
            owed: 0,
            tx: Vec::with_capacity(TX_MAX),
            tx_done: 0,
            recv_queued: false,
            send_queued: false,
            closing: false,
        }));
        let _ = self.queue_recv(slot);
    }

    fn queue_recv(&mut self, slot: usize) -> Result<()> {
        let Some(c) = self.conns[slot].as_mut() else {
            return Ok(());
        };
        let entry = opcode::Recv::new(
            types::Fd(c.fd.as_raw_fd()),
            c.rx.as_mut_ptr(),
            super::client::sqe_len(RX_LEN),
        )
        .build()
        .user_data((slot as u64) << 1);
        c.recv_queued = true;
        self.push(entry)
    }

    fn received(&mut self, slot: usize, res: i32) -> Result<()> {
        let request_len = self.shape.request_len;
        let Some(c) = self.conns[slot].as_mut() else {
            return Ok(());
        };
        c.recv_queued = false;
        if res <= 0 {
            c.closing = true;
            return Ok(());
        }
        let total = c.partial + res as usize;
        c.owed += total / request_len;
        c.partial = total % request_len;
        self.queue_send(slot)?;
        self.queue_recv(slot)
    }

    fn queue_send(&mut self, slot: usize) -> Result<()> {
        let reply_len = self.shape.reply.len();
        let Some(c) = self.conns[slot].as_mut() else {
            return Ok(());
        };
        if c.send_queued || c.closing {
            return Ok(());
        }
        if c.tx_done == c.tx.len() {
            if c.owed == 0 {
                return Ok(());
            }
            let n = c.owed.min((TX_MAX / reply_len).max(1));
            c.owed -= n;
            c.tx.clear();
            for _ in 0..n {
                c.tx.extend_from_slice(&self.shape.reply);
            }
            c.tx_done = 0;
        }
        let rest = &c.tx[c.tx_done..];
        let entry = opcode::Send::new(
            types::Fd(c.fd.as_raw_fd()),
            rest.as_ptr(),
            super::client::sqe_len(rest.len()),
        )
        .build()
        .user_data(((slot as u64) << 1) | 1);
        c.send_queued = true;
        self.push(entry)
    }

    fn sent(&mut self, slot: usize, res: i32) -> Result<()> {
        let Some(c) = self.conns[slot].as_mut() else {
            return Ok(());
        };
        c.send_queued = false;
        if res < 0 {
            c.closing = true;
            return Ok(());
        }
        c.tx_done += res as usize;
        self.queue_send(slot)
    }

    /// Drops a closing connection once none of its ops is queued.
    fn reap(&mut self, slot: usize) {
        if self.conns[slot]
            .as_ref()
            .is_some_and(|c| c.closing && !c.recv_queued && !c.send_queued)
        {
            self.conns[slot] = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mcwire::{split_reply, split_reply_for, Reply};

    #[test]
    fn replies_are_as_long_as_the_real_ones_and_parse_as_hits() {
        let get = Shape::new(Op::Get, 100);
        assert_eq!(get.request_len, b"get b100:00000000\r\n".len());
        assert_eq!(split_reply(&get.reply), Some((Reply::Hit, get.reply.len())));
        let set = Shape::new(Op::Set, 4096);
        assert_eq!(
            set.request_len,
            b"set b4096:00000000 0 0 4096\r\n".len() + 4096 + 2
        );
        assert_eq!(
            split_reply(&set.reply),
            Some((Reply::Stored, set.reply.len()))
        );
        for op in [Op::MetaGet, Op::BinGet, Op::BinGetK] {
            let shape = Shape::new(op, 102400);
            assert_eq!(
                split_reply_for(op, 102400, &shape.reply),
                Some((Reply::Hit, shape.reply.len())),
                "{op:?}"
            );
        }
        assert_eq!(
            Shape::new(Op::MetaGet, 100).request_len,
            b"mg b100:00000000 v\r\n".len()
        );
        assert_eq!(Shape::new(Op::BinGetK, 100).request_len, 24 + 13);
    }

    #[test]
    fn the_floor_answers_every_pipelined_request_once() {
        use std::io::{Read, Write};
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || serve(listener, Shape::new(Op::Get, 100)));
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let shape = Shape::new(Op::Get, 100);
        let mut reqs = Vec::new();
        for i in 0..16 {
            write_request(&mut reqs, Op::Get, &[b'v'; 100], i);
        }
        // Split mid-request: the floor must count by bytes across receives.
        s.write_all(&reqs[..reqs.len() / 2 + 3]).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        s.write_all(&reqs[reqs.len() / 2 + 3..]).unwrap();
        let mut got = vec![0u8; shape.reply.len() * 16];
        s.read_exact(&mut got).unwrap();
        assert!(got.chunks(shape.reply.len()).all(|r| r == shape.reply));
        s.set_read_timeout(Some(std::time::Duration::from_millis(100)))
            .unwrap();
        assert!(
            s.read(&mut [0u8; 1]).is_err(),
            "no reply beyond the requests sent"
        );
    }

    /// The load generator against a floor that answers `mg` with values of `served` bytes,
    /// asking for values of `asked` bytes (keys of the same width, so the floor counts alike).
    fn mg_cell_against_floor(served: usize, asked: usize) -> anyhow::Result<u64> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        std::thread::spawn(move || serve(listener, Shape::new(Op::MetaGet, served)));
        let mode = crate::client::Mode::Memcache {
            op: Op::MetaGet,
            value_len: asked,
        };
        let mut session = crate::client::Session::open(&crate::client::LoadSpec {
            port,
            mode: mode.clone(),
            depth: 1,
            conns: 2,
            keyspace: 4,
            warmup: std::time::Duration::ZERO,
            measure: std::time::Duration::ZERO,
            slices: 1,
            server_pid: std::process::id(),
        })?;
        // A counted pass: exact whatever the machine's load.
        let r = session.pass(&mode, 1, 8, std::time::Duration::from_secs(5))?;
        Ok(r.requests)
    }

    #[test]
    fn a_wrong_answer_fails_an_mg_cell_instead_of_counting() {
        assert_eq!(mg_cell_against_floor(100, 100).unwrap(), 16);
        let wrong = mg_cell_against_floor(100, 200).unwrap_err();
        assert!(format!("{wrong:#}").contains("wrong answer"), "{wrong:#}");
    }
}
