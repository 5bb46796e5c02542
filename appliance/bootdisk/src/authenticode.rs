//! Whether the firmware would start an EFI image under Secure Boot, checked before PID 1
//! writes it to a slot (ADR 0051): the PE's Authenticode digest (SHA-256, computed as EDK2
//! and sbsign compute it), the PKCS#7 SignedData in its certificate table (the digest it
//! signs must be the image's, the signed attributes' messageDigest must be the hash of that
//! SpcIndirectDataContent, the signer's RSA or ECDSA P-256 signature over the attributes must
//! verify, with ring), and the signer's certificate: in db itself, or issued (signature
//! checked) by a db certificate directly or through intermediates the signature carries. An
//! image whose hash is in db passes unsigned; a hash or certificate in dbx refuses. Time and
//! key usage are not checked: the firmware does not check them either.

use ring::{digest, signature};

use ringstore_proto::der::{self, oid, Reader, Tlv};

/// How many certificates from the signer up a chain may be, the signer included.
const MAX_CHAIN: usize = 4;
/// `EFI_CERT_X509_GUID` and `EFI_CERT_SHA256_GUID` as they are stored (mixed-endian).
const X509_GUID: [u8; 16] = [
    0xa1, 0x59, 0xc0, 0xa5, 0xe4, 0x94, 0xa7, 0x4a, 0x87, 0xb5, 0xab, 0x15, 0x5c, 0x2b, 0xf0, 0x72,
];
const SHA256_GUID: [u8; 16] = [
    0x26, 0x16, 0xc4, 0xc1, 0x4c, 0x50, 0x92, 0x40, 0xac, 0xa9, 0x41, 0xf9, 0x36, 0x93, 0x43, 0x28,
];
/// `WIN_CERT_TYPE_PKCS_SIGNED_DATA`.
const PKCS_SIGNED_DATA: u16 = 0x0002;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthenticodeError {
    #[error("not a PE32+ image: {0}")]
    NotPe(&'static str),
    #[error("no Authenticode signature (unsigned)")]
    Unsigned,
    #[error("malformed Authenticode signature: {0}")]
    Malformed(&'static str),
    #[error("unsupported Authenticode signature: {0}")]
    Unsupported(&'static str),
    #[error("the image does not match its Authenticode signature (changed after signing)")]
    DigestMismatch,
    #[error("the Authenticode signature does not verify with its signer's key")]
    BadSignature,
    #[error("signed by {0}, which no certificate in the firmware's db vouches for")]
    Untrusted(String),
    #[error("revoked by the firmware's dbx: {0}")]
    Revoked(&'static str),
    #[error("malformed EFI signature list: {0}")]
    BadList(&'static str),
}

use AuthenticodeError as E;

/// The X.509 certificates and SHA-256 image hashes of an EFI signature database (db, dbx).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SignatureDb {
    /// DER certificates.
    pub certs: Vec<Vec<u8>>,
    pub sha256: Vec<[u8; 32]>,
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<usize> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?) as usize)
}

impl SignatureDb {
    /// Parses concatenated `EFI_SIGNATURE_LIST`s; entries of other types are skipped.
    pub fn parse(mut lists: &[u8]) -> Result<SignatureDb, AuthenticodeError> {
        let mut db = SignatureDb::default();
        while !lists.is_empty() {
            let bad = E::BadList("truncated list header");
            let kind = lists.get(..16).ok_or(bad.clone())?;
            let size = u32_at(lists, 16).ok_or(bad.clone())?;
            let header = u32_at(lists, 20).ok_or(bad.clone())?;
            let each = u32_at(lists, 24).ok_or(bad)?;
            let body = lists
                .get(28 + header..size)
                .ok_or(E::BadList("list size past its end"))?;
            if each <= 16 || body.len() % each != 0 {
                return Err(E::BadList("signature size"));
            }
            for entry in body.chunks(each) {
                let data = &entry[16..];
                if kind == X509_GUID {
                    db.certs.push(data.to_vec());
                } else if kind == SHA256_GUID {
                    db.sha256
                        .push(data.try_into().map_err(|_| E::BadList("SHA-256 size"))?);
                }
            }
            lists = &lists[size..];
        }
        Ok(db)
    }

    /// From an efivarfs file (`db-…`, `dbx-…`): four attribute bytes, then the lists.
    pub fn from_efivar(bytes: &[u8]) -> Result<SignatureDb, AuthenticodeError> {
        SignatureDb::parse(bytes.get(4..).ok_or(E::BadList("no attributes"))?)
    }
}

/// A PE32+ image's Authenticode digest and its certificate table (empty when unsigned).
struct Pe<'a> {
    digest: [u8; 32],
    table: &'a [u8],
}

/// The Authenticode SHA-256 of `image`: the headers without the checksum and the
/// certificate table's directory entry, the sections in file order, then any data after
/// them up to the certificate table (which must end the file).
/// Where a PE image's optional header and section table start, and how many sections.
struct Coff {
    opt: usize,
    table: usize,
    count: usize,
}

fn coff(image: &[u8]) -> Result<Coff, AuthenticodeError> {
    let hdr = E::NotPe("truncated headers");
    if image.get(..2) != Some(b"MZ") {
        return Err(E::NotPe("no MZ header"));
    }
    let pe = u32_at(image, 0x3c).ok_or(hdr.clone())?;
    if image.get(pe..pe + 4) != Some(b"PE\0\0") {
        return Err(E::NotPe("no PE signature"));
    }
    let coff = pe + 4;
    let count = usize::from(u16_at(image, coff + 2).ok_or(hdr.clone())?);
    let opt = coff + 20;
    let table = opt + usize::from(u16_at(image, coff + 16).ok_or(hdr)?);
    Ok(Coff { opt, table, count })
}

fn pe(image: &[u8]) -> Result<Pe<'_>, AuthenticodeError> {
    let hdr = E::NotPe("truncated headers");
    let Coff { opt, table, count } = coff(image)?;
    if u16_at(image, opt) != Some(0x20b) {
        return Err(E::NotPe("not PE32+"));
    }
    let headers = u32_at(image, opt + 60).ok_or(hdr.clone())?;
    let dir = opt + 144;
    if u32_at(image, opt + 108).ok_or(hdr.clone())? < 5
        || headers > image.len()
        || dir + 8 > headers
    {
        return Err(E::NotPe("no certificate table directory"));
    }
    let (cert_at, cert_size) = (
        u32_at(image, dir).ok_or(hdr.clone())?,
        u32_at(image, dir + 4).ok_or(hdr)?,
    );
    if cert_size != 0 && cert_at.checked_add(cert_size) != Some(image.len()) {
        return Err(E::Malformed("the certificate table does not end the file"));
    }
    let mut ctx = digest::Context::new(&digest::SHA256);
    ctx.update(&image[..opt + 64]);
    ctx.update(&image[opt + 68..dir]);
    ctx.update(&image[dir + 8..headers]);
    let mut sections = Vec::with_capacity(count);
    for i in 0..count {
        let h = table + i * 40;
        let size = u32_at(image, h + 16).ok_or(E::NotPe("truncated section table"))?;
        let at = u32_at(image, h + 20).ok_or(E::NotPe("truncated section table"))?;
        if size != 0 {
            sections.push((at, size));
        }
    }
    sections.sort_unstable();
    let mut hashed = headers;
    for (at, size) in sections {
        ctx.update(
            image
                .get(at..at + size)
                .ok_or(E::NotPe("section past the end"))?,
        );
        hashed += size;
    }
    let end = image.len() - cert_size;
    if end > hashed {
        ctx.update(&image[hashed..end]);
    }
    let mut out = [0u8; 32];
    out.copy_from_slice(ctx.finish().as_ref());
    let table = if cert_size == 0 {
        &[][..]
    } else {
        &image[cert_at..]
    };
    Ok(Pe { digest: out, table })
}

