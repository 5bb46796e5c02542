//! Data at rest (ADR 0050): with a data key, every record and the checkpoint body are sealed
//! with AES-256-GCM from `ring` (the crypto provider the TLS code links).
//!
//! - The AEAD key and the superblock's key check value are two HMAC-SHA256 outputs of the
//!   32-byte data key (different labels, salted with the device uuid): the check value tells a
//!   wrong key apart before any data is read or written and reveals nothing about the AEAD key.
//! - Nonces are `epoch u32 | counter u64`. The epoch is a counter in the superblock block that
//!   each open raises and flushes *before* its first sealed write ([`crate::superblock`]'s epoch
//!   slots); the counter starts at 0 in every open and is handed out in disjoint ranges from one
//!   atomic ([`Crypt::reserve`]) to each region's log ([`Sealer`]). So no two seals of one open
//!   share a counter, no two opens share an epoch (a crash before the flush of the new epoch
//!   leaves no sealed write under it), and compaction's copies are new seals with new nonces.
//!   A counter or epoch that would wrap is refused ([`DurableError::NonceSpace`]), never reused.
//!
//! [`DataKey`] takes the key bytes from anywhere (a file here; PID 1 may later unseal them from
//! a TPM): the engine only sees the 32 bytes.
use std::fmt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};
use ring::hmac;

use crate::error::DurableError;

/// Bytes of a data key.
pub const DATA_KEY_LEN: usize = 32;
/// Bytes of a nonce stored in a sealed record or checkpoint.
pub const NONCE_LEN: usize = 12;
/// Bytes of the AEAD tag after every sealed body.
pub const TAG_LEN: usize = 16;
/// Bytes of the key check value in the superblock.
pub const KEY_CHECK_LEN: usize = 32;
/// Counter values a region's log takes from [`Crypt::reserve`] at a time: one atomic add per
/// this many records, and a range left unused at shutdown or a crash is simply skipped.
pub const NONCE_RANGE: u64 = 1 << 16;

const CHECK_LABEL: &[u8] = b"ringstore data key check v1";
const AEAD_LABEL: &[u8] = b"ringstore data aead key v1";

/// The 32-byte data key. Never printed.
#[derive(Clone)]
pub struct DataKey([u8; DATA_KEY_LEN]);

impl fmt::Debug for DataKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("DataKey(..)")
    }
}

impl DataKey {
    /// A key from its bytes (a file, or a key PID 1 unsealed).
    pub fn from_bytes(bytes: [u8; DATA_KEY_LEN]) -> DataKey {
        DataKey(bytes)
    }

    /// Reads a key file: exactly 32 bytes, a regular file with no permission beyond its
    /// owner's read and write (mode 0600, or 0400); anything else is refused, so a key is
    /// never taken from a file others could read or replace.
    pub fn from_file(path: &Path) -> Result<DataKey, DurableError> {
        use std::os::unix::fs::MetadataExt;
        let refuse = |reason: String| DurableError::KeyFile {
            path: path.display().to_string(),
            reason,
        };
        let meta = std::fs::metadata(path).map_err(|e| refuse(e.to_string()))?;
        if !meta.is_file() {
            return Err(refuse("not a regular file".into()));
        }
        let mode = meta.mode() & 0o7777;
        if mode & !0o600 != 0 {
            return Err(refuse(format!(
                "mode {mode:04o}: a data key must be readable by its owner only (chmod 600)"
            )));
        }
        let bytes = std::fs::read(path).map_err(|e| refuse(e.to_string()))?;
        let key: [u8; DATA_KEY_LEN] = bytes.as_slice().try_into().map_err(|_| {
            refuse(format!(
                "{} bytes: a data key is exactly {DATA_KEY_LEN} bytes (e.g. head -c 32 /dev/urandom)",
                bytes.len()
            ))
        })?;
        Ok(DataKey(key))
    }

    fn prf(&self, label: &[u8], uuid: &[u8; 16]) -> [u8; 32] {
        let k = hmac::Key::new(hmac::HMAC_SHA256, &self.0);
        let mut ctx = hmac::Context::with_key(&k);
        ctx.update(label);
        ctx.update(uuid);
        let mut out = [0u8; 32];
        out.copy_from_slice(ctx.sign().as_ref());
        out
    }

    /// The key check value stored in the superblock of device `uuid`.
    pub fn check_value(&self, uuid: &[u8; 16]) -> [u8; KEY_CHECK_LEN] {
        self.prf(CHECK_LABEL, uuid)
    }
}

/// The sealing state of one open of an encrypted device: the AEAD key, the device uuid (bound
/// into every seal's associated data), the open's epoch and the next free counter.
pub struct Crypt {
    key: LessSafeKey,
    uuid: [u8; 16],
    /// This open's epoch, durable in the superblock; `None`: opens only (recovery).
    epoch: Option<u32>,
    next: AtomicU64,
}

