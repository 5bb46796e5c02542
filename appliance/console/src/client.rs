//! The host side of the console: log in (the challenge signed with a key file or through
//! ssh-agent), run one command with `--json`, return its answer objects. `ringstore console`
//! and the QEMU tests both drive the box through [`Client`].

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;
use ssh_key::{HashAlg, LineEnding, PrivateKey, PublicKey, SshSig};

use crate::frame::{self, FrameError};
use crate::split::{Splitter, Utf8Pieces};
use crate::{NAMESPACE, PASSWORD_PROMPT, PROMPT, SIGNATURE_PROMPT};

/// Most of PID 1's text a client holds while waiting for something.
pub const PENDING_MAX: usize = 4 << 20;
/// Longest ssh-agent reply taken.
const AGENT_REPLY_MAX: usize = 256 << 10;

/// Why the client failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("console i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("waited {0:?} for {1:?} from the console; last text: {2}")]
    Timeout(Duration, String, String),
    #[error("the console closed")]
    Closed,
    #[error("{0}")]
    Frame(#[from] FrameError),
    #[error("key: {0}")]
    Key(String),
    #[error("ssh-agent: {0}")]
    Agent(String),
    #[error("login refused: {0}")]
    Refused(String),
    #[error("the console's answer has no {0}")]
    Answer(&'static str),
}

/// A console connection: text to the box, PID 1's text back (kernel records already cut out).
pub trait Link {
    fn send(&mut self, text: &str) -> std::io::Result<()>;
    /// PID 1's text that arrived since the last call, waiting at most `wait` for some; an empty
    /// string when none came. `Err(UnexpectedEof)` once the other side closed.
    fn recv(&mut self, wait: Duration) -> std::io::Result<String>;
}

/// A [`Link`] over a byte stream (a unix socket, a tty): a thread reads it, the bytes are
/// decoded and split from the kernel's records (`split.rs`).
pub struct StreamLink<W: Write> {
    writer: W,
    bytes: mpsc::Receiver<Vec<u8>>,
    split: Splitter,
    utf8: Utf8Pieces,
    closed: bool,
}

impl<W: Write> StreamLink<W> {
    pub fn new(mut reader: impl Read + Send + 'static, writer: W) -> StreamLink<W> {
        let (tx, rx) = mpsc::sync_channel(64);
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = reader.read(&mut buf) {
                if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                    break;
                }
            }
        });
        StreamLink {
            writer,
            bytes: rx,
            split: Splitter::default(),
            utf8: Utf8Pieces::default(),
            closed: false,
        }
    }
}

impl<W: Write> Link for StreamLink<W> {
    fn send(&mut self, text: &str) -> std::io::Result<()> {
        self.writer.write_all(text.as_bytes())?;
        self.writer.flush()
    }

    fn recv(&mut self, wait: Duration) -> std::io::Result<String> {
        if self.closed {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        match self.bytes.recv_timeout(wait) {
            Ok(bytes) => {
                let text = self.utf8.decode(&bytes);
                self.split.feed(&text);
                Ok(std::mem::take(&mut self.split.pid1))
            }
            Err(mpsc::RecvTimeoutError::Timeout) => Ok(String::new()),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                self.closed = true;
                Err(std::io::ErrorKind::UnexpectedEof.into())
            }
        }
    }
}

/// What signs a challenge.
pub enum Signer {
    /// An unencrypted OpenSSH private key.
    Key(Box<PrivateKey>),
    /// The ssh-agent at this socket, with its first identity or the one given.
    Agent {
        socket: PathBuf,
        key: Option<PublicKey>,
    },
}

impl Signer {
    pub fn from_key_file(path: &Path) -> Result<Signer, ClientError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ClientError::Key(format!("{}: {e}", path.display())))?;
        let key = PrivateKey::from_openssh(text)
            .map_err(|e| ClientError::Key(format!("{}: {e}", path.display())))?;
        if key.is_encrypted() {
            return Err(ClientError::Key(format!(
                "{} is encrypted: load it into ssh-agent instead",
                path.display()
            )));
        }
        Ok(Signer::Key(Box::new(key)))
    }

    /// The armored SSHSIG of `message`, as `ssh-keygen -Y sign -n ringstore-console` makes it.
    pub fn sign(&self, message: &str) -> Result<String, ClientError> {
        let sig = match self {
            Signer::Key(key) => key
                .sign(NAMESPACE, HashAlg::Sha512, message.as_bytes())
                .map_err(|e| ClientError::Key(e.to_string()))?,
            Signer::Agent { socket, key } => agent_sign(socket, key.as_ref(), message)?,
        };
        sig.to_pem(LineEnding::LF)
            .map_err(|e| ClientError::Key(e.to_string()))
    }
}