/// The bytes of `image`'s section `name` (`.linux`, `.initrd`, `.cmdline` of a UKI: what a
/// kexec jump loads, ADR 0054), at most its virtual size (the raw size is padded to the
/// file alignment); `None` when the image has no such section.
pub fn section<'a>(image: &'a [u8], name: &str) -> Result<Option<&'a [u8]>, AuthenticodeError> {
    let Coff { table, count, .. } = coff(image)?;
    for i in 0..count {
        let h = table + i * 40;
        let raw_name = image
            .get(h..h + 8)
            .ok_or(E::NotPe("truncated section table"))?;
        let end = raw_name.iter().position(|b| *b == 0).unwrap_or(8);
        if &raw_name[..end] != name.as_bytes() {
            continue;
        }
        let virt = u32_at(image, h + 8).ok_or(E::NotPe("truncated section table"))?;
        let size = u32_at(image, h + 16).ok_or(E::NotPe("truncated section table"))?;
        let at = u32_at(image, h + 20).ok_or(E::NotPe("truncated section table"))?;
        let len = if virt == 0 { size } else { virt.min(size) };
        let bytes = image
            .get(at..at + len)
            .ok_or(E::NotPe("section past the end"))?;
        return Ok(Some(bytes));
    }
    Ok(None)
}

