//! Connections handed over by the acceptors (the inbox) and accepted by this worker's own
//! reuseport listeners.

use super::*;

impl<H: Handler> Worker<H> {
    pub(super) fn on_inbox(&mut self) {
        self.take_inbox();
        self.arm_inbox();
    }

    pub(super) fn on_accept(&mut self, index: usize, res: i32) {
        self.accept_armed[index] = false;
        if res >= 0 {
            let fd = super::sqe::adopt_accepted(res);
            let endpoint = self.core.setup.listeners[index].1;
            if self.core.stopping_deadline.is_some() {
                return;
            }
            if let Some(fd) = self.core.setup.admit_own(fd, endpoint) {
                self.open_connection(fd, endpoint);
            }
            self.arm_accept(index);
            return;
        }
        match -res {
            libc::ECANCELED | libc::EINVAL | libc::EBADF => {} // stopping
            libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM => {
                // Out of descriptors: retry from the tick instead of spinning.
                self.core.accept_backoff_until = self.core.now.mono_ms + 100;
            }
            _ if self.core.stopping_deadline.is_none() => self.arm_accept(index),
            _ => {}
        }
    }
}
