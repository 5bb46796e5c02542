//! Marshalling and policy tests, and sealing against a software TPM (`swtpm`) on the host.
use super::*;
use crate::swtpm::SwTpm;

#[test]
fn the_pcr7_policy_digest_is_the_spec_computation() {
    // Computed independently (Python hashlib) from TPM 2.0 Part 3, 23.7.
    assert_eq!(
        hex(&pcr7_policy(&[0u8; 32])),
        "8b5682d81b29435d08d79278150611dc7e5923b2fefcce684a09577b40130a8b"
    );
    let counting: [u8; 32] = std::array::from_fn(|i| u8::try_from(i).unwrap());
    assert_eq!(
        hex(&pcr7_policy(&counting)),
        "ef23ccc71b928bf66889c4390f780400ae6a7a091201becfffd13998660b40e3"
    );
}

#[test]
fn commands_carry_their_size_and_the_pcr7_selection() {
    let mut c = Command::new(ST_NO_SESSIONS, CC_POLICY_PCR);
    c.u32(0x0300_0000).u16(0).bytes(&wire::pcr7_selection());
    let b = c.finish();
    assert_eq!(
        hex(&b),
        "80010000001a0000017f03000000000000000001000b03800000"
    );
    assert_eq!(b.len(), 0x1a);
}

#[test]
fn the_sealed_template_forbids_password_use() {
    let t = sealed_template(&[7u8; 32]);
    let attrs = u32::from_be_bytes([t[4], t[5], t[6], t[7]]);
    assert_eq!(attrs & (1 << 6), 0, "userWithAuth must be clear");
    assert_eq!(attrs & 0x12, 0x12, "fixedTPM and fixedParent");
    assert_eq!(&t[10..42], &[7u8; 32]);
}

#[test]
fn sealed_keys_round_trip_and_refuse_junk() {
    let sealed = SealedKey {
        public: vec![0, 2, 0xAA, 0xBB],
        private: vec![0, 1, 0xCC],
    };
    let b = sealed.encode();
    assert_eq!(SealedKey::decode(&b).unwrap(), sealed);
    assert!(SealedKey::decode(&b[..b.len() - 1]).is_err());
    assert!(SealedKey::decode(&[b.as_slice(), &[0]].concat()).is_err());
    assert!(SealedKey::decode(&vec![0u8; SEALED_MAX + 1]).is_err());
    assert!(SealedKey::decode(&[]).is_err());
}

/// Answers every command with a fixed error, and records what it was sent.
struct Refusing {
    sent: Vec<u32>,
}

impl Transport for Refusing {
    fn transact(&mut self, command: &[u8]) -> Result<Vec<u8>, TpmError> {
        self.sent.push(u32::from_be_bytes([
            command[6], command[7], command[8], command[9],
        ]));
        // TPM_RC_INTEGRITY on parameter 1: what Load answers for another TPM's blob.
        let mut rsp = vec![0x80, 0x01, 0, 0, 0, 10];
        rsp.extend_from_slice(&0x1DFu32.to_be_bytes());
        Ok(rsp)
    }
}