/// The PKCS#7 blobs of a certificate table (`WIN_CERTIFICATE`s, 8-byte aligned).
fn pkcs7_blobs(mut table: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    while let (Some(len), Some(kind)) = (u32_at(table, 0), u16_at(table, 6)) {
        let Some(body) = table.get(8..len) else { break };
        if kind == PKCS_SIGNED_DATA {
            out.push(body);
        }
        table = table.get(len.next_multiple_of(8)..).unwrap_or_default();
    }
    out
}

/// What an X.509 certificate says that the check needs.
struct Cert<'a> {
    whole: &'a [u8],
    tbs: &'a [u8],
    serial: &'a [u8],
    issuer: &'a [u8],
    subject: &'a [u8],
    key_alg: &'a [u8],
    key_curve: Option<&'a [u8]>,
    key: &'a [u8],
    sig_alg: &'a [u8],
    sig: &'a [u8],
}

/// An AlgorithmIdentifier's OID and, if its parameter is an OID, that one.
fn algorithm<'a>(alg: &Tlv<'a>) -> Option<(&'a [u8], Option<&'a [u8]>)> {
    let mut r = alg.reader();
    let id = r.expect(der::OID)?.content;
    Some((id, r.optional(der::OID).map(|t| t.content)))
}

/// A BIT STRING's bytes (no unused bits allowed).
fn bits<'a>(t: &Tlv<'a>) -> Option<&'a [u8]> {
    match t.content.split_first() {
        Some((0, rest)) => Some(rest),
        _ => None,
    }
}

fn cert(whole: &[u8]) -> Option<Cert<'_>> {
    let outer = Reader::new(whole).expect(der::SEQUENCE)?;
    let mut r = outer.reader();
    let tbs = r.expect(der::SEQUENCE)?;
    let (sig_alg, _) = algorithm(&r.expect(der::SEQUENCE)?)?;
    let sig = bits(&r.expect(der::BIT_STRING)?)?;
    let mut t = tbs.reader();
    t.optional(der::CONTEXT_0);
    let serial = t.expect(der::INTEGER)?.content;
    t.expect(der::SEQUENCE)?;
    let issuer = t.expect(der::SEQUENCE)?.whole;
    t.expect(der::SEQUENCE)?;
    let subject = t.expect(der::SEQUENCE)?.whole;
    let mut spki = t.expect(der::SEQUENCE)?.reader();
    let (key_alg, key_curve) = algorithm(&spki.expect(der::SEQUENCE)?)?;
    let key = bits(&spki.expect(der::BIT_STRING)?)?;
    Some(Cert {
        whole: outer.whole,
        tbs: tbs.whole,
        serial,
        issuer,
        subject,
        key_alg,
        key_curve,
        key,
        sig_alg,
        sig,
    })
}

