//! `cargo xtask keygen OUT`: a new update signing key (ADR 0025) in the file format
//! `--signing-key` reads, written with mode 0600, and its public half printed;
//! `--secure-boot DIR`: a Secure Boot key set (`keygen_secure_boot.rs`).

use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, ensure, Context, Result};

/// The key file's text: a comment naming the public half, then the 32-byte ed25519 secret
/// key (the seed) as 64 lowercase hex digits.
pub fn key_file_text(key: &ed25519_dalek::SigningKey) -> String {
    let public = ringstore_bootdisk::signature::to_hex(key.verifying_key().as_bytes());
    format!(
        "# ringstore update signing key (ADR 0025), secret: keep it off the boxes and out of git\n\
         # public {public}\n{}\n",
        ringstore_bootdisk::signature::to_hex(key.as_bytes())
    )
}

/// Writes a new key to `out` (which must not exist) with mode 0600; returns its public half
/// in hex.
pub fn write_new_key(out: &Path) -> Result<String> {
    let mut seed = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut seed))
        .context("reading /dev/urandom")?;
    let key = ed25519_dalek::SigningKey::from_bytes(&seed);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(out)
        .with_context(|| format!("creating {} (it must not exist yet)", out.display()))?;
    file.write_all(key_file_text(&key).as_bytes())
        .and_then(|()| file.sync_all())
        .with_context(|| format!("writing {}", out.display()))?;
    Ok(ringstore_bootdisk::signature::to_hex(
        key.verifying_key().as_bytes(),
    ))
}

/// What `cargo xtask keygen` was asked to write.
#[derive(Debug, PartialEq, Eq)]
pub enum Keygen {
    /// `OUT`: an update signing key.
    UpdateKey(PathBuf),
    /// `--secure-boot DIR`: a Secure Boot key set.
    SecureBoot(PathBuf),
}

/// Parses `cargo xtask keygen OUT` or `cargo xtask keygen --secure-boot DIR`.
pub fn parse(args: &[String]) -> Result<Keygen> {
    let parsed = crate::cli::parse("keygen", args)?;
    if let Some((_, dir)) = parsed.flags.iter().find(|(f, _)| *f == "--secure-boot") {
        ensure!(
            parsed.positional.is_empty(),
            "keygen --secure-boot DIR takes no OUT"
        );
        return Ok(Keygen::SecureBoot(PathBuf::from(
            dir.as_deref().unwrap_or_default(),
        )));
    }
    let [out] = parsed.positional.as_slice() else {
        bail!(
            "keygen needs exactly one OUT file\n\n{}",
            crate::cli::command("keygen").help()
        );
    };
    Ok(Keygen::UpdateKey(PathBuf::from(out)))
}

/// `cargo xtask keygen OUT` or `cargo xtask keygen --secure-boot DIR`.
pub fn run(args: &[String]) -> Result<()> {
    let out = match parse(args)? {
        Keygen::SecureBoot(dir) => {
            crate::keygen_secure_boot::write_set(&dir)?;
            let dir = dir.display();
            eprintln!(
                "keygen: wrote a Secure Boot key set to {dir} (keys mode 0600): PK, KEK and db keys and\n\
                 keygen: certificates, and PK.auth, KEK.auth, db.auth to enroll in setup mode\n\
                 keygen: (docs/OPERATIONS.md, \"Secure Boot\"). Keep the .key files off the boxes.\n\
                 keygen: sign images: cargo xtask image --secure-boot-key {dir}/db.key --secure-boot-cert {dir}/db.crt"
            );
            return Ok(());
        }
        Keygen::UpdateKey(out) => out,
    };
    let public = write_new_key(&out)?;
    eprintln!(
        "keygen: wrote the update signing key {} (mode 0600). Keep it where your release\n\
         keygen: builds run and nowhere else (not on a box, not in git; back it up offline):\n\
         keygen: every image signed with it accepts updates signed with it.\n\
         keygen: use it: cargo xtask image --signing-key {}",
        out.display(),
        out.display()
    );
    println!("{public}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_new_key_reads_back_with_its_public_half_and_mode_0600() {
        let dir = std::env::temp_dir().join(format!("xtask-keygen-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("update.key");
        let public = write_new_key(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let key = crate::image::read_signing_key(&path).unwrap();
        assert_eq!(
            ringstore_bootdisk::signature::to_hex(key.verifying_key().as_bytes()),
            public
        );
        assert!(
            write_new_key(&path).is_err(),
            "an existing key is never overwritten"
        );
        let other = write_new_key(&dir.join("second.key")).unwrap();
        assert_ne!(other, public);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
