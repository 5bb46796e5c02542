//! Seeded crash simulation of a full device that evicts (ADR 0039): two regions written far
//! beyond their size with overwrites and deletes through both, each region's compactor run
//! between batches (compacting, or evicting its oldest segment), some writes left in flight in
//! the other region while one evicts, and power lost at a random operation. While serving and
//! after recovery, every key answers its newest acknowledged state, a newer write that was in
//! flight, or a miss (evicted): never a value older than its newest acknowledged write, which
//! is what an evicted record's key would show if recovery found an older record of it.
//! `data-full refuse` keeps today's behaviour: values are refused, nothing is evicted.
//!
//! `RINGSTORE_SIM_SEEDS=N` runs N seeds (default 150), `RINGSTORE_SIM_SEED_BASE` shifts them.
#![expect(
    clippy::unwrap_used,
    reason = "test code: a failed step fails the test (allow-*-in-tests does not reach an integration test's helpers)"
)]

use std::collections::HashMap;

use ringstore_durable::compactor::run_to_idle;
use ringstore_durable::serving::drive_sync;
use ringstore_durable::sim::{SimDevice, SimRng};
use ringstore_durable::{
    Compactor, DataFull, Durable, DurableError, Limits, Mutation, Options, RegionLog, Reserve,
    Serving,
};

const KEYS: u64 = 1200;

fn options() -> Options {
    Options {
        data_key: None,
        regions: 2,
        segment_size: 16 * 1024,
        block_size: 512,
        checkpoint_len: 64 * 1024,
        force: false,
        salvage: false,
        limits: Limits::default(),
    }
}

fn value_for(n: u64, len: usize) -> Vec<u8> {
    let mut v = n.to_le_bytes().to_vec();
    v.extend((0..len).map(|i| u8::try_from((n % 256 * 31 + i as u64) % 256).unwrap()));
    v
}

fn key_name(k: u64) -> Vec<u8> {
    format!("key-{k}").into_bytes()
}

/// One write of a key: (seq, value or delete, acked).
type Version = (u64, Option<Vec<u8>>, bool);

/// Per key, every write in sequence order.
#[derive(Default)]
struct Model {
    versions: HashMap<u64, Vec<Version>>,
    tokens: HashMap<u64, (u64, u64)>,
}

impl Model {
    fn settle(&mut self, acked: &[u64]) {
        for t in acked {
            if let Some((k, seq)) = self.tokens.remove(t) {
                let v = self.versions.get_mut(&k).unwrap();
                if let Some(e) = v.iter_mut().find(|e| e.0 == seq) {
                    e.2 = true;
                }
            }
        }
    }

    /// `got` is allowed for key `k`: a miss, or a value written no earlier than the newest
    /// acknowledged write of the key.
    fn check(&self, k: u64, got: Option<&[u8]>, ctx: &str) {
        let Some(got) = got else { return };
        let versions = self.versions.get(&k).map_or(&[][..], Vec::as_slice);
        let floor = versions
            .iter()
            .filter(|e| e.2)
            .map(|e| e.0)
            .max()
            .unwrap_or(0);
        let ok = versions
            .iter()
            .any(|e| e.0 >= floor && e.1.as_deref() == Some(got));
        assert!(
            ok,
            "{ctx}: key {k} answered a value that is not its newest acknowledged state \
             (or a newer write): {} bytes, versions {:?}",
            got.len(),
            versions
                .iter()
                .map(|e| (e.0, e.1.as_ref().map(Vec::len), e.2))
                .collect::<Vec<_>>()
        );
    }
}

/// Stages one random write of a random key into `log`.
fn stage_one(
    s: &Serving<SimDevice>,
    log: &mut RegionLog<u64>,
    rng: &mut SimRng,
    model: &mut Model,
    token: u64,
) -> Result<u64, DurableError> {
    let k = rng.below(KEYS);
    let key = key_name(k);
    let value = value_for(token, 100 + usize::try_from(rng.below(900)).unwrap());
    let delete = rng.chance(1, 10);
    let m = if delete {
        Mutation::Delete { key: &key }
    } else {
        Mutation::Put {
            key: &key,
            value: &value,
            flags: 0,
            exptime: 0,
            cas: token,
            large: false,
        }
    };
    let seq = s.stage(log, m, token)?;
    let v = model.versions.entry(k).or_default();
    v.push((seq, (!delete).then_some(value), false));
    model.tokens.insert(token, (k, seq));
    Ok(seq)
}

