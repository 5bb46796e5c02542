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
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use aes::cipher::generic_array::GenericArray;
use aes::cipher::{BlockEncrypt, KeyInit};
use aes::Aes256;
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};
use ring::hmac;
use zeroize::{Zeroize, Zeroizing};

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
const WRAP_LABEL: &[u8] = b"ringstore data key wrap v1";

/// The 32-byte data key. Never printed; its bytes are zeroed when it is dropped.
#[derive(Clone)]
pub struct DataKey([u8; DATA_KEY_LEN]);

impl Drop for DataKey {
    fn drop(&mut self) {
        self.0.zeroize();
    }
}

impl PartialEq for DataKey {
    fn eq(&self, other: &DataKey) -> bool {
        // Not constant-time, and need not be: only ever compared with another key the
        // operator holds (a rekey to the key in use is refused).
        self.0 == other.0
    }
}

impl fmt::Debug for DataKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("DataKey(..)")
    }
}

impl DataKey {
    /// A key from its bytes (a file, or a key PID 1 unsealed). The caller's copy is its own
    /// to zero (a `Zeroizing` buffer, or a `DataKey` that is dropped).
    pub fn from_bytes(bytes: [u8; DATA_KEY_LEN]) -> DataKey {
        DataKey(bytes)
    }

    /// The key's bytes (PID 1 seals them with the TPM).
    pub fn bytes(&self) -> &[u8; DATA_KEY_LEN] {
        &self.0
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
        let bytes = Zeroizing::new(std::fs::read(path).map_err(|e| refuse(e.to_string()))?);
        let key: [u8; DATA_KEY_LEN] = bytes.as_slice().try_into().map_err(|_| {
            refuse(format!(
                "{} bytes: a data key is exactly {DATA_KEY_LEN} bytes (e.g. head -c 32 /dev/urandom)",
                bytes.len()
            ))
        })?;
        Ok(DataKey(key))
    }

    /// The file `ringstore serve` rekeys to on SIGHUP when it exists (ADR 0055): `FILE.next`
    /// beside `--data-key FILE`.
    pub fn next_file(path: &Path) -> std::path::PathBuf {
        let mut name = path.as_os_str().to_owned();
        name.push(".next");
        name.into()
    }

    /// After a rekey to [`DataKey::next_file`] became durable: renames it over `path` (and
    /// syncs the directory), so `--data-key FILE` names the key in use again.
    pub fn promote_next(path: &Path) -> std::io::Result<()> {
        std::fs::rename(DataKey::next_file(path), path)?;
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        std::fs::File::open(dir)?.sync_all()
    }

    /// A new random key (`data rekey` without a key given: the appliance).
    pub fn random() -> Result<DataKey, DurableError> {
        use ring::rand::SecureRandom;
        let mut key = [0u8; DATA_KEY_LEN];
        ring::rand::SystemRandom::new()
            .fill(&mut key)
            .map_err(|_| DurableError::Rekey("no random bytes from the kernel".into()))?;
        Ok(DataKey(key))
    }

    fn prf(&self, label: &[u8], uuid: &[u8; 16]) -> Zeroizing<[u8; 32]> {
        let k = hmac::Key::new(hmac::HMAC_SHA256, &self.0);
        let mut ctx = hmac::Context::with_key(&k);
        ctx.update(label);
        ctx.update(uuid);
        let mut out = Zeroizing::new([0u8; 32]);
        out.copy_from_slice(ctx.sign().as_ref());
        out
    }

    /// The key check value stored in the superblock of device `uuid`.
    pub fn check_value(&self, uuid: &[u8; 16]) -> [u8; KEY_CHECK_LEN] {
        *self.prf(CHECK_LABEL, uuid)
    }

    fn wrap_key(
        &self,
        uuid: &[u8; 16],
        from: u32,
    ) -> Result<(LessSafeKey, Nonce, Vec<u8>), DurableError> {
        let key = aead_key(&self.prf(WRAP_LABEL, uuid))?;
        // One wrap per rekey, and each rekey has its own `from` epoch: the nonce is unique.
        let mut nonce = [0u8; NONCE_LEN];
        nonce[..4].copy_from_slice(&from.to_le_bytes());
        let mut aad = uuid.to_vec();
        aad.extend_from_slice(&from.to_le_bytes());
        Ok((key, Nonce::assume_unique_for_key(nonce), aad))
    }

