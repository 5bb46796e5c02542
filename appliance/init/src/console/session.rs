//! The console's login state: logged out (only `help` and `login`), pasting a signature for a
//! challenge, typing a password, or logged in as an identity until `logout` or an idle timeout.
//! The credentials are the image's (/etc/ringstore/authorized_keys, /etc/ringstore/console-password)
//! and the config partition's `/authorized_keys` (read at boot by `bootdisk.rs`); each key keeps
//! its source, which `keys`, the login answer and the log name.
//! ADR-0023.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use ringstore_console::login::{IDLE_LIMIT, SIGNATURE_LINES_MAX};
use ringstore_console::{AuthError, AuthorizedKeys, Backoff, Challenge, Identity, PasswordHash};

use super::output::Output;

/// The image's authorized keys (`cargo xtask image --authorized-keys FILE`).
pub const AUTHORIZED_KEYS_PATH: &str = "/etc/ringstore/authorized_keys";
/// The image's argon2id password hash (a PHC string), if any.
pub const PASSWORD_HASH_PATH: &str = "/etc/ringstore/console-password";
/// A challenge not answered within this long is void.
pub const CHALLENGE_LIFETIME: Duration = Duration::from_secs(300);
/// Largest credentials file read.
const CREDENTIALS_FILE_MAX: u64 = 256 << 10;

/// The sources of authorized keys, as `keys`, `login` and the log name them.
pub const SOURCE_IMAGE: &str = "image";
pub const SOURCE_PARTITION: &str = "config-partition";

/// What may log in.
#[derive(Debug, Default)]
pub struct Credentials {
    pub keys: AuthorizedKeys,
    pub password: Option<PasswordHash>,
    /// What was skipped and why (a bad line, a file over its limit), one text each: logged at
    /// boot, shown by `keys` and by `login` when no key is configured.
    pub problems: Vec<String>,
}

impl Credentials {
    /// From the sources' texts: the image's authorized_keys and password hash (absent: `None`),
    /// then the config partition's authorized_keys (`Err`: why it could not be read). A bad key
    /// line is skipped and reported, never fatal; keys past the limit
    /// ([`ringstore_console::login::KEYS_MAX`], all sources together) are dropped and reported.
    pub fn build(
        image_keys: Option<&str>,
        password: Option<&str>,
        partition_keys: Option<Result<&str, &str>>,
    ) -> Credentials {
        let mut creds = Credentials::default();
        let add = |creds: &mut Credentials, source: &str, what: &str, text: &str| {
            let (keys, problems) = AuthorizedKeys::parse_lines(source, text.lines());
            creds
                .problems
                .extend(problems.iter().map(|p| format!("{what}: {p} (skipped)")));
            if let Err(e) = creds.keys.extend(keys) {
                creds
                    .problems
                    .push(format!("{what}: {e} in all (the rest skipped)"));
            }
        };
        if let Some(text) = image_keys {
            add(&mut creds, SOURCE_IMAGE, AUTHORIZED_KEYS_PATH, text);
        }
        if let Some(text) = password {
            match PasswordHash::parse(text) {
                Ok(hash) => creds.password = Some(hash),
                Err(e) => creds.problems.push(format!("{PASSWORD_HASH_PATH}: {e}")),
            }
        }
        let what = format!("config partition {}", crate::bootdisk::AUTHORIZED_KEYS_FILE);
        match partition_keys {
            Some(Ok(text)) => add(&mut creds, SOURCE_PARTITION, &what, text),
            Some(Err(why)) => creds.problems.push(format!("{what}: {why} (not used)")),
            None => {}
        }
        creds
    }

    /// `N authorized keys (A from image, B from config-partition), a password`.
    pub fn summary(&self) -> String {
        format!(
            "{} authorized keys ({} from {SOURCE_IMAGE}, {} from {SOURCE_PARTITION}), {} password",
            self.keys.len(),
            self.keys.count_from(SOURCE_IMAGE),
            self.keys.count_from(SOURCE_PARTITION),
            if self.password.is_some() { "a" } else { "no" }
        )
    }
}

static CREDENTIALS: Mutex<Option<Credentials>> = Mutex::new(None);

fn credentials() -> std::sync::MutexGuard<'static, Option<Credentials>> {
    CREDENTIALS.lock().unwrap_or_else(|p| p.into_inner())
}

fn read_bounded(path: &str) -> Option<String> {
    use std::io::Read;
    let file = std::fs::File::open(path).ok()?;
    let mut text = String::new();
    file.take(CREDENTIALS_FILE_MAX)
        .read_to_string(&mut text)
        .ok()?;
    Some(text)
}

