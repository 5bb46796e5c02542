//! TPM 2.0 sealing of the 32-byte data key to PCR 7 (ADR 0053), for the static PID 1.
//!
//! Seal: CreatePrimary (a fixed ECC P-256 storage key under the owner hierarchy: the TPM
//! re-derives the same key from its owner seed at every boot, so nothing of it is stored), then
//! Create of a keyedhash object holding the key, whose authPolicy is the PolicyPCR digest of
//! the present PCR 7 (SHA-256 bank), with userWithAuth clear (no password can stand in for the
//! policy), fixedTPM and fixedParent. The TPM2B_PUBLIC and TPM2B_PRIVATE it returns are the
//! [`SealedKey`], which is useless without this TPM's owner seed.
//!
//! Unseal: CreatePrimary, Load, StartAuthSession (policy), PolicyPCR(7), Unseal, and every
//! handle flushed whatever happened. A different PCR 7 (Secure Boot off, other db/dbx keys)
//! makes Unseal fail its policy; another TPM (or a cleared one) fails Load.
//!
//! `data reseal` adds a second, short-lived copy bound to this TPM and its boot count instead
//! of PCR 7 ([`one_boot`]).
// The software TPM the tests seal against: compiled only for tests, never into PID 1.
pub mod one_boot;
#[cfg(any(test, feature = "swtpm"))]
pub mod swtpm;
mod wire;

use std::time::Duration;
use tpm2_protocol::data::TpmCc;
use wire::{
    Command, Reader, ALG_NULL, ALG_SHA256, RH_NULL, RH_OWNER, RS_PW, ST_NO_SESSIONS, ST_SESSIONS,
};
use zeroize::Zeroizing;

/// Bytes of the data key.
pub const KEY_LEN: usize = 32;
/// The largest sealed key accepted (public + private areas; a real one is under 300 bytes).
pub const SEALED_MAX: usize = 1024;
/// How long one TPM command may take (ECC key derivation on a slow TPM is well under this).
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);
/// The device node of the kernel's TPM resource manager.
pub const DEVICE: &str = "/dev/tpmrm0";

const CC_CREATE_PRIMARY: u32 = 0x131;
const CC_CREATE: u32 = 0x153;
const CC_LOAD: u32 = 0x157;
const CC_UNSEAL: u32 = 0x15E;
const CC_FLUSH_CONTEXT: u32 = 0x165;
const CC_START_AUTH_SESSION: u32 = 0x176;
const CC_PCR_READ: u32 = 0x17E;
const CC_POLICY_PCR: u32 = 0x17F;

/// What went wrong talking to the TPM.
#[derive(Debug, thiserror::Error)]
pub enum TpmError {
    /// The device could not be opened, written or read (or did not answer in time).
    #[error("TPM device: {0}")]
    Io(#[from] std::io::Error),
    /// The TPM answered a command with an error code.
    #[error("TPM refused {command}: {name} (0x{code:03x})")]
    Refused {
        /// The command.
        command: &'static str,
        /// The response code.
        code: u32,
        /// Its name, as tpm2-protocol decodes it.
        name: String,
    },
    /// A response whose frame tpm2-protocol rejects.
    #[error("TPM response to {0} is malformed: {1}")]
    Protocol(&'static str, String),
    /// A response or sealed key shorter or longer than its fields say.
    #[error("malformed TPM data: {0}")]
    Malformed(&'static str),
}

impl TpmError {
    /// Whether the TPM refused because the policy does not hold: PCR 7 is not what it was at
    /// sealing (Secure Boot state or keys changed).
    pub fn is_policy_failure(&self) -> bool {
        // TPM_RC_POLICY_FAIL (0x09D) and TPM_RC_VALUE on the PCR digest, in format 1 with the
        // session/parameter number in the upper bits: compare the error number only.
        matches!(self, TpmError::Refused { command: "Unseal", code, .. } if code & 0x0BF == 0x09D)
    }

    /// Whether a one-boot copy ([`one_boot`]) was refused because a later boot began: the
    /// TPM's resetCount is past the copy's last (TPM_RC_POLICY, 0x126).
    pub fn is_spent(&self) -> bool {
        matches!(self, TpmError::Refused { command: "PolicyCounterTimer", code, .. } if code & 0xFFF == 0x126)
    }
}

/// Sends a command and returns the raw response.
pub trait Transport {
    /// One command, one response.
    fn transact(&mut self, command: &[u8]) -> Result<Vec<u8>, TpmError>;
}

/// The kernel's TPM device (`/dev/tpmrm0`).
#[derive(Debug)]
pub struct Device(ringstore_sys::TpmDevice);

impl Device {
    /// Opens `path`.
    pub fn open(path: &std::path::Path) -> Result<Device, TpmError> {
        Ok(Device(ringstore_sys::TpmDevice::open(path)?))
    }
}

impl Transport for Device {
    fn transact(&mut self, command: &[u8]) -> Result<Vec<u8>, TpmError> {
        Ok(self.0.transact(command, COMMAND_TIMEOUT)?)
    }
}

/// The data key sealed by one TPM: TPM2B_PUBLIC then TPM2B_PRIVATE, as the TPM returned them.
#[derive(Clone, PartialEq, Eq)]
pub struct SealedKey {
    public: Vec<u8>,
    private: Vec<u8>,
}

impl std::fmt::Debug for SealedKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "SealedKey({} + {} bytes)",
            self.public.len(),
            self.private.len()
        )
    }
}