#[test]
fn a_refusal_is_typed_and_names_the_command() {
    let mut tpm = Refusing { sent: Vec::new() };
    let err = unseal(
        &mut tpm,
        &SealedKey {
            public: vec![0, 0],
            private: vec![0, 0],
        },
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            TpmError::Refused {
                command: "CreatePrimary",
                code: 0x1DF,
                ..
            }
        ),
        "{err}"
    );
    assert!(!err.is_policy_failure());
    assert_eq!(tpm.sent, vec![CC_CREATE_PRIMARY]);
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[test]
fn swtpm_seals_unseals_and_refuses_another_pcr7_or_tpm() {
    if !SwTpm::available() {
        return;
    }
    let (dir, other_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut tpm = SwTpm::start(dir.path()).unwrap();
    let key: [u8; 32] = std::array::from_fn(|i| u8::try_from(i * 7).unwrap());
    let sealed = seal(&mut tpm, &key).unwrap();
    let stored = sealed.encode();
    assert!(stored.len() < 400, "{} bytes", stored.len());
    assert!(
        !stored.windows(32).any(|w| w == key),
        "key in clear in the sealed blob"
    );
    let back = SealedKey::decode(&stored).unwrap();
    assert_eq!(*unseal(&mut tpm, &back).unwrap(), key);
    assert_eq!(
        *unseal(&mut tpm, &back).unwrap(),
        key,
        "handles were not flushed"
    );

    // Another TPM: the same blob does not even load.
    let mut other = SwTpm::start(other_dir.path()).unwrap();
    let err = unseal(&mut other, &back).unwrap_err();
    assert!(
        matches!(
            err,
            TpmError::Refused {
                command: "Load",
                ..
            }
        ),
        "{err}"
    );

    // PCR 7 moved (as when Secure Boot is turned off): the policy fails.
    tpm.extend_pcr7().unwrap();
    let err = unseal(&mut tpm, &back).unwrap_err();
    assert!(err.is_policy_failure(), "{err}");
}

#[test]
fn the_reset_count_policy_digest_is_the_spec_computation() {
    // Computed independently (Python hashlib) from TPM 2.0 Part 3, 23.10.
    assert_eq!(
        hex(&one_boot::reset_policy(1)),
        "32aac0a02c5dd86a7d07898a2d31d55f1d7bbe1ec926fab72e9fcef95d66e124"
    );
    assert_eq!(
        hex(&one_boot::reset_policy(0x0102_0304)),
        "e288ef882919dffa48b4618e78ba7bd844fb30da2f98d2d98a8ffc5edf9270e3"
    );
}

#[test]
fn one_boot_keys_round_trip_and_refuse_junk() {
    let key = one_boot::OneBootKey {
        last: 7,
        sealed: SealedKey {
            public: vec![0, 1, 0xAA],
            private: vec![0, 1, 0xBB],
        },
    };
    let b = key.encode();
    assert_eq!(&b[..4], &[0, 0, 0, 7]);
    assert_eq!(one_boot::OneBootKey::decode(&b).unwrap(), key);
    assert!(one_boot::OneBootKey::decode(&b[..3]).is_err());
    assert!(one_boot::OneBootKey::decode(&b[..b.len() - 1]).is_err());
}

/// `data reseal`'s copy: unseals whatever PCR 7 holds, for `RESETS` TPM Resets after it was
/// made and not one more, and on this TPM only.
#[test]
fn swtpm_one_boot_copy_ignores_pcr7_and_is_refused_once_the_tpm_counted_past_it() {
    use one_boot::{read_reset_count, seal_one_boot, unseal_one_boot, RESETS};
    if !SwTpm::available() {
        return;
    }
    let (dir, other_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut tpm = SwTpm::start(dir.path()).unwrap();
    let key: [u8; 32] = std::array::from_fn(|i| u8::try_from(i * 5).unwrap());
    let reset = read_reset_count(&mut tpm).unwrap();
    let copy = seal_one_boot(&mut tpm, &key).unwrap();
    assert_eq!(copy.last, reset + RESETS);
    let stored = copy.encode();
    assert!(!stored.windows(32).any(|w| w == key), "key in clear");
    let copy = one_boot::OneBootKey::decode(&stored).unwrap();
    assert_eq!(*unseal_one_boot(&mut tpm, &copy).unwrap(), key, "same boot");
    let mut other = SwTpm::start(other_dir.path()).unwrap();
    let err = unseal_one_boot(&mut other, &copy).unwrap_err();
    assert!(
        matches!(
            err,
            TpmError::Refused {
                command: "Load",
                ..
            }
        ),
        "{err}"
    );
    drop(other);

    for n in 1..=RESETS {
        tpm = tpm.reboot(dir.path()).unwrap();
        assert_eq!(read_reset_count(&mut tpm).unwrap(), reset + n);
        tpm.extend_pcr7().unwrap();
        assert_eq!(
            *unseal_one_boot(&mut tpm, &copy).unwrap(),
            key,
            "reset {n}, PCR 7 changed"
        );
    }
    let mut tpm = tpm.reboot(dir.path()).unwrap();
    let err = unseal_one_boot(&mut tpm, &copy).unwrap_err();
    assert!(err.is_spent(), "{err}");
}
