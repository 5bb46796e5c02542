//! Seeded crash simulation of large objects through `Serving`: uploads (chunks, then the
//! manifest once every chunk is durable), plain writes, deletes and background compaction
//! against a device that loses power at a random operation. After each crash every recovered
//! key is an acked-or-later write, and every recovered manifest's chunks read back exactly.
//!
//! `RINGSTORE_LARGE_SEEDS=N` runs N seeds (default 300).
#![expect(
    clippy::unwrap_used,
    reason = "test code: a failed step fails the test (allow-*-in-tests does not reach an integration test's helpers)"
)]

use std::collections::HashMap;

use ringstore_durable::compactor::{run_to_idle, Compactor};
use ringstore_durable::serving::drive_sync;
use ringstore_durable::sim::{SimDevice, SimRng};
use ringstore_durable::{
    DataKey, Durable, Limits, Manifest, Mutation, Options, RegionLog, Serving,
};

const KEYS: u64 = 8;

/// `sealed`: with a data key (ADR 0050): sealed chunks, manifests and whole-chunk range reads.
fn options(sealed: bool) -> Options {
    Options {
        data_key: sealed.then(|| DataKey::from_bytes([0x3C; 32])),
        regions: 2,
        segment_size: 16 * 1024,
        block_size: 512,
        checkpoint_len: 64 * 1024,
        force: false,
        salvage: false,
        limits: Limits {
            max_batch_bytes: 8192,
            max_pending_writes: 64,
            max_inflight_writes: 2,
            max_inflight_flushes: 2,
        },
    }
}

/// Object bytes derived from the object id, so any mix-up is detectable.
fn object_bytes(object: u64, len: u64) -> Vec<u8> {
    (0..len)
        .map(|i| u8::try_from((i.wrapping_mul(13) ^ object.wrapping_mul(0x9E37)) % 256).unwrap())
        .collect()
}

