//! AF_XDP sockets: one socket per receive queue with its own UMEM (frames shared with the
//! kernel) and its four rings (fill, completion, rx, tx), behind a safe interface.
//!
//! Frames move by ownership: [`Xsk::rx_burst`] and [`Xsk::alloc`] hand out [`Frame`]
//! tokens (not `Clone`), [`Xsk::transmit`] and [`Xsk::recycle`] take them back. The kernel
//! touches a frame only while it sits in a ring, and a token exists only while it does not,
//! so [`Xsk::bytes`] may hand out a slice of it. Copy-mode descriptor addresses (chunk +
//! headroom) are masked back to the chunk before refilling. rustix has no AF_XDP setup
//! wrappers for the ring mmaps, so these are raw `libc` calls.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};

use crate::mmap::Mapping;
use crate::num::{u32_of, usize_of};

/// `AF_XDP` (44) in a `sockaddr_xdp`'s family field.
#[expect(clippy::cast_possible_truncation, reason = "AF_XDP is 44")]
const AF_XDP: u16 = libc::AF_XDP as u16;

/// Most descriptors the kernel sends per copy-mode `sendto` kick (TX_BATCH_SIZE).
const KICK_BATCH: u32 = 32;

/// Why an AF_XDP socket could not be set up.
#[derive(Debug, thiserror::Error)]
#[error("AF_XDP {what}: {err}")]
pub struct XskError {
    pub what: &'static str,
    pub err: io::Error,
}

fn err(what: &'static str) -> impl FnOnce(io::Error) -> XskError {
    move |err| XskError { what, err }
}

/// Sizes of one socket's UMEM and rings (ring sizes are powers of two).
#[derive(Debug, Clone, Copy)]
pub struct XskConfig {
    /// Frames in the UMEM.
    pub frames: u32,
    /// Bytes per frame (a power of two, 2048 or 4096).
    pub frame_size: u32,
    /// Entries of each ring.
    pub ring_size: u32,
    /// Frames kept in the fill ring for receiving; the rest are for transmitting.
    pub fill_frames: u32,
}

impl Default for XskConfig {
    fn default() -> Self {
        XskConfig {
            frames: 4096,
            frame_size: 4096,
            ring_size: 2048,
            fill_frames: 2048,
        }
    }
}

/// How the socket moves frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XskMode {
    /// The driver DMAs straight into the UMEM.
    ZeroCopy,
    /// The kernel copies each frame between its buffers and the UMEM.
    Copy,
}

impl XskMode {
    pub fn name(self) -> &'static str {
        match self {
            XskMode::ZeroCopy => "zerocopy",
            XskMode::Copy => "copy",
        }
    }
}

/// A UMEM frame owned by the caller: received data, or a buffer to transmit from.
#[derive(Debug, PartialEq, Eq)]
pub struct Frame {
    /// Offset of the data in the UMEM.
    addr: u64,
    /// Bytes of data (received length; the whole frame for an allocated one).
    len: u32,
    /// The UMEM this frame belongs to (its base address), checked on every use.
    umem: usize,
    /// Taken from the rx ring (counts against the fill share until given back).
    received: bool,
}