    /// `old` sealed under this (the new) key, for the superblock of a rekeyed device whose
    /// new key applies from epoch `from` (ADR 0055): whoever holds the new key reads the old
    /// records; whoever holds only the old key learns nothing of the new one.
    pub fn wrap(
        &self,
        old: &DataKey,
        uuid: &[u8; 16],
        from: u32,
    ) -> Result<[u8; WRAPPED_LEN], DurableError> {
        let (key, nonce, aad) = self.wrap_key(uuid, from)?;
        let mut out = [0u8; WRAPPED_LEN];
        out[..DATA_KEY_LEN].copy_from_slice(&old.0);
        let tag = key
            .seal_in_place_separate_tag(nonce, Aad::from(aad), &mut out[..DATA_KEY_LEN])
            .map_err(|_| DurableError::Rekey("sealing the old key failed".into()))?;
        out[DATA_KEY_LEN..].copy_from_slice(tag.as_ref());
        Ok(out)
    }

    /// The old key [`DataKey::wrap`] sealed; `None` when it does not verify.
    pub fn unwrap_old(
        &self,
        wrapped: &[u8; WRAPPED_LEN],
        uuid: &[u8; 16],
        from: u32,
    ) -> Option<DataKey> {
        let (key, nonce, aad) = self.wrap_key(uuid, from).ok()?;
        let mut buf = Zeroizing::new(*wrapped);
        let plain = key
            .open_in_place(nonce, Aad::from(aad), &mut buf[..])
            .ok()?;
        plain.try_into().ok().map(DataKey)
    }

    fn aead(&self, uuid: &[u8; 16]) -> Result<AeadKey, DurableError> {
        let bytes = self.prf(AEAD_LABEL, uuid);
        Ok(AeadKey {
            gcm: aead_key(&bytes)?,
            ctr: Aes256::new(GenericArray::from_slice(&bytes[..])),
        })
    }
}

/// One AEAD key twice: as `ring`'s AES-256-GCM (seal, open) and as the bare AES-256 block
/// cipher under the same bytes, which gives GCM's counter-mode keystream alone for
/// [`Crypt::peek`] (`ring` does not expose it). The `aes` crate zeroes its round keys on drop.
struct AeadKey {
    gcm: LessSafeKey,
    ctr: Aes256,
}

/// An AES-256-GCM key from 32 derived bytes. `UnboundKey::new` refuses only a key of another
/// length than the algorithm's (32 here, always).
fn aead_key(bytes: &[u8; 32]) -> Result<LessSafeKey, DurableError> {
    UnboundKey::new(&AES_256_GCM, bytes)
        .map(LessSafeKey::new)
        .map_err(|_| DurableError::NonceSpace)
}

/// Bytes of an old key sealed under the new one ([`DataKey::wrap`]): key then tag.
pub const WRAPPED_LEN: usize = DATA_KEY_LEN + TAG_LEN;

/// The keys of one open: the current one, and while a rekey is not finished the old one,
/// which opens what was sealed under an epoch below `from` (ADR 0055). Never changed in
/// place: a switch makes a new one, so a [`Sealer`] seals with its own snapshot, lock-free.
struct Keys {
    current: DataKey,
    aead: AeadKey,
    /// The first epoch sealed under `current` (0: every epoch; no rekey since the format).
    from: u32,
    old: Option<(DataKey, AeadKey)>,
    /// This open's sealing epoch, durable in the superblock; `None`: opens only (recovery).
    epoch: Option<u32>,
}

impl Keys {
    fn new(
        uuid: &[u8; 16],
        current: DataKey,
        from: u32,
        old: Option<DataKey>,
        epoch: Option<u32>,
    ) -> Result<Arc<Keys>, DurableError> {
        let old = match old {
            Some(k) => Some((k.aead(uuid)?, k)),
            None => None,
        };
        Ok(Arc::new(Keys {
            aead: current.aead(uuid)?,
            current,
            from,
            old: old.map(|(aead, k)| (k, aead)),
            epoch,
        }))
    }

    /// The key that seals and opens under `nonce`: the old key for an epoch below the switch
    /// while one is kept, the current one otherwise.
    fn for_nonce(&self, nonce: &[u8; NONCE_LEN]) -> &AeadKey {
        let epoch = u32::from_le_bytes([nonce[0], nonce[1], nonce[2], nonce[3]]);
        match &self.old {
            Some((_, old)) if epoch < self.from => old,
            _ => &self.aead,
        }
    }

    fn old_key(&self) -> Option<DataKey> {
        self.old.as_ref().map(|(k, _)| k.clone())
    }
}

