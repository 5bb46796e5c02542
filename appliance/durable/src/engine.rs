//! `Durable`: opens (formats or recovers) a device and drives the region logs synchronously
//! through a [`BlockDevice`]. The io_uring runtime drives [`crate::RegionLog`] the same way,
//! submitting the actions as SQEs instead of calling the device.
use std::time::{Duration, Instant};

use crate::checkpoint::{self, RegionState, BODY_OFFSET};
use crate::device::BlockDevice;
use crate::error::DurableError;
use crate::group_commit::{Action, Completion, Limits};
use crate::index::Index;
use crate::record::{RecordKind, RecordMeta};
use crate::recovery::{scan_all, Damage};
use crate::region::{Purpose, RegionLog, SegState, Staged};
use crate::superblock::{probe, round_up, Geometry, Probe, Superblock, PROBE_LEN, SUPERBLOCK_LEN};

/// How to open (and if blank, format) a device.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Regions (one per worker) when formatting.
    pub regions: u32,
    /// Segment size when formatting.
    pub segment_size: u64,
    /// Write alignment when formatting (512 or 4096).
    pub block_size: u32,
    /// Checkpoint area size when formatting; 0 = 1/8 of the device (at least 64 KiB).
    pub checkpoint_len: u64,
    /// Overwrite a foreign, unknown or other-version device.
    pub force: bool,
    /// Start even when recovery finds damage in acknowledged history (ADR 0016): use every
    /// record that verifies, also past the damage, and report the damage in
    /// [`OpenReport::damaged`]. Keys whose newest record was the damaged one may then answer
    /// an older value or be missing. Off: such a device is refused with
    /// [`DurableError::CorruptHistory`].
    pub salvage: bool,
    /// Group-commit bounds per region.
    pub limits: Limits,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            regions: 1,
            segment_size: 8 << 20,
            block_size: 4096,
            checkpoint_len: 0,
            force: false,
            salvage: false,
            limits: Limits::default(),
        }
    }
}

/// What [`Durable::open`] found and did.
#[derive(Debug, Clone)]
pub struct OpenReport {
    /// The device was blank (or forced) and has been formatted.
    pub formatted: bool,
    /// The index came from a clean-shutdown checkpoint rather than a scan.
    pub from_checkpoint: bool,
    /// Records read by the scan (0 with a checkpoint).
    pub records_scanned: usize,
    /// Keys with a value or manifest after recovery (chunk records not counted).
    pub live_objects: usize,
    /// Places in acknowledged history that did not verify (only with [`Options::salvage`];
    /// otherwise such a device is refused).
    pub damaged: Vec<crate::recovery::Damage>,
    /// Wall time of recovery.
    pub elapsed: Duration,
}

/// The outcome of one client write, released by [`Durable::tick`].
#[derive(Debug)]
pub struct Ack {
    /// The caller's token.
    pub token: u64,
    /// `Ok` once durable; an error if the write or its flush failed.
    pub result: Result<(), DurableError>,
}

/// A value read back from the device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item {
    /// Client flags.
    pub flags: u32,
    /// Absolute expiry (Unix seconds), 0 = never.
    pub exptime: u64,
    /// CAS unique.
    pub cas: u64,
    /// Write sequence.
    pub seq: u64,
    /// The value; for a large object (`large`), an encoded [`crate::large::Manifest`].
    pub value: Vec<u8>,
    /// The record is a manifest: the object's bytes are in chunk records.
    pub large: bool,
}

/// An open data device.
#[derive(Debug)]
pub struct Durable<D: BlockDevice> {
    pub(crate) dev: D,
    pub(crate) sb: Superblock,
    pub(crate) regions: Vec<RegionLog<u64>>,
    pub(crate) index: Index,
    pub(crate) next_seq: u64,
    pub(crate) acks: Vec<Ack>,
    pub(crate) relocate_failures: u64,
}

