//! `data reseal` (ADR 0053): the one-boot copy goes into the area the key in use is not in,
//! never beside a rekey's two keys; a rekey waits for it; a crash in its write leaves the key
//! in use's sealed copy whole, and the device opens with the key in use.
use crate::crypt::DataKey;
use crate::engine::{Durable, Options};
use crate::serving::Serving;
use crate::sim::{SimDevice, SimRng};
use crate::superblock::{one_boot_key, sealed_key_for, sealed_key_in, set_sealed_key};

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

/// A device formatted with key 1, whose TPM-sealed copy PID 1 wrote before the format.
fn appliance() -> Serving<SimDevice> {
    let mut img = vec![0u8; 1 << 20];
    set_sealed_key(&mut img[..4096], b"sealed-1").unwrap();
    let (d, _) = Durable::open(SimDevice::from_image(img), &opts(1)).unwrap();
    Serving::new(d)
}

fn one_boot_copy(k: &[u8; 32]) -> Result<Vec<u8>, String> {
    Ok([b"one-boot:".as_slice(), &k[..4]].concat())
}

#[test]
fn the_one_boot_copy_goes_beside_the_key_in_use_and_is_cancelled() {
    let s = appliance();
    let uuid = s.superblock().uuid;
    assert!(!s.reseal_pending().unwrap());
    let mut sealed_with = None;
    s.reseal(&mut |k| {
        sealed_with = Some(*k);
        one_boot_copy(k)
    })
    .unwrap();
    assert_eq!(
        sealed_with,
        Some([1; 32]),
        "the key in use is what is sealed"
    );
    let img = s.device().crash_image(&mut SimRng::new(1));
    let (area, copy, check) = one_boot_key(&img).unwrap();
    assert_eq!((area, copy), (1, &b"one-boot:\x01\x01\x01\x01"[..]));
    assert_eq!(check, key(1).check_value(&uuid));
    assert_eq!(sealed_key_in(&img, 0), Some(&b"sealed-1"[..]));
    assert!(s.reseal_pending().unwrap());
    // Again: replaced, still one.
    s.reseal(&mut one_boot_copy).unwrap();
    // A rekey would put its new key where the copy is: refused until it is spent or cancelled.
    let err = s.rekey(key(2), Some(b"sealed-2")).unwrap_err();
    assert!(err.to_string().contains("data reseal"), "{err}");
    assert!(s.reseal_cancel().unwrap());
    assert!(!s.reseal_cancel().unwrap(), "nothing left to cancel");
    let img = s.device().crash_image(&mut SimRng::new(2));
    assert_eq!(one_boot_key(&img), None);
    assert_eq!(sealed_key_in(&img, 0), Some(&b"sealed-1"[..]));
    // A failed seal writes nothing.
    let err = s.reseal(&mut |_| Err("TPM gone".into())).unwrap_err();
    assert!(err.to_string().contains("TPM gone"), "{err}");
    assert!(!s.reseal_pending().unwrap());
}

#[test]
fn a_reseal_is_refused_during_a_rekey_and_without_a_sealed_copy() {
    let s = appliance();
    {
        // Write one record so the rekey has an epoch to move past.
        s.rekey(key(2), Some(b"sealed-2")).unwrap();
    }
    let err = s.reseal(&mut one_boot_copy).unwrap_err();
    assert!(err.to_string().contains("rekey"), "{err}");
    // `serve --data-key`: no TPM-sealed copy at all.
    let (d, _) = Durable::open(SimDevice::new(1 << 20), &opts(1)).unwrap();
    let err = Serving::new(d).reseal(&mut one_boot_copy).unwrap_err();
    assert!(err.to_string().contains("no TPM-sealed copy"), "{err}");
}

/// Power lost at each write and flush of a reseal and of its cancel, with every fate of the
/// unflushed writes: the key in use's sealed copy is always whole and the device opens with
/// the key in use; the one-boot copy is there whole or not at all.
#[test]
fn a_crash_in_a_reseal_never_touches_the_key_in_use() {
    for at in 0..4 {
        for seed in 0..16 {
            let s = appliance();
            s.reseal(&mut one_boot_copy).unwrap();
            s.device().crash_after(at);
            let _ = s.reseal_cancel();
            let _ = s.reseal(&mut one_boot_copy);
            let img = s.device().crash_image(&mut SimRng::new(seed));
            let sb = &img[..4096];
            assert_eq!(
                sealed_key_for(sb, Some(key(1).check_value(&s.superblock().uuid))),
                Some(&b"sealed-1"[..])
            );
            if let Some((area, copy, _)) = one_boot_key(sb) {
                assert_eq!((area, copy), (1, &b"one-boot:\x01\x01\x01\x01"[..]));
            }
            let (d, _) = Durable::open(SimDevice::from_image(img), &opts(1)).unwrap();
            drop(d);
        }
    }
}