/// The sealing state of one open of an encrypted device: the keys, the device uuid (bound
/// into every seal's associated data), the open's epoch and the next free counter.
pub struct Crypt {
    uuid: [u8; 16],
    keys: RwLock<Arc<Keys>>,
    /// Raised by every change of keys or epoch: a [`Sealer`] holding a range of an earlier
    /// generation takes a new one (and the keys with it) before its next seal.
    generation: AtomicU64,
    next: AtomicU64,
    /// Whether `keys` holds an old key: read at every compaction step, without the lock.
    old_kept: AtomicBool,
}

impl fmt::Debug for Crypt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let k = self.keys();
        write!(
            f,
            "Crypt {{ epoch: {:?}, from: {}, old: {} }}",
            k.epoch,
            k.from,
            k.old.is_some()
        )
    }
}

impl Crypt {
    /// One sealing under `epoch` (tests; the open path starts a reader's epoch instead).
    #[cfg(test)]
    pub(crate) fn new(key: &DataKey, uuid: [u8; 16], epoch: u32) -> Result<Crypt, DurableError> {
        let c = Crypt::reader(key, uuid)?;
        c.start_epoch(epoch)?;
        Ok(c)
    }

    /// One that only opens (recovery, before the open's epoch is durable; the fuzz target): it
    /// never seals.
    pub fn reader(key: &DataKey, uuid: [u8; 16]) -> Result<Crypt, DurableError> {
        Ok(Crypt {
            uuid,
            keys: RwLock::new(Keys::new(&uuid, key.clone(), 0, None, None)?),
            generation: AtomicU64::new(1),
            next: AtomicU64::new(0),
            old_kept: AtomicBool::new(false),
        })
    }

    /// A rekey not finished (ADR 0055): `old` opens what was sealed under an epoch below `from`.
    pub(crate) fn with_old(self, old: DataKey, from: u32) -> Result<Crypt, DurableError> {
        let k = self.keys();
        let keys = Keys::new(&self.uuid, k.current.clone(), from, Some(old), k.epoch)?;
        self.replace(keys, false);
        Ok(self)
    }

    fn keys(&self) -> Arc<Keys> {
        self.keys.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Puts `keys` in force (`restart`: counters from 0, a new epoch) and raises the
    /// generation so every sealer picks them up before its next seal.
    fn replace(&self, keys: Arc<Keys>, restart: bool) {
        let mut k = self.keys.write().unwrap_or_else(|e| e.into_inner());
        self.old_kept.store(keys.old.is_some(), Ordering::Release);
        *k = keys;
        if restart {
            // Ranges are taken under the read lock: none straddles this.
            self.next.store(0, Ordering::Relaxed);
        }
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Starts sealing under `epoch` (the open made it durable in the superblock).
    pub(crate) fn start_epoch(&self, epoch: u32) -> Result<(), DurableError> {
        let k = self.keys();
        let keys = Keys::new(
            &self.uuid,
            k.current.clone(),
            k.from,
            k.old_key(),
            Some(epoch),
        )?;
        self.replace(keys, true);
        Ok(())
    }

    /// The key in use (sealing), a copy.
    pub(crate) fn current_key(&self) -> DataKey {
        self.keys().current.clone()
    }

    /// This open's sealing epoch (`None`: a reader).
    pub(crate) fn epoch(&self) -> Option<u32> {
        self.keys().epoch
    }

    /// Whether an old key is still kept (a rekey not finished).
    pub fn has_old_key(&self) -> bool {
        self.old_kept.load(Ordering::Acquire)
    }

    /// Raised at each change of keys or epoch.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Seals with `new` from epoch `from` on (already durable in the superblock, with the
    /// present key wrapped beside it); the present key opens what came before. Every
    /// [`Sealer`] takes a range of the new epoch before its next seal.
    pub(crate) fn switch(&self, new: DataKey, from: u32) -> Result<(), DurableError> {
        let prev = self.current_key();
        self.replace(
            Keys::new(&self.uuid, new, from, Some(prev), Some(from))?,
            true,
        );
        Ok(())
    }

    /// Forgets the old key (no record needs it any more; the superblock no longer holds it).
    /// Its bytes are zeroed when the last snapshot of it drops: each sealer lets its own go
    /// at its next seal.
    pub(crate) fn retire_old(&self) -> Result<(), DurableError> {
        let k = self.keys();
        let keys = Keys::new(&self.uuid, k.current.clone(), k.from, None, k.epoch)?;
        drop(k);
        self.replace(keys, false);
        Ok(())
    }

    /// The next [`NONCE_RANGE`] counter values of the present epoch, for one caller alone,
    /// with the keys they are sealed under; refused by a reader.
    fn reserve_keys(&self) -> Result<(u64, u64, Arc<Keys>), DurableError> {
        // Under the read lock: a switch (write lock) cannot slip between the keys, their
        // epoch and the counter, so a range always belongs to the epoch it is sealed under.
        let k = self.keys.read().unwrap_or_else(|e| e.into_inner());
        if k.epoch.is_none() {
            return Err(DurableError::NonceSpace);
        }
        // Never wraps: once the counter cannot give a whole range, every later call fails too.
        let start = self
            .next
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                n.checked_add(NONCE_RANGE)
            })
            .map_err(|_| DurableError::NonceSpace)?;
        Ok((start, start + NONCE_RANGE, k.clone()))
    }

