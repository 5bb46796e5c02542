//! PID 1's log: every line goes to /dev/kmsg with its level (the kernel echoes it on the
//! serial console with a timestamp) and into a bounded ring buffer for the console's `log`.
//! Before /dev/kmsg exists, lines are written straight to the console.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::sync::Mutex;

/// Lines kept for the console's `log` command.
pub const RING_LINES: usize = 256;
/// Longest logged line; longer ones are cut (kmsg itself refuses records over ~1 KiB).
pub const MAX_LINE: usize = 480;

/// Syslog levels as /dev/kmsg takes them (`<N>` prefix).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Error = 3,
    Warn = 4,
    Info = 6,
}

impl Level {
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

struct Sinks {
    kmsg: Option<File>,
    ring: Ring,
}

static SINKS: Mutex<Sinks> = Mutex::new(Sinks {
    kmsg: None,
    ring: Ring {
        lines: VecDeque::new(),
    },
});
/// Serialises whole lines on the console between threads (log echo, command output, prompt).
static CONSOLE: Mutex<()> = Mutex::new(());

/// Opens /dev/kmsg once devtmpfs is mounted; until then lines go to the console directly.
pub fn attach_kmsg() {
    if let Ok(file) = OpenOptions::new().write(true).open("/dev/kmsg") {
        lock_sinks().kmsg = Some(file);
    }
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

/// Logs one line at `level`.
pub fn log(level: Level, text: &str) {
    let line = clean_line(text, MAX_LINE);
    let mut sinks = lock_sinks();
    let uptime = crate::sysinfo::uptime_secs();
    sinks
        .ring
        .push(format!("[{uptime:9.3}] {}: {line}", level.name()));
    let written = match sinks.kmsg.as_mut() {
        Some(kmsg) => kmsg
            .write_all(format!("<{}>ringstore: {line}\n", level as u8).as_bytes())
            .is_ok(),
        None => false,
    };
    drop(sinks);
    if !written {
        console_line(&format!("ringstore: {line}"));
    }
}

/// Writes one line to the console (fd 1), whole.
pub fn console_line(line: &str) {
    console_write(&format!("{line}\n"));
}

/// Writes text to the console (fd 1) without interleaving with other console writers.
pub fn console_write(text: &str) {
    let _guard = CONSOLE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let mut out = std::io::stdout().lock();
    // A console write error has nowhere to be reported; the line is still in the ring.
    let _ = out.write_all(text.as_bytes());
    let _ = out.flush();
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
    fn lines_are_cut_and_cleaned() {
        assert_eq!(clean_line("a\nb\x1bc", 100), "a b c");
        assert_eq!(clean_line("ééé", 5), "éé");
        assert_eq!(clean_line(&"x".repeat(1000), MAX_LINE).len(), MAX_LINE);
    }
}
