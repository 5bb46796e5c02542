//! Console login: SSH-key challenge/response (SSHSIG, `ssh-keygen -Y sign -n ringstore-console`),
//! an argon2id password fallback, and the exponential back-off after failed attempts (ADR-0023).
//! Sans-IO: the caller supplies the clock and the random bytes' source is getrandom.

use std::time::{Duration, Instant};

use ssh_key::{HashAlg, PublicKey, SshSig};

/// The SSHSIG namespace a console signature must carry (`ssh-keygen -Y sign -n`).
pub const NAMESPACE: &str = "ringstore-console";
/// The first word of every challenge message; its version is part of what is signed.
pub const CHALLENGE_TAG: &str = "ringstore-console v1";
/// Most authorized keys read from one source.
pub const KEYS_MAX: usize = 64;
/// Longest authorized-keys line taken (an ed25519 line is about 100 bytes; RSA-4096 about 750).
pub const KEY_LINE_MAX: usize = 2048;
/// Most lines of a pasted armored signature (an ed25519 SSHSIG is 6).
pub const SIGNATURE_LINES_MAX: usize = 32;
/// Longest argon2 PHC string taken from the configuration.
pub const PASSWORD_HASH_MAX: usize = 256;
/// The first back-off after a failed attempt; it doubles per failure up to [`BACKOFF_MAX`].
pub const BACKOFF_FIRST: Duration = Duration::from_secs(1);
pub const BACKOFF_MAX: Duration = Duration::from_secs(60);
/// A logged-in session with no input for this long is ended at its next line.
pub const IDLE_LIMIT: Duration = Duration::from_secs(600);

/// Why a login or its configuration was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("authorized key line {line}: {why}")]
    BadKeyLine { line: usize, why: String },
    #[error("more than {KEYS_MAX} authorized keys")]
    TooManyKeys,
    #[error("the signature is not an armored SSH signature: {0}")]
    Malformed(String),
    #[error("the signature is for namespace {0:?}, not {NAMESPACE:?}")]
    Namespace(String),
    #[error("no authorized key made this signature")]
    NotAuthorized,
    #[error("no password is configured")]
    NoPassword,
    #[error("the configured password hash is not an argon2id PHC string")]
    BadPasswordHash,
    #[error("wrong password")]
    WrongPassword,
    #[error("no random bytes for the nonce: {0}")]
    Random(String),
}

/// Who logged in, as the command log names them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The key's comment (may be empty), or `password`.
    pub comment: String,
    /// `SHA256:...` of the key, or `password`.
    pub fingerprint: String,
    /// Where the key came from (`image`, `config-partition`; empty when untagged), or `image`
    /// for the password.
    pub source: String,
}

impl std::fmt::Display for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.comment.is_empty() || self.comment == self.fingerprint {
            f.write_str(&self.fingerprint)
        } else {
            write!(f, "{} ({})", self.comment, self.fingerprint)
        }
    }
}

/// One authorized key as `keys` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyInfo {
    pub algorithm: String,
    pub comment: String,
    pub fingerprint: String,
    pub source: String,
}

/// The keys allowed to log in, each with the source it came from.
#[derive(Debug, Clone, Default)]
pub struct AuthorizedKeys {
    keys: Vec<(PublicKey, String)>,
}

