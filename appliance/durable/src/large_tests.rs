//! Tests of large objects through [`Serving`]: chunks and manifests staged, settled, read,
//! replaced, swept at restart, and moved by background compaction.
use crate::compactor::{run_to_idle, Compactor};
use crate::device::BlockDevice;
use crate::engine::{Durable, Options};
use crate::error::DurableError;
use crate::large::{
    chunk_key, parse_chunk_key, piece_table_len, Manifest, CHUNK_KEY_LEN, MANIFEST_HEAD_MAX,
    PIECE_LEN,
};
use crate::record::{encoded_len, RecordKind, HEADER_LEN};
use crate::region::RegionLog;
use crate::serving::{drive_sync, Serving, Settled};
use crate::sim::{SimDevice, SimRng};
use crate::Mutation;

fn opts(regions: u32) -> Options {
    Options {
        data_key: None,
        regions,
        segment_size: 16 * 1024,
        block_size: 512,
        ..Options::default()
    }
}

fn open_with(dev: SimDevice, regions: u32) -> (Serving<SimDevice>, bool) {
    let (d, rep) = Durable::open(dev, &opts(regions)).unwrap();
    (Serving::new(d), rep.from_checkpoint)
}

fn drive(s: &Serving<SimDevice>, log: &mut RegionLog<u64>) -> Settled {
    drive_sync(s, log, |_| {}).unwrap()
}

/// Object bytes derived from a number, so mix-ups are detectable.
fn object_bytes(n: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| u8::try_from((i as u64 * 7 + n * 131 + (i as u64 >> 8)) % 256).unwrap())
        .collect()
}

/// Uploads `bytes` as a large object: chunks, settle, then the manifest under `key`, settle.
/// Returns the manifest. Panics if any write fails.
fn upload(
    s: &Serving<SimDevice>,
    log: &mut RegionLog<u64>,
    key: &[u8],
    bytes: &[u8],
    token: &mut u64,
) -> Manifest {
    let m = stage_chunks(s, log, bytes, token);
    let got = drive(s, log);
    assert!(got.failed.is_empty(), "{:?}", got.failed);
    stage_manifest(s, log, key, &m, token);
    let got = drive(s, log);
    assert!(got.failed.is_empty(), "{:?}", got.failed);
    m
}

fn stage_chunks(
    s: &Serving<SimDevice>,
    log: &mut RegionLog<u64>,
    bytes: &[u8],
    token: &mut u64,
) -> Manifest {
    let m = Manifest {
        object: s.next_object_id(),
        len: bytes.len() as u64,
        chunk_len: u32::try_from(s.chunk_len()).unwrap(),
        head: bytes[..bytes.len().min(MANIFEST_HEAD_MAX)].to_vec(),
    };
    for i in 0..m.chunks() {
        let (a, b) = m.chunk_range(i);
        *token += 1;
        s.stage_chunk(
            log,
            m.object,
            i,
            &bytes[usize::try_from(a).unwrap()..usize::try_from(b).unwrap()],
            *token,
        )
        .unwrap();
    }
    m
}

fn stage_manifest(
    s: &Serving<SimDevice>,
    log: &mut RegionLog<u64>,
    key: &[u8],
    m: &Manifest,
    token: &mut u64,
) {
    *token += 1;
    s.stage(
        log,
        Mutation::Put {
            key,
            value: &m.encode(),
            flags: 3,
            exptime: 0,
            cas: *token,
            large: true,
        },
        *token,
    )
    .unwrap();
}

fn put_plain(
    s: &Serving<SimDevice>,
    log: &mut RegionLog<u64>,
    key: &[u8],
    v: &[u8],
    token: &mut u64,
) {
    *token += 1;
    s.stage(
        log,
        Mutation::Put {
            key,
            value: v,
            flags: 0,
            exptime: 0,
            cas: *token,
            large: false,
        },
        *token,
    )
    .unwrap();
}