impl fmt::Debug for Crypt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Crypt {{ epoch: {:?} }}", self.epoch)
    }
}

impl Crypt {
    /// Only the open path makes one, after it made `epoch` durable in the superblock.
    pub(crate) fn new(key: &DataKey, uuid: [u8; 16], epoch: u32) -> Result<Crypt, DurableError> {
        let mut c = Crypt::reader(key, uuid)?;
        c.epoch = Some(epoch);
        Ok(c)
    }

    /// One that only opens (recovery, before the open's epoch is durable; the fuzz target): it
    /// never seals.
    pub fn reader(key: &DataKey, uuid: [u8; 16]) -> Result<Crypt, DurableError> {
        let aead = key.prf(AEAD_LABEL, &uuid);
        // Fails only for a key of another length than the algorithm's (32 here, always).
        let unbound = UnboundKey::new(&AES_256_GCM, &aead).map_err(|_| DurableError::NonceSpace)?;
        Ok(Crypt {
            key: LessSafeKey::new(unbound),
            uuid,
            epoch: None,
            next: AtomicU64::new(0),
        })
    }

    /// The next [`NONCE_RANGE`] counter values, for one caller alone; refused by a reader.
    pub(crate) fn reserve(&self) -> Result<(u64, u64), DurableError> {
        if self.epoch.is_none() {
            return Err(DurableError::NonceSpace);
        }
        // Never wraps: once the counter cannot give a whole range, every later call fails too.
        let start = self
            .next
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                n.checked_add(NONCE_RANGE)
            })
            .map_err(|_| DurableError::NonceSpace)?;
        Ok((start, start + NONCE_RANGE))
    }

    /// The nonce for counter `n` of this open.
    pub(crate) fn nonce(&self, n: u64) -> [u8; NONCE_LEN] {
        let mut out = [0u8; NONCE_LEN];
        out[..4].copy_from_slice(&self.epoch.unwrap_or(0).to_le_bytes());
        out[4..].copy_from_slice(&n.to_le_bytes());
        out
    }

    fn aad(&self, header: &[u8]) -> Vec<u8> {
        let mut aad = Vec::with_capacity(16 + header.len());
        aad.extend_from_slice(&self.uuid);
        aad.extend_from_slice(header);
        aad
    }

    /// Seals `body` in place under `nonce`, authenticating `header` too; returns the tag.
    pub(crate) fn seal(
        &self,
        nonce: [u8; NONCE_LEN],
        header: &[u8],
        body: &mut [u8],
    ) -> [u8; TAG_LEN] {
        let aad = self.aad(header);
        let mut tag = [0u8; TAG_LEN];
        // Sealing fails only for a body over AES-GCM's 64 GiB limit; records are below 4 GiB.
        if let Ok(t) = self.key.seal_in_place_separate_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(aad.as_slice()),
            body,
        ) {
            tag.copy_from_slice(t.as_ref());
        }
        tag
    }

    /// Opens `sealed` (ciphertext then tag) and returns the plaintext; `None` when the tag does
    /// not verify (damage, tampering or another key). `sealed` is never modified.
    pub(crate) fn open(
        &self,
        nonce: [u8; NONCE_LEN],
        header: &[u8],
        sealed: &[u8],
    ) -> Option<Vec<u8>> {
        let aad = self.aad(header);
        let mut buf = sealed.to_vec();
        let n = self
            .key
            .open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad.as_slice()),
                &mut buf,
            )
            .ok()?
            .len();
        buf.truncate(n);
        Some(buf)
    }

    /// Seals a whole blob (the checkpoint body): `nonce | ciphertext | tag`.
    pub(crate) fn seal_blob(&self, label: &[u8], plain: &[u8]) -> Result<Vec<u8>, DurableError> {
        let (n, _) = self.reserve()?;
        let nonce = self.nonce(n);
        let mut out = Vec::with_capacity(NONCE_LEN + plain.len() + TAG_LEN);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(plain);
        let tag = self.seal(nonce, label, &mut out[NONCE_LEN..]);
        out.extend_from_slice(&tag);
        Ok(out)
    }

    /// Opens what [`Crypt::seal_blob`] made with the same label; `None` if it does not verify.
    pub(crate) fn open_blob(&self, label: &[u8], sealed: &[u8]) -> Option<Vec<u8>> {
        let nonce: [u8; NONCE_LEN] = sealed.get(..NONCE_LEN)?.try_into().ok()?;
        self.open(nonce, label, sealed.get(NONCE_LEN..)?)
    }
}

/// A region log's source of nonces: a range reserved from the open's [`Crypt`] at a time.
pub struct Sealer {
    crypt: Arc<Crypt>,
    next: u64,
    end: u64,
}

