//! `cargo xtask keygen --secure-boot DIR`: a Secure Boot key set of one's own (ADR 0051).
//! openssl makes three self-signed RSA-2048 certificates (PK, KEK, db); efitools'
//! `cert-to-efi-sig-list` turns each into an EFI signature list under one owner GUID and
//! `sign-efi-sig-list` signs them as authenticated variable updates: PK.auth and KEK.auth by
//! PK, db.auth by KEK, the chain the firmware checks when they are enrolled in setup mode.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use anyhow::{ensure, Context, Result};

use crate::util::exec;

/// The three keys, each with the variable its list goes to and the key that signs that list.
const SET: [(&str, &str); 3] = [("PK", "PK"), ("KEK", "PK"), ("db", "KEK")];

/// Writes the set into `dir` (created; it must not exist or be empty): `NAME.key` (mode
/// 0600), `NAME.crt` (PEM), `NAME.cer` (DER, for firmware menus), `NAME.esl`, `NAME.auth`,
/// and `GUID` (the signature owner).
pub fn write_set(dir: &Path) -> Result<()> {
    for tool in ["openssl", "cert-to-efi-sig-list", "sign-efi-sig-list"] {
        ensure!(
            crate::util::have(tool),
            "{tool} not found (apt-get install openssl efitools)"
        );
    }
    if dir.exists() {
        let mut entries =
            std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))?;
        ensure!(
            entries.next().is_none(),
            "{} is not empty: keygen never overwrites keys",
            dir.display()
        );
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    let guid = owner_guid()?;
    crate::image::write(&dir.join("GUID"), format!("{guid}\n"))?;
    for (name, _) in SET {
        make_cert(dir, name)?;
        exec(
            Command::new("cert-to-efi-sig-list")
                .args(["-g", &guid])
                .arg(dir.join(format!("{name}.crt")))
                .arg(dir.join(format!("{name}.esl"))),
        )?;
    }
    for (name, signer) in SET {
        exec(
            Command::new("sign-efi-sig-list")
                .args(["-g", &guid, "-k"])
                .arg(dir.join(format!("{signer}.key")))
                .arg("-c")
                .arg(dir.join(format!("{signer}.crt")))
                .arg(name)
                .arg(dir.join(format!("{name}.esl")))
                .arg(dir.join(format!("{name}.auth")))
                // It prints offsets ("Signature at: 40") nobody needs.
                .stdout(std::process::Stdio::null()),
        )
        .with_context(|| format!("signing {name}.esl with {signer}.key"))?;
    }
    Ok(())
}

/// A random owner GUID (version 4).
fn owner_guid() -> Result<String> {
    use std::io::Read;
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .context("reading /dev/urandom")?;
    Ok(ringstore_bootdisk::Guid::v4_from(bytes).to_string())
}

/// `NAME.key` (0600), `NAME.crt` and `NAME.cer`: a self-signed RSA-2048 certificate, SHA-256,
/// valid for 20 years (the firmware does not check validity; a short one only strands boxes).
fn make_cert(dir: &Path, name: &str) -> Result<()> {
    let key = dir.join(format!("{name}.key"));
    let crt = dir.join(format!("{name}.crt"));
    exec(
        Command::new("openssl")
            .args(["req", "-new", "-x509", "-newkey", "rsa:2048", "-nodes"])
            .args(["-sha256", "-days", "7300", "-subj"])
            .arg(format!("/CN=ringstore Secure Boot {name}/"))
            .arg("-keyout")
            .arg(&key)
            .arg("-out")
            .arg(&crt)
            .stderr(std::process::Stdio::null()),
    )
    .with_context(|| format!("making the {name} key"))?;
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600))?;
    exec(
        Command::new("openssl")
            .args(["x509", "-outform", "DER", "-in"])
            .arg(&crt)
            .arg("-out")
            .arg(dir.join(format!("{name}.cer"))),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One `sign-efi-sig-list` authenticated variable: the EFI_TIME, then WIN_CERTIFICATE
    /// (dwLength, revision 0x0200, type EFI_CERT_TYPE_GUID 0x0EF1), then the list.
    fn auth_list(auth: &[u8]) -> &[u8] {
        let len = u32::from_le_bytes(auth[16..20].try_into().unwrap()) as usize;
        assert_eq!(&auth[20..24], &[0x00, 0x02, 0xf1, 0x0e]);
        &auth[16 + len..]
    }

    #[test]
    fn a_secure_boot_set_has_keys_lists_and_signed_updates() {
        if !crate::util::have("sign-efi-sig-list") {
            assert!(
                std::env::var_os("CI").is_none(),
                "efitools missing (cargo xtask test installs it)"
            );
            return;
        }
        let dir = std::env::temp_dir().join(format!("xtask-sbkeys-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        write_set(&dir).unwrap();
        for (name, _) in SET {
            let key = dir.join(format!("{name}.key"));
            let mode = std::fs::metadata(&key).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{name}.key");
            let esl = std::fs::read(dir.join(format!("{name}.esl"))).unwrap();
            let cer = std::fs::read(dir.join(format!("{name}.cer"))).unwrap();
            // EFI_SIGNATURE_LIST: EFI_CERT_X509_GUID, then the owner GUID and the DER.
            assert_eq!(&esl[..4], &[0xa1, 0x59, 0xc0, 0xa5]);
            assert!(esl.ends_with(&cer), "{name}.esl holds {name}.cer");
            let auth = std::fs::read(dir.join(format!("{name}.auth"))).unwrap();
            assert_eq!(auth_list(&auth), &esl[..], "{name}.auth");
        }
        assert!(
            write_set(&dir).is_err(),
            "an existing set is never overwritten"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
