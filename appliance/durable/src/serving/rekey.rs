//! `data rekey` while serving (ADR 0055): the switch to a new data key, and the retirement of
//! the old one once compaction rewrote every segment that held a record under it.
//!
//! The switch is two superblock writes, each flushed: first the new epoch in the free epoch
//! slot (and, on the appliance, the new key sealed by the TPM in the free sealed-key area),
//! then sector 0 with the new key check and the old key sealed under the new one. Until the
//! second flush the device opens with the old key alone; after it, with the new key alone
//! (which unseals the old one); records sealed under an epoch below the switch open with the
//! old key. Only then do the logs seal with the new key. Compactors ([`crate::Compactor`])
//! see the new generation, close their active segment and rewrite every segment opened
//! before it; when every region has none left, sector 0 is written without the old key
//! (format version 2 again) and the old key is dropped (its bytes zeroed).
use std::sync::Mutex;

use super::{lock, Serving};
use crate::crypt::DataKey;
use crate::device::BlockDevice;
use crate::error::DurableError;
use crate::superblock::{
    one_boot_key, sealed_key_check, sealed_key_in, set_sealed_key_in, Rekey, Superblock,
    SEALED_KEY_AREAS, SUPERBLOCK_LEN,
};
use crate::units::usize_from;

/// The rekey bookkeeping of a serving device.
#[derive(Debug)]
pub(crate) struct RekeyState {
    /// The superblock as it is on the device now (the key check changes with a rekey).
    sb: Superblock,
    /// Per region: no segment opened before the switch is left (its compactor said so).
    done: Vec<bool>,
    /// Switches and retirements since start.
    rekeys: u64,
    retired: u64,
}

impl RekeyState {
    pub(crate) fn new(sb: Superblock) -> Mutex<RekeyState> {
        Mutex::new(RekeyState {
            sb,
            done: vec![false; sb.geometry.regions as usize],
            rekeys: 0,
            retired: 0,
        })
    }
}

/// Where a rekey stands ([`Serving::rekey_status`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RekeyStatus {
    /// The data device is encrypted.
    pub sealed: bool,
    /// The first epoch of the present key while the old one is kept; `None`: one key only.
    pub old_key_until_epoch: Option<u32>,
    /// Regions whose segments from before the switch are all rewritten.
    pub regions_done: usize,
    /// Regions.
    pub regions: usize,
    /// Rekeys and retirements of an old key since the server started.
    pub rekeys: u64,
    pub retired: u64,
}

fn io(e: std::io::Error) -> DurableError {
    DurableError::io(0, &e)
}

impl<D: BlockDevice> Serving<D> {
    /// Switches to `new`: from the moment this returns every record sealed is sealed under
    /// it; the old key is kept (in the superblock, sealed under `new`) until compaction has
    /// rewritten every record under it. `tpm_sealed`: the new key sealed by the appliance's
    /// TPM, written to the sealed-key area the present key is not in. Returns the first epoch
    /// of the new key. Refused while a previous rekey still keeps its old key.
    pub fn rekey(&self, new: DataKey, tpm_sealed: Option<&[u8]>) -> Result<u32, DurableError> {
        let refuse = |why: &str| Err(DurableError::Rekey(why.into()));
        let Some(crypt) = self.crypt.as_deref() else {
            return refuse(
                "the data device is not encrypted (it was formatted without a data key)",
            );
        };
        let mut st = lock(&self.rekey);
        if crypt.has_old_key() {
            return refuse("the previous rekey is still rewriting records under its old key; `data` shows when it is retired");
        }
        let old = crypt.current_key();
        if old == new {
            return refuse("the new key is the key in use");
        }
        let uuid = st.sb.uuid;
        let mut block = vec![0u8; usize_from(SUPERBLOCK_LEN)];
        self.dev.read_at(0, &mut block).map_err(io)?;
        if tpm_sealed.is_some() && one_boot_key(&block).is_some() {
            // Its area is the one the new key's copy goes into (ADR 0053).
            return refuse(
                "a `data reseal` waits for the next boot: reboot, or `data reseal cancel`, first",
            );
        }
        let (slot_epoch, slot) = st.sb.epoch(&block);
        let epoch_now = crypt.epoch().ok_or(DurableError::NonceSpace)?;
        let from = slot_epoch
            .max(epoch_now)
            .checked_add(1)
            .ok_or(DurableError::NonceSpace)?;
        // Step 1: the new key's first epoch (and its TPM-sealed copy) durable; sector 0, the
        // key check, is rewritten with the bytes it has.
        st.sb.set_epoch(&mut block, slot, from);
        if let Some(sealed) = tpm_sealed {
            let area = free_sealed_area(&block, &old, &uuid)?;
            set_sealed_key_in(&mut block, area, sealed, new.check_value(&uuid))?;
        }
        self.dev.settle_errors();
        self.dev.write_at(0, &block).map_err(io)?;
        self.dev.flush().map_err(io)?;
        // Step 2, the switch: one sector holds the new key check and the old key.
        let mut sb = st.sb;
        sb.key_check = Some(new.check_value(&uuid));
        sb.rekey = Some(Rekey {
            from,
            wrapped: new.wrap(&old, &uuid, from)?,
            old_check: old.check_value(&uuid),
        });
        write_sector0(&self.dev, &mut block, &sb)?;
        st.sb = sb;
        st.done.iter_mut().for_each(|d| *d = false);
        st.rekeys += 1;
        crypt.switch(new, from)?;
        Ok(from)
    }

