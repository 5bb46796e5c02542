//! The users and tokens files (ADR 0032): memcached's `-Y` users file (`--auth-file`) and
//! the HTTP tokens file (`--http-tokens`), parsed and checked. Its own crate so that PID 1,
//! which checks both files at boot, reads them as the server does without the service.
//!
//! Secrets are never kept as given: each user name and password is held as its SHA-256
//! digest, and a check hashes what the client sent and compares it with every entry in
//! constant time (`subtle`), so neither the time a check takes nor anything in memory, the
//! log or `stats` says how much of a password was right.
#![forbid(unsafe_code)]

use sha2::{Digest, Sha256};
use subtle::{Choice, ConstantTimeEq};

use ringstore_tls::Subject;

/// Largest `--auth-file` accepted.
pub const AUTH_FILE_MAX: usize = 1 << 20;
/// Most `user:password` lines (memcached keeps 8 and drops the rest silently; ringstore
/// refuses a longer file instead).
pub const AUTH_ENTRIES_MAX: usize = 1024;
/// Longest line, line end excluded (memcached reads at most 255 bytes a line).
pub const AUTH_LINE_MAX: usize = 255;

/// Why an `--auth-file` was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AuthFileError {
    #[error("it is larger than {AUTH_FILE_MAX} bytes")]
    TooLarge,
    #[error("line {0} is not user:password")]
    Malformed(usize),
    #[error("line {0} is longer than {AUTH_LINE_MAX} bytes")]
    LongLine(usize),
    #[error("it has more than {AUTH_ENTRIES_MAX} entries")]
    TooMany,
    #[error("it has no user:password line")]
    Empty,
}

/// One `user:password` line, as digests.
struct Entry {
    user: [u8; 32],
    pass: [u8; 32],
}

/// The users of an `--auth-file`.
pub struct Credentials {
    entries: Vec<Entry>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Credentials({} users)", self.entries.len())
    }
}

fn digest(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

impl Credentials {
    /// Reads memcached's `-Y` format: one `user:password` per line; the user ends at the
    /// first `:`, the password at the line end (`\n`, `\r\n`). A line without `:` (an empty
    /// one too) refuses the whole file, as memcached refuses to start.
    pub fn parse(text: &[u8]) -> Result<Credentials, AuthFileError> {
        if text.len() > AUTH_FILE_MAX {
            return Err(AuthFileError::TooLarge);
        }
        let body = text.strip_suffix(b"\n").unwrap_or(text);
        if body.is_empty() {
            return Err(AuthFileError::Empty);
        }
        let mut entries = Vec::new();
        for (i, line) in body.split(|&b| b == b'\n').enumerate() {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if line.len() > AUTH_LINE_MAX {
                return Err(AuthFileError::LongLine(i + 1));
            }
            let colon = line
                .iter()
                .position(|&b| b == b':')
                .ok_or(AuthFileError::Malformed(i + 1))?;
            if entries.len() == AUTH_ENTRIES_MAX {
                return Err(AuthFileError::TooMany);
            }
            entries.push(Entry {
                user: digest(&line[..colon]),
                pass: digest(&line[colon + 1..]),
            });
        }
        Ok(Credentials { entries })
    }

    /// Users in the file.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Always false (a file without users is refused); for clippy's `len` rule.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// True when `user` with `pass` is a line of the file. Every entry is compared, in
    /// constant time, whatever matched before.
    pub fn check(&self, user: &[u8], pass: &[u8]) -> bool {
        self.login(user, pass).is_some()
    }

    /// Who `user` with `pass` is, when that is a line of the file (see
    /// [`Credentials::check`]).
    pub fn login(&self, user: &[u8], pass: &[u8]) -> Option<Identity> {
        let who = Identity(Entry {
            user: digest(user),
            pass: digest(pass),
        });
        self.holds(&who).then_some(who)
    }

    /// True while `who` (a login this file or an earlier one accepted) is still a line of
    /// the file, password unchanged. Every entry is compared, in constant time.
    pub fn holds(&self, who: &Identity) -> bool {
        let found = self.entries.iter().fold(Choice::from(0), |found, e| {
            found | (e.user.ct_eq(&who.0.user) & e.pass.ct_eq(&who.0.pass))
        });
        found.into()
    }
}

/// Who a connection logged in as: the digests of its `user:password` line, never what the
/// client sent (a reload asks [`Credentials::holds`] whether the line is still there).
pub struct Identity(Entry);

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Identity(..)")
    }
}