impl<D: BlockDevice> Durable<D> {
    /// Open `dev`: format it if blank, refuse foreign or other-version content unless `force`,
    /// then recover from the checkpoint (if the last shutdown was clean) or by scanning.
    pub fn open(dev: D, opts: &Options) -> Result<(Self, OpenReport), DurableError> {
        let started = Instant::now();
        let len = dev.len();
        let mut head = vec![0u8; (PROBE_LEN as u64).min(len) as usize];
        dev.read_at(0, &mut head)
            .map_err(|e| DurableError::io(0, &e))?;
        let existing = match probe(&head) {
            Probe::Blank => None,
            Probe::Ringstore => match Superblock::decode(&head, len) {
                Ok(sb) => Some(sb),
                Err(e) if !opts.force => return Err(e),
                Err(_) => None,
            },
            Probe::Foreign(_) | Probe::Unknown if opts.force => None,
            Probe::Foreign(name) => return Err(DurableError::ForeignSignature(name)),
            Probe::Unknown => return Err(DurableError::NotBlank),
        };
        let (sb, formatted) = match existing {
            Some(sb) => (sb, false),
            None => (format(&dev, opts)?, true),
        };
        let mut me = Durable {
            dev,
            sb,
            regions: Vec::new(),
            index: Index::new(sb.geometry.regions, sb.geometry.segments_per_region),
            next_seq: 1,
            acks: Vec::new(),
            relocate_failures: 0,
        };
        let mut report = OpenReport {
            formatted,
            from_checkpoint: false,
            records_scanned: 0,
            live_objects: 0,
            damaged: Vec::new(),
            elapsed: Duration::ZERO,
        };
        if !formatted && me.load_checkpoint(opts.limits)? {
            report.from_checkpoint = true;
        } else {
            let (records, damaged) = me.load_by_scan(opts.limits, opts.salvage)?;
            report.records_scanned = records;
            report.damaged = damaged;
        }
        me.next_seq = me.index.max_seq() + 1;
        report.live_objects = me
            .index
            .iter()
            .filter(|(k, e)| e.meta.kind.has_value() && crate::large::parse_chunk_key(k).is_none())
            .count();
        report.elapsed = started.elapsed();
        Ok((me, report))
    }

    /// Scans every region. Damage in acknowledged history refuses the device unless
    /// `salvage`, which also applies the verified records found past it.
    fn load_by_scan(
        &mut self,
        limits: Limits,
        salvage: bool,
    ) -> Result<(usize, Vec<Damage>), DurableError> {
        let g = self.sb.geometry;
        let scans = scan_all(&self.dev, &self.sb)?;
        let damaged: Vec<Damage> = scans.iter().flat_map(|s| s.damaged.clone()).collect();
        if let (Some(first), false) = (damaged.first(), salvage) {
            return Err(DurableError::CorruptHistory {
                region: first.region,
                segment: first.segment,
                offset: g.segment_offset(first.region, first.segment) + u64::from(first.offset),
                places: damaged.len(),
            });
        }
        self.index
            .reserve(scans.iter().map(|s| s.records.len()).sum());
        let mut records = 0;
        for (r, scan) in scans.into_iter().enumerate() {
            records += scan.records.len() + scan.past_damage.len();
            for rec in scan.records.into_iter().chain(scan.past_damage) {
                self.index
                    .apply(&rec.key, rec.meta, rec.loc, rec.value_len, rec.seed);
            }
            // After a crash the end of every log may be torn: new writes go to fresh segments.
            let mut log = RegionLog::new(
                r as u32,
                g,
                self.sb.uuid,
                limits,
                scan.states,
                scan.next_open_seq,
            );
            if let Some((segment, open_seq, end)) = scan.newest {
                log.note_recovered_tail(segment, open_seq, end);
            }
            self.regions.push(log);
        }
        Ok((records, damaged))
    }

