//! Unit tests of the sealed region (ADR 0052): a seal resumed with every item, CAS and TTL
//! exact; every other start cold with its reason, and never a wrong value.

use super::*;

const MEMORY: usize = 64 << 20;

fn config(memory_bytes: usize) -> StoreConfig {
    StoreConfig {
        memory_bytes,
        item_size_max: 1 << 20,
        shards: 4,
        huge_pages: false,
        external_threshold: 0,
    }
}

/// A region holding `image` (zero-extended to what `memory_bytes` needs).
fn region(memory_bytes: usize, image: &[u8]) -> Region {
    let len = Store::region_len(&config(memory_bytes)).expect("len");
    // A fresh anonymous mapping and only the image's non-zero pages copied: the other pages
    // are never touched, so the leaked regions of many opens cost little memory.
    let mut map = memmap2::MmapMut::map_anon(len.max(image.len())).expect("map");
    for (i, page) in image.chunks(4096).enumerate() {
        if page.iter().any(|&b| b != 0) {
            map[i * 4096..i * 4096 + page.len()].copy_from_slice(page);
        }
    }
    Region {
        bytes: Box::leak(Box::new(map)).as_mut(),
        backing: Backing::Normal,
        source: "test".into(),
    }
}

fn open(memory_bytes: usize, image: &[u8], unix_secs: u64) -> Store {
    let at = WallTime { unix_secs, now: 1 };
    Store::open_region(config(memory_bytes), region(memory_bytes, image), at, None).expect("open")
}

fn put(s: &Store, key: &[u8], value: &[u8], flags: u32, exptime: Time, now: Time) -> u64 {
    let meta = NewMeta {
        flags,
        exptime,
        cas: None,
    };
    s.update(key, now, |_| (Write::Put { value, meta }, ()))
        .expect("put")
        .cas
        .expect("cas")
}

/// (value, flags, exptime, cas) of `key`.
fn item(s: &Store, key: &[u8], now: Time) -> Option<(Vec<u8>, u32, Time, u64)> {
    s.get(key, now, ReadOpts::default(), |i| {
        i.map(|i| (i.value.to_vec(), i.flags, i.exptime, i.cas))
    })
}

fn value_of(i: u32) -> Vec<u8> {
    format!("value-{i}-")
        .repeat(1 + (i % 7) as usize)
        .into_bytes()
}

/// A store over a fresh region with `n` items `k{i}`, sealed at Unix time 1000 (store time
/// 100); returns its image and each item's CAS.
fn sealed_with(n: u32) -> (Vec<u8>, Vec<u64>) {
    let s = open(MEMORY, &[], 900);
    let cas = (0..n)
        .map(|i| {
            let exptime = if i % 3 == 0 { 100 + 50 + i } else { NEVER };
            put(
                &s,
                format!("k{i}").as_bytes(),
                &value_of(i),
                i * 7,
                exptime,
                100,
            )
        })
        .collect();
    let at = WallTime {
        unix_secs: 1000,
        now: 100,
    };
    let report = s.seal(at).expect("seal");
    assert_eq!(report.items, u64::from(n));
    (s.region_image(), cas)
}

fn cold_reason(s: &Store) -> String {
    match &s.restart().expect("a region").outcome {
        Outcome::Cold { reason } => reason.clone(),
        other => panic!("expected a cold start, got {other:?}"),
    }
}

#[test]
fn a_seal_resumes_every_item_with_flags_cas_and_ttl() {
    let (image, cas) = sealed_with(5000);
    // Down 10 s: store time 1 here is Unix 1010, so an exptime of 150 + i (Unix 1050 + i)
    // is now 41 + i.
    let s = open(MEMORY, &image, 1010);
    assert!(matches!(
        s.restart().expect("region").outcome,
        Outcome::Resumed {
            items: 5000,
            expired: 0,
            down_secs: 10,
            ..
        }
    ));
    for i in 0..5000u32 {
        let exptime = if i % 3 == 0 { 41 + i } else { NEVER };
        let want = (value_of(i), i * 7, exptime, cas[i as usize]);
        assert_eq!(item(&s, format!("k{i}").as_bytes(), 1), Some(want), "k{i}");
    }
    let max = cas.iter().copied().max().expect("cas");
    assert!(
        put(&s, b"new", b"v", 0, NEVER, 2) > max,
        "the CAS counter continues above"
    );
    assert_eq!(s.stats().curr_items, 5001);
}

#[test]
fn items_that_expired_while_down_are_gone() {
    let (image, _) = sealed_with(300);
    // Down 100 s: exptimes 150 + i (Unix 1050 + i) with i < 51 passed by Unix 1100 + 1.
    let s = open(MEMORY, &image, 1100);
    let Outcome::Resumed { items, expired, .. } = s.restart().expect("region").outcome else {
        panic!("not resumed");
    };
    let gone = (0..300u32)
        .filter(|i| i % 3 == 0 && 1050 + i <= 1100)
        .count() as u64;
    assert_eq!((items, expired), (300 - gone, gone));
    for i in 0..300u32 {
        let got = item(&s, format!("k{i}").as_bytes(), 1);
        assert_eq!(got.is_none(), i % 3 == 0 && 1050 + i <= 1100, "k{i}");
    }
}