/// Most lines of an `--http-tokens` file.
pub const TOKENS_MAX: usize = 1024;
/// Longest token name or key prefix.
pub const TOKEN_FIELD_MAX: usize = 250;

/// What an HTTP token may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token {
    /// The name the file gives it (for the operator; logged, never the token).
    pub name: String,
    /// PUT and DELETE too (`write`); else GET and HEAD only (`read`).
    pub write: bool,
    /// Keys it may touch start with this (empty: every key).
    pub prefix: Vec<u8>,
}

/// The tokens of an `--http-tokens` file, each kept as the SHA-256 the file gives, and the
/// client certificate subjects (`subject:RFC4514`) that stand in for a token.
pub struct HttpTokens {
    entries: Vec<([u8; 32], Token)>,
    subjects: Vec<(Subject, Token)>,
}

impl std::fmt::Debug for HttpTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "HttpTokens({} tokens, {} subjects)",
            self.entries.len(),
            self.subjects.len()
        )
    }
}

/// The second field of a tokens line that maps a client certificate's subject.
pub const SUBJECT_PREFIX: &str = "subject:";

/// Why an `--http-tokens` file was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TokensFileError {
    #[error("it is larger than {AUTH_FILE_MAX} bytes")]
    TooLarge,
    #[error("line {0} is not NAME SHA256-HEX|subject:RFC4514-SUBJECT read|write [KEY-PREFIX]")]
    Malformed(usize),
    #[error(
        "line {0}: the subject is not an RFC 4514 name (CN=app1,O=Example; no spaces: write \\20)"
    )]
    BadSubject(usize),
    #[error("line {0}: the hash is not 64 hex digits")]
    BadHash(usize),
    #[error("line {0}: the name or prefix is longer than {TOKEN_FIELD_MAX} bytes")]
    LongField(usize),
    #[error("it has more than {TOKENS_MAX} tokens")]
    TooMany,
    #[error("it has no token line")]
    Empty,
}

fn hex32(text: &str) -> Option<[u8; 32]> {
    let bytes = text.as_bytes();
    if bytes.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, pair) in bytes.chunks(2).enumerate() {
        let digits = std::str::from_utf8(pair).ok()?;
        out[i] = u8::from_str_radix(digits, 16).ok()?;
    }
    Some(out)
}