    /// Region `region` holds no segment opened before the switch (its compactor's word).
    /// When every region said so, the old key is retired: sector 0 without it, flushed, then
    /// forgotten. A failed write leaves it kept; the compactors say it again later.
    pub fn rekey_region_done(&self, region: u32) -> Result<bool, DurableError> {
        let Some(crypt) = self.crypt.as_deref() else {
            return Ok(false);
        };
        let mut st = lock(&self.rekey);
        if !crypt.has_old_key() {
            return Ok(false);
        }
        if let Some(d) = st.done.get_mut(region as usize) {
            *d = true;
        }
        if !st.done.iter().all(|d| *d) {
            return Ok(false);
        }
        let mut sb = st.sb;
        sb.rekey = None;
        self.dev.settle_errors();
        let mut block = vec![0u8; usize_from(SUPERBLOCK_LEN)];
        self.dev.read_at(0, &mut block).map_err(io)?;
        let current = crypt.current_key();
        if let Some(area) = old_sealed_area(&block, &current, &sb.uuid) {
            // The old key's TPM-sealed copy goes too (it unseals only on this box, but no
            // record needs it any more).
            block[SEALED_KEY_AREAS[area].clone()].fill(0);
        }
        write_sector0(&self.dev, &mut block, &sb)?;
        st.sb = sb;
        st.retired += 1;
        crypt.retire_old()?;
        Ok(true)
    }

    /// Where a rekey stands (the console's `data`).
    pub fn rekey_status(&self) -> RekeyStatus {
        let st = lock(&self.rekey);
        RekeyStatus {
            sealed: self.crypt.is_some(),
            old_key_until_epoch: st.sb.rekey.map(|r| r.from),
            regions_done: st.done.iter().filter(|d| **d).count(),
            regions: st.done.len(),
            rekeys: st.rekeys,
            retired: st.retired,
        }
    }
}

/// Writes `sb` into sector 0 of the superblock block `block` and `block` to the device, then
/// flushes. The rest of the block is written with the bytes read from it.
fn write_sector0<D: BlockDevice>(
    dev: &D,
    block: &mut [u8],
    sb: &Superblock,
) -> Result<(), DurableError> {
    let enc = sb.encode();
    block[..512].copy_from_slice(&enc[..512]);
    dev.write_at(0, block).map_err(io)?;
    dev.flush().map_err(io)
}

/// The sealed-key area that does not hold the TPM-sealed copy of the key in use. Which one
/// that is cannot be told without the TPM, so each area carries the key check of the key it
/// holds (zero for the key PID 1 sealed before the format: the one key of a device never
/// rekeyed).
fn free_sealed_area(
    block: &[u8],
    current: &DataKey,
    uuid: &[u8; 16],
) -> Result<usize, DurableError> {
    match area_of(block, current, uuid) {
        Some(mine) => Ok(1 - mine),
        None if sealed_key_in(block, 0).is_none() && sealed_key_in(block, 1).is_none() => Ok(0),
        None => Err(DurableError::Rekey(
            "the key in use has no TPM-sealed copy here: the new key's copy would replace the only other one".into(),
        )),
    }
}

/// The area holding `key`'s sealed copy.
pub(super) fn area_of(block: &[u8], key: &DataKey, uuid: &[u8; 16]) -> Option<usize> {
    let check = key.check_value(uuid);
    (0..SEALED_KEY_AREAS.len())
        .find(|&a| sealed_key_check(block, a) == Some(check))
        .or_else(|| {
            (0..SEALED_KEY_AREAS.len()).find(|&a| sealed_key_check(block, a) == Some([0; 32]))
        })
}

/// At retirement: the area holding another key's sealed copy than `current`'s.
fn old_sealed_area(block: &[u8], current: &DataKey, uuid: &[u8; 16]) -> Option<usize> {
    let other = 1 - area_of(block, current, uuid)?;
    sealed_key_in(block, other).map(|_| other)
}
