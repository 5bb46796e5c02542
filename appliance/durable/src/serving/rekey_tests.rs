//! `data rekey` (ADR 0055): records of both keys read back, the old key retired once
//! compaction rewrote every segment from before the switch, and a crash at every write and
//! flush of a rekey (and of the rewriting until the retirement) leaves every acknowledged
//! record readable, with exactly one of the two keys opening the device.
use crate::compactor::{run_to_idle, Compactor};
use crate::crypt::DataKey;
use crate::engine::{Durable, Options};
use crate::error::DurableError;
use crate::serving::{drive_sync, Serving};
use crate::sim::{SimDevice, SimRng};
use crate::superblock::{Superblock, FORMAT_VERSION_SEALED, SUPERBLOCK_LEN};
use crate::units::usize_from;
use crate::{Mutation, RegionLog};

fn key(b: u8) -> DataKey {
    DataKey::from_bytes([b; 32])
}

fn opts(k: u8) -> Options {
    Options {
        data_key: Some(key(k)),
        regions: 2,
        segment_size: 16 * 1024,
        block_size: 512,
        ..Options::default()
    }
}

fn value(i: u64, round: u64) -> Vec<u8> {
    format!("secret-value-{i}-{round}-").repeat(8).into_bytes()
}

/// Writes keys `from..to` (round `round`) through the two logs; returns the tokens acked.
fn write(
    s: &Serving<SimDevice>,
    logs: &mut [RegionLog<u64>],
    range: std::ops::Range<u64>,
    round: u64,
) -> Vec<u64> {
    let mut acked = Vec::new();
    for i in range {
        let log = &mut logs[usize_from(i % 2)];
        let v = value(i, round);
        let k = format!("secret-key-{i}");
        let m = Mutation::Put {
            key: k.as_bytes(),
            value: &v,
            flags: 0,
            exptime: 0,
            cas: 1000 * round + i + 1,
            large: false,
        };
        // A crashed device refuses a stage too (nothing is acknowledged then).
        if s.stage(log, m, 1000 * round + i).is_err() {
            continue;
        }
        if let Ok(got) = drive_sync(s, log, |_| {}) {
            acked.extend(got.acked);
        }
    }
    acked
}

fn open(img: &[u8], k: u8) -> Result<Serving<SimDevice>, DurableError> {
    let (d, _) = Durable::open(SimDevice::from_image(img.to_vec()), &opts(k))?;
    Ok(Serving::new(d))
}

fn superblock(img: &[u8]) -> Superblock {
    Superblock::decode(&img[..usize_from(SUPERBLOCK_LEN)], img.len() as u64).unwrap()
}

/// Compaction on both regions until the old key is retired (or `steps` rounds pass).
fn rewrite(s: &Serving<SimDevice>, logs: &mut [RegionLog<u64>], c: &mut [Compactor], steps: usize) {
    for _ in 0..steps {
        for (log, c) in logs.iter_mut().zip(c.iter_mut()) {
            if run_to_idle(c, s, log, 0, 10_000).is_err() {
                return;
            }
        }
        if s.rekey_status().old_key_until_epoch.is_none() || s.device().crashed() {
            return;
        }
    }
}

fn setup(k: u8) -> (Serving<SimDevice>, Vec<RegionLog<u64>>, Vec<Compactor>) {
    let (d, _) = Durable::open(SimDevice::new(1 << 20), &opts(k)).unwrap();
    let s = Serving::new(d);
    let logs: Vec<_> = (0..2).map(|r| s.take_log(r).unwrap()).collect();
    let c = (0..2).map(|_| Compactor::new(512)).collect();
    (s, logs, c)
}

/// Every key `i` reads back with round `round`.
fn check(s: &Serving<SimDevice>, want: &[(u64, u64)]) {
    for &(i, round) in want {
        let got = s.lookup(format!("secret-key-{i}").as_bytes(), 0).unwrap();
        assert_eq!(got.map(|g| g.value), Some(value(i, round)), "key {i}");
    }
}

#[test]
fn records_of_both_keys_read_back_and_the_old_key_is_retired() {
    let (s, mut logs, mut c) = setup(1);
    assert_eq!(write(&s, &mut logs, 0..60, 0).len(), 60);
    let from = s.rekey(key(2), None).unwrap();
    assert!(matches!(s.rekey(key(3), None), Err(DurableError::Rekey(_))));
    assert_eq!(s.rekey_status().old_key_until_epoch, Some(from));
    assert_eq!(write(&s, &mut logs, 40..80, 1).len(), 40);
    let want: Vec<(u64, u64)> = (0..80).map(|i| (i, u64::from(i >= 40))).collect();
    check(&s, &want);
    // A crash now: the old key is refused as replaced, the new one reads both kinds.
    let img = s.device().crash_image(&mut SimRng::new(1));
    assert_eq!(superblock(&img).rekey.map(|r| r.from), Some(from));
    assert!(matches!(open(&img, 1), Err(DurableError::KeyReplaced)));
    assert!(matches!(open(&img, 3), Err(DurableError::WrongKey)));
    check(&open(&img, 2).unwrap(), &want);
    rewrite(&s, &mut logs, &mut c, 20);
    let st = s.rekey_status();
    assert_eq!((st.old_key_until_epoch, st.retired), (None, 1), "{st:?}");
    assert!(!s.crypt().unwrap().has_old_key());
    check(&s, &want);
    // Retired: version 2 again, and a new key alone recovers everything by scanning (a
    // segment left with a record under the old key would be damage and refuse the open).
    let img = s.device().crash_image(&mut SimRng::new(2));
    let sb = superblock(&img);
    assert!(sb.rekey.is_none());
    assert_eq!(
        u32::from_le_bytes(img[8..12].try_into().unwrap()),
        FORMAT_VERSION_SEALED
    );
    assert!(matches!(open(&img, 1), Err(DurableError::WrongKey)));
    let again = open(&img, 2).unwrap();
    check(&again, &want);
    assert!(
        !img.windows(13).any(|w| w == b"secret-value-"),
        "plaintext on the device"
    );
    // A second rekey after the first retired is allowed.
    assert!(again.rekey(key(3), None).is_ok());
    assert!(matches!(
        again.rekey(key(3), None),
        Err(DurableError::Rekey(_))
    ));
}

