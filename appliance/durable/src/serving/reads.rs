//! Reads of [`Serving`]: a key's newest value (overlay first, then the device, honouring
//! expiry and flush_all), and the start-up pass that reads every live value back in log order
//! to warm RAM. Every record read goes through [`crate::readback`].
use super::{lock, Pending, Serving};
use crate::device::BlockDevice;
use crate::engine::Item;
use crate::error::DurableError;
use crate::index::Entry;
use crate::large::parse_chunk_key;
use crate::readback::{read_entry, verify};
use crate::record::RecordView;
use crate::units::usize_from;

impl<D: BlockDevice> Serving<D> {
    fn flushed(&self, seq: u64, now_unix: u64) -> bool {
        lock(&self.flush).is_some_and(|(s, at)| seq < s && now_unix >= at)
    }

    /// The key's newest value (staged or durable), if live at `now_unix`. Reads the device.
    pub fn lookup(&self, key: &[u8], now_unix: u64) -> Result<Option<Item>, DurableError> {
        if key.is_empty() {
            return Ok(None);
        }
        let staged = match self.overlay_shard(key).get(key) {
            Some(Pending::Deleted(_)) => return Ok(None),
            Some(Pending::Value(item)) => Some(item.clone()),
            None => None,
        };
        let item = match staged {
            Some(item) => item,
            None => match self.read_durable(key)? {
                Some(item) => item,
                None => return Ok(None),
            },
        };
        let expired = item.exptime != 0 && item.exptime <= now_unix;
        if expired || self.flushed(item.seq, now_unix) {
            return Ok(None);
        }
        Ok(Some(item))
    }

    /// The key's durable value.
    pub(super) fn read_durable(&self, key: &[u8]) -> Result<Option<Item>, DurableError> {
        self.read_moving(key, |e| self.read_entry(key, e))
    }

    /// Looks `key` up in the index and reads its record with `read`; `None` when the index has
    /// no entry (or `read` found no value). Background compaction may move the record and erase
    /// (and reuse) its segment between the look-up and the read: a record that no longer
    /// verifies is looked up again once if the index moved it meanwhile.
    pub(super) fn read_moving<T>(
        &self,
        key: &[u8],
        read: impl Fn(&Entry) -> Result<Option<T>, DurableError>,
    ) -> Result<Option<T>, DurableError> {
        let Some(e) = self.read_index().get(key).copied() else {
            return Ok(None);
        };
        match read(&e) {
            Err(DurableError::Corrupt { offset }) => {
                let Some(again) = self.read_index().get(key).copied() else {
                    return Ok(None);
                };
                if again == e {
                    return Err(DurableError::Corrupt { offset });
                }
                read(&again)
            }
            other => other,
        }
    }

    pub(super) fn read_entry(&self, key: &[u8], e: &Entry) -> Result<Option<Item>, DurableError> {
        read_entry(&*self.dev, &self.sb.geometry, key, e, self.crypt())
    }

    /// Calls `f` with every value live at `now_unix` (for warming RAM at start), reading the
    /// device one segment at a time in log order. Manifests come with `large: true`; chunks
    /// are never delivered. Returns how many were delivered; a record that does not verify is
    /// skipped and counted in the error total returned second.
    pub fn for_each_value(&self, now_unix: u64, mut f: impl FnMut(&[u8], Item)) -> (usize, usize) {
        let mut entries: Vec<(Box<[u8]>, Entry)> = {
            let index = self.read_index();
            index
                .iter()
                .filter(|(k, e)| {
                    !k.is_empty()
                        && e.meta.kind.has_value()
                        && parse_chunk_key(k).is_none()
                        && (e.meta.exptime == 0 || e.meta.exptime > now_unix)
                })
                .map(|(k, e)| (Box::<[u8]>::from(k), *e))
                .collect()
        };
        entries.retain(|(_, e)| !self.flushed(e.meta.seq, now_unix));
        entries.sort_unstable_by_key(|(_, e)| (e.loc.region, e.loc.segment, e.loc.offset));
        let (mut delivered, mut bad) = (0, 0);
        bad += self.read_each(&entries, |key, rec| match rec {
            Some(r) => {
                delivered += 1;
                f(key, Item::from_record(r));
            }
            None => bad += 1,
        });
        (delivered, bad)
    }

    /// Reads the records of `entries` (sorted by location) one segment span at a time and
    /// calls `f(key, record)`, with `None` for a record that does not verify. Entries whose
    /// read failed are not passed to `f`; returns how many there were.
    pub(super) fn read_each(
        &self,
        entries: &[(Box<[u8]>, Entry)],
        mut f: impl FnMut(&[u8], Option<RecordView<'_>>),
    ) -> usize {
        let g = self.sb.geometry;
        let mut io_failed = 0;
        let mut buf = Vec::new();
        let mut i = 0;
        while i < entries.len() {
            let (region, segment) = (entries[i].1.loc.region, entries[i].1.loc.segment);
            let mut j = i;
            while j < entries.len()
                && entries[j].1.loc.region == region
                && entries[j].1.loc.segment == segment
            {
                j += 1;
            }
            let lo = u64::from(entries[i].1.loc.offset);
            let hi = entries[i..j]
                .iter()
                .map(|(_, e)| u64::from(e.loc.offset) + u64::from(e.loc.len))
                .max()
                .unwrap_or(lo);
            buf.resize(usize_from(hi - lo), 0);
            if self
                .dev
                .read_at(g.segment_offset(region, segment) + lo, &mut buf)
                .is_err()
            {
                io_failed += j - i;
                i = j;
                continue;
            }
            for (key, e) in &entries[i..j] {
                let at = usize_from(u64::from(e.loc.offset) - lo);
                let rec = buf.get(at..).and_then(|b| verify(b, key, e, self.crypt()));
                f(key, rec);
            }
            i = j;
        }
        io_failed
    }
}
