//! Seeded crash simulation: random writes, deletes, ticks, compactions and EIO against a
//! simulated device that loses power at a random operation; after each crash the device is
//! recovered and every acknowledged write must be there, intact.
//!
//! `RINGSTORE_SIM_SEEDS=N` runs N seeds (default 2000), `RINGSTORE_SIM_SEED_BASE` shifts them.
#![expect(
    clippy::unwrap_used,
    reason = "test code: a failed step fails the test (allow-*-in-tests does not reach an integration test's helpers)"
)]

use std::collections::HashMap;
use std::time::Instant;

use ringstore_durable::sim::{SimDevice, SimRng};
use ringstore_durable::{DataKey, Durable, DurableError, Limits, Options};

const KEYS: u64 = 24;
const ROUNDS: usize = 3;

/// The options of a run; `sealed`: with a data key (ADR 0050), the same crashes and faults.
fn options(sealed: bool) -> Options {
    Options {
        data_key: sealed.then(|| DataKey::from_bytes([0x5A; 32])),
        regions: 2,
        segment_size: 16 * 1024,
        block_size: 512,
        checkpoint_len: 64 * 1024,
        force: false,
        salvage: false,
        limits: Limits {
            max_batch_bytes: 4096,
            max_pending_writes: 48,
            max_inflight_writes: 2,
            max_inflight_flushes: 2,
        },
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    InFlight,
    Acked,
    Failed,
}

#[derive(Clone)]
struct Version {
    seq: u64,
    value: Option<Vec<u8>>,
    fate: Fate,
}

impl std::fmt::Debug for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = self
            .value
            .as_ref()
            .map_or("delete".to_string(), |v| format!("{}B", v.len()));
        write!(f, "seq {} {what} {:?}", self.seq, self.fate)
    }
}

/// Value bytes derived from a unique number, so any mix-up or garbage is detectable.
fn value_for(n: u64, len: usize) -> Vec<u8> {
    let mut v = n.to_le_bytes().to_vec();
    v.extend((0..len).map(|i| u8::try_from((usize::try_from(n).unwrap() * 31 + i) % 256).unwrap()));
    v
}

struct Model {
    versions: HashMap<u64, Vec<Version>>,
    tokens: HashMap<u64, (u64, usize)>,
    next_token: u64,
}

impl Model {
    fn ack(&mut self, token: u64, ok: bool) {
        if let Some((key, idx)) = self.tokens.remove(&token) {
            let v = &mut self.versions.get_mut(&key).unwrap()[idx];
            v.fate = if ok { Fate::Acked } else { Fate::Failed };
        }
    }
}

fn key_name(k: u64) -> Vec<u8> {
    format!("key-{k}").into_bytes()
}

/// Check the recovered device against the model; return the new baseline.
fn verify(d: &Durable<SimDevice>, model: &Model, ctx: &str, clean: bool) {
    for k in 0..KEYS {
        let got = d
            .get(&key_name(k))
            .unwrap_or_else(|e| panic!("{ctx}: key {k}: read error {e}"));
        let versions = model.versions.get(&k).cloned().unwrap_or_default();
        let last_acked = versions.iter().rposition(|v| v.fate == Fate::Acked);
        let candidates: Vec<&Version> = match last_acked {
            Some(i) => versions[i..].iter().collect(),
            None => versions.iter().collect(),
        };
        if clean {
            let want = last_acked.map(|i| &versions[i]);
            match (&got, want) {
                (None, None) => {}
                (None, Some(w)) => assert!(
                    w.value.is_none(),
                    "{ctx}: key {k} lost after clean shutdown"
                ),
                (Some(item), Some(w)) => {
                    assert_eq!(
                        (item.seq, Some(&item.value)),
                        (w.seq, w.value.as_ref()),
                        "{ctx}: key {k}"
                    )
                }
                (Some(item), None) => panic!("{ctx}: key {k} has unexpected seq {}", item.seq),
            }
            continue;
        }
        match got {
            Some(item) => {
                assert!(
                    d.max_cas() >= item.cas,
                    "{ctx}: CAS counter not beyond recovered item"
                );
                let ok = candidates
                    .iter()
                    .any(|v| v.seq == item.seq && v.value.as_ref() == Some(&item.value));
                assert!(
                    ok,
                    "{ctx}: key {k} recovered seq {} not acked-or-later in-flight: {versions:?}",
                    item.seq
                );
            }
            None => {
                let ok = last_acked.is_none() || candidates.iter().any(|v| v.value.is_none());
                assert!(ok, "{ctx}: key {k} lost; versions {versions:?}");
            }
        }
    }
}

/// Rebuild the model from what recovery returned: that is now the durable truth.
fn baseline(d: &Durable<SimDevice>) -> Model {
    let mut versions = HashMap::new();
    for k in 0..KEYS {
        if let Ok(Some(item)) = d.get(&key_name(k)) {
            versions.insert(
                k,
                vec![Version {
                    seq: item.seq,
                    value: Some(item.value),
                    fate: Fate::Acked,
                }],
            );
        }
    }
    Model {
        versions,
        tokens: HashMap::new(),
        next_token: 1,
    }
}

/// True when `image` holds a record in clear with one of the run's keys (every one starts
/// with "key-", right after the 48-byte header that starts with "RSR1"): both at once, so
/// ciphertext that happens to hold one of them is no false alarm (2^-64 a place).
fn a_key_in_clear(image: &[u8]) -> bool {
    image
        .windows(52)
        .any(|w| &w[..4] == b"RSR1" && &w[48..] == b"key-")
}

