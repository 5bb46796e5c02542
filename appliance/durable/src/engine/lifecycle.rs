//! Opening and closing a [`Durable`]: probe the device (format a blank one, refuse foreign or
//! other-version content unless forced), recover the index and region logs from the
//! clean-shutdown checkpoint or by scanning every region, and at shutdown write the checkpoint
//! the next open starts from (ADR 0010).
use crate::units::{count_u32, usize_from};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Ack, Durable, OpenReport, Options};
use crate::checkpoint::{self, RegionState, BODY_OFFSET};
use crate::crypt::{Crypt, DataKey, Sealer};
use crate::device::BlockDevice;
use crate::error::DurableError;
use crate::group_commit::Limits;
use crate::index::Index;
use crate::recovery::{scan_all, Damage};
use crate::region::{RegionLog, SegState};
use crate::superblock::{probe, round_up, Geometry, Probe, Superblock, PROBE_LEN, SUPERBLOCK_LEN};

impl<D: BlockDevice> Durable<D> {
    /// Open `dev`: format it if blank, refuse foreign or other-version content unless `force`,
    /// then recover from the checkpoint (if the last shutdown was clean) or by scanning.
    pub fn open(dev: D, opts: &Options) -> Result<(Self, OpenReport), DurableError> {
        let started = Instant::now();
        let existing = existing_superblock(&dev, opts)?;
        let (sb, formatted) = match existing {
            Some(sb) => (sb, false),
            None => (format(&dev, opts)?, true),
        };
        // Recovery only opens records; nothing is sealed before the epoch below is durable.
        let crypt = opts.data_key.as_ref().map(|k| reader(k, &sb)).transpose()?;
        let mut me = Durable {
            dev,
            sb,
            crypt: crypt.map(Arc::new),
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
        if let Some(key) = &opts.data_key {
            me.start_sealing(key)?;
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

    /// Once recovery succeeded (a refused device is left as it was): raises the epoch, then
    /// gives every log a sealer of this open (ADR 0050).
    fn start_sealing(&mut self, key: &DataKey) -> Result<(), DurableError> {
        let epoch = next_epoch(&self.dev, &self.sb)?;
        let crypt = match self.crypt.take() {
            Some(c) => c,
            None => Arc::new(reader(key, &self.sb)?),
        };
        crypt.start_epoch(epoch)?;
        for log in &mut self.regions {
            log.set_sealer(Some(Sealer::new(crypt.clone())));
        }
        self.crypt = Some(crypt);
        Ok(())
    }

    /// Scans every region. Damage in acknowledged history refuses the device unless
    /// `salvage`, which also applies the verified records found past it.
    fn load_by_scan(
        &mut self,
        limits: Limits,
        salvage: bool,
    ) -> Result<(usize, Vec<Damage>), DurableError> {
        let g = self.sb.geometry;
        let scans = scan_all(&self.dev, &self.sb, self.crypt.as_deref())?;
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
                count_u32(r),
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
        let mut body = vec![0u8; usize_from(body_len)];
        let at = g.checkpoint_offset + BODY_OFFSET;
        if self.dev.read_at(at, &mut body).is_err() || crc32c::crc32c(&body) != body_crc {
            return Ok(false);
        }
        if let Some(c) = &self.crypt {
            let Some(plain) = c.open_blob(checkpoint::CHECKPOINT_MAGIC, &body) else {
                return Ok(false);
            };
            body = plain;
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
                count_u32(r),
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
        if let Some(c) = &self.crypt {
            body = c.seal_blob(checkpoint::CHECKPOINT_MAGIC, &body)?;
        }
        if body.len() as u64 > g.checkpoint_len - BODY_OFFSET {
            return Ok((self.dev, false));
        }
        let header = checkpoint::encode_header(&self.sb.uuid, &body, g.block_size as usize);
        body.resize(
            usize_from(round_up(body.len() as u64, u64::from(g.block_size))),
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
    let uuid = crate::superblock::new_uuid();
    let sb = Superblock {
        uuid,
        device_len: len,
        geometry,
        key_check: opts.data_key.as_ref().map(|k| k.check_value(&uuid)),
        rekey: None,
    };
    // Everything up to the first region: stale signatures (btrfs at 64 KiB) and any old checkpoint.
    let wipe = (geometry.data_offset - SUPERBLOCK_LEN).min(round_up(PROBE_LEN as u64, 4096));
    let io = |e: std::io::Error| DurableError::io(0, &e);
    dev.write_at(SUPERBLOCK_LEN, &vec![0u8; usize_from(wipe)])
        .map_err(io)?;
    let mut block = sb.encode();
    if opts.data_key.is_some() {
        // The TPM-sealed key PID 1 wrote ahead of the format stays (ADR 0053).
        let mut old = vec![0u8; usize_from(SUPERBLOCK_LEN)];
        dev.read_at(0, &mut old).map_err(io)?;
        if let Some(sealed) = crate::superblock::sealed_key(&old) {
            crate::superblock::set_sealed_key(&mut block, sealed)?;
        }
    }
    dev.write_at(0, &block).map_err(io)?;
    dev.flush().map_err(io)?;
    Ok(sb)
}

/// The superblock of a device that holds one and may be opened with `opts` (its key checked);
/// `None` for a blank device, or one `force` formats over. Reads only.
fn existing_superblock<D: BlockDevice>(
    dev: &D,
    opts: &Options,
) -> Result<Option<Superblock>, DurableError> {
    let len = dev.len();
    let mut head = vec![0u8; usize_from((PROBE_LEN as u64).min(len))];
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
    if let Some(sb) = &existing {
        check_key(sb, opts.data_key.as_ref())?;
    }
    Ok(existing)
}

/// Refuses a device whose superblock does not match the key given (ADR 0050): encrypted and
/// no key, a key for a device in clear, or another key. Nothing is written before this.
fn check_key(sb: &Superblock, key: Option<&DataKey>) -> Result<(), DurableError> {
    match (&sb.key_check, key) {
        (None, None) => Ok(()),
        (Some(_), None) => Err(DurableError::KeyMissing),
        (None, Some(_)) => Err(DurableError::KeyUnexpected),
        (Some(check), Some(k)) if k.check_value(&sb.uuid) == *check => Ok(()),
        (Some(_), Some(k)) => match &sb.rekey {
            Some(r) if k.check_value(&sb.uuid) == r.old_check => Err(DurableError::KeyReplaced),
            _ => Err(DurableError::WrongKey),
        },
    }
}

/// The opening state for `key` (already checked): with a rekey not finished, the old key
/// unsealed from the superblock too (ADR 0055). An old key that does not unseal refuses the
/// open before anything is written.
fn reader(key: &DataKey, sb: &Superblock) -> Result<Crypt, DurableError> {
    let crypt = Crypt::reader(key, sb.uuid)?;
    match &sb.rekey {
        None => Ok(crypt),
        Some(r) => {
            let old = key.unwrap_old(&r.wrapped, &sb.uuid, r.from).ok_or(
                DurableError::CorruptSuperblock(
                    "the old data key kept for a rekey does not verify",
                ),
            )?;
            crypt.with_old(old, r.from)
        }
    }
}

/// Raises the open epoch in the superblock block and flushes it before anything is sealed,
/// so this open's nonces (`epoch | counter`) differ from every earlier open's (ADR 0050).
pub(crate) fn next_epoch<D: BlockDevice>(dev: &D, sb: &Superblock) -> Result<u32, DurableError> {
    let io = |e: std::io::Error| DurableError::io(0, &e);
    let mut block = vec![0u8; usize_from(SUPERBLOCK_LEN)];
    dev.read_at(0, &mut block).map_err(io)?;
    let (epoch, slot) = sb.epoch(&block);
    // A rekey makes its first epoch durable in the slots before the switch, so `from` is never
    // above the slots; taking the larger keeps the new key's epochs unique even if it were.
    let last = epoch.max(sb.rekey.map_or(0, |r| r.from));
    let epoch = last.checked_add(1).ok_or(DurableError::NonceSpace)?;
    sb.set_epoch(&mut block, slot, epoch);
    dev.write_at(0, &block).map_err(io)?;
    dev.flush().map_err(io)?;
    Ok(epoch)
}
