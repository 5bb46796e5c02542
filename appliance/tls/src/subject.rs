//! A certificate subject (X.501 Name) as `--http-tokens` maps it: read from a client
//! certificate's DER (only the fields up to the subject are walked; the TLS layer verified
//! the certificate) or from the RFC 4514 string an operator writes in the tokens file
//! (`CN=app1,O=Example`, what `openssl x509 -noout -subject -nameopt RFC2253` prints).
//! Two subjects are equal when they have the same RDNs in the same order, each with the same
//! attribute types and values (attribute names are case-insensitive, escapes are decoded).

/// Longest subject string in a tokens file, and longest value kept from a certificate.
pub const SUBJECT_MAX: usize = 1024;
/// Most attributes (over all RDNs) a subject may have.
const ATTRIBUTES_MAX: usize = 32;

use ringstore_proto::der::{self, Reader};

/// One attribute: its OID in dotted form, and its value (the string's bytes as UTF-8, or
/// `#` and the lowercase hex of the whole DER element for a value that is not a string).
type Attribute = (String, Vec<u8>);

/// A subject: its RDNs in certificate (DER) order, each RDN's attributes sorted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subject(Vec<Vec<Attribute>>);

/// Attribute names the string form may use, with their OIDs (RFC 4514 §3 and common use).
pub(crate) const NAMES: &[(&str, &str)] = &[
    ("CN", "2.5.4.3"),
    ("C", "2.5.4.6"),
    ("L", "2.5.4.7"),
    ("ST", "2.5.4.8"),
    ("STREET", "2.5.4.9"),
    ("O", "2.5.4.10"),
    ("OU", "2.5.4.11"),
    ("SERIALNUMBER", "2.5.4.5"),
    ("DC", "0.9.2342.19200300.100.1.25"),
    ("UID", "0.9.2342.19200300.100.1.1"),
    ("EMAILADDRESS", "1.2.840.113549.1.9.1"),
];

/// A reader over DER certificate `der`'s tbsCertificate fields from the one after the first
/// `skip` (not counting the optional `[0]` version) to the end.
pub(crate) fn tbs_fields(der: &[u8], skip: usize) -> Option<Reader<'_>> {
    let certificate = Reader::new(der).expect(der::SEQUENCE)?;
    let mut tbs = certificate.reader().expect(der::SEQUENCE)?.reader();
    tbs.optional(der::CONTEXT_0);
    for _ in 0..skip {
        tbs.any()?;
    }
    Some(tbs)
}

/// The dotted form of a DER OID's content.
fn dotted(oid: &[u8]) -> Option<String> {
    let mut parts: Vec<u64> = Vec::new();
    let mut value: u64 = 0;
    for &b in oid {
        value = value.checked_mul(128)? | u64::from(b & 0x7f);
        if b & 0x80 == 0 {
            parts.push(value);
            value = 0;
        }
    }
    let (&first, tail) = parts.split_first()?;
    if oid.last().is_some_and(|b| b & 0x80 != 0) {
        return None;
    }
    let (x, y) = if first < 80 {
        (first / 40, first % 40)
    } else {
        (2, first - 80)
    };
    let mut out = format!("{x}.{y}");
    for p in tail {
        out.push('.');
        out.push_str(&p.to_string());
    }
    Some(out)
}

fn hex_of(bytes: &[u8]) -> Vec<u8> {
    let mut out = vec![b'#'];
    for b in bytes {
        out.extend_from_slice(format!("{b:02x}").as_bytes());
    }
    out
}

/// A DER attribute value as the string form compares it.
fn value_of(tag: u8, content: &[u8], whole: &[u8]) -> Vec<u8> {
    match tag {
        // UTF8String, PrintableString, TeletexString, IA5String, VisibleString.
        0x0c | 0x13 | 0x14 | 0x16 | 0x1a => content.to_vec(),
        // BMPString: UTF-16BE.
        0x1e if content.len().is_multiple_of(2) => {
            let units = content.chunks(2).map(|c| u16::from_be_bytes([c[0], c[1]]));
            match String::from_utf16(&units.collect::<Vec<_>>()) {
                Ok(s) => s.into_bytes(),
                Err(_) => hex_of(whole),
            }
        }
        _ => hex_of(whole),
    }
}

/// One RDN (a SET of AttributeTypeAndValue) of a DER Name.
fn rdn_of(mut set: Reader<'_>, count: &mut usize) -> Option<Vec<Attribute>> {
    let mut rdn = Vec::new();
    while !set.is_empty() {
        let mut atv = set.expect(der::SEQUENCE)?.reader();
        let oid = atv.expect(der::OID)?.content;
        let value = atv.any()?;
        *count += 1;
        if *count > ATTRIBUTES_MAX || value.whole.len() > SUBJECT_MAX {
            return None;
        }
        rdn.push((
            dotted(oid)?,
            value_of(value.tag, value.content, value.whole),
        ));
    }
    rdn.sort();
    (!rdn.is_empty()).then_some(rdn)
}