    fn load_checkpoint(&mut self, limits: Limits) -> Result<bool, DurableError> {
        let g = self.sb.geometry;
        let block = g.block_size as usize;
        let mut h = vec![0u8; block];
        self.dev
            .read_at(g.checkpoint_offset, &mut h)
            .map_err(|e| DurableError::io(g.checkpoint_offset, &e))?;
        let Some((body_len, body_crc)) = checkpoint::decode_header(&h, &self.sb.uuid) else {
            return Ok(false);
        };
        if body_len > g.checkpoint_len.saturating_sub(BODY_OFFSET) {
            return Ok(false);
        }
        let mut body = vec![0u8; body_len as usize];
        let at = g.checkpoint_offset + BODY_OFFSET;
        if self.dev.read_at(at, &mut body).is_err() || crc32c::crc32c(&body) != body_crc {
            return Ok(false);
        }
        let Some(ck) = checkpoint::decode_body(&body, g.regions, g.segments_per_region) else {
            return Ok(false);
        };
        drop(body);
        // Erase the header before anything new is written: the snapshot describes this instant only.
        self.dev
            .write_at(g.checkpoint_offset, &vec![0u8; block])
            .map_err(|e| DurableError::io(g.checkpoint_offset, &e))?;
        self.dev
            .flush()
            .map_err(|e| DurableError::io(g.checkpoint_offset, &e))?;
        self.index.raise_floors(ck.max_seq, ck.max_cas);
        self.index.reserve(ck.entries.len());
        for (key, e) in ck.entries {
            self.index.restore(key, e);
        }
        for (r, st) in ck.regions.into_iter().enumerate() {
            let segments = st
                .segments
                .iter()
                .map(|&(s, o)| {
                    (
                        if s == SegState::Active {
                            SegState::Sealed
                        } else {
                            s
                        },
                        o,
                    )
                })
                .collect();
            let mut log = RegionLog::new(
                r as u32,
                g,
                self.sb.uuid,
                limits,
                segments,
                st.next_open_seq,
            );
            if let Some((seg, used, chain)) = st.tail {
                if used.is_multiple_of(u64::from(g.block_size)) && used < g.segment_size {
                    log.resume(seg, used, chain);
                }
            }
            self.regions.push(log);
        }
        Ok(true)
    }

    /// The superblock (uuid and geometry).
    pub fn superblock(&self) -> &Superblock {
        &self.sb
    }

    /// The device.
    pub fn device(&self) -> &D {
        &self.dev
    }

    /// Highest CAS on the device: the store's CAS counter must start above it.
    pub fn max_cas(&self) -> u64 {
        self.index.max_cas()
    }

    /// The index (key → location), for warming the RAM tier after recovery.
    pub fn index(&self) -> &Index {
        &self.index
    }

    /// Queue a write of `key` in region `region`. Its [`Ack`] (with `token`) comes from a later
    /// [`Durable::tick`], only after the flush covering it completed. Returns its sequence.
    #[allow(clippy::too_many_arguments)]
    pub fn set(
        &mut self,
        region: usize,
        key: &[u8],
        value: &[u8],
        flags: u32,
        exptime: u64,
        cas: u64,
        token: u64,
    ) -> Result<u64, DurableError> {
        let meta = RecordMeta {
            kind: RecordKind::Value,
            flags,
            exptime,
            cas,
            seq: self.next_seq,
        };
        self.stage(region, key, value, meta, token)
    }

    /// Queue a delete of `key` (a tombstone record). Acked like [`Durable::set`].
    pub fn delete(&mut self, region: usize, key: &[u8], token: u64) -> Result<u64, DurableError> {
        let meta = RecordMeta::bare(RecordKind::Tombstone, self.next_seq);
        self.stage(region, key, &[], meta, token)
    }

    fn stage(
        &mut self,
        region: usize,
        key: &[u8],
        value: &[u8],
        meta: RecordMeta,
        token: u64,
    ) -> Result<u64, DurableError> {
        let log = self
            .regions
            .get_mut(region)
            .ok_or(DurableError::NoRegion(region))?;
        log.stage(key, value, meta, Purpose::Client(token), false)?;
        self.next_seq += 1;
        Ok(meta.seq)
    }

