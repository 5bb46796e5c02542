//! Tests of the serving-time compactor: bounded steps, live records moved, space given back.

use super::*;
use crate::engine::{Durable, Options};
use crate::region::SegState;
use crate::serving::drive_sync;
use crate::serving::tests::put;
use crate::sim::{SimDevice, SimRng};
use crate::Mutation;
use crate::SPACE_FACTOR;

fn opts() -> Options {
    Options {
        data_key: None,
        regions: 1,
        segment_size: 16 * 1024,
        block_size: 512,
        ..Options::default()
    }
}

fn used(log: &RegionLog<u64>, seg: u64) -> u64 {
    log.segments()
        .filter(|(_, st, _)| *st != SegState::Free)
        .count() as u64
        * seg
}

#[test]
fn overwrites_far_beyond_the_device_stay_within_the_space_bound() {
    let s = Serving::new(
        Durable::open(SimDevice::new(512 * 1024), &opts())
            .unwrap()
            .0,
    );
    let g = s.superblock().geometry;
    let mut log = s.take_log(0).unwrap();
    let mut c = Compactor::new(g.block_size);
    let value = |k: u64, round: u64| {
        vec![u8::try_from((k + round) % 256).unwrap(); 200 + (usize::try_from(k).unwrap() % 7)]
    };
    let mut written = 0u64;
    let mut token = 0;
    for round in 0..600u64 {
        for k in 0..32u64 {
            token += 1;
            let key = format!("key{k}");
            let v = value(k, round);
            s.stage(
                &mut log,
                Mutation::Put {
                    key: key.as_bytes(),
                    value: &v,
                    flags: 0,
                    exptime: 0,
                    cas: token,
                    large: false,
                },
                token,
            )
            .unwrap_or_else(|e| panic!("round {round} key {k}: {e}"));
            written += v.len() as u64;
        }
        // Deleting and re-creating a key leaves tombstones to forget.
        token += 1;
        s.stage(&mut log, Mutation::Delete { key: b"gone" }, token)
            .unwrap();
        token += 1;
        s.stage(
            &mut log,
            Mutation::Put {
                key: b"gone",
                value: b"back",
                flags: 0,
                exptime: 0,
                cas: token,
                large: false,
            },
            token,
        )
        .unwrap();
        let got = drive_sync(&s, &mut log, |_| {}).unwrap();
        assert!(got.failed.is_empty());
        run_to_idle(&mut c, &s, &mut log, 0, 10_000).unwrap();
        let live = s.read_index().total_live();
        assert!(
            used(&log, g.segment_size) <= SPACE_FACTOR * live + 2 * g.segment_size,
            "round {round}: used {} live {live}",
            used(&log, g.segment_size)
        );
    }
    let device_bytes = u64::from(g.segments_per_region) * g.segment_size;
    assert!(
        written > 8 * device_bytes,
        "wrote {written} through a {device_bytes} byte region"
    );
    let st = c.stats();
    assert!(st.freed > 100 && st.aborted == 0, "{st:?}");
    let state = s.state();
    assert_eq!(
        (state.compactions, state.compactions_aborted),
        (st.freed, 0),
        "the console's `data` counts what the compactor did"
    );
    for k in 0..32u64 {
        assert_eq!(
            s.lookup(format!("key{k}").as_bytes(), 0)
                .unwrap()
                .unwrap()
                .value,
            value(k, 599)
        );
    }
    // Everything survives a crash: the erased segments left nothing that recovery resurrects.
    let img = s.device().crash_image(&mut SimRng::new(5));
    let (d, _) = Durable::open(SimDevice::from_image(img), &opts()).unwrap();
    for k in 0..32u64 {
        assert_eq!(
            d.get(format!("key{k}").as_bytes()).unwrap().unwrap().value,
            value(k, 599)
        );
    }
    assert_eq!(d.get(b"gone").unwrap().unwrap().value, b"back");
}