fn assert_readable(s: &Serving<SimDevice>, m: &Manifest, bytes: &[u8]) {
    for i in 0..m.chunks() {
        let (a, b) = m.chunk_range(i);
        let data = &bytes[usize::try_from(a).unwrap()..usize::try_from(b).unwrap()];
        assert_eq!(
            s.read_chunk(m.object, i).unwrap(),
            data,
            "object {} chunk {i}",
            m.object
        );
        let n = data.len();
        for (x, y) in [(0, n), (n / 3, n / 2), (n - 1, n), (0, 1)] {
            assert_eq!(
                s.read_chunk_range(m.object, i, x, y).unwrap(),
                &data[x..y],
                "object {} chunk {i} range {x}..{y}",
                m.object
            );
        }
    }
}

/// A device whose chunks span several pieces: 1 MiB segments give 252 KiB chunks, three
/// whole 64 KiB pieces and a last one of 60 KiB.
fn open_pieces() -> Serving<SimDevice> {
    let o = Options {
        data_key: None,
        segment_size: 1 << 20,
        block_size: 4096,
        ..opts(1)
    };
    Serving::new(Durable::open(SimDevice::new(16 << 20), &o).unwrap().0)
}

/// Device offset of the first data byte of chunk `index` of `object` (past its piece table).
fn chunk_data_offset(s: &Serving<SimDevice>, object: u64, index: u32) -> u64 {
    let e = *s.read_index().get(&chunk_key(object, index)).unwrap();
    let rec = s
        .superblock()
        .geometry
        .segment_offset(e.loc.region, e.loc.segment)
        + u64::from(e.loc.offset);
    let data_len = s.chunk_len().min(e.value_len as usize);
    rec + (HEADER_LEN + CHUNK_KEY_LEN + piece_table_len(data_len)) as u64
}

fn flip_byte(s: &Serving<SimDevice>, at: u64) {
    let mut b = [0u8];
    s.device().read_at(at, &mut b).unwrap();
    b[0] ^= 0x40;
    s.device().write_at(at, &b).unwrap();
}

fn assert_gone(s: &Serving<SimDevice>, m: &Manifest) {
    for i in 0..m.chunks() {
        assert!(
            matches!(
                s.read_chunk(m.object, i),
                Err(DurableError::MissingChunk { object, index }) if object == m.object && index == i
            ),
            "object {} chunk {i} still readable",
            m.object
        );
        assert!(s.read_index().get(&chunk_key(m.object, i)).is_none());
    }
}

/// Bytes of the chunk records of `m` in the index.
fn chunk_live_bytes(s: &Serving<SimDevice>, m: &Manifest) -> u64 {
    let index = s.read_index();
    (0..m.chunks())
        .map(|i| {
            index
                .get(&chunk_key(m.object, i))
                .map_or(0, |e| u64::from(e.loc.len))
        })
        .sum()
}

#[test]
fn chunk_len_fits_the_segment_with_room_for_others() {
    let (s, _) = open_with(SimDevice::new(1 << 20), 1);
    assert_eq!(s.chunk_len(), 4096, "16 KiB segments: the 4 KiB floor");
    let big = Options {
        data_key: None,
        segment_size: 256 * 1024,
        block_size: 4096,
        ..opts(1)
    };
    let s = Serving::new(Durable::open(SimDevice::new(4 << 20), &big).unwrap().0);
    // (256 KiB - 4 KiB) / 4 - 64 rounded down to 4 KiB.
    assert_eq!(s.chunk_len(), 60 * 1024);
    let huge = Options {
        data_key: None,
        segment_size: 8 << 20,
        block_size: 4096,
        ..opts(1)
    };
    let s = Serving::new(Durable::open(SimDevice::new(40 << 20), &huge).unwrap().0);
    // 8 chunk records fill the 8 MiB - 4 KiB payload: 1 MiB would fit only 7 and waste 1/8.
    let chunk = s.chunk_len();
    assert_eq!(chunk, (1 << 20) - 4096);
    // The record carries a piece table: 16 crcs for 16 pieces (the last one 60 KiB).
    assert_eq!(piece_table_len(chunk), 64);
    let record = encoded_len(CHUNK_KEY_LEN, chunk + 64);
    assert_eq!(record, chunk + HEADER_LEN + CHUNK_KEY_LEN + 64 + 2); // padded to 8 bytes
    assert!(8 * record <= (8 << 20) - 4096 && 9 * record > (8 << 20) - 4096);
    assert_eq!(
        open_pieces().chunk_len(),
        252 * 1024,
        "1 MiB segments: 4 per segment"
    );
    let a = s.next_object_id();
    assert!(s.next_object_id() > a);
}

