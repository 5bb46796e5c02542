//! Unit tests of a device opened with a data key (ADR 0050): nothing in clear, the key check
//! (wrong key, no key, key for a clear device: refused with the device byte for byte as it
//! was), the epoch raised at each open, and sealed records through crash recovery, the
//! checkpoint, compaction and large objects.
use super::*;
use crate::crypt::DataKey;
use crate::sim::{SimDevice, SimRng};
use crate::superblock::{Superblock, SUPERBLOCK_LEN};
use crate::units::usize_from;

fn key(b: u8) -> Option<DataKey> {
    Some(DataKey::from_bytes([b; 32]))
}

fn opts(data_key: Option<DataKey>) -> Options {
    Options {
        data_key,
        regions: 2,
        segment_size: 16 * 1024,
        block_size: 512,
        ..Options::default()
    }
}

fn crash(d: &Durable<SimDevice>) -> Vec<u8> {
    d.device().crash_image(&mut SimRng::new(11))
}

fn contains(img: &[u8], what: &[u8]) -> bool {
    img.windows(what.len()).any(|w| w == what)
}

fn epoch(img: &[u8]) -> u32 {
    let sb = Superblock::decode(&img[..usize_from(SUPERBLOCK_LEN)], img.len() as u64).unwrap();
    sb.epoch(img).0
}

/// Writes `n` keys `secret-key-i` with values `secret-value-i`, acked.
fn fill(d: &mut Durable<SimDevice>, n: u64) {
    for i in 0..n {
        let k = format!("secret-key-{i}");
        let v = format!("secret-value-{i}").repeat(20);
        d.set(
            (i % 2) as usize,
            k.as_bytes(),
            v.as_bytes(),
            3,
            0,
            100 + i,
            i,
        )
        .unwrap();
    }
    d.tick();
}

fn check(d: &Durable<SimDevice>, n: u64) {
    for i in 0..n {
        let got = d
            .get(format!("secret-key-{i}").as_bytes())
            .unwrap()
            .unwrap();
        let want = format!("secret-value-{i}").repeat(20);
        assert_eq!(
            (got.value.as_slice(), got.flags, got.cas),
            (want.as_bytes(), 3, 100 + i)
        );
    }
}

#[test]
fn a_sealed_device_shows_nothing_in_clear_and_recovers_by_scan_and_checkpoint() {
    let (mut d, rep) = Durable::open(SimDevice::new(1 << 20), &opts(key(1))).unwrap();
    assert!(rep.formatted && d.crypt().is_some());
    assert!(d.superblock().key_check.is_some());
    fill(&mut d, 40);
    let img = crash(&d);
    assert!(!contains(&img, b"secret"), "a key or value in clear");
    assert_eq!(epoch(&img), 1);
    // Crash recovery by scanning.
    let (mut d, rep) = Durable::open(SimDevice::from_image(img), &opts(key(1))).unwrap();
    assert!(!rep.from_checkpoint && rep.live_objects == 40);
    check(&d, 40);
    // Compaction rewrites records under new nonces; then a clean shutdown seals the checkpoint.
    fill(&mut d, 40);
    d.maintain(0).unwrap();
    while d.compact(0).unwrap().is_some() {}
    check(&d, 40);
    let (dev, written) = d.shutdown().unwrap();
    assert!(written);
    let img = dev.crash_image(&mut SimRng::new(1));
    assert!(
        !contains(&img, b"secret"),
        "the checkpoint holds keys in clear"
    );
    let (d, rep) = Durable::open(SimDevice::from_image(img), &opts(key(1))).unwrap();
    assert!(rep.from_checkpoint);
    check(&d, 40);
    assert_eq!(epoch(&crash(&d)), 3);
}

#[test]
fn wrong_key_no_key_and_key_for_a_clear_device_are_refused_untouched() {
    let (mut d, _) = Durable::open(SimDevice::new(1 << 20), &opts(key(1))).unwrap();
    fill(&mut d, 10);
    let sealed = crash(&d);
    for (k, want) in [(key(2), "wrong"), (None, "encrypted")] {
        let dev = std::sync::Arc::new(SimDevice::from_image(sealed.clone()));
        let err = Durable::open(dev.clone(), &opts(k)).unwrap_err();
        assert!(
            matches!(err, DurableError::WrongKey | DurableError::KeyMissing),
            "{err}"
        );
        assert!(err.to_string().contains(want), "{err}");
        // Refused before any write: the device is the same, byte for byte.
        assert_eq!(dev.counts().0, 0, "a refused open wrote");
        assert_eq!(dev.crash_image(&mut SimRng::new(2)), sealed);
    }
    let (mut d, _) = Durable::open(SimDevice::new(1 << 20), &opts(None)).unwrap();
    fill(&mut d, 10);
    let clear = crash(&d);
    assert!(contains(&clear, b"secret-key-3"));
    let dev = SimDevice::from_image(clear.clone());
    assert!(matches!(
        Durable::open(dev, &opts(key(1))),
        Err(DurableError::KeyUnexpected)
    ));
}

