//! Tests of the certificate subject: DER read, RFC 4514 strings parsed, the two compared.

use super::*;

fn der(tag: u8, content: &[u8]) -> Vec<u8> {
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
pub(crate) fn atv(oid: &[u8], tag: u8, value: &[u8]) -> Vec<u8> {
    der(0x30, &[der(0x06, oid), der(tag, value)].concat())
}

pub(crate) const CN: &[u8] = &[0x55, 0x04, 0x03];
pub(crate) const O: &[u8] = &[0x55, 0x04, 0x0a];

/// A certificate shape: version, serial, algorithm, issuer, validity, subject, and a
/// trailing field (what follows the subject is not read).
pub(crate) fn certificate(rdns: &[Vec<Vec<u8>>]) -> Vec<u8> {
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

#[test]
fn a_certificate_subject_equals_its_rfc4514_string() {
    let cert = certificate(&[
        vec![atv(O, 0x13, b"Example, Inc")],
        vec![atv(CN, 0x0c, b"app1")],
    ]);
    let subject = Subject::from_certificate(&cert).unwrap();
    assert_eq!(
        Subject::parse(r"CN=app1,O=Example\, Inc"),
        Some(subject.clone())
    );
    assert_eq!(
        Subject::parse(r"cn=app1,o=Example\2c Inc"),
        Some(subject.clone())
    );
    assert_eq!(
        Subject::parse(r"2.5.4.3=app1,2.5.4.10=Example\2C Inc"),
        Some(subject.clone())
    );
    // Order matters; so do the values and the types.
    assert_ne!(
        Subject::parse(r"O=Example\, Inc,CN=app1"),
        Some(subject.clone())
    );
    assert_ne!(
        Subject::parse(r"CN=app2,O=Example\, Inc"),
        Some(subject.clone())
    );
    assert_ne!(
        Subject::parse(r"OU=app1,O=Example\, Inc"),
        Some(subject.clone())
    );
    assert_ne!(Subject::parse("CN=app1"), Some(subject));
}

#[test]
fn multi_valued_rdns_and_other_string_types() {
    let cert = certificate(&[vec![atv(CN, 0x1e, &[0, b'a', 0, b'b']), atv(O, 0x16, b"x")]]);
    let subject = Subject::from_certificate(&cert).unwrap();
    assert_eq!(Subject::parse("O=x+CN=ab"), Some(subject.clone()));
    assert_eq!(Subject::parse("CN=ab+O=x"), Some(subject));
    // A value that is not a string compares as #hex of its DER element.
    let cert = certificate(&[vec![atv(CN, 0x04, &[0xab, 0xcd])]]);
    let subject = Subject::from_certificate(&cert).unwrap();
    assert_eq!(Subject::parse("CN=#0402ABCD"), Some(subject));
}

#[test]
fn malformed_strings_and_certificates_are_refused() {
    for bad in [
        "", "CN", "=x", "CN=a,", "XX=a", "CN=#abc", "CN=#zz", r"CN=a\",
    ] {
        assert_eq!(Subject::parse(bad), None, "{bad:?}");
    }
    assert_eq!(
        Subject::parse(&format!("CN={}", "a".repeat(SUBJECT_MAX))),
        None
    );
    let many = vec!["CN=a"; ATTRIBUTES_MAX + 1].join(",");
    assert_eq!(Subject::parse(&many), None);
    let cert = certificate(&[vec![atv(CN, 0x0c, b"app1")]]);
    for cut in [0, 1, 10, 60, 100] {
        assert_eq!(
            Subject::from_certificate(&cert[..cut]),
            None,
            "cut at {cut}"
        );
    }
    assert_eq!(
        Subject::from_certificate(&[0x30, 0x85, 1, 1, 1, 1, 1]),
        None
    );
    let tall: Vec<Vec<u8>> = (0..=ATTRIBUTES_MAX).map(|_| atv(CN, 0x0c, b"a")).collect();
    assert_eq!(Subject::from_certificate(&certificate(&[tall])), None);
}