impl SealedKey {
    /// The stored form: the two TPM2Bs back to back (each carries its size).
    pub fn encode(&self) -> Vec<u8> {
        [self.public.as_slice(), self.private.as_slice()].concat()
    }

    /// Reads the stored form; anything but two TPM2Bs filling `b` within [`SEALED_MAX`] is
    /// refused.
    pub fn decode(b: &[u8]) -> Result<SealedKey, TpmError> {
        if b.len() > SEALED_MAX {
            return Err(TpmError::Malformed("sealed key over its bound"));
        }
        let mut r = Reader::new(b);
        let public = r.sized_whole()?.to_vec();
        let private = r.sized_whole()?.to_vec();
        if !r.is_empty() {
            return Err(TpmError::Malformed("bytes after the sealed key"));
        }
        Ok(SealedKey { public, private })
    }
}

/// A fresh random data key from the kernel's CSPRNG (getrandom).
/// Zeroed when dropped, as every copy of key bytes here is (ADR 0055).
pub fn new_key() -> Result<Zeroizing<[u8; KEY_LEN]>, TpmError> {
    use ring::rand::SecureRandom;
    let mut key = Zeroizing::new([0u8; KEY_LEN]);
    ring::rand::SystemRandom::new()
        .fill(&mut key[..])
        .map_err(|_| TpmError::Io(std::io::Error::other("getrandom failed")))?;
    Ok(key)
}

/// The PolicyPCR digest over PCR 7 (SHA-256 bank) holding `pcr7`: TPM 2.0 Part 3, 23.7:
/// `H(0^32 || TPM_CC_PolicyPCR || TPML_PCR_SELECTION || H(pcr7))`.
pub fn pcr7_policy(pcr7: &[u8; 32]) -> [u8; 32] {
    use ring::digest::{digest, Context, SHA256};
    let pcr_digest = digest(&SHA256, pcr7);
    let mut ctx = Context::new(&SHA256);
    ctx.update(&[0u8; 32]);
    ctx.update(&CC_POLICY_PCR.to_be_bytes());
    ctx.update(&wire::pcr7_selection());
    ctx.update(pcr_digest.as_ref());
    let mut out = [0u8; 32];
    out.copy_from_slice(ctx.finish().as_ref());
    out
}

/// The present value of PCR 7 in the SHA-256 bank.
pub fn read_pcr7(tpm: &mut dyn Transport) -> Result<[u8; 32], TpmError> {
    let mut c = Command::new(ST_NO_SESSIONS, CC_PCR_READ);
    c.bytes(&wire::pcr7_selection());
    let rsp = tpm.transact(&c.finish())?;
    let mut r = wire::check("PCR_Read", TpmCc::PcrRead, &rsp)?;
    r.u32()?; // pcrUpdateCounter
    let banks = r.u32()?;
    for _ in 0..banks.min(16) {
        r.u16()?;
        let n = r.u8()?;
        r.take(usize::from(n))?;
    }
    if r.u32()? != 1 {
        return Err(TpmError::Malformed("TPM has no SHA-256 PCR 7"));
    }
    let value = r.sized()?;
    value
        .try_into()
        .map_err(|_| TpmError::Malformed("PCR 7 is not a SHA-256 digest"))
}

