//! The harness around one booted appliance: QEMU started on a profile, its serial console read
//! into bounded buffers (as it came, and split into PID 1's output and the kernel's records:
//! `serial.rs`), commands typed and answered up to the prompt, poweroff and power cut.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use ringstore_console::client::{Client, Link, LoggedIn, Signer};

use super::serial::{Splitter, Utf8Pieces};
use super::{netns, COMMAND_LIMIT, PROMPT};
use crate::image::{appliance_dir, Image};
use crate::qemu::{self, Forward, Serial};

/// Serial output kept per VM and view; older bytes are dropped past this.
const SERIAL_MAX: usize = 4 << 20;
/// How long QEMU may take to end after `poweroff`.
const POWEROFF_LIMIT: Duration = Duration::from_secs(30);

/// What the serial console printed, three ways.
#[derive(Default)]
struct Console {
    /// Everything, as it came (`\r` dropped): for error messages.
    raw: String,
    /// PID 1's output with the kernel's records cut out, and those records.
    split: Splitter,
}

/// Drops the older half of `text` once it passes [`SERIAL_MAX`].
fn bound(text: &mut String) {
    if text.len() > SERIAL_MAX {
        let cut = text.len() - SERIAL_MAX / 2;
        let cut = (cut..text.len())
            .find(|i| text.is_char_boundary(*i))
            .unwrap_or(text.len());
        text.replace_range(..cut, "");
    }
}

/// A QEMU process and its scratch directory: dropping it kills QEMU, waits for it and removes
/// the directory, on every path out of a test (errors and panics included).
struct Qemu {
    child: Child,
    dir: PathBuf,
    /// QEMU's stderr (target/appliance/vm/NAME.qemu.stderr).
    stderr: PathBuf,
}

impl Drop for Qemu {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A booted appliance.
pub struct Vm {
    pub(super) name: String,
    qemu: Qemu,
    serial: UnixStream,
    console: Arc<Mutex<Console>>,
    pub forwards: Vec<Forward>,
    /// When QEMU was started.
    pub(super) started: Instant,
    /// Logged in on the console (with the test key) by this harness.
    logged_in: bool,
}

/// The console as a [`Link`] for the host client: PID 1's view of the output from where the
/// link was made (kernel records already cut out by the reader thread).
pub struct VmLink<'a> {
    vm: &'a mut Vm,
    from: usize,
}

