//! Fuzzes the parsers of bytes read back from the data device: record decoding and segment
//! scanning (what recovery runs over a torn or foreign device), large-object manifests and chunk
//! values, clear and sealed (`--data-key`). Arbitrary bytes never panic, a scan never reports a record past the buffer, and a
//! manifest that decodes re-encodes to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringstore_durable::crypt::Crypt;
use ringstore_durable::large::{chunk_data, chunk_data_len};
use ringstore_durable::record::{decode, scan};
use ringstore_durable::{DataKey, Manifest};

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let seed = rest
        .get(..4)
        .map_or(0, |b| u32::from_le_bytes(b.try_into().expect("4 bytes")));
    // Every other input is read as a sealed device's bytes: a key of the fuzz target's own
    // (nothing ships it), so a sealed record must get its tag right to decode at all.
    let crypt = (selector & 0x80 != 0)
        .then(|| Crypt::reader(&DataKey::from_bytes([7; 32]), [9; 16]).expect("a 32-byte key"));
    let crypt = crypt.as_ref();
    match selector % 3 {
        0 => {
            if let Some(m) = Manifest::decode(rest) {
                assert_eq!(
                    m.encode(),
                    rest,
                    "a decoded manifest re-encodes identically"
                );
                assert!(m.head.len() as u64 <= m.len);
                if m.chunks() > 0 {
                    let (start, end) = m.chunk_range(m.chunks() - 1);
                    assert!(start < end && end == m.len);
                }
            }
        }
        1 => {
            if let Some(r) = decode(rest, seed, crypt) {
                assert!(r.len <= rest.len() && r.key.len() + r.value.len() <= r.len);
            }
            if let Some(d) = chunk_data(rest) {
                assert_eq!(Some(d.len()), chunk_data_len(rest.len()));
            }
        }
        _ => {
            let block = 512usize << (usize::from(selector >> 2) % 4);
            let (end, _) = scan(rest, 0, seed, block, crypt, |at, r| {
                assert!(at + r.len <= rest.len(), "record past the buffer");
            });
            assert!(end <= rest.len());
        }
    }
});
