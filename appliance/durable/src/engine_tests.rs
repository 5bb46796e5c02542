//! Unit tests of [`super::Durable`]: formatting, crash recovery, checkpoints, damage in
//! acknowledged history, foreign devices, a full device and EIO.
use super::*;
use crate::sim::{SimDevice, SimRng};

fn opts() -> Options {
    Options {
        data_key: None,
        regions: 2,
        segment_size: 16 * 1024,
        block_size: 512,
        ..Options::default()
    }
}

fn open(dev: SimDevice) -> (Durable<SimDevice>, OpenReport) {
    Durable::open(dev, &opts()).unwrap()
}

fn reboot(d: Durable<SimDevice>) -> (Durable<SimDevice>, OpenReport) {
    let img = d.device().crash_image(&mut SimRng::new(7));
    open(SimDevice::from_image(img))
}

#[test]
fn blank_device_is_formatted_and_acked_writes_survive_a_crash() {
    let (mut d, rep) = open(SimDevice::new(1 << 20));
    assert!(rep.formatted);
    d.set(0, b"a", b"one", 5, 0, 100, 1).unwrap();
    d.set(1, b"b", b"two", 0, 0, 101, 2).unwrap();
    assert!(
        d.get(b"a").unwrap().is_none(),
        "not durable before the flush"
    );
    let acks = d.tick();
    assert_eq!(acks.iter().map(|a| a.token).collect::<Vec<_>>(), vec![1, 2]);
    d.delete(1, b"b", 3).unwrap();
    d.tick();
    d.set(0, b"c", b"unacked", 0, 0, 102, 4).unwrap(); // never ticked
    let (d, rep) = reboot(d);
    assert!(!rep.formatted && !rep.from_checkpoint);
    let a = d.get(b"a").unwrap().unwrap();
    assert_eq!((a.value.as_slice(), a.flags, a.cas), (&b"one"[..], 5, 100));
    assert_eq!(d.get(b"b").unwrap(), None);
    assert_eq!(d.get(b"c").unwrap(), None);
    assert_eq!(d.max_cas(), 101);
}

#[test]
fn checkpoint_restores_state_and_is_consumed() {
    let (mut d, _) = open(SimDevice::new(1 << 20));
    for i in 0..200u64 {
        d.set(
            (i % 2) as usize,
            format!("k{i}").as_bytes(),
            &i.to_le_bytes(),
            0,
            0,
            i + 1,
            i,
        )
        .unwrap();
    }
    d.sync();
    d.delete(0, b"k3", 999).unwrap();
    d.sync();
    let (mut d2, _) = reboot(d);
    d2.set(0, b"late", b"x", 0, 0, 500, 1).unwrap();
    let (dev, written) = d2.shutdown().unwrap();
    assert!(written);
    let (mut d3, rep) = open(SimDevice::from_image(dev.crash_image(&mut SimRng::new(3))));
    assert!(rep.from_checkpoint, "{rep:?}");
    assert_eq!(d3.get(b"k7").unwrap().unwrap().value, 7u64.to_le_bytes());
    assert_eq!(d3.get(b"k3").unwrap(), None);
    assert_eq!(d3.get(b"late").unwrap().unwrap().cas, 500);
    assert_eq!(d3.max_cas(), 500);
    // Writing after a checkpoint start, then crashing: the checkpoint must not be reused.
    d3.set(0, b"k7", b"new", 0, 0, 501, 2).unwrap();
    d3.sync();
    let (d4, rep) = reboot(d3);
    assert!(!rep.from_checkpoint);
    assert_eq!(d4.get(b"k7").unwrap().unwrap().value, b"new");
    assert_eq!(d4.get(b"late").unwrap().unwrap().cas, 500);
}

/// Device offset of the first value byte of `key`'s newest record.
fn value_offset(d: &Durable<SimDevice>, key: &[u8]) -> usize {
    let e = d.index().get(key).unwrap();
    let g = d.superblock().geometry;
    usize::try_from(
        g.segment_offset(e.loc.region, e.loc.segment)
            + u64::from(e.loc.offset)
            + crate::record::HEADER_LEN as u64
            + key.len() as u64,
    )
    .unwrap()
}

/// `set k A; set d D; set f F; set k B; delete d`, each acknowledged, then a crash.
fn history() -> (Durable<SimDevice>, usize) {
    let (mut d, _) = open(SimDevice::new(1 << 20));
    for (i, (key, value)) in [("k", "A"), ("d", "D"), ("f", "F")].iter().enumerate() {
        d.set(
            0,
            key.as_bytes(),
            value.as_bytes(),
            0,
            0,
            i as u64 + 1,
            i as u64,
        )
        .unwrap();
        assert_eq!(d.tick().len(), 1);
    }
    let f = value_offset(&d, b"f");
    d.set(0, b"k", b"B", 0, 0, 4, 4).unwrap();
    assert_eq!(d.tick().len(), 1);
    d.delete(0, b"d", 5).unwrap();
    assert_eq!(d.tick().len(), 1);
    (d, f)
}

