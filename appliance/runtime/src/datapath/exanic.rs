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

use std::ffi::CString;

use crate::sys::{u32_of, usize_of};

use super::{Counters, FrameBackend, Mode, RxDesc, TxDesc};

/// Largest frame received or sent (a standard MTU frame with headroom).
pub const FRAME_MAX: usize = 2048;
/// Receive slots: frames held between `rx_burst` and `recycle`.
pub const RX_SLOTS: usize = 64;
/// Transmit buffers.
pub const TX_SLOTS: usize = 64;
/// `EXANIC_RX_FRAME_SWOVFL` of `exanic/fifo_rx.h`: the reader was lapped.
const RX_FRAME_SWOVFL: isize = 256;

// The FFI, and with it every `unsafe` of this backend.
#[allow(
    unsafe_code,
    reason = "libexanic's C functions; each call's bound is stated at the call"
)]
mod ffi;

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
    port: ffi::Port,
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
        let opened = ffi::Port::open(&name, port).map_err(|failed| match failed {
            ffi::Failed::Handle => ExanicError::Device(device.into()),
            ffi::Failed::Rx => ExanicError::Rx(device.into(), port),
            ffi::Failed::Tx => ExanicError::Tx(device.into(), port),
        })?;
        Ok(Exanic {
            port: opened,
            rx_bufs: vec![[0u8; FRAME_MAX]; RX_SLOTS].into_boxed_slice(),
            rx_free: (0..u32_of(RX_SLOTS)).rev().collect(),
            tx_bufs: vec![[0u8; FRAME_MAX]; TX_SLOTS].into_boxed_slice(),
            tx_free: (0..u32_of(TX_SLOTS)).rev().collect(),
            counters: Counters::default(),
            lapped: 0,
        })
    }

    /// Times the reader was lapped (each also counted as a drop).
    pub fn lapped(&self) -> u64 {
        self.lapped
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
            let got = self.port.receive(buf);
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
                len: u32_of(len),
            });
            self.counters.rx += 1;
            n += 1;
        }
        n
    }

    fn rx_frame(&self, rx: RxDesc) -> &[u8] {
        let buf = &self.rx_bufs[usize_of(rx.id) % RX_SLOTS];
        &buf[..(rx.len as usize).min(FRAME_MAX)]
    }

    fn recycle(&mut self, rx: RxDesc) {
        let Ok(slot) = u32::try_from(rx.id) else {
            return; // not one of ours
        };
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
        &mut self.tx_bufs[usize_of(tx.id) % TX_SLOTS]
    }

    fn tx_burst(&mut self, burst: &[TxDesc]) {
        for tx in burst {
            let slot = usize_of(tx.id) % TX_SLOTS;
            let len = (tx.len as usize).min(FRAME_MAX);
            let frame = &self.tx_bufs[slot];
            if len == 0 {
                // A frame whose build failed: its buffer only goes back.
                if !self.tx_free.contains(&u32_of(slot)) {
                    self.tx_free.push(u32_of(slot));
                }
                continue;
            }
            let rc = self.port.transmit(&frame[..len]);
            if rc == 0 {
                self.counters.tx += 1;
            } else {
                self.counters.dropped += 1;
            }
            if !self.tx_free.contains(&u32_of(slot)) {
                self.tx_free.push(u32_of(slot));
            }
        }
    }

    fn counters(&self) -> Counters {
        self.counters
    }
}

#[cfg(test)]
mod tests;
