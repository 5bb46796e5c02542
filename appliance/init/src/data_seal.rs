//! The data key sealed by the TPM (ADR 0053): at the first format PID 1 makes a random key,
//! seals it to PCR 7 and writes the sealed key into the superblock block of the blank device
//! (the one write PID 1 makes to the data device); at every boot it unseals it and hands it to
//! the server through a root-only file in /run that it removes once the server started. A TPM
//! that refuses (another PCR 7: Secure Boot off or other keys; another TPM) leaves the device
//! untouched and the box serving from RAM; without a TPM the device stays in clear. After
//! `data reseal` the boot whose PCR 7 changed opens with the one-boot copy instead, seals the
//! key to the present PCR 7 and erases the copy ([`resealed`]).
use ringstore_durable::superblock::{self, Probe, Superblock, SUPERBLOCK_LEN};
use ringstore_tpm::Transport;
use std::io::Write;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use zeroize::Zeroizing;

/// Where the unsealed key waits for the server's start (tmpfs, mode 0600, removed after).
pub const KEY_FILE: &str = "/run/ringstore-data.key";

/// What PID 1 decided about the data device's encryption.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AtRest {
    /// Encrypted with the TPM-sealed key, written to `key_file` for the server; `warn` when
    /// Secure Boot is off (PCR 7 then binds the key to this TPM, not to signed images).
    Sealed {
        key_file: PathBuf,
        line: String,
        warn: bool,
    },
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
            AtRest::Sealed { warn: false, .. } | AtRest::AsConfigured { warn: false, .. }
        )
    }
}

/// Decides for the data device `data` with the TPM at `tpm`; `configured_key`: the operator set
/// `data_key`, which wins; `secure_boot`: whether the firmware enforces Secure Boot now.
pub fn prepare(data: &Path, tpm: &Path, configured_key: bool, secure_boot: bool) -> AtRest {
    if configured_key {
        return AtRest::AsConfigured {
            line: "encrypted with the configured data_key".into(),
            warn: false,
        };
    }
    if !tpm.exists() {
        return clear("in clear: no TPM (/dev/tpmrm0), so no key to seal");
    }
    let opened = ringstore_tpm::Device::open(tpm).map_err(|e| e.to_string());
    let decided = opened.and_then(|mut dev| decide(data, &mut dev, Path::new(KEY_FILE)));
    under_secure_boot(decided.unwrap_or_else(refused), secure_boot)
}

/// A key sealed to PCR 7 with Secure Boot off is bound to this TPM and to "Secure Boot off":
/// a disk taken alone reads nothing, but the whole box boots any image that unseals it. Said
/// in `status` and warned about in `tuning`.
fn under_secure_boot(at: AtRest, secure_boot: bool) -> AtRest {
    match at {
        AtRest::Sealed { key_file, line, .. } if !secure_boot => AtRest::Sealed {
            key_file,
            line: format!(
                "{line}; Secure Boot is off: the key is bound to this TPM only (a disk taken \
                 alone reads nothing, the whole box does)"
            ),
            warn: true,
        },
        other => other,
    }
}

fn refused(why: String) -> AtRest {
    AtRest::Refused(format!(
        "refused: {why}; serving from RAM only, the data device untouched"
    ))
}

fn clear(line: &str) -> AtRest {
    AtRest::AsConfigured {
        line: line.into(),
        warn: true,
    }
}