/// ssh-agent protocol (draft-miller-ssh-agent): one request, one reply, each `u32 length` then
/// the message.
fn agent_call(
    stream: &mut std::os::unix::net::UnixStream,
    msg: &[u8],
) -> Result<Vec<u8>, ClientError> {
    let agent = |e: std::io::Error| ClientError::Agent(e.to_string());
    let len =
        u32::try_from(msg.len()).map_err(|_| ClientError::Agent("request too long".into()))?;
    stream.write_all(&len.to_be_bytes()).map_err(agent)?;
    stream.write_all(msg).map_err(agent)?;
    let mut len = [0u8; 4];
    stream.read_exact(&mut len).map_err(agent)?;
    let len = u32::from_be_bytes(len) as usize;
    if len > AGENT_REPLY_MAX || len == 0 {
        return Err(ClientError::Agent(format!("a reply of {len} bytes")));
    }
    let mut reply = vec![0u8; len];
    stream.read_exact(&mut reply).map_err(agent)?;
    Ok(reply)
}

/// An SSH wire `string`: u32 length, then the bytes (refused past 4 GiB, which the wire
/// format cannot say).
fn put_string(out: &mut Vec<u8>, bytes: &[u8]) -> Result<(), ClientError> {
    let len = u32::try_from(bytes.len())
        .map_err(|_| ClientError::Agent(format!("a string of {} bytes", bytes.len())))?;
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(bytes);
    Ok(())
}

fn take_string<'a>(input: &mut &'a [u8]) -> Result<&'a [u8], ClientError> {
    let short = || ClientError::Agent("a short reply".into());
    let len = input.get(..4).ok_or_else(short)?;
    let len = u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize;
    let bytes = input.get(4..4 + len).ok_or_else(short)?;
    *input = &input[4 + len..];
    Ok(bytes)
}

const SSH_AGENTC_REQUEST_IDENTITIES: u8 = 11;
const SSH_AGENT_IDENTITIES_ANSWER: u8 = 12;
const SSH_AGENTC_SIGN_REQUEST: u8 = 13;
const SSH_AGENT_SIGN_RESPONSE: u8 = 14;

fn agent_sign(
    socket: &Path,
    key: Option<&PublicKey>,
    message: &str,
) -> Result<SshSig, ClientError> {
    let mut stream = std::os::unix::net::UnixStream::connect(socket)
        .map_err(|e| ClientError::Agent(format!("{}: {e}", socket.display())))?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let key = match key {
        Some(k) => k.clone(),
        None => {
            let reply = agent_call(&mut stream, &[SSH_AGENTC_REQUEST_IDENTITIES])?;
            let (&kind, mut rest) = reply
                .split_first()
                .ok_or(ClientError::Agent("empty".into()))?;
            if kind != SSH_AGENT_IDENTITIES_ANSWER || rest.len() < 4 {
                return Err(ClientError::Agent(format!("identities answer type {kind}")));
            }
            let count = u32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]);
            rest = &rest[4..];
            let mut found = None;
            for _ in 0..count.min(1024) {
                let blob = take_string(&mut rest)?;
                let _comment = take_string(&mut rest)?;
                if let Ok(k) = PublicKey::from_bytes(blob) {
                    found = Some(k);
                    break;
                }
            }
            found.ok_or_else(|| ClientError::Agent("the agent holds no usable key".into()))?
        }
    };
    let blob = key
        .to_bytes()
        .map_err(|e| ClientError::Key(e.to_string()))?;
    let data = SshSig::signed_data(NAMESPACE, HashAlg::Sha512, message.as_bytes())
        .map_err(|e| ClientError::Key(e.to_string()))?;
    let mut request = vec![SSH_AGENTC_SIGN_REQUEST];
    put_string(&mut request, &blob)?;
    put_string(&mut request, &data)?;
    // Flags 0: ed25519 has one signature algorithm (RSA would ask for rsa-sha2-512 here).
    request.extend_from_slice(&0u32.to_be_bytes());
    let reply = agent_call(&mut stream, &request)?;
    let (&kind, mut rest) = reply
        .split_first()
        .ok_or(ClientError::Agent("empty".into()))?;
    if kind != SSH_AGENT_SIGN_RESPONSE {
        return Err(ClientError::Agent(format!(
            "the agent refused to sign (reply type {kind})"
        )));
    }
    let signature = ssh_key::Signature::try_from(take_string(&mut rest)?)
        .map_err(|e| ClientError::Agent(e.to_string()))?;
    SshSig::new(
        key.key_data().clone(),
        NAMESPACE,
        HashAlg::Sha512,
        signature,
    )
    .map_err(|e| ClientError::Agent(e.to_string()))
}