/// Reads the credentials once (at boot, before the first prompt): the image's files and
/// `partition_keys`, the config partition's authorized_keys as boot found it.
pub fn load_credentials(partition_keys: Option<Result<String, String>>) {
    let creds = Credentials::build(
        read_bounded(AUTHORIZED_KEYS_PATH).as_deref(),
        read_bounded(PASSWORD_HASH_PATH).as_deref(),
        partition_keys
            .as_ref()
            .map(|r| r.as_ref().map(String::as_str).map_err(String::as_str)),
    );
    crate::info!("console: {}", creds.summary());
    for p in &creds.problems {
        crate::warn!("console: {p}");
    }
    *credentials() = Some(creds);
}

/// The credentials' keys, password and problems, for `keys`.
pub fn describe() -> (Vec<ringstore_console::KeyInfo>, bool, Vec<String>) {
    let guard = credentials();
    match guard.as_ref() {
        Some(c) => (c.keys.list(), c.password.is_some(), c.problems.clone()),
        None => (Vec::new(), false, Vec::new()),
    }
}

/// Adds authorized keys from another source (`source` names it in `keys` and the log), all or
/// nothing: a bad line refuses the whole source (tests and tools that build a box in-process).
pub fn add_authorized_key_lines(source: &str, lines: &[&str]) -> Result<usize, AuthError> {
    let (keys, mut problems) = AuthorizedKeys::parse_lines(source, lines.iter().copied());
    if !problems.is_empty() {
        return Err(problems.remove(0));
    }
    let added = keys.len();
    let mut guard = credentials();
    let creds = guard.get_or_insert_with(Credentials::default);
    creds.keys.extend(keys)?;
    crate::info!("console: {added} authorized keys from {source}");
    Ok(added)
}

enum Phase {
    Out,
    Signature {
        challenge: String,
        issued: Instant,
        paste: Vec<String>,
        json: bool,
    },
    Password {
        json: bool,
    },
    In {
        who: Identity,
        last: Instant,
    },
}

/// One console's login state.
pub struct Session {
    phase: Phase,
    backoff: Backoff,
    host: String,
    boot_id: String,
}

impl Session {
    pub fn new(host: &str, boot_id: &str) -> Session {
        Session {
            phase: Phase::Out,
            backoff: Backoff::default(),
            host: host.to_string(),
            boot_id: boot_id.to_string(),
        }
    }

    /// For the box: hostname and boot id from /proc.
    pub fn for_this_boot() -> Session {
        let read = |p: &str| ringstore_sys::read_trim(p).unwrap_or_default();
        Session::new(
            &crate::hostname::current(),
            &read("/proc/sys/kernel/random/boot_id"),
        )
    }

    pub fn who(&self) -> Option<&Identity> {
        match &self.phase {
            Phase::In { who, .. } => Some(who),
            _ => None,
        }
    }