#[test]
fn a_rekey_to_the_key_in_use_or_on_a_clear_device_is_refused() {
    let (s, _, _) = setup(1);
    assert!(matches!(s.rekey(key(1), None), Err(DurableError::Rekey(_))));
    let clear = Options {
        data_key: None,
        ..opts(1)
    };
    let (d, _) = Durable::open(SimDevice::new(1 << 20), &clear).unwrap();
    assert!(matches!(
        Serving::new(d).rekey(key(2), None),
        Err(DurableError::Rekey(_))
    ));
}

/// One run: writes, a rekey, more writes, rewriting until retired, with the power lost
/// after `crash_at` device operations. Returns whether the crash came before the end.
fn crash_run(crash_at: u64, seed: u64) -> bool {
    let (s, mut logs, mut c) = setup(1);
    let mut acked = write(&s, &mut logs, 0..30, 0);
    s.device().crash_after(crash_at);
    let _ = s.rekey(key(2), None);
    acked.extend(write(&s, &mut logs, 20..40, 1));
    rewrite(&s, &mut logs, &mut c, 20);
    let crashed = s.device().crashed();
    if !crashed {
        assert_eq!(
            s.rekey_status().retired,
            1,
            "the run without a crash retires the old key"
        );
    }
    let img = s.device().crash_image(&mut SimRng::new(seed));
    // Exactly one key opens the device: the old one until the switch is durable.
    let (new, old) = (open(&img, 2), open(&img, 1));
    assert!(
        new.is_ok() != old.is_ok(),
        "crash at {crash_at}: new {:?}, old {:?}",
        new.as_ref().err(),
        old.as_ref().err()
    );
    let s = new.or(old).unwrap();
    for i in 0..40u64 {
        let got = s
            .lookup(format!("secret-key-{i}").as_bytes(), 0)
            .unwrap()
            .map(|g| g.value);
        // Acknowledged: that value or a later one; a write not acknowledged may or may not be
        // there.
        let ok = if acked.contains(&(1000 + i)) {
            got == Some(value(i, 1))
        } else if acked.contains(&i) {
            got == Some(value(i, 0)) || (i >= 20 && got == Some(value(i, 1)))
        } else {
            got.is_none() || got == Some(value(i, 1))
        };
        assert!(ok, "crash at {crash_at}: key {i}: {got:?}");
    }
    crashed
}

#[test]
fn a_crash_at_every_step_of_a_rekey_loses_no_acknowledged_record() {
    let mut at = 0;
    while crash_run(at, at) {
        at += 1;
        assert!(at < 5_000, "the run never ends");
    }
    assert!(at > 20, "only {at} crash points");
}

#[test]
fn on_the_appliance_the_new_keys_tpm_sealed_copy_goes_to_the_other_area() {
    use crate::superblock::{sealed_key_check, sealed_key_in, set_sealed_key};
    // PID 1 wrote the first key's sealed copy before the format (ADR 0053).
    let mut img = vec![0u8; 1 << 20];
    set_sealed_key(&mut img[..4096], b"sealed-1").unwrap();
    let (d, _) = Durable::open(SimDevice::from_image(img), &opts(1)).unwrap();
    let s = Serving::new(d);
    let mut logs: Vec<_> = (0..2).map(|r| s.take_log(r).unwrap()).collect();
    let mut c: Vec<_> = (0..2).map(|_| Compactor::new(512)).collect();
    write(&s, &mut logs, 0..20, 0);
    let uuid = s.superblock().uuid;
    s.rekey(key(2), Some(b"sealed-2")).unwrap();
    let img = s.device().crash_image(&mut SimRng::new(3));
    assert_eq!(sealed_key_in(&img, 0), Some(&b"sealed-1"[..]));
    assert_eq!(sealed_key_in(&img, 1), Some(&b"sealed-2"[..]));
    assert_eq!(sealed_key_check(&img, 1), Some(key(2).check_value(&uuid)));
    rewrite(&s, &mut logs, &mut c, 20);
    assert_eq!(s.rekey_status().retired, 1);
    let img = s.device().crash_image(&mut SimRng::new(4));
    assert_eq!(
        sealed_key_in(&img, 0),
        None,
        "the old key's sealed copy is gone"
    );
    assert_eq!(sealed_key_in(&img, 1), Some(&b"sealed-2"[..]));
    // The next rekey takes the free area again.
    s.rekey(key(3), Some(b"sealed-3")).unwrap();
    let img = s.device().crash_image(&mut SimRng::new(5));
    assert_eq!(sealed_key_in(&img, 0), Some(&b"sealed-3"[..]));
    assert_eq!(sealed_key_check(&img, 0), Some(key(3).check_value(&uuid)));
    assert_eq!(sealed_key_in(&img, 1), Some(&b"sealed-2"[..]));
    check(
        &open(&img, 3).unwrap(),
        &(0..20).map(|i| (i, 0)).collect::<Vec<_>>(),
    );
}
