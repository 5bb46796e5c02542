//! Entity tags: the CAS unique of a stored value, quoted, compared for `If-None-Match` and `If-Range`.

use super::head::{list_items, parse_u64_saturating};

/// `If-None-Match`: true when the field names the current value (weak comparison, RFC 9110 §13.1.2):
/// `*`, or a listed tag `"<cas>"` / `W/"<cas>"`.
pub fn none_match_hits(field: &[u8], cas: u64) -> bool {
    list_items(field).any(|tag| {
        if tag == b"*" {
            return true;
        }
        let tag = tag.strip_prefix(b"W/").unwrap_or(tag);
        opaque_cas(tag) == Some(cas)
    })
}

/// `If-Range`: the range applies only when the field is exactly the current strong tag.
/// A date never matches: we keep no modification times.
pub fn if_range_matches(field: &[u8], cas: u64) -> bool {
    opaque_cas(field) == Some(cas)
}

fn opaque_cas(tag: &[u8]) -> Option<u64> {
    let inner = tag.strip_prefix(b"\"")?.strip_suffix(b"\"")?;
    // Leading zeros would make "07" match cas 7; our tags never have them, so neither may a match.
    if inner.len() > 1 && inner[0] == b'0' {
        return None;
    }
    parse_u64_saturating(inner).filter(|&n| n != u64::MAX || inner == b"18446744073709551615")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn none_match() {
        assert!(none_match_hits(b"\"7\"", 7));
        assert!(none_match_hits(b"W/\"7\"", 7));
        assert!(none_match_hits(b"\"1\", \"7\"", 7));
        assert!(none_match_hits(b"*", 7));
        assert!(!none_match_hits(b"\"8\"", 7));
        assert!(!none_match_hits(b"7", 7));
        assert!(!none_match_hits(b"\"07\"", 7));
        assert!(!none_match_hits(b"\"99999999999999999999999\"", u64::MAX));
        assert!(none_match_hits(b"\"18446744073709551615\"", u64::MAX));
        assert!(!none_match_hits(b"", 7));
    }

    #[test]
    fn if_range() {
        assert!(if_range_matches(b"\"7\"", 7));
        assert!(!if_range_matches(b"W/\"7\"", 7));
        assert!(!if_range_matches(b"Wed, 21 Oct 2015 07:28:00 GMT", 7));
    }
}