    /// The nonce for counter `n` of `epoch`.
    pub(crate) fn nonce(epoch: u32, n: u64) -> [u8; NONCE_LEN] {
        let mut out = [0u8; NONCE_LEN];
        out[..4].copy_from_slice(&epoch.to_le_bytes());
        out[4..].copy_from_slice(&n.to_le_bytes());
        out
    }

    /// Seals `body` in place under `nonce` with `keys`, authenticating `header` and the
    /// device uuid too; returns the tag.
    fn seal_with(
        &self,
        keys: &Keys,
        nonce: [u8; NONCE_LEN],
        header: &[u8],
        body: &mut [u8],
    ) -> [u8; TAG_LEN] {
        let aad = aad(&self.uuid, header);
        let mut tag = [0u8; TAG_LEN];
        // Sealing fails only for a body over AES-GCM's 64 GiB limit; records are below 4 GiB.
        // The key follows the nonce's epoch: a range taken just before a switch stays under
        // the key of its epoch, which the switch keeps until no record needs it.
        if let Ok(t) = keys.for_nonce(&nonce).gcm.seal_in_place_separate_tag(
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
        let aad = aad(&self.uuid, header);
        let mut buf = sealed.to_vec();
        let keys = self.keys.read().unwrap_or_else(|e| e.into_inner());
        let n = keys
            .for_nonce(&nonce)
            .gcm
            .open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad.as_slice()),
                &mut buf,
            )
            .ok()?
            .len();
        drop(keys);
        buf.truncate(n);
        Some(buf)
    }

    /// Decrypts in place `bytes`, the ciphertext at offset `at` of a body sealed under `nonce`,
    /// *without* checking the tag: GCM is counter mode, so a few bytes cost a few AES blocks
    /// where [`Crypt::open`] decrypts and authenticates the whole body. Only for deciding what
    /// to skip (compaction's walk: which records are dead); bytes that are served, kept or
    /// copied come from [`Crypt::open`].
    pub(crate) fn peek(&self, nonce: [u8; NONCE_LEN], at: usize, bytes: &mut [u8]) {
        let keys = self.keys.read().unwrap_or_else(|e| e.into_inner());
        let aes = &keys.for_nonce(&nonce).ctr;
        let (mut pos, mut rest) = (at, bytes);
        while !rest.is_empty() {
            let skip = pos % 16;
            let (now, later) = rest.split_at_mut((16 - skip).min(rest.len()));
            // GCM with a 96-bit nonce: J0 = nonce | 1, and the body starts at counter 2.
            // Bodies are below 4 GiB: the block number fits.
            let counter = u32::try_from(pos / 16 + 2).unwrap_or(u32::MAX);
            let mut block = GenericArray::from([0u8; 16]);
            block[..NONCE_LEN].copy_from_slice(&nonce);
            block[NONCE_LEN..].copy_from_slice(&counter.to_be_bytes());
            aes.encrypt_block(&mut block);
            for (b, k) in now.iter_mut().zip(&block[skip..]) {
                *b ^= k;
            }
            pos += now.len();
            rest = later;
        }
    }

    /// Seals a whole blob (the checkpoint body): `nonce | ciphertext | tag`.
    pub(crate) fn seal_blob(&self, label: &[u8], plain: &[u8]) -> Result<Vec<u8>, DurableError> {
        let (n, _, keys) = self.reserve_keys()?;
        let nonce = Crypt::nonce(keys.epoch.unwrap_or(0), n);
        let mut out = Vec::with_capacity(NONCE_LEN + plain.len() + TAG_LEN);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(plain);
        let tag = self.seal_with(&keys, nonce, label, &mut out[NONCE_LEN..]);
        out.extend_from_slice(&tag);
        Ok(out)
    }

    /// Opens what [`Crypt::seal_blob`] made with the same label; `None` if it does not verify.
    pub(crate) fn open_blob(&self, label: &[u8], sealed: &[u8]) -> Option<Vec<u8>> {
        let nonce: [u8; NONCE_LEN] = sealed.get(..NONCE_LEN)?.try_into().ok()?;
        self.open(nonce, label, sealed.get(NONCE_LEN..)?)
    }
}