    /// Submit everything queued (one write + one flush per batch) and return the acks released.
    pub fn tick(&mut self) -> Vec<Ack> {
        for r in 0..self.regions.len() {
            self.drive(r);
        }
        std::mem::take(&mut self.acks)
    }

    pub(crate) fn drive(&mut self, r: usize) {
        while let Some(action) = self.regions[r].poll_action() {
            let (done, err) = match action {
                Action::WriteBatch { id, offset, bytes } => {
                    let res = self.dev.write_at(offset, &bytes);
                    let kind = res.as_ref().err().map(|e| e.kind());
                    (self.regions[r].on_write_complete(id, res.is_ok()), kind)
                }
                Action::Flush { id } => {
                    let res = self.dev.flush();
                    let kind = res.as_ref().err().map(|e| e.kind());
                    (self.regions[r].on_flush_complete(id, res.is_ok()), kind)
                }
            };
            // A completion the state machine rejects cannot happen in this synchronous driver.
            if let Ok(done) = done {
                self.settle(done, err.unwrap_or(std::io::ErrorKind::Other));
            }
        }
    }

    fn settle(&mut self, done: Completion<Staged<u64>>, kind: std::io::ErrorKind) {
        for s in done.acked {
            match s.purpose {
                Purpose::Client(token) => {
                    self.index.apply(&s.key, s.meta, s.loc, s.value_len, s.seed);
                    self.acks.push(Ack {
                        token,
                        result: Ok(()),
                    });
                }
                Purpose::Relocate(from) => {
                    self.index.relocate(&s.key, s.meta, from, s.loc, s.seed);
                }
            }
        }
        let offset = done.error_offset.unwrap_or(0);
        for s in done.failed {
            self.index.note_unapplied(&s.key, s.meta, s.loc);
            match s.purpose {
                Purpose::Client(token) => self.acks.push(Ack {
                    token,
                    result: Err(DurableError::Io { offset, kind }),
                }),
                Purpose::Relocate(_) => self.relocate_failures += 1,
            }
        }
    }

    pub(crate) fn pending_acks_extend(&mut self, acks: Vec<Ack>) {
        self.acks.extend(acks);
    }

    /// Tick until nothing is queued; returns every ack released.
    pub fn sync(&mut self) -> Vec<Ack> {
        let mut out = Vec::new();
        for _ in 0..4 {
            out.extend(self.tick());
            if self.regions.iter().all(|r| r.is_idle()) {
                break;
            }
        }
        out
    }

    /// Read `key` back from the device, verifying its checksum. Tombstones read as `None`.
    /// Expiry is the caller's business (`exptime` is returned).
    pub fn get(&self, key: &[u8]) -> Result<Option<Item>, DurableError> {
        match self.index.get(key) {
            Some(e) => crate::readback::read_entry(&self.dev, &self.sb.geometry, key, e),
            None => Ok(None),
        }
    }

    /// Flush everything and write a checkpoint so the next open skips the scan. Returns the
    /// device and whether a checkpoint was written (false when the snapshot does not fit its area).
    pub fn shutdown(mut self) -> Result<(D, bool), DurableError> {
        let pending: Vec<Ack> = self.sync();
        if let Some(Ack { result: Err(e), .. }) = pending.into_iter().find(|a| a.result.is_err()) {
            return Err(e);
        }
        let g = self.sb.geometry;
        let states: Vec<RegionState> = self
            .regions
            .iter()
            .map(|r| RegionState {
                next_open_seq: r.next_open_seq(),
                tail: r.tail(),
                segments: r.segments().map(|(_, s, o)| (s, o)).collect(),
            })
            .collect();
        let mut body = checkpoint::encode_body(
            &states,
            self.next_seq - 1,
            self.index.max_cas(),
            self.index.iter().collect::<Vec<_>>().into_iter(),
        );
        if body.len() as u64 > g.checkpoint_len - BODY_OFFSET {
            return Ok((self.dev, false));
        }
        let header = checkpoint::encode_header(&self.sb.uuid, &body, g.block_size as usize);
        body.resize(
            round_up(body.len() as u64, u64::from(g.block_size)) as usize,
            0,
        );
        let at = g.checkpoint_offset + BODY_OFFSET;
        let io = |e: std::io::Error| DurableError::io(at, &e);
        self.dev.write_at(at, &body).map_err(io)?;
        self.dev.flush().map_err(io)?;
        self.dev
            .write_at(g.checkpoint_offset, &header)
            .map_err(io)?;
        self.dev.flush().map_err(io)?;
        Ok((self.dev, true))
    }
}

