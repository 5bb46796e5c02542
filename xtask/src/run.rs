//! `cargo xtask run`: builds the image and boots a QEMU profile with the serial console on
//! this terminal, and prints the one command that logs in from a second terminal.
//!
//! QEMU's serial port is a unix socket that this process relays: to the terminal (raw, ctrl-a
//! x quits, as QEMU's own stdio does) and to one `ringstore console --socket` client at a time
//! on `target/appliance/run/console.sock` (`run/console_slot.rs`). Without `--authorized-keys` the image is built with
//! the test key (TEST KEYS), and a copy of its private half with mode 0600 (ssh-keygen refuses
//! the checkout's 0644) is what the printed command logs in with.

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use ringstore_vm::qemu::{self, Serial};
use ringstore_vm::LOGIN_HINT;

mod console_slot;
use console_slot::ConsoleSlot;

/// Ctrl-a, then `x`: quit QEMU (QEMU's own escape).
const ESCAPE: u8 = 0x01;
/// How long QEMU has to open its serial socket.
const SOCKET_LIMIT: Duration = Duration::from_secs(20);

/// What `cargo xtask run` was asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunOptions {
    pub profile: String,
    pub append: String,
    pub disks: Vec<PathBuf>,
    /// The developer's own authorized_keys; the test key when absent.
    pub authorized_keys: Option<PathBuf>,
}

impl RunOptions {
    pub fn parse(args: &[String]) -> Result<RunOptions> {
        let mut o = RunOptions {
            profile: "numa2".into(),
            append: String::new(),
            disks: Vec::new(),
            authorized_keys: None,
        };
        for (flag, value) in crate::cli::parse("run", args)?.flags {
            let value = value.unwrap_or_default();
            match flag {
                "--profile" => o.profile = value,
                "--append" => o.append = value,
                "--disk" => o.disks.push(value.into()),
                "--authorized-keys" => o.authorized_keys = Some(value.into()),
                other => return Err(crate::cli::unhandled("run", other)),
            }
        }
        Ok(o)
    }
}

/// `target/appliance/run`: the sockets and the key copy of a development boot.
pub fn run_dir() -> PathBuf {
    crate::image::appliance_dir().join("run")
}

/// Copies the test key's private half to `dir` with mode 0600 (what ssh-keygen and the
/// console client accept) and returns the copy.
pub fn prepare_test_key(dir: &Path) -> Result<PathBuf> {
    let copy = dir.join("test_ed25519");
    let _ = std::fs::remove_file(&copy);
    let key = crate::image::read(&crate::image::test_key())?;
    crate::image::write(&copy, key)?;
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("chmod 600 {}", copy.display()))?;
    Ok(copy)
}

/// The command that logs in on `socket` and runs `status`.
pub fn login_command(socket: &Path, key: Option<&Path>) -> String {
    let binary = crate::image::cargo_target_dir()
        .join(crate::image::MUSL_TARGET)
        .join("release/ringstore");
    let key = match key {
        Some(key) => format!(" --key {}", key.display()),
        // Their own key: from the ssh-agent, or `--key` with its private half.
        None => String::new(),
    };
    format!(
        "{} console --socket {}{key} status",
        binary.display(),
        socket.display()
    )
}

/// Data disks: those given, then `target/appliance/disks/PROFILE-K.raw` (kept between runs).
fn data_disks(opts: &RunOptions, profile: &qemu::Profile) -> Result<Vec<PathBuf>> {
    let mut files = opts.disks.clone();
    if files.len() > profile.disks.len() {
        bail!(
            "profile {} has {} data disks; {} --disk files given",
            opts.profile,
            profile.disks.len(),
            files.len()
        );
    }
    for k in files.len()..profile.disks.len() {
        files.push(
            crate::image::appliance_dir()
                .join("disks")
                .join(format!("{}-{k}.raw", opts.profile)),
        );
    }
    for (k, (file, disk)) in files.iter().zip(&profile.disks).enumerate() {
        let created = qemu::ensure_disk(file, disk.size_mib)?;
        let size = std::fs::metadata(file)
            .with_context(|| format!("reading {}", file.display()))?
            .len();
        eprintln!(
            "run: data disk {k} {} ({} MiB{}) is the guest's {}",
            file.display(),
            size >> 20,
            if created { ", new" } else { "" },
            profile.guest_disk_path(k)
        );
    }
    Ok(files)
}