/// Whether `sig` over `msg` by `alg` (a signature or, in a SignerInfo, a key algorithm
/// with SHA-256 as the digest) verifies with `by`'s key: RSA PKCS#1 v1.5 or ECDSA P-256.
fn verifies(by: &Cert, alg: &[u8], msg: &[u8], sig: &[u8]) -> bool {
    let scheme: &dyn signature::VerificationAlgorithm = match (by.key_alg, alg) {
        (oid::RSA_ENCRYPTION, oid::SHA256_WITH_RSA | oid::RSA_ENCRYPTION) => {
            &signature::RSA_PKCS1_2048_8192_SHA256
        }
        (oid::EC_PUBLIC_KEY, oid::ECDSA_WITH_SHA256) if by.key_curve == Some(oid::P256) => {
            &signature::ECDSA_P256_SHA256_ASN1
        }
        _ => return false,
    };
    signature::UnparsedPublicKey::new(scheme, by.key)
        .verify(msg, sig)
        .is_ok()
}

/// The parts of an Authenticode SignedData the check uses.
struct Signed<'a> {
    /// SpcIndirectDataContent's content octets: what messageDigest hashes.
    indirect: &'a [u8],
    image_digest: &'a [u8],
    certs: Vec<Cert<'a>>,
    issuer: &'a [u8],
    serial: &'a [u8],
    /// The signed attributes, `[0] IMPLICIT`: signed as a SET.
    attrs: Tlv<'a>,
    sig_alg: &'a [u8],
    sig: &'a [u8],
}

fn signed_data(blob: &[u8]) -> Option<Signed<'_>> {
    let mut ci = Reader::new(blob).expect(der::SEQUENCE)?.reader();
    (ci.expect(der::OID)?.content == oid::SIGNED_DATA).then_some(())?;
    let mut sd = ci
        .expect(der::CONTEXT_0)?
        .reader()
        .expect(der::SEQUENCE)?
        .reader();
    sd.expect(der::INTEGER)?;
    sd.expect(der::SET)?;
    let mut content = sd.expect(der::SEQUENCE)?.reader();
    (content.expect(der::OID)?.content == oid::SPC_INDIRECT_DATA).then_some(())?;
    let indirect = content
        .expect(der::CONTEXT_0)?
        .reader()
        .expect(der::SEQUENCE)?;
    let mut spc = indirect.reader();
    spc.expect(der::SEQUENCE)?;
    let mut digest_info = spc.expect(der::SEQUENCE)?.reader();
    let (alg, _) = algorithm(&digest_info.expect(der::SEQUENCE)?)?;
    (alg == oid::SHA256).then_some(())?;
    let image_digest = digest_info.expect(der::OCTET_STRING)?.content;
    let mut certs = Vec::new();
    if let Some(list) = sd.optional(der::CONTEXT_0) {
        let mut r = list.reader();
        while let Some(c) = r.any() {
            certs.push(cert(c.whole)?);
        }
    }
    sd.optional(der::CONTEXT_1);
    let mut si = sd
        .expect(der::SET)?
        .reader()
        .expect(der::SEQUENCE)?
        .reader();
    si.expect(der::INTEGER)?;
    let mut ias = si.expect(der::SEQUENCE)?.reader();
    let issuer = ias.expect(der::SEQUENCE)?.whole;
    let serial = ias.expect(der::INTEGER)?.content;
    (algorithm(&si.expect(der::SEQUENCE)?)?.0 == oid::SHA256).then_some(())?;
    let attrs = si.expect(der::CONTEXT_0)?;
    let (sig_alg, _) = algorithm(&si.expect(der::SEQUENCE)?)?;
    let sig = si.expect(der::OCTET_STRING)?.content;
    Some(Signed {
        indirect: indirect.content,
        image_digest,
        certs,
        issuer,
        serial,
        attrs,
        sig_alg,
        sig,
    })
}