impl AuthorizedKeys {
    /// Parses OpenSSH `authorized_keys` lines (`TYPE BASE64 [COMMENT]`; blank lines and `#`
    /// comments skipped; options before the type are not supported and refused). Strict: the
    /// first bad line refuses them all (what `cargo xtask image` checks its files with).
    pub fn from_lines<'a>(lines: impl IntoIterator<Item = &'a str>) -> Result<Self, AuthError> {
        let (keys, mut problems) = Self::parse_lines("", lines);
        match problems.is_empty() {
            true => Ok(keys),
            false => Err(problems.remove(0)),
        }
    }

    /// Parses `authorized_keys` lines from `source` leniently, for the box: a bad line (over
    /// [`KEY_LINE_MAX`], not a key) is skipped and reported, keys past [`KEYS_MAX`] are
    /// dropped and reported once; the keys that parsed are kept, tagged with `source`.
    pub fn parse_lines<'a>(
        source: &str,
        lines: impl IntoIterator<Item = &'a str>,
    ) -> (Self, Vec<AuthError>) {
        let mut keys = AuthorizedKeys::default();
        let mut problems = Vec::new();
        for (index, line) in lines.into_iter().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = |why: String| AuthError::BadKeyLine {
                line: index + 1,
                why,
            };
            if line.len() > KEY_LINE_MAX {
                problems.push(bad(format!("longer than {KEY_LINE_MAX} bytes")));
                continue;
            }
            match PublicKey::from_openssh(line) {
                Ok(key) => {
                    if let Err(e) = keys.push(key, source) {
                        problems.push(e);
                        break;
                    }
                }
                Err(e) => problems.push(bad(e.to_string())),
            }
        }
        (keys, problems)
    }

    fn push(&mut self, key: PublicKey, source: &str) -> Result<(), AuthError> {
        if self
            .keys
            .iter()
            .any(|(k, _)| k.key_data() == key.key_data())
        {
            return Ok(());
        }
        if self.keys.len() >= KEYS_MAX {
            return Err(AuthError::TooManyKeys);
        }
        self.keys.push((key, source.to_string()));
        Ok(())
    }

    /// Adds another source's keys after these (a key already here keeps its first source);
    /// past [`KEYS_MAX`] in all the rest is refused (the ones that fit are kept).
    pub fn extend(&mut self, other: AuthorizedKeys) -> Result<(), AuthError> {
        other
            .keys
            .into_iter()
            .try_for_each(|(k, source)| self.push(k, &source))
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// How many keys came from `source`.
    pub fn count_from(&self, source: &str) -> usize {
        self.keys.iter().filter(|(_, s)| s == source).count()
    }

    /// Every key with its source, in order.
    pub fn list(&self) -> Vec<KeyInfo> {
        self.keys
            .iter()
            .map(|(k, source)| KeyInfo {
                algorithm: k.algorithm().to_string(),
                comment: k.comment().to_string(),
                fingerprint: k.fingerprint(HashAlg::Sha256).to_string(),
                source: source.clone(),
            })
            .collect()
    }

    /// Checks an armored SSHSIG over `message`: namespace [`NAMESPACE`], made by one of the keys.
    pub fn verify(&self, message: &str, armored: &str) -> Result<Identity, AuthError> {
        let sig =
            SshSig::from_pem(armored.trim()).map_err(|e| AuthError::Malformed(e.to_string()))?;
        if sig.namespace() != NAMESPACE {
            return Err(AuthError::Namespace(sig.namespace().to_string()));
        }
        let (key, source) = self
            .keys
            .iter()
            .find(|(k, _)| k.key_data() == sig.public_key())
            .ok_or(AuthError::NotAuthorized)?;
        key.verify(NAMESPACE, message.as_bytes(), &sig)
            .map_err(|_| AuthError::NotAuthorized)?;
        Ok(Identity {
            comment: key.comment().to_string(),
            fingerprint: key.fingerprint(HashAlg::Sha256).to_string(),
            source: source.clone(),
        })
    }
}

/// A challenge: what the operator signs, one line, unique to this box, boot and attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Challenge {
    pub message: String,
}

impl Challenge {
    /// `ringstore-console v1 host=HOST boot=BOOT_ID nonce=HEX32` with 32 bytes from getrandom.
    /// `host` and `boot_id` must not contain spaces (they are replaced by `_`).
    pub fn new(host: &str, boot_id: &str) -> Result<Challenge, AuthError> {
        let mut nonce = [0u8; 32];
        getrandom::getrandom(&mut nonce).map_err(|e| AuthError::Random(e.to_string()))?;
        Ok(Challenge::with_nonce(host, boot_id, &nonce))
    }

