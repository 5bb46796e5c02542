//! PID 1's log. PID 1 owns the console: each line is written there by PID 1 itself, once, whole,
//! in one write(2) (`ringstore: TEXT`), and kept in a bounded ring buffer for the console's `log`.
//! A copy goes to /dev/kmsg at debug level, which the console does not print at the default
//! console log level, so the kernel's ring has PID 1's events without the console showing them
//! twice; when the console would print debug records (`loglevel=8`, `ignore_loglevel`) the kmsg
//! copy is left out instead (ADR-0015).
//!
//! Every console writer serialises on the process's stderr lock, which `eprintln!` in the server's
//! threads takes too, so PID 1's lines, the prompt, command output and the server's lines never
//! interleave with each other. Kernel log records can still land in the middle of any of them
//! (the kernel writes them to the UART directly); readers strip them by their timestamp.
//!
//! With `log_sink` (ADR 0045) every line is queued for the receiver too, and fd 2 becomes the
//! log sink's tee: PID 1 then writes the console directly, under [`CONSOLE`], which the tee
//! holds for each server line it passes on, so lines still never interleave.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::sync::Mutex;

use ringstore_logsink::{Facility, Severity};

/// Lines kept for the console's `log` command.
pub const RING_LINES: usize = 256;
/// Longest logged line; longer ones are cut (kmsg itself refuses records over ~1 KiB).
pub const LINE_MAX: usize = 480;

/// Syslog levels (`<N>`); the kmsg copy is sent at [`KMSG_LEVEL`] whatever the level, and the
/// level's name is in its text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Error = 3,
    Warn = 4,
    Info = 6,
}

impl Level {
    fn severity(self) -> Severity {
        match self {
            Level::Error => Severity::Error,
            Level::Warn => Severity::Warning,
            Level::Info => Severity::Info,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Level::Error => "error",
            Level::Warn => "warn",
            Level::Info => "info",
        }
    }
}

/// A bounded list of the most recent lines.
#[derive(Debug, Default)]
pub struct Ring {
    lines: VecDeque<String>,
}

impl Ring {
    pub fn push(&mut self, line: String) {
        if self.lines.len() == RING_LINES {
            self.lines.pop_front();
        }
        self.lines.push_back(line);
    }

    pub fn lines(&self) -> impl Iterator<Item = &String> {
        self.lines.iter()
    }
}

/// KERN_DEBUG: the console prints a record only when its level is below the console log level
/// (7 by default), so debug records stay off the console.
pub const KMSG_LEVEL: u8 = 7;

struct Sinks {
    kmsg: Option<File>,
    ring: Ring,
    /// `log_sink` (ADR 0045): every line is queued there too, never waited on.
    ship: Option<ringstore_logsink::Shipper>,
}

static SINKS: Mutex<Sinks> = Mutex::new(Sinks {
    kmsg: None,
    ring: Ring {
        lines: VecDeque::new(),
    },
    ship: None,
});

/// With the log sink's stderr tee in place: the console itself, written under [`CONSOLE`].
static DIRECT_CONSOLE: std::sync::OnceLock<File> = std::sync::OnceLock::new();

/// Held for each console write once fd 2 is the log sink's tee (whose thread holds it for each
/// server line it passes on), so lines stay whole. Never held while waiting on anything else.
pub static CONSOLE: Mutex<()> = Mutex::new(());
/// Opens /dev/kmsg once devtmpfs and /proc are mounted, unless the console would print PID 1's
/// debug-level copies (then the kernel's ring goes without them). Returns why it did not attach.
pub fn attach_kmsg() -> Option<String> {
    let printk = std::fs::read_to_string("/proc/sys/kernel/printk").unwrap_or_default();
    let ignore = std::fs::read_to_string("/sys/module/printk/parameters/ignore_loglevel").ok();
    if let Err(why) = kmsg_copy_stays_off_console(&printk, ignore.as_deref()) {
        return Some(format!("no /dev/kmsg copy of this log: {why}"));
    }
    match OpenOptions::new().write(true).open("/dev/kmsg") {
        Ok(file) => {
            lock_sinks().kmsg = Some(file);
            None
        }
        Err(err) => Some(format!("/dev/kmsg: {err}")),
    }
}

/// Whether the console leaves out records of [`KMSG_LEVEL`], from /proc/sys/kernel/printk (its
/// first field is the console log level) and the printk `ignore_loglevel` parameter (`Y`/`N`).
pub fn kmsg_copy_stays_off_console(
    printk: &str,
    ignore_loglevel: Option<&str>,
) -> Result<(), String> {
    if ignore_loglevel.map(str::trim) == Some("Y") {
        return Err("the console prints every level (ignore_loglevel)".into());
    }
    let console_level: u8 = printk
        .split_whitespace()
        .next()
        .and_then(|f| f.parse().ok())
        .ok_or_else(|| format!("unreadable console log level {printk:?}"))?;
    if console_level > KMSG_LEVEL {
        return Err(format!(
            "the console prints debug records (console log level {console_level})"
        ));
    }
    Ok(())
}

fn lock_sinks() -> std::sync::MutexGuard<'static, Sinks> {
    SINKS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Cuts `text` to at most `max` bytes on a character boundary and removes control characters.
