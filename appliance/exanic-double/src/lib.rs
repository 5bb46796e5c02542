//! A test double of the libexanic functions ringstore's ExaNIC backend calls (Cisco
//! exanic-software's `exanic/exanic.h`, `fifo_rx.h`, `fifo_tx.h`; same C names and
//! signatures, exported with `#[no_mangle]`), so the backend builds and runs in CI without a
//! card or the library. Never linked into the product: only the runtime's tests depend on it.
//!
//! What it simulates: named devices (created by [`create`]) with one port; an RX ring that
//! holds [`RING_FRAMES`] frames and is overwritten by the "wire" ([`inject`]) whether or not
//! a reader keeps up, as the card's DMA ring is. A reader more than a ring behind has been
//! lapped: its next `exanic_receive_frame` returns `-EXANIC_RX_FRAME_SWOVFL` and it resumes at
//! the newest frame, as libexanic's catch-up does. A frame longer than the reader's buffer
//! returns `-EXANIC_RX_FRAME_TRUNCATED` and is skipped. Transmitted frames are collected
//! ([`take_sent`]). What it does not simulate: chunks and generation bits of the real
//! 2 MiB ring (128-byte chunks), timestamps (always 0), flow steering, several ports or
//! buffers, TX feedback slots and their back pressure.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, CStr};
use std::sync::Mutex;

/// Frames the simulated RX ring holds before the wire overwrites the oldest.
pub const RING_FRAMES: u64 = 16;
/// `enum rx_frame_status_sw_err` of `fifo_rx.h`.
pub const EXANIC_RX_FRAME_SWOVFL: isize = 256;
pub const EXANIC_RX_FRAME_TRUNCATED: isize = 257;

#[derive(Default)]
struct Device {
    /// The ring: frame `n` lives at `n % RING_FRAMES` until overwritten.
    ring: Vec<Vec<u8>>,
    /// Frames ever written by the wire.
    written: u64,
    sent: Vec<Vec<u8>>,
    open_handles: usize,
    open_buffers: usize,
}

static DEVICES: Mutex<Option<HashMap<String, Device>>> = Mutex::new(None);

fn with_device<T>(name: &str, f: impl FnOnce(&mut Device) -> T) -> Option<T> {
    let mut devices = DEVICES.lock().unwrap_or_else(|e| e.into_inner());
    devices
        .get_or_insert_with(HashMap::new)
        .get_mut(name)
        .map(f)
}

/// Makes device `name` exist (fresh, empty).
pub fn create(name: &str) {
    let mut devices = DEVICES.lock().unwrap_or_else(|e| e.into_inner());
    devices
        .get_or_insert_with(HashMap::new)
        .insert(name.to_string(), Device::default());
}

/// A frame arrives on device `name`'s port 0.
pub fn inject(name: &str, frame: &[u8]) {
    with_device(name, |d| {
        let slot = (d.written % RING_FRAMES) as usize;
        if d.ring.len() <= slot {
            d.ring.resize(slot + 1, Vec::new());
        }
        d.ring[slot] = frame.to_vec();
        d.written += 1;
    });
}

/// The frames transmitted on device `name` since the last call.
pub fn take_sent(name: &str) -> Vec<Vec<u8>> {
    with_device(name, |d| std::mem::take(&mut d.sent)).unwrap_or_default()
}

/// Handles plus RX/TX buffers still acquired on device `name` (0 once all are released).
pub fn open_count(name: &str) -> usize {
    with_device(name, |d| d.open_handles + d.open_buffers).unwrap_or(0)
}

/// `exanic_t`: the device it names.
#[allow(non_camel_case_types, reason = "libexanic's C type name")]
pub struct exanic_t {
    device: String,
}

/// `exanic_rx_t`: the next frame this reader takes.
#[allow(non_camel_case_types, reason = "libexanic's C type name")]
pub struct exanic_rx_t {
    device: String,
    next: u64,
}