impl Link for VmLink<'_> {
    fn send(&mut self, text: &str) -> std::io::Result<()> {
        self.vm.serial.write_all(text.as_bytes())
    }

    fn recv(&mut self, wait: Duration) -> std::io::Result<String> {
        let deadline = Instant::now() + wait;
        loop {
            let out = self.vm.output();
            // The bounded buffer may have dropped its older half: start over at its end.
            let from = if self.from > out.len() {
                out.len()
            } else {
                self.from
            };
            if out.len() > from {
                self.from = out.len();
                return Ok(out.get(from..).unwrap_or_default().to_string());
            }
            if let Ok(Some(_)) = self.vm.qemu.child.try_wait() {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            if Instant::now() >= deadline {
                return Ok(String::new());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Vm {
    /// Boots `profile` with `append` added to the kernel command line; `name` names the log.
    pub fn boot(image: &Image, name: &str, profile: &str, append: &str) -> Result<Vm> {
        Vm::boot_in(image, name, profile, append, None, &[])
    }

    /// [`Vm::boot`] with `disks` as the files of the profile's data disks (one each; the caller
    /// creates them and keeps them across boots).
    pub(super) fn boot_with_disks(
        image: &Image,
        name: &str,
        profile: &str,
        append: &str,
        disks: &[PathBuf],
    ) -> Result<Vm> {
        Vm::boot_in(image, name, profile, append, None, disks)
    }

    /// [`Vm::boot`] with QEMU running inside `netns` (its taps live there).
    pub(super) fn boot_in(
        image: &Image,
        name: &str,
        profile: &str,
        append: &str,
        netns: Option<&netns::Netns>,
        disks: &[PathBuf],
    ) -> Result<Vm> {
        let profile_name = profile;
        let profile = qemu::load_profile(profile)?;
        anyhow::ensure!(
            disks.len() == profile.disks.len(),
            "profile {profile_name} has {} data disks, {} files given",
            profile.disks.len(),
            disks.len()
        );
        let forwards = qemu::choose_forwards(&profile)?;
        let dir = scratch_dir(name)?;
        let socket = dir.join("serial.sock");
        let accel = qemu::accel(&image.bzimage);
        let args = qemu::machine_args(
            &profile,
            image,
            &Serial::Socket(socket.clone()),
            append,
            accel,
            &forwards,
            disks,
        );
        Vm::start(name, dir, &socket, &args, forwards, netns)
    }

    /// Starts QEMU with `args` (whose serial console is the unix socket `socket` inside `dir`,
    /// the scratch directory removed with the VM) and attaches to its console.
    pub(super) fn start(
        name: &str,
        dir: PathBuf,
        socket: &std::path::Path,
        args: &[String],
        forwards: Vec<Forward>,
        netns: Option<&netns::Netns>,
    ) -> Result<Vm> {
        // Next to the console log, kept after the test: QEMU's own reason when it ends early.
        let stderr_path = appliance_dir()
            .join("vm")
            .join(format!("{name}.qemu.stderr"));
        let stderr = std::fs::File::create(&stderr_path)?;
        let mut command = match netns {
            Some(ns) => ns.command("qemu-system-x86_64"),
            None => Command::new("qemu-system-x86_64"),
        };
        let mut log =
            std::fs::File::create(appliance_dir().join("vm").join(format!("{name}.log")))?;
        let started = Instant::now();
        let child = command
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .context("starting qemu-system-x86_64")?;
        let mut qemu = Qemu {
            child,
            dir,
            stderr: stderr_path,
        };
        let deadline = Instant::now() + Duration::from_secs(15);
        let serial = loop {
            match UnixStream::connect(socket) {
                Ok(stream) => break stream,
                Err(_) if Instant::now() < deadline && qemu.child.try_wait()?.is_none() => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                Err(err) => {
                    let why = std::fs::read_to_string(&qemu.stderr).unwrap_or_default();
                    bail!(
                        "QEMU serial socket {}: {err}; QEMU said: {why}",
                        socket.display()
                    );
                }
            }
        };
        let console = Arc::new(Mutex::new(Console::default()));
        let mut reader = serial.try_clone()?;
        let sink = Arc::clone(&console);
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            let mut utf8 = Utf8Pieces::default();
            while let Ok(n) = reader.read(&mut buf) {
                if n == 0 {
                    break;
                }
                let _ = log.write_all(&buf[..n]);
                let text = utf8.decode(&buf[..n]);
                let mut console = sink.lock().unwrap_or_else(|p| p.into_inner());
                console.raw.push_str(&text.replace('\r', ""));
                console.split.feed(&text);
                bound(&mut console.raw);
                bound(&mut console.split.pid1);
                bound(&mut console.split.kernel);
            }
        });
        Ok(Vm {
            name: name.to_string(),
            qemu,
            serial,
            console,
            forwards,
            started,
            logged_in: false,
        })
    }

    /// The host-side console client (`ringstore console`'s) on this VM's serial console.
    pub fn client(&mut self) -> Client<VmLink<'_>> {
        let from = self.output().len();
        let mut client = Client::new(VmLink { vm: self, from });
        client.limit = COMMAND_LIMIT;
        client
    }

    /// Logs in with the test key through the client (once; later calls do nothing).
    pub fn login(&mut self) -> Result<LoggedIn> {
        let signer = Signer::from_key_file(&crate::image::test_key())?;
        let name = self.name.clone();
        let who = self
            .client()
            .login(&signer)
            .with_context(|| format!("{name}: console login with the test key"))?;
        self.logged_in = true;
        Ok(who)
    }

    /// Runs `command --json` through the client (logged in first); its answer objects.
    pub fn json(&mut self, command: &str) -> Result<Vec<serde_json::Value>> {
        self.ensure_login()?;
        let name = self.name.clone();
        self.client()
            .run(command)
            .with_context(|| format!("{name}: `{command} --json`"))
    }

    fn ensure_login(&mut self) -> Result<()> {
        if !self.logged_in {
            self.login()?;
        }
        Ok(())
    }

    fn console(&self) -> std::sync::MutexGuard<'_, Console> {
        self.console.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What PID 1 printed so far (its lines, the prompt, command output, the server's lines),
    /// with the kernel's log records cut out wherever they landed. Waits and commands read this.
    pub fn output(&self) -> String {
        self.console().split.pid1.clone()
    }

    /// The kernel's log records so far, one whole line each.
    pub fn kernel_log(&self) -> String {
        self.console().split.kernel.clone()
    }

    /// The last lines of the console as it came, kernel lines included.
    pub(super) fn tail(&self) -> String {
        let out = self.console().raw.clone();
        let lines: Vec<&str> = out.lines().collect();
        lines[lines.len().saturating_sub(25)..].join("\n")
    }

    /// Waits until `needle` appears after byte `from` of the output; returns where it ends.
    pub fn wait_for(&mut self, needle: &str, from: usize, limit: Duration) -> Result<usize> {
        let deadline = Instant::now() + limit;
        // When the kernel's log last grew: a kernel silent for long before /init has stalled.
        let mut grew = (0, Instant::now());
        loop {
            let out = self.output();
            if let Some(at) = out.get(from.min(out.len())..).and_then(|s| s.find(needle)) {
                return Ok(from + at + needle.len());
            }
            let kernel = self.kernel_log();
            if kernel.len() != grew.0 {
                grew = (kernel.len(), Instant::now());
            }
            if let Some(stall) = guest_stalled_before_init(&kernel)
                .or_else(|| silent_before_init(&kernel, grew.1.elapsed()))
            {
                bail!(
                    "{}: {STALL_BEFORE_INIT} ({}) while waiting for {needle:?}; last lines:\n{}",
                    self.name,
                    stall.trim(),
                    self.tail()
                );
            }
            if let Some(status) = self.qemu.child.try_wait()? {
                let stderr = std::fs::read_to_string(&self.qemu.stderr).unwrap_or_default();
                if emulator_failed_before_init(status.success(), &self.kernel_log()) {
                    bail!("{}: {EMULATOR_FAILED_BEFORE_INIT}: QEMU exited ({status}) {:.1} s after it started, while waiting for {needle:?}; QEMU said: {}; last lines:\n{}", self.name, self.started.elapsed().as_secs_f64(), stderr.trim(), self.tail());
                }
                bail!("{}: QEMU exited ({status}) {:.1} s after it started, before {needle:?} appeared; QEMU said: {}; last lines:\n{}", self.name, self.started.elapsed().as_secs_f64(), stderr.trim(), self.tail());
            }
            if Instant::now() > deadline {
                bail!(
                    "{}: {needle:?} did not appear within {} s; last lines:\n{}",
                    self.name,
                    limit.as_secs(),
                    self.tail()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Sends a console command (logged in first) and returns its output (up to the next prompt).
    pub fn command(&mut self, command: &str) -> Result<String> {
        self.ensure_login()?;
        let start = self.output().len();
        self.serial.write_all(format!("{command}\n").as_bytes())?;
        let end = self.wait_for(PROMPT, start + command.len(), COMMAND_LIMIT)?;
        let out = self.output();
        Ok(out.get(start..end - PROMPT.len()).unwrap_or("").to_string())
    }

    /// Types `command` (logged in first) without waiting for a prompt: a command that reboots
    /// (`reboot`, `update`), whose next output is the firmware's; the next command logs in again.
    pub fn command_no_wait(&mut self, command: &str) -> Result<()> {
        self.ensure_login()?;
        self.serial.write_all(format!("{command}\n").as_bytes())?;
        self.logged_in = false;
        Ok(())
    }

    /// The host port forwarded to `name` on NIC `nic`.
    pub fn port(&self, name: &str, nic: usize) -> Result<u16> {
        self.forwards
            .iter()
            .find(|f| f.name == name && f.nic == nic)
            .map(|f| f.host_port)
            .with_context(|| format!("no forward {name} on NIC {nic}"))
    }

    /// Types `poweroff` and waits for QEMU to end.
    pub fn poweroff(&mut self) -> Result<Duration> {
        self.ensure_login()?;
        let started = Instant::now();
        self.serial.write_all(b"poweroff\n")?;
        while started.elapsed() < POWEROFF_LIMIT {
            if let Some(status) = self.qemu.child.try_wait()? {
                if !status.success() {
                    bail!("{}: QEMU ended with {status} after poweroff", self.name);
                }
                return Ok(started.elapsed());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        bail!(
            "{}: QEMU still running {} s after poweroff; last lines:\n{}",
            self.name,
            POWEROFF_LIMIT.as_secs(),
            self.tail()
        )
    }

    /// Pulls the plug: SIGKILL to QEMU, as a power cut is to the guest (whatever the guest had
    /// not yet written to its virtual disk is gone: its page cache, queued requests). Returns
    /// once QEMU is gone.
    pub fn power_cut(mut self) -> Result<()> {
        self.qemu.child.kill().context("killing QEMU")?;
        self.qemu
            .child
            .wait()
            .context("waiting for the killed QEMU")?;
        Ok(())
    }

    /// Kernel timestamp (seconds) of the first kernel log record containing `needle`.
    pub fn kernel_time_of(&self, needle: &str) -> Option<f64> {
        self.kernel_log()
            .lines()
            .find(|l| l.contains(needle))
            .and_then(|l| {
                let inner = l.trim_start().strip_prefix('[')?.split(']').next()?;
                inner.trim().parse().ok()
            })
    }
}

/// A fresh, empty target/appliance/vm/NAME-PID for one test's files.
pub(super) fn scratch_dir(name: &str) -> Result<PathBuf> {
    let dir = appliance_dir()
        .join("vm")
        .join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// What a wait reports when the emulated machine stalled before our code ran.
pub const STALL_BEFORE_INIT: &str = "the guest kernel stalled before /init ran";
/// What a wait reports when QEMU itself failed before our code ran.
pub const EMULATOR_FAILED_BEFORE_INIT: &str = "QEMU failed before /init ran";

/// QEMU ended with a failure (a signal, a non-zero status) before the guest kernel ran /init:
/// seen under TCG on the shared box as a SIGSEGV of qemu-system-x86_64 3 s after its start
/// (a NULL dereference, in the host's dmesg), and once as exit status 1 with nothing on its
/// stderr, both with no guest output. Nothing of ringstore has run, so the test is worth one
/// more boot. A kernel panic ends QEMU with status 0 (`-no-reboot`) and is not this.
pub fn emulator_failed_before_init(exited_ok: bool, kernel_log: &str) -> bool {
    !exited_ok && !kernel_log.contains("Run /init as init process")
}

/// A stall report of the guest kernel (RCU "detected stalls", or its timer never firing)
/// printed before `Run /init`: seen under TCG right after the disks were probed, on an idle
/// host. Nothing of ringstore has run yet, so the test is worth one more boot.
pub fn guest_stalled_before_init(console: &str) -> Option<&str> {
    if console.contains("Run /init as init process") {
        return None;
    }
    console.lines().find(|l| {
        l.contains("rcu: INFO: rcu_sched detected stalls")
            || l.contains("timer wakeup didn't happen")
    })
}

/// How long a guest kernel that has started printing may go silent before /init: it prints
/// every few hundred ms while it boots, and reaches /init in seconds even under TCG.
const SILENT_BEFORE_INIT: Duration = Duration::from_secs(60);

/// A kernel that printed its first lines and then nothing for [`SILENT_BEFORE_INIT`] before
/// `Run /init`: seen under TCG (QEMU 10.0, the third boot of a test) as a kernel that stopped
/// after "Demotion targets for Node 0" with no stall report. Nothing of ringstore has run.
pub fn silent_before_init(kernel_log: &str, silent: Duration) -> Option<&'static str> {
    (!kernel_log.is_empty()
        && silent >= SILENT_BEFORE_INIT
        && !kernel_log.contains("Run /init as init process"))
    .then_some("no kernel output for 60 s")
}

#[cfg(test)]
mod stall_tests {
    use super::*;

    #[test]
    fn a_silent_kernel_counts_only_before_init_and_after_its_first_line() {
        let early = "[ 3.1] Demotion targets for Node 0: null\n";
        assert!(silent_before_init(early, SILENT_BEFORE_INIT).is_some());
        assert!(silent_before_init(early, Duration::from_secs(59)).is_none());
        let later = "[ 2.3] Run /init as init process\n";
        assert!(silent_before_init(later, SILENT_BEFORE_INIT).is_none());
        // The firmware's time before the kernel prints is not the kernel's silence.
        assert!(silent_before_init("", SILENT_BEFORE_INIT).is_none());
    }

    #[test]
    fn a_stall_counts_only_before_init() {
        let stalled = "[ 1.5] virtio_blk virtio1: [vda]\n[ 22.0] rcu: INFO: rcu_sched detected stalls on CPUs/tasks:\n";
        assert!(guest_stalled_before_init(stalled).is_some());
        let later = "[ 2.3] Run /init as init process\n[ 22.0] rcu: INFO: rcu_sched detected stalls on CPUs/tasks:\n";
        assert!(guest_stalled_before_init(later).is_none());
        assert!(guest_stalled_before_init("[ 1.0] booting\n").is_none());
    }

    #[test]
    fn an_emulator_failure_counts_only_before_init() {
        assert!(emulator_failed_before_init(false, ""));
        assert!(emulator_failed_before_init(
            false,
            "[    0.000000] Linux version 6.12\n"
        ));
        // After /init ran, QEMU failing may be ours.
        assert!(!emulator_failed_before_init(
            false,
            "[    2.300000] Run /init as init process\n"
        ));
        // A clean exit (poweroff, a kernel panic under -no-reboot) is never the emulator's.
        assert!(!emulator_failed_before_init(true, ""));
    }
}
