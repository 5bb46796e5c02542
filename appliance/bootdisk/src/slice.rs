//! A byte range of a disk (one partition) as its own `Read + Write + Seek` stream, so the FAT
//! code sees a volume that starts at 0 and can never touch bytes outside the partition.

use std::io::{self, Read, Seek, SeekFrom, Write};

/// `len` bytes of `inner` starting at `start`.
#[derive(Debug)]
pub struct Slice<F> {
    inner: F,
    start: u64,
    len: u64,
    pos: u64,
}

impl<F: Seek> Slice<F> {
    pub fn new(inner: F, start: u64, len: u64) -> Slice<F> {
        Slice {
            inner,
            start,
            len,
            pos: 0,
        }
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn into_inner(self) -> F {
        self.inner
    }

    /// How many of `want` bytes fit before the end, positioning `inner` at the current offset.
    fn prepare(&mut self, want: usize) -> io::Result<usize> {
        let left = self.len.saturating_sub(self.pos);
        let n = usize::try_from(left).unwrap_or(usize::MAX).min(want);
        if n > 0 {
            self.inner.seek(SeekFrom::Start(self.start + self.pos))?;
        }
        Ok(n)
    }
}

impl<F: Read + Seek> Read for Slice<F> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.prepare(buf.len())?;
        if n == 0 {
            return Ok(0);
        }
        let got = self.inner.read(&mut buf[..n])?;
        self.pos += got as u64;
        Ok(got)
    }
}

impl<F: Write + Seek> Write for Slice<F> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.prepare(buf.len())?;
        if n == 0 && !buf.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "write past the end of the partition",
            ));
        }
        let put = self.inner.write(&buf[..n])?;
        self.pos += put as u64;
        Ok(put)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

impl<F: Seek> Seek for Slice<F> {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let target = match to {
            SeekFrom::Start(n) => Some(n),
            SeekFrom::End(d) => self.len.checked_add_signed(d),
            SeekFrom::Current(d) => self.pos.checked_add_signed(d),
        };
        match target {
            Some(n) if n <= self.len => {
                self.pos = n;
                Ok(n)
            }
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "seek outside the partition",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    #[test]
    fn reads_and_writes_stay_inside_the_range() {
        let mut s = Slice::new(Cursor::new(vec![0u8; 16]), 4, 8);
        assert_eq!(s.write(b"0123456789").unwrap(), 8);
        assert_eq!(s.write(b"x").unwrap_err().kind(), io::ErrorKind::WriteZero);
        assert!(s.seek(SeekFrom::Start(9)).is_err());
        assert!(s.seek(SeekFrom::Current(-9)).is_err());
        s.seek(SeekFrom::End(-2)).unwrap();
        let mut buf = [0u8; 8];
        assert_eq!(s.read(&mut buf).unwrap(), 2);
        assert_eq!(&buf[..2], b"67");
        assert_eq!(s.read(&mut buf).unwrap(), 0);
        let disk = s.into_inner().into_inner();
        assert_eq!(&disk[..4], &[0; 4]);
        assert_eq!(&disk[4..12], b"01234567");
        assert_eq!(&disk[12..], &[0; 4]);
    }
}
