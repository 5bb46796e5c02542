//! Byte searches eight bytes at a time in a `u64` (SWAR), for the short spans of a request
//! line (a key, a get's rest of line) where a call into `memchr` costs more than the search:
//! `memchr` took about 100 instructions for a 13-byte key, and a byte loop over a get's key
//! about 190; with these scans a one-key get's whole parse is ~120 (callgrind).
//!
//! Safe code only: words are read with `u64::from_le_bytes`, so the first byte of a span is
//! the lowest byte of its word, and the lowest flagged byte is the first match.

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGHS: u64 = 0x8080_8080_8080_8080;

/// The high bit of each byte of `word` below `n` (`n` ≤ 0x80). Only the lowest flagged byte
/// is exact (a borrow moves up from a byte below `n` and may flag the bytes above it), and
/// only the lowest is read: a byte at or above `n` under every flagged one is never flagged
/// (it subtracts without a borrow; one at 0x80 or above has its high bit masked off by `!word`).
#[inline(always)]
fn below(word: u64, n: u8) -> u64 {
    debug_assert!(n <= 0x80);
    word.wrapping_sub(ONES * u64::from(n)) & !word & HIGHS
}

/// The high bit of each byte of `word` equal to `byte` (lowest exact, as [`below`]).
#[inline(always)]
fn equal(word: u64, byte: u8) -> u64 {
    below(word ^ (ONES * u64::from(byte)), 1)
}

/// Offset of the first byte of `hay` that `word_mask` flags in its word (`byte_is` says the
/// same of one byte, for the tail shorter than a word).
#[inline(always)]
fn first(
    hay: &[u8],
    word_mask: impl Fn(u64) -> u64,
    byte_is: impl Fn(u8) -> bool,
) -> Option<usize> {
    let mut chunks = hay.chunks_exact(8);
    let mut at = 0;
    for chunk in chunks.by_ref() {
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(chunk);
        let flagged = word_mask(u64::from_le_bytes(bytes));
        if flagged != 0 {
            // trailing_zeros of a nonzero u64 is under 64: the byte index fits.
            return Some(at + (flagged.trailing_zeros() / 8) as usize);
        }
        at += 8;
    }
    let tail = chunks.remainder();
    tail.iter().position(|&b| byte_is(b)).map(|i| at + i)
}

/// Offset of the first byte of `hay` that cannot continue a text key: a space, a control
/// byte (below 0x20) or DEL (0x7f); bytes from 0x80 up are key bytes ([`super::key`]).
#[inline]
pub(crate) fn key_stop(hay: &[u8]) -> Option<usize> {
    first(
        hay,
        |w| below(w, 0x21) | equal(w, 0x7f),
        |b| b <= b' ' || b == 0x7f,
    )
}

/// Offset of the first `byte` in `hay`.
#[inline]
pub(crate) fn find(hay: &[u8], byte: u8) -> Option<usize> {
    first(hay, |w| equal(w, byte), |b| b == byte)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn is_stop(b: u8) -> bool {
        b <= b' ' || b == 0x7f
    }

    #[test]
    fn finds_the_first_stop_in_every_position() {
        for len in 0..40 {
            for at in 0..len {
                for stop in [b' ', b'\r', b'\n', 0, 0x1f, 0x7f] {
                    let mut hay = vec![b'k'; len];
                    hay[at] = stop;
                    // A later stop and high bytes never move the answer.
                    if at + 1 < len {
                        hay[at + 1] = 0x80;
                    }
                    hay.push(b' ');
                    assert_eq!(key_stop(&hay), Some(at), "{hay:?}");
                    assert_eq!(find(&hay, stop), Some(at), "{hay:?}");
                }
            }
            assert_eq!(key_stop(&vec![0xff; len]), None);
            assert_eq!(find(&vec![b'x'; len], b' '), None);
        }
    }

    proptest! {
        /// The same answers as a byte loop, on any bytes.
        #[test]
        fn agrees_with_a_byte_loop(hay in prop::collection::vec(any::<u8>(), 0..64), byte in any::<u8>()) {
            prop_assert_eq!(key_stop(&hay), hay.iter().position(|&b| is_stop(b)));
            prop_assert_eq!(find(&hay, byte), hay.iter().position(|&b| b == byte));
        }

        /// ... and on bytes near the edges the masks test (borrows between neighbours).
        #[test]
        fn agrees_near_the_edges(
            hay in prop::collection::vec(prop::sample::select(vec![0u8, 1, 0x1f, 0x20, 0x21, 0x7e, 0x7f, 0x80, 0x81, 0xff, b'k']), 0..40),
            byte in prop::sample::select(vec![0u8, 1, 0x20, 0x7f, 0x80, 0xff]),
        ) {
            prop_assert_eq!(key_stop(&hay), hay.iter().position(|&b| is_stop(b)));
            prop_assert_eq!(find(&hay, byte), hay.iter().position(|&b| b == byte));
        }
    }
}