pub fn clean_line(text: &str, max: usize) -> String {
    let mut out = String::with_capacity(text.len().min(max));
    for ch in text.chars() {
        let ch = if ch.is_control() { ' ' } else { ch };
        if out.len() + ch.len_utf8() > max {
            break;
        }
        out.push(ch);
    }
    out
}

/// The kmsg record of one logged line: debug level, the level's name in the text.
pub fn kmsg_record(level: Level, line: &str) -> String {
    format!("<{KMSG_LEVEL}>ringstore: {}: {line}\n", level.name())
}

/// Logs one line at `level`: the console (`ringstore: TEXT`), the ring and the kmsg copy.
pub fn log(level: Level, text: &str) {
    let line = clean_line(text, LINE_MAX);
    {
        let mut sinks = lock_sinks();
        let uptime = crate::sysinfo::uptime_secs();
        sinks
            .ring
            .push(format!("[{uptime:9.3}] {}: {line}", level.name()));
        if let Some(kmsg) = sinks.kmsg.as_mut() {
            // One write(2) is one record; a refused record is still on the console and in the ring.
            let _ = kmsg.write(kmsg_record(level, &line).as_bytes());
        }
        if let Some(ship) = &sinks.ship {
            ship.log(Facility::Daemon, level.severity(), "init", &line);
        }
    }
    console_line(&format!("ringstore: {line}"));
}

/// Writes one line to the console, whole.
pub fn console_line(line: &str) {
    console_write(&format!("{line}\n"));
}

/// Writes text to the console in one write(2) (more only if the kernel takes part of it), holding
/// the stderr lock that every other console writer of the process holds too.
pub fn console_write(text: &str) {
    // fds 1 and 2 of PID 1 are both /dev/console; the unbuffered stderr handle passes the whole
    // text to one write(2).
    if let Some(mut console) = DIRECT_CONSOLE.get() {
        // fd 2 is the log sink's tee: write the console itself, as the tee does.
        let _held = CONSOLE.lock().unwrap_or_else(|p| p.into_inner());
        let _ = console.write_all(text.as_bytes());
        return;
    }
    let mut out = std::io::stderr().lock();
    // A console write error has nowhere to be reported; the line is still in the ring.
    let _ = out.write_all(text.as_bytes());
}

/// Ships every line from now on, after the ones the ring kept from the boot so far (the
/// backlog of the lines written before the network was up, at most [`RING_LINES`]).
pub fn attach_shipper(ship: ringstore_logsink::Shipper) {
    let mut sinks = lock_sinks();
    for line in sinks.ring.lines() {
        ship.log(Facility::Daemon, Severity::Info, "init", line);
    }
    sinks.ship = Some(ship);
}

/// The log sink, once attached (its counters for `stats`).
pub fn shipper() -> Option<ringstore_logsink::Shipper> {
    lock_sinks().ship.clone()
}

/// Writes the console through `console` from now on (fd 2 has become the log sink's tee).
pub fn write_console_directly(console: File) {
    let _ = DIRECT_CONSOLE.set(console);
}

/// The ring buffer's lines, oldest first.
pub fn recent() -> Vec<String> {
    lock_sinks().ring.lines().cloned().collect()
}

#[macro_export]
macro_rules! info { ($($arg:tt)*) => { $crate::log::log($crate::log::Level::Info, &format!($($arg)*)) } }
#[macro_export]
macro_rules! warn { ($($arg:tt)*) => { $crate::log::log($crate::log::Level::Warn, &format!($($arg)*)) } }
#[macro_export]
macro_rules! error { ($($arg:tt)*) => { $crate::log::log($crate::log::Level::Error, &format!($($arg)*)) } }

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_is_bounded_and_keeps_the_newest() {
        let mut ring = Ring::default();
        for i in 0..RING_LINES + 10 {
            ring.push(i.to_string());
        }
        let lines: Vec<_> = ring.lines().cloned().collect();
        assert_eq!(lines.len(), RING_LINES);
        assert_eq!(lines[0], "10");
        assert_eq!(lines.last().unwrap(), &(RING_LINES + 9).to_string());
    }

    #[test]
    fn the_kmsg_copy_stays_off_the_console() {
        // Default console log level 7: records of level 7 are not printed.
        assert_eq!(
            kmsg_copy_stays_off_console("7\t4\t1\t7\n", Some("N\n")),
            Ok(())
        );
        assert_eq!(kmsg_copy_stays_off_console("4 4 1 7", None), Ok(()));
        // `loglevel=8` or `debug`... and `ignore_loglevel` would echo it: no copy then.
        assert!(kmsg_copy_stays_off_console("8\t4\t1\t7\n", Some("N"))
            .unwrap_err()
            .contains("level 8"));
        assert!(kmsg_copy_stays_off_console("7 4 1 7", Some("Y\n")).is_err());
        assert!(kmsg_copy_stays_off_console("", None).is_err());
        assert_eq!(
            kmsg_record(Level::Warn, "x y"),
            "<7>ringstore: warn: x y\n",
            "debug level whatever the line's level"
        );
        assert_eq!(KMSG_LEVEL, 7);
    }

    #[test]
    fn lines_are_cut_and_cleaned() {
        assert_eq!(clean_line("a\nb\x1bc", 100), "a b c");
        assert_eq!(clean_line("ééé", 5), "éé");
        assert_eq!(clean_line(&"x".repeat(1000), LINE_MAX).len(), LINE_MAX);
    }
}