#[test]
fn deleted_keys_stay_deleted_after_their_tombstones_are_compacted() {
    let s = Serving::new(
        Durable::open(SimDevice::new(512 * 1024), &opts())
            .unwrap()
            .0,
    );
    let g = s.superblock().geometry;
    let mut log = s.take_log(0).unwrap();
    let mut c = Compactor::new(g.block_size);
    let big = vec![9u8; 1000];
    let mut token = 0;
    for i in 0..200u64 {
        token += 1;
        s.stage(
            &mut log,
            Mutation::Put {
                key: format!("d{i}").as_bytes(),
                value: &big,
                flags: 0,
                exptime: 0,
                cas: token,
                large: false,
            },
            token,
        )
        .unwrap();
        drive_sync(&s, &mut log, |_| {}).unwrap();
        run_to_idle(&mut c, &s, &mut log, 0, 10_000).unwrap();
        if i >= 10 {
            token += 1;
            s.stage(
                &mut log,
                Mutation::Delete {
                    key: format!("d{}", i - 10).as_bytes(),
                },
                token,
            )
            .unwrap();
        }
    }
    drive_sync(&s, &mut log, |_| {}).unwrap();
    for _ in 0..4 {
        log.seal();
        run_to_idle(&mut c, &s, &mut log, 0, 10_000).unwrap();
    }
    assert!(
        s.read_index().len() < 150,
        "tombstones forgotten: {}",
        s.read_index().len()
    );
    let img = s.device().crash_image(&mut SimRng::new(9));
    let (d, _) = Durable::open(SimDevice::from_image(img), &opts()).unwrap();
    for i in 0..190u64 {
        assert_eq!(
            d.get(format!("d{i}").as_bytes()).unwrap(),
            None,
            "d{i} came back"
        );
    }
    for i in 190..200u64 {
        assert_eq!(
            d.get(format!("d{i}").as_bytes()).unwrap().unwrap().value,
            big
        );
    }
}