#[test]
fn a_torn_sealed_record_is_a_torn_tail_and_a_flip_in_history_is_damage() {
    let (mut d, _) = Durable::open(SimDevice::new(1 << 20), &opts(key(1))).unwrap();
    // Two batches: the second one's stamps say the first was durable (ADR 0016).
    fill(&mut d, 6);
    fill(&mut d, 6);
    let img = crash(&d);
    let (good, _) = Durable::open(SimDevice::from_image(img.clone()), &opts(key(1))).unwrap();
    check(&good, 6);
    let g = d.superblock().geometry;
    // The first record of region 0's first segment in use: later records vouch for it.
    let base = usize_from(g.segment_offset(0, 0)) + g.block_size as usize;
    assert_eq!(&img[base..base + 4], b"RSE1");
    // Every byte of the record: clear framing (magic, crc, stamp, lengths, nonce), ciphertext
    // and tag. The tag is checked where the crc is, so each flip is damage, never skipped.
    let len = crate::record::sealed_len(12, "secret-value-0".len() * 20);
    assert_eq!(&img[base + len..base + len + 4], b"RSE1");
    // (The pad to 8 after the tag is no part of the record, as in a clear one.)
    let covered = crate::record::HEADER_LEN + 40 + 12 + "secret-value-0".len() * 20 + 16;
    for at in base..base + covered {
        let mut bad = img.clone();
        bad[at] ^= 0x04;
        let dev = std::sync::Arc::new(SimDevice::from_image(bad));
        match Durable::open(dev.clone(), &opts(key(1))) {
            Err(DurableError::CorruptHistory { .. }) => {}
            other => panic!("flip at {} not found: {:?}", at - base, other.map(|o| o.1)),
        }
        // Refused with the device untouched: not even the epoch was raised.
        assert_eq!(dev.counts().0, 0, "a refused open wrote");
    }
}

#[test]
fn a_tpm_sealed_key_written_ahead_of_the_format_survives_format_and_opens() {
    use crate::superblock::{probe, sealed_key, set_sealed_key, Probe, SEALED_KEY_MAX};
    let blob: Vec<u8> = (0..300u32).map(|i| (i % 251) as u8).collect();
    let mut img = vec![0u8; 1 << 20];
    set_sealed_key(&mut img[..4096], &blob).unwrap();
    assert_eq!(
        probe(&img[..8192]),
        Probe::Blank,
        "a waiting sealed key is still blank"
    );
    let (mut d, rep) = Durable::open(SimDevice::from_image(img), &opts(key(4))).unwrap();
    assert!(rep.formatted);
    fill(&mut d, 4);
    let img = crash(&d);
    assert_eq!(sealed_key(&img[..4096]), Some(blob.as_slice()));
    // Reopening raises the epoch in the same block: the sealed key stays.
    let (d, _) = Durable::open(SimDevice::from_image(img), &opts(key(4))).unwrap();
    check(&d, 4);
    let img = crash(&d);
    assert_eq!(sealed_key(&img[..4096]), Some(blob.as_slice()));
    assert_eq!(epoch(&img), 2);
    // A damaged area is no sealed key, and a device with only junk there is not blank.
    let mut bad = vec![0u8; 8192];
    set_sealed_key(&mut bad[..4096], &blob).unwrap();
    bad[2100] ^= 1;
    assert_eq!(sealed_key(&bad), None);
    assert_eq!(probe(&bad), Probe::Unknown);
    assert!(set_sealed_key(&mut bad[..4096], &vec![0; SEALED_KEY_MAX + 1]).is_err());
}

#[test]
fn a_format_without_a_key_drops_a_sealed_key_area() {
    let mut img = vec![0u8; 1 << 20];
    crate::superblock::set_sealed_key(&mut img[..4096], b"sealed").unwrap();
    let (d, _) = Durable::open(SimDevice::from_image(img), &opts(None)).unwrap();
    assert_eq!(crate::superblock::sealed_key(&crash(&d)[..4096]), None);
}