/// `exanic_tx_t`.
#[allow(non_camel_case_types, reason = "libexanic's C type name")]
pub struct exanic_tx_t {
    device: String,
}

/// # Safety
/// `name` is a NUL-terminated string (as in C).
#[no_mangle]
pub unsafe extern "C" fn exanic_acquire_handle(name: *const c_char) -> *mut exanic_t {
    if name.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: the caller passes a NUL-terminated string (the C contract).
    let name = unsafe { CStr::from_ptr(name) }
        .to_string_lossy()
        .into_owned();
    match with_device(&name, |d| d.open_handles += 1) {
        Some(()) => Box::into_raw(Box::new(exanic_t { device: name })),
        None => std::ptr::null_mut(),
    }
}

/// # Safety
/// `exanic` came from [`exanic_acquire_handle`] and is released once.
#[no_mangle]
pub unsafe extern "C" fn exanic_release_handle(exanic: *mut exanic_t) {
    if exanic.is_null() {
        return;
    }
    // SAFETY: the pointer came from Box::into_raw in exanic_acquire_handle, released once.
    let handle = unsafe { Box::from_raw(exanic) };
    with_device(&handle.device, |d| d.open_handles -= 1);
}

/// # Safety
/// `exanic` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn exanic_acquire_rx_buffer(
    exanic: *mut exanic_t,
    port_number: c_int,
    buffer_number: c_int,
) -> *mut exanic_rx_t {
    if exanic.is_null() || port_number != 0 || buffer_number != 0 {
        return std::ptr::null_mut();
    }
    // SAFETY: a live handle from exanic_acquire_handle (the C contract).
    let device = unsafe { &*exanic }.device.clone();
    let Some(next) = with_device(&device, |d| {
        d.open_buffers += 1;
        d.written
    }) else {
        return std::ptr::null_mut();
    };
    Box::into_raw(Box::new(exanic_rx_t { device, next }))
}

/// # Safety
/// `rx` came from [`exanic_acquire_rx_buffer`] and is released once.
#[no_mangle]
pub unsafe extern "C" fn exanic_release_rx_buffer(rx: *mut exanic_rx_t) {
    if rx.is_null() {
        return;
    }
    // SAFETY: from Box::into_raw in exanic_acquire_rx_buffer, released once.
    let rx = unsafe { Box::from_raw(rx) };
    with_device(&rx.device, |d| d.open_buffers -= 1);
}

/// # Safety
/// `rx` is live; `rx_buf` is writable for `rx_buf_size` bytes; `timestamp` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn exanic_receive_frame(
    rx: *mut exanic_rx_t,
    rx_buf: *mut c_char,
    rx_buf_size: usize,
    timestamp: *mut u32,
) -> isize {
    if rx.is_null() {
        return -1;
    }
    // SAFETY: a live RX handle (the C contract); only this caller uses it.
    let rx = unsafe { &mut *rx };
    let got = with_device(&rx.device, |d| {
        if rx.next == d.written {
            return Ok(None);
        }
        if d.written - rx.next > RING_FRAMES {
            // Lapped: what it had not read is overwritten; resume at the newest frame.
            rx.next = d.written;
            return Err(EXANIC_RX_FRAME_SWOVFL);
        }
        let frame = d.ring[(rx.next % RING_FRAMES) as usize].clone();
        rx.next += 1;
        if frame.len() > rx_buf_size {
            return Err(EXANIC_RX_FRAME_TRUNCATED);
        }
        Ok(Some(frame))
    });
    match got {
        None | Some(Ok(None)) => 0,
        Some(Err(status)) => -status,
        Some(Ok(Some(frame))) => {
            // SAFETY: rx_buf is writable for rx_buf_size >= frame.len() bytes (checked above).
            unsafe { std::ptr::copy_nonoverlapping(frame.as_ptr(), rx_buf.cast(), frame.len()) };
            if !timestamp.is_null() {
                // SAFETY: a non-null timestamp pointer is writable (the C contract).
                unsafe { *timestamp = 0 };
            }
            frame.len() as isize
        }
    }
}

