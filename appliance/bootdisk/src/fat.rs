//! FAT volumes through the `fatfs` crate: formatting with a given volume id, fixed file times
//! (reproducible images), and whole-file reads with a size limit and writes that create the
//! parent folders.

use std::io::{self, Read, Seek, Write};

use fatfs::{Date, DateTime, FileSystem, FsOptions, Time};

use crate::layout::FatKind;

/// A clock that always says the same time: the image's `SOURCE_DATE_EPOCH`, or 1980-01-01 (the
/// FAT epoch) for files PID 1 writes.
#[derive(Debug)]
pub struct FixedTime(pub DateTime);

impl fatfs::TimeProvider for FixedTime {
    fn get_current_date(&self) -> Date {
        self.0.date
    }
    fn get_current_date_time(&self) -> DateTime {
        self.0
    }
}

/// 1980-01-01 00:00:00, the earliest time FAT can store.
pub static DOS_EPOCH: FixedTime = FixedTime(DateTime {
    date: Date {
        year: 1980,
        month: 1,
        day: 1,
    },
    time: Time {
        hour: 0,
        min: 0,
        sec: 0,
        millis: 0,
    },
});

impl FixedTime {
    /// The FAT time of a Unix time (UTC), clamped to FAT's range 1980..=2107.
    pub fn from_unix(secs: u64) -> FixedTime {
        let days = secs / 86_400;
        let rem = secs % 86_400;
        let (mut year, mut month, mut day) = ringstore_sys::civil_from_days(days as i64);
        if year < 1980 {
            (year, month, day) = (1980, 1, 1);
        }
        FixedTime(DateTime {
            date: Date {
                year: date_field(year.min(2107)),
                month: date_field(month),
                day: date_field(day),
            },
            time: Time {
                hour: (rem / 3600) as u16,
                min: (rem / 60 % 60) as u16,
                sec: (rem % 60) as u16,
                millis: 0,
            },
        })
    }
}

/// A calendar field of [`FixedTime::from_unix`]: a year clamped to 1980..=2107, a month or a day,
/// so it always fits FAT's `u16`.
fn date_field(value: i64) -> u16 {
    debug_assert!((1..=2107).contains(&value), "date field {value}");
    u16::try_from(value).unwrap_or(1)
}

#[derive(Debug, thiserror::Error)]
pub enum FatError {
    #[error("{path}: {size} bytes, more than the {limit} allowed")]
    TooLarge { path: String, size: u64, limit: u64 },
    #[error("{path}: {source}")]
    Io { path: String, source: io::Error },
}

fn io_err(path: &str) -> impl FnOnce(io::Error) -> FatError + '_ {
    move |source| FatError::Io {
        path: path.to_string(),
        source,
    }
}

/// Formats `disk` (a whole partition) as FAT.
pub fn format<T: Read + Write + Seek>(
    disk: T,
    kind: FatKind,
    label: &str,
    volume_id: u32,
) -> io::Result<()> {
    let mut name = [b' '; 11];
    for (slot, byte) in name.iter_mut().zip(label.bytes()) {
        *slot = byte.to_ascii_uppercase();
    }
    let options = fatfs::FormatVolumeOptions::new()
        .fat_type(match kind {
            FatKind::Fat12 => fatfs::FatType::Fat12,
            FatKind::Fat16 => fatfs::FatType::Fat16,
            FatKind::Fat32 => fatfs::FatType::Fat32,
        })
        .volume_id(volume_id)
        .volume_label(name);
    fatfs::format_volume(disk, options)
}

/// Opens a FAT volume; files it creates or changes get `time`.
pub fn open<T: Read + Write + Seek>(
    disk: T,
    time: &'static FixedTime,
) -> io::Result<FileSystem<T>> {
    FileSystem::new(
        disk,
        FsOptions::new()
            .time_provider(time)
            .update_accessed_date(false),
    )
}

/// The whole of `path` (`/`-separated, from the root), `None` when it does not exist; a file
/// over `limit` bytes is an error, read no further.
pub fn read_file<T: Read + Write + Seek>(
    fs: &FileSystem<T>,
    path: &str,
    limit: u64,
) -> Result<Option<Vec<u8>>, FatError> {
    let mut file = match fs.root_dir().open_file(path) {
        Ok(file) => file,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(err) => return Err(io_err(path)(err)),
    };
    let mut bytes = Vec::new();
    let got = (&mut file)
        .take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(io_err(path))? as u64;
    if got > limit {
        let size = file.seek(io::SeekFrom::End(0)).unwrap_or(got);
        return Err(FatError::TooLarge {
            path: path.to_string(),
            size,
            limit,
        });
    }
    Ok(Some(bytes))
}

/// Writes `bytes` as the whole of `path`, creating its folders.
pub fn write_file<T: Read + Write + Seek>(
    fs: &FileSystem<T>,
    path: &str,
    bytes: &[u8],
) -> Result<(), FatError> {
    let mut dir = fs.root_dir();
    let mut parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    let name = parts.pop().unwrap_or("");
    for part in parts {
        dir = dir.create_dir(part).map_err(io_err(path))?;
    }
    let mut file = dir.create_file(name).map_err(io_err(path))?;
    file.truncate().map_err(io_err(path))?;
    file.write_all(bytes).map_err(io_err(path))?;
    file.flush().map_err(io_err(path))
}

/// Removes `path` if it exists.
pub fn remove_file<T: Read + Write + Seek>(fs: &FileSystem<T>, path: &str) -> Result<(), FatError> {
    match fs.root_dir().remove(path) {
        Err(err) if err.kind() != io::ErrorKind::NotFound => Err(io_err(path)(err)),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    fn volume() -> Cursor<Vec<u8>> {
        let mut disk = Cursor::new(vec![0u8; 4 << 20]);
        format(&mut disk, FatKind::Fat12, "test", 0x1234_5678).unwrap();
        disk
    }

    #[test]
    fn files_round_trip_with_folders_and_limits() {
        let mut disk = volume();
        {
            let fs = open(&mut disk, &DOS_EPOCH).unwrap();
            assert_eq!(fs.volume_id(), 0x1234_5678);
            write_file(&fs, "loader/entries/x.conf", b"hello").unwrap();
            write_file(&fs, "loader/entries/x.conf", b"hi").unwrap();
            assert_eq!(
                read_file(&fs, "loader/entries/x.conf", 2).unwrap().unwrap(),
                b"hi"
            );
            assert!(read_file(&fs, "nope.toml", 10).unwrap().is_none());
            let err = read_file(&fs, "loader/entries/x.conf", 1).unwrap_err();
            assert!(
                matches!(
                    err,
                    FatError::TooLarge {
                        size: 2,
                        limit: 1,
                        ..
                    }
                ),
                "{err}"
            );
            remove_file(&fs, "loader/entries/x.conf").unwrap();
            remove_file(&fs, "loader/entries/x.conf").unwrap();
            assert!(read_file(&fs, "loader/entries/x.conf", 10)
                .unwrap()
                .is_none());
            fs.unmount().unwrap();
        }
    }

    #[test]
    fn unix_times_become_fat_times() {
        let t = FixedTime::from_unix(1_764_547_200 + 3_661).0; // 2025-12-01 01:01:01
        assert_eq!((t.date.year, t.date.month, t.date.day), (2025, 12, 1));
        assert_eq!((t.time.hour, t.time.min, t.time.sec), (1, 1, 1));
        assert_eq!(FixedTime::from_unix(0).0.date.year, 1980);
        assert_eq!(FixedTime::from_unix(951_782_400).0.date.day, 29); // 2000-02-29
    }
}