/// With the TPM `tpm`: the decision for `data`, the key (if any) written to `key_file`.
/// `Err`: why the TPM (or the device) refused.
pub fn decide(data: &Path, tpm: &mut dyn Transport, key_file: &Path) -> Result<AtRest, String> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(data)
        .map_err(|e| format!("cannot open {}: {e}", data.display()))?;
    let mut head = vec![0u8; superblock::PROBE_LEN];
    let got =
        read_head(&file, &mut head).map_err(|e| format!("cannot read {}: {e}", data.display()))?;
    head.truncate(got);
    // Two sealed copies during a rekey (ADR 0055): the superblock's key check picks the one
    // the device is under.
    let sb = match superblock::probe(&head) {
        Probe::Ringstore => Superblock::decode(&head, device_len(&file)).ok(),
        _ => None,
    };
    let key_check = sb.as_ref().and_then(|sb| sb.key_check);
    let pending = superblock::one_boot_key(&head);
    if let Some(sealed) = superblock::sealed_key_for(&head, key_check) {
        let sealed = ringstore_tpm::SealedKey::decode(sealed).map_err(|e| e.to_string());
        let key = match (sealed.and_then(|s| unseal(tpm, &s)), pending) {
            (Ok(key), _) => key,
            (Err(why), None) => return Err(why),
            (Err(why), Some(_)) => return resealed(&file, &head, sb.as_ref(), tpm, key_file, &why),
        };
        let mut line = "encrypted, key sealed to PCR 7 and unsealed at this boot".to_string();
        if let Some((area, copy, _)) = pending {
            line.push_str(&unneeded_copy(&file, &head, (area, copy), tpm));
        }
        return sealed_at_rest(&key, key_file, &line);
    }
    if pending.is_some() {
        // The key in use's copy is torn: a crash while a resealing boot rewrote it.
        let why = "the key's sealed copy is not whole";
        return resealed(&file, &head, sb.as_ref(), tpm, key_file, why);
    }
    match superblock::probe(&head) {
        Probe::Blank => first_format(&file, &head, tpm, key_file),
        Probe::Ringstore => match Superblock::decode(&head, device_len(&file)) {
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

/// The device's length (a block device's metadata says 0: its end is where a seek lands).
fn device_len(mut file: &std::fs::File) -> u64 {
    use std::io::Seek;
    file.seek(std::io::SeekFrom::End(0)).unwrap_or(0)
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

fn unseal(
    tpm: &mut dyn Transport,
    sealed: &ringstore_tpm::SealedKey,
) -> Result<Zeroizing<[u8; 32]>, String> {
    ringstore_tpm::unseal(tpm, sealed).map_err(|e| {
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
fn first_format(
    file: &std::fs::File,
    head: &[u8],
    tpm: &mut dyn Transport,
    key_file: &Path,
) -> Result<AtRest, String> {
    let key = ringstore_tpm::new_key().map_err(|e| e.to_string())?;
    let sealed = ringstore_tpm::seal(tpm, &key).map_err(|e| format!("sealing: {e}"))?;
    if unseal(tpm, &sealed)? != key {
        return Err("the TPM unsealed another key than it sealed".into());
    }
    let mut block = block_of(head);
    superblock::set_sealed_key(&mut block, &sealed.encode()).map_err(|e| e.to_string())?;
    write_area(file, &block, 0).map_err(|e| format!("writing the sealed key: {e}"))?;
    sealed_at_rest(
        &key,
        key_file,
        "encrypted, key made and sealed to PCR 7 at this boot",
    )
}

fn sealed_at_rest(key: &[u8; 32], key_file: &Path, line: &str) -> Result<AtRest, String> {
    let _ = std::fs::remove_file(key_file);
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(key_file)
        .and_then(|mut f| f.write_all(key))
        .map_err(|e| format!("{}: {e}", key_file.display()))?;
    Ok(AtRest::Sealed {
        key_file: key_file.to_path_buf(),
        line: line.into(),
        warn: false,
    })
}

/// `data rekey` on the appliance (ADR 0055): a new random key, sealed to the present PCR 7 and
/// unsealed back (a TPM that seals but cannot unseal is found before the device depends on
/// it). Returns the key and its sealed copy for the server's rekey, which writes the copy
/// into the superblock's free sealed-key area before the switch.
pub fn new_sealed_key(tpm: &mut dyn Transport) -> Result<(Zeroizing<[u8; 32]>, Vec<u8>), String> {
    let key = ringstore_tpm::new_key().map_err(|e| e.to_string())?;
    let sealed = ringstore_tpm::seal(tpm, &key).map_err(|e| format!("sealing: {e}"))?;
    if unseal(tpm, &sealed)? != key {
        return Err("the TPM unsealed another key than it sealed".into());
    }
    Ok((key, sealed.encode()))
}

/// The boot after `data reseal` (ADR 0053), the PCR 7 copy refused (`why`): the one-boot copy
/// unsealed, checked against the superblock's key check, sealed to the present PCR 7 and
/// unsealed back, written over the key in use's area and synced; only then the one-boot copy
/// erased. Power lost before the new copy is whole: the next boot finds the one-boot copy
/// again (the TPM admits it for a few resets) and does it again; lost after: the new copy
/// opens and the one-boot copy is erased then.
fn resealed(
    file: &std::fs::File,
    head: &[u8],
    sb: Option<&Superblock>,
    tpm: &mut dyn Transport,
    key_file: &Path,
    why: &str,
) -> Result<AtRest, String> {
    let (area, copy, copy_check) = superblock::one_boot_key(head).ok_or(why.to_string())?;
    let (Some(sb), Some(check)) = (sb, sb.and_then(|sb| sb.key_check)) else {
        return Err(format!(
            "{why}; a `data reseal` copy waits but the superblock is not readable"
        ));
    };
    let copy = ringstore_tpm::one_boot::OneBootKey::decode(copy).map_err(|e| e.to_string())?;
    let key = ringstore_tpm::one_boot::unseal_one_boot(tpm, &copy).map_err(|e| {
        let spent = if e.is_spent() {
            "it was for an earlier boot"
        } else {
            "refused"
        };
        format!("{why}; the one-boot copy of `data reseal`: {spent} ({e})")
    })?;
    let data_key = ringstore_durable::DataKey::from_bytes(*key);
    if copy_check != check || data_key.check_value(&sb.uuid) != check {
        return Err(format!(
            "{why}; the one-boot copy of `data reseal` holds another key than the device's"
        ));
    }
    let sealed = ringstore_tpm::seal(tpm, &key).map_err(|e| format!("sealing: {e}"))?;
    if unseal(tpm, &sealed)? != key {
        return Err("the TPM unsealed another key than it sealed".into());
    }
    let mut block = block_of(head);
    let normal = 1 - area;
    superblock::set_sealed_key_in(&mut block, normal, &sealed.encode(), check)
        .map_err(|e| e.to_string())?;
    write_area(file, &block, normal).map_err(|e| format!("writing the resealed key: {e}"))?;
    let mut line =
        "encrypted, key resealed to the present PCR 7 at this boot (data reseal)".to_string();
    if let Err(e) = erase_area(file, &block, area) {
        line.push_str(&format!(
            "; the one-boot copy not erased ({e}): the TPM refuses it after this boot"
        ));
    }
    sealed_at_rest(&key, key_file, &line)
}

/// A boot whose PCR 7 copy unsealed while a one-boot copy waits: a boot with no TPM restart
/// since `data reseal` (a kexec jump: no firmware pass, so nothing could have changed yet)
/// keeps the copy for the boot through the firmware; any later one spends it (PCR 7 did not
/// change), erasing it. The `status` words said either way.
fn unneeded_copy(
    file: &std::fs::File,
    head: &[u8],
    (area, copy): (usize, &[u8]),
    tpm: &mut dyn Transport,
) -> String {
    use ringstore_tpm::one_boot::{read_reset_count, OneBootKey, RESETS};
    let made_this_tpm_boot = OneBootKey::decode(copy)
        .ok()
        .zip(read_reset_count(tpm).ok())
        .is_some_and(|(k, now)| now.checked_add(RESETS) == Some(k.last));
    if made_this_tpm_boot {
        return "; the one-boot copy of `data reseal` waits for a boot through the firmware \
                (the TPM has not restarted since it was made)"
            .to_string();
    }
    let mut line = "; the one-boot copy of `data reseal` was not needed".to_string();
    line.push_str(&match erase_area(file, head, area) {
        Ok(()) => " and is erased".to_string(),
        Err(e) => format!(" (not erased: {e}; the TPM refuses it after this boot)"),
    });
    line
}

/// The superblock block as read in `head`, zero-filled to its whole length.
fn block_of(head: &[u8]) -> Vec<u8> {
    let len = ringstore_durable::units::usize_from(SUPERBLOCK_LEN);
    let mut block = head[..head.len().min(len)].to_vec();
    block.resize(len, 0);
    block
}

/// Writes sealed-key area `area` of superblock block `block` to the device and syncs it.
fn write_area(file: &std::fs::File, block: &[u8], area: usize) -> std::io::Result<()> {
    let range = superblock::SEALED_KEY_AREAS[area].clone();
    file.write_all_at(&block[range.clone()], range.start as u64)?;
    file.sync_all()
}

/// Zeroes sealed-key area `area` on the device (a spent one-boot copy) and syncs it.
fn erase_area(file: &std::fs::File, head: &[u8], area: usize) -> std::io::Result<()> {
    let mut block = block_of(head);
    superblock::clear_area(&mut block, area);
    write_area(file, &block, area)
}

/// `data reseal` (ADR 0053): the key in use sealed by this TPM for this boot and the next one,
/// with no PCR, and unsealed back; the stored form for the server to write beside the key's
/// PCR 7 copy.
pub fn one_boot_copy(tpm: &mut dyn Transport, key: &[u8; 32]) -> Result<Vec<u8>, String> {
    use ringstore_tpm::one_boot::{seal_one_boot, unseal_one_boot};
    let copy = seal_one_boot(tpm, key).map_err(|e| format!("sealing: {e}"))?;
    match unseal_one_boot(tpm, &copy) {
        Ok(back) if *back == *key => Ok(copy.encode()),
        Ok(_) => Err("the TPM unsealed another key than it sealed".into()),
        Err(e) => Err(format!("unsealing the one-boot copy back: {e}")),
    }
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
            true,
        );
        assert!(at.line().starts_with("in clear: no TPM"), "{at:?}");
        assert!(at.warns());
        let at = prepare(
            Path::new("/nonexistent/vda"),
            Path::new("/nonexistent/tpmrm0"),
            true,
            true,
        );
        assert!(!at.warns());
    }

    #[test]
    fn a_key_sealed_with_secure_boot_off_is_said_and_warned_about() {
        let sealed = || AtRest::Sealed {
            key_file: PathBuf::from(KEY_FILE),
            line: "encrypted, key sealed to PCR 7".into(),
            warn: false,
        };
        assert!(!under_secure_boot(sealed(), true).warns());
        let off = under_secure_boot(sealed(), false);
        assert!(off.warns());
        assert!(off.line().contains("Secure Boot is off"), "{off:?}");
        let clear = under_secure_boot(clear("in clear"), false);
        assert_eq!(clear.line(), "in clear", "only a sealed key is qualified");
    }

    /// A blank 1 MiB data file and a key file path in a fresh directory.
    fn blank(dir: &Path) -> (PathBuf, PathBuf) {
        let data = dir.join("data");
        std::fs::write(&data, vec![0u8; 1 << 20]).unwrap();
        (data, dir.join("data.key"))
    }

    #[test]
    fn the_first_boot_seals_a_key_and_later_boots_unseal_it_on_that_tpm_only() {
        use ringstore_tpm::swtpm::SwTpm;
        use std::os::unix::fs::PermissionsExt;
        if !SwTpm::available() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let (state, fresh) = (dir.path().join("tpm"), dir.path().join("fresh"));
        std::fs::create_dir_all(&state).unwrap();
        std::fs::create_dir_all(&fresh).unwrap();
        let (data, key_file) = blank(dir.path());
        let mut tpm = SwTpm::start(&state).unwrap();

        let first = decide(&data, &mut tpm, &key_file).unwrap();
        assert!(first.line().contains("made and sealed"), "{first:?}");
        assert!(!first.warns());
        let key = std::fs::read(&key_file).unwrap();
        let mode = std::fs::metadata(&key_file).unwrap().permissions().mode();
        assert_eq!((key.len(), mode & 0o777), (32, 0o600));
        let image = std::fs::read(&data).unwrap();
        assert!(superblock::sealed_key(&image[..4096]).is_some());
        assert_eq!(superblock::probe(&image[..8192]), Probe::Blank);
        assert!(!image.windows(32).any(|w| w == key), "the key in clear");

        let again = decide(&data, &mut tpm, &key_file).unwrap();
        assert!(again.line().contains("unsealed at this boot"), "{again:?}");
        assert_eq!(std::fs::read(&key_file).unwrap(), key);

        let mut other = SwTpm::start(&fresh).unwrap();
        let err = decide(&data, &mut other, &key_file).unwrap_err();
        assert!(err.contains("another TPM"), "{err}");
        tpm.extend_pcr7().unwrap();
        let err = decide(&data, &mut tpm, &key_file).unwrap_err();
        assert!(err.contains("PCR 7 is not what it was"), "{err}");
        assert_eq!(
            std::fs::read(&data).unwrap(),
            image,
            "a refusal wrote the device"
        );
    }

    /// `data rekey` on the appliance (ADR 0055): the new key's sealed copy goes beside the
    /// old one, and the next boot unseals the key the superblock is under: the old one until
    /// the switch, the new one after it (and after the old one is retired).
    #[test]
    fn after_a_rekey_the_boot_unseals_the_key_the_device_is_under() {
        use ringstore_durable::{DataKey, Durable, FileDevice, Options, Serving};
        use ringstore_tpm::swtpm::SwTpm;
        if !SwTpm::available() {
            return; // under CI, `available` fails the test instead
        }
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("tpm");
        std::fs::create_dir_all(&state).unwrap();
        let (data, key_file) = blank(dir.path());
        let mut tpm = SwTpm::start(&state).unwrap();
        decide(&data, &mut tpm, &key_file).unwrap();
        let first: [u8; 32] = std::fs::read(&key_file).unwrap().try_into().unwrap();
        let opts = Options {
            data_key: Some(DataKey::from_bytes(first)),
            regions: 1,
            segment_size: 64 * 1024,
            block_size: 512,
            ..Options::default()
        };
        let (d, _) = Durable::open(FileDevice::open(&data).unwrap(), &opts).unwrap();
        let serving = Serving::new(d);
        // The first boot's key unseals while the format holds it.
        decide(&data, &mut tpm, &key_file).unwrap();
        assert_eq!(std::fs::read(&key_file).unwrap(), first);
        let (new, sealed) = new_sealed_key(&mut tpm).unwrap();
        assert_ne!(*new, first);
        serving
            .rekey(DataKey::from_bytes(*new), Some(&sealed))
            .unwrap();
        let again = decide(&data, &mut tpm, &key_file).unwrap();
        assert!(again.line().contains("unsealed at this boot"), "{again:?}");
        assert_eq!(
            std::fs::read(&key_file).unwrap(),
            *new,
            "the new key after the switch"
        );
        let image = std::fs::read(&data).unwrap();
        assert!(superblock::sealed_key_in(&image, 0).is_some());
        assert!(superblock::sealed_key_in(&image, 1).is_some());
        assert!(
            !image.windows(32).any(|w| w == *new || w == first),
            "a key in clear"
        );
    }

    /// A TPM-sealed device formatted by the server (so its superblock has a key check), its
    /// key, and the swtpm's state directory.
    fn formatted(dir: &Path) -> (PathBuf, PathBuf, PathBuf, [u8; 32]) {
        use ringstore_durable::{DataKey, Durable, FileDevice, Options};
        use ringstore_tpm::swtpm::SwTpm;
        let state = dir.join("tpm");
        std::fs::create_dir_all(&state).unwrap();
        let (data, key_file) = blank(dir);
        decide(&data, &mut SwTpm::start(&state).unwrap(), &key_file).unwrap();
        let key: [u8; 32] = std::fs::read(&key_file).unwrap().try_into().unwrap();
        let opts = Options {
            data_key: Some(DataKey::from_bytes(key)),
            regions: 1,
            segment_size: 64 * 1024,
            block_size: 512,
            ..Options::default()
        };
        drop(Durable::open(FileDevice::open(&data).unwrap(), &opts).unwrap());
        (data, key_file, state, key)
    }

    /// `data reseal` as the console does it: the server writes the one-boot copy.
    fn reseal(data: &Path, tpm: &mut dyn Transport, key: [u8; 32]) {
        use ringstore_durable::{DataKey, Durable, FileDevice, Options, Serving};
        let opts = Options {
            data_key: Some(DataKey::from_bytes(key)),
            regions: 1,
            segment_size: 64 * 1024,
            block_size: 512,
            ..Options::default()
        };
        let (d, _) = Durable::open(FileDevice::open(data).unwrap(), &opts).unwrap();
        let serving = Serving::new(d);
        serving.reseal(&mut |k| one_boot_copy(tpm, k)).unwrap();
        assert!(serving.reseal_pending().unwrap());
    }

    fn head(data: &Path) -> Vec<u8> {
        std::fs::read(data).unwrap()[..4096].to_vec()
    }

    /// ADR 0053's `data reseal`: PCR 7 changes at the next boot (Secure Boot off): the device
    /// opens, the key is sealed to the new PCR 7, the one-boot copy is gone; the boot after
    /// opens with the new seal; the old PCR 7 back is refused, the device unchanged.
    #[test]
    fn after_data_reseal_the_next_boot_reseals_to_the_new_pcr7_and_spends_the_copy() {
        use ringstore_tpm::swtpm::SwTpm;
        if !SwTpm::available() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let (data, key_file, state, key) = formatted(dir.path());
        let mut tpm = SwTpm::start(&state).unwrap();
        reseal(&data, &mut tpm, key);
        let copy = superblock::one_boot_key(&head(&data)).unwrap().1.to_vec();
        assert!(!std::fs::read(&data).unwrap().windows(32).any(|w| w == key));

        // Secure Boot off: another PCR 7.
        let mut tpm = tpm.reboot(&state).unwrap();
        tpm.extend_pcr7().unwrap();
        let at = decide(&data, &mut tpm, &key_file).unwrap();
        assert!(
            at.line().contains("resealed to the present PCR 7"),
            "{at:?}"
        );
        assert_eq!(std::fs::read(&key_file).unwrap(), key);
        assert_eq!(superblock::one_boot_key(&head(&data)), None, "spent");

        let mut tpm = tpm.reboot(&state).unwrap();
        tpm.extend_pcr7().unwrap();
        let at = decide(&data, &mut tpm, &key_file).unwrap();
        assert!(at.line().contains("unsealed at this boot"), "{at:?}");
        assert_eq!(std::fs::read(&key_file).unwrap(), key);

        // Secure Boot on again: the key is bound to the new PCR 7 now.
        let mut tpm = tpm.reboot(&state).unwrap();
        let image = std::fs::read(&data).unwrap();
        let err = decide(&data, &mut tpm, &key_file).unwrap_err();
        assert!(err.contains("PCR 7 is not what it was"), "{err}");
        assert_eq!(
            std::fs::read(&data).unwrap(),
            image,
            "a refusal wrote the device"
        );
        // The spent copy put back (a disk image taken while it was pending): the TPM counted
        // past it.
        let mut block = head(&data);
        let check = superblock::sealed_key_check(&block, 0).unwrap();
        superblock::set_one_boot_key(&mut block, 1, &copy, check).unwrap();
        let mut tpm = tpm.reboot(&state).unwrap();
        for _ in 0..ringstore_tpm::one_boot::RESETS {
            tpm = tpm.reboot(&state).unwrap();
        }
        std::fs::OpenOptions::new()
            .write(true)
            .open(&data)
            .unwrap()
            .write_all_at(&block, 0)
            .unwrap();
        let err = decide(&data, &mut tpm, &key_file).unwrap_err();
        assert!(err.contains("it was for an earlier boot"), "{err}");
    }

    /// A reseal whose next boot measures the same PCR 7: the copy is spent all the same.
    #[test]
    fn a_reseal_is_spent_by_the_next_boot_even_if_pcr7_did_not_change() {
        use ringstore_tpm::swtpm::SwTpm;
        if !SwTpm::available() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let (data, key_file, state, key) = formatted(dir.path());
        let mut tpm = SwTpm::start(&state).unwrap();
        reseal(&data, &mut tpm, key);
        let mut tpm = tpm.reboot(&state).unwrap();
        let at = decide(&data, &mut tpm, &key_file).unwrap();
        assert!(at.line().contains("was not needed and is erased"), "{at:?}");
        assert_eq!(std::fs::read(&key_file).unwrap(), key);
        assert_eq!(superblock::one_boot_key(&head(&data)), None);
    }

    /// A kexec `reboot` after `data reseal` restarts no TPM: that boot opens with the PCR 7
    /// copy and keeps the one-boot copy for the boot through the firmware, which then reseals.
    #[test]
    fn a_boot_without_a_tpm_restart_keeps_the_reseal_copy() {
        use ringstore_tpm::swtpm::SwTpm;
        if !SwTpm::available() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let (data, key_file, state, key) = formatted(dir.path());
        let mut tpm = SwTpm::start(&state).unwrap();
        reseal(&data, &mut tpm, key);
        // The same TPM boot (a kexec jump): kept, twice.
        for _ in 0..2 {
            let at = decide(&data, &mut tpm, &key_file).unwrap();
            assert!(
                at.line().contains("waits for a boot through the firmware"),
                "{at:?}"
            );
            assert!(superblock::one_boot_key(&head(&data)).is_some(), "kept");
        }
        // Through the firmware, Secure Boot off: resealed as without the jump.
        let mut tpm = tpm.reboot(&state).unwrap();
        tpm.extend_pcr7().unwrap();
        let at = decide(&data, &mut tpm, &key_file).unwrap();
        assert!(
            at.line().contains("resealed to the present PCR 7"),
            "{at:?}"
        );
        assert_eq!(std::fs::read(&key_file).unwrap(), key);
        assert_eq!(superblock::one_boot_key(&head(&data)), None, "spent");
    }

    /// Power lost at any point of the resealing boot's two area writes (each area two
    /// sectors, each landing or not; the copy erased only after the new seal is synced): the
    /// next boot opens with the key, and a torn state never loses both copies.
    #[test]
    fn a_crash_in_the_resealing_boot_never_loses_the_key() {
        use ringstore_tpm::swtpm::SwTpm;
        if !SwTpm::available() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let (data, key_file, state, key) = formatted(dir.path());
        let mut tpm = SwTpm::start(&state).unwrap();
        reseal(&data, &mut tpm, key);
        let before = std::fs::read(&data).unwrap();
        let mut tpm = tpm.reboot(&state).unwrap();
        tpm.extend_pcr7().unwrap();
        decide(&data, &mut tpm, &key_file).unwrap();
        let after = std::fs::read(&data).unwrap();
        // Sectors 4, 5: area 0 (the new PCR 7 seal); 6, 7: area 1 (the one-boot copy).
        let sectors = [4usize, 5, 6, 7];
        let mut states = 0;
        for mask in 0u32..16 {
            let landed = |i: usize| mask & (1 << i) != 0;
            if (landed(2) || landed(3)) && !(landed(0) && landed(1)) {
                continue; // the copy is erased only after the new seal was synced
            }
            let mut image = before.clone();
            for (i, &s) in sectors.iter().enumerate() {
                if landed(i) {
                    image[s * 512..(s + 1) * 512].copy_from_slice(&after[s * 512..(s + 1) * 512]);
                }
            }
            std::fs::write(&data, &image).unwrap();
            let at = decide(&data, &mut tpm, &key_file)
                .unwrap_or_else(|e| panic!("mask {mask:04b}: {e}"));
            assert_eq!(
                std::fs::read(&key_file).unwrap(),
                key,
                "mask {mask:04b}: {at:?}"
            );
            let h = head(&data);
            assert_eq!(superblock::one_boot_key(&h), None, "mask {mask:04b}");
            assert!(
                superblock::sealed_key_in(&h, 0).is_some(),
                "mask {mask:04b}"
            );
            states += 1;
        }
        assert_eq!(states, 7);
    }

    #[test]
    fn a_device_in_clear_or_foreign_is_left_in_clear_with_a_warning() {
        use ringstore_tpm::swtpm::SwTpm;
        if !SwTpm::available() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("tpm");
        std::fs::create_dir_all(&state).unwrap();
        let (data, key_file) = blank(dir.path());
        let mut junk = vec![0u8; 1 << 20];
        junk[100] = 1;
        std::fs::write(&data, &junk).unwrap();
        let mut tpm = SwTpm::start(&state).unwrap();
        let at = decide(&data, &mut tpm, &key_file).unwrap();
        assert!(
            at.warns() && at.line().contains("not a blank device"),
            "{at:?}"
        );
        assert_eq!(std::fs::read(&data).unwrap(), junk);
        assert!(!key_file.exists());
    }

    #[test]
    fn an_unreadable_device_with_a_tpm_is_refused() {
        // Any existing path stands in for the TPM: the device fails first.
        let at = prepare(Path::new("/nonexistent/vda"), Path::new("/"), false, true);
        assert!(matches!(at, AtRest::Refused(_)) && at.warns(), "{at:?}");
    }
}