fn verify_recovered(image: Vec<u8>, model: &Model, ctx: &str) {
    let (d, _) = Durable::open(SimDevice::from_image(image), &options())
        .unwrap_or_else(|e| panic!("{ctx}: recovery refused the device: {e}"));
    for k in 0..KEYS {
        let got = d.get(&key_name(k)).unwrap().map(|i| i.value);
        model.check(k, got.as_deref(), ctx);
    }
}

/// One seed: returns (records evicted, writes acknowledged).
fn run_seed(seed: u64) -> (u64, usize) {
    let mut rng = SimRng::new(seed);
    let s = Serving::new(
        Durable::open(SimDevice::new(512 * 1024), &options())
            .unwrap()
            .0,
    );
    let block = s.superblock().geometry.block_size;
    let mut logs = [s.take_log(0).unwrap(), s.take_log(1).unwrap()];
    let mut compactors = [Compactor::new(block), Compactor::new(block)];
    let mut model = Model::default();
    let mut token = 0u64;
    let mut acked = 0;
    let crash_at = 300 + rng.below(2500);
    s.device().crash_after(crash_at);
    for round in 0..400 {
        let r = usize::try_from(rng.below(2)).unwrap();
        let other = 1 - r;
        // Writes of the other region stay in flight while this one compacts or evicts.
        let mut floor = u64::MAX;
        for _ in 0..rng.below(4) {
            token += 1;
            let seq = stage_one(&s, &mut logs[other], &mut rng, &mut model, token).unwrap();
            floor = floor.min(seq);
        }
        s.set_pending_floor(other, floor);
        for _ in 0..1 + rng.below(8) {
            token += 1;
            stage_one(&s, &mut logs[r], &mut rng, &mut model, token)
                .unwrap_or_else(|e| panic!("seed {seed} round {round}: {e}"));
        }
        let got = drive_sync(&s, &mut logs[r], |x| compactors[r].on_relocated(x)).unwrap();
        acked += got.acked.len();
        model.settle(&got.acked);
        run_to_idle(&mut compactors[r], &s, &mut logs[r], 0, 10_000).unwrap();
        let got = drive_sync(&s, &mut logs[other], |x| compactors[other].on_relocated(x)).unwrap();
        acked += got.acked.len();
        model.settle(&got.acked);
        s.set_pending_floor(other, u64::MAX);
        if s.device().crashed() {
            break;
        }
        for k in 0..KEYS {
            let got = s.lookup(&key_name(k), 0).unwrap().map(|i| i.value);
            model.check(
                k,
                got.as_deref(),
                &format!("seed {seed} round {round}, serving"),
            );
        }
    }
    let image = s.device().crash_image(&mut rng);
    verify_recovered(image, &model, &format!("seed {seed}, after the crash"));
    (s.evictions().objects, acked)
}

