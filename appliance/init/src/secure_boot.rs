//! Secure Boot as the firmware reports it (ADR 0051): `SecureBoot` and `SetupMode` from
//! efivarfs for `status` and `tuning`, and the update check that an image written to a slot
//! would be started by the firmware: with Secure Boot on, its Authenticode signature must
//! chain to a certificate of the firmware's db (and nothing of it be in dbx), checked by
//! `ringstore_bootdisk::authenticode` before a byte is written. It imports no other module of
//! PID 1: `update`, `tuning` and the console all read it.

use std::io::Read;
use std::path::{Path, PathBuf};

use ringstore_bootdisk::authenticode::{self, SignatureDb};

/// Where efivarfs is mounted (`update::boot_state` mounts it).
pub const EFIVARS: &str = "/sys/firmware/efi/efivars";

/// `EFI_GLOBAL_VARIABLE` (SecureBoot, SetupMode) and `EFI_IMAGE_SECURITY_DATABASE_GUID` (db,
/// dbx).
const GLOBAL_GUID: &str = "8be4df61-93ca-11d2-aa0d-00e098032b8c";
const DB_GUID: &str = "d719b2cb-3d3a-4596-a3bc-dad00e67656f";
/// The largest db or dbx read (real ones are a few KiB to a few tens of KiB).
const DB_MAX: u64 = 1 << 20;

/// What the firmware says about Secure Boot (`None`: no such variable, e.g. not a UEFI boot).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SecureBoot {
    pub enabled: Option<bool>,
    pub setup_mode: Option<bool>,
}

impl SecureBoot {
    /// Read from efivarfs now.
    pub fn read() -> SecureBoot {
        SecureBoot::read_in(Path::new(EFIVARS))
    }

    fn read_in(dir: &Path) -> SecureBoot {
        let flag = |name: &str| {
            let bytes = std::fs::read(dir.join(format!("{name}-{GLOBAL_GUID}"))).ok()?;
            bytes.get(4).map(|b| *b == 1)
        };
        SecureBoot {
            enabled: flag("SecureBoot"),
            setup_mode: flag("SetupMode"),
        }
    }

    pub fn on(&self) -> bool {
        self.enabled == Some(true)
    }

    /// The `status`/`tuning` line's text: `on`, `off`, `off (setup mode: ...)`, `unknown`.
    pub fn describe(&self) -> String {
        match (self.enabled, self.setup_mode) {
            (Some(true), _) => "on (the firmware starts only images its db trusts)".into(),
            (Some(false), Some(true)) => {
                "off, setup mode (no platform key enrolled: enroll PK, KEK and db, docs/OPERATIONS.md)".into()
            }
            (Some(false), _) => "off (the firmware starts any image on the ESP)".into(),
            (None, _) => "unknown (not booted through UEFI, or no efivarfs)".into(),
        }
    }

    /// `{"enabled": bool|null, "setup_mode": bool|null}`.
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({"enabled": self.enabled, "setup_mode": self.setup_mode})
    }
}

fn read_db(dir: &Path, name: &str) -> Result<SignatureDb, String> {
    let path: PathBuf = dir.join(format!("{name}-{DB_GUID}"));
    let mut bytes = Vec::new();
    match std::fs::File::open(&path) {
        Ok(f) => f
            .take(DB_MAX)
            .read_to_end(&mut bytes)
            .map_err(|e| format!("{}: {e}", path.display()))?,
        // No dbx is an empty one; no db trusts nothing (the check then refuses).
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(SignatureDb::default()),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    SignatureDb::from_efivar(&bytes).map_err(|e| format!("{name}: {e}"))
}

/// With Secure Boot on, whether the firmware would start `image` (how, for the log); with
/// it off, `Ok(None)`. The error says why the firmware would refuse it.
pub fn check_image(image: &[u8]) -> Result<Option<String>, String> {
    check_image_in(Path::new(EFIVARS), image)
}

fn check_image_in(dir: &Path, image: &[u8]) -> Result<Option<String>, String> {
    if !SecureBoot::read_in(dir).on() {
        return Ok(None);
    }
    let db = read_db(dir, "db")?;
    let dbx = read_db(dir, "dbx")?;
    authenticode::verify(image, &db, &dbx)
        .map(Some)
        .map_err(|e| format!("Secure Boot is on and the firmware would refuse this image: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn testdata(name: &str) -> Vec<u8> {
        let path = format!(
            "{}/../bootdisk/testdata/authenticode/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    /// A fake efivarfs: SecureBoot and SetupMode, and db holding the test CA.
    fn efivars(name: &str, secure_boot: u8) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("ringstore-efivars-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let var = |v: u8| vec![6, 0, 0, 0, v];
        std::fs::write(
            dir.join(format!("SecureBoot-{GLOBAL_GUID}")),
            var(secure_boot),
        )
        .unwrap();
        std::fs::write(dir.join(format!("SetupMode-{GLOBAL_GUID}")), var(0)).unwrap();
        let mut db = vec![0x27, 0, 0, 0];
        db.extend_from_slice(&testdata("ca.esl"));
        std::fs::write(dir.join(format!("db-{DB_GUID}")), db).unwrap();
        dir
    }

    #[test]
    fn with_secure_boot_on_only_an_image_the_db_trusts_passes() {
        let dir = efivars("on", 1);
        assert_eq!(
            SecureBoot::read_in(&dir),
            SecureBoot {
                enabled: Some(true),
                setup_mode: Some(false)
            }
        );
        let how = check_image_in(&dir, &testdata("tiny-leaf.efi")).unwrap();
        assert!(how.is_some_and(|h| h.contains("trusted by db")));
        let unsigned = check_image_in(&dir, &testdata("tiny.efi")).unwrap_err();
        assert!(
            unsigned.contains("would refuse") && unsigned.contains("unsigned"),
            "{unsigned}"
        );
        std::fs::write(dir.join(format!("db-{DB_GUID}")), [0x27, 0, 0, 0]).unwrap();
        let untrusted = check_image_in(&dir, &testdata("tiny-leaf.efi")).unwrap_err();
        assert!(
            untrusted.contains("no certificate in the firmware's db"),
            "{untrusted}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn with_secure_boot_off_or_unknown_nothing_is_checked() {
        let dir = efivars("off", 0);
        assert_eq!(check_image_in(&dir, &testdata("tiny.efi")), Ok(None));
        assert!(SecureBoot::read_in(&dir).describe().starts_with("off"));
        std::fs::remove_dir_all(&dir).unwrap();
        let none = SecureBoot::read_in(Path::new("/nonexistent-efivars"));
        assert_eq!(none, SecureBoot::default());
        assert!(none.describe().starts_with("unknown"));
        let setup = SecureBoot {
            enabled: Some(false),
            setup_mode: Some(true),
        };
        assert!(setup.describe().contains("setup mode"));
    }
}