#[test]
fn a_flipped_byte_in_acknowledged_history_is_reported_not_rolled_back() {
    let (d, f) = history();
    let mut img = d.device().crash_image(&mut SimRng::new(7));
    let (good, _) = open(SimDevice::from_image(img.clone()));
    assert_eq!(good.get(b"k").unwrap().unwrap().value, b"B");
    img[f] ^= 0x20;
    let err = Durable::open(SimDevice::from_image(img.clone()), &opts()).unwrap_err();
    let DurableError::CorruptHistory { region, places, .. } = err else {
        panic!("{err:?}")
    };
    assert_eq!((region, places), (0, 1));
    // Salvage: everything that verifies, also past the damage; f is gone, reported.
    let salvage = Options {
        data_key: None,
        salvage: true,
        ..opts()
    };
    let (s, rep) = Durable::open(SimDevice::from_image(img), &salvage).unwrap();
    assert_eq!(rep.damaged.len(), 1);
    assert_eq!(s.get(b"k").unwrap().unwrap().value, b"B");
    assert_eq!(s.get(b"d").unwrap(), None);
    assert_eq!(s.get(b"f").unwrap(), None);
}

#[test]
fn every_single_byte_flip_of_an_acknowledged_record_is_caught() {
    let (d, f) = history();
    let img = d.device().crash_image(&mut SimRng::new(7));
    // Every byte of f's record (header, key, value), not only its value.
    let start = f - crate::record::HEADER_LEN - 1;
    for at in start..f + 1 {
        let mut bad = img.clone();
        bad[at] ^= 0x01;
        match Durable::open(SimDevice::from_image(bad), &opts()) {
            Err(DurableError::CorruptHistory { .. }) => {}
            other => panic!(
                "flip at {} not reported: {:?}",
                at - start,
                other.map(|o| o.1)
            ),
        }
    }
}

#[test]
fn the_last_record_of_a_segment_is_vouched_for_by_the_next_segment() {
    let (mut d, _) = open(SimDevice::new(1 << 20));
    let value = vec![7u8; 1000];
    let mut n = 0u64;
    let first_segment = loop {
        d.set(0, format!("k{n}").as_bytes(), &value, 0, 0, n + 1, n)
            .unwrap();
        assert_eq!(d.tick().len(), 1);
        let seg = d
            .index()
            .get(format!("k{n}").as_bytes())
            .unwrap()
            .loc
            .segment;
        if n > 0 && seg != d.index().get(b"k0").unwrap().loc.segment {
            break n - 1; // k{n-1} was the last record of the first segment
        }
        n += 1;
    };
    d.set(0, b"after", b"x", 0, 0, 1000, 1000).unwrap();
    assert_eq!(d.tick().len(), 1);
    let last = value_offset(&d, format!("k{first_segment}").as_bytes());
    let mut img = d.device().crash_image(&mut SimRng::new(2));
    img[last + 10] ^= 0x04;
    assert!(matches!(
        Durable::open(SimDevice::from_image(img), &opts()),
        Err(DurableError::CorruptHistory { .. })
    ));
}

#[test]
fn the_last_writes_before_a_crash_are_vouched_for_after_the_restart() {
    let (d, f) = history();
    let (mut d, rep) = reboot(d);
    assert!(rep.damaged.is_empty());
    // Nothing vouches for "delete d" (the last record) yet; the first segment written
    // after the restart names where recovery found the log's end, and once a record of
    // it is acknowledged (the next one's stamp says so) that end is vouched for.
    let tail = value_offset(&d, b"d") - 1; // the tombstone's key byte
    d.set(0, b"new", b"n", 0, 0, 9, 9).unwrap();
    assert_eq!(d.sync().len(), 1);
    d.set(0, b"new2", b"n", 0, 0, 10, 10).unwrap();
    assert_eq!(d.sync().len(), 1);
    let img = d.device().crash_image(&mut SimRng::new(3));
    for at in [f, tail] {
        let mut bad = img.clone();
        bad[at] ^= 0x01;
        assert!(
            matches!(
                Durable::open(SimDevice::from_image(bad), &opts()),
                Err(DurableError::CorruptHistory { .. })
            ),
            "flip at {at}"
        );
    }
}