    pub fn with_nonce(host: &str, boot_id: &str, nonce: &[u8; 32]) -> Challenge {
        let clean = |s: &str| -> String {
            let s: String = s
                .chars()
                .take(64)
                .map(|c| if c.is_ascii_graphic() { c } else { '_' })
                .collect();
            if s.is_empty() {
                "-".into()
            } else {
                s
            }
        };
        let hex: String = nonce.iter().map(|b| format!("{b:02x}")).collect();
        Challenge {
            message: format!(
                "{CHALLENGE_TAG} host={} boot={} nonce={hex}",
                clean(host),
                clean(boot_id)
            ),
        }
    }
}

/// An argon2id password hash from the configuration (a PHC string `$argon2id$v=19$...`).
#[derive(Debug, Clone)]
pub struct PasswordHash {
    phc: String,
}

impl PasswordHash {
    pub fn parse(phc: &str) -> Result<PasswordHash, AuthError> {
        let phc = phc.trim();
        if phc.len() > PASSWORD_HASH_MAX || !phc.starts_with("$argon2id$") {
            return Err(AuthError::BadPasswordHash);
        }
        argon2::PasswordHash::new(phc).map_err(|_| AuthError::BadPasswordHash)?;
        Ok(PasswordHash {
            phc: phc.to_string(),
        })
    }

    pub fn verify(&self, password: &str) -> Result<Identity, AuthError> {
        use argon2::PasswordVerifier;
        let hash = argon2::PasswordHash::new(&self.phc).map_err(|_| AuthError::BadPasswordHash)?;
        argon2::Argon2::default()
            .verify_password(password.as_bytes(), &hash)
            .map_err(|_| AuthError::WrongPassword)?;
        Ok(Identity {
            comment: "password".into(),
            fingerprint: "password".into(),
            source: "image".into(),
        })
    }
}

/// Failed attempts and when the next one is allowed: 1 s after the first failure, doubling per
/// failure, at most 60 s. A success resets it.
#[derive(Debug, Clone, Default)]
pub struct Backoff {
    failures: u32,
    until: Option<Instant>,
}

impl Backoff {
    /// How long the caller must still wait at `now` (None: an attempt may start).
    pub fn wait(&self, now: Instant) -> Option<Duration> {
        self.until
            .and_then(|until| until.checked_duration_since(now))
            .filter(|d| !d.is_zero())
    }

    /// Records a failure at `now`; returns the back-off it set.
    pub fn failed(&mut self, now: Instant) -> Duration {
        self.failures = self.failures.saturating_add(1);
        let delay = BACKOFF_FIRST
            .saturating_mul(1u32 << (self.failures - 1).min(16))
            .min(BACKOFF_MAX);
        self.until = Some(now + delay);
        delay
    }

    pub fn succeeded(&mut self) {
        *self = Backoff::default();
    }