fn aad(uuid: &[u8; 16], header: &[u8]) -> Vec<u8> {
    let mut aad = Vec::with_capacity(16 + header.len());
    aad.extend_from_slice(uuid);
    aad.extend_from_slice(header);
    aad
}

/// A region log's source of nonces: a range reserved from the open's [`Crypt`] at a time,
/// with a snapshot of the keys that range is sealed under.
pub struct Sealer {
    crypt: Arc<Crypt>,
    keys: Option<Arc<Keys>>,
    next: u64,
    end: u64,
    generation: u64,
}

impl fmt::Debug for Sealer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let epoch = self.keys.as_ref().and_then(|k| k.epoch);
        write!(
            f,
            "Sealer {{ epoch: {epoch:?}, next: {}, end: {} }}",
            self.next, self.end
        )
    }
}

impl Sealer {
    /// A sealer drawing on `crypt`; it reserves its first range at its first record.
    pub fn new(crypt: Arc<Crypt>) -> Sealer {
        Sealer {
            crypt,
            keys: None,
            next: 0,
            end: 0,
            generation: 0,
        }
    }

    /// The open's sealing state.
    pub fn crypt(&self) -> &Crypt {
        &self.crypt
    }

    /// A nonce no other seal under this key used or will use. After a switch of keys the next
    /// one is of the new epoch (so sealed under the new key) at once.
    pub fn next_nonce(&mut self) -> Result<[u8; NONCE_LEN], DurableError> {
        let generation = self.crypt.generation();
        if self.next == self.end || generation != self.generation || self.keys.is_none() {
            let (next, end, keys) = self.crypt.reserve_keys()?;
            (self.next, self.end, self.keys) = (next, end, Some(keys));
            self.generation = generation;
        }
        let n = self.next;
        self.next += 1;
        let epoch = self.keys.as_ref().and_then(|k| k.epoch).unwrap_or(0);
        Ok(Crypt::nonce(epoch, n))
    }

    /// Seals `body` in place under `nonce` (from [`Sealer::next_nonce`]) with this sealer's
    /// keys, without a lock; returns the tag.
    pub(crate) fn seal(
        &self,
        nonce: [u8; NONCE_LEN],
        header: &[u8],
        body: &mut [u8],
    ) -> [u8; TAG_LEN] {
        match &self.keys {
            Some(keys) => self.crypt.seal_with(keys, nonce, header, body),
            // No nonce was taken yet, so there is nothing to seal under: the caller always
            // takes one first. Sealing under the present keys keeps this total.
            None => self
                .crypt
                .seal_with(&self.crypt.keys(), nonce, header, body),
        }
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
        assert_ne!(key(1).check_value(&u), *key(1).prf(AEAD_LABEL, &u));
    }

