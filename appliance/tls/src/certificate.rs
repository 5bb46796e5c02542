//! What an operator needs to know of a server certificate (the appliance's console `certs`,
//! `status` and `tuning`): its subject as RFC 4514 text and the end of its validity, read
//! from the DER by walking the fields up to the subject (the TLS layer parses and uses the
//! certificate; this reads, never trusts).

use crate::subject::{tbs_fields, Subject};
use ringstore_proto::der;
use ringstore_sys::days_from_civil;

/// A certificate's subject and `notAfter`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertificateSummary {
    /// RFC 4514 (`CN=cache.example,O=Example\, Inc.,C=DE`).
    pub subject: String,
    /// `notAfter` in seconds since the Unix epoch (UTC).
    pub not_after: i64,
}

/// Seconds in a day, for days to expiry.
pub const DAY_SECS: i64 = 86_400;

impl CertificateSummary {
    /// Of DER certificate `der`; `None` if it does not have an X.509 shape.
    pub fn from_der(der: &[u8]) -> Option<CertificateSummary> {
        // Serial, signature algorithm, issuer: skipped.
        let mut validity = tbs_fields(der, 3)?.expect(der::SEQUENCE)?.reader();
        let _not_before = validity.any()?;
        let not_after = validity.any()?;
        Some(CertificateSummary {
            subject: Subject::from_certificate(der)?.to_string(),
            not_after: der_time(not_after.tag, not_after.content)?,
        })
    }

    /// Whole days from `now` (Unix seconds) to the end of validity; negative once expired.
    pub fn days_left(&self, now: i64) -> i64 {
        (self.not_after - now).div_euclid(DAY_SECS)
    }
}

/// A DER UTCTime (`YYMMDDHHMMSSZ`, years 1950-2049) or GeneralizedTime (`YYYYMMDDHHMMSSZ`)
/// in Unix seconds. Only the `Z` forms DER allows.
fn der_time(tag: u8, text: &[u8]) -> Option<i64> {
    let digits = text.strip_suffix(b"Z")?;
    if !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let num = |range: std::ops::Range<usize>| -> Option<i64> {
        std::str::from_utf8(digits.get(range)?).ok()?.parse().ok()
    };
    let (year, rest) = match (tag, digits.len()) {
        (der::UTC_TIME, 12) => {
            let yy = num(0..2)?;
            (if yy < 50 { 2000 + yy } else { 1900 + yy }, 2)
        }
        (der::GENERALIZED_TIME, 14) => (num(0..4)?, 4),
        _ => return None,
    };
    let field = |i: usize| num(rest + 2 * i..rest + 2 * i + 2);
    let (month, day, hour, min, sec) = (field(0)?, field(1)?, field(2)?, field(3)?, field(4)?);
    let valid =
        (1..=12).contains(&month) && (1..=31).contains(&day) && hour < 24 && min < 60 && sec < 61;
    valid.then(|| days_from_civil(year, month, day) * DAY_SECS + hour * 3600 + min * 60 + sec)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The DER of the first CERTIFICATE block of `pem` (a test-only base64 decoder).
    fn der_of(pem: &str) -> Vec<u8> {
        let body: String = pem
            .lines()
            .skip_while(|l| !l.starts_with("-----BEGIN CERTIFICATE"))
            .skip(1)
            .take_while(|l| !l.starts_with("-----END"))
            .collect();
        let alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let mut out = Vec::new();
        let (mut acc, mut bits) = (0u32, 0);
        for c in body.bytes().filter(|&c| c != b'=') {
            let v = u32::try_from(alphabet.iter().position(|&a| a == c).unwrap()).unwrap();
            acc = (acc << 6) | v;
            bits += 6;
            if bits >= 8 {
                bits -= 8;
                out.push(u8::try_from((acc >> bits) & 0xff).unwrap());
            }
        }
        out
    }

    // Made with `openssl req -x509 -subj "/C=DE/O=Example\, Inc./CN=cache.example" -days 3650`
    // and `-subj /CN=far.example -days 40000` (a GeneralizedTime); the subjects and dates are
    // what `openssl x509 -noout -subject -nameopt RFC2253 -enddate` printed.
    const UTC: &str = include_str!("testdata/cert-utctime.pem");
    const GENERALIZED: &str = include_str!("testdata/cert-generalizedtime.pem");

    #[test]
    fn subject_and_expiry_are_what_openssl_prints() {
        let s = CertificateSummary::from_der(&der_of(UTC)).unwrap();
        assert_eq!(s.subject, "CN=cache.example,O=Example\\, Inc.,C=DE");
        assert_eq!(s.not_after, 2_111_641_139);
        let far = CertificateSummary::from_der(&der_of(GENERALIZED)).unwrap();
        assert_eq!(far.subject, "CN=far.example");
        assert_eq!(far.not_after, 5_252_281_139);
    }

    #[test]
    fn days_left_counts_whole_days_and_goes_negative() {
        let s = CertificateSummary {
            subject: String::new(),
            not_after: 100 * DAY_SECS,
        };
        assert_eq!(s.days_left(86 * DAY_SECS + 1), 13);
        assert_eq!(s.days_left(86 * DAY_SECS), 14);
        assert_eq!(s.days_left(100 * DAY_SECS + 1), -1);
    }

    #[test]
    fn not_a_certificate_or_a_bad_time_is_none() {
        assert_eq!(CertificateSummary::from_der(b""), None);
        assert_eq!(
            CertificateSummary::from_der(&[0x30, 0x03, 0x30, 0x01]),
            None
        );
        let der = der_of(UTC);
        for cut in [1, 10, der.len() / 2, der.len() - 1] {
            assert_eq!(CertificateSummary::from_der(&der[..cut]), None, "{cut}");
        }
        assert_eq!(der_time(0x17, b"361130065859"), None, "no Z");
        assert_eq!(der_time(0x17, b"361330065859Z"), None, "month 13");
        assert_eq!(der_time(0x18, b"361130065859Z"), None, "short");
        assert_eq!(der_time(0x17, b"700101000000Z"), Some(0));
        assert_eq!(der_time(0x17, b"491231235959Z"), Some(2_524_607_999));
    }
}
