//! Queueing io_uring operations: the tick, the inbox read, accepts, receives and sends.

use super::send_vec;
use super::*;

impl<H: Handler> Worker<H> {
    pub(super) fn arm_tick(&mut self) {
        let entry = opcode::Timeout::new(&*self.tick as *const types::Timespec)
            .build()
            .user_data(Op::Tick.encode());
        self.pending.push(entry);
    }

    pub(super) fn arm_inbox(&mut self) {
        let entry = opcode::Read::new(
            types::Fd(self.core.setup.inbox.eventfd()),
            self.inbox_word.cast(),
            8,
        )
        .build()
        .user_data(Op::Inbox.encode());
        self.pending.push(entry);
    }

    /// A multishot readiness poll on AF_XDP socket `index`: its completions only wake the
    /// loop, which then polls every socket (the socket lives as long as the worker).
    pub(super) fn arm_xdp(&mut self, index: usize) {
        let Some(fd) = self
            .core
            .setup
            .xdp
            .as_ref()
            .and_then(|x| x.fds().get(index).copied())
        else {
            return;
        };
        let entry = opcode::PollAdd::new(types::Fd(fd), libc::POLLIN as u32)
            .multi(true)
            .build()
            .user_data(
                Op::XdpReady {
                    index: crate::sys::u32_of(index),
                }
                .encode(),
            );
        self.pending.push(entry);
    }

    pub(super) fn arm_accept(&mut self, index: usize) {
        let fd = self.core.setup.listeners[index].0.as_raw_fd();
        let entry = opcode::Accept::new(types::Fd(fd), std::ptr::null_mut(), std::ptr::null_mut())
            .flags(libc::SOCK_CLOEXEC)
            .build()
            .user_data(
                Op::Accept {
                    index: crate::sys::u32_of(index),
                }
                .encode(),
            );
        self.pending.push(entry);
        self.accept_armed[index] = true;
    }

    pub(super) fn arm_recv(&mut self, slot: u32) {
        self.arm_recv_with(slot, 0);
    }

    /// `ioprio` may carry IORING_RECVSEND_POLL_FIRST: for a receive queued behind a send the
    /// request has just been answered, so the peer's next one is not there yet; polling first
    /// skips a receive attempt that would only find the socket empty.
    pub(super) fn arm_recv_with(&mut self, slot: u32, ioprio: u16) {
        let generation = self.core.conns.generation(slot);
        let pooled = self.bufs.is_some();
        let Some(conn) = self.core.conns.get_mut(slot, generation) else {
            return;
        };
        let fd = types::Fd(conn.fd.as_raw_fd());
        let target = conn.recv_target(&*self.core.setup.handler);
        let entry = if let Some((at, len)) = target {
            // A storage value's missing bytes go straight into its reserved item (issue 38).
            opcode::Recv::new(fd, at, crate::sys::u32_of(len))
                .ioprio(ioprio)
                .build()
        } else if pooled {
            opcode::Recv::new(fd, std::ptr::null_mut(), crate::sys::u32_of(BUF_SIZE))
                .buf_group(BufRing::GROUP)
                .ioprio(ioprio)
                .build()
                .flags(squeue::Flags::BUFFER_SELECT)
        } else {
            #[expect(
                clippy::expect_used,
                reason = "without a buffer pool every connection gets its own buffer at open"
            )]
            let buf = conn.io.own_buf.as_mut().expect("own buffer without a pool");
            opcode::Recv::new(fd, buf.as_mut_ptr(), crate::sys::u32_of(buf.len()))
                .ioprio(ioprio)
                .build()
        };
        conn.machine.armed(Io::Recv);
        self.pending
            .push(entry.user_data(Op::Recv { slot, generation }.encode()));
    }

    /// Sends the rest of `out`. When the connection will read next (`Flow::Continue`), the
    /// receive is linked behind the send and goes in the same submission: one enter per
    /// request instead of two. A short send breaks the link (the receive completes with
    /// ECANCELED) and the remainder is sent first.
    pub(super) fn arm_send(&mut self, slot: u32) {
        let at = self.core.at();
        let generation = self.core.conns.generation(slot);
        let handler = &*self.core.setup.handler;
        let Some(conn) = self.core.conns.get_mut(slot, generation) else {
            return;
        };
        let splices = handler.splices(&conn.session);
        let entry = if splices.is_empty() {
            let rest = &conn.out[conn.sent..];
            let len = u32::try_from(rest.len()).unwrap_or(u32::MAX);
            opcode::Send::new(types::Fd(conn.fd.as_raw_fd()), rest.as_ptr(), len)
                .flags(libc::MSG_NOSIGNAL)
                .build()
        } else {
            // Output with values sent from the item: a vectored send (`send_vec.rs`).
            let fd = conn.fd.as_raw_fd();
            send_vec::entry(fd, &conn.out, conn.sent, &mut conn.io.vec_send, splices)
        };
        let link_recv = self.link_recv && conn.machine.links_recv(at);
        let mut entry = entry.user_data(Op::Send { slot, generation }.encode());
        if link_recv {
            entry = entry.flags(squeue::Flags::IO_LINK);
        }
        conn.machine.armed(Io::Send);
        self.pending.push(entry);
        if link_recv {
            // POLL_FIRST exists from 5.19, like provided-buffer rings: use it only with them.
            let ioprio = if self.bufs.is_some() && self.poll_first {
                RECVSEND_POLL_FIRST
            } else {
                0
            };
            self.arm_recv_with(slot, ioprio);
        }
    }
}
