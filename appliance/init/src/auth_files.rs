//! The users and tokens files of the config partition, beside its certificates: `/auth/users`
//! (the server's `auth_file`, memcached `-Y` lines) and `/auth/tokens` (`http_tokens`). Boot
//! reads them and writes them to [`RUN_DIR`] (tmpfs; the folder 0700, the files 0600: the
//! users file holds passwords in the clear), where the server's keys point unless a
//! configuration layer names other files. The console's `auth reload` reads them again from
//! the disk, installs each that parses and has the server reload (`console/auth.rs`).
//!
//! A file that is on the partition is installed at boot even when it does not parse: the
//! server then refuses to start and says why, rather than serving without the check the
//! operator asked for; a partition whose `/auth/` cannot be read keeps the server from
//! starting too (`serve` in lib.rs), and a refused `/ringstore.toml` does not drop these
//! files' paths (`effective_cmdline`).

use std::path::{Path, PathBuf};

use ringstore_auth::{Credentials, HttpTokens, AUTH_FILE_MAX};

use crate::bootdisk::Found;
use crate::tls_files;

/// Where on the config partition the files are.
pub const PARTITION_DIR: &str = "auth";
/// Where the server reads them.
pub const RUN_DIR: &str = "/run/ringstore/auth";
/// Each file's bound (the server's own).
pub const FILE_MAX: u64 = AUTH_FILE_MAX as u64;

/// One of the two files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `/auth/users`: `auth_file`.
    Users,
    /// `/auth/tokens`: `http_tokens`.
    Tokens,
}

impl Kind {
    pub const ALL: [Kind; 2] = [Kind::Users, Kind::Tokens];

    /// The file's name, on the partition and in [`RUN_DIR`].
    pub fn file(self) -> &'static str {
        match self {
            Kind::Users => "users",
            Kind::Tokens => "tokens",
        }
    }

    /// What the file holds, for messages (`the users in force stay`).
    pub fn what(self) -> &'static str {
        match self {
            Kind::Users => "users",
            Kind::Tokens => "tokens",
        }
    }

    /// The configuration key that names the file the server reads.
    pub fn key(self) -> &'static str {
        match self {
            Kind::Users => "auth_file",
            Kind::Tokens => "http_tokens",
        }
    }

    /// The file the server reads for this kind, as `config` names it (`None`: off).
    pub fn configured(self, config: &ringstore_config::Config) -> Option<&Path> {
        match self {
            Kind::Users => config.auth_file.as_deref(),
            Kind::Tokens => config.http_tokens.as_deref(),
        }
    }

    /// Whether `bytes` is a file the server takes; the error is the parser's reason.
    pub fn check(self, bytes: &[u8]) -> Result<(), String> {
        match self {
            Kind::Users => Credentials::parse(bytes)
                .map(drop)
                .map_err(|e| e.to_string()),
            Kind::Tokens => std::str::from_utf8(bytes)
                .map_err(|_| "not UTF-8".to_string())
                .and_then(|text| HttpTokens::parse(text).map_err(|e| e.to_string()))
                .map(drop),
        }
    }
}

/// The files as read from the partition (`None`: not there).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct AuthFiles {
    pub users: Option<Vec<u8>>,
    pub tokens: Option<Vec<u8>>,
}

impl std::fmt::Debug for AuthFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the bytes: the users file holds passwords.
        let size = |b: &Option<Vec<u8>>| b.as_ref().map(Vec::len);
        write!(
            f,
            "AuthFiles {{ users: {:?} bytes, tokens: {:?} bytes }}",
            size(&self.users),
            size(&self.tokens)
        )
    }
}

impl AuthFiles {
    pub fn get(&self, kind: Kind) -> Option<&[u8]> {
        match kind {
            Kind::Users => self.users.as_deref(),
            Kind::Tokens => self.tokens.as_deref(),
        }
    }
}

/// The partition's `/auth/users` and `/auth/tokens`; a file over [`FILE_MAX`] is an error
/// naming it. `fresh`: drop what the kernel cached of the disk first.
pub fn read(found: &Found, fresh: bool) -> Result<AuthFiles, String> {
    let names = Kind::ALL.map(Kind::file);
    let [users, tokens] =
        tls_files::read_partition_files(found, fresh, PARTITION_DIR, names, FILE_MAX)?;
    Ok(AuthFiles { users, tokens })
}

