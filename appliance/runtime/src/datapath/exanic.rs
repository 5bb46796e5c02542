//! The ExaNIC backend (cargo feature `exanic`, the ExaSock hook): memcache UDP frames from an
//! ExaNIC port through libexanic (Cisco exanic-software, BSD-3-Clause), as a polled
//! [`FrameBackend`]. libexanic is linked statically from `EXANIC_LIB_DIR` (see `build.rs`);
//! tests link the test double `appliance/exanic-double` instead (ADR 0021).
//!
//! The card DMAs every frame into a 2 MiB ring that nobody refills; `exanic_receive_frame`
//! copies the next one out. A reader that falls a ring behind is lapped: libexanic reports
//! `-EXANIC_RX_FRAME_SWOVFL` and catches up, so the frames in between are lost. This backend
//! counts that as a drop (and separately as `lapped`), like every other negative status
//! (truncated, corrupt, aborted, hardware overflow), and never fails on it.
//!
//! Buffers: [`RX_SLOTS`] receive slots of [`FRAME_MAX`] bytes (a burst takes at most the free
//! ones) and [`TX_SLOTS`] transmit buffers; replies are built in a TX buffer by
//! `datapath::FrameSink` and handed to `exanic_transmit_frame` by [`FrameBackend::tx_burst`].

use std::ffi::{c_char, c_int, CString};

use super::{Counters, FrameBackend, Mode, RxDesc, TxDesc};

/// Largest frame received or sent (a standard MTU frame with headroom).
pub const FRAME_MAX: usize = 2048;
/// Receive slots: frames held between `rx_burst` and `recycle`.
pub const RX_SLOTS: usize = 64;
/// Transmit buffers.
pub const TX_SLOTS: usize = 64;
/// `EXANIC_RX_FRAME_SWOVFL` of `exanic/fifo_rx.h`: the reader was lapped.
const RX_FRAME_SWOVFL: isize = 256;

mod ffi {
    //! The libexanic functions used, with their C signatures (`exanic/exanic.h`,
    //! `exanic/fifo_rx.h`, `exanic/fifo_tx.h`). The handle types are opaque here.
    use std::ffi::{c_char, c_int};

    #[repr(C)]
    pub struct exanic_t {
        _opaque: [u8; 0],
    }
    #[repr(C)]
    pub struct exanic_rx_t {
        _opaque: [u8; 0],
    }
    #[repr(C)]
    pub struct exanic_tx_t {
        _opaque: [u8; 0],
    }

    extern "C" {
        pub fn exanic_acquire_handle(device_name: *const c_char) -> *mut exanic_t;
        pub fn exanic_release_handle(exanic: *mut exanic_t);
        pub fn exanic_acquire_rx_buffer(
            exanic: *mut exanic_t,
            port_number: c_int,
            buffer_number: c_int,
        ) -> *mut exanic_rx_t;
        pub fn exanic_release_rx_buffer(rx: *mut exanic_rx_t);
        pub fn exanic_receive_frame(
            rx: *mut exanic_rx_t,
            rx_buf: *mut c_char,
            rx_buf_size: usize,
            timestamp: *mut u32,
        ) -> isize;
        pub fn exanic_acquire_tx_buffer(
            exanic: *mut exanic_t,
            port_number: c_int,
            requested_size: usize,
        ) -> *mut exanic_tx_t;
        pub fn exanic_release_tx_buffer(tx: *mut exanic_tx_t);
        pub fn exanic_transmit_frame(
            tx: *mut exanic_tx_t,
            frame: *const c_char,
            frame_size: usize,
        ) -> c_int;
    }
}

/// Why an ExaNIC port could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum ExanicError {
    #[error("ExaNIC device name {0:?} contains a NUL byte")]
    BadName(String),
    #[error("cannot open ExaNIC device {0} (exanic_acquire_handle failed)")]
    Device(String),
    #[error("cannot acquire the RX buffer of {0} port {1}")]
    Rx(String, i32),
    #[error("cannot acquire the TX buffer of {0} port {1}")]
    Tx(String, i32),
}

/// One ExaNIC port, owned by one worker.
pub struct Exanic {
    handle: *mut ffi::exanic_t,
    rx: *mut ffi::exanic_rx_t,
    tx: *mut ffi::exanic_tx_t,
    rx_bufs: Box<[[u8; FRAME_MAX]]>,
    rx_free: Vec<u32>,
    tx_bufs: Box<[[u8; FRAME_MAX]]>,
    tx_free: Vec<u32>,
    counters: Counters,
    lapped: u64,
}

impl std::fmt::Debug for Exanic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exanic")
            .field("counters", &self.counters)
            .field("lapped", &self.lapped)
            .finish()
    }
}