/// Seals `key` to the present PCR 7 of `tpm`.
pub fn seal(tpm: &mut dyn Transport, key: &[u8; KEY_LEN]) -> Result<SealedKey, TpmError> {
    let policy = pcr7_policy(&read_pcr7(tpm)?);
    let primary = create_primary(tpm)?;
    let sealed = create_sealed(tpm, primary, key, &policy);
    flush(tpm, primary);
    sealed
}

/// Unseals `sealed` with `tpm`: refused unless PCR 7 is what it was at sealing and the TPM is
/// the one that sealed it.
pub fn unseal(
    tpm: &mut dyn Transport,
    sealed: &SealedKey,
) -> Result<Zeroizing<[u8; KEY_LEN]>, TpmError> {
    let primary = create_primary(tpm)?;
    let object = load(tpm, primary, sealed);
    flush(tpm, primary);
    let object = object?;
    let session = start_policy_session(tpm);
    let key = session.and_then(|s| {
        let key = policy_pcr7(tpm, s).and_then(|()| unseal_object(tpm, object, s));
        flush(tpm, s);
        key
    });
    flush(tpm, object);
    key
}

fn create_primary(tpm: &mut dyn Transport) -> Result<u32, TpmError> {
    let mut c = Command::new(ST_SESSIONS, CC_CREATE_PRIMARY);
    c.u32(RH_OWNER).auth(RS_PW, 0);
    c.u16(4).u16(0).u16(0); // inSensitive: no auth value, no data
    c.sized(&storage_template())?;
    c.u16(0).u32(0); // outsideInfo, creationPCR
    let rsp = tpm.transact(&c.finish())?;
    wire::check("CreatePrimary", TpmCc::CreatePrimary, &rsp)?.u32()
}

/// TPMT_PUBLIC of the storage key: ECC P-256, restricted decrypt, AES-128-CFB for children.
/// Fixed, so CreatePrimary derives the same key from the same owner seed every boot.
fn storage_template() -> Vec<u8> {
    let mut t = Vec::with_capacity(32);
    t.extend_from_slice(&0x0023u16.to_be_bytes()); // TPM_ALG_ECC
    t.extend_from_slice(&ALG_SHA256.to_be_bytes());
    // fixedTPM, fixedParent, sensitiveDataOrigin, userWithAuth, noDA, restricted, decrypt
    t.extend_from_slice(&0x0003_0472u32.to_be_bytes());
    t.extend_from_slice(&0u16.to_be_bytes()); // no authPolicy
    t.extend_from_slice(&0x0006u16.to_be_bytes()); // AES
    t.extend_from_slice(&128u16.to_be_bytes());
    t.extend_from_slice(&0x0043u16.to_be_bytes()); // CFB
    t.extend_from_slice(&ALG_NULL.to_be_bytes()); // scheme
    t.extend_from_slice(&0x0003u16.to_be_bytes()); // NIST P-256
    t.extend_from_slice(&ALG_NULL.to_be_bytes()); // kdf
    t.extend_from_slice(&[0, 0, 0, 0]); // unique: empty x and y
    t
}

/// TPMT_PUBLIC of the sealed object: keyedhash, no scheme, fixedTPM | fixedParent | noDA, and
/// userWithAuth clear so only `policy` authorizes Unseal.
fn sealed_template(policy: &[u8; 32]) -> Vec<u8> {
    let mut t = Vec::with_capacity(48);
    t.extend_from_slice(&0x0008u16.to_be_bytes()); // TPM_ALG_KEYEDHASH
    t.extend_from_slice(&ALG_SHA256.to_be_bytes());
    t.extend_from_slice(&0x0000_0412u32.to_be_bytes());
    t.extend_from_slice(&32u16.to_be_bytes());
    t.extend_from_slice(policy);
    t.extend_from_slice(&ALG_NULL.to_be_bytes());
    t.extend_from_slice(&0u16.to_be_bytes()); // unique
    t
}