/// Writes `bytes` as `kind`'s file in `dir` (created 0700), 0600, through a rename.
pub fn install(dir: &Path, kind: Kind, bytes: &[u8]) -> Result<(), String> {
    tls_files::make_private_dir(dir)?;
    tls_files::write_file(dir, kind.file(), bytes, 0o600)
}

/// The configuration pairs that point the server at the files installed in `dir`.
pub fn paths(dir: &Path, files: &AuthFiles) -> Vec<(&'static str, PathBuf)> {
    Kind::ALL
        .into_iter()
        .filter(|&k| files.get(k).is_some())
        .map(|k| (k.key(), dir.join(k.file())))
        .collect()
}

/// Boot: the partition's users and tokens files into [`RUN_DIR`], recorded in `machine`;
/// the `ringstore.auth_file`/`ringstore.http_tokens` pairs that point the server at them
/// (none without files).
pub fn at_boot(machine: &crate::machine::Machine, found: &Found) -> Vec<(String, String)> {
    let dir = Path::new(RUN_DIR);
    let installed = read(found, false).and_then(|files| {
        for kind in Kind::ALL {
            if let Some(bytes) = files.get(kind) {
                install(dir, kind, bytes)?;
            }
        }
        Ok(files)
    });
    let (recorded, pairs) = match installed {
        Ok(files) if files == AuthFiles::default() => (None, Vec::new()),
        Ok(files) => {
            let pairs: Vec<(String, String)> = paths(dir, &files)
                .into_iter()
                .map(|(key, path)| (format!("ringstore.{key}"), path.display().to_string()))
                .collect();
            let names: Vec<&str> = pairs.iter().map(|(key, _)| key.as_str()).collect();
            crate::info!(
                "auth: config partition /{PARTITION_DIR}/ installed in {RUN_DIR}: {}",
                names.join(", ")
            );
            (Some(Ok(())), pairs)
        }
        Err(why) => {
            crate::error!("auth: {why}; the config partition's users and tokens are not used");
            (Some(Err(why)), Vec::new())
        }
    };
    machine.state().auth_files = recorded;
    pairs
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// PID 1 reads the files with the server's parsers (the auth crate) without linking the
    /// service (issue 37; ADR-0000).
    #[test]
    fn pid_1_does_not_depend_on_the_service_crate() {
        let manifest = include_str!("../Cargo.toml");
        let deps = manifest
            .split("[dependencies]")
            .nth(1)
            .and_then(|rest| rest.split("\n[").next())
            .unwrap_or_default();
        assert!(deps.contains("ringstore-auth"), "{deps}");
        assert!(!deps.contains("ringstore-service"), "{deps}");
    }

    #[test]
    fn files_are_installed_0600_and_checked_as_the_server_checks_them() {
        let dir = std::env::temp_dir().join(format!("ringstore-auth-files-{}", std::process::id()));
        install(&dir, Kind::Users, b"alice:secret\n").unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir.join("users")), 0o600);
        assert_eq!(mode(&dir), 0o700);
        install(&dir, Kind::Users, b"bob:pw\n").unwrap();
        assert_eq!(std::fs::read(dir.join("users")).unwrap(), b"bob:pw\n");
        std::fs::remove_dir_all(&dir).unwrap();

        assert_eq!(Kind::Users.check(b"alice:secret\n"), Ok(()));
        let bad = Kind::Users.check(b"alice:secret\nno colon\n").unwrap_err();
        assert_eq!(bad, "line 2 is not user:password");
        let hash = "ab".repeat(32);
        assert_eq!(
            Kind::Tokens.check(format!("t {hash} read\n").as_bytes()),
            Ok(())
        );
        assert_eq!(
            Kind::Tokens.check(b"t 12 read\n").unwrap_err(),
            "line 1: the hash is not 64 hex digits"
        );
        assert_eq!(Kind::Tokens.check(b"\xff").unwrap_err(), "not UTF-8");
    }

    #[test]
    fn only_files_on_the_partition_are_pointed_at() {
        let files = AuthFiles {
            users: None,
            tokens: Some(b"t x read".to_vec()),
        };
        let dir = Path::new(RUN_DIR);
        assert_eq!(
            paths(dir, &files),
            vec![("http_tokens", dir.join("tokens"))]
        );
        assert!(paths(dir, &AuthFiles::default()).is_empty());
        let users = AuthFiles {
            users: Some(b"alice:secret".to_vec()),
            tokens: None,
        };
        assert!(!format!("{users:?}").contains("secret"));
        assert_eq!(users.get(Kind::Users), Some(&b"alice:secret"[..]));
    }
}
