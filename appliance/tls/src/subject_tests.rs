//! Tests of the certificate subject: DER read, RFC 4514 strings parsed, the two compared.

use super::*;
use crate::der_builder::{atv, certificate, CN, O};

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