impl Frame {
    pub fn len(&self) -> usize {
        self.len as usize
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// One mapped ring: producer and consumer indices shared with the kernel, and its entries.
struct Ring {
    map: Mapping,
    producer: *const AtomicU32,
    consumer: *const AtomicU32,
    flags: *const AtomicU32,
    descs: *mut u8,
    size: u32,
}

impl Ring {
    fn map<T>(
        fd: BorrowedFd<'_>,
        off: &libc::xdp_ring_offset,
        size: u32,
        pgoff: u64,
    ) -> io::Result<Ring> {
        let len = usize_of(off.desc) + size as usize * std::mem::size_of::<T>();
        let map = Mapping::shared(fd, pgoff, len)?;
        // SAFETY: the kernel's offsets (XDP_MMAP_OFFSETS) lie inside the `len` bytes mapped.
        let at = |o: u64| unsafe { map.as_ptr().add(usize_of(o)) };
        Ok(Ring {
            producer: at(off.producer).cast(),
            consumer: at(off.consumer).cast(),
            flags: at(off.flags).cast(),
            descs: at(off.desc),
            size,
            map,
        })
    }

    fn index(&self, which: *const AtomicU32) -> &AtomicU32 {
        // The kernel only ever accesses these indices atomically too.
        // SAFETY: the pointer is 4-aligned inside the live mapping `self.map` (kernel offsets).
        unsafe { &*which }
    }

    fn needs_wakeup(&self) -> bool {
        self.index(self.flags).load(Ordering::Relaxed) & libc::XDP_RING_NEED_WAKEUP != 0
    }

    /// Entry `i` (taken modulo the size) as a pointer to `T`.
    fn slot<T>(&self, i: u32) -> *mut T {
        let at = (i & (self.size - 1)) as usize * std::mem::size_of::<T>();
        debug_assert!(at + std::mem::size_of::<T>() <= self.map.len());
        // SAFETY: `at` is within the `size` entries mapped after `descs`.
        unsafe { self.descs.add(at).cast() }
    }

    /// Producer side: free entries.
    fn free(&self) -> u32 {
        let prod = self.index(self.producer).load(Ordering::Relaxed);
        let cons = self.index(self.consumer).load(Ordering::Acquire);
        self.size - prod.wrapping_sub(cons)
    }

    /// Producer side: writes `items` (at most [`Ring::free`]) and publishes them.
    fn produce<T: Copy>(&self, items: &[T]) {
        let prod = self.index(self.producer).load(Ordering::Relaxed);
        for (i, item) in items.iter().enumerate() {
            // SAFETY: entries from producer to consumer + size are ours until published below.
            unsafe { self.slot::<T>(prod.wrapping_add(u32_of(i))).write(*item) };
        }
        self.index(self.producer)
            .store(prod.wrapping_add(u32_of(items.len())), Ordering::Release);
    }

    /// Consumer side: reads up to `max` entries into `out` and releases them.
    fn consume<T: Copy>(&self, max: u32, out: &mut impl FnMut(T)) -> u32 {
        let cons = self.index(self.consumer).load(Ordering::Relaxed);
        let prod = self.index(self.producer).load(Ordering::Acquire);
        let n = prod.wrapping_sub(cons).min(max);
        for i in 0..n {
            // SAFETY: entries from consumer to producer are published (Acquire) and stay put.
            out(unsafe { self.slot::<T>(cons.wrapping_add(i)).read() });
        }
        self.index(self.consumer)
            .store(cons.wrapping_add(n), Ordering::Release);
        n
    }

    /// Producer side: entries published but not yet taken by the kernel.
    fn unconsumed(&self) -> u32 {
        let prod = self.index(self.producer).load(Ordering::Relaxed);
        let cons = self.index(self.consumer).load(Ordering::Acquire);
        prod.wrapping_sub(cons)
    }
}

/// An AF_XDP socket bound to one receive queue, with its UMEM and rings.
pub struct Xsk {
    // Field order: the rings and UMEM are unmapped before the socket closes.
    fill: Ring,
    comp: Ring,
    rx: Ring,
    tx: Ring,
    umem: Mapping,
    fd: OwnedFd,
    frame_size: u32,
    fill_frames: u32,
    /// Frames neither in a ring nor handed out.
    free: Vec<u64>,
    /// Frames in the fill ring (or received and not yet recycled).
    rx_frames: u32,
    /// Frames in the tx ring or awaiting completion.
    tx_inflight: u32,
    mode: XskMode,
    scratch: Vec<libc::xdp_desc>,
}

// SAFETY: the raw pointers point into mappings the `Xsk` owns; moving it to another thread
// moves them with it (it is used by one thread at a time, `&mut self` everywhere).
unsafe impl Send for Xsk {}

fn setsockopt<T>(fd: BorrowedFd<'_>, opt: libc::c_int, value: &T) -> io::Result<()> {
    // SAFETY: `value` is a live `T` of `size_of::<T>()` bytes, the layout SOL_XDP `opt` reads.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_XDP,
            opt,
            (value as *const T).cast(),
            u32_of(std::mem::size_of::<T>()),
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

impl Xsk {
    /// Opens a socket on queue `queue` of interface `ifindex`: zero-copy when `zerocopy`
    /// (fails where the driver lacks it), else copy mode.
    pub fn open(ifindex: u32, queue: u32, cfg: XskConfig, zerocopy: bool) -> Result<Xsk, XskError> {
        assert!(cfg.frame_size.is_power_of_two() && cfg.ring_size.is_power_of_two());
        assert!(cfg.fill_frames <= cfg.ring_size && cfg.fill_frames < cfg.frames);
        // SAFETY: socket(2) with constant arguments; a non-negative result is a new descriptor.
        let raw = unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            return Err(err("socket")(io::Error::last_os_error()));
        }
        // SAFETY: `raw` is a fresh descriptor nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let umem_len = cfg.frames as usize * cfg.frame_size as usize;
        let umem = Mapping::anonymous(umem_len, true).map_err(err("UMEM mmap"))?;
        let reg = libc::xdp_umem_reg {
            addr: umem.as_ptr() as u64,
            len: umem_len as u64,
            chunk_size: cfg.frame_size,
            headroom: 0,
            flags: 0,
            tx_metadata_len: 0,
        };
        setsockopt(fd.as_fd(), libc::XDP_UMEM_REG, &reg).map_err(err("XDP_UMEM_REG"))?;
        for (opt, what) in [
            (libc::XDP_UMEM_FILL_RING, "fill ring size"),
            (libc::XDP_UMEM_COMPLETION_RING, "completion ring size"),
            (libc::XDP_RX_RING, "rx ring size"),
            (libc::XDP_TX_RING, "tx ring size"),
        ] {
            setsockopt(fd.as_fd(), opt, &cfg.ring_size).map_err(err(what))?;
        }
        // SAFETY: all-zero is a valid xdp_mmap_offsets (plain integers).
        let mut off: libc::xdp_mmap_offsets = unsafe { std::mem::zeroed() };
        let mut optlen = u32_of(std::mem::size_of::<libc::xdp_mmap_offsets>());
        // SAFETY: `off` and `optlen` are live and sized as XDP_MMAP_OFFSETS writes them.
        let rc = unsafe {
            libc::getsockopt(
                fd.as_raw_fd(),
                libc::SOL_XDP,
                libc::XDP_MMAP_OFFSETS,
                (&mut off as *mut libc::xdp_mmap_offsets).cast(),
                &mut optlen,
            )
        };
        if rc < 0 {
            return Err(err("XDP_MMAP_OFFSETS")(io::Error::last_os_error()));
        }
        let size = cfg.ring_size;
        let b = fd.as_fd();
        let fill = Ring::map::<u64>(b, &off.fr, size, libc::XDP_UMEM_PGOFF_FILL_RING)
            .map_err(err("fill ring mmap"))?;
        let comp = Ring::map::<u64>(b, &off.cr, size, libc::XDP_UMEM_PGOFF_COMPLETION_RING)
            .map_err(err("completion ring mmap"))?;
        let rx = Ring::map::<libc::xdp_desc>(b, &off.rx, size, libc::XDP_PGOFF_RX_RING as u64)
            .map_err(err("rx ring mmap"))?;
        let tx = Ring::map::<libc::xdp_desc>(b, &off.tx, size, libc::XDP_PGOFF_TX_RING as u64)
            .map_err(err("tx ring mmap"))?;
        let mut xsk = Xsk {
            fill,
            comp,
            rx,
            tx,
            umem,
            fd,
            frame_size: cfg.frame_size,
            fill_frames: cfg.fill_frames,
            free: (0..cfg.frames)
                .rev()
                .map(|i| u64::from(i) * u64::from(cfg.frame_size))
                .collect(),
            rx_frames: 0,
            tx_inflight: 0,
            mode: if zerocopy {
                XskMode::ZeroCopy
            } else {
                XskMode::Copy
            },
            scratch: Vec::with_capacity(size as usize),
        };
        xsk.refill();
        let flags = libc::XDP_USE_NEED_WAKEUP
            | if zerocopy {
                libc::XDP_ZEROCOPY
            } else {
                libc::XDP_COPY
            };
        let addr = libc::sockaddr_xdp {
            sxdp_family: AF_XDP,
            sxdp_flags: flags,
            sxdp_ifindex: ifindex,
            sxdp_queue_id: queue,
            sxdp_shared_umem_fd: 0,
        };
        // SAFETY: `addr` is a live sockaddr_xdp and the length passed is its size.
        let rc = unsafe {
            libc::bind(
                xsk.fd.as_raw_fd(),
                (&addr as *const libc::sockaddr_xdp).cast(),
                u32_of(std::mem::size_of::<libc::sockaddr_xdp>()),
            )
        };
        if rc < 0 {
            return Err(err("bind")(io::Error::last_os_error()));
        }
        Ok(xsk)
    }

    pub fn mode(&self) -> XskMode {
        self.mode
    }

    /// Frames neither in a ring nor handed out.
    pub fn free_frames(&self) -> usize {
        self.free.len()
    }

    /// Tops the fill ring up to its share of frames (the ring may take fewer: the rest stay
    /// free for the next call).
    fn refill(&mut self) {
        let want = self.fill_frames.saturating_sub(self.rx_frames);
        let n = want.min(self.fill.free()).min(u32_of(self.free.len())) as usize;
        if n == 0 {
            return;
        }
        let at = self.free.len() - n;
        self.fill.produce(&self.free[at..]);
        self.free.truncate(at);
        self.rx_frames += u32_of(n);
    }

    /// Takes up to `max` received frames into `out`; tops the fill ring up first.
    pub fn rx_burst(&mut self, max: u32, out: &mut Vec<Frame>) -> u32 {
        self.refill();
        let umem = self.umem.as_ptr() as usize;
        let limit = self.umem.len() as u64;
        let frame_size = u64::from(self.frame_size);
        self.rx.consume(max, &mut |d: libc::xdp_desc| {
            // The kernel's descriptors stay inside one frame; check anyway.
            let chunk_end = (d.addr & !(frame_size - 1)) + frame_size;
            let len = if d.addr + u64::from(d.len) <= chunk_end.min(limit) {
                d.len
            } else {
                0
            };
            out.push(Frame {
                addr: d.addr,
                len,
                umem,
                received: true,
            });
        })
    }

    /// The bytes of `frame` (its data; for an allocated frame, the whole frame).
    pub fn bytes(&mut self, frame: &Frame) -> &mut [u8] {
        assert_eq!(
            frame.umem,
            self.umem.as_ptr() as usize,
            "a frame of another UMEM"
        );
        let room = self.room(frame);
        let len = (frame.len as usize).min(room);
        // The range lies inside the UMEM (`room`); the kernel leaves a frame whose token is out
        // alone (module comment); `&mut self` keeps this the only slice of it.
        // SAFETY: in bounds, not shared with the kernel now, and exclusively borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.umem.as_ptr().add(usize_of(frame.addr)), len) }
    }

    /// The bytes of `frame`, read-only.
    pub fn data(&self, frame: &Frame) -> &[u8] {
        assert_eq!(
            frame.umem,
            self.umem.as_ptr() as usize,
            "a frame of another UMEM"
        );
        let len = (frame.len as usize).min(self.room(frame));
        // SAFETY: as in `bytes`; the shared borrow of `self` excludes any `&mut` slice.
        unsafe { std::slice::from_raw_parts(self.umem.as_ptr().add(usize_of(frame.addr)), len) }
    }

    /// Bytes from the frame's data start to the end of its chunk.
    fn room(&self, frame: &Frame) -> usize {
        let frame_size = u64::from(self.frame_size);
        let chunk_end = (frame.addr & !(frame_size - 1)) + frame_size;
        usize_of(chunk_end.min(self.umem.len() as u64) - frame.addr)
    }

    /// Sets the length of `frame` to `len` (at most the room left in its chunk), so its
    /// bytes can be written past what was received. Returns false when it does not fit.
    pub fn resize(&self, frame: &mut Frame, len: usize) -> bool {
        if len > self.room(frame) {
            return false;
        }
        frame.len = u32_of(len);
        true
    }

    /// A free frame to transmit from (`None`: all are in use).
    pub fn alloc(&mut self) -> Option<Frame> {
        let addr = self.free.pop()?;
        Some(Frame {
            addr,
            len: self.frame_size,
            umem: self.umem.as_ptr() as usize,
            received: false,
        })
    }

    /// Gives a frame back (a received frame not answered, or an allocated one not sent).
    pub fn recycle(&mut self, frame: Frame) {
        assert_eq!(
            frame.umem,
            self.umem.as_ptr() as usize,
            "a frame of another UMEM"
        );
        if frame.received {
            self.rx_frames = self.rx_frames.saturating_sub(1);
        }
        self.free
            .push(frame.addr & !(u64::from(self.frame_size) - 1));
    }

    /// Free tx ring entries.
    pub fn tx_room(&self) -> u32 {
        self.tx.free()
    }

    /// Queues frames for transmit, each with its current length. Frames the ring has no
    /// room for are recycled and counted in the result (drops).
    pub fn transmit(&mut self, frames: &mut Vec<Frame>) -> u32 {
        let room = self.tx.free() as usize;
        let mut dropped = 0;
        while frames.len() > room {
            let Some(frame) = frames.pop() else {
                break;
            };
            self.recycle(frame);
            dropped += 1;
        }
        self.scratch.clear();
        for frame in frames.drain(..) {
            assert_eq!(
                frame.umem,
                self.umem.as_ptr() as usize,
                "a frame of another UMEM"
            );
            if frame.received {
                self.rx_frames = self.rx_frames.saturating_sub(1);
            }
            self.scratch.push(libc::xdp_desc {
                addr: frame.addr,
                len: frame.len,
                options: 0,
            });
        }
        self.tx_inflight += u32_of(self.scratch.len());
        self.tx.produce(&self.scratch);
        dropped
    }

    /// Reaps the completion ring (sent frames become free) and, when the kernel asks (copy
    /// mode always does), kicks transmission with `sendto`, at most 32 descriptors each.
    /// Returns whether transmit work is still pending.
    pub fn pump_tx(&mut self) -> bool {
        let frame_mask = !(u64::from(self.frame_size) - 1);
        let free = &mut self.free;
        let done = self.comp.consume(u32::MAX, &mut |addr: u64| {
            free.push(addr & frame_mask);
        });
        self.tx_inflight = self.tx_inflight.saturating_sub(done);
        let pending = self.tx.unconsumed();
        if pending > 0 && (self.tx.needs_wakeup() || self.mode == XskMode::Copy) {
            for _ in 0..pending.div_ceil(KICK_BATCH).min(64) {
                // SAFETY: sendto with no buffer and no address: only a transmit kick.
                let rc = unsafe {
                    libc::sendto(
                        self.fd.as_raw_fd(),
                        std::ptr::null(),
                        0,
                        libc::MSG_DONTWAIT,
                        std::ptr::null(),
                        0,
                    )
                };
                if rc < 0 || self.tx.unconsumed() == 0 {
                    break;
                }
            }
        }
        self.tx_inflight > 0
    }

    /// Wakes the driver's receive side if it asked (zero-copy with an empty fill ring).
    pub fn wake_rx(&self) {
        if self.fill.needs_wakeup() && self.mode == XskMode::ZeroCopy {
            // SAFETY: recvfrom with no buffer: only a wakeup; MSG_DONTWAIT never blocks.
            unsafe {
                libc::recvfrom(
                    self.fd.as_raw_fd(),
                    std::ptr::null_mut(),
                    0,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                )
            };
        }
    }

    /// Frames received but not yet taken by [`Xsk::rx_burst`].
    pub fn rx_pending(&self) -> u32 {
        let prod = self.rx.index(self.rx.producer).load(Ordering::Acquire);
        let cons = self.rx.index(self.rx.consumer).load(Ordering::Relaxed);
        prod.wrapping_sub(cons)
    }
}

impl AsFd for Xsk {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// Receive queues of interface `name` (entries `rx-N` in /sys/class/net/NAME/queues).
pub fn rx_queue_count(name: &str) -> io::Result<u32> {
    let dir = std::fs::read_dir(format!("/sys/class/net/{name}/queues"))?;
    Ok(dir
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("rx-"))
        .count()
        .try_into()
        .unwrap_or(u32::MAX))
}

/// The interface index of `name` (0 when there is no such interface).
pub fn ifindex(name: &str) -> io::Result<u32> {
    let c = std::ffi::CString::new(name).map_err(|_| io::ErrorKind::InvalidInput)?;
    // SAFETY: `c` is a NUL-terminated string that outlives the call.
    let idx = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if idx == 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(idx)
    }
}