#[test]
fn a_torn_unacknowledged_tail_is_not_corruption() {
    let (mut d, _) = history();
    d.set(0, b"t", b"never acked", 0, 0, 6, 6).unwrap();
    d.set(0, b"u", b"never acked", 0, 0, 7, 7).unwrap();
    // Write the batch but crash before its flush: what reaches the device is unflushed.
    d.device().crash_after(1);
    d.tick();
    // A crash image where the unflushed batch landed whole (each seed picks its fate).
    let (img, t) = (0..64)
        .find_map(|seed| {
            let img = d.device().crash_image(&mut SimRng::new(seed));
            let hits: Vec<usize> = img
                .windows(11)
                .enumerate()
                .filter(|(_, w)| *w == b"never acked")
                .map(|(i, _)| i)
                .collect();
            (hits.len() == 2).then(|| (img, hits[0]))
        })
        .expect("some crash image holds the unflushed batch");
    for flip in [t, t + 40] {
        let mut torn = img.clone();
        torn[flip] ^= 0x01;
        let (r, rep) = Durable::open(SimDevice::from_image(torn), &opts()).unwrap();
        assert!(rep.damaged.is_empty());
        assert_eq!(r.get(b"k").unwrap().unwrap().value, b"B");
        assert_eq!(r.get(b"d").unwrap(), None);
    }
}

#[test]
fn foreign_and_other_version_devices_are_refused_unless_forced() {
    let mut img = vec![0u8; 1 << 20];
    img[1080..1082].copy_from_slice(&[0x53, 0xEF]);
    let err = Durable::open(SimDevice::from_image(img.clone()), &opts()).unwrap_err();
    assert!(matches!(err, DurableError::ForeignSignature("ext2/3/4")));
    assert!(err.to_string().contains("ext2/3/4"));
    let forced = Options {
        data_key: None,
        force: true,
        ..opts()
    };
    let (d, rep) = Durable::open(SimDevice::from_image(img), &forced).unwrap();
    assert!(rep.formatted);
    let mut img = d.device().crash_image(&mut SimRng::new(1));
    img[8] = 4; // a format version this build does not know
    assert!(matches!(
        Durable::open(SimDevice::from_image(img.clone()), &opts()),
        Err(DurableError::Version {
            found: 4,
            supported: 1
        })
    ));
    assert!(
        Durable::open(SimDevice::from_image(img), &forced)
            .unwrap()
            .1
            .formatted
    );
    let mut junk = vec![0u8; 1 << 20];
    junk[7] = 1;
    assert!(matches!(
        Durable::open(SimDevice::from_image(junk), &opts()),
        Err(DurableError::NotBlank)
    ));
}

#[test]
fn device_full_is_no_space_and_compaction_frees_it() {
    let (mut d, _) = open(SimDevice::new(256 * 1024));
    let value = vec![1u8; 3000];
    let mut n = 0u64;
    let err = loop {
        match d.set(0, b"same", &value, 0, 0, n, n) {
            Ok(_) => {
                n += 1;
                d.tick();
            }
            Err(e) => break e,
        }
    };
    assert!(matches!(err, DurableError::NoSpace));
    let runs = d.maintain(0).unwrap();
    assert!(runs > 0);
    d.set(0, b"same", &value, 0, 0, n, n).unwrap();
    assert!(d.sync().iter().all(|a| a.result.is_ok()));
    assert_eq!(d.get(b"same").unwrap().unwrap().cas, n);
}

#[test]
fn eio_fails_only_the_affected_requests() {
    let (mut d, _) = open(SimDevice::new(1 << 20));
    d.set(0, b"ok", b"1", 0, 0, 1, 1).unwrap();
    assert!(d.tick()[0].result.is_ok());
    let seg0 = d.sb.geometry.segment_offset(0, 0);
    d.device()
        .inject_write_eio(seg0, d.sb.geometry.segment_size);
    d.set(0, b"bad", b"2", 0, 0, 2, 2).unwrap();
    let acks = d.tick();
    assert!(
        matches!(acks[0].result, Err(DurableError::Io { .. })),
        "{acks:?}"
    );
    // The log moves to a fresh segment and keeps working.
    d.set(0, b"after", b"3", 0, 0, 3, 3).unwrap();
    assert!(d.tick()[0].result.is_ok());
    d.device().fail_next_flush();
    d.set(1, b"flushfail", b"4", 0, 0, 4, 4).unwrap();
    assert!(d.tick()[0].result.is_err());
    d.device().clear_faults();
    assert_eq!(d.get(b"after").unwrap().unwrap().value, b"3");
    assert_eq!(d.get(b"bad").unwrap(), None);
    d.device().inject_read_eio(0, 1 << 20);
    assert!(matches!(d.get(b"ok"), Err(DurableError::Io { .. })));
}
