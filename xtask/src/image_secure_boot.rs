//! Secure Boot signing of disk.img's EFI binaries (ADR 0051): systemd-boot and each slot's
//! ringstore.efi get an Authenticode signature from Debian's `sbsign` with the operator's db
//! key, checked with `sbverify` before the image is written. The snakeoil key Debian's OVMF
//! trusts is a test key: it signs only where `--test-keys` asks. (image.rs calls this file;
//! nothing here calls back.)

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, ensure, Context, Result};

use crate::util::exec;

/// The test key pair Debian's `OVMF_VARS_4M.snakeoil.fd` trusts (its PK, KEK and db).
pub const SNAKEOIL_KEY: &str = "/usr/share/ovmf/PkKek-1-snakeoil.key";
pub const SNAKEOIL_CERT: &str = "/usr/share/ovmf/PkKek-1-snakeoil.pem";

/// The db key and certificate that sign the EFI binaries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SigningPair {
    /// PEM private key (RSA; what `cargo xtask keygen --secure-boot` writes as `db.key`).
    pub key: PathBuf,
    /// PEM X.509 certificate (`db.crt`), the one enrolled in the firmware's db.
    pub cert: PathBuf,
}

impl SigningPair {
    /// Debian's snakeoil pair: a TEST key (its secret half is in every Debian mirror).
    pub fn snakeoil() -> SigningPair {
        SigningPair {
            key: SNAKEOIL_KEY.into(),
            cert: SNAKEOIL_CERT.into(),
        }
    }

    /// Both halves from the flags, or neither; a test certificate only with `test_keys`.
    pub fn from_flags(
        key: Option<&Path>,
        cert: Option<&Path>,
        test_keys: bool,
    ) -> Result<Option<SigningPair>> {
        let pair = match (key, cert) {
            (None, None) => return Ok(None),
            (Some(key), Some(cert)) => SigningPair {
                key: key.to_path_buf(),
                cert: cert.to_path_buf(),
            },
            _ => bail!("--secure-boot-key and --secure-boot-cert go together"),
        };
        if !test_keys && is_test_cert(&pair.cert)? {
            bail!(
                "{} is a TEST certificate (Debian's snakeoil key, public to anyone): it signs \
                 only with --test-keys",
                pair.cert.display()
            );
        }
        Ok(Some(pair))
    }
}

/// The DER bytes of the first certificate of a PEM file.
pub fn pem_cert_der(path: &Path) -> Result<Vec<u8>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let body: String = text
        .lines()
        .skip_while(|l| !l.starts_with("-----BEGIN CERTIFICATE-----"))
        .skip(1)
        .take_while(|l| !l.starts_with("-----END CERTIFICATE-----"))
        .collect();
    ensure!(
        !body.is_empty(),
        "{}: no PEM certificate (-----BEGIN CERTIFICATE-----)",
        path.display()
    );
    base64_decode(&body).with_context(|| format!("{}: bad base64", path.display()))
}

/// Standard base64 (PEM bodies), padding optional.
fn base64_decode(text: &str) -> Result<Vec<u8>> {
    let value = |c: u8| -> Result<u32> {
        Ok(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => bail!("character {:?}", char::from(c)),
        }
        .into())
    };
    let bytes: Vec<u8> = text
        .bytes()
        .filter(|b| !b.is_ascii_whitespace() && *b != b'=')
        .collect();
    let mut out = Vec::with_capacity(bytes.len() * 3 / 4);
    for chunk in bytes.chunks(4) {
        let mut acc = 0u32;
        for (i, c) in chunk.iter().enumerate() {
            acc |= value(*c)? << (18 - 6 * i);
        }
        let full = acc.to_be_bytes();
        out.extend_from_slice(&full[1..chunk.len()]);
    }
    Ok(out)
}

/// Whether `cert` is the snakeoil certificate (the same DER).
pub fn is_test_cert(cert: &Path) -> Result<bool> {
    let snakeoil = Path::new(SNAKEOIL_CERT);
    if !snakeoil.exists() {
        return Ok(false);
    }
    Ok(pem_cert_der(cert)? == pem_cert_der(snakeoil)?)
}