impl Subject {
    /// The subject of a DER X.509 certificate; `None` if it does not have that shape.
    pub fn from_certificate(der: &[u8]) -> Option<Subject> {
        // Serial, signature algorithm, issuer, validity: skipped.
        let mut name = tbs_fields(der, 4)?.expect(der::SEQUENCE)?.reader();
        let mut rdns = Vec::new();
        let mut count = 0;
        while !name.is_empty() {
            rdns.push(rdn_of(name.expect(der::SET)?.reader(), &mut count)?);
        }
        Some(Subject(rdns))
    }

    /// The RFC 4514 string `text` (`CN=app1,O=Example`; `+` joins the attributes of one RDN;
    /// `\,` or `\2c` escape a byte; a value starting with `#` is hex DER). `None` when it is
    /// not one.
    pub fn parse(text: &str) -> Option<Subject> {
        if text.is_empty() || text.len() > SUBJECT_MAX {
            return None;
        }
        let mut rdns = Vec::new();
        let mut count = 0;
        for rdn_text in split_unescaped(text.as_bytes(), b',') {
            let mut rdn = Vec::new();
            for atv in split_unescaped(rdn_text, b'+') {
                count += 1;
                if count > ATTRIBUTES_MAX {
                    return None;
                }
                rdn.push(attribute(atv)?);
            }
            rdn.sort();
            rdns.push(rdn);
        }
        // The string form lists the last RDN first.
        rdns.reverse();
        Some(Subject(rdns))
    }
}

/// `bytes` cut at each `sep` that no backslash escapes.
fn split_unescaped(bytes: &[u8], sep: u8) -> Vec<&[u8]> {
    let mut parts = Vec::new();
    let (mut start, mut i) = (0, 0);
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 1,
            b if b == sep => {
                parts.push(&bytes[start..i]);
                start = i + 1;
            }
            _ => {}
        }
        i += 1;
    }
    parts.push(&bytes[start..]);
    parts
}

/// `TYPE=VALUE` of the string form.
fn attribute(atv: &[u8]) -> Option<Attribute> {
    let eq = atv.iter().position(|&b| b == b'=')?;
    let name = std::str::from_utf8(&atv[..eq]).ok()?.trim();
    let oid = match NAMES
        .iter()
        .find(|(short, _)| short.eq_ignore_ascii_case(name))
    {
        Some((_, oid)) => (*oid).to_string(),
        None if !name.is_empty() && name.bytes().all(|b| b.is_ascii_digit() || b == b'.') => {
            name.to_string()
        }
        None => return None,
    };
    let raw = &atv[eq + 1..];
    if let Some(hex) = raw.strip_prefix(b"#") {
        let ok =
            !hex.is_empty() && hex.len().is_multiple_of(2) && hex.iter().all(u8::is_ascii_hexdigit);
        return ok.then(|| (oid, [b"#".as_slice(), &hex.to_ascii_lowercase()].concat()));
    }
    Some((oid, unescape(raw)?))
}

/// A value with its backslash escapes decoded (`\,` and `\2c` both give `,`).
fn unescape(raw: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        if raw[i] != b'\\' {
            out.push(raw[i]);
            i += 1;
            continue;
        }
        let next = *raw.get(i + 1)?;
        let pair = raw
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok());
        match pair.and_then(|h| u8::from_str_radix(h, 16).ok()) {
            Some(byte) if next.is_ascii_hexdigit() => {
                out.push(byte);
                i += 3;
            }
            _ => {
                out.push(next);
                i += 2;
            }
        }
    }
    Some(out)
}

/// The RFC 4514 string (`CN=app1,O=Example,C=DE`: the last RDN first, as `openssl x509
/// -noout -subject -nameopt RFC2253` prints it), with the short names above.
impl std::fmt::Display for Subject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, rdn) in self.0.iter().rev().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            for (j, (oid, value)) in rdn.iter().enumerate() {
                if j > 0 {
                    f.write_str("+")?;
                }
                let name = NAMES
                    .iter()
                    .find(|(_, o)| o == oid)
                    .map_or(oid.as_str(), |(n, _)| n);
                write!(f, "{name}={}", escaped(value))?;
            }
        }
        Ok(())
    }
}

/// A value with RFC 4514's specials escaped (`,` `+` `"` `\` `<` `>` `;`, a leading `#` or
/// space, a trailing space); a hex value (`#...`) as it is.
fn escaped(value: &[u8]) -> String {
    let text = String::from_utf8_lossy(value);
    if value.first() == Some(&b'#') && value.len() > 1 {
        return text.into_owned();
    }
    let last = text.chars().count().saturating_sub(1);
    let mut out = String::with_capacity(text.len());
    for (i, c) in text.chars().enumerate() {
        let special = matches!(c, ',' | '+' | '"' | '\\' | '<' | '>' | ';')
            || (i == 0 && matches!(c, '#' | ' '))
            || (i == last && c == ' ');
        if special {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
#[path = "subject_tests.rs"]
mod tests;