#[test]
fn manifest_and_chunks_are_staged_settled_and_read_back() {
    let (s, _) = open_with(SimDevice::new(1 << 20), 2);
    let mut log = s.take_log(0).unwrap();
    let mut token = 0;
    let bytes = object_bytes(1, 3 * 4096 + 1000);
    let m = stage_chunks(&s, &mut log, &bytes, &mut token);
    assert_eq!(m.chunks(), 4);
    let got = drive(&s, &mut log);
    assert_eq!(
        got.acked,
        vec![1, 2, 3, 4],
        "chunks are acked like client writes"
    );
    assert_eq!(s.lookup(b"obj", 0).unwrap(), None, "no manifest yet");
    stage_manifest(&s, &mut log, b"obj", &m, &mut token);
    let staged = s.lookup(b"obj", 0).unwrap().unwrap();
    assert!(staged.large, "the overlay carries large");
    assert_eq!(Manifest::decode(&staged.value), Some(m.clone()));
    assert_eq!(drive(&s, &mut log).acked, vec![5]);
    let item = s.lookup(b"obj", 0).unwrap().unwrap();
    assert!(item.large && item.flags == 3);
    assert_eq!(Manifest::decode(&item.value), Some(m.clone()));
    assert_eq!(
        s.read_index().get(b"obj").unwrap().meta.kind,
        RecordKind::Manifest
    );
    assert_readable(&s, &m, &bytes);
    assert!(matches!(
        s.read_chunk(m.object, 4),
        Err(DurableError::MissingChunk { index: 4, .. })
    ));
    put_plain(&s, &mut log, b"small", b"v", &mut token);
    drive(&s, &mut log);
    let mut seen = Vec::new();
    let (n, bad) = s.for_each_value(0, |k, it| seen.push((k.to_vec(), it.large)));
    seen.sort();
    assert_eq!((n, bad), (2, 0), "{seen:?}");
    assert_eq!(
        seen,
        vec![(b"obj".to_vec(), true), (b"small".to_vec(), false)],
        "the manifest, the value, and no chunk"
    );
    // A large put whose value is not a manifest is refused before anything is staged.
    assert!(matches!(
        s.stage(
            &mut log,
            Mutation::Put {
                key: b"bad",
                value: b"not a manifest",
                flags: 0,
                exptime: 0,
                cas: 1,
                large: true
            },
            99
        ),
        Err(DurableError::BadManifest)
    ));
    assert!(log.is_idle());
}

