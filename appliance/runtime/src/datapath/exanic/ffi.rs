//! libexanic's C functions (`exanic/exanic.h`, `exanic/fifo_rx.h`, `exanic/fifo_tx.h`) and
//! [`Port`], the one safe owner of a handle with its RX and TX buffers: the only `unsafe` of
//! the ExaNIC backend. The handle types are opaque here.

use std::ffi::{c_char, c_int, CStr};

#[repr(C)]
struct exanic_t {
    _opaque: [u8; 0],
}
#[repr(C)]
struct exanic_rx_t {
    _opaque: [u8; 0],
}
#[repr(C)]
struct exanic_tx_t {
    _opaque: [u8; 0],
}

extern "C" {
    fn exanic_acquire_handle(device_name: *const c_char) -> *mut exanic_t;
    fn exanic_release_handle(exanic: *mut exanic_t);
    fn exanic_acquire_rx_buffer(
        exanic: *mut exanic_t,
        port_number: c_int,
        buffer_number: c_int,
    ) -> *mut exanic_rx_t;
    fn exanic_release_rx_buffer(rx: *mut exanic_rx_t);
    fn exanic_receive_frame(
        rx: *mut exanic_rx_t,
        rx_buf: *mut c_char,
        rx_buf_size: usize,
        timestamp: *mut u32,
    ) -> isize;
    fn exanic_acquire_tx_buffer(
        exanic: *mut exanic_t,
        port_number: c_int,
        requested_size: usize,
    ) -> *mut exanic_tx_t;
    fn exanic_release_tx_buffer(tx: *mut exanic_tx_t);
    fn exanic_transmit_frame(
        tx: *mut exanic_tx_t,
        frame: *const c_char,
        frame_size: usize,
    ) -> c_int;
}

/// Which acquisition of [`Port::open`] failed (what was acquired before it is released).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Failed {
    Handle,
    Rx,
    Tx,
}

/// One port of an ExaNIC: its device handle, RX buffer 0 and a TX buffer, released on drop.
pub(super) struct Port {
    handle: *mut exanic_t,
    rx: *mut exanic_rx_t,
    tx: *mut exanic_tx_t,
}

impl Port {
    /// Acquires device `name` (e.g. `exanic0`) and the buffers of port `port`.
    pub(super) fn open(name: &CStr, port: c_int) -> Result<Port, Failed> {
        // SAFETY: `name` is NUL-terminated and outlives the call.
        let handle = unsafe { exanic_acquire_handle(name.as_ptr()) };
        if handle.is_null() {
            return Err(Failed::Handle);
        }
        // SAFETY: `handle` is a live handle just acquired.
        let rx = unsafe { exanic_acquire_rx_buffer(handle, port, 0) };
        if rx.is_null() {
            // SAFETY: acquired above, released once.
            unsafe { exanic_release_handle(handle) };
            return Err(Failed::Rx);
        }
        // SAFETY: `handle` is live; 0 asks for the default TX buffer size.
        let tx = unsafe { exanic_acquire_tx_buffer(handle, port, 0) };
        if tx.is_null() {
            // SAFETY: both acquired above, each released once.
            unsafe {
                exanic_release_rx_buffer(rx);
                exanic_release_handle(handle);
            }
            return Err(Failed::Tx);
        }
        Ok(Port { handle, rx, tx })
    }

    /// Copies the next received frame into `buf`: its length, 0 when none is waiting, or
    /// libexanic's negative status (lapped, truncated, corrupt, aborted, overflow).
    pub(super) fn receive(&mut self, buf: &mut [u8]) -> isize {
        // A null timestamp pointer is allowed (libexanic then skips it).
        // SAFETY: `self.rx` is live (released only on drop); `buf` is writable for its length.
        unsafe {
            exanic_receive_frame(
                self.rx,
                buf.as_mut_ptr().cast::<c_char>(),
                buf.len(),
                std::ptr::null_mut(),
            )
        }
    }

    /// Transmits `frame`: 0 when queued, libexanic's error otherwise.
    pub(super) fn transmit(&mut self, frame: &[u8]) -> c_int {
        // SAFETY: `self.tx` is live (released only on drop); `frame` is readable for its length.
        unsafe { exanic_transmit_frame(self.tx, frame.as_ptr().cast::<c_char>(), frame.len()) }
    }
}

impl Drop for Port {
    fn drop(&mut self) {
        // SAFETY: all three were acquired in `open` and are released exactly once, here.
        unsafe {
            exanic_release_tx_buffer(self.tx);
            exanic_release_rx_buffer(self.rx);
            exanic_release_handle(self.handle);
        }
    }
}