impl Exanic {
    /// Opens `device` (e.g. `exanic0`) port `port`: its handle, RX buffer 0 and a TX buffer.
    pub fn open(device: &str, port: i32) -> Result<Exanic, ExanicError> {
        let name = CString::new(device).map_err(|_| ExanicError::BadName(device.into()))?;
        // SAFETY: `name` is NUL-terminated and outlives the call.
        let handle = unsafe { ffi::exanic_acquire_handle(name.as_ptr()) };
        if handle.is_null() {
            return Err(ExanicError::Device(device.into()));
        }
        // SAFETY: `handle` is a live handle just acquired.
        let rx = unsafe { ffi::exanic_acquire_rx_buffer(handle, port as c_int, 0) };
        if rx.is_null() {
            // SAFETY: acquired above, released once.
            unsafe { ffi::exanic_release_handle(handle) };
            return Err(ExanicError::Rx(device.into(), port));
        }
        // SAFETY: `handle` is live; 0 asks for the default TX buffer size.
        let tx = unsafe { ffi::exanic_acquire_tx_buffer(handle, port as c_int, 0) };
        if tx.is_null() {
            // SAFETY: both acquired above, each released once.
            unsafe {
                ffi::exanic_release_rx_buffer(rx);
                ffi::exanic_release_handle(handle);
            }
            return Err(ExanicError::Tx(device.into(), port));
        }
        Ok(Exanic {
            handle,
            rx,
            tx,
            rx_bufs: vec![[0u8; FRAME_MAX]; RX_SLOTS].into_boxed_slice(),
            rx_free: (0..RX_SLOTS as u32).rev().collect(),
            tx_bufs: vec![[0u8; FRAME_MAX]; TX_SLOTS].into_boxed_slice(),
            tx_free: (0..TX_SLOTS as u32).rev().collect(),
            counters: Counters::default(),
            lapped: 0,
        })
    }

    /// Times the reader was lapped (each also counted as a drop).
    pub fn lapped(&self) -> u64 {
        self.lapped
    }
}

impl Drop for Exanic {
    fn drop(&mut self) {
        // SAFETY: all three were acquired in `open` and are released exactly once, here.
        unsafe {
            ffi::exanic_release_tx_buffer(self.tx);
            ffi::exanic_release_rx_buffer(self.rx);
            ffi::exanic_release_handle(self.handle);
        }
    }
}

impl FrameBackend for Exanic {
    fn mode(&self) -> Mode {
        Mode::Exanic
    }

    fn rx_burst(&mut self, burst: &mut Vec<RxDesc>, budget: usize) -> usize {
        let mut n = 0;
        // Each failed receive consumed something (a lost or bad frame): bounded by the budget too.
        let mut attempts = 0;
        while n < budget && attempts < budget {
            attempts += 1;
            let Some(&slot) = self.rx_free.last() else {
                break;
            };
            let buf = &mut self.rx_bufs[slot as usize];
            // A null timestamp pointer is allowed (libexanic then skips it).
            // SAFETY: `self.rx` is live; `buf` is writable for FRAME_MAX bytes.
            let got = unsafe {
                ffi::exanic_receive_frame(
                    self.rx,
                    buf.as_mut_ptr().cast::<c_char>(),
                    FRAME_MAX,
                    std::ptr::null_mut(),
                )
            };
            if got == 0 {
                break;
            }
            if got < 0 {
                self.counters.dropped += 1;
                if got == -RX_FRAME_SWOVFL {
                    self.lapped += 1;
                }
                continue;
            }
            let len = (got as usize).min(FRAME_MAX);
            self.rx_free.pop();
            burst.push(RxDesc {
                id: u64::from(slot),
                len: len as u32,
            });
            self.counters.rx += 1;
            n += 1;
        }
        n
    }

    fn rx_frame(&self, rx: RxDesc) -> &[u8] {
        let buf = &self.rx_bufs[rx.id as usize % RX_SLOTS];
        &buf[..(rx.len as usize).min(FRAME_MAX)]
    }

    fn recycle(&mut self, rx: RxDesc) {
        let slot = rx.id as u32;
        if (slot as usize) < RX_SLOTS && !self.rx_free.contains(&slot) {
            self.rx_free.push(slot);
        }
    }

    fn tx_alloc(&mut self) -> Option<TxDesc> {
        let slot = self.tx_free.pop()?;
        Some(TxDesc {
            id: u64::from(slot),
            len: 0,
        })
    }

    fn tx_buf(&mut self, tx: TxDesc) -> &mut [u8] {
        &mut self.tx_bufs[tx.id as usize % TX_SLOTS]
    }

    fn tx_burst(&mut self, burst: &[TxDesc]) {
        for tx in burst {
            let slot = tx.id as usize % TX_SLOTS;
            let len = (tx.len as usize).min(FRAME_MAX);
            let frame = &self.tx_bufs[slot];
            if len == 0 {
                // A frame whose build failed: its buffer only goes back.
                if !self.tx_free.contains(&(slot as u32)) {
                    self.tx_free.push(slot as u32);
                }
                continue;
            }
            // SAFETY: `self.tx` is live; `frame` is readable for `len` <= FRAME_MAX bytes.
            let rc = unsafe {
                ffi::exanic_transmit_frame(self.tx, frame.as_ptr().cast::<c_char>(), len)
            };
            if rc == 0 {
                self.counters.tx += 1;
            } else {
                self.counters.dropped += 1;
            }
            if !self.tx_free.contains(&(slot as u32)) {
                self.tx_free.push(slot as u32);
            }
        }
    }

    fn counters(&self) -> Counters {
        self.counters
    }
}

#[cfg(test)]
mod tests;