#[test]
fn replacing_deleting_or_failing_a_large_object_frees_its_chunks() {
    let (s, _) = open_with(SimDevice::new(2 << 20), 1);
    let mut log = s.take_log(0).unwrap();
    let mut token = 0;
    let bytes_a = object_bytes(1, 5 * 4096);
    let a = upload(&s, &mut log, b"k", &bytes_a, &mut token);
    assert_readable(&s, &a, &bytes_a);
    let chunks_a = chunk_live_bytes(&s, &a);
    assert!(chunks_a >= 5 * 4096);
    let manifest_len = u64::from(s.read_index().get(b"k").unwrap().loc.len);
    let live = s.read_index().total_live();
    put_plain(&s, &mut log, b"k", b"plain", &mut token);
    drive(&s, &mut log);
    assert_gone(&s, &a);
    let plain_len = u64::from(s.read_index().get(b"k").unwrap().loc.len);
    assert_eq!(
        s.read_index().total_live(),
        live - chunks_a - manifest_len + plain_len,
        "the chunks' bytes no longer count as live"
    );
    assert!(!s.lookup(b"k", 0).unwrap().unwrap().large);

    // Large replaced by large: only the old object's chunks go.
    let bytes_b = object_bytes(2, 2 * 4096 + 1);
    let b = upload(&s, &mut log, b"k", &bytes_b, &mut token);
    let bytes_c = object_bytes(3, 4096);
    let c = upload(&s, &mut log, b"k", &bytes_c, &mut token);
    assert_gone(&s, &b);
    assert_readable(&s, &c, &bytes_c);

    // Re-logging the same manifest (a touch) keeps the chunks.
    stage_manifest(&s, &mut log, b"k", &c, &mut token);
    drive(&s, &mut log);
    assert_readable(&s, &c, &bytes_c);

    // Delete.
    token += 1;
    s.stage(&mut log, Mutation::Delete { key: b"k" }, token)
        .unwrap();
    drive(&s, &mut log);
    assert_gone(&s, &c);
    assert_eq!(s.lookup(b"k", 0).unwrap(), None);

    // A failed manifest: its chunks stay until the next start, since the failed write may
    // still be on the device (checked at the end).
    let bytes_d = object_bytes(4, 3 * 4096);
    let d = stage_chunks(&s, &mut log, &bytes_d, &mut token);
    assert!(drive(&s, &mut log).failed.is_empty());
    assert_readable(&s, &d, &bytes_d);
    s.device().fail_next_flush();
    stage_manifest(&s, &mut log, b"f", &d, &mut token);
    let got = drive(&s, &mut log);
    assert_eq!(got.failed.len(), 1);
    assert_eq!(
        (got.failed[0].0, &*got.failed[0].1, got.failed[0].2),
        (token, &b"f"[..], token)
    );
    assert_eq!(s.lookup(b"f", 0).unwrap(), None);
    assert_readable(&s, &d, &bytes_d);

    // A failed chunk is reported with its chunk key and cas 0.
    s.device().fail_next_flush();
    let bytes_e = object_bytes(5, 100);
    let e = stage_chunks(&s, &mut log, &bytes_e, &mut token);
    let got = drive(&s, &mut log);
    assert_eq!(got.failed.len(), 1);
    assert_eq!(got.failed[0].0, token);
    assert_eq!(parse_chunk_key(&got.failed[0].1), Some((e.object, 0)));
    assert_eq!(got.failed[0].2, 0);

    // An upload given up before its manifest: its chunks can be dropped.
    let bytes_g = object_bytes(6, 2 * 4096);
    let g = stage_chunks(&s, &mut log, &bytes_g, &mut token);
    drive(&s, &mut log);
    assert_eq!(s.abandon_object(g.object, g.chunks()), 2);
    assert_gone(&s, &g);

    // After a crash the failed manifest either made it (with every chunk) or its chunks are
    // swept.
    for seed in 0..8 {
        let img = s.device().crash_image(&mut SimRng::new(seed));
        let (s2, _) = open_with(SimDevice::from_image(img), 1);
        match s2.lookup(b"f", 0).unwrap() {
            Some(item) => {
                assert_eq!(Manifest::decode(&item.value), Some(d.clone()));
                assert_readable(&s2, &d, &bytes_d);
            }
            None => assert_gone(&s2, &d),
        }
        assert_gone(&s2, &e);
    }
}

#[test]
fn a_manifest_superseded_before_it_settles_frees_its_chunks() {
    let (s, _) = open_with(SimDevice::new(2 << 20), 2);
    let mut log0 = s.take_log(0).unwrap();
    let mut log1 = s.take_log(1).unwrap();
    let mut token = 0;
    let bytes = object_bytes(9, 2 * 4096);
    let m = stage_chunks(&s, &mut log0, &bytes, &mut token);
    drive(&s, &mut log0);
    // The manifest is staged in region 0, then a newer plain value in region 1 settles first.
    stage_manifest(&s, &mut log0, b"k", &m, &mut token);
    put_plain(&s, &mut log1, b"k", b"newer", &mut token);
    drive(&s, &mut log1);
    assert_readable(&s, &m, &bytes);
    drive(&s, &mut log0);
    assert_gone(&s, &m);
    assert_eq!(s.lookup(b"k", 0).unwrap().unwrap().value, b"newer");
}