#[test]
fn segments_with_records_in_flight_are_not_compacted() {
    let s = Serving::new(
        Durable::open(SimDevice::new(512 * 1024), &opts())
            .unwrap()
            .0,
    );
    let g = s.superblock().geometry;
    let mut log = s.take_log(0).unwrap();
    let mut c = Compactor::new(g.block_size);
    let v = vec![3u8; 900];
    // Fill several segments without letting any write complete: sealed segments whose
    // records are not in the index yet look dead, and must not be erased.
    for i in 0..100u64 {
        s.stage(
            &mut log,
            Mutation::Put {
                key: format!("f{i}").as_bytes(),
                value: &v,
                flags: 0,
                exptime: 0,
                cas: i + 1,
                large: false,
            },
            i + 1,
        )
        .unwrap();
    }
    assert!(
        log.segments()
            .filter(|(_, st, _)| *st == SegState::Sealed)
            .count()
            >= 3
    );
    for _ in 0..100 {
        match c.step(&s, &mut log, 0, 0, true) {
            Step::Read { offset, .. } => c.read_sync(s.device(), offset, 0),
            Step::Erase { offset } => {
                s.device().write_at(offset, c.erase_block()).unwrap();
                c.on_erased(&s, &mut log, true, 0);
            }
            _ => {}
        }
    }
    assert_eq!(c.stats().freed, 0);
    let got = drive_sync(&s, &mut log, |r| c.on_relocated(r)).unwrap();
    assert_eq!(got.acked.len(), 100);
    for i in 0..100u64 {
        assert_eq!(
            s.lookup(format!("f{i}").as_bytes(), 0)
                .unwrap()
                .unwrap()
                .value,
            v,
            "f{i}"
        );
    }
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one scripted sequence of reads, failures and retries, each step checked: it reads in order"
)]
fn reads_are_requested_and_a_failed_or_short_read_gives_up_until_the_retry() {
    let o = Options {
        data_key: None,
        segment_size: 2 * READ_CHUNK as u64,
        ..opts()
    };
    let s = Serving::new(
        Durable::open(SimDevice::new(32 * READ_CHUNK), &o)
            .unwrap()
            .0,
    );
    let g = s.superblock().geometry;
    assert!(
        usize::try_from(g.segment_size).unwrap() > READ_CHUNK,
        "two reads per victim"
    );
    let mut log = s.take_log(0).unwrap();
    let mut c = Compactor::new(g.block_size);
    let value = |k: u64, round: u64| {
        vec![u8::try_from((k * 7 + round) % 256).unwrap(); 12_000 + usize::try_from(k).unwrap()]
    };
    let (mut token, mut round) = (0, 0);
    // Overwrite until a victim is worth compacting: its first read is asked for.
    let (offset, len) = loop {
        assert!(round < 100, "no compaction started");
        for k in 0..64u64 {
            token += 1;
            let v = value(k, round);
            let key = format!("r{k}");
            let change = Mutation::Put {
                key: key.as_bytes(),
                value: &v,
                flags: 0,
                exptime: 0,
                cas: token,
                large: false,
            };
            s.stage(&mut log, change, token).unwrap();
        }
        assert!(drive_sync(&s, &mut log, |_| {}).unwrap().failed.is_empty());
        round += 1;
        match c.step(&s, &mut log, 0, 0, true) {
            Step::Idle => continue,
            Step::Busy => {} // picked a victim
            other => panic!("round {round}: {other:?}"),
        }
        match c.step(&s, &mut log, 0, 0, true) {
            Step::Read { offset, len } => break (offset, len),
            other => panic!("round {round}: {other:?}"),
        }
    };
    let last = round - 1;
    let check = |s: &Serving<SimDevice>, ctx: &str| {
        for k in 0..64u64 {
            let got = s.lookup(format!("r{k}").as_bytes(), 0).unwrap();
            assert_eq!(got.unwrap().value, value(k, last), "{ctx}: r{k}");
        }
    };
    assert_eq!(len, READ_CHUNK);
    assert_eq!((offset - g.segment_offset(0, 0)) % g.segment_size, 0);
    assert_eq!(c.read_buf().len(), len);
    // One read at a time: while it is in flight there is nothing to step.
    assert_eq!(c.step(&s, &mut log, 0, 0, true), Step::Waiting);
    assert!(!c.is_idle());

    // A failed read: given up, retried only after RETRY_MS.
    c.on_read(Err(()), 10);
    assert!(c.is_idle());
    assert_eq!(c.stats().aborted, 1);
    assert!(c.read_buf().is_empty());
    assert_eq!(c.step(&s, &mut log, 0, 10 + RETRY_MS - 1, true), Step::Idle);
    let now = 10 + RETRY_MS;
    assert_eq!(c.step(&s, &mut log, 0, now, true), Step::Busy);
    assert_eq!(
        c.step(&s, &mut log, 0, now, true),
        Step::Read { offset, len },
        "retried from the start"
    );
    // The first chunk arrives, the second is asked for and comes back short.
    c.read_sync(s.device(), offset, now);
    assert_eq!(c.stats().aborted, 1);
    let second = c.step(&s, &mut log, 0, now, true);
    let rest = usize::try_from(g.segment_size).unwrap() - READ_CHUNK;
    assert_eq!(
        second,
        Step::Read {
            offset: offset + READ_CHUNK as u64,
            len: rest.min(READ_CHUNK)
        }
    );
    c.on_read(Ok(rest.min(READ_CHUNK) - 1), now);
    assert!(c.is_idle());
    assert_eq!(c.stats().aborted, 2);
    assert_eq!(c.stats().copied, 0);
    // The Serving's count (the console's `data`) catches up at the next step.
    c.step(&s, &mut log, 0, now, false);
    assert_eq!(s.state().compactions_aborted, 2);
    // A completion nobody asked for is ignored.
    c.on_read(Ok(len), now);
    assert!(c.is_idle());
    check(&s, "after the aborts");

    // The retry succeeds, driven by hand like the worker: reads, copies, erase.
    let now = now + RETRY_MS;
    let mut reads = 0;
    for _ in 0..10_000 {
        match c.step(&s, &mut log, 0, now, true) {
            Step::Idle => break,
            Step::Busy | Step::Waiting => {}
            Step::Read { offset, len } => {
                reads += 1;
                let buf = c.read_buf();
                assert_eq!(buf.len(), len);
                s.device().read_at(offset, buf).unwrap();
                c.on_read(Ok(len), now);
            }
            Step::Erase { offset } => {
                s.device().write_at(offset, c.erase_block()).unwrap();
                s.device().flush().unwrap();
                c.on_erased(&s, &mut log, true, now);
            }
        }
        drive_sync(&s, &mut log, |r| c.on_relocated(r)).unwrap();
    }
    let st = c.stats();
    assert!(st.freed >= 1 && st.aborted == 2, "{st:?}");
    assert!(reads >= 2, "{reads} reads");
    check(&s, "after the compaction");
    let img = s.device().crash_image(&mut SimRng::new(3));
    let (d, _) = Durable::open(SimDevice::from_image(img), &o).unwrap();
    for k in 0..64u64 {
        let got = d.get(format!("r{k}").as_bytes()).unwrap();
        assert_eq!(got.unwrap().value, value(k, last), "after a crash: r{k}");
    }
}