fn run_seed(seed: u64, sealed: bool) -> usize {
    let mut rng = SimRng::new(seed);
    let (mut d, _) = Durable::open(SimDevice::new(512 * 1024), &options(sealed)).unwrap();
    let mut model = baseline(&d);
    let mut crashes = 0;
    for round in 0..ROUNDS {
        let clean = rng.chance(1, 10);
        if !clean {
            d.device().crash_after(rng.below(400));
        }
        if rng.chance(1, 8) {
            let g = d.superblock().geometry;
            let seg = u32::try_from(rng.below(u64::from(g.segments_per_region))).unwrap();
            d.device().inject_write_eio(
                g.segment_offset(u32::try_from(rng.below(2)).unwrap(), seg),
                g.segment_size,
            );
        }
        for _ in 0..rng.below(300) {
            if d.device().crashed() {
                break;
            }
            match rng.below(100) {
                0..=74 => {
                    let k = rng.below(KEYS);
                    let region = usize::try_from(rng.below(2)).unwrap();
                    let token = model.next_token;
                    let is_set = rng.below(100) < 80;
                    let len = usize::try_from(rng.below(1500)).unwrap();
                    let res = if is_set {
                        // Content is derived from the token (unique per write), so a mix-up is detectable.
                        let value = value_for(token, len);
                        d.set(region, &key_name(k), &value, 0, 0, token, token)
                            .map(|seq| (seq, Some(value)))
                    } else {
                        d.delete(region, &key_name(k), token).map(|seq| (seq, None))
                    };
                    match res {
                        Ok((seq, value)) => {
                            let vs = model.versions.entry(k).or_default();
                            vs.push(Version {
                                seq,
                                value,
                                fate: Fate::InFlight,
                            });
                            model.tokens.insert(token, (k, vs.len() - 1));
                            model.next_token += 1;
                        }
                        Err(DurableError::NoSpace) => {
                            let _ = d.maintain(0);
                        }
                        Err(DurableError::Backpressure { .. }) => {
                            for a in d.tick() {
                                model.ack(a.token, a.result.is_ok());
                            }
                        }
                        Err(e) => panic!("seed {seed}: unexpected {e}"),
                    }
                }
                75..=95 => {
                    for a in d.tick() {
                        model.ack(a.token, a.result.is_ok());
                    }
                }
                _ => {
                    let _ = d.maintain(0);
                    let _ = d.compact(0);
                }
            }
        }
        for a in d.tick() {
            model.ack(a.token, a.result.is_ok());
        }
        let ctx = format!("seed {seed} round {round}");
        let image = if clean && !d.device().crashed() {
            d.device().clear_faults();
            match d.shutdown() {
                Ok((dev, _)) => dev.crash_image(&mut rng),
                Err(e) => panic!("{ctx}: clean shutdown failed: {e}"),
            }
        } else {
            crashes += 1;
            let img = d.device().crash_image(&mut rng);
            drop(d);
            img
        };
        // A sealed device must hold no record in clear with a key of the run.
        if sealed {
            assert!(
                !a_key_in_clear(&image),
                "{ctx}: a key in clear on a sealed device"
            );
        }
        let (nd, report) = Durable::open(SimDevice::from_image(image), &options(sealed))
            .unwrap_or_else(|e| panic!("{ctx}: recovery failed: {e}"));
        let clean_ok = clean && report.from_checkpoint;
        verify(&nd, &model, &ctx, clean_ok);
        model = baseline(&nd);
        d = nd;
    }
    crashes
}

/// The check above finds what it looks for: a record of the run on a device in clear.
#[test]
fn the_check_for_keys_in_clear_finds_one_without_a_data_key() {
    let (mut d, _) = Durable::open(SimDevice::new(512 * 1024), &options(false)).unwrap();
    d.set(0, &key_name(3), b"v", 0, 0, 1, 1).unwrap();
    d.tick();
    assert!(a_key_in_clear(&d.device().crash_image(&mut SimRng::new(1))));
    let (mut d, _) = Durable::open(SimDevice::new(512 * 1024), &options(true)).unwrap();
    d.set(0, &key_name(3), b"v", 0, 0, 1, 1).unwrap();
    d.tick();
    assert!(!a_key_in_clear(
        &d.device().crash_image(&mut SimRng::new(1))
    ));
}

#[test]
fn acknowledged_writes_survive_random_crashes() {
    run_seeds(2000, false);
}

/// The same simulation on a device with a data key: sealed records, the sealed checkpoint and
/// the open epoch bumped at every recovery.
#[test]
fn acknowledged_writes_survive_random_crashes_with_a_data_key() {
    run_seeds(2000, true);
}

fn run_seeds(default_seeds: u64, sealed: bool) {
    let seeds: u64 = std::env::var("RINGSTORE_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default_seeds);
    let base: u64 = std::env::var("RINGSTORE_SIM_SEED_BASE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let started = Instant::now();
    let mut crashes = 0;
    for seed in base..base + seeds {
        crashes += run_seed(seed, sealed);
    }
    println!(
        "simulation (sealed: {sealed}): {seeds} seeds, {crashes} crash points, {} rounds, {:.2?}",
        usize::try_from(seeds).unwrap() * ROUNDS,
        started.elapsed()
    );
    assert!(
        crashes > usize::try_from(seeds).unwrap(),
        "too few crash points exercised"
    );
}
