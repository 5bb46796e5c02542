//! The stated space bound under overwrite churn, and recovery time per million objects with and
//! without a checkpoint on a real file (`RINGSTORE_RECOVERY_OBJECTS`, default 200000; results are
//! printed scaled to one million).
use std::collections::HashMap;
use std::time::Instant;

use ringstore_durable::sim::{SimDevice, SimRng};
use ringstore_durable::{Durable, FileDevice, Limits, Options, SPACE_FACTOR};

#[test]
fn space_stays_within_the_stated_factor_of_live_data() {
    let opts = Options {
        data_key: None,
        regions: 2,
        segment_size: 16 * 1024,
        block_size: 512,
        ..Options::default()
    };
    let (mut d, _) = Durable::open(SimDevice::new(2 << 20), &opts).unwrap();
    let g = d.superblock().geometry;
    let slack = u64::from(g.regions + 1) * g.segment_size;
    let mut rng = SimRng::new(42);
    let mut model: HashMap<u64, Option<Vec<u8>>> = HashMap::new();
    let mut compactions = 0;
    for step in 0..20_000u64 {
        let k = rng.below(300);
        let key = format!("k{k}");
        let region = usize::try_from(rng.below(2)).unwrap();
        let value = if rng.chance(1, 10) {
            None
        } else {
            Some(vec![
                (step % 251) as u8;
                usize::try_from(rng.below(1200)).unwrap()
            ])
        };
        let res = match &value {
            Some(v) => d.set(region, key.as_bytes(), v, 0, 0, step, step),
            None => d.delete(region, key.as_bytes(), step),
        };
        match res {
            Ok(_) => {
                model.insert(k, value);
            }
            Err(e) => panic!("step {step}: {e} with space {:?}", d.space()),
        }
        if step % 50 == 49 {
            assert!(d.sync().iter().all(|a| a.result.is_ok()));
            compactions += d.maintain(0).unwrap();
            let u = d.space();
            assert!(
                u.used <= SPACE_FACTOR * u.live + slack,
                "step {step}: {u:?}"
            );
        }
    }
    assert!(
        compactions > 50,
        "churn must have forced compaction ({compactions})"
    );
    for (k, v) in &model {
        let got = d.get(format!("k{k}").as_bytes()).unwrap().map(|i| i.value);
        assert_eq!(&got, v, "key {k}");
    }
    println!("space: {compactions} compactions, final {:?}", d.space());
}

#[test]
fn recovery_time_per_million_objects() {
    let n: u64 = std::env::var("RINGSTORE_RECOVERY_OBJECTS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200_000);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data");
    let record = 96u64; // 48-byte header + 16-byte key + 32-byte value
    let checkpoint_len = n * 100 + (1 << 20);
    let len = n * record * 2 + checkpoint_len + (64 << 20);
    let opts = Options {
        data_key: None,
        regions: 4,
        segment_size: 4 << 20,
        block_size: 4096,
        checkpoint_len,
        force: false,
        salvage: false,
        limits: Limits {
            max_batch_bytes: 1 << 20,
            max_pending_writes: 16_384,
            max_inflight_writes: 4,
            max_inflight_flushes: 2,
        },
    };
    let (mut d, _) = Durable::open(FileDevice::create(&path, len).unwrap(), &opts).unwrap();
    let started = Instant::now();
    for i in 0..n {
        let key = format!("key-{i:012}");
        d.set(
            (i % 4) as usize,
            key.as_bytes(),
            &[u8::try_from(i % 256).unwrap(); 32],
            0,
            0,
            i + 1,
            i,
        )
        .unwrap();
        if i % 8192 == 8191 {
            d.tick();
        }
    }
    d.sync();
    let write = started.elapsed();
    drop(d); // no checkpoint: like a crash
    let (d, scan) = Durable::open(FileDevice::open(&path).unwrap(), &opts).unwrap();
    assert!(!scan.from_checkpoint);
    assert_eq!(scan.live_objects as u64, n);
    let (_, written) = d.shutdown().unwrap();
    assert!(written);
    let (d, ck) = Durable::open(FileDevice::open(&path).unwrap(), &opts).unwrap();
    assert!(ck.from_checkpoint);
    assert_eq!(ck.live_objects as u64, n);
    assert_eq!(
        d.get(b"key-000000000007").unwrap().unwrap().value,
        vec![7u8; 32]
    );
    let per_m = |t: std::time::Duration| t.as_secs_f64() * 1e6 / n as f64;
    println!(
        "recovery: {n} objects; write {:.2?}; scan {:.2?} ({:.2} s per million); checkpoint {:.2?} ({:.2} s per million)",
        write,
        scan.elapsed,
        per_m(scan.elapsed),
        ck.elapsed,
        per_m(ck.elapsed)
    );
}