fn key_name(k: u64) -> Vec<u8> {
    format!("key-{k}").into_bytes()
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum What {
    Plain(Vec<u8>),
    Large(u64),
    Deleted,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    InFlight,
    Acked,
    Failed,
}

/// An upload waiting for its chunks.
struct Upload {
    key: u64,
    manifest: Manifest,
    tokens: Vec<u64>,
    region: usize,
}

#[derive(Default)]
struct Model {
    versions: HashMap<u64, Vec<(What, Fate)>>,
    /// token → (key, version index) for client writes of user keys.
    writes: HashMap<u64, (u64, usize)>,
    /// chunk token → acked?
    chunks: HashMap<u64, Option<bool>>,
    next_token: u64,
}

impl Model {
    fn settle(&mut self, acked: &[u64], failed: &[(u64, Box<[u8]>, u64)]) {
        let done = acked
            .iter()
            .map(|t| (*t, true))
            .chain(failed.iter().map(|f| (f.0, false)));
        for (t, ok) in done {
            if let Some(c) = self.chunks.get_mut(&t) {
                *c = Some(ok);
            } else if let Some((k, i)) = self.writes.remove(&t) {
                self.versions.get_mut(&k).unwrap()[i].1 =
                    if ok { Fate::Acked } else { Fate::Failed };
            }
        }
    }

    fn token(&mut self) -> u64 {
        self.next_token += 1;
        self.next_token
    }
}

fn drive(s: &Serving<SimDevice>, log: &mut RegionLog<u64>, m: &mut Model, c: &mut Compactor) {
    let got = drive_sync(s, log, |r| c.on_relocated(r)).unwrap();
    m.settle(&got.acked, &got.failed);
}

fn verify(s: &Serving<SimDevice>, model: &Model, ctx: &str) -> HashMap<u64, Vec<(What, Fate)>> {
    let mut base = HashMap::new();
    for k in 0..KEYS {
        let got = s
            .lookup(&key_name(k), 0)
            .unwrap_or_else(|e| panic!("{ctx}: key {k}: {e}"));
        let versions = model.versions.get(&k).cloned().unwrap_or_default();
        let last_acked = versions.iter().rposition(|v| v.1 == Fate::Acked);
        let candidates = &versions[last_acked.unwrap_or(0)..];
        let what = match got {
            None => {
                assert!(
                    last_acked.is_none() || candidates.iter().any(|v| v.0 == What::Deleted),
                    "{ctx}: key {k} lost: {versions:?}"
                );
                continue;
            }
            Some(item) if item.large => {
                let m = Manifest::decode(&item.value)
                    .unwrap_or_else(|| panic!("{ctx}: key {k}: bad manifest"));
                let bytes = object_bytes(m.object, m.len);
                assert_eq!(m.head, bytes[..m.head.len()], "{ctx}: key {k} head");
                for i in 0..m.chunks() {
                    let (a, b) = m.chunk_range(i);
                    let chunk = s.read_chunk(m.object, i).unwrap_or_else(|e| {
                        panic!("{ctx}: key {k} object {} chunk {i}: {e}", m.object)
                    });
                    let want = &bytes[usize::try_from(a).unwrap()..usize::try_from(b).unwrap()];
                    assert_eq!(chunk, want, "{ctx}: key {k} chunk {i}");
                    // A few ranges of it, read and verified piece by piece.
                    let mut pick = SimRng::new(m.object ^ u64::from(i));
                    for _ in 0..3 {
                        let x = usize::try_from(pick.below(want.len() as u64 + 1)).unwrap();
                        let y =
                            x + usize::try_from(pick.below((want.len() - x) as u64 + 1)).unwrap();
                        let range = s.read_chunk_range(m.object, i, x, y).unwrap_or_else(|e| {
                            panic!("{ctx}: key {k} object {} chunk {i} {x}..{y}: {e}", m.object)
                        });
                        assert_eq!(range, &want[x..y], "{ctx}: key {k} chunk {i} {x}..{y}");
                    }
                }
                What::Large(m.object)
            }
            Some(item) => What::Plain(item.value),
        };
        assert!(
            candidates.iter().any(|v| v.0 == what),
            "{ctx}: key {k} recovered {what:?} not acked-or-later: {versions:?}"
        );
        base.insert(k, vec![(what, Fate::Acked)]);
    }
    base
}

/// Returns (crash points, recovered manifests checked).
#[expect(
    clippy::too_many_lines,
    reason = "one seeded scenario: uploads, crashes and recovery checks, read in order"
)]
fn run_seed(seed: u64, sealed: bool) -> (usize, usize) {
    let mut rng = SimRng::new(seed);
    let (d, _) = Durable::open(SimDevice::new(1 << 20), &options(sealed)).unwrap();
    let mut s = Serving::new(d);
    let mut model = Model::default();
    let mut crashes = 0;
    let mut manifests = 0;
    let mut ids = Vec::new();
    for round in 0..3 {
        let mut logs = [s.take_log(0).unwrap(), s.take_log(1).unwrap()];
        let mut comps = [Compactor::new(512), Compactor::new(512)];
        let clean = rng.chance(1, 6);
        if !clean {
            s.device().crash_after(rng.below(300));
        }
        let mut uploads: Vec<Upload> = Vec::new();
        for _ in 0..rng.below(200) {
            if s.device().crashed() {
                break;
            }
            let r = usize::try_from(rng.below(2)).unwrap();
            match rng.below(100) {
                0..=14 => {
                    // Start an upload: chunks now, manifest once they are all durable.
                    let len = rng.below(4 * s.chunk_len() as u64);
                    let object = s.next_object_id();
                    ids.push(object);
                    let bytes = object_bytes(object, len);
                    let manifest = Manifest {
                        object,
                        len,
                        chunk_len: u32::try_from(s.chunk_len()).unwrap(),
                        head: bytes[..usize::try_from(len).unwrap().min(64)].to_vec(),
                    };
                    let mut tokens = Vec::new();
                    for i in 0..manifest.chunks() {
                        let (a, b) = manifest.chunk_range(i);
                        let t = model.token();
                        let chunk =
                            &bytes[usize::try_from(a).unwrap()..usize::try_from(b).unwrap()];
                        if s.stage_chunk(&mut logs[r], object, i, chunk, t).is_ok() {
                            model.chunks.insert(t, None);
                            tokens.push(t);
                        }
                    }
                    if tokens.len() == manifest.chunks() as usize {
                        uploads.push(Upload {
                            key: rng.below(KEYS),
                            manifest,
                            tokens,
                            region: r,
                        });
                    }
                }
                15..=49 => {
                    let k = rng.below(KEYS);
                    let t = model.token();
                    let value = format!("v{t}")
                        .into_bytes()
                        .repeat(1 + usize::try_from(rng.below(50)).unwrap());
                    let change = if rng.chance(1, 5) {
                        Mutation::Delete { key: &key_name(k) }
                    } else {
                        Mutation::Put {
                            key: &key_name(k),
                            value: &value,
                            flags: 0,
                            exptime: 0,
                            cas: t,
                            large: false,
                        }
                    };
                    let what = match change {
                        Mutation::Delete { .. } => What::Deleted,
                        _ => What::Plain(value.clone()),
                    };
                    if s.stage(&mut logs[r], change, t).is_ok() {
                        let vs = model.versions.entry(k).or_default();
                        vs.push((what, Fate::InFlight));
                        model.writes.insert(t, (k, vs.len() - 1));
                    }
                }
                50..=89 => {
                    let [l0, l1] = &mut logs;
                    let [c0, c1] = &mut comps;
                    drive(&s, l0, &mut model, c0);
                    drive(&s, l1, &mut model, c1);
                    // Manifests of uploads whose chunks are all durable; drop failed ones.
                    let mut i = 0;
                    while i < uploads.len() {
                        let fates: Vec<_> =
                            uploads[i].tokens.iter().map(|t| model.chunks[t]).collect();
                        if fates.contains(&None) {
                            i += 1;
                            continue;
                        }
                        let u = uploads.swap_remove(i);
                        if fates.contains(&Some(false)) {
                            continue;
                        }
                        let t = model.token();
                        let key = key_name(u.key);
                        let value = u.manifest.encode();
                        let change = Mutation::Put {
                            key: &key,
                            value: &value,
                            flags: 0,
                            exptime: 0,
                            cas: t,
                            large: true,
                        };
                        if s.stage(&mut logs[u.region], change, t).is_ok() {
                            let vs = model.versions.entry(u.key).or_default();
                            vs.push((What::Large(u.manifest.object), Fate::InFlight));
                            model.writes.insert(t, (u.key, vs.len() - 1));
                        }
                    }
                }
                _ => {
                    let _ = run_to_idle(&mut comps[r], &s, &mut logs[r], 0, 200);
                }
            }
        }
        let [l0, l1] = &mut logs;
        let [c0, c1] = &mut comps;
        drive(&s, l0, &mut model, c0);
        drive(&s, l1, &mut model, c1);
        let ctx = format!("seed {seed} round {round}");
        let image = if clean && !s.device().crashed() && comps.iter().all(Compactor::is_idle) {
            for l in logs {
                s.park_log(l);
            }
            s.checkpoint()
                .unwrap_or_else(|e| panic!("{ctx}: checkpoint: {e}"));
            s.device().crash_image(&mut rng)
        } else {
            crashes += 1;
            s.device().crash_image(&mut rng)
        };
        let (d, _) = Durable::open(SimDevice::from_image(image), &options(sealed))
            .unwrap_or_else(|e| panic!("{ctx}: recovery failed: {e}"));
        s = Serving::new(d);
        let base = verify(&s, &model, &ctx);
        // Chunks of objects no recovered manifest names are gone (swept or replaced).
        let live: Vec<u64> = base
            .values()
            .filter_map(|v| match v[0].0 {
                What::Large(o) => Some(o),
                _ => None,
            })
            .collect();
        manifests += live.len();
        for object in ids.iter().filter(|o| !live.contains(o)) {
            assert!(
                s.read_chunk(*object, 0).is_err(),
                "{ctx}: orphan chunk of object {object} survived"
            );
        }
        model = Model {
            versions: base,
            next_token: model.next_token,
            ..Model::default()
        };
    }
    (crashes, manifests)
}

#[test]
fn recovered_manifests_always_have_all_their_chunks() {
    run_seeds(false);
}

#[test]
fn recovered_manifests_always_have_all_their_chunks_with_a_data_key() {
    run_seeds(true);
}

fn run_seeds(sealed: bool) {
    let seeds: u64 = std::env::var("RINGSTORE_LARGE_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(300);
    let (mut crashes, mut manifests) = (0, 0);
    for seed in 0..seeds {
        let (c, m) = run_seed(seed, sealed);
        crashes += c;
        manifests += m;
    }
    println!("large objects (sealed: {sealed}): {seeds} seeds, {crashes} crash points, {manifests} manifests checked");
    assert!(
        crashes > usize::try_from(seeds).unwrap(),
        "too few crash points: {crashes}"
    );
    assert!(
        manifests > usize::try_from(seeds).unwrap(),
        "too few manifests recovered: {manifests}"
    );
}
