//! Seeded crash simulation with damage in the middle of flushed history (ADR 0016): random
//! writes, deletes, ticks, compactions and a power loss at a random operation (torn tails as
//! in `simulation.rs`), then one bit flipped in a record, or one 512-byte sector lost (read
//! back as zeros), somewhere a later record of the same segment says was durable. Recovery
//! must refuse the device (`CorruptHistory`): no key may answer a version older than its last
//! acknowledged one without that being reported. With `salvage` it starts, reports the damage,
//! and still never serves bytes that were not written. Undamaged crash images are never
//! reported as corrupt. Damage in the last flushed records of a segment (no later record to
//! vouch for them) is counted and printed: that is the stated limit.
//!
//! `RINGSTORE_CORRUPT_SEEDS=N` runs N seeds (default 1000), `RINGSTORE_SIM_SEED_BASE` shifts them.
#![expect(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed step fails the test (allow-*-in-tests does not reach an integration test's helpers)"
)]

use std::collections::HashMap;

use ringstore_durable::record::{scan, Stamp, HEADER_LEN};
use ringstore_durable::sim::{SimDevice, SimRng};
use ringstore_durable::{DataKey, Durable, DurableError, Limits, Options};

const KEYS: u64 = 16;

/// `sealed`: with a data key (ADR 0050): sealed records, the same damage must be found.
fn options(salvage: bool, sealed: bool) -> Options {
    Options {
        data_key: sealed.then(|| DataKey::from_bytes([0xA5; 32])),
        regions: 2,
        segment_size: 16 * 1024,
        block_size: 512,
        checkpoint_len: 64 * 1024,
        force: false,
        salvage,
        limits: Limits {
            max_batch_bytes: 2048,
            max_pending_writes: 48,
            max_inflight_writes: 2,
            max_inflight_flushes: 2,
        },
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Version {
    seq: u64,
    value: Option<Vec<u8>>,
    acked: bool,
}

fn key_name(k: u64) -> Vec<u8> {
    format!("key-{k}").into_bytes()
}

fn value_for(n: u64, len: usize) -> Vec<u8> {
    let mut v = n.to_le_bytes().to_vec();
    v.extend((0..len).map(|i| u8::try_from((usize::try_from(n).unwrap() * 17 + i) % 256).unwrap()));
    v
}

/// A record of a segment's verified chain: where it is and what its stamp claims.
struct Placed {
    at: usize,
    /// Bytes the crc covers (the padding after them is not part of the record).
    len: usize,
    stamp: Stamp,
}

/// A segment in use, its verified chain, and what its header says about the one before it.
struct Seg {
    region: u32,
    segment: u32,
    base: usize,
    open_seq: u64,
    /// (segment, end, open sequence) of the previous segment, from the header extension.
    prev: Option<(u32, u32, u64)>,
    recs: Vec<Placed>,
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

/// Every segment in use and its verified chain, from the image.
fn chains(img: &[u8], d: &Durable<SimDevice>) -> Vec<Seg> {
    let g = d.superblock().geometry;
    let block = g.block_size as usize;
    let mut out = Vec::new();
    for region in 0..g.regions {
        for segment in 0..g.segments_per_region {
            let base = usize::try_from(g.segment_offset(region, segment)).unwrap();
            let seg = &img[base..base + usize::try_from(g.segment_size).unwrap()];
            let stored = le32(seg, 40);
            if &seg[..8] != b"RSSEGMT1" || crc32c::crc32c(&seg[..40]) != stored {
                continue;
            }
            let prev = (crc32c::crc32c_append(stored, &seg[48..64]) == le32(seg, 64)).then(|| {
                let open_seq = u64::from_le_bytes(seg[56..64].try_into().unwrap());
                (le32(seg, 48), le32(seg, 52), open_seq)
            });
            let mut recs = Vec::new();
            // The bytes the crc covers: a sealed record adds its body's head and tag.
            let extra = if d.crypt().is_some() { 40 + 16 } else { 0 };
            scan(seg, block, stored, block, d.crypt(), |at, rec| {
                recs.push(Placed {
                    at,
                    len: HEADER_LEN + rec.key.len() + rec.value.len() + extra,
                    stamp: rec.stamp,
                })
            });
            out.push(Seg {
                region,
                segment,
                base,
                open_seq: u64::from_le_bytes(seg[32..40].try_into().unwrap()),
                prev,
                recs,
            });
        }
    }
    out
}

/// Whether `got` for key `k` is allowed: a version that was written (never garbage), and,
/// when `strict`, not older than the last acknowledged one.
fn check(versions: &[Version], got: Option<&(u64, Vec<u8>)>, strict: bool) -> Result<(), String> {
    let last = versions.iter().rposition(|v| v.acked);
    let from = if strict { last.unwrap_or(0) } else { 0 };
    let ok = match got {
        Some((seq, value)) => versions[from..]
            .iter()
            .any(|v| v.seq == *seq && v.value.as_ref() == Some(value)),
        None => last.is_none() || !strict || versions[from..].iter().any(|v| v.value.is_none()),
    };
    if ok {
        Ok(())
    } else {
        Err(format!("got {got:?}, versions {versions:?}"))
    }
}

fn read_all(d: &Durable<SimDevice>) -> HashMap<u64, (u64, Vec<u8>)> {
    (0..KEYS)
        .filter_map(|k| {
            let item = d.get(&key_name(k)).expect("a read")?;
            Some((k, (item.seq, item.value)))
        })
        .collect()
}

#[derive(Default, Debug)]
struct Tally {
    refused: usize,
    flips: usize,
    lost_sectors: usize,
    unvouched: usize,
    unvouched_rolled_back: usize,
}

#[expect(
    clippy::too_many_lines,
    reason = "one seeded scenario: writes, crash, damage, recovery and the verdict on it, read in order"
)]
fn run_seed(seed: u64, t: &mut Tally, sealed: bool) {
    let mut rng = SimRng::new(seed);
    let (mut d, _) = Durable::open(SimDevice::new(256 * 1024), &options(false, sealed)).unwrap();
    let mut versions: HashMap<u64, Vec<Version>> = HashMap::new();
    let mut tokens: HashMap<u64, (u64, usize)> = HashMap::new();
    let mut next = 1u64;
    d.device().crash_after(100 + rng.below(300));
    let ack = |acks: Vec<ringstore_durable::Ack>,
               versions: &mut HashMap<u64, Vec<Version>>,
               tokens: &mut HashMap<u64, (u64, usize)>| {
        for a in acks {
            if let Some((k, i)) = tokens.remove(&a.token) {
                versions.get_mut(&k).unwrap()[i].acked = a.result.is_ok();
            }
        }
    };
    for _ in 0..400 {
        if d.device().crashed() {
            break;
        }
        match rng.below(100) {
            0..=69 => {
                let k = rng.below(KEYS);
                let region = usize::try_from(rng.below(2)).unwrap();
                let res = if rng.below(100) < 80 {
                    let value = value_for(next, usize::try_from(rng.below(700)).unwrap());
                    d.set(region, &key_name(k), &value, 0, 0, next, next)
                        .map(|seq| (seq, Some(value)))
                } else {
                    d.delete(region, &key_name(k), next).map(|seq| (seq, None))
                };
                match res {
                    Ok((seq, value)) => {
                        let vs = versions.entry(k).or_default();
                        vs.push(Version {
                            seq,
                            value,
                            acked: false,
                        });
                        tokens.insert(next, (k, vs.len() - 1));
                        next += 1;
                    }
                    Err(DurableError::NoSpace) => {
                        let _ = d.maintain(0);
                    }
                    Err(DurableError::Backpressure { .. }) => {
                        ack(d.tick(), &mut versions, &mut tokens)
                    }
                    Err(e) => panic!("seed {seed}: unexpected {e}"),
                }
            }
            70..=96 => ack(d.tick(), &mut versions, &mut tokens),
            _ => {
                let _ = d.maintain(0);
                let _ = d.compact(0);
            }
        }
    }
    ack(d.tick(), &mut versions, &mut tokens);
    let img = d.device().crash_image(&mut rng);
    let ctx = format!("seed {seed}");
    // The crash alone is a torn tail: never reported, nothing acknowledged lost.
    let (plain, rep) = Durable::open(SimDevice::from_image(img.clone()), &options(false, sealed))
        .unwrap_or_else(|e| panic!("{ctx}: undamaged crash image refused: {e}"));
    assert!(rep.damaged.is_empty());
    let got = read_all(&plain);
    for k in 0..KEYS {
        let vs = versions.get(&k).cloned().unwrap_or_default();
        check(&vs, got.get(&k), true).unwrap_or_else(|e| panic!("{ctx}: key {k}: {e}"));
    }

    // Damage: a flipped bit in a record, or a lost sector, inside flushed history.
    let segs = chains(&img, &d);
    let mut vouched = Vec::new(); // (first byte, bytes, flip?) choices recovery must catch
    let mut unvouched = Vec::new();
    for sg in &segs {
        // The header of the segment written after this one, once that one has an
        // acknowledged record, vouches for this one up to the end it names.
        let cross = segs
            .iter()
            .filter(|t| t.region == sg.region && t.recs.iter().any(|r| r.stamp.durable > 0))
            .filter_map(|t| t.prev)
            .filter(|&(seg, _, open_seq)| seg == sg.segment && open_seq == sg.open_seq)
            .map(|(_, end, _)| end as usize)
            .max();
        let recs = &sg.recs;
        for (i, x) in recs.iter().enumerate() {
            let claim = recs[i + 1..].iter().map(|r| r.stamp.durable).max();
            let across = cross.is_some_and(|end| {
                // A claim on a block boundary needs only the block before it reached.
                x.at < end && (end % 512 != 0 || x.at.div_ceil(512) * 512 < end)
            });
            if claim.is_some_and(|c| c as usize > x.at) || across {
                vouched.push((sg.base + x.at, x.len, true));
            } else {
                unvouched.push((sg.base + x.at, x.len));
            }
            // A lost sector starting in this record: caught when a record that is not the
            // first one wholly after the sector claims the segment durable past this record.
            let sector = x.at.div_ceil(512) * 512;
            let after: Vec<&Placed> = recs.iter().filter(|r| r.at >= sector + 512).collect();
            if sector < x.at + x.len
                && after.len() >= 2
                && after[1..].iter().any(|r| r.stamp.durable as usize > x.at)
            {
                vouched.push((sg.base + sector, 512, false));
            }
        }
    }
    if let Some(&(at, len, flip)) =
        vouched.get(usize::try_from(rng.below(vouched.len().max(1) as u64)).unwrap())
    {
        let mut bad = img.clone();
        if flip {
            let o = usize::try_from(rng.below(len as u64)).unwrap();
            bad[at + o] ^= 1 << rng.below(8);
            t.flips += 1;
        } else {
            bad[at..at + len].fill(0);
            t.lost_sectors += 1;
        }
        match Durable::open(SimDevice::from_image(bad.clone()), &options(false, sealed)) {
            Err(DurableError::CorruptHistory { places, .. }) => {
                assert!(places >= 1);
                t.refused += 1;
            }
            other => panic!(
                "{ctx}: damage at {at} ({}) not reported: {:?}",
                if flip { "flip" } else { "lost sector" },
                other.map(|o| o.1)
            ),
        }
        let (s, rep) = Durable::open(SimDevice::from_image(bad), &options(true, sealed))
            .unwrap_or_else(|e| panic!("{ctx}: salvage failed: {e}"));
        assert!(!rep.damaged.is_empty(), "{ctx}: salvage reports the damage");
        let got = read_all(&s);
        for k in 0..KEYS {
            let vs = versions.get(&k).cloned().unwrap_or_default();
            check(&vs, got.get(&k), false).unwrap_or_else(|e| {
                panic!("{ctx}: salvage served unwritten bytes for key {k}: {e}")
            });
        }
    }
    // The stated limit: a record no later record of its segment vouches for.
    if let Some(&(at, len)) =
        unvouched.get(usize::try_from(rng.below(unvouched.len().max(1) as u64)).unwrap())
    {
        let mut bad = img;
        bad[at + usize::try_from(rng.below(len as u64)).unwrap()] ^= 1 << rng.below(8);
        t.unvouched += 1;
        if let Ok((s, _)) = Durable::open(SimDevice::from_image(bad), &options(false, sealed)) {
            let got = read_all(&s);
            let mut rolled_back = false;
            for k in 0..KEYS {
                let vs = versions.get(&k).cloned().unwrap_or_default();
                check(&vs, got.get(&k), false)
                    .unwrap_or_else(|e| panic!("{ctx}: unwritten bytes served for key {k}: {e}"));
                rolled_back |= check(&vs, got.get(&k), true).is_err();
            }
            t.unvouched_rolled_back += usize::from(rolled_back);
        }
    }
}

#[test]
fn damage_in_flushed_history_is_reported_never_served_as_an_older_value() {
    run_seeds(1000, false);
}

/// The same on a device with a data key: a damaged sealed record is found as damage too.
#[test]
fn damage_in_sealed_history_is_reported_never_served_as_an_older_value() {
    run_seeds(1000, true);
}

fn run_seeds(default_seeds: u64, sealed: bool) {
    let seeds: u64 = std::env::var("RINGSTORE_CORRUPT_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default_seeds);
    let base: u64 = std::env::var("RINGSTORE_SIM_SEED_BASE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let mut t = Tally::default();
    for seed in base..base + seeds {
        run_seed(seed, &mut t, sealed);
    }
    println!("corruption simulation (sealed: {sealed}): {seeds} seeds: {t:?}");
    assert!(
        t.flips > usize::try_from(seeds).unwrap() / 4
            && t.lost_sectors > usize::try_from(seeds).unwrap() / 20,
        "too few damage cases exercised: {t:?}"
    );
    assert_eq!(t.refused, t.flips + t.lost_sectors);
}