/// # Safety
/// `exanic` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn exanic_acquire_tx_buffer(
    exanic: *mut exanic_t,
    port_number: c_int,
    requested_size: usize,
) -> *mut exanic_tx_t {
    let _ = requested_size;
    if exanic.is_null() || port_number != 0 {
        return std::ptr::null_mut();
    }
    // SAFETY: a live handle from exanic_acquire_handle (the C contract).
    let device = unsafe { &*exanic }.device.clone();
    match with_device(&device, |d| d.open_buffers += 1) {
        Some(()) => Box::into_raw(Box::new(exanic_tx_t { device })),
        None => std::ptr::null_mut(),
    }
}

/// # Safety
/// `tx` came from [`exanic_acquire_tx_buffer`] and is released once.
#[no_mangle]
pub unsafe extern "C" fn exanic_release_tx_buffer(tx: *mut exanic_tx_t) {
    if tx.is_null() {
        return;
    }
    // SAFETY: from Box::into_raw in exanic_acquire_tx_buffer, released once.
    let tx = unsafe { Box::from_raw(tx) };
    with_device(&tx.device, |d| d.open_buffers -= 1);
}

/// # Safety
/// `tx` is live; `frame` is readable for `frame_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn exanic_transmit_frame(
    tx: *mut exanic_tx_t,
    frame: *const c_char,
    frame_size: usize,
) -> c_int {
    if tx.is_null() || frame.is_null() {
        return -1;
    }
    // SAFETY: a live TX handle; frame readable for frame_size bytes (the C contract).
    let (tx, bytes) = unsafe {
        (
            &*tx,
            std::slice::from_raw_parts(frame.cast::<u8>(), frame_size),
        )
    };
    match with_device(&tx.device, |d| d.sent.push(bytes.to_vec())) {
        Some(()) => 0,
        None => -1,
    }
}

/// `exanic_get_last_error`: a fixed message (the double keeps no error state).
#[no_mangle]
pub extern "C" fn exanic_get_last_error() -> *const c_char {
    c"exanic test double: no such device or port".as_ptr()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lapped_reader_gets_swovfl_then_the_newest_frames() {
        create("double-t");
        let name = c"double-t";
        // SAFETY: a NUL-terminated name; the handles are released below.
        unsafe {
            let h = exanic_acquire_handle(name.as_ptr());
            assert!(!h.is_null());
            let rx = exanic_acquire_rx_buffer(h, 0, 0);
            let mut buf = [0 as c_char; 64];
            assert_eq!(
                exanic_receive_frame(rx, buf.as_mut_ptr(), 64, std::ptr::null_mut()),
                0
            );
            for i in 0..(RING_FRAMES + 3) {
                inject("double-t", &[u8::try_from(i % 256).unwrap(); 10]);
            }
            let got = exanic_receive_frame(rx, buf.as_mut_ptr(), 64, std::ptr::null_mut());
            assert_eq!(got, -EXANIC_RX_FRAME_SWOVFL);
            inject("double-t", &[7; 100]);
            let got = exanic_receive_frame(rx, buf.as_mut_ptr(), 64, std::ptr::null_mut());
            assert_eq!(got, -EXANIC_RX_FRAME_TRUNCATED);
            inject("double-t", &[9; 5]);
            assert_eq!(
                exanic_receive_frame(rx, buf.as_mut_ptr(), 64, std::ptr::null_mut()),
                5
            );
            assert_eq!(buf[0], 9);
            exanic_release_rx_buffer(rx);
            exanic_release_handle(h);
            assert!(exanic_acquire_handle(c"nope".as_ptr()).is_null());
        }
        assert_eq!(open_count("double-t"), 0);
    }
}
