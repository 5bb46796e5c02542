//! A minimal DER reader for what PID 1 and the TLS layer read but never trust (Authenticode's
//! PKCS#7 in `ringstore-bootdisk`, a certificate's subject and validity in `ringstore-tls`): one
//! TLV at a time, single-byte tags, definite lengths of at most four bytes (what PKCS#7 and X.509 use).

/// A DER element: its tag, its content, and the whole encoding (tag and length included).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tlv<'a> {
    pub tag: u8,
    pub content: &'a [u8],
    pub whole: &'a [u8],
}

pub const INTEGER: u8 = 0x02;
pub const BIT_STRING: u8 = 0x03;
pub const OCTET_STRING: u8 = 0x04;
pub const OID: u8 = 0x06;
pub const SEQUENCE: u8 = 0x30;
pub const SET: u8 = 0x31;
pub const UTC_TIME: u8 = 0x17;
pub const GENERALIZED_TIME: u8 = 0x18;
/// `[0]` constructed (EXPLICIT or IMPLICIT SET/SEQUENCE).
pub const CONTEXT_0: u8 = 0xa0;
pub const CONTEXT_1: u8 = 0xa1;

/// Reads elements off the front of a byte string.
#[derive(Debug, Clone, Copy)]
pub struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    pub fn new(bytes: &'a [u8]) -> Reader<'a> {
        Reader { rest: bytes }
    }

    pub fn is_empty(&self) -> bool {
        self.rest.is_empty()
    }

    /// The next element, whatever its tag.
    pub fn any(&mut self) -> Option<Tlv<'a>> {
        let (&tag, after) = self.rest.split_first()?;
        let (&first, after) = after.split_first()?;
        let (len, after) = if first < 0x80 {
            (usize::from(first), after)
        } else {
            let n = usize::from(first & 0x7f);
            if n == 0 || n > 4 || after.len() < n {
                return None;
            }
            let len = after[..n]
                .iter()
                .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
            (len, &after[n..])
        };
        if after.len() < len {
            return None;
        }
        let header = self.rest.len() - after.len();
        let whole = &self.rest[..header + len];
        let content = &after[..len];
        self.rest = &after[len..];
        Some(Tlv {
            tag,
            content,
            whole,
        })
    }

    /// The next element if it has `tag` (consumed), `None` otherwise (not consumed).
    pub fn optional(&mut self, tag: u8) -> Option<Tlv<'a>> {
        let mut peek = *self;
        let tlv = peek.any().filter(|t| t.tag == tag)?;
        *self = peek;
        Some(tlv)
    }

    /// The next element, which must have `tag`.
    pub fn expect(&mut self, tag: u8) -> Option<Tlv<'a>> {
        let tlv = self.any()?;
        (tlv.tag == tag).then_some(tlv)
    }
}

impl<'a> Tlv<'a> {
    /// A reader over this element's content.
    pub fn reader(&self) -> Reader<'a> {
        Reader::new(self.content)
    }
}

/// OIDs in their DER content form.
pub mod oid {
    pub const SIGNED_DATA: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x07, 0x02];
    pub const SPC_INDIRECT_DATA: &[u8] =
        &[0x2b, 0x06, 0x01, 0x04, 0x01, 0x82, 0x37, 0x02, 0x01, 0x04];
    pub const SHA256: &[u8] = &[0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x01];
    pub const CONTENT_TYPE: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x09, 0x03];
    pub const MESSAGE_DIGEST: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x09, 0x04];
    pub const RSA_ENCRYPTION: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01];
    pub const SHA256_WITH_RSA: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0b];
    pub const EC_PUBLIC_KEY: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01];
    pub const ECDSA_WITH_SHA256: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x02];
    pub const P256: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07];
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_and_long_lengths_read_and_truncation_is_refused() {
        let mut r = Reader::new(&[0x04, 0x02, 0xaa, 0xbb, 0x30, 0x81, 0x01, 0x05]);
        let a = r.expect(OCTET_STRING).unwrap();
        assert_eq!((a.content, a.whole.len()), (&[0xaa, 0xbb][..], 4));
        assert!(r.optional(SET).is_none(), "a wrong tag is not consumed");
        let b = r.expect(SEQUENCE).unwrap();
        assert_eq!(b.content, &[0x05]);
        assert!(r.is_empty());
        assert!(Reader::new(&[0x04, 0x03, 0x00]).any().is_none());
        assert!(Reader::new(&[0x04, 0x85, 1, 1, 1, 1, 1]).any().is_none());
        assert!(Reader::new(&[0x04]).any().is_none());
    }
}