    pub fn failures(&self) -> u32 {
        self.failures
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEST_PUB: &str = include_str!("../../../tests/keys/test_ed25519.pub");
    const WRONG_PUB: &str = include_str!("../../../tests/keys/wrong_ed25519.pub");
    /// Made by stock OpenSSH: `printf %s "$(cat testdata-message.txt)" |
    /// ssh-keygen -Y sign -n ringstore-console -f tests/keys/test_ed25519`.
    const OPENSSH_SIG: &str = include_str!("testdata-test-key.sig");
    const OPENSSH_MSG: &str = include_str!("testdata-message.txt");

    #[test]
    fn a_real_ssh_keygen_signature_verifies() {
        let keys = AuthorizedKeys::from_lines(TEST_PUB.lines()).unwrap();
        let who = keys.verify(OPENSSH_MSG, OPENSSH_SIG).unwrap();
        assert!(who.comment.contains("test-only"), "{who}");
        assert!(who.fingerprint.starts_with("SHA256:"), "{who}");
        // Another message (another box, boot or nonce) with the same signature fails.
        let other = OPENSSH_MSG.replace("host=test", "host=other");
        assert_eq!(
            keys.verify(&other, OPENSSH_SIG),
            Err(AuthError::NotAuthorized)
        );
        // Only the wrong key authorized: refused.
        let wrong = AuthorizedKeys::from_lines(WRONG_PUB.lines()).unwrap();
        assert_eq!(
            wrong.verify(OPENSSH_MSG, OPENSSH_SIG),
            Err(AuthError::NotAuthorized)
        );
        // Garbage and cut signatures are malformed, not panics.
        assert!(matches!(
            keys.verify(OPENSSH_MSG, "hello"),
            Err(AuthError::Malformed(_))
        ));
        let cut: String = OPENSSH_SIG.lines().take(3).collect::<Vec<_>>().join("\n");
        assert!(matches!(
            keys.verify(OPENSSH_MSG, &cut),
            Err(AuthError::Malformed(_))
        ));
        let flipped = OPENSSH_SIG.replacen("U1NIU0lH", "U1NIU0lI", 1);
        assert!(keys.verify(OPENSSH_MSG, &flipped).is_err());
    }

    #[test]
    fn authorized_keys_lines_are_bounded_and_checked() {
        let two = format!("# comment\n\n{TEST_PUB}{WRONG_PUB}{TEST_PUB}");
        assert_eq!(AuthorizedKeys::from_lines(two.lines()).unwrap().len(), 2);
        let err = AuthorizedKeys::from_lines(["ssh-ed25519 notbase64 x"]).unwrap_err();
        assert!(
            matches!(err, AuthError::BadKeyLine { line: 1, .. }),
            "{err}"
        );
        let long = format!("ssh-ed25519 {}", "A".repeat(KEY_LINE_MAX));
        assert!(AuthorizedKeys::from_lines([long.as_str()]).is_err());
        // KEYS_MAX distinct keys are taken, one more is refused.
        let lines: Vec<String> = (0..=KEYS_MAX).map(numbered_key).collect();
        let full = AuthorizedKeys::from_lines(lines[..KEYS_MAX].iter().map(String::as_str));
        assert_eq!(full.unwrap().len(), KEYS_MAX);
        let over = AuthorizedKeys::from_lines(lines.iter().map(String::as_str));
        assert_eq!(over.unwrap_err(), AuthError::TooManyKeys);
    }

    #[test]
    fn lenient_parsing_skips_bad_lines_and_keeps_sources() {
        const PART_PUB: &str = include_str!("../../../tests/keys/partition_ed25519.pub");
        let long = format!("ssh-ed25519 {}", "A".repeat(KEY_LINE_MAX));
        let text =
            format!("# partition keys\nssh-ed25519 notbase64 bad\n{long}\n{PART_PUB}\n{TEST_PUB}");
        let (part, problems) = AuthorizedKeys::parse_lines("config-partition", text.lines());
        assert_eq!(part.len(), 2, "the good lines are kept");
        assert!(
            matches!(&problems[..], [AuthError::BadKeyLine { line: 2, .. }, AuthError::BadKeyLine { line: 3, why }] if why.contains("longer than")),
            "{problems:?}"
        );
        // The strict form refuses the same text at its first bad line.
        assert!(matches!(
            AuthorizedKeys::from_lines(text.lines()),
            Err(AuthError::BadKeyLine { line: 2, .. })
        ));
        // Merged after the image's keys: the test key keeps its first source, the partition
        // key says where it came from, and a login with it reports that.
        let (mut keys, none) = AuthorizedKeys::parse_lines("image", TEST_PUB.lines());
        assert!(none.is_empty());
        keys.extend(part).unwrap();
        let sources: Vec<(String, String)> = keys
            .list()
            .into_iter()
            .map(|k| (k.comment, k.source))
            .collect();
        assert_eq!(sources.len(), 2, "{sources:?}");
        assert!(sources[0].0.contains("ringstore-test-only") && sources[0].1 == "image");
        assert_eq!(
            sources[1],
            (
                "partition-test-only@ringstore".into(),
                "config-partition".into()
            )
        );
        assert_eq!(
            (
                keys.count_from("image"),
                keys.count_from("config-partition")
            ),
            (1, 1)
        );
        let who = keys.verify(OPENSSH_MSG, OPENSSH_SIG).unwrap();
        assert_eq!(who.source, "image");
        // KEYS_MAX in all: the partition's keys past it are dropped and reported once.
        let lines: Vec<String> = (0..KEYS_MAX + 5).map(numbered_key).collect();
        let (many, problems) =
            AuthorizedKeys::parse_lines("config-partition", lines.iter().map(String::as_str));
        assert_eq!(
            (many.len(), problems),
            (KEYS_MAX, vec![AuthError::TooManyKeys])
        );
        let (mut image, _) = AuthorizedKeys::parse_lines("image", TEST_PUB.lines());
        assert_eq!(image.extend(many), Err(AuthError::TooManyKeys));
        assert_eq!(image.len(), KEYS_MAX, "what fit is kept");
    }

    /// A distinct, valid ed25519 authorized-keys line per `i`.
    fn numbered_key(i: usize) -> String {
        let mut bytes = [0u8; 32];
        bytes[..8].copy_from_slice(&(i as u64).to_le_bytes());
        let data = ssh_key::public::KeyData::Ed25519(ssh_key::public::Ed25519PublicKey(bytes));
        PublicKey::new(data, format!("k{i}")).to_openssh().unwrap()
    }

    #[test]
    fn challenges_carry_the_context_and_differ() {
        let a = Challenge::new("box a", "b00t").unwrap();
        let b = Challenge::new("box a", "b00t").unwrap();
        assert_ne!(a, b, "fresh nonces");
        assert!(a
            .message
            .starts_with("ringstore-console v1 host=box_a boot=b00t nonce="));
        assert_eq!(a.message.split(' ').count(), 5);
        let nonce = a.message.rsplit("nonce=").next().unwrap();
        assert_eq!(nonce.len(), 64);
        assert!(Challenge::with_nonce("", "x", &[0; 32])
            .message
            .contains("host=- "));
    }

    #[test]
    fn backoff_doubles_from_one_second_to_sixty() {
        let t0 = Instant::now();
        let mut b = Backoff::default();
        assert_eq!(b.wait(t0), None);
        let mut delays = Vec::new();
        let mut now = t0;
        for _ in 0..9 {
            let d = b.failed(now);
            assert_eq!(b.wait(now), Some(d), "no attempt right after a failure");
            assert!(b.wait(now + d).is_none(), "allowed once it passed");
            assert!(b.wait(now + d - Duration::from_millis(1)).is_some());
            delays.push(d.as_secs());
            now += d;
        }
        assert_eq!(delays, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
        for _ in 0..100 {
            b.failed(now);
        }
        assert_eq!(b.wait(now), Some(BACKOFF_MAX));
        b.succeeded();
        assert_eq!((b.wait(now), b.failures()), (None, 0));
    }

    #[test]
    fn passwords_check_against_an_argon2id_hash_only() {
        use argon2::password_hash::{PasswordHasher, SaltString};
        let salt = SaltString::encode_b64(b"ringstore-test-salt").unwrap();
        let params = argon2::Params::new(1024, 1, 1, None).unwrap();
        let argon =
            argon2::Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params);
        let phc = argon.hash_password(b"hunter2", &salt).unwrap().to_string();
        let hash = PasswordHash::parse(&phc).unwrap();
        assert_eq!(hash.verify("hunter2").unwrap().fingerprint, "password");
        assert_eq!(hash.verify("hunter3"), Err(AuthError::WrongPassword));
        assert!(
            PasswordHash::parse("hunter2").is_err(),
            "a plain password is refused"
        );
        let argon2i = phc.replacen("$argon2id$", "$argon2i$", 1);
        assert!(PasswordHash::parse(&argon2i).is_err());
        assert!(PasswordHash::parse(&"$argon2id$".repeat(40)).is_err());
    }

    /// The QEMU tests' password file (`tests/keys/console-password.argon2id`) is the hash of
    /// the documented test-only password.
    #[test]
    fn the_test_password_file_matches_the_test_password() {
        const PHC: &str = include_str!("../../../tests/keys/console-password.argon2id");
        let hash = PasswordHash::parse(PHC).unwrap();
        assert!(hash.verify("ringstore-test-password").is_ok());
        assert_eq!(
            hash.verify("ringstore-test-passwore"),
            Err(AuthError::WrongPassword)
        );
    }
}