/// `cargo xtask run [--profile NAME] [--append ARGS] [--disk FILE] [--authorized-keys FILE]`.
pub fn run(args: &[String]) -> Result<()> {
    let opts = RunOptions::parse(args)?;
    let profile = qemu::load_profile(&opts.profile)?;
    let disks = data_disks(&opts, &profile)?;
    let image = match &opts.authorized_keys {
        Some(keys) => crate::image::build_image_in(&crate::image::appliance_dir(), Some(keys))?,
        // TEST KEYS: a development boot, logged in with tests/keys/test_ed25519.
        None => crate::image::build_test_image()?,
    };
    let dir = run_dir();
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let key = match &opts.authorized_keys {
        Some(_) => None,
        None => Some(prepare_test_key(&dir)?),
    };
    let accel = qemu::accel(&image.bzimage);
    let forwards = qemu::choose_forwards(&profile)?;
    eprintln!(
        "run: profile {} ({}), accel {accel}, kernel {}",
        opts.profile, profile.description, image.kernel_version
    );
    for f in &forwards {
        eprintln!(
            "run: {} on 127.0.0.1:{} -> guest port {} (NIC {})",
            f.name, f.host_port, f.guest_port, f.nic
        );
    }
    let serial = dir.join("serial.sock");
    let console = dir.join("console.sock");
    eprintln!("{LOGIN_HINT}");
    eprintln!("run:     {}", login_command(&console, key.as_deref()));
    if key.is_none() {
        eprintln!("run: (your key from SSH_AUTH_SOCK, or add --key YOUR-PRIVATE-KEY)");
    }
    eprintln!("run: serial console below; `login` at the ringstore> prompt, ctrl-a x quits QEMU");
    let _ = std::fs::remove_file(&serial);
    let qemu = Command::new("qemu-system-x86_64")
        .args(qemu::machine_args(
            &profile,
            &image,
            &Serial::Socket(serial.clone()),
            &opts.append,
            accel,
            &forwards,
            &disks,
        ))
        .stdin(Stdio::null())
        .spawn()
        .context("starting qemu-system-x86_64 (apt-get install qemu-system-x86)")?;
    relay(qemu, &serial, &console)
}