/// The signed attributes' messageDigest, if the content type is SpcIndirectDataContent.
fn message_digest<'a>(attrs: &Tlv<'a>) -> Option<&'a [u8]> {
    let mut r = attrs.reader();
    let (mut digest, mut typed) = (None, false);
    while let Some(attr) = r.any() {
        let mut a = attr.reader();
        let kind = a.expect(der::OID)?.content;
        let mut values = a.expect(der::SET)?.reader();
        if kind == oid::CONTENT_TYPE {
            typed = values.expect(der::OID)?.content == oid::SPC_INDIRECT_DATA;
        } else if kind == oid::MESSAGE_DIGEST {
            digest = Some(values.expect(der::OCTET_STRING)?.content);
        }
    }
    digest.filter(|_| typed)
}

/// A Name for messages: its common name (`CN=…`), else its organization (`O=…`), else
/// `a certificate`.
fn common_name(name: &[u8]) -> String {
    const CN: &[u8] = &[0x55, 0x04, 0x03];
    const O: &[u8] = &[0x55, 0x04, 0x0a];
    let mut rdns = Reader::new(name)
        .expect(der::SEQUENCE)
        .map(|t| t.reader())
        .unwrap_or(Reader::new(&[]));
    let (mut cn, mut org) = (None, None);
    while let Some(rdn) = rdns.any() {
        let mut atv = rdn
            .reader()
            .any()
            .map(|t| t.reader())
            .unwrap_or(Reader::new(&[]));
        let kind = atv.expect(der::OID).map(|o| o.content);
        let value = atv
            .any()
            .map(|v| String::from_utf8_lossy(v.content).into_owned());
        match kind {
            Some(CN) => cn = value.map(|v| format!("CN={v}")),
            Some(O) => org = value.map(|v| format!("O={v}")),
            _ => {}
        }
    }
    cn.or(org).unwrap_or_else(|| "a certificate".into())
}

/// Whether `signer` chains to a db certificate (through `bundle`); revoked when a
/// certificate on the way is in dbx.
fn chains(
    signer: &Cert,
    bundle: &[Cert],
    db: &[Cert],
    dbx: &SignatureDb,
) -> Result<bool, AuthenticodeError> {
    let mut current = signer;
    for _ in 0..MAX_CHAIN {
        if dbx.certs.iter().any(|c| c == current.whole) {
            return Err(E::Revoked("a certificate of the signature's chain"));
        }
        if db.iter().any(|c| c.whole == current.whole) {
            return Ok(true);
        }
        let issued_by = |c: &&Cert| {
            c.subject == current.issuer
                && c.whole != current.whole
                && verifies(c, current.sig_alg, current.tbs, current.sig)
        };
        if db.iter().find(issued_by).is_some() {
            return Ok(true);
        }
        match bundle.iter().find(issued_by) {
            Some(up) => current = up,
            None => return Ok(false),
        }
    }
    Ok(false)
}

/// One SignedData blob checked against the image digest and db: the signer's name.
fn check_blob(
    blob: &[u8],
    digest: &[u8; 32],
    db: &[Cert],
    dbx: &SignatureDb,
) -> Result<String, AuthenticodeError> {
    let s = signed_data(blob).ok_or(E::Unsupported(
        "not SHA-256 Authenticode SignedData with one signer",
    ))?;
    if s.image_digest != digest {
        return Err(E::DigestMismatch);
    }
    let want = digest::digest(&digest::SHA256, s.indirect);
    if message_digest(&s.attrs) != Some(want.as_ref()) {
        return Err(E::Malformed(
            "messageDigest is not the hash of the signed content",
        ));
    }
    let signer = s
        .certs
        .iter()
        .find(|c| c.issuer == s.issuer && c.serial == s.serial)
        .ok_or(E::Malformed(
            "the signer's certificate is not in the signature",
        ))?;
    let mut attrs = s.attrs.whole.to_vec();
    attrs[0] = der::SET;
    if !verifies(signer, s.sig_alg, &attrs, s.sig) {
        return Err(E::BadSignature);
    }
    let name = common_name(signer.subject);
    if chains(signer, &s.certs, db, dbx)? {
        Ok(format!("signed by {name}, trusted by db"))
    } else {
        Err(E::Untrusted(name))
    }
}

