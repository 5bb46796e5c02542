//! The TLS certificates of the config partition: `/tls/cert.pem` (the chain), `/tls/key.pem`
//! and, optional, `/tls/ca.pem` (client CAs). Boot reads them and writes them to
//! [`RUN_DIR`] (tmpfs; the key mode 0600), where the server's `tls-cert`/`tls-key`/`tls-ca`
//! point unless a configuration layer names other files; the console's `certs reload`
//! reads them again from the disk and the server then reloads (new handshakes use the new
//! certificate, open sessions keep theirs). The key never goes on a command line or into
//! the initramfs: only these paths do.

use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use ringstore_bootdisk::fat;
use ringstore_tls::CertificateSummary;

use crate::bootdisk::Found;

/// Where on the config partition the files are.
pub const PARTITION_DIR: &str = "tls";
/// Where the server reads them.
pub const RUN_DIR: &str = "/run/ringstore/tls";
/// Each file's bound (a chain of a few certificates is a few KiB).
pub const PEM_MAX: u64 = 256 << 10;
/// Under this many days to expiry, `status`, `certs` and `tuning` warn.
pub const WARN_DAYS: i64 = 14;

/// The files as read from the partition.
#[derive(Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: Vec<u8>,
    pub key: Vec<u8>,
    pub ca: Option<Vec<u8>>,
}

impl std::fmt::Debug for TlsFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key's bytes, not even in a debug line.
        write!(
            f,
            "TlsFiles {{ cert: {} bytes, key: (hidden), ca: {:?} }}",
            self.cert.len(),
            self.ca.as_ref().map(Vec::len)
        )
    }
}

/// The partition's TLS files: `Ok(None)` when it has neither cert.pem nor key.pem; one
/// without the other, or a file over [`PEM_MAX`], is an error naming it. `fresh`: drop what
/// the kernel cached of the disk first (a reload after someone wrote the partition).
pub fn read(found: &Found, fresh: bool) -> Result<Option<TlsFiles>, String> {
    let names = ["cert.pem", "key.pem", "ca.pem"];
    let [cert, key, ca] = read_partition_files(found, fresh, PARTITION_DIR, names, PEM_MAX)?;
    match (cert, key) {
        (None, None) => Ok(None),
        (Some(cert), Some(key)) => Ok(Some(TlsFiles { cert, key, ca })),
        (Some(_), None) => Err(partition_error(found, "tls/cert.pem without tls/key.pem")),
        (None, Some(_)) => Err(partition_error(found, "tls/key.pem without tls/cert.pem")),
    }
}

/// `config partition (DISK partition N): WHY`.
pub fn partition_error(found: &Found, why: impl std::fmt::Display) -> String {
    format!(
        "config partition ({} partition {}): {why}",
        found.disk.display(),
        found.number
    )
}

/// Files `names` of folder `dir` of the config partition (`None`: absent), each at most `max`
/// bytes (a larger one is an error naming it). `fresh`: drop what the kernel cached of the
/// disk first (a reload after someone wrote the partition). Also `auth_files.rs`'s reader.
pub fn read_partition_files<const N: usize>(
    found: &Found,
    fresh: bool,
    dir: &str,
    names: [&str; N],
    max: u64,
) -> Result<[Option<Vec<u8>>; N], String> {
    let what = |e: &dyn std::fmt::Display| partition_error(found, e);
    if fresh {
        let disk = std::fs::File::open(&found.disk).map_err(|e| what(&e))?;
        ringstore_sys::drop_cached(&disk).map_err(|e| what(&e))?;
    }
    let volume = found.open(false).map_err(|e| what(&e))?;
    let fs = fat::open(volume, &fat::DOS_EPOCH).map_err(|e| what(&e))?;
    let mut files = [(); N].map(|()| None);
    for (file, name) in files.iter_mut().zip(names) {
        *file = fat::read_file(&fs, &format!("{dir}/{name}"), max).map_err(|e| what(&e))?;
    }
    Ok(files)
}

/// Boot: the partition's TLS files into [`RUN_DIR`], recorded in `machine`; the
/// `ringstore.tls_*` pairs that point the server at them (none without files).
pub fn at_boot(machine: &crate::machine::Machine, found: &Found) -> Vec<(String, String)> {
    let installed = read(found, false).and_then(|files| {
        let Some(files) = files else {
            return Ok(None);
        };
        install(Path::new(RUN_DIR), &files)?;
        Ok(Some(files))
    });
    let (recorded, pairs) = match installed {
        Ok(None) => (None, Vec::new()),
        Ok(Some(files)) => {
            let dir = Path::new(RUN_DIR);
            let seen =
                summary_of(&dir.join("cert.pem")).map_or_else(|e| e, |s| describe(&s, unix_now()));
            crate::info!("tls: config partition /{PARTITION_DIR}/ installed in {RUN_DIR}: {seen}");
            let pairs = paths(dir, &files)
                .into_iter()
                .map(|(key, path)| (format!("ringstore.{key}"), path.display().to_string()))
                .collect();
            (Some(Ok(())), pairs)
        }
        Err(why) => {
            crate::error!("tls: {why}; the config partition's certificates are not used");
            (Some(Err(why)), Vec::new())
        }
    };
    machine.state().tls_files = recorded;
    pairs
}

/// The paths the server is given for `files` in `dir`.
pub fn paths(dir: &Path, files: &TlsFiles) -> Vec<(&'static str, PathBuf)> {
    let mut out = vec![
        ("tls_cert", dir.join("cert.pem")),
        ("tls_key", dir.join("key.pem")),
    ];
    if files.ca.is_some() {
        out.push(("tls_ca", dir.join("ca.pem")));
    }
    out
}

