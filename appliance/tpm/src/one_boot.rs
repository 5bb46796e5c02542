//! The one-boot copy of the data key that `data reseal` writes (ADR 0053): sealed by this TPM
//! with no PCR in its policy, only TPM2_PolicyCounterTimer "resetCount ≤ now + [`RESETS`]".
//! The TPM counts every TPM Reset (each platform reset's TPM2_Startup(CLEAR)), so the copy
//! unseals whatever PCR 7 holds for the next few resets and never again: the first ringstore
//! boot erases it from the disk, and a copy of the disk taken in between is useless to anyone
//! once the TPM counted past it, even with this TPM.
use crate::wire::{self, Command, ST_NO_SESSIONS};
use crate::{
    create_primary, create_sealed, flush, load, start_policy_session, unseal_object, SealedKey,
    TpmError, Transport, KEY_LEN,
};
use tpm2_protocol::data::TpmCc;
use zeroize::Zeroizing;

const CC_POLICY_COUNTER_TIMER: u32 = 0x16D;
const CC_READ_CLOCK: u32 = 0x181;
/// Where resetCount sits in TPMS_TIME_INFO: time u64, then TPMS_CLOCK_INFO's clock u64.
const RESET_COUNT_AT: u16 = 16;
/// TPM Resets the copy outlives: the boot that spends it is often not the next reset (saving
/// keys in the firmware's setup resets the platform, once or twice), and one more lets a boot
/// that lost power before its new PCR 7 copy was durable do it again.
pub const RESETS: u32 = 4;
/// TPM_EO_UNSIGNED_LE: the TPM's value ≤ the operand.
const EO_UNSIGNED_LE: u16 = 0x0009;

/// A key sealed for the boots up to the one whose TPM resetCount is `last`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OneBootKey {
    /// The last resetCount the policy admits ([`RESETS`] past the one at sealing).
    pub last: u32,
    /// The sealed object.
    pub sealed: SealedKey,
}

impl OneBootKey {
    /// Stored form: `last` (u32, big-endian), then the sealed key's.
    pub fn encode(&self) -> Vec<u8> {
        [&self.last.to_be_bytes()[..], &self.sealed.encode()].concat()
    }

    /// Reads the stored form.
    pub fn decode(b: &[u8]) -> Result<OneBootKey, TpmError> {
        let (last, rest) = b
            .split_first_chunk::<4>()
            .ok_or(TpmError::Malformed("one-boot key shorter than its count"))?;
        Ok(OneBootKey {
            last: u32::from_be_bytes(*last),
            sealed: SealedKey::decode(rest)?,
        })
    }
}

/// The TPM's resetCount: how many TPM Resets (boots) it has seen.
pub fn read_reset_count(tpm: &mut dyn Transport) -> Result<u32, TpmError> {
    let rsp = tpm.transact(&Command::new(ST_NO_SESSIONS, CC_READ_CLOCK).finish())?;
    let mut r = wire::check("ReadClock", TpmCc::ReadClock, &rsp)?;
    r.take(usize::from(RESET_COUNT_AT))?;
    r.u32()
}

/// The policy digest of PolicyCounterTimer(resetCount ≤ `last`) from a fresh session (TPM 2.0
/// Part 3, 23.10): `H(0^32 || TPM_CC_PolicyCounterTimer || H(operandB || offset || operation))`.
pub fn reset_policy(last: u32) -> [u8; 32] {
    use ring::digest::{digest, Context, SHA256};
    let mut args = Vec::with_capacity(8);
    args.extend_from_slice(&last.to_be_bytes());
    args.extend_from_slice(&RESET_COUNT_AT.to_be_bytes());
    args.extend_from_slice(&EO_UNSIGNED_LE.to_be_bytes());
    let args = digest(&SHA256, &args);
    let mut ctx = Context::new(&SHA256);
    ctx.update(&[0u8; 32]);
    ctx.update(&CC_POLICY_COUNTER_TIMER.to_be_bytes());
    ctx.update(args.as_ref());
    let mut out = [0u8; 32];
    out.copy_from_slice(ctx.finish().as_ref());
    out
}

/// Seals `key` for this boot and the next [`RESETS`] TPM Resets, under this TPM's storage
/// key, with no PCR: the next boot unseals it whatever Secure Boot state or keys it measured.
pub fn seal_one_boot(tpm: &mut dyn Transport, key: &[u8; KEY_LEN]) -> Result<OneBootKey, TpmError> {
    let last = read_reset_count(tpm)?
        .checked_add(RESETS)
        .ok_or(TpmError::Malformed("TPM resetCount at its end"))?;
    let primary = create_primary(tpm)?;
    let sealed = create_sealed(tpm, primary, key, &reset_policy(last));
    flush(tpm, primary);
    Ok(OneBootKey {
        last,
        sealed: sealed?,
    })
}

/// Unseals a one-boot copy: refused by PolicyCounterTimer once the TPM counted past `last`,
/// by Load on another TPM.
pub fn unseal_one_boot(
    tpm: &mut dyn Transport,
    key: &OneBootKey,
) -> Result<Zeroizing<[u8; KEY_LEN]>, TpmError> {
    let primary = create_primary(tpm)?;
    let object = load(tpm, primary, &key.sealed);
    flush(tpm, primary);
    let object = object?;
    let session = start_policy_session(tpm);
    let out = session.and_then(|s| {
        let out = policy_reset(tpm, s, key.last).and_then(|()| unseal_object(tpm, object, s));
        flush(tpm, s);
        out
    });
    flush(tpm, object);
    out
}

fn policy_reset(tpm: &mut dyn Transport, session: u32, last: u32) -> Result<(), TpmError> {
    let mut c = Command::new(ST_NO_SESSIONS, CC_POLICY_COUNTER_TIMER);
    c.u32(session).sized(&last.to_be_bytes())?;
    c.u16(RESET_COUNT_AT).u16(EO_UNSIGNED_LE);
    let rsp = tpm.transact(&c.finish())?;
    wire::check("PolicyCounterTimer", TpmCc::PolicyCounterTimer, &rsp).map(|_| ())
}