/// Write a fresh superblock (new uuid) and wipe the signature area and checkpoint header.
fn format<D: BlockDevice>(dev: &D, opts: &Options) -> Result<Superblock, DurableError> {
    let len = dev.len();
    let geometry = Geometry::plan(
        len,
        opts.regions,
        opts.segment_size,
        opts.block_size,
        opts.checkpoint_len,
    )?;
    let sb = Superblock {
        uuid: crate::superblock::new_uuid(),
        device_len: len,
        geometry,
    };
    // Everything up to the first region: stale signatures (btrfs at 64 KiB) and any old checkpoint.
    let wipe = (geometry.data_offset - SUPERBLOCK_LEN).min(round_up(PROBE_LEN as u64, 4096));
    let io = |e: std::io::Error| DurableError::io(0, &e);
    dev.write_at(SUPERBLOCK_LEN, &vec![0u8; wipe as usize])
        .map_err(io)?;
    dev.write_at(0, &sb.encode()).map_err(io)?;
    dev.flush().map_err(io)?;
    Ok(sb)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::{SimDevice, SimRng};

    fn opts() -> Options {
        Options {
            regions: 2,
            segment_size: 16 * 1024,
            block_size: 512,
            ..Options::default()
        }
    }

    fn open(dev: SimDevice) -> (Durable<SimDevice>, OpenReport) {
        Durable::open(dev, &opts()).unwrap()
    }

    fn reboot(d: Durable<SimDevice>) -> (Durable<SimDevice>, OpenReport) {
        let img = d.device().crash_image(&mut SimRng::new(7));
        open(SimDevice::from_image(img))
    }

    #[test]
    fn blank_device_is_formatted_and_acked_writes_survive_a_crash() {
        let (mut d, rep) = open(SimDevice::new(1 << 20));
        assert!(rep.formatted);
        d.set(0, b"a", b"one", 5, 0, 100, 1).unwrap();
        d.set(1, b"b", b"two", 0, 0, 101, 2).unwrap();
        assert!(
            d.get(b"a").unwrap().is_none(),
            "not durable before the flush"
        );
        let acks = d.tick();
        assert_eq!(acks.iter().map(|a| a.token).collect::<Vec<_>>(), vec![1, 2]);
        d.delete(1, b"b", 3).unwrap();
        d.tick();
        d.set(0, b"c", b"unacked", 0, 0, 102, 4).unwrap(); // never ticked
        let (d, rep) = reboot(d);
        assert!(!rep.formatted && !rep.from_checkpoint);
        let a = d.get(b"a").unwrap().unwrap();
        assert_eq!((a.value.as_slice(), a.flags, a.cas), (&b"one"[..], 5, 100));
        assert_eq!(d.get(b"b").unwrap(), None);
        assert_eq!(d.get(b"c").unwrap(), None);
        assert_eq!(d.max_cas(), 101);
    }

    #[test]
    fn checkpoint_restores_state_and_is_consumed() {
        let (mut d, _) = open(SimDevice::new(1 << 20));
        for i in 0..200u64 {
            d.set(
                (i % 2) as usize,
                format!("k{i}").as_bytes(),
                &i.to_le_bytes(),
                0,
                0,
                i + 1,
                i,
            )
            .unwrap();
        }
        d.sync();
        d.delete(0, b"k3", 999).unwrap();
        d.sync();
        let (mut d2, _) = reboot(d);
        d2.set(0, b"late", b"x", 0, 0, 500, 1).unwrap();
        let (dev, written) = d2.shutdown().unwrap();
        assert!(written);
        let (mut d3, rep) = open(SimDevice::from_image(dev.crash_image(&mut SimRng::new(3))));
        assert!(rep.from_checkpoint, "{rep:?}");
        assert_eq!(d3.get(b"k7").unwrap().unwrap().value, 7u64.to_le_bytes());
        assert_eq!(d3.get(b"k3").unwrap(), None);
        assert_eq!(d3.get(b"late").unwrap().unwrap().cas, 500);
        assert_eq!(d3.max_cas(), 500);
        // Writing after a checkpoint start, then crashing: the checkpoint must not be reused.
        d3.set(0, b"k7", b"new", 0, 0, 501, 2).unwrap();
        d3.sync();
        let (d4, rep) = reboot(d3);
        assert!(!rep.from_checkpoint);
        assert_eq!(d4.get(b"k7").unwrap().unwrap().value, b"new");
        assert_eq!(d4.get(b"late").unwrap().unwrap().cas, 500);
    }

    /// Device offset of the first value byte of `key`'s newest record.
    fn value_offset(d: &Durable<SimDevice>, key: &[u8]) -> usize {
        let e = d.index().get(key).unwrap();
        let g = d.superblock().geometry;
        (g.segment_offset(e.loc.region, e.loc.segment)
            + u64::from(e.loc.offset)
            + crate::record::HEADER_LEN as u64
            + key.len() as u64) as usize
    }

    /// `set k A; set d D; set f F; set k B; delete d`, each acknowledged, then a crash.
    fn history() -> (Durable<SimDevice>, usize) {
        let (mut d, _) = open(SimDevice::new(1 << 20));
        for (i, (key, value)) in [("k", "A"), ("d", "D"), ("f", "F")].iter().enumerate() {
            d.set(
                0,
                key.as_bytes(),
                value.as_bytes(),
                0,
                0,
                i as u64 + 1,
                i as u64,
            )
            .unwrap();
            assert_eq!(d.tick().len(), 1);
        }
        let f = value_offset(&d, b"f");
        d.set(0, b"k", b"B", 0, 0, 4, 4).unwrap();
        assert_eq!(d.tick().len(), 1);
        d.delete(0, b"d", 5).unwrap();
        assert_eq!(d.tick().len(), 1);
        (d, f)
    }

    #[test]
    fn a_flipped_byte_in_acknowledged_history_is_reported_not_rolled_back() {
        let (d, f) = history();
        let mut img = d.device().crash_image(&mut SimRng::new(7));
        let (good, _) = open(SimDevice::from_image(img.clone()));
        assert_eq!(good.get(b"k").unwrap().unwrap().value, b"B");
        img[f] ^= 0x20;
        let err = Durable::open(SimDevice::from_image(img.clone()), &opts()).unwrap_err();
        let DurableError::CorruptHistory { region, places, .. } = err else {
            panic!("{err:?}")
        };
        assert_eq!((region, places), (0, 1));
        // Salvage: everything that verifies, also past the damage; f is gone, reported.
        let salvage = Options {
            salvage: true,
            ..opts()
        };
        let (s, rep) = Durable::open(SimDevice::from_image(img), &salvage).unwrap();
        assert_eq!(rep.damaged.len(), 1);
        assert_eq!(s.get(b"k").unwrap().unwrap().value, b"B");
        assert_eq!(s.get(b"d").unwrap(), None);
        assert_eq!(s.get(b"f").unwrap(), None);
    }

    #[test]
    fn every_single_byte_flip_of_an_acknowledged_record_is_caught() {
        let (d, f) = history();
        let img = d.device().crash_image(&mut SimRng::new(7));
        // Every byte of f's record (header, key, value), not only its value.
        let start = f - crate::record::HEADER_LEN - 1;
        for at in start..f + 1 {
            let mut bad = img.clone();
            bad[at] ^= 0x01;
            match Durable::open(SimDevice::from_image(bad), &opts()) {
                Err(DurableError::CorruptHistory { .. }) => {}
                other => panic!(
                    "flip at {} not reported: {:?}",
                    at - start,
                    other.map(|o| o.1)
                ),
            }
        }
    }

    #[test]
    fn the_last_record_of_a_segment_is_vouched_for_by_the_next_segment() {
        let (mut d, _) = open(SimDevice::new(1 << 20));
        let value = vec![7u8; 1000];
        let mut n = 0u64;
        let first_segment = loop {
            d.set(0, format!("k{n}").as_bytes(), &value, 0, 0, n + 1, n)
                .unwrap();
            assert_eq!(d.tick().len(), 1);
            let seg = d
                .index()
                .get(format!("k{n}").as_bytes())
                .unwrap()
                .loc
                .segment;
            if n > 0 && seg != d.index().get(b"k0").unwrap().loc.segment {
                break n - 1; // k{n-1} was the last record of the first segment
            }
            n += 1;
        };
        d.set(0, b"after", b"x", 0, 0, 1000, 1000).unwrap();
        assert_eq!(d.tick().len(), 1);
        let last = value_offset(&d, format!("k{first_segment}").as_bytes());
        let mut img = d.device().crash_image(&mut SimRng::new(2));
        img[last + 10] ^= 0x04;
        assert!(matches!(
            Durable::open(SimDevice::from_image(img), &opts()),
            Err(DurableError::CorruptHistory { .. })
        ));
    }

    #[test]
    fn the_last_writes_before_a_crash_are_vouched_for_after_the_restart() {
        let (d, f) = history();
        let (mut d, rep) = reboot(d);
        assert!(rep.damaged.is_empty());
        // Nothing vouches for "delete d" (the last record) yet; the first segment written
        // after the restart names where recovery found the log's end, and once a record of
        // it is acknowledged (the next one's stamp says so) that end is vouched for.
        let tail = value_offset(&d, b"d") - 1; // the tombstone's key byte
        d.set(0, b"new", b"n", 0, 0, 9, 9).unwrap();
        assert_eq!(d.sync().len(), 1);
        d.set(0, b"new2", b"n", 0, 0, 10, 10).unwrap();
        assert_eq!(d.sync().len(), 1);
        let img = d.device().crash_image(&mut SimRng::new(3));
        for at in [f, tail] {
            let mut bad = img.clone();
            bad[at] ^= 0x01;
            assert!(
                matches!(
                    Durable::open(SimDevice::from_image(bad), &opts()),
                    Err(DurableError::CorruptHistory { .. })
                ),
                "flip at {at}"
            );
        }
    }

    #[test]
    fn a_torn_unacknowledged_tail_is_not_corruption() {
        let (mut d, _) = history();
        d.set(0, b"t", b"never acked", 0, 0, 6, 6).unwrap();
        d.set(0, b"u", b"never acked", 0, 0, 7, 7).unwrap();
        // Write the batch but crash before its flush: what reaches the device is unflushed.
        d.device().crash_after(1);
        d.tick();
        // A crash image where the unflushed batch landed whole (each seed picks its fate).
        let (img, t) = (0..64)
            .find_map(|seed| {
                let img = d.device().crash_image(&mut SimRng::new(seed));
                let hits: Vec<usize> = img
                    .windows(11)
                    .enumerate()
                    .filter(|(_, w)| *w == b"never acked")
                    .map(|(i, _)| i)
                    .collect();
                (hits.len() == 2).then(|| (img, hits[0]))
            })
            .expect("some crash image holds the unflushed batch");
        for flip in [t, t + 40] {
            let mut torn = img.clone();
            torn[flip] ^= 0x01;
            let (r, rep) = Durable::open(SimDevice::from_image(torn), &opts()).unwrap();
            assert!(rep.damaged.is_empty());
            assert_eq!(r.get(b"k").unwrap().unwrap().value, b"B");
            assert_eq!(r.get(b"d").unwrap(), None);
        }
    }

    #[test]
    fn foreign_and_other_version_devices_are_refused_unless_forced() {
        let mut img = vec![0u8; 1 << 20];
        img[1080..1082].copy_from_slice(&[0x53, 0xEF]);
        let err = Durable::open(SimDevice::from_image(img.clone()), &opts()).unwrap_err();
        assert!(matches!(err, DurableError::ForeignSignature("ext2/3/4")));
        assert!(err.to_string().contains("ext2/3/4"));
        let forced = Options {
            force: true,
            ..opts()
        };
        let (d, rep) = Durable::open(SimDevice::from_image(img), &forced).unwrap();
        assert!(rep.formatted);
        let mut img = d.device().crash_image(&mut SimRng::new(1));
        img[8] = 2; // format version 2
        assert!(matches!(
            Durable::open(SimDevice::from_image(img.clone()), &opts()),
            Err(DurableError::Version {
                found: 2,
                supported: 1
            })
        ));
        assert!(
            Durable::open(SimDevice::from_image(img), &forced)
                .unwrap()
                .1
                .formatted
        );
        let mut junk = vec![0u8; 1 << 20];
        junk[7] = 1;
        assert!(matches!(
            Durable::open(SimDevice::from_image(junk), &opts()),
            Err(DurableError::NotBlank)
        ));
    }

    #[test]
    fn device_full_is_no_space_and_compaction_frees_it() {
        let (mut d, _) = open(SimDevice::new(256 * 1024));
        let value = vec![1u8; 3000];
        let mut n = 0u64;
        let err = loop {
            match d.set(0, b"same", &value, 0, 0, n, n) {
                Ok(_) => {
                    n += 1;
                    d.tick();
                }
                Err(e) => break e,
            }
        };
        assert!(matches!(err, DurableError::NoSpace));
        let runs = d.maintain(0).unwrap();
        assert!(runs > 0);
        d.set(0, b"same", &value, 0, 0, n, n).unwrap();
        assert!(d.sync().iter().all(|a| a.result.is_ok()));
        assert_eq!(d.get(b"same").unwrap().unwrap().cas, n);
    }

    #[test]
    fn eio_fails_only_the_affected_requests() {
        let (mut d, _) = open(SimDevice::new(1 << 20));
        d.set(0, b"ok", b"1", 0, 0, 1, 1).unwrap();
        assert!(d.tick()[0].result.is_ok());
        let seg0 = d.sb.geometry.segment_offset(0, 0);
        d.device()
            .inject_write_eio(seg0, d.sb.geometry.segment_size);
        d.set(0, b"bad", b"2", 0, 0, 2, 2).unwrap();
        let acks = d.tick();
        assert!(
            matches!(acks[0].result, Err(DurableError::Io { .. })),
            "{acks:?}"
        );
        // The log moves to a fresh segment and keeps working.
        d.set(0, b"after", b"3", 0, 0, 3, 3).unwrap();
        assert!(d.tick()[0].result.is_ok());
        d.device().fail_next_flush();
        d.set(1, b"flushfail", b"4", 0, 0, 4, 4).unwrap();
        assert!(d.tick()[0].result.is_err());
        d.device().clear_faults();
        assert_eq!(d.get(b"after").unwrap().unwrap().value, b"3");
        assert_eq!(d.get(b"bad").unwrap(), None);
        d.device().inject_read_eio(0, 1 << 20);
        assert!(matches!(d.get(b"ok"), Err(DurableError::Io { .. })));
    }
}