#[test]
fn deletes_and_overwrites_stay_as_they_were() {
    let s = open(MEMORY, &[], 900);
    for i in 0..2000u32 {
        put(&s, format!("k{i}").as_bytes(), b"old", 0, NEVER, 1);
    }
    for i in (0..2000u32).step_by(2) {
        put(&s, format!("k{i}").as_bytes(), b"new!", 0, NEVER, 1);
    }
    for i in (0..2000u32).step_by(5) {
        s.update(format!("k{i}").as_bytes(), 1, |_| (Write::Delete, ()))
            .expect("delete");
    }
    s.seal(WallTime {
        unix_secs: 1000,
        now: 1,
    })
    .expect("seal");
    let s = open(MEMORY, &s.region_image(), 1000);
    for i in 0..2000u32 {
        let want: Option<&[u8]> = match (i % 5, i % 2) {
            (0, _) => None,
            (_, 0) => Some(b"new!"),
            _ => Some(b"old"),
        };
        let got = item(&s, format!("k{i}").as_bytes(), 1).map(|i| i.0);
        assert_eq!(got.as_deref(), want, "k{i}");
    }
}

#[test]
fn no_seal_blank_or_another_layout_start_cold_with_the_reason() {
    let blank = open(MEMORY, &[], 1000);
    assert!(
        cold_reason(&blank).starts_with("no seal"),
        "{}",
        cold_reason(&blank)
    );
    put(&blank, b"a", b"1", 0, NEVER, 1);
    // The run stops without a seal (a crash): the image as it is.
    let crashed = open(MEMORY, &blank.region_image(), 1000);
    assert!(
        cold_reason(&crashed).starts_with("not sealed"),
        "{}",
        cold_reason(&crashed)
    );
    assert_eq!(item(&crashed, b"a", 1), None);
    let (image, _) = sealed_with(10);
    let other = open(MEMORY * 2, &image, 1000);
    assert!(
        cold_reason(&other).starts_with("layout changed"),
        "{}",
        cold_reason(&other)
    );
    let mut old = image.clone();
    old[8] = 9; // format version 9
    let older = open(MEMORY, &old, 1000);
    assert!(
        cold_reason(&older).starts_with("format version 9"),
        "{}",
        cold_reason(&older)
    );
    let at = WallTime {
        unix_secs: 1000,
        now: 1,
    };
    let forced = Store::open_region(
        config(MEMORY),
        region(MEMORY, &image),
        at,
        Some("why".into()),
    )
    .expect("open");
    assert_eq!(cold_reason(&forced), "why");
}

#[test]
fn a_region_resumes_once() {
    let (image, _) = sealed_with(10);
    let s = open(MEMORY, &image, 1000);
    assert!(matches!(
        s.restart().expect("region").outcome,
        Outcome::Resumed { items: 10, .. }
    ));
    // Without a new seal the region reads as a crash next time.
    let again = open(MEMORY, &s.region_image(), 1000);
    assert!(cold_reason(&again).starts_with("not sealed"));
}

#[test]
fn a_flipped_byte_never_gives_a_wrong_value() {
    let (image, cas) = sealed_with(3000);
    let used = image.iter().rposition(|&b| b != 0).expect("bytes") + 1;
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    for round in 0..40 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let mut bad = image.clone();
        // Half the flips hit the footer and table, half anywhere written.
        let pick = usize::try_from(seed % (1 << 40)).expect("small");
        let at = if round % 2 == 0 {
            pick % 8192
        } else {
            pick % used
        };
        bad[at] ^= 1 << (seed >> 60 & 7);
        let s = open(MEMORY, &bad, 1000);
        for i in (0..3000u32).step_by(7) {
            if let Some(got) = item(&s, format!("k{i}").as_bytes(), 1) {
                let exptime = if i % 3 == 0 { 51 + i } else { NEVER };
                assert_eq!(
                    got,
                    (value_of(i), i * 7, exptime, cas[i as usize]),
                    "flip at {at}"
                );
            }
        }
    }
}

#[test]
fn a_pending_delayed_flush_empties_the_seal() {
    let s = open(MEMORY, &[], 900);
    put(&s, b"a", b"1", 0, NEVER, 1);
    s.flush_all(1, 50);
    let report = s
        .seal(WallTime {
            unix_secs: 1000,
            now: 2,
        })
        .expect("seal");
    assert_eq!(report.items, 0);
    let s = open(MEMORY, &s.region_image(), 1000);
    assert_eq!(item(&s, b"a", 1), None);
}

#[test]
fn a_store_without_a_region_has_no_seal() {
    let s = Store::new(config(MEMORY)).expect("store");
    assert!(s.restart().is_none());
    assert!(s
        .seal(WallTime {
            unix_secs: 1,
            now: 1
        })
        .is_err());
}
