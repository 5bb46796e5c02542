//! Builds DER certificate shapes for tests (this crate's and the service's `--http-tokens`
//! tests): only the fields the subject and certificate readers walk are meaningful.
//! Compiled for this crate's tests and under the `test-util` feature, never in the product.
#![allow(
    clippy::unwrap_used,
    reason = "test-only builder: an element over 64 KiB is a mistake in the test itself"
)]

/// One DER element: tag, definite length (short form or two bytes), content.
pub fn der(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    if content.len() < 0x80 {
        out.push(u8::try_from(content.len()).unwrap());
    } else {
        let len = u16::try_from(content.len()).unwrap().to_be_bytes();
        out.extend_from_slice(&[0x82, len[0], len[1]]);
    }
    out.extend_from_slice(content);
    out
}

/// An attribute (OID content bytes, string tag, value).
pub fn atv(oid: &[u8], tag: u8, value: &[u8]) -> Vec<u8> {
    der(0x30, &[der(0x06, oid), der(tag, value)].concat())
}

/// commonName's OID (2.5.4.3) as content bytes.
pub const CN: &[u8] = &[0x55, 0x04, 0x03];
/// organizationName's OID (2.5.4.10) as content bytes.
pub const O: &[u8] = &[0x55, 0x04, 0x0a];

/// A certificate shape: version, serial, algorithm, issuer, validity, subject, and a
/// trailing field (what follows the subject is not read).
pub fn certificate(rdns: &[Vec<Vec<u8>>]) -> Vec<u8> {
    let name: Vec<u8> = rdns
        .iter()
        .flat_map(|rdn| der(0x31, &rdn.concat()))
        .collect();
    let tbs = [
        der(0xa0, &der(0x02, &[2])),
        der(0x02, &[0x01, 0x02]),
        der(
            0x30,
            &der(0x06, &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x02]),
        ),
        der(0x30, &der(0x31, &atv(CN, 0x0c, b"ca"))),
        der(
            0x30,
            &[der(0x17, b"250101000000Z"), der(0x17, b"350101000000Z")].concat(),
        ),
        der(0x30, &name),
        der(0x30, &[0u8; 200]),
    ]
    .concat();
    der(0x30, &[der(0x30, &tbs), der(0x30, &[1, 2, 3])].concat())
}