/// Writes `files` into `dir` (created 0700), each through a temporary file and a rename so
/// a reload never reads half a file; the key 0600. A `ca.pem` no longer on the partition
/// is removed.
pub fn install(dir: &Path, files: &TlsFiles) -> Result<(), String> {
    make_private_dir(dir)?;
    write_file(dir, "cert.pem", &files.cert, 0o644)?;
    write_file(dir, "key.pem", &files.key, 0o600)?;
    match &files.ca {
        Some(ca) => write_file(dir, "ca.pem", ca, 0o644),
        None => remove_file(dir, "ca.pem"),
    }
}

/// Creates `dir` (and its parents) and makes it 0700.
pub fn make_private_dir(dir: &Path) -> Result<(), String> {
    let failed = |e: std::io::Error| format!("{}: {e}", dir.display());
    std::fs::create_dir_all(dir).map_err(failed)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(failed)
}

/// Writes `bytes` to `dir/name` with `mode` through a temporary file and a rename, so a
/// reader never sees half a file.
pub fn write_file(dir: &Path, name: &str, bytes: &[u8], mode: u32) -> Result<(), String> {
    let failed = |path: &Path, e: std::io::Error| format!("{}: {e}", path.display());
    let (path, next) = (dir.join(name), dir.join(format!(".{name}.next")));
    let _ = std::fs::remove_file(&next);
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&next)
        .and_then(|mut f| std::io::Write::write_all(&mut f, bytes));
    written.map_err(|e| failed(&next, e))?;
    std::fs::rename(&next, &path).map_err(|e| failed(&path, e))
}

/// Removes `dir/name`; absent already is fine.
pub fn remove_file(dir: &Path, name: &str) -> Result<(), String> {
    let path = dir.join(name);
    match std::fs::remove_file(&path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(format!("{}: {e}", path.display()))
        }
        _ => Ok(()),
    }
}

/// The first certificate of the PEM chain at `path`, summarized.
pub fn summary_of(path: &Path) -> Result<CertificateSummary, String> {
    use rustls_pki_types::pem::PemObject;
    let pem = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let der = rustls_pki_types::CertificateDer::pem_slice_iter(&pem)
        .next()
        .ok_or_else(|| format!("{}: no CERTIFICATE block", path.display()))?
        .map_err(|e| format!("{}: {e}", path.display()))?;
    CertificateSummary::from_der(&der)
        .ok_or_else(|| format!("{}: not an X.509 certificate", path.display()))
}

/// Seconds since the Unix epoch, now.
pub fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// `subject S, expires DATE (N days)`, with the warning under [`WARN_DAYS`] or once expired.
pub fn describe(s: &CertificateSummary, now: i64) -> String {
    let days = s.days_left(now);
    format!(
        "subject {}, expires {} ({days} days){}",
        s.subject,
        not_after_text(s),
        warning(days).map(|w| format!(": {w}")).unwrap_or_default()
    )
}

/// `notAfter` as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn not_after_text(s: &CertificateSummary) -> String {
    let day = ringstore_tls::DAY_SECS;
    let secs = s.not_after.rem_euclid(day);
    let (y, m, d) = ringstore_sys::civil_from_days(s.not_after.div_euclid(day));
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

/// The warning for `days` to expiry, if any.
pub fn warning(days: i64) -> Option<String> {
    match days {
        d if d < 0 => Some("WARNING: EXPIRED, clients refuse it".into()),
        d if d < WARN_DAYS => Some(format!("WARNING: expires in under {WARN_DAYS} days")),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(ca: bool) -> TlsFiles {
        TlsFiles {
            cert: b"CERT".to_vec(),
            key: b"KEY".to_vec(),
            ca: ca.then(|| b"CA".to_vec()),
        }
    }

    #[test]
    fn install_writes_the_key_0600_and_drops_a_removed_ca() {
        let dir = std::env::temp_dir().join(format!("ringstore-tls-files-{}", std::process::id()));
        install(&dir, &files(true)).unwrap();
        let mode = |n: &str| std::fs::metadata(dir.join(n)).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode("key.pem"), 0o600);
        assert_eq!(mode("cert.pem"), 0o644);
        assert_eq!(std::fs::read(dir.join("ca.pem")).unwrap(), b"CA");
        let mut next = files(false);
        next.cert = b"CERT2".to_vec();
        install(&dir, &next).unwrap();
        assert_eq!(std::fs::read(dir.join("cert.pem")).unwrap(), b"CERT2");
        assert!(!dir.join("ca.pem").exists());
        assert_eq!(paths(&dir, &next).len(), 2);
        assert_eq!(paths(&dir, &files(true))[2].0, "tls_ca");
        assert!(!format!("{:?}", files(true)).contains("KEY"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn expiry_is_written_in_utc() {
        let s = CertificateSummary {
            subject: "CN=x".into(),
            not_after: 2_111_641_139,
        };
        assert_eq!(not_after_text(&s), "2036-11-30T06:58:59Z");
        let text = describe(&s, 2_111_641_139 - 3 * 86_400);
        assert!(text.contains("(3 days): WARNING"), "{text}");
    }

    #[test]
    fn warnings_start_under_fourteen_days() {
        assert_eq!(warning(14), None);
        assert!(warning(13).unwrap().contains("under 14 days"));
        assert!(warning(-1).unwrap().contains("EXPIRED"));
    }
}
