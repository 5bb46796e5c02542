//! `data reseal` while serving (ADR 0053): the key in use, sealed by the appliance's TPM for
//! one boot and no PCR, written into the sealed-key area the key in use is not in, or erased
//! again. One write of the superblock block (sector 0 with its own bytes) and a flush, under
//! the rekey lock, so it never interleaves with a rekey's writes; a torn write leaves an area
//! whose checksum fails: no copy, and the key in use's area untouched.
use super::rekey::area_of;
use super::{lock, Serving};
use crate::device::BlockDevice;
use crate::error::DurableError;
use crate::superblock::{clear_area, one_boot_key, set_one_boot_key, SUPERBLOCK_LEN};
use crate::units::usize_from;

fn io(e: std::io::Error) -> DurableError {
    DurableError::io(0, &e)
}

/// What seals the key in use for one boot: its bytes in, the stored copy out (PID 1's TPM).
pub type OneBootSeal<'a> = dyn FnMut(&[u8; 32]) -> Result<Vec<u8>, String> + 'a;

impl<D: BlockDevice> Serving<D> {
    /// Writes the one-boot copy that `seal` makes of the key in use (its bytes in, the stored
    /// copy out) into the free sealed-key area, replacing a pending one. Refused while a rekey
    /// keeps its old key (both areas hold a key then) and on a device whose key has no
    /// TPM-sealed copy here.
    pub fn reseal(&self, seal: &mut OneBootSeal<'_>) -> Result<(), DurableError> {
        let refuse = |why: &str| Err(DurableError::Rekey(why.into()));
        let Some(crypt) = self.crypt.as_deref() else {
            return refuse("the data device is not encrypted");
        };
        let _st = lock(&self.rekey);
        let uuid = self.superblock().uuid;
        if crypt.has_old_key() {
            return refuse("a rekey is still rewriting records under its old key (both sealed-key areas are in use); `data` shows when it is retired");
        }
        let mut block = vec![0u8; usize_from(SUPERBLOCK_LEN)];
        self.dev.read_at(0, &mut block).map_err(io)?;
        let current = crypt.current_key();
        let Some(mine) = area_of(&block, &current, &uuid) else {
            return refuse("the key in use has no TPM-sealed copy on the device");
        };
        let copy = seal(current.bytes()).map_err(DurableError::Rekey)?;
        set_one_boot_key(&mut block, 1 - mine, &copy, current.check_value(&uuid))?;
        self.dev.settle_errors();
        self.dev.write_at(0, &block).map_err(io)?;
        self.dev.flush().map_err(io)
    }

    /// Erases a pending one-boot copy; whether there was one.
    pub fn reseal_cancel(&self) -> Result<bool, DurableError> {
        let _st = lock(&self.rekey);
        let mut block = vec![0u8; usize_from(SUPERBLOCK_LEN)];
        self.dev.read_at(0, &mut block).map_err(io)?;
        let Some((area, ..)) = one_boot_key(&block) else {
            return Ok(false);
        };
        clear_area(&mut block, area);
        self.dev.settle_errors();
        self.dev.write_at(0, &block).map_err(io)?;
        self.dev.flush().map_err(io)?;
        Ok(true)
    }

    /// Whether a one-boot copy waits for the next boot.
    pub fn reseal_pending(&self) -> Result<bool, DurableError> {
        let _st = lock(&self.rekey);
        let mut block = vec![0u8; usize_from(SUPERBLOCK_LEN)];
        self.dev.read_at(0, &mut block).map_err(io)?;
        Ok(one_boot_key(&block).is_some())
    }
}