/// Connects to QEMU's serial socket (bounded), relays it until QEMU exits.
fn relay(qemu: Child, serial: &Path, console: &Path) -> Result<()> {
    let qemu = Arc::new(Mutex::new(qemu));
    let deadline = Instant::now() + SOCKET_LIMIT;
    let guest = loop {
        match UnixStream::connect(serial) {
            Ok(stream) => break stream,
            Err(err) => {
                if lock(&qemu).try_wait()?.is_some() || Instant::now() > deadline {
                    bail!("QEMU serial socket {}: {err}", serial.display());
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    };
    let client = Arc::new(ConsoleSlot::default());
    let _ = std::fs::remove_file(console);
    let listener = UnixListener::bind(console)
        .with_context(|| format!("listening on {}", console.display()))?;
    spawn_guest_reader(guest.try_clone()?, Arc::clone(&client));
    console_slot::spawn_acceptor(listener, guest.try_clone()?, Arc::clone(&client));
    let terminal = Terminal::raw();
    let quit = Arc::new(AtomicBool::new(false));
    spawn_terminal_reader(guest, Arc::clone(&qemu), Arc::clone(&quit));
    let status = loop {
        if let Some(status) = lock(&qemu).try_wait()? {
            break status;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    drop(terminal);
    let _ = std::fs::remove_file(console);
    if quit.load(Ordering::SeqCst) {
        eprintln!("\r\nrun: quit (ctrl-a x)");
        return Ok(());
    }
    if !status.success() {
        bail!("QEMU exited with {status}");
    }
    eprintln!("\r\nrun: QEMU exited");
    Ok(())
}

/// A poisoned lock only means a relay thread panicked; the data (a stream, a child) is whole.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Guest output to the terminal and to the connected console client, if any.
fn spawn_guest_reader(mut guest: UnixStream, client: Arc<ConsoleSlot>) {
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n @ 1..) = guest.read(&mut buf) {
            let mut out = std::io::stdout().lock();
            let _ = out.write_all(&buf[..n]).and_then(|()| out.flush());
            client.write(&buf[..n]);
        }
    });
}

/// Terminal input to the guest; ctrl-a x kills QEMU, ctrl-a ctrl-a sends one ctrl-a.
fn spawn_terminal_reader(mut guest: UnixStream, qemu: Arc<Mutex<Child>>, quit: Arc<AtomicBool>) {
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin().lock();
        let mut buf = [0u8; 1024];
        let mut escaped = false;
        while let Ok(n @ 1..) = stdin.read(&mut buf) {
            let mut out = Vec::with_capacity(n);
            for &b in &buf[..n] {
                match (escaped, b) {
                    (false, ESCAPE) => escaped = true,
                    (true, b'x') => {
                        quit.store(true, Ordering::SeqCst);
                        let _ = lock(&qemu).kill();
                        return;
                    }
                    (true, ESCAPE) => {
                        out.push(ESCAPE);
                        escaped = false;
                    }
                    (true, other) => {
                        out.extend([ESCAPE, other]);
                        escaped = false;
                    }
                    (false, other) => out.push(other),
                }
            }
            if guest.write_all(&out).is_err() {
                return;
            }
        }
    });
}

/// The terminal in raw mode while it lives (when stdin is one), restored when dropped.
struct Terminal {
    saved: Option<String>,
}

impl Terminal {
    fn raw() -> Terminal {
        let saved = Command::new("stty")
            .arg("-g")
            .stdin(Stdio::inherit())
            .stderr(Stdio::null())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
        if saved.is_some() {
            let _ = Command::new("stty")
                .args(["raw", "-echo"])
                .stdin(Stdio::inherit())
                .status();
        }
        Terminal { saved }
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        if let Some(saved) = &self.saved {
            let _ = Command::new("stty")
                .arg(saved)
                .stdin(Stdio::inherit())
                .status();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_options_parse_every_flag() {
        let args = |l: &[&str]| l.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let o = RunOptions::parse(&args(&[
            "--profile",
            "single",
            "--disk",
            "a.raw",
            "--authorized-keys",
            "me.pub",
            "--append",
            "x=1",
        ]))
        .unwrap();
        assert_eq!(
            (o.profile.as_str(), o.disks.len(), o.append.as_str()),
            ("single", 1, "x=1")
        );
        assert_eq!(o.authorized_keys, Some(PathBuf::from("me.pub")));
        assert!(RunOptions::parse(&args(&["--profile"])).is_err());
    }

    #[test]
    fn the_key_copy_has_mode_0600_and_the_command_names_it() {
        let dir = std::env::temp_dir().join(format!("xtask-run-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let key = prepare_test_key(&dir).unwrap();
        let mode = std::fs::metadata(&key).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(
            std::fs::read(&key).unwrap(),
            std::fs::read(crate::image::test_key()).unwrap()
        );
        let line = login_command(Path::new("/s/console.sock"), Some(&key));
        assert!(line.ends_with(&format!(
            "release/ringstore console --socket /s/console.sock --key {} status",
            key.display()
        )));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