/// The snakeoil key is stored encrypted with the passphrase `snakeoil` (Debian's
/// README.Debian): a decrypted copy in `scratch` (mode 0600), so a test build asks nothing.
/// Any other key is used as it is (an encrypted one: sbsign asks for its passphrase).
fn usable_key(pair: &SigningPair, scratch: &Path) -> Result<PathBuf> {
    if *pair != SigningPair::snakeoil() {
        return Ok(pair.key.clone());
    }
    let plain = scratch.join("snakeoil-test.key");
    exec(
        Command::new("openssl")
            .args(["pkey", "-passin", "pass:snakeoil", "-in"])
            .arg(&pair.key)
            .arg("-out")
            .arg(&plain),
    )
    .context("decrypting the snakeoil test key")?;
    std::fs::set_permissions(&plain, std::fs::Permissions::from_mode(0o600))?;
    Ok(plain)
}

/// `bytes` (a PE image) with an Authenticode signature by `pair`, checked by `sbverify`
/// against the certificate. `what` names it in errors; `scratch` is a folder for the files.
pub fn sign(bytes: &[u8], pair: &SigningPair, what: &str, scratch: &Path) -> Result<Vec<u8>> {
    ensure!(
        crate::util::have("sbsign") && crate::util::have("sbverify"),
        "signing {what}: sbsign/sbverify not found (apt-get install sbsigntool)"
    );
    let key = usable_key(pair, scratch)?;
    let unsigned = scratch.join(format!("{what}.unsigned"));
    let signed = scratch.join(format!("{what}.signed"));
    std::fs::write(&unsigned, bytes).with_context(|| format!("writing {}", unsigned.display()))?;
    exec(
        Command::new("sbsign")
            .arg("--key")
            .arg(&key)
            .arg("--cert")
            .arg(&pair.cert)
            .arg("--output")
            .arg(&signed)
            .arg(&unsigned),
    )
    .with_context(|| format!("signing {what} with {}", pair.key.display()))?;
    let out = Command::new("sbverify")
        .arg("--cert")
        .arg(&pair.cert)
        .arg(&signed)
        .output()
        .context("running sbverify")?;
    ensure!(
        out.status.success(),
        "sbverify refuses the signed {what}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let bytes = std::fs::read(&signed).with_context(|| format!("reading {}", signed.display()))?;
    if key != pair.key {
        let _ = std::fs::remove_file(&key);
    }
    let _ = std::fs::remove_file(&unsigned);
    let _ = std::fs::remove_file(&signed);
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_decodes_pem_bodies() {
        assert_eq!(base64_decode("aGVsbG8=").unwrap(), b"hello");
        assert_eq!(base64_decode("aGVs\nbG8h").unwrap(), b"hello!");
        assert!(base64_decode("a*b=").is_err());
    }

    #[test]
    fn the_snakeoil_certificate_signs_only_with_test_keys() {
        let cert = Path::new(SNAKEOIL_CERT);
        if !cert.exists() {
            assert!(
                std::env::var_os("CI").is_none(),
                "{SNAKEOIL_CERT} missing (apt-get install ovmf)"
            );
            return;
        }
        let der = pem_cert_der(cert).unwrap();
        assert_eq!(der[0], 0x30, "a DER SEQUENCE");
        let key = Path::new(SNAKEOIL_KEY);
        let refused = SigningPair::from_flags(Some(key), Some(cert), false).unwrap_err();
        assert!(
            refused.to_string().contains("TEST certificate"),
            "{refused}"
        );
        assert_eq!(
            SigningPair::from_flags(Some(key), Some(cert), true).unwrap(),
            Some(SigningPair::snakeoil())
        );
        assert!(SigningPair::from_flags(Some(key), None, true).is_err());
        assert_eq!(SigningPair::from_flags(None, None, false).unwrap(), None);
    }
}
