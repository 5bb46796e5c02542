//! The data key sealed by the TPM (ADR 0053): at the first format PID 1 makes a random key,
//! seals it to PCR 7 and writes the sealed key into the superblock block of the blank device
//! (the one write PID 1 makes to the data device); at every boot it unseals it and hands it to
//! the server through a root-only file in /run that it removes once the server started. A TPM
//! that refuses (another PCR 7: Secure Boot off or other keys; another TPM) leaves the device
//! untouched and the box serving from RAM; without a TPM the device stays in clear.
use ringstore_durable::superblock::{self, Probe, Superblock, SUPERBLOCK_LEN};
use std::io::Write;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Where the unsealed key waits for the server's start (tmpfs, mode 0600, removed after).
pub const KEY_FILE: &str = "/run/ringstore-data.key";

/// What PID 1 decided about the data device's encryption.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AtRest {
    /// Encrypted with the TPM-sealed key, written to `key_file` for the server.
    Sealed { key_file: PathBuf, line: String },
    /// Left to the configuration: in clear (`warn`) or an operator's `data_key`.
    AsConfigured { line: String, warn: bool },
    /// The TPM refused: nothing serves from the device, which stays as it was.
    Refused(String),
}

impl AtRest {
    /// The `status` line after `data at rest `.
    pub fn line(&self) -> &str {
        match self {
            AtRest::Sealed { line, .. } | AtRest::AsConfigured { line, .. } => line,
            AtRest::Refused(why) => why,
        }
    }

    /// Whether `tuning` warns about it.
    pub fn warns(&self) -> bool {
        !matches!(
            self,
            AtRest::Sealed { .. } | AtRest::AsConfigured { warn: false, .. }
        )
    }
}

/// Decides for the data device `data` with the TPM at `tpm`; `configured_key`: the operator set
/// `data_key`, which wins.
pub fn prepare(data: &Path, tpm: &Path, configured_key: bool) -> AtRest {
    if configured_key {
        return AtRest::AsConfigured {
            line: "encrypted with the configured data_key".into(),
            warn: false,
        };
    }
    if !tpm.exists() {
        return clear("in clear: no TPM (/dev/tpmrm0), so no key to seal");
    }
    match prepare_with_tpm(data, tpm) {
        Ok(at_rest) => at_rest,
        Err(why) => AtRest::Refused(format!(
            "refused: {why}; serving from RAM only, the data device untouched"
        )),
    }
}

fn clear(line: &str) -> AtRest {
    AtRest::AsConfigured {
        line: line.into(),
        warn: true,
    }
}

fn prepare_with_tpm(data: &Path, tpm: &Path) -> Result<AtRest, String> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(data)
        .map_err(|e| format!("cannot open {}: {e}", data.display()))?;
    let mut head = vec![0u8; superblock::PROBE_LEN];
    let got =
        read_head(&file, &mut head).map_err(|e| format!("cannot read {}: {e}", data.display()))?;
    head.truncate(got);
    if let Some(sealed) = superblock::sealed_key(&head) {
        let sealed = ringstore_tpm::SealedKey::decode(sealed).map_err(|e| e.to_string())?;
        let key = unseal(tpm, &sealed)?;
        return sealed_at_rest(
            &key,
            "encrypted, key sealed to PCR 7 and unsealed at this boot",
        );
    }
    match superblock::probe(&head) {
        Probe::Blank => first_format(&file, &head, tpm),
        Probe::Ringstore => match Superblock::decode(&head, u64::MAX) {
            Ok(sb) if sb.key_check.is_none() => Ok(clear(
                "in clear: formatted in clear before a key was sealed (reformat to encrypt)",
            )),
            _ => Ok(clear("encrypted with a key this box has no sealed copy of")),
        },
        Probe::Foreign(_) | Probe::Unknown => Ok(clear(
            "in clear: not a blank device, so no key was sealed (ringstore.data_format rules apply)",
        )),
    }
}