/// Whether the firmware, with `db` and `dbx`, would start `image`: how it is trusted.
pub fn verify(
    image: &[u8],
    db: &SignatureDb,
    dbx: &SignatureDb,
) -> Result<String, AuthenticodeError> {
    let pe = pe(image)?;
    if dbx.sha256.contains(&pe.digest) {
        return Err(E::Revoked("the image's hash"));
    }
    let db_certs: Vec<Cert> = db.certs.iter().filter_map(|c| cert(c)).collect();
    let mut first_error = E::Unsigned;
    for (i, blob) in pkcs7_blobs(pe.table).into_iter().enumerate() {
        match check_blob(blob, &pe.digest, &db_certs, dbx) {
            Ok(how) => return Ok(how),
            Err(e @ E::Revoked(_)) => return Err(e),
            Err(e) if i == 0 => first_error = e,
            Err(_) => {}
        }
    }
    if db.sha256.contains(&pe.digest) {
        return Ok("its hash is in db".into());
    }
    Err(first_error)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Test files (testdata/authenticode/README.md): a tiny PE, it signed by a leaf RSA key
    /// and by an ECDSA P-256 key (both issued by the CA), the certificates, two db lists.
    fn data(name: &str) -> Vec<u8> {
        let path = format!(
            "{}/testdata/authenticode/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    fn db_of(certs: &[&str]) -> SignatureDb {
        SignatureDb {
            certs: certs.iter().map(|c| data(c)).collect(),
            sha256: Vec::new(),
        }
    }

    #[test]
    fn a_sections_bytes_are_found_by_name() {
        // A minimal PE32+: MZ, e_lfanew 0x40, COFF with two sections, no optional header.
        let mut img = vec![0u8; 0x200];
        img[..2].copy_from_slice(b"MZ");
        img[0x3c..0x40].copy_from_slice(&0x40u32.to_le_bytes());
        img[0x40..0x44].copy_from_slice(b"PE\0\0");
        img[0x46..0x48].copy_from_slice(&2u16.to_le_bytes());
        let table = 0x44 + 20;
        for (i, (name, virt, raw, at)) in [
            (&b".cmdline"[..], 5u32, 16u32, 0x100u32),
            (b".linux", 0, 4, 0x180),
        ]
        .into_iter()
        .enumerate()
        {
            let h = table + i * 40;
            img[h..h + name.len()].copy_from_slice(name);
            img[h + 8..h + 12].copy_from_slice(&virt.to_le_bytes());
            img[h + 16..h + 20].copy_from_slice(&raw.to_le_bytes());
            img[h + 20..h + 24].copy_from_slice(&at.to_le_bytes());
        }
        img[0x100..0x105].copy_from_slice(b"quiet");
        img[0x180..0x184].copy_from_slice(b"bzIm");
        assert_eq!(section(&img, ".cmdline").unwrap(), Some(&b"quiet"[..]));
        assert_eq!(section(&img, ".linux").unwrap(), Some(&b"bzIm"[..]));
        assert_eq!(section(&img, ".initrd").unwrap(), None);
        assert!(section(b"not a PE", ".linux").is_err());
        let mut past = img.clone();
        past.truncate(0x182);
        assert!(section(&past, ".linux").is_err());
    }

    #[test]
    fn signature_lists_parse_and_garbage_is_refused() {
        let db = SignatureDb::parse(&data("ca.esl")).unwrap();
        assert_eq!(db.certs, vec![data("ca.der")]);
        let mut both = data("ca.esl");
        both.extend_from_slice(&data("other.esl"));
        assert_eq!(SignatureDb::parse(&both).unwrap().certs.len(), 2);
        let mut var = vec![0x27, 0, 0, 0];
        var.extend_from_slice(&data("ca.esl"));
        assert_eq!(SignatureDb::from_efivar(&var).unwrap(), db);
        let esl = data("ca.esl");
        assert!(SignatureDb::parse(&esl[..esl.len() - 1]).is_err());
        assert!(SignatureDb::parse(&esl[..20]).is_err());
    }

    #[test]
    fn a_signature_chaining_to_db_passes_directly_or_through_its_issuer() {
        let none = SignatureDb::default();
        for image in ["tiny-leaf.efi", "tiny-ec.efi"] {
            let how = verify(&data(image), &db_of(&["ca.der"]), &none).unwrap();
            assert!(how.contains("CN=ringstore test"), "{image}: {how}");
        }
        let how = verify(
            &data("tiny-leaf.efi"),
            &db_of(&["other.der", "leaf.der"]),
            &none,
        );
        assert_eq!(
            how.unwrap(),
            "signed by CN=ringstore test signer, trusted by db"
        );
    }

    #[test]
    fn unsigned_changed_untrusted_and_revoked_images_are_refused() {
        let none = SignatureDb::default();
        let db = db_of(&["ca.der"]);
        assert_eq!(verify(&data("tiny.efi"), &db, &none), Err(E::Unsigned));
        let mut changed = data("tiny-leaf.efi");
        changed[0x405] ^= 1;
        assert_eq!(verify(&changed, &db, &none), Err(E::DigestMismatch));
        // A header byte the digest skips (the checksum) changes nothing.
        let mut checksum = data("tiny-leaf.efi");
        checksum[0x98 + 64] ^= 1;
        assert!(verify(&checksum, &db, &none).is_ok());
        let other = verify(&data("tiny-leaf.efi"), &db_of(&["other.der"]), &none);
        assert_eq!(other, Err(E::Untrusted("CN=ringstore test signer".into())));
        let revoked = verify(&data("tiny-leaf.efi"), &db, &db_of(&["leaf.der"]));
        assert!(matches!(revoked, Err(E::Revoked(_))), "{revoked:?}");
        // The signature itself damaged: its last byte (the RSA signature's) flipped.
        let mut sig = data("tiny-leaf.efi");
        let at = 0x600 + 8 + usize::try_from(pkcs7_len(&sig)).unwrap() - 1;
        sig[at] ^= 1;
        assert_eq!(verify(&sig, &db, &none), Err(E::BadSignature));
        assert!(matches!(verify(b"MZ", &db, &none), Err(E::NotPe(_))));
    }

    /// The DER length of the first PKCS#7 blob of a signed test image.
    fn pkcs7_len(image: &[u8]) -> u64 {
        let pe = pe(image).unwrap();
        Reader::new(pkcs7_blobs(pe.table)[0])
            .any()
            .unwrap()
            .whole
            .len() as u64
    }

    #[test]
    fn an_image_hash_in_db_passes_and_in_dbx_is_refused() {
        let image = data("tiny.efi");
        let digest = pe(&image).unwrap().digest;
        let by_hash = SignatureDb {
            certs: Vec::new(),
            sha256: vec![digest],
        };
        assert_eq!(
            verify(&image, &by_hash, &SignatureDb::default()).unwrap(),
            "its hash is in db"
        );
        let signed = data("tiny-leaf.efi");
        let signed_digest = pe(&signed).unwrap().digest;
        assert_eq!(digest, signed_digest, "signing leaves the digest as it was");
        assert_eq!(
            verify(&signed, &db_of(&["ca.der"]), &by_hash),
            Err(E::Revoked("the image's hash"))
        );
    }
}
