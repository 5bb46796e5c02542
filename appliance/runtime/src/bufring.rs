//! A worker's receive buffer pool as an io_uring provided-buffer ring: the kernel picks a
//! free buffer when data arrives, so idle connections hold no receive memory.
//!
//! The mappings are `sys::Mapping`s; the ring's entries and tail are written here through
//! raw pointers, because only this code knows which slots are ours (between the kernel's
//! head and our tail) and which buffers the kernel has handed back (ADR-0017's amendment).

use std::io;
use std::sync::atomic::{AtomicU16, Ordering};

use io_uring::types::BufRingEntry;
use io_uring::IoUring;

use crate::sys::Mapping;

/// A provided-buffer ring of one worker: group [`BufRing::GROUP`] for TCP receives,
/// [`BufRing::UDP_GROUP`] for the kernel-UDP backend's multishot `recvmsg`.
pub(crate) struct BufRing {
    ring: Mapping,
    buffers: Mapping,
    entries: u16,
    buf_size: usize,
    tail: u16,
}

impl BufRing {
    pub(crate) const GROUP: u16 = 0;
    pub(crate) const UDP_GROUP: u16 = 1;

    /// Maps `entries` (a power of two) buffers of `buf_size` bytes and registers them with `ring`.
    pub(crate) fn register(ring: &IoUring, entries: u16, buf_size: usize) -> io::Result<BufRing> {
        Self::register_group(ring, Self::GROUP, entries, buf_size)
    }

    /// [`BufRing::register`] as buffer group `group`.
    pub(crate) fn register_group(
        ring: &IoUring,
        group: u16,
        entries: u16,
        buf_size: usize,
    ) -> io::Result<BufRing> {
        assert!(entries.is_power_of_two());
        let ring_bytes =
            (entries as usize * std::mem::size_of::<BufRingEntry>()).next_multiple_of(4096);
        let ring_map = Mapping::anonymous(ring_bytes, false)?;
        let buffers = Mapping::anonymous(entries as usize * buf_size, false)?;
        // The owner drops the io_uring (or unregisters) before dropping this BufRing.
        // SAFETY: the ring mapping is page aligned, holds `entries` entries and lives as long as this BufRing.
        unsafe {
            ring.submitter().register_buf_ring_with_flags(
                ring_map.as_ptr() as u64,
                entries,
                group,
                0,
            )?
        };
        let mut pool = BufRing {
            ring: ring_map,
            buffers,
            entries,
            buf_size,
            tail: 0,
        };
        for bid in 0..entries {
            pool.push(bid);
        }
        pool.publish();
        Ok(pool)
    }

    /// The first `len` bytes of buffer `bid`, which the kernel has filled and handed back.
    pub(crate) fn filled(&self, bid: u16, len: usize) -> &[u8] {
        assert!(bid < self.entries && len <= self.buf_size);
        // The kernel handed this buffer to us (CQE with F_BUFFER) and will not write it until we push it back.
        // SAFETY: bid < entries so the range lies inside `buffers`, and the kernel is done with it.
        unsafe {
            std::slice::from_raw_parts(self.buffers.as_ptr().add(bid as usize * self.buf_size), len)
        }
    }

    fn push(&mut self, bid: u16) {
        let index = (self.tail & (self.entries - 1)) as usize;
        // Slots between the kernel's head and our tail are ours to write.
        // SAFETY: index < entries, so the entry lies inside the ring mapping, and the slot is ours.
        let entry = unsafe { &mut *(self.ring.as_ptr() as *mut BufRingEntry).add(index) };
        // SAFETY: bid < entries, so the buffer lies inside `buffers`.
        entry.set_addr(unsafe { self.buffers.as_ptr().add(bid as usize * self.buf_size) } as u64);
        entry.set_len(crate::sys::u32_of(self.buf_size));
        entry.set_bid(bid);
        self.tail = self.tail.wrapping_add(1);
    }

    fn publish(&self) {
        // SAFETY: the ring base is valid; the tail field is a u16 the kernel reads atomically.
        let tail = unsafe {
            &*(BufRingEntry::tail(self.ring.as_ptr() as *const BufRingEntry) as *const AtomicU16)
        };
        tail.store(self.tail, Ordering::Release);
    }

    /// Gives buffer `bid` back to the kernel after its bytes were consumed.
    pub(crate) fn recycle(&mut self, bid: u16) {
        self.push(bid);
        self.publish();
    }
}