/// A delete's tombstone outlives the last older value of its key while a write of the key
/// staged before the delete is still in flight in another region: otherwise that write
/// settles into an empty entry and the deleted key comes back (found by `tests/eviction.rs`).
#[test]
fn a_tombstone_stays_while_an_older_write_of_its_key_is_in_flight_elsewhere() {
    let o = Options {
        data_key: None,
        regions: 2,
        ..opts()
    };
    let s = Serving::new(Durable::open(SimDevice::new(512 * 1024), &o).unwrap().0);
    let g = s.superblock().geometry;
    let (mut log0, mut log1) = (s.take_log(0).unwrap(), s.take_log(1).unwrap());
    let mut c = Compactor::new(g.block_size);
    let put = |key: &'static [u8], value: &'static [u8], cas| Mutation::Put {
        key,
        value,
        flags: 0,
        exptime: 0,
        cas,
        large: false,
    };
    s.stage(&mut log0, put(b"k", b"v1", 1), 1).unwrap();
    for t in 2..100 {
        // Overwrites of another key: the segment holding v1 becomes almost all dead.
        s.stage(&mut log0, put(b"junk", &[0; 1000], t), t).unwrap();
    }
    drive_sync(&s, &mut log0, |_| {}).unwrap();
    // v2 is staged (sequence below the delete's) in region 1 and not settled yet.
    let v2 = s.stage(&mut log1, put(b"k", b"v2", 100), 1).unwrap();
    s.set_pending_floor(1, v2);
    s.stage(&mut log0, Mutation::Delete { key: b"k" }, 100)
        .unwrap();
    drive_sync(&s, &mut log0, |_| {}).unwrap();
    log0.seal();
    run_to_idle(&mut c, &s, &mut log0, 0, 10_000).unwrap();
    assert!(c.stats().freed > 0, "v1's segment was compacted");
    drive_sync(&s, &mut log1, |_| {}).unwrap();
    s.set_pending_floor(1, u64::MAX);
    assert_eq!(
        s.lookup(b"k", 0).unwrap(),
        None,
        "the deleted key came back"
    );
}

/// The value of `key{k}` in [`mostly_dead`].
fn value_of(k: u64) -> Vec<u8> {
    vec![u8::try_from(k % 200).unwrap() + 1; 300]
}

/// Writes `n` keys of 300 bytes (`key0`…), then deletes all but `keep`, all acknowledged: the
/// first segments are left dead but for the kept keys.
fn mostly_dead(s: &Serving<SimDevice>, log: &mut RegionLog<u64>, n: u64, keep: &[u64]) {
    for k in 0..n {
        let (v, key) = (value_of(k), format!("key{k}"));
        s.stage(log, put(key.as_bytes(), &v, k + 1), k + 1).unwrap();
    }
    for k in (0..n).filter(|k| !keep.contains(k)) {
        let key = format!("key{k}");
        s.stage(
            log,
            Mutation::Delete {
                key: key.as_bytes(),
            },
            n + k + 1,
        )
        .unwrap();
    }
    let got = drive_sync(s, log, |_| {}).unwrap();
    assert!(got.failed.is_empty());
}