fn create_sealed(
    tpm: &mut dyn Transport,
    parent: u32,
    key: &[u8; KEY_LEN],
    policy: &[u8; 32],
) -> Result<SealedKey, TpmError> {
    let mut c = Command::new(ST_SESSIONS, CC_CREATE);
    c.u32(parent).auth(RS_PW, 0);
    c.u16(2 + 2 + 32).u16(0).sized(key)?; // inSensitive: no auth value, the key as data
    c.sized(&sealed_template(policy))?;
    c.u16(0).u32(0);
    // The command holds the key in clear: zeroed once sent.
    let command = Zeroizing::new(c.finish());
    let rsp = tpm.transact(&command)?;
    let mut r = wire::check("Create", TpmCc::Create, &rsp)?;
    r.u32()?; // parameterSize
    let private = r.sized_whole()?.to_vec();
    let public = r.sized_whole()?.to_vec();
    if public.len() + private.len() > SEALED_MAX {
        return Err(TpmError::Malformed("sealed key over its bound"));
    }
    Ok(SealedKey { public, private })
}

fn load(tpm: &mut dyn Transport, parent: u32, sealed: &SealedKey) -> Result<u32, TpmError> {
    let mut c = Command::new(ST_SESSIONS, CC_LOAD);
    c.u32(parent).auth(RS_PW, 0);
    c.bytes(&sealed.private).bytes(&sealed.public);
    let rsp = tpm.transact(&c.finish())?;
    wire::check("Load", TpmCc::Load, &rsp)?.u32()
}

/// An unsalted, unbound policy session: PolicyPCR needs no secret, so none is set up.
fn start_policy_session(tpm: &mut dyn Transport) -> Result<u32, TpmError> {
    let mut c = Command::new(ST_NO_SESSIONS, CC_START_AUTH_SESSION);
    // The caller's nonce only freshens HMACs, which this session never computes; the TPM
    // wants at least 16 bytes of it.
    c.u32(RH_NULL).u32(RH_NULL).sized(&[0u8; 16])?;
    c.u16(0).u8(0x01).u16(ALG_NULL).u16(ALG_SHA256); // no salt, POLICY, no symmetric
    let rsp = tpm.transact(&c.finish())?;
    wire::check("StartAuthSession", TpmCc::StartAuthSession, &rsp)?.u32()
}

fn policy_pcr7(tpm: &mut dyn Transport, session: u32) -> Result<(), TpmError> {
    let mut c = Command::new(ST_NO_SESSIONS, CC_POLICY_PCR);
    // An empty pcrDigest: the TPM folds in the present PCR 7, and Unseal's check compares.
    c.u32(session).u16(0).bytes(&wire::pcr7_selection());
    let rsp = tpm.transact(&c.finish())?;
    wire::check("PolicyPCR", TpmCc::PolicyPcr, &rsp).map(|_| ())
}

fn unseal_object(
    tpm: &mut dyn Transport,
    object: u32,
    session: u32,
) -> Result<Zeroizing<[u8; KEY_LEN]>, TpmError> {
    let mut c = Command::new(ST_SESSIONS, CC_UNSEAL);
    c.u32(object).auth(session, 0x01); // continueSession: flushed by us below
                                       // The response holds the key in clear: zeroed once read.
    let rsp = Zeroizing::new(tpm.transact(&c.finish())?);
    let mut r = wire::check("Unseal", TpmCc::Unseal, &rsp)?;
    r.u32()?;
    let got = r.sized()?;
    if got.len() != KEY_LEN {
        return Err(TpmError::Malformed("unsealed data is not a 32-byte key"));
    }
    // Copied straight into the zeroed-on-drop buffer: no other copy on the stack.
    let mut key = Zeroizing::new([0u8; KEY_LEN]);
    key.copy_from_slice(got);
    Ok(key)
}

/// Frees a transient object or session; a failure only leaks a slot the resource manager
/// frees when the device is closed.
fn flush(tpm: &mut dyn Transport, handle: u32) {
    let mut c = Command::new(ST_NO_SESSIONS, CC_FLUSH_CONTEXT);
    c.u32(handle);
    let _ = tpm.transact(&c.finish());
}

#[cfg(test)]
mod tests;