    /// The prompt to print after an answer: `signature: ` when a challenge was printed, none
    /// while its lines are being pasted.
    pub fn prompt(&self) -> Option<&'static str> {
        match &self.phase {
            // The signature prompt once, before the paste; none between its lines.
            Phase::Signature { paste, .. } if paste.is_empty() => {
                Some(ringstore_console::SIGNATURE_PROMPT)
            }
            Phase::Signature { .. } => None,
            Phase::Password { .. } => Some(ringstore_console::PASSWORD_PROMPT),
            _ => Some(ringstore_console::PROMPT),
        }
    }

    /// Ends a logged-in session idle past [`IDLE_LIMIT`] at `now`; returns the notice.
    pub fn check_idle(&mut self, now: Instant) -> Option<String> {
        if let Phase::In { last, who } = &mut self.phase {
            if now.saturating_duration_since(*last) > IDLE_LIMIT {
                let notice = format!(
                    "session of {who} ended: idle for more than {} s; log in again",
                    IDLE_LIMIT.as_secs()
                );
                crate::info!("console: {notice}");
                self.phase = Phase::Out;
                return Some(notice);
            }
            *last = now;
        }
        None
    }

    /// A line typed while a signature or password is expected: its answer (`None`: the line
    /// is a command).
    pub fn take_line(&mut self, line: &str, now: Instant) -> Option<Vec<String>> {
        match &mut self.phase {
            Phase::Out | Phase::In { .. } => None,
            Phase::Password { json } => {
                let json = *json;
                let creds = credentials();
                let result = creds
                    .as_ref()
                    .and_then(|c| c.password.as_ref())
                    .ok_or(AuthError::NoPassword)
                    .and_then(|hash| hash.verify(line));
                drop(creds);
                Some(self.finish(result, now).render("login", json))
            }
            Phase::Signature {
                challenge,
                issued,
                paste,
                json,
            } => {
                let json = *json;
                let trimmed = line.trim();
                if trimmed == "cancel" {
                    self.phase = Phase::Out;
                    return Some(Output::error("login cancelled").render("login", json));
                }
                if !trimmed.is_empty() {
                    paste.push(trimmed.to_string());
                }
                if paste.len() > SIGNATURE_LINES_MAX {
                    let why =
                        AuthError::Malformed(format!("more than {SIGNATURE_LINES_MAX} lines"));
                    return Some(self.finish(Err(why), now).render("login", json));
                }
                if !trimmed.starts_with("-----END SSH SIGNATURE-----") {
                    return Some(Vec::new());
                }
                let result = if now.saturating_duration_since(*issued) > CHALLENGE_LIFETIME {
                    Err(AuthError::Malformed(format!(
                        "the challenge is older than {} s",
                        CHALLENGE_LIFETIME.as_secs()
                    )))
                } else {
                    let armored = paste.join("\n");
                    let challenge = challenge.clone();
                    credentials()
                        .as_ref()
                        .ok_or(AuthError::NotAuthorized)
                        .and_then(|c| c.keys.verify(&challenge, &armored))
                };
                Some(self.finish(result, now).render("login", json))
            }
        }
    }

    fn finish(&mut self, result: Result<Identity, AuthError>, now: Instant) -> Output {
        match result {
            Ok(who) => {
                self.backoff.succeeded();
                let kind = if who.fingerprint == "password" {
                    "password"
                } else {
                    "key"
                };
                crate::info!("console: {who} logged in ({kind} from {})", who.source);
                let mut out = Output::new();
                out.line(format!("logged in as {who}"));
                out.set("phase", "done");
                out.set("comment", who.comment.clone());
                out.set("fingerprint", who.fingerprint.clone());
                out.set("source", who.source.clone());
                self.phase = Phase::In { who, last: now };
                out
            }
            Err(why) => {
                self.phase = Phase::Out;
                let wait = self.backoff.failed(now);
                crate::warn!(
                    "console: login refused ({why}); {} failed attempts, next in {} s",
                    self.backoff.failures(),
                    wait.as_secs()
                );
                let mut out = Output::error(format!(
                    "login refused: {why}; next attempt in {} s",
                    wait.as_secs()
                ));
                out.set("retry_in_s", wait.as_secs());
                out
            }
        }
    }

    /// `login [password]`: a challenge to sign (or the password prompt), unless backing off.
    pub fn start_login(&mut self, args: &[&str], json: bool, now: Instant) -> Output {
        if let Some(wait) = self.backoff.wait(now) {
            // Whole seconds, rounded up: a wait of 0.2 s says 1 s, never 0.
            let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
            let mut out = Output::error(format!(
                "{} failed attempts: wait {secs} s before the next login",
                self.backoff.failures()
            ));
            out.set("retry_in_s", secs);
            return out;
        }
        let guard = credentials();
        let creds = guard.as_ref();
        if args.first() == Some(&"password") {
            if creds.and_then(|c| c.password.as_ref()).is_none() {
                return Output::error("no console password is configured on this box");
            }
            self.phase = Phase::Password { json };
            let mut out = Output::new();
            out.set("phase", "password");
            return out;
        }
        if creds.is_none_or(|c| c.keys.is_empty()) {
            let why = creds.map(|c| c.problems.join("; ")).unwrap_or_default();
            return Output::error(format!(
                "no authorized keys on this box (build the image with --authorized-keys FILE, or put {} on the config partition){}",
                crate::bootdisk::AUTHORIZED_KEYS_FILE,
                if why.is_empty() {
                    String::new()
                } else {
                    format!(": {why}")
                }
            ));
        }
        drop(guard);
        let challenge = match Challenge::new(&self.host, &self.boot_id) {
            Ok(c) => c.message,
            Err(e) => return Output::error(e.to_string()),
        };
        let mut out = Output::new();
        out.line(format!("challenge {challenge}"));
        out.line(format!(
            "sign it: printf '%s' '{challenge}' | ssh-keygen -Y sign -n {} -f KEY",
            ringstore_console::NAMESPACE
        ));
        out.line("then paste the signature (a line `cancel` gives up)");
        out.set("phase", "challenge");
        out.set("challenge", challenge.clone());
        out.set("namespace", ringstore_console::NAMESPACE);
        self.phase = Phase::Signature {
            challenge,
            issued: now,
            paste: Vec::new(),
            json,
        };
        out
    }

    pub fn logout(&mut self) -> Output {
        let mut out = Output::new();
        if let Some(who) = self.who() {
            crate::info!("console: {who} logged out");
            out.line(format!("{who} logged out"));
        }
        self.phase = Phase::Out;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEST_PUB: &str = include_str!("../../../../tests/keys/test_ed25519.pub");
    const TEST_KEY: &str = include_str!("../../../../tests/keys/test_ed25519");
    const WRONG_KEY: &str = include_str!("../../../../tests/keys/wrong_ed25519");

    fn sign(key: &str, message: &str) -> String {
        let key = ssh_key::PrivateKey::from_openssh(key).unwrap();
        key.sign(
            ringstore_console::NAMESPACE,
            ssh_key::HashAlg::Sha512,
            message.as_bytes(),
        )
        .unwrap()
        .to_pem(ssh_key::LineEnding::LF)
        .unwrap()
    }

    fn paste(s: &mut Session, armored: &str, now: Instant) -> Vec<String> {
        let mut last = Vec::new();
        for line in armored.lines() {
            last = s.take_line(line, now).expect("pasting");
        }
        last
    }

    const PART_PUB: &str = include_str!("../../../../tests/keys/partition_ed25519.pub");
    const PART_KEY: &str = include_str!("../../../../tests/keys/partition_ed25519");
    const TEST_PHC: &str = include_str!("../../../../tests/keys/console-password.argon2id");

    #[test]
    fn credentials_merge_the_image_and_the_config_partition() {
        use ringstore_console::login::{KEYS_MAX, KEY_LINE_MAX};
        let long = format!("ssh-ed25519 {}", "A".repeat(KEY_LINE_MAX));
        let partition = format!("{PART_PUB}ssh-ed25519 garbage\n{long}\n{TEST_PUB}");
        let c = Credentials::build(Some(TEST_PUB), Some(TEST_PHC), Some(Ok(&partition)));
        assert_eq!(
            c.summary(),
            "2 authorized keys (1 from image, 1 from config-partition), a password"
        );
        // Both bad lines are named and skipped; nothing else is lost.
        assert_eq!(c.problems.len(), 2, "{:?}", c.problems);
        assert!(
            c.problems[0].starts_with("config partition authorized_keys: authorized key line 2:")
        );
        assert!(c.problems[1].contains("line 3: longer than 2048 bytes (skipped)"));
        let message = "ringstore-console v1 host=h boot=b nonce=00";
        let who = c.keys.verify(message, &sign(PART_KEY, message)).unwrap();
        assert_eq!(who.source, SOURCE_PARTITION);
        assert_eq!(
            c.keys.verify(message, &sign(WRONG_KEY, message)),
            Err(AuthError::NotAuthorized)
        );
        // An unreadable partition file, a bad password hash: reported, the image's key stays.
        let c = Credentials::build(
            Some(TEST_PUB),
            Some("hunter2"),
            Some(Err("authorized_keys: too large")),
        );
        assert_eq!(
            (c.keys.len(), c.password.is_none(), c.problems.len()),
            (1, true, 2)
        );
        assert!(
            c.problems[1].ends_with("too large (not used)"),
            "{:?}",
            c.problems
        );
        // Only the partition: its keys are enough; past KEYS_MAX in all, the rest is skipped.
        let many: String = (0..KEYS_MAX + 3)
            .map(|i| {
                let mut bytes = [0u8; 32];
                bytes[..8].copy_from_slice(&(i as u64).to_le_bytes());
                let data =
                    ssh_key::public::KeyData::Ed25519(ssh_key::public::Ed25519PublicKey(bytes));
                ssh_key::PublicKey::new(data, "k").to_openssh().unwrap() + "\n"
            })
            .collect();
        let c = Credentials::build(Some(TEST_PUB), None, Some(Ok(&many)));
        assert_eq!(c.keys.len(), KEYS_MAX);
        assert_eq!(c.keys.count_from(SOURCE_PARTITION), KEYS_MAX - 1);
        assert!(
            c.problems.iter().any(|p| p.contains("more than 64")),
            "{:?}",
            c.problems
        );
    }

    #[test]
    fn password_login_and_backoff() {
        // Only the password is set: the key test shares the credentials.
        credentials()
            .get_or_insert_with(Credentials::default)
            .password = Some(PasswordHash::parse(TEST_PHC).unwrap());
        let t0 = Instant::now();
        let mut s = Session::new("box", "boot-1");
        let out = s.start_login(&["password"], true, t0);
        assert!(out.ok && out.fields["phase"] == "password");
        assert_eq!(s.prompt(), Some(ringstore_console::PASSWORD_PROMPT));
        let refused = s.take_line("wrong", t0).unwrap();
        assert!(refused[0].contains("wrong password") && refused[0].contains("retry_in_s"));
        assert!(!s.start_login(&["password"], true, t0).ok, "backing off");
        let t1 = t0 + Duration::from_secs(1);
        assert!(s.start_login(&["password"], true, t1).ok);
        let ok = s.take_line("ringstore-test-password", t1).unwrap();
        assert!(ok[0].contains("\"fingerprint\":\"password\""), "{ok:?}");
        assert!(s.who().is_some());
    }

    #[test]
    fn key_login_backoff_and_idle_end() {
        add_authorized_key_lines("test", &TEST_PUB.lines().collect::<Vec<_>>()).unwrap();
        let t0 = Instant::now();
        let mut s = Session::new("box", "boot-1");
        assert!(s.who().is_none());
        let out = s.start_login(&[], true, t0);
        let challenge = out.fields["challenge"].as_str().unwrap().to_string();
        assert!(challenge.contains("host=box boot=boot-1 nonce="));
        assert_eq!(s.prompt(), Some(ringstore_console::SIGNATURE_PROMPT));
        assert_eq!(
            s.take_line("-----BEGIN SSH SIGNATURE-----", t0),
            Some(vec![])
        );
        assert_eq!(s.prompt(), None, "no prompt between pasted lines");
        assert!(s.take_line("cancel", t0).unwrap()[0].contains("cancelled"));
        let out = s.start_login(&[], true, t0);
        let challenge = out.fields["challenge"].as_str().unwrap().to_string();
        // The wrong key: refused, and a second login right away is refused by the back-off.
        let answer = paste(&mut s, &sign(WRONG_KEY, &challenge), t0);
        assert!(
            answer[0].contains("\"ok\":false") && answer[0].contains("retry_in_s"),
            "{answer:?}"
        );
        assert!(s.who().is_none());
        let early = s.start_login(&[], false, t0 + Duration::from_millis(500));
        assert!(
            !early.ok && early.text[0].contains("wait 1 s"),
            "{:?}",
            early.text
        );
        // After 1 s a new challenge; the old challenge's signature (replay) fails, now 2 s.
        let t1 = t0 + Duration::from_secs(1);
        let old = sign(TEST_KEY, &challenge);
        let next = s.start_login(&[], false, t1);
        assert!(next.ok);
        let replay = paste(&mut s, &old, t1);
        assert!(replay[0].contains("next attempt in 2 s"), "{replay:?}");
        assert!(
            !s.start_login(&[], false, t1 + Duration::from_millis(1900))
                .ok
        );
        // The right key on a fresh challenge logs in and resets the back-off.
        let t2 = t1 + Duration::from_secs(2);
        let fresh = s.start_login(&[], false, t2).fields["challenge"]
            .as_str()
            .unwrap()
            .to_string();
        let ok = paste(&mut s, &sign(TEST_KEY, &fresh), t2);
        assert!(
            ok[0].starts_with("logged in as ringstore-test-only"),
            "{ok:?}"
        );
        assert!(s.who().unwrap().fingerprint.starts_with("SHA256:"));
        assert_eq!(s.prompt(), Some(ringstore_console::PROMPT));
        // Active use keeps it; idle past the limit ends it.
        assert!(s.check_idle(t2 + IDLE_LIMIT).is_none());
        let end = s.check_idle(t2 + IDLE_LIMIT * 2 + Duration::from_secs(1));
        assert!(end.unwrap().contains("idle"));
        assert!(s.who().is_none());
        // A stale challenge is refused; `cancel` gives up; a runaway paste is bounded.
        let t3 = t2 + IDLE_LIMIT * 3;
        let c = s.start_login(&[], false, t3).fields["challenge"]
            .as_str()
            .unwrap()
            .to_string();
        let late = paste(
            &mut s,
            &sign(TEST_KEY, &c),
            t3 + CHALLENGE_LIFETIME + Duration::from_secs(1),
        );
        assert!(late[0].contains("older than"), "{late:?}");
        let t4 = t3 + CHALLENGE_LIFETIME + Duration::from_secs(10);
        assert!(s.start_login(&[], false, t4).ok);
        assert!(s.take_line("cancel", t4).unwrap()[0].contains("cancelled"));
        assert!(s.start_login(&[], false, t4).ok);
        let mut answer = Vec::new();
        for _ in 0..=SIGNATURE_LINES_MAX {
            answer = s.take_line("AAAA", t4).unwrap();
        }
        assert!(answer[0].contains("more than"), "{answer:?}");
        assert!(s.who().is_none());
    }
}