/// Uploads a live object, an overwritten one, and orphan chunks; returns (live manifest and
/// bytes, overwritten manifest, orphan manifest).
fn populate(
    s: &Serving<SimDevice>,
    log: &mut RegionLog<u64>,
    token: &mut u64,
) -> ((Manifest, Vec<u8>), Manifest, Manifest) {
    let bytes = object_bytes(11, 4 * 4096 + 17);
    let live = upload(s, log, b"live", &bytes, token);
    let old_bytes = object_bytes(12, 2 * 4096);
    let old = upload(s, log, b"over", &old_bytes, token);
    put_plain(s, log, b"over", b"replaced", token);
    let orphan_bytes = object_bytes(13, 3 * 4096);
    let orphan = stage_chunks(s, log, &orphan_bytes, token);
    assert!(drive(s, log).failed.is_empty());
    assert_gone(s, &old);
    assert_readable(s, &orphan, &orphan_bytes);
    ((live, bytes), old, orphan)
}

fn check_restarted(
    s: &Serving<SimDevice>,
    live: &Manifest,
    bytes: &[u8],
    old: &Manifest,
    orphan: &Manifest,
) {
    let item = s.lookup(b"live", 0).unwrap().unwrap();
    assert!(item.large);
    assert_eq!(Manifest::decode(&item.value).as_ref(), Some(live));
    assert_eq!(
        s.read_index().get(b"live").unwrap().meta.kind,
        RecordKind::Manifest
    );
    assert_readable(s, live, bytes);
    assert_gone(s, orphan);
    assert_gone(s, old);
    assert_eq!(s.lookup(b"over", 0).unwrap().unwrap().value, b"replaced");
    let id = s.next_object_id();
    assert!(
        id > live.object && id > orphan.object,
        "object ids are never reused"
    );
    let mut large = Vec::new();
    s.for_each_value(0, |k, it| large.push((k.to_vec(), it.large)));
    large.retain(|(k, _)| k != b"later");
    large.sort();
    assert_eq!(
        large,
        vec![(b"live".to_vec(), true), (b"over".to_vec(), false)]
    );
}

#[test]
fn crash_without_checkpoint_keeps_the_object_and_sweeps_orphans() {
    let (s, _) = open_with(SimDevice::new(2 << 20), 2);
    let mut log = s.take_log(1).unwrap();
    let mut token = 0;
    let ((live, bytes), old, orphan) = populate(&s, &mut log, &mut token);
    let img = s.device().crash_image(&mut SimRng::new(3));
    let (s2, from_checkpoint) = open_with(SimDevice::from_image(img), 2);
    assert!(!from_checkpoint);
    // The overwritten object's chunks are still on the device and come back with the scan.
    assert_eq!(s2.swept_chunks(), (orphan.chunks() + old.chunks()) as usize);
    check_restarted(&s2, &live, &bytes, &old, &orphan);
    // And the sweep is stable across another crash.
    let img = s2.device().crash_image(&mut SimRng::new(4));
    let (s3, _) = open_with(SimDevice::from_image(img), 2);
    check_restarted(&s3, &live, &bytes, &old, &orphan);
}

