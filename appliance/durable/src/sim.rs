//! A simulated device for tests: records writes and flushes, crashes at a chosen point,
//! drops or tears unflushed writes (sector-granular, random order) and injects EIO.
use crate::units::usize_from;
use std::io;
use std::sync::Mutex;

use crate::device::{check_range, BlockDevice};

/// Granularity at which a crash tears an unflushed write.
pub const SECTOR: usize = 512;

/// A small seeded PRNG (SplitMix64) so every simulated run replays from its seed.
#[derive(Debug, Clone)]
pub struct SimRng(u64);

impl SimRng {
    /// A generator whose whole output is fixed by `seed`.
    pub fn new(seed: u64) -> Self {
        SimRng(seed)
    }
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
    /// True with probability `num/den`.
    pub fn chance(&mut self, num: u64, den: u64) -> bool {
        self.below(den) < num
    }
}

#[derive(Debug)]
struct SimState {
    durable: Vec<u8>,
    current: Vec<u8>,
    unflushed: Vec<(u64, Vec<u8>)>,
    write_eio: Vec<(u64, u64)>,
    read_eio: Vec<(u64, u64)>,
    fail_next_flush: bool,
    ops: u64,
    crash_after_ops: Option<u64>,
    crashed: bool,
    writes: u64,
    flushes: u64,
}

/// An in-memory [`BlockDevice`] that can lose power.
///
/// Reads see every completed write. A successful flush makes every earlier write durable.
/// [`SimDevice::crash_image`] returns what a reboot would find: the durable bytes plus, for
/// each unflushed write in random order, nothing, all of it, or a random subset of its sectors.
#[derive(Debug)]
pub struct SimDevice {
    state: Mutex<SimState>,
    len: u64,
}

fn eio() -> io::Error {
    io::Error::from_raw_os_error(5)
}

fn overlaps(ranges: &[(u64, u64)], offset: u64, len: usize) -> bool {
    let end = offset + len as u64;
    ranges.iter().any(|&(s, e)| offset < e && s < end)
}

impl SimDevice {
    /// A zero-filled device of `len` bytes.
    pub fn new(len: usize) -> Self {
        Self::from_image(vec![0; len])
    }