impl HttpTokens {
    /// Reads `NAME SHA256-OF-TOKEN read|write [KEY-PREFIX]` and
    /// `NAME subject:RFC4514-SUBJECT read|write [KEY-PREFIX]` lines (fields separated by
    /// spaces or tabs; empty lines and lines starting with `#` are skipped).
    pub fn parse(text: &str) -> Result<HttpTokens, TokensFileError> {
        if text.len() > AUTH_FILE_MAX {
            return Err(TokensFileError::TooLarge);
        }
        let mut tokens = HttpTokens {
            entries: Vec::new(),
            subjects: Vec::new(),
        };
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            if tokens.entries.len() + tokens.subjects.len() == TOKENS_MAX {
                return Err(TokensFileError::TooMany);
            }
            tokens.parse_line(i + 1, line)?;
        }
        if tokens.entries.is_empty() && tokens.subjects.is_empty() {
            return Err(TokensFileError::Empty);
        }
        Ok(tokens)
    }

    /// Line `n` (not empty, not a comment).
    fn parse_line(&mut self, n: usize, line: &str) -> Result<(), TokensFileError> {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (name, secret, mode, prefix) = match fields[..] {
            [name, secret, mode] => (name, secret, mode, ""),
            [name, secret, mode, prefix] => (name, secret, mode, prefix),
            _ => return Err(TokensFileError::Malformed(n)),
        };
        let write = match mode {
            "read" => false,
            "write" => true,
            _ => return Err(TokensFileError::Malformed(n)),
        };
        if name.len() > TOKEN_FIELD_MAX || prefix.len() > TOKEN_FIELD_MAX {
            return Err(TokensFileError::LongField(n));
        }
        let token = Token {
            name: name.to_string(),
            write,
            prefix: prefix.as_bytes().to_vec(),
        };
        if let Some(subject) = secret.strip_prefix(SUBJECT_PREFIX) {
            let subject = Subject::parse(subject).ok_or(TokensFileError::BadSubject(n))?;
            self.subjects.push((subject, token));
        } else {
            let hash = hex32(secret).ok_or(TokensFileError::BadHash(n))?;
            self.entries.push((hash, token));
        }
        Ok(())
    }

    /// Lines in the file (tokens and subjects).
    pub fn len(&self) -> usize {
        self.entries.len() + self.subjects.len()
    }

    /// Always false (a file without lines is refused); for clippy's `len` rule.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The entry of a verified client certificate's `subject` (the first line that maps it).
    /// Subjects are not secrets: compared as they are.
    pub fn find_subject(&self, subject: &Subject) -> Option<&Token> {
        self.subjects
            .iter()
            .find(|(known, _)| known == subject)
            .map(|(_, token)| token)
    }

    /// The token whose hash is SHA-256(`presented`). Every entry is compared in constant
    /// time; the first match wins.
    pub fn find(&self, presented: &[u8]) -> Option<&Token> {
        let hash = digest(presented);
        let mut found = None;
        for (known, token) in &self.entries {
            let hit: bool = known.ct_eq(&hash).into();
            if hit && found.is_none() {
                found = Some(token);
            }
        }
        found
    }
}