fn read_head(file: &std::fs::File, head: &mut [u8]) -> std::io::Result<usize> {
    let mut got = 0;
    while got < head.len() {
        match file.read_at(&mut head[got..], got as u64)? {
            0 => break,
            n => got += n,
        }
    }
    Ok(got)
}

fn unseal(tpm: &Path, sealed: &ringstore_tpm::SealedKey) -> Result<[u8; 32], String> {
    let mut dev = ringstore_tpm::Device::open(tpm).map_err(|e| e.to_string())?;
    ringstore_tpm::unseal(&mut dev, sealed).map_err(|e| {
        let hint = if e.is_policy_failure() {
            "PCR 7 is not what it was at sealing: Secure Boot turned off or its keys changed"
        } else if matches!(
            e,
            ringstore_tpm::TpmError::Refused {
                command: "Load",
                ..
            }
        ) {
            "the key was sealed by another TPM, or this one was cleared"
        } else {
            "the TPM could not unseal the data key"
        };
        format!("{hint} ({e})")
    })
}

/// A blank device: a new key, sealed and checked by unsealing it back, written into the
/// superblock block before the server formats the device with it.
fn first_format(file: &std::fs::File, head: &[u8], tpm: &Path) -> Result<AtRest, String> {
    let key = ringstore_tpm::new_key().map_err(|e| e.to_string())?;
    let mut dev = ringstore_tpm::Device::open(tpm).map_err(|e| e.to_string())?;
    let sealed = ringstore_tpm::seal(&mut dev, &key).map_err(|e| format!("sealing: {e}"))?;
    if unseal(tpm, &sealed)? != key {
        return Err("the TPM unsealed another key than it sealed".into());
    }
    let mut block = head[..head
        .len()
        .min(ringstore_durable::units::usize_from(SUPERBLOCK_LEN))]
        .to_vec();
    block.resize(ringstore_durable::units::usize_from(SUPERBLOCK_LEN), 0);
    superblock::set_sealed_key(&mut block, &sealed.encode()).map_err(|e| e.to_string())?;
    let area = superblock::SEALED_KEY_AREA;
    file.write_all_at(&block[area.clone()], area.start as u64)
        .and_then(|()| file.sync_all())
        .map_err(|e| format!("writing the sealed key: {e}"))?;
    sealed_at_rest(&key, "encrypted, key made and sealed to PCR 7 at this boot")
}

fn sealed_at_rest(key: &[u8; 32], line: &str) -> Result<AtRest, String> {
    let _ = std::fs::remove_file(KEY_FILE);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(KEY_FILE)
        .and_then(|mut f| f.write_all(key).map(|()| f))
        .map_err(|e| format!("{KEY_FILE}: {e}"))?;
    let _ = f.flush();
    Ok(AtRest::Sealed {
        key_file: PathBuf::from(KEY_FILE),
        line: line.into(),
    })
}

/// Removes the key file once the server holds the key.
pub fn forget_key_file() {
    let _ = std::fs::remove_file(KEY_FILE);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_tpm_the_device_stays_in_clear_and_tuning_warns() {
        let at = prepare(
            Path::new("/nonexistent/vda"),
            Path::new("/nonexistent/tpmrm0"),
            false,
        );
        assert!(at.line().starts_with("in clear: no TPM"), "{at:?}");
        assert!(at.warns());
        let at = prepare(
            Path::new("/nonexistent/vda"),
            Path::new("/nonexistent/tpmrm0"),
            true,
        );
        assert!(!at.warns());
    }

    #[test]
    fn an_unreadable_device_with_a_tpm_is_refused() {
        // Any existing path stands in for the TPM: the device fails first.
        let at = prepare(Path::new("/nonexistent/vda"), Path::new("/"), false);
        assert!(matches!(at, AtRest::Refused(_)) && at.warns(), "{at:?}");
    }
}