#[test]
fn checkpoint_keeps_manifests_and_sweeps_orphans() {
    let (s, _) = open_with(SimDevice::new(2 << 20), 2);
    let mut log = s.take_log(0).unwrap();
    let mut token = 0;
    let ((live, bytes), old, orphan) = populate(&s, &mut log, &mut token);
    s.park_log(log);
    assert!(s.checkpoint().unwrap());
    let img = s.device().crash_image(&mut SimRng::new(5));
    let (s2, from_checkpoint) = open_with(SimDevice::from_image(img), 2);
    assert!(from_checkpoint);
    assert_eq!(
        s2.swept_chunks(),
        orphan.chunks() as usize,
        "the overwritten object's chunks were already out of the index"
    );
    check_restarted(&s2, &live, &bytes, &old, &orphan);
    // Writing on after the restart, then crashing (no checkpoint): still intact.
    let mut log = s2.take_log(1).unwrap();
    put_plain(&s2, &mut log, b"later", b"x", &mut token);
    drive(&s2, &mut log);
    let img = s2.device().crash_image(&mut SimRng::new(6));
    let (s3, from_checkpoint) = open_with(SimDevice::from_image(img), 2);
    assert!(!from_checkpoint);
    check_restarted(&s3, &live, &bytes, &old, &orphan);
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one scenario (upload, replace, compact, restart) whose checks depend on each earlier step"
)]
fn background_compaction_moves_chunks_and_reclaims_replaced_objects() {
    let (s, _) = open_with(SimDevice::new(512 * 1024), 1);
    let g = s.superblock().geometry;
    let mut log = s.take_log(0).unwrap();
    let mut c = Compactor::new(g.block_size);
    let mut token = 0;
    let mut current: Vec<(Manifest, Vec<u8>)> = Vec::new();
    let mut moved = false;
    let mut written = 0u64;
    for round in 0..120u64 {
        // Three keys, each replaced by a fresh object every third round; plain churn between.
        let slot = (round % 3) as usize;
        let key = format!("obj{slot}");
        let bytes = object_bytes(round, 4096 + (usize::try_from(round).unwrap() * 997) % 6000);
        let m = upload(&s, &mut log, key.as_bytes(), &bytes, &mut token);
        written += bytes.len() as u64;
        if current.len() <= slot {
            current.push((m, bytes));
        } else {
            let (old, _) = std::mem::replace(&mut current[slot], (m, bytes));
            assert_gone(&s, &old);
        }
        for k in 0..8u64 {
            put_plain(
                &s,
                &mut log,
                format!("p{k}").as_bytes(),
                &vec![u8::try_from(round % 256).unwrap(); 300],
                &mut token,
            );
        }
        assert!(drive(&s, &mut log).failed.is_empty());
        run_to_idle(&mut c, &s, &mut log, 0, 10_000).unwrap();
        for (m, bytes) in &current {
            assert_readable(&s, m, bytes);
        }
    }
    // A kept object whose chunks share segments with plain values that then die: the
    // chunks' segments become mostly dead and compaction must copy the chunks.
    let bytes = object_bytes(1000, 8 * 4096);
    let kept = Manifest {
        object: s.next_object_id(),
        len: bytes.len() as u64,
        chunk_len: 4096,
        head: Vec::new(),
    };
    for i in 0..kept.chunks() {
        let (a, b) = kept.chunk_range(i);
        token += 1;
        let chunk = &bytes[usize::try_from(a).unwrap()..usize::try_from(b).unwrap()];
        s.stage_chunk(&mut log, kept.object, i, chunk, token)
            .unwrap();
        for k in 0..8u64 {
            put_plain(
                &s,
                &mut log,
                format!("p{k}").as_bytes(),
                &[u8::try_from(i % 256).unwrap(); 900],
                &mut token,
            );
        }
        assert!(drive(&s, &mut log).failed.is_empty());
    }
    stage_manifest(&s, &mut log, b"kept", &kept, &mut token);
    assert!(drive(&s, &mut log).failed.is_empty());
    let locs = |s: &Serving<SimDevice>| -> Vec<_> {
        (0..kept.chunks())
            .map(|i| s.read_index().get(&chunk_key(kept.object, i)).unwrap().loc)
            .collect()
    };
    let before = locs(&s);
    let copied = c.stats().copied;
    for round in 0..200u64 {
        for k in 0..8u64 {
            put_plain(
                &s,
                &mut log,
                format!("p{k}").as_bytes(),
                &vec![u8::try_from(round % 256).unwrap(); 600],
                &mut token,
            );
        }
        assert!(drive(&s, &mut log).failed.is_empty());
        run_to_idle(&mut c, &s, &mut log, 0, 10_000).unwrap();
        moved |= locs(&s) != before;
        assert_readable(&s, &kept, &bytes);
        for (m, bytes) in &current {
            assert_readable(&s, m, bytes);
        }
    }
    assert!(c.stats().copied > copied);
    current.push((kept, bytes));
    let st = c.stats();
    assert!(moved, "compaction never moved a chunk: {st:?}");
    assert!(st.freed > 20 && st.aborted == 0, "{st:?}");
    let device_bytes = u64::from(g.segments_per_region) * g.segment_size;
    assert!(
        written > device_bytes,
        "objects through the region: {written}"
    );
    // Crash: the relocated chunks and the newest manifests are what recovery finds.
    let img = s.device().crash_image(&mut SimRng::new(8));
    let (s2, _) = open_with(SimDevice::from_image(img), 1);
    for (slot, (m, bytes)) in current.iter().enumerate() {
        let key = if slot < 3 {
            format!("obj{slot}")
        } else {
            "kept".to_string()
        };
        let item = s2.lookup(key.as_bytes(), 0).unwrap().unwrap();
        assert_eq!(Manifest::decode(&item.value).as_ref(), Some(m));
        assert_readable(&s2, m, bytes);
    }
}

