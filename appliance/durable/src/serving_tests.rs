//! Unit tests of [`super::Serving`]: staging, settling, look-ups, checkpoint and crash recovery.
use super::*;
use crate::engine::Options;
use crate::group_commit::Action;
use crate::sim::{SimDevice, SimRng};
use crate::Mutation;

fn open(dev: SimDevice) -> Serving<SimDevice> {
    let opts = Options {
        data_key: None,
        regions: 2,
        segment_size: 16 * 1024,
        block_size: 512,
        ..Options::default()
    };
    Serving::new(Durable::open(dev, &opts).unwrap().0)
}

/// Executes every action of `log` against the device, as the io_uring worker does.
fn drive(s: &Serving<SimDevice>, log: &mut RegionLog<u64>) -> Settled {
    let mut all = Settled::default();
    while let Some(a) = log.poll_action() {
        let done = match a {
            Action::WriteBatch {
                id, offset, bytes, ..
            } => {
                let ok = s.device().write_at(offset, &bytes).is_ok();
                log.on_write_complete(id, ok).unwrap()
            }
            Action::Flush { id, .. } => {
                let ok = s.device().flush().is_ok();
                log.on_flush_complete(id, ok).unwrap()
            }
        };
        let got = s.settle(done);
        all.acked.extend(got.acked);
        all.failed.extend(got.failed);
    }
    all
}

/// A put of `value` (flags 1, no expiry) with CAS `cas`; the compactor's tests use it too.
pub(crate) fn put<'a>(key: &'a [u8], value: &'a [u8], cas: u64) -> Mutation<'a> {
    Mutation::Put {
        key,
        value,
        flags: 1,
        exptime: 0,
        cas,
        large: false,
    }
}

#[test]
fn staged_writes_are_visible_before_and_after_their_flush() {
    let s = open(SimDevice::new(1 << 20));
    let mut log = s.take_log(0).unwrap();
    assert!(s.take_log(0).is_none(), "a log is driven by one worker");
    s.stage(&mut log, put(b"a", b"1", 5), 1).unwrap();
    s.stage(&mut log, Mutation::Delete { key: b"b" }, 2)
        .unwrap();
    assert_eq!(s.lookup(b"a", 0).unwrap().unwrap().value, b"1", "overlay");
    let got = drive(&s, &mut log);
    assert_eq!(got.acked, vec![1, 2]);
    assert_eq!(s.lookup(b"a", 0).unwrap().unwrap().cas, 5, "index");
    s.stage(&mut log, Mutation::Delete { key: b"a" }, 3)
        .unwrap();
    assert_eq!(
        s.lookup(b"a", 0).unwrap(),
        None,
        "staged delete hides the durable value"
    );
    drive(&s, &mut log);
    assert_eq!(s.lookup(b"a", 0).unwrap(), None);
    s.stage(&mut log, put(b"x", b"old", 6), 4).unwrap();
    s.stage(&mut log, Mutation::FlushAll { at: 100 }, 5)
        .unwrap();
    s.stage(&mut log, put(b"y", b"new", 7), 6).unwrap();
    drive(&s, &mut log);
    assert!(s.lookup(b"x", 99).unwrap().is_some(), "flush not due yet");
    assert_eq!(s.lookup(b"x", 100).unwrap(), None, "flushed");
    assert!(
        s.lookup(b"y", 100).unwrap().is_some(),
        "written after the flush"
    );
    s.park_log(log);
    assert!(s.checkpoint().unwrap());
}

#[test]
fn a_log_parked_with_a_write_unflushed_gets_no_checkpoint() {
    let s = open(SimDevice::new(1 << 20));
    let mut log = s.take_log(0).unwrap();
    s.stage(&mut log, put(b"a", b"1", 5), 1).unwrap();
    s.park_log(log);
    assert!(matches!(s.checkpoint(), Err(DurableError::Unsettled)));
    let s2 = open(SimDevice::from_image(
        s.device().crash_image(&mut SimRng::new(2)),
    ));
    assert_eq!(
        s2.lookup(b"a", 0).unwrap(),
        None,
        "never written, never acked"
    );
}

#[test]
fn checkpoint_and_crash_recovery_keep_values_and_the_flush_mark() {
    let s = open(SimDevice::new(1 << 20));
    let mut log = s.take_log(1).unwrap();
    for i in 0..50u64 {
        s.stage(
            &mut log,
            put(format!("k{i}").as_bytes(), &i.to_le_bytes(), 100 + i),
            i,
        )
        .unwrap();
    }
    s.stage(&mut log, Mutation::FlushAll { at: 1 }, 99).unwrap();
    s.stage(&mut log, put(b"after", b"v", 500), 100).unwrap();
    assert_eq!(drive(&s, &mut log).acked.len(), 52);
    let img = s.device().crash_image(&mut SimRng::new(1));
    let s2 = open(SimDevice::from_image(img));
    assert_eq!(s2.max_cas(), 500);
    let mut seen = Vec::new();
    let (n, bad) = s2.for_each_value(10, |k, _| seen.push(k.to_vec()));
    assert_eq!((n, bad), (1, 0), "only the write after the flush is live");
    assert_eq!(seen, vec![b"after".to_vec()]);
    assert_eq!(
        s2.for_each_value(0, |_, _| {}).0,
        51,
        "before the flush time everything is live"
    );
}

#[test]
fn failed_writes_are_reported_with_their_key_and_leave_the_older_value() {
    let s = open(SimDevice::new(1 << 20));
    let mut log = s.take_log(0).unwrap();
    s.stage(&mut log, put(b"k", b"good", 1), 1).unwrap();
    drive(&s, &mut log);
    s.device().fail_next_flush();
    s.stage(&mut log, put(b"k", b"lost", 2), 2).unwrap();
    let got = drive(&s, &mut log);
    assert!(got.acked.is_empty());
    assert_eq!(got.failed.len(), 1);
    assert_eq!(
        (got.failed[0].0, &*got.failed[0].1, got.failed[0].2),
        (2, &b"k"[..], 2)
    );
    assert_eq!(s.lookup(b"k", 0).unwrap().unwrap().value, b"good");
}

#[test]
fn state_counts_records_and_live_bytes_per_region() {
    let s = open(SimDevice::new(1 << 20));
    let empty = s.state();
    assert_eq!((empty.records, empty.region_live_bytes.len()), (0, 2));
    assert!(empty.region_live_bytes.iter().all(|&b| b == 0));
    let mut log = s.take_log(1).unwrap();
    s.stage(&mut log, put(b"k1", &[7u8; 1000], 1), 1).unwrap();
    s.stage(&mut log, put(b"k2", &[8u8; 1000], 2), 2).unwrap();
    drive(&s, &mut log);
    let state = s.state();
    assert_eq!(state.records, 2);
    assert_eq!(state.region_live_bytes[0], 0, "nothing written to region 0");
    assert!(state.region_live_bytes[1] >= 2000, "{state:?}");
    assert_eq!(state.region_live_segments, [0, 1]);
    assert_eq!((state.corrupt_records, state.uploads), (0, 0));
    assert_eq!(state.geometry.regions, 2);
    s.park_log(log);
}