#[test]
fn a_victim_with_a_damaged_record_is_kept_with_the_live_records_behind_it() {
    // A byte flipped in a live record (bit rot, after it was acknowledged) ends the victim's
    // walk there: the compaction must give up rather than erase the live records it did not
    // reach. In clear and sealed (whose walk reads heads only and decodes what it keeps).
    let keep = [1, 3, 5, 7];
    for data_key in [None, Some(crate::crypt::DataKey::from_bytes([5; 32]))] {
        let sealed = data_key.is_some();
        let o = Options { data_key, ..opts() };
        let s = Serving::new(Durable::open(SimDevice::new(512 * 1024), &o).unwrap().0);
        let g = s.superblock().geometry;
        let mut log = s.take_log(0).unwrap();
        mostly_dead(&s, &mut log, 120, &keep);
        let loc = s.read_index().get(b"key1").unwrap().loc;
        let key7 = s.read_index().get(b"key7").unwrap().loc;
        assert_eq!(loc.segment, key7.segment, "the kept keys share a segment");
        let at = g.segment_offset(loc.region, loc.segment) + u64::from(loc.offset) + 100;
        let mut byte = [0u8];
        s.device().read_at(at, &mut byte).unwrap();
        s.device().write_at(at, &[byte[0] ^ 0x10]).unwrap();
        // Live filler, compacting as a server does, until the region is pressed for room:
        // then the victim is the segment with the fewest live bytes, the damaged one. A try
        // refused waits for its retry, and the clock does not move here: one try.
        let pressed = crate::region::COMPACTION_RESERVE + crate::region::DELETE_RESERVE + 3;
        let mut c = Compactor::new(g.block_size);
        for i in 0u64.. {
            run_to_idle(&mut c, &s, &mut log, 0, 1_000).unwrap();
            if log.free_count() < pressed {
                break;
            }
            let key = format!("fill{i}");
            s.stage(
                &mut log,
                put(key.as_bytes(), &[9; 3000], 1000 + i),
                1000 + i,
            )
            .unwrap();
            assert!(drive_sync(&s, &mut log, |_| {}).unwrap().failed.is_empty());
        }
        let st = c.stats();
        assert_eq!(st.aborted, 1, "sealed {sealed}: {st:?}");
        // The damaged victim is not picked again: the rest of the region still compacts
        // (here: more filler, with the clock past the retry, frees segments again).
        for i in 0..60u64 {
            let key = format!("more{}", i % 8);
            s.stage(
                &mut log,
                put(key.as_bytes(), &[8; 3000], 5000 + i),
                5000 + i,
            )
            .unwrap();
            assert!(drive_sync(&s, &mut log, |_| {}).unwrap().failed.is_empty());
            run_to_idle_at(&mut c, &s, &mut log, (0, RETRY_MS * (i + 1)), 1_000).unwrap();
        }
        let after = c.stats();
        assert_eq!(after.aborted, 1, "sealed {sealed}: {after:?}");
        assert!(after.freed > st.freed, "sealed {sealed}: {after:?}");
        assert!(
            log.segments()
                .any(|(seg, st, _)| seg == loc.segment && st == SegState::Sealed),
            "sealed {sealed}: the victim was erased"
        );
        for k in [3, 5, 7] {
            let key = format!("key{k}");
            let got = s.lookup(key.as_bytes(), 0).unwrap().unwrap().value;
            assert_eq!(got, value_of(k), "sealed {sealed}: {key}");
        }
        assert!(
            s.lookup(b"key1", 0).is_err(),
            "sealed {sealed}: damage is damage"
        );
    }
}