#[test]
fn an_expired_manifest_dropped_by_compaction_takes_its_chunks() {
    let (s, _) = open_with(SimDevice::new(512 * 1024), 1);
    let g = s.superblock().geometry;
    let mut log = s.take_log(0).unwrap();
    let mut c = Compactor::new(g.block_size);
    let mut token = 0;
    let bytes = object_bytes(1, 2 * 4096);
    let mut m = stage_chunks(&s, &mut log, &bytes, &mut token);
    m.head.clear();
    drive(&s, &mut log);
    // The manifest goes to a segment of its own, among plain values that die.
    log.seal();
    token += 1;
    s.stage(
        &mut log,
        Mutation::Put {
            key: b"exp",
            value: &m.encode(),
            flags: 0,
            exptime: 5,
            cas: token,
            large: true,
        },
        token,
    )
    .unwrap();
    drive(&s, &mut log);
    assert_readable(&s, &m, &bytes);
    // Churn until the manifest's segment is compacted at a time after its expiry.
    for round in 0..300u64 {
        if s.read_index().get(b"exp").is_none() {
            break;
        }
        for k in 0..8u64 {
            put_plain(
                &s,
                &mut log,
                format!("p{k}").as_bytes(),
                &vec![u8::try_from(round % 256).unwrap(); 600],
                &mut token,
            );
        }
        drive(&s, &mut log);
        run_to_idle(&mut c, &s, &mut log, 100, 10_000).unwrap();
    }
    assert!(
        s.read_index().get(b"exp").is_none(),
        "manifest never dropped"
    );
    assert_gone(&s, &m);
}

#[test]
fn chunk_ranges_return_exactly_the_bytes_asked_for() {
    let s = open_pieces();
    let mut log = s.take_log(0).unwrap();
    let mut token = 0;
    let chunk = s.chunk_len();
    let bytes = object_bytes(9, 2 * chunk + 5000);
    let m = upload(&s, &mut log, b"big", &bytes, &mut token);
    assert_eq!(m.chunks(), 3);
    assert_readable(&s, &m, &bytes);
    const P: usize = PIECE_LEN;
    let mut rng = SimRng::new(7);
    for i in 0..m.chunks() {
        let (a, b) = m.chunk_range(i);
        let data = &bytes[usize::try_from(a).unwrap()..usize::try_from(b).unwrap()];
        let n = data.len();
        let mut ranges = vec![
            (0, n),
            (0, 0),
            (n, n),
            (0, 1),
            (n - 1, n),
            (17, 4000.min(n)),
        ];
        if n > P {
            ranges.extend([
                (0, P),               // one whole piece
                (P, 2 * P),           // the next, at its boundary
                (P - 1, P + 1),       // across a boundary
                (P + 5, P + 6000),    // inside one piece
                (P / 2, 3 * P + 10),  // across four pieces
                (3 * P, n),           // the last, partial piece
                (3 * P + 100, n - 1), // inside it
                (2 * P + 1, n),       // to the end
            ]);
        }
        for _ in 0..50 {
            let x = usize::try_from(rng.below(n as u64 + 1)).unwrap();
            let y = x + usize::try_from(rng.below((n - x) as u64 + 1)).unwrap();
            ranges.push((x, y));
        }
        for (x, y) in ranges {
            assert_eq!(
                s.read_chunk_range(m.object, i, x, y).unwrap(),
                &data[x..y],
                "chunk {i} range {x}..{y}"
            );
        }
        assert!(matches!(
            s.read_chunk_range(m.object, i, 0, n + 1),
            Err(DurableError::BadRange { .. })
        ));
        assert!(matches!(
            s.read_chunk_range(m.object, i, 5, 4),
            Err(DurableError::BadRange { .. })
        ));
        assert!(matches!(
            s.read_chunk_range(m.object, i, usize::MAX, usize::MAX),
            Err(DurableError::BadRange { .. })
        ));
    }
    assert!(matches!(
        s.read_chunk_range(m.object, 3, 0, 1),
        Err(DurableError::MissingChunk { index: 3, .. })
    ));
    assert!(matches!(
        s.read_chunk_range(m.object + 1000, 0, 0, 1),
        Err(DurableError::MissingChunk { .. })
    ));
    // Replaced: the old object's chunks are gone for ranges too.
    put_plain(&s, &mut log, b"big", b"small now", &mut token);
    drive(&s, &mut log);
    assert!(matches!(
        s.read_chunk_range(m.object, 0, 0, 10),
        Err(DurableError::MissingChunk { index: 0, .. })
    ));
}