    #[test]
    fn peek_is_the_plaintext_prefix_under_the_key_of_its_epoch() {
        let c = Arc::new(Crypt::new(&key(7), [3; 16], 5).unwrap());
        let plain: Vec<u8> = (0..200u8).collect();
        let seal = |c: &Arc<Crypt>| {
            let mut s = Sealer::new(c.clone());
            let nonce = s.next_nonce().unwrap();
            let mut body = plain.clone();
            let tag = s.seal(nonce, b"h", &mut body);
            (nonce, body, tag)
        };
        let (nonce, body, tag) = seal(&c);
        let peek = |c: &Crypt, nonce, range: std::ops::Range<usize>, body: &[u8]| {
            let mut out = body[range.clone()].to_vec();
            c.peek(nonce, range.start, &mut out);
            out
        };
        for len in [0, 1, 15, 16, 17, 40, 57, 200] {
            assert_eq!(
                peek(&c, nonce, 0..len, &body),
                &plain[..len],
                "prefix of {len}"
            );
        }
        for range in [3..5, 15..17, 16..48, 40..57, 33..200] {
            let want = &plain[range.clone()];
            assert_eq!(peek(&c, nonce, range.clone(), &body), want, "{range:?}");
        }
        let mut sealed = body.clone();
        sealed.extend_from_slice(&tag);
        assert_eq!(c.open(nonce, b"h", &sealed).unwrap(), plain);
        // After a switch, what was sealed under the old epoch peeks with the old key.
        c.switch(key(8), 6).unwrap();
        assert_eq!(peek(&c, nonce, 0..57, &body), &plain[..57]);
        let (nonce2, body2, _) = seal(&c);
        assert_eq!(peek(&c, nonce2, 0..57, &body2), &plain[..57]);
        // Another key peeks garbage (nothing checks it: `peek` only decides what to skip).
        let other = Crypt::new(&key(9), [3; 16], 5).unwrap();
        assert_ne!(peek(&other, nonce, 0..57, &body), &plain[..57]);
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
    fn a_switch_seals_under_the_new_key_at_once_and_keeps_the_old_one_for_old_epochs() {
        let c = Arc::new(Crypt::new(&key(1), [5; 16], 4).unwrap());
        let mut s = Sealer::new(c.clone());
        let before = s.next_nonce().unwrap();
        let old_blob = c.seal_blob(b"ck", b"old").unwrap();
        c.switch(key(2), 5).unwrap();
        // The same sealer, mid-range: its next nonce is of the new epoch, counter 0.
        let after = s.next_nonce().unwrap();
        assert_eq!(
            (&before[..4], &after[..4]),
            (&4u32.to_le_bytes()[..], &5u32.to_le_bytes()[..])
        );
        assert_eq!(&after[4..], &0u64.to_le_bytes());
        // A nonce of the old epoch (taken just before the switch) still seals under the old key.
        let mut late = b"late".to_vec();
        let tag = s.seal(before, b"h", &mut late);
        late.extend_from_slice(&tag);
        let only_old = Crypt::reader(&key(1), [5; 16]).unwrap();
        assert_eq!(only_old.open(before, b"h", &late).unwrap(), b"late");
        let mut fresh = b"fresh".to_vec();
        let tag = s.seal(after, b"h", &mut fresh);
        fresh.extend_from_slice(&tag);
        assert!(only_old.open(after, b"h", &fresh).is_none());
        let new_blob = c.seal_blob(b"ck", b"new").unwrap();
        // Both open here; a reader with the new key alone opens only the new one, one with
        // the new key and the old from epoch 5 opens both.
        assert_eq!(c.open_blob(b"ck", &old_blob).unwrap(), b"old");
        assert_eq!(c.open_blob(b"ck", &new_blob).unwrap(), b"new");
        let only_new = Crypt::reader(&key(2), [5; 16]).unwrap();
        assert!(only_new.open_blob(b"ck", &old_blob).is_none());
        assert_eq!(only_new.open_blob(b"ck", &new_blob).unwrap(), b"new");
        let both = Crypt::reader(&key(2), [5; 16])
            .unwrap()
            .with_old(key(1), 5)
            .unwrap();
        assert_eq!(both.open_blob(b"ck", &old_blob).unwrap(), b"old");
        // Retired: the old epoch's records no longer open.
        c.retire_old().unwrap();
        assert!(!c.has_old_key());
        assert!(c.open_blob(b"ck", &old_blob).is_none());
        assert_eq!(c.open_blob(b"ck", &new_blob).unwrap(), b"new");
    }

    #[test]
    fn the_old_key_wrapped_under_the_new_one_opens_only_with_it() {
        let uuid = [6; 16];
        let w = key(2).wrap(&key(1), &uuid, 9).unwrap();
        assert!(!w.windows(8).any(|x| x == [1u8; 8]), "the old key in clear");
        assert_eq!(key(2).unwrap_old(&w, &uuid, 9), Some(key(1)));
        assert_eq!(key(1).unwrap_old(&w, &uuid, 9), None);
        assert_eq!(key(2).unwrap_old(&w, &[7; 16], 9), None);
        assert_eq!(key(2).unwrap_old(&w, &uuid, 10), None);
        let mut bad = w;
        bad[3] ^= 1;
        assert_eq!(key(2).unwrap_old(&bad, &uuid, 9), None);
        // A new key wrapping another old key at another rekey uses another nonce.
        assert_ne!(key(2).wrap(&key(3), &uuid, 11).unwrap()[..32], w[..32]);
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