#[test]
fn a_full_device_evicts_and_never_brings_back_an_older_value() {
    let seeds: u64 = std::env::var("RINGSTORE_SIM_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(150);
    let base: u64 = std::env::var("RINGSTORE_SIM_SEED_BASE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let (mut evicted, mut acked) = (0, 0);
    for seed in base..base + seeds {
        let (e, a) = run_seed(seed);
        evicted += e;
        acked += a;
    }
    eprintln!("{seeds} seeds: {evicted} records evicted, {acked} writes acknowledged");
    assert!(
        evicted > 10 * seeds,
        "the device never filled enough to evict: {evicted} evictions, {acked} writes"
    );
}

/// A client-sized write of `key`: the value `ok`.
fn small_put(key: &[u8], cas: u64) -> Mutation<'_> {
    Mutation::Put {
        key,
        value: b"ok",
        flags: 0,
        exptime: 0,
        cas,
        large: false,
    }
}

#[test]
fn refuse_mode_refuses_values_and_evicts_nothing() {
    let s = Serving::new(
        Durable::open(SimDevice::new(256 * 1024), &options())
            .unwrap()
            .0,
    )
    .with_data_full(DataFull::Refuse);
    let mut log = s.take_log(0).unwrap();
    let mut c = Compactor::new(s.superblock().geometry.block_size);
    let value = vec![5u8; 1000];
    let mut stored = 0u64;
    let err = loop {
        let key = format!("fill{stored}");
        let put = Mutation::Put {
            key: key.as_bytes(),
            value: &value,
            flags: 0,
            exptime: 0,
            cas: stored + 1,
            large: false,
        };
        match s.stage(&mut log, put, stored + 1) {
            Ok(_) => stored += 1,
            Err(e) => break e,
        }
        drive_sync(&s, &mut log, |x| c.on_relocated(x)).unwrap();
        run_to_idle(&mut c, &s, &mut log, 0, 10_000).unwrap();
    };
    assert!(matches!(err, DurableError::NoSpace), "{err}");
    assert_eq!(s.evictions().objects, 0);
    for i in 0..stored {
        let got = s.lookup(format!("fill{i}").as_bytes(), 0).unwrap();
        assert_eq!(got.map(|i| i.value), Some(value.clone()), "fill{i} kept");
    }
    // Small values fill what the large ones left, until they too are refused.
    let mut small = 0u64;
    while small < 100_000 {
        let key = format!("pad{small}");
        match s.stage(&mut log, small_put(key.as_bytes(), stored + 1), stored + 1) {
            Ok(_) => small += 1,
            Err(DurableError::NoSpace) => break,
            Err(e) => panic!("pad{small}: {e}"),
        }
        drive_sync(&s, &mut log, |_| {}).unwrap();
    }
    assert!(small < 100_000, "small values never filled the device");
    // A client's write is refused whatever its key: the canary's names take no reserve.
    for key in [
        &b"ringstore-canary-x"[..],
        b"ringstore-update-canary",
        b"/ringstore-canary-1",
    ] {
        let err = s.stage(&mut log, small_put(key, stored + 2), stored + 2);
        let err = err.unwrap_err();
        assert!(matches!(err, DurableError::NoSpace), "{key:?}: {err}");
    }
    // Deletes still fit: the delete reserve is untouched.
    let delete = Mutation::Delete { key: b"fill0" };
    s.stage(&mut log, delete, stored + 3).unwrap();
    drive_sync(&s, &mut log, |_| {}).unwrap();
    assert!(s.lookup(b"fill0", 0).unwrap().is_none(), "fill0 deleted");
    // The appliance's own in-process writer chooses the delete reserve explicitly.
    let internal = small_put(b"any-internal-key", stored + 4);
    s.stage_reserving(&mut log, internal, stored + 4, Reserve::Internal)
        .unwrap();
    drive_sync(&s, &mut log, |_| {}).unwrap();
    assert_eq!(
        s.lookup(b"any-internal-key", 0).unwrap().map(|i| i.value),
        Some(b"ok".to_vec())
    );
}

#[test]
fn the_oldest_keys_are_evicted_first_and_named_for_their_ram_copies() {
    let s = Serving::new(
        Durable::open(SimDevice::new(256 * 1024), &options())
            .unwrap()
            .0,
    );
    let mut log = s.take_log(0).unwrap();
    let mut c = Compactor::new(s.superblock().geometry.block_size);
    let value = vec![7u8; 700];
    let mut named = Vec::new();
    for i in 0..2000u64 {
        let key = format!("k{i}");
        let put = Mutation::Put {
            key: key.as_bytes(),
            value: &value,
            flags: 0,
            exptime: 0,
            cas: 1000 + i,
            large: false,
        };
        s.stage(&mut log, put, i + 1)
            .unwrap_or_else(|e| panic!("k{i} refused: {e}"));
        drive_sync(&s, &mut log, |x| c.on_relocated(x)).unwrap();
        run_to_idle(&mut c, &s, &mut log, 0, 10_000).unwrap();
        named.extend(c.take_evicted());
    }
    let ev = s.evictions();
    assert!(ev.objects > 1000 && ev.segments > 0, "{ev:?}");
    assert_eq!(ev.objects, named.len() as u64);
    assert_eq!(c.stats().evicted, ev.objects);
    let kept: Vec<u64> = (0..2000)
        .filter(|i| s.lookup(format!("k{i}").as_bytes(), 0).unwrap().is_some())
        .collect();
    assert_eq!(
        kept.len() as u64 + ev.objects,
        2000,
        "every key is kept or evicted"
    );
    // FIFO: every evicted key is older than every kept one, and named with its own CAS.
    let first_kept = kept[0];
    assert!(
        kept.windows(2).all(|w| w[1] == w[0] + 1),
        "kept keys are the newest run"
    );
    for (key, cas) in &named {
        let i: u64 = std::str::from_utf8(&key[1..]).unwrap().parse().unwrap();
        assert!(i < first_kept, "k{i} evicted while k{first_kept} was kept");
        assert_eq!(*cas, 1000 + i);
    }
    // The same after a crash: evicted keys stay misses.
    let image = s.device().crash_image(&mut SimRng::new(1));
    let (d, _) = Durable::open(SimDevice::from_image(image), &options()).unwrap();
    for i in 0..2000u64 {
        let got = d.get(format!("k{i}").as_bytes()).unwrap();
        assert_eq!(got.is_some(), i >= first_kept, "k{i} after the crash");
    }
}