/// The token of an `Authorization: Bearer TOKEN` value (RFC 6750 §2.1; the scheme is
/// case-insensitive).
pub fn bearer(value: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = value.split_at(value.len().min(7));
    if !scheme.eq_ignore_ascii_case(b"bearer ") {
        return None;
    }
    let token = rest.trim_ascii();
    (!token.is_empty()).then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_is_memcacheds_format() {
        let c = Credentials::parse(b"alice:secret\r\nbob:hun:ter2\n").unwrap();
        assert_eq!(c.len(), 2);
        assert!(c.check(b"alice", b"secret"));
        assert!(
            c.check(b"bob", b"hun:ter2"),
            "the password runs to the line end"
        );
        assert!(!c.check(b"alice", b"secre"));
        assert!(!c.check(b"alice", b"secret "));
        assert!(
            !c.check(b"bob", b"secret"),
            "a password belongs to its own user"
        );
        assert!(!c.check(b"", b""));
    }

    #[test]
    fn malformed_files_are_refused() {
        assert_eq!(
            Credentials::parse(b"alice:x\n\nbob:y\n").unwrap_err(),
            AuthFileError::Malformed(2)
        );
        assert_eq!(
            Credentials::parse(b"nocolon").unwrap_err(),
            AuthFileError::Malformed(1)
        );
        assert_eq!(Credentials::parse(b"").unwrap_err(), AuthFileError::Empty);
        let long = format!("u:{}\n", "p".repeat(AUTH_LINE_MAX));
        assert_eq!(
            Credentials::parse(long.as_bytes()).unwrap_err(),
            AuthFileError::LongLine(1)
        );
        let many = "u:p\n".repeat(AUTH_ENTRIES_MAX + 1);
        assert_eq!(
            Credentials::parse(many.as_bytes()).unwrap_err(),
            AuthFileError::TooMany
        );
        let big = vec![b'a'; AUTH_FILE_MAX + 1];
        assert_eq!(
            Credentials::parse(&big).unwrap_err(),
            AuthFileError::TooLarge
        );
    }

    #[test]
    fn no_secret_in_memory_or_debug() {
        let c = Credentials::parse(b"alice:topsecretpw\n").unwrap();
        assert_eq!(format!("{c:?}"), "Credentials(1 users)");
        let raw: Vec<u8> = c
            .entries
            .iter()
            .flat_map(|e| e.user.iter().chain(&e.pass))
            .copied()
            .collect();
        assert!(!raw.windows(5).any(|w| w == b"topse"));
    }

    #[test]
    fn subject_lines_map_client_certificates() {
        let hex = "cd".repeat(32);
        let text = format!(
            "app1 subject:CN=app1,O=Example read app1/\n\
             tok {hex} write\n\
             app2 subject:CN=app\\202 write\n"
        );
        let t = HttpTokens::parse(&text).unwrap();
        assert_eq!(t.len(), 3);
        assert_eq!(format!("{t:?}"), "HttpTokens(1 tokens, 2 subjects)");
        let app1 = t
            .find_subject(&Subject::parse("CN=app1,O=Example").unwrap())
            .unwrap();
        assert_eq!(
            (app1.name.as_str(), app1.write, app1.prefix.as_slice()),
            ("app1", false, &b"app1/"[..])
        );
        let app2 = t
            .find_subject(&Subject::parse("CN=app 2").unwrap())
            .unwrap();
        assert!(app2.write && app2.prefix.is_empty());
        assert!(t
            .find_subject(&Subject::parse("CN=app1").unwrap())
            .is_none());
        // A subject is never a bearer token.
        assert!(t.find(b"subject:CN=app1,O=Example").is_none());
        for bad in ["subject: read", "subject:CN read", "subject:XX=1 read"] {
            assert_eq!(
                HttpTokens::parse(&format!("n {bad}")).unwrap_err(),
                TokensFileError::BadSubject(1),
                "{bad}"
            );
        }
        let only = HttpTokens::parse("a subject:CN=a read\n").unwrap();
        assert_eq!(only.len(), 1);
        let many = "a subject:CN=a read\n".repeat(TOKENS_MAX + 1);
        assert_eq!(
            HttpTokens::parse(&many).unwrap_err(),
            TokensFileError::TooMany
        );
    }

    #[test]
    fn http_token_files() {
        let good = digest(b"tok-read");
        let hex: String = good.iter().map(|b| format!("{b:02x}")).collect();
        let text = format!(
            "# comment\n\nreader {hex} read\nwriter {} write users/\n",
            "ab".repeat(32)
        );
        let t = HttpTokens::parse(&text).unwrap();
        assert_eq!(t.len(), 2);
        let found = t.find(b"tok-read").unwrap();
        assert_eq!(
            (found.name.as_str(), found.write, found.prefix.as_slice()),
            ("reader", false, &b""[..])
        );
        assert!(t.find(b"tok-rea").is_none());
        assert!(t.find(&good).is_none(), "the hash itself is not the token");
        assert_eq!(format!("{t:?}"), "HttpTokens(2 tokens, 0 subjects)");
        assert_eq!(
            HttpTokens::parse("a b").unwrap_err(),
            TokensFileError::Malformed(1)
        );
        assert_eq!(
            HttpTokens::parse(&format!("a {hex} admin")).unwrap_err(),
            TokensFileError::Malformed(1)
        );
        assert_eq!(
            HttpTokens::parse("a 12 read").unwrap_err(),
            TokensFileError::BadHash(1)
        );
        assert_eq!(
            HttpTokens::parse(&format!("a {} read", "zz".repeat(32))).unwrap_err(),
            TokensFileError::BadHash(1)
        );
        assert_eq!(
            HttpTokens::parse("# nothing\n").unwrap_err(),
            TokensFileError::Empty
        );
        let many = format!("a {hex} read\n").repeat(TOKENS_MAX + 1);
        assert_eq!(
            HttpTokens::parse(&many).unwrap_err(),
            TokensFileError::TooMany
        );
    }

    #[test]
    fn bearer_values() {
        assert_eq!(bearer(b"Bearer abc"), Some(&b"abc"[..]));
        assert_eq!(bearer(b"bearer   abc "), Some(&b"abc"[..]));
        assert_eq!(bearer(b"Basic abc"), None);
        assert_eq!(bearer(b"Bearer "), None);
        assert_eq!(bearer(b"Bearerabc"), None);
    }
}