impl fmt::Debug for Sealer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Sealer {{ next: {}, end: {} }}", self.next, self.end)
    }
}

impl Sealer {
    /// A sealer drawing on `crypt`; it reserves its first range at its first record.
    pub fn new(crypt: Arc<Crypt>) -> Sealer {
        Sealer {
            crypt,
            next: 0,
            end: 0,
        }
    }

    /// The open's sealing state.
    pub fn crypt(&self) -> &Crypt {
        &self.crypt
    }

    /// A nonce no other seal under this key used or will use.
    pub fn next_nonce(&mut self) -> Result<[u8; NONCE_LEN], DurableError> {
        if self.next == self.end {
            (self.next, self.end) = self.crypt.reserve()?;
        }
        let n = self.next;
        self.next += 1;
        Ok(self.crypt.nonce(n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::os::unix::fs::PermissionsExt;

    fn key(b: u8) -> DataKey {
        DataKey::from_bytes([b; DATA_KEY_LEN])
    }

    #[test]
    fn check_value_depends_on_key_and_device() {
        let u = [1u8; 16];
        assert_eq!(key(1).check_value(&u), key(1).check_value(&u));
        assert_ne!(key(1).check_value(&u), key(2).check_value(&u));
        assert_ne!(key(1).check_value(&u), key(1).check_value(&[2u8; 16]));
        // The check value is not the AEAD key.
        assert_ne!(key(1).check_value(&u), key(1).prf(AEAD_LABEL, &u));
    }

    #[test]
    fn seal_open_roundtrip_and_rejects_any_change() {
        let c = Crypt::new(&key(7), [3; 16], 5).unwrap();
        let blob = c.seal_blob(b"ck", b"secret body").unwrap();
        assert!(!blob.windows(6).any(|w| w == b"secret"));
        assert_eq!(c.open_blob(b"ck", &blob).unwrap(), b"secret body");
        assert!(c.open_blob(b"other", &blob).is_none());
        for i in 0..blob.len() {
            let mut b = blob.clone();
            b[i] ^= 1;
            assert!(c.open_blob(b"ck", &b).is_none(), "flip at {i} accepted");
        }
        let other = Crypt::new(&key(8), [3; 16], 5).unwrap();
        assert!(other.open_blob(b"ck", &blob).is_none());
    }

    #[test]
    fn nonces_never_repeat_across_sealers_and_ranges() {
        let c = Arc::new(Crypt::new(&key(1), [0; 16], 9).unwrap());
        let mut seen = HashSet::new();
        let mut sealers: Vec<Sealer> = (0..3).map(|_| Sealer::new(c.clone())).collect();
        for i in 0..(3 * (1usize << 16) + 10) {
            let n = sealers[i % 3].next_nonce().unwrap();
            assert_eq!(&n[..4], &9u32.to_le_bytes());
            assert!(seen.insert(n), "nonce repeated at {i}");
        }
        // A sealer made later in the same open (a log rebuilt) still gets fresh counters.
        let mut late = Sealer::new(c.clone());
        assert!(seen.insert(late.next_nonce().unwrap()));
        c.next.store(u64::MAX - NONCE_RANGE + 1, Ordering::Relaxed);
        for _ in 0..2 {
            assert!(matches!(
                Sealer::new(c.clone()).next_nonce(),
                Err(DurableError::NonceSpace)
            ));
        }
    }

    #[test]
    fn a_reader_opens_but_never_seals() {
        let c = Crypt::new(&key(7), [3; 16], 5).unwrap();
        let blob = c.seal_blob(b"ck", b"body").unwrap();
        let r = Crypt::reader(&key(7), [3; 16]).unwrap();
        assert_eq!(r.open_blob(b"ck", &blob).unwrap(), b"body");
        assert!(matches!(
            r.seal_blob(b"ck", b"x"),
            Err(DurableError::NonceSpace)
        ));
        assert!(Sealer::new(Arc::new(r)).next_nonce().is_err());
    }

    #[test]
    fn key_file_must_be_32_bytes_and_private() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k");
        std::fs::write(&path, [9u8; 32]).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = DataKey::from_file(&path).unwrap_err().to_string();
        assert!(err.contains("0644"), "{err}");
        for mode in [0o640, 0o604, 0o700, 0o4600] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            assert!(DataKey::from_file(&path).is_err(), "mode {mode:o} accepted");
        }
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o400)).unwrap();
        assert!(DataKey::from_file(&path).is_ok());
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let k = DataKey::from_file(&path).unwrap();
        assert_eq!(k.check_value(&[0; 16]), key(9).check_value(&[0; 16]));
        assert_eq!(format!("{k:?}"), "DataKey(..)");
        std::fs::write(&path, [9u8; 31]).unwrap();
        let err = DataKey::from_file(&path).unwrap_err().to_string();
        assert!(err.contains("31 bytes"), "{err}");
    }
}