    /// A device whose durable content is `image` (for example a previous crash image).
    pub fn from_image(image: Vec<u8>) -> Self {
        let len = image.len() as u64;
        SimDevice {
            state: Mutex::new(SimState {
                current: image.clone(),
                durable: image,
                unflushed: Vec::new(),
                write_eio: Vec::new(),
                read_eio: Vec::new(),
                fail_next_flush: false,
                ops: 0,
                crash_after_ops: None,
                crashed: false,
                writes: 0,
                flushes: 0,
            }),
            len,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SimState> {
        // A test thread that panicked while holding the lock leaves valid bytes behind.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Writes touching `offset..offset+len` fail with EIO from now on.
    pub fn inject_write_eio(&self, offset: u64, len: u64) {
        self.lock().write_eio.push((offset, offset + len));
    }

    /// Reads touching `offset..offset+len` fail with EIO from now on.
    pub fn inject_read_eio(&self, offset: u64, len: u64) {
        self.lock().read_eio.push((offset, offset + len));
    }

    /// The next flush fails with EIO (and makes nothing durable).
    pub fn fail_next_flush(&self) {
        self.lock().fail_next_flush = true;
    }

    /// Remove every injected fault.
    pub fn clear_faults(&self) {
        let mut s = self.lock();
        s.write_eio.clear();
        s.read_eio.clear();
        s.fail_next_flush = false;
    }

    /// Lose power after `n` more write/flush operations: that operation and every later one fails
    /// with EIO and changes nothing, as if the machine had stopped.
    pub fn crash_after(&self, n: u64) {
        let mut s = self.lock();
        s.crash_after_ops = Some(s.ops + n);
    }

    /// Whether the device has lost power.
    pub fn crashed(&self) -> bool {
        self.lock().crashed
    }

    /// Number of writes and flushes that completed.
    pub fn counts(&self) -> (u64, u64) {
        let s = self.lock();
        (s.writes, s.flushes)
    }

    /// The image a reboot would see, given `rng` to choose the fate of unflushed writes.
    pub fn crash_image(&self, rng: &mut SimRng) -> Vec<u8> {
        let s = self.lock();
        let mut image = s.durable.clone();
        let mut order: Vec<usize> = (0..s.unflushed.len()).collect();
        for i in (1..order.len()).rev() {
            let j = usize_from(rng.below(i as u64 + 1));
            order.swap(i, j);
        }
        for i in order {
            let (offset, data) = &s.unflushed[i];
            let base = usize_from(*offset);
            match rng.below(3) {
                0 => {}
                1 => image[base..base + data.len()].copy_from_slice(data),
                _ => {
                    for (k, chunk) in data.chunks(SECTOR).enumerate() {
                        if rng.chance(1, 2) {
                            let at = base + k * SECTOR;
                            image[at..at + chunk.len()].copy_from_slice(chunk);
                        }
                    }
                }
            }
        }
        image
    }

    /// Count one operation; true when the device has (now) lost power.
    fn tick_crash(s: &mut SimState) -> bool {
        if s.crashed {
            return true;
        }
        s.ops += 1;
        if let Some(limit) = s.crash_after_ops {
            if s.ops > limit {
                s.crashed = true;
            }
        }
        s.crashed
    }
}

impl BlockDevice for SimDevice {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        check_range(offset, buf.len(), self.len)?;
        let s = self.lock();
        if s.crashed || overlaps(&s.read_eio, offset, buf.len()) {
            return Err(eio());
        }
        let at = usize_from(offset);
        buf.copy_from_slice(&s.current[at..at + buf.len()]);
        Ok(())
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        check_range(offset, buf.len(), self.len)?;
        let mut s = self.lock();
        if Self::tick_crash(&mut s) || overlaps(&s.write_eio, offset, buf.len()) {
            return Err(eio());
        }
        let at = usize_from(offset);
        s.current[at..at + buf.len()].copy_from_slice(buf);
        s.unflushed.push((offset, buf.to_vec()));
        s.writes += 1;
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        let mut s = self.lock();
        if Self::tick_crash(&mut s) {
            return Err(eio());
        }
        if s.fail_next_flush {
            s.fail_next_flush = false;
            return Err(eio());
        }
        let pending = std::mem::take(&mut s.unflushed);
        for (offset, data) in pending {
            let at = usize_from(offset);
            s.durable[at..at + data.len()].copy_from_slice(&data);
        }
        s.flushes += 1;
        Ok(())
    }

    fn len(&self) -> u64 {
        self.len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flushed_writes_survive_unflushed_may_not() {
        let dev = SimDevice::new(4096);
        dev.write_at(0, &[1; 512]).unwrap();
        dev.flush().unwrap();
        dev.write_at(512, &[2; 1024]).unwrap();
        let mut seen_dropped = false;
        let mut seen_torn = false;
        for seed in 0..64 {
            let img = dev.crash_image(&mut SimRng::new(seed));
            assert_eq!(&img[..512], &[1; 512][..]);
            let a = img[512] == 2;
            let b = img[1024] == 2;
            seen_dropped |= !a && !b;
            seen_torn |= a != b;
        }
        assert!(seen_dropped && seen_torn);
    }

    #[test]
    fn eio_and_crash_after() {
        let dev = SimDevice::new(4096);
        dev.inject_write_eio(1000, 10);
        assert!(dev.write_at(512, &[0; 512]).is_err());
        assert!(dev.write_at(0, &[0; 512]).is_ok());
        dev.fail_next_flush();
        assert!(dev.flush().is_err());
        assert!(dev.flush().is_ok());
        dev.crash_after(1);
        assert!(dev.write_at(0, &[3; 10]).is_ok());
        assert!(dev.flush().is_err());
        assert!(dev.crashed());
        let img = dev.crash_image(&mut SimRng::new(1));
        assert_eq!(img.len(), 4096);
    }
}