/// Who the box says logged in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoggedIn {
    pub comment: String,
    pub fingerprint: String,
    /// Where the box found the key (`image`, `config-partition`); `image` for the password.
    pub source: String,
}

/// A console session driven from the host.
pub struct Client<L: Link> {
    link: L,
    /// PID 1's text received and not yet consumed.
    pending: String,
    /// How long one answer may take.
    pub limit: Duration,
}

impl<L: Link> Client<L> {
    pub fn new(link: L) -> Client<L> {
        Client {
            link,
            pending: String::new(),
            limit: Duration::from_secs(30),
        }
    }

    pub fn link(&mut self) -> &mut L {
        &mut self.link
    }

    /// Reads until `needle`; returns the text up to and including it, keeping the rest.
    fn read_until(&mut self, needle: &str) -> Result<String, ClientError> {
        let deadline = Instant::now() + self.limit;
        loop {
            if let Some(at) = self.pending.find(needle) {
                let rest = self.pending.split_off(at + needle.len());
                return Ok(std::mem::replace(&mut self.pending, rest));
            }
            let now = Instant::now();
            if now >= deadline {
                let tail: String = self
                    .pending
                    .chars()
                    .rev()
                    .take(400)
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .collect();
                return Err(ClientError::Timeout(self.limit, needle.into(), tail));
            }
            match self
                .link
                .recv((deadline - now).min(Duration::from_millis(200)))
            {
                Ok(text) => self.pending.push_str(&text),
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                    return Err(ClientError::Closed)
                }
                Err(e) => return Err(e.into()),
            }
            if self.pending.len() > PENDING_MAX {
                let cut = self.pending.len() - PENDING_MAX / 2;
                let cut = (cut..self.pending.len())
                    .find(|&i| self.pending.is_char_boundary(i))
                    .unwrap_or(0);
                self.pending.drain(..cut);
            }
        }
    }

    /// Reads one framed answer (up to its `@end` line).
    fn answer(&mut self) -> Result<Vec<Value>, ClientError> {
        let text = self.read_until(&format!("\n{}\n", frame::END_LINE))?;
        match frame::parse_answer(&text) {
            Some(answer) => Ok(answer?),
            None => Err(ClientError::Answer("@end")),
        }
    }

    /// Drops what came so far and waits for a fresh prompt (a line end first, so a half-typed
    /// line on the box is ended).
    pub fn sync(&mut self) -> Result<(), ClientError> {
        self.link.send("\n")?;
        self.read_until(PROMPT)?;
        // Whatever else is queued (a second prompt) is old.
        let _ = self.link.recv(Duration::from_millis(100)).map(drop);
        self.pending.clear();
        Ok(())
    }

    /// Sends `line` (`login --json`, `login password --json`) and reads its first step: the
    /// step's object, with the box at `prompt`, or the refusal (the box back at its prompt).
    fn login_step(&mut self, line: &str, prompt: &str) -> Result<Value, ClientError> {
        self.pending.clear();
        self.link.send(line)?;
        let first = self.answer()?;
        let step = first
            .into_iter()
            .next()
            .ok_or(ClientError::Answer("login object"))?;
        if step["ok"] != true {
            self.read_until(PROMPT)?;
            return Err(ClientError::Refused(
                step["error"].as_str().unwrap_or("?").to_string(),
            ));
        }
        self.read_until(prompt)?;
        Ok(step)
    }

    /// Reads a login's result (after the signature or password was sent).
    fn login_result(&mut self) -> Result<LoggedIn, ClientError> {
        let done = self.answer()?;
        self.read_until(PROMPT)?;
        let done = done.first().ok_or(ClientError::Answer("login result"))?;
        if done["ok"] != true {
            return Err(ClientError::Refused(
                done["error"].as_str().unwrap_or("?").to_string(),
            ));
        }
        let field = |k: &str| done[k].as_str().unwrap_or_default().to_string();
        Ok(LoggedIn {
            comment: field("comment"),
            fingerprint: field("fingerprint"),
            source: field("source"),
        })
    }

    /// Logs in with `signer`; afterwards the box is at its prompt.
    pub fn login(&mut self, signer: &Signer) -> Result<LoggedIn, ClientError> {
        let challenge = self.login_step("login --json\n", SIGNATURE_PROMPT)?;
        let message = challenge["challenge"]
            .as_str()
            .ok_or(ClientError::Answer("challenge"))?
            .to_string();
        let armored = signer.sign(&message)?;
        self.link.send(&armored)?;
        if !armored.ends_with('\n') {
            self.link.send("\n")?;
        }
        self.login_result()
    }

    /// Logs in with the console password (`login password`; the serial line echoes it, so
    /// this is the fallback, not the way in).
    pub fn login_password(&mut self, password: &str) -> Result<LoggedIn, ClientError> {
        self.login_step("login password --json\n", PASSWORD_PROMPT)?;
        self.link.send(&format!("{password}\n"))?;
        self.login_result()
    }

    /// Runs `command` with `--json` appended; returns its answer objects (the prompt after it
    /// is consumed).
    pub fn run(&mut self, command: &str) -> Result<Vec<Value>, ClientError> {
        self.pending.clear();
        self.link.send(&format!("{} --json\n", command.trim()))?;
        let answer = self.answer()?;
        self.read_until(PROMPT)?;
        Ok(answer)
    }

    /// Sends a line and returns the text up to the next prompt (the human form).
    pub fn run_text(&mut self, line: &str) -> Result<String, ClientError> {
        self.pending.clear();
        self.link.send(&format!("{line}\n"))?;
        let text = self.read_until(PROMPT)?;
        Ok(text[..text.len() - PROMPT.len()].to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::AuthorizedKeys;

    #[test]
    fn a_key_file_signs_what_the_box_verifies() {
        let dir = env!("CARGO_MANIFEST_DIR");
        let key = Path::new(dir).join("../../tests/keys/test_ed25519");
        let signer = Signer::from_key_file(&key).unwrap();
        let message = crate::Challenge::new("h", "b").unwrap().message;
        let armored = signer.sign(&message).unwrap();
        assert!(armored.starts_with("-----BEGIN SSH SIGNATURE-----\n"));
        let public = std::fs::read_to_string(key.with_extension("pub")).unwrap();
        let keys = AuthorizedKeys::from_lines(public.lines()).unwrap();
        keys.verify(&message, &armored).unwrap();
        assert!(keys.verify(&format!("{message}x"), &armored).is_err());
        assert!(Signer::from_key_file(&key.with_extension("pub")).is_err());
    }

    /// A real ssh-agent (OpenSSH's, `openssh-client` in xtask's deps) holding the test key signs
    /// a challenge that verifies; an agent without keys is refused.
    #[test]
    fn ssh_agent_signs_what_the_box_verifies() {
        use std::process::{Command, Stdio};
        let dir = std::env::temp_dir().join(format!("ringstore-agent-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let sock = dir.join("agent.sock");
        let mut agent = Command::new("ssh-agent")
            .arg("-D")
            .arg("-a")
            .arg(&sock)
            .stdout(Stdio::null())
            .spawn()
            .expect("ssh-agent (apt openssh-client)");
        for _ in 0..100 {
            if sock.exists() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let signer = Signer::Agent {
            socket: sock.clone(),
            key: None,
        };
        let empty = signer.sign("m");
        let key = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/keys/test_ed25519");
        // ssh-add refuses a key file others may read; copy it with mode 0600.
        let private = dir.join("key");
        std::fs::copy(&key, &private).unwrap();
        std::fs::set_permissions(
            &private,
            std::os::unix::fs::PermissionsExt::from_mode(0o600),
        )
        .unwrap();
        let added = Command::new("ssh-add")
            .arg(&private)
            .env("SSH_AUTH_SOCK", &sock)
            .stderr(Stdio::null())
            .status()
            .unwrap();
        let message = crate::Challenge::new("h", "b").unwrap().message;
        let armored = signer.sign(&message);
        let _ = agent.kill();
        let _ = agent.wait();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(matches!(empty, Err(ClientError::Agent(_))), "{empty:?}");
        assert!(added.success());
        let public = std::fs::read_to_string(key.with_extension("pub")).unwrap();
        let keys = AuthorizedKeys::from_lines(public.lines()).unwrap();
        keys.verify(&message, &armored.unwrap()).unwrap();
    }

    #[test]
    fn agent_strings_are_bounded() {
        let mut out = Vec::new();
        put_string(&mut out, b"abc").unwrap();
        let mut input = out.as_slice();
        assert_eq!(take_string(&mut input).unwrap(), b"abc");
        assert!(input.is_empty());
        let mut short: &[u8] = &[0, 0, 0, 9, 1];
        assert!(take_string(&mut short).is_err());
    }
}