#[test]
fn a_flipped_byte_fails_only_the_ranges_touching_its_piece() {
    let s = open_pieces();
    let mut log = s.take_log(0).unwrap();
    let mut token = 0;
    let chunk = s.chunk_len();
    let bytes = object_bytes(3, 2 * chunk);
    let m = upload(&s, &mut log, b"obj", &bytes, &mut token);
    const P: usize = PIECE_LEN;
    let data = &bytes[..chunk];
    let corrupt = |x: usize, y: usize| {
        matches!(
            s.read_chunk_range(m.object, 0, x, y),
            Err(DurableError::Corrupt { .. })
        )
    };
    let intact = |x: usize, y: usize| s.read_chunk_range(m.object, 0, x, y).unwrap() == data[x..y];

    // A data byte of piece 1.
    flip_byte(&s, chunk_data_offset(&s, m.object, 0) + (P + 1234) as u64);
    for (x, y) in [
        (P, P + 1),
        (P + 1234, P + 1235),
        (0, chunk),
        (P - 1, P + 1),
        (P + 2000, 2 * P),
    ] {
        assert!(corrupt(x, y), "range {x}..{y} touches the flipped piece");
    }
    for (x, y) in [
        (0, P),
        (P - 100, P),
        (2 * P, chunk),
        (2 * P, 2 * P + 5),
        (0, 0),
    ] {
        assert!(intact(x, y), "range {x}..{y} is elsewhere");
    }
    assert!(matches!(
        s.read_chunk(m.object, 0),
        Err(DurableError::Corrupt { .. })
    ));
    assert_eq!(
        s.read_chunk(m.object, 1).unwrap(),
        &bytes[chunk..],
        "chunk 1 intact"
    );

    // The crc of piece 3 in the table: that piece no longer verifies, the others do.
    let table = chunk_data_offset(&s, m.object, 0) - piece_table_len(chunk) as u64;
    flip_byte(&s, table + 4 * 3 + 2);
    assert!(corrupt(3 * P, chunk) && corrupt(3 * P + 7, 3 * P + 8));
    assert!(intact(2 * P, 3 * P) && intact(0, 10));

    // The header's sequence: nothing of the record is served, not even an empty range.
    let header = table - (HEADER_LEN + CHUNK_KEY_LEN) as u64;
    flip_byte(&s, header + 40);
    assert!(corrupt(0, 10) && corrupt(2 * P, 3 * P) && corrupt(5, 5));
    // The key inside the header.
    flip_byte(&s, header + 40);
    assert!(intact(0, 10));
    flip_byte(&s, header + (HEADER_LEN + 13) as u64);
    assert!(corrupt(0, 10));
}
