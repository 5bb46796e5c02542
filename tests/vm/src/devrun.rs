//! The `cargo xtask run` QEMU test: runs the command as a developer does, takes the login
//! command it prints, and with it runs `status` and then `poweroff` from "a second terminal";
//! `cargo xtask run` must then end by itself, successfully.

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::BOOT_LIMIT;
use crate::image::Image;

/// Building the image again (cached) before the boot.
const BUILD_LIMIT: Duration = Duration::from_secs(300);
const POWEROFF_LIMIT: Duration = Duration::from_secs(60);

/// The line before the login command in what `cargo xtask run` prints (xtask's run.rs prints
/// it; this test finds the command after it).
pub const LOGIN_HINT: &str =
    "run: log in from a second terminal (any console command in place of status: stats, tuning, poweroff):";

/// Kills `cargo xtask run` (and so its QEMU, whose serial socket then closes) if the test
/// ends early.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn collect(mut from: impl Read + Send + 'static, into: Arc<Mutex<String>>) {
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n @ 1..) = from.read(&mut buf) {
            if let Ok(mut text) = into.lock() {
                text.push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        }
    });
}

fn wait_for(text: &Arc<Mutex<String>>, what: &str, limit: Duration) -> Result<String> {
    let deadline = Instant::now() + limit;
    loop {
        let now = text.lock().map(|t| t.clone()).unwrap_or_default();
        if now.contains(what) {
            return Ok(now);
        }
        if Instant::now() > deadline {
            let tail: String = now
                .chars()
                .rev()
                .take(3000)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            bail!(
                "no {what:?} within {} s; last output:\n{tail}",
                limit.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The command printed on the line after [`LOGIN_HINT`], as words.
pub fn printed_login(stderr: &str) -> Option<Vec<String>> {
    let mut lines = stderr.lines();
    lines.find(|l| l.trim() == LOGIN_HINT)?;
    let command = lines.next()?.trim().strip_prefix("run:")?.trim();
    Some(command.split_whitespace().map(str::to_string).collect())
}

/// Runs the printed command with its last word (the console command) replaced.
fn console(login: &[String], command: &str) -> Result<(bool, String)> {
    let (program, args) = login.split_first().context("empty login command")?;
    let args = &args[..args.len().saturating_sub(1)];
    let out = Command::new(program)
        .args(args)
        .arg(command)
        .output()
        .with_context(|| format!("running {program}"))?;
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    Ok((out.status.success(), text))
}

/// `cargo xtask run`, logged in on with what it prints, powered off with it.
pub fn xtask_run_prints_a_working_login(_image: &Image) -> Result<String> {
    let started = Instant::now();
    let mut child = Command::new(std::env::current_exe()?)
        .arg("run")
        .current_dir(crate::util::root())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting cargo xtask run")?;
    let (guest, host) = (
        Arc::new(Mutex::new(String::new())),
        Arc::new(Mutex::new(String::new())),
    );
    collect(child.stdout.take().context("stdout")?, Arc::clone(&guest));
    collect(child.stderr.take().context("stderr")?, Arc::clone(&host));
    let mut running = Running(child);
    let stderr = wait_for(&host, "run: serial console below", BUILD_LIMIT)?;
    let login = printed_login(&stderr)
        .with_context(|| format!("no login command after {:?}:\n{stderr}", LOGIN_HINT))?;
    wait_for(&guest, "ringstore: ready memcache=", BOOT_LIMIT)?;
    let ready = started.elapsed();
    let (ok, status) = console(&login, "status")?;
    anyhow::ensure!(
        ok && status.contains("\"ok\":true") && status.contains("\"cmd\":\"status\""),
        "the printed login {login:?} did not run status:\n{status}"
    );
    let asked = Instant::now();
    let (_, poweroff) = console(&login, "poweroff")?;
    while asked.elapsed() < POWEROFF_LIMIT {
        if let Some(status) = running.0.try_wait()? {
            anyhow::ensure!(
                status.success(),
                "cargo xtask run ended with {status} after poweroff"
            );
            let log = crate::image::appliance_dir().join("vm/xtask_run.log");
            let _ = std::fs::write(&log, guest.lock().map(|g| g.clone()).unwrap_or_default());
            return Ok(format!(
                "ready {:.1} s after start (build included), status ok, poweroff ended it in {:.1} s",
                ready.as_secs_f64(),
                asked.elapsed().as_secs_f64()
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!(
        "cargo xtask run still running {} s after poweroff ({poweroff})",
        POWEROFF_LIMIT.as_secs()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_login_command_is_the_line_after_the_hint() {
        let stderr = format!(
            "run: profile numa2\n{}\nrun:     /t/ringstore console --socket /r/console.sock --key /r/test_ed25519 status\nrun: serial console below\n",
            LOGIN_HINT
        );
        assert_eq!(
            printed_login(&stderr).unwrap(),
            [
                "/t/ringstore",
                "console",
                "--socket",
                "/r/console.sock",
                "--key",
                "/r/test_ed25519",
                "status"
            ]
        );
        assert!(printed_login("run: nothing\n").is_none());
    }
}
