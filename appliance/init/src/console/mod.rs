//! The serial console: prompt `ringstore> `, one bounded line per command, login first
//! (`session.rs`), every command from one table (`table.rs`), each answering text or `--json`
//! (`output.rs`). ADR-0023, docs/CONSOLE.md.

mod auth;
mod certs;
mod commands;
mod ctx;
mod hotkeys;
mod output;
pub mod session;
pub mod table;
mod watch;

use std::io::Read;
use std::time::{Duration, Instant};

use crate::log::{console_line, console_write};
use crate::machine::Machine;

pub use ringstore_console::PROMPT;
/// Longest command line; the rest of a longer line is discarded.
pub const COMMAND_MAX: usize = 256;
/// Printed before the first prompt.
pub const BANNER: &str =
    "ringstore console: `login` to log in with your SSH key; `help` lists the commands";

/// Reads lines from fd 0 with a length bound.
struct LineReader {
    pending: Vec<u8>,
    discarding: bool,
    /// The previous byte was '\r': a following '\n' ends nothing (CRLF is one line end).
    after_cr: bool,
}

impl LineReader {
    fn new() -> LineReader {
        LineReader {
            pending: Vec::new(),
            discarding: false,
            after_cr: false,
        }
    }

    /// Feeds bytes; returns completed lines (over-long ones come back as `None` entries).
    fn feed(&mut self, bytes: &[u8]) -> Vec<Option<String>> {
        let mut out = Vec::new();
        for &b in bytes {
            let crlf = b == b'\n' && self.after_cr;
            self.after_cr = b == b'\r';
            if crlf {
                continue;
            }
            if b == b'\n' || b == b'\r' {
                if self.discarding {
                    out.push(None);
                } else {
                    out.push(Some(String::from_utf8_lossy(&self.pending).into_owned()));
                }
                self.pending.clear();
                self.discarding = false;
            } else if self.pending.len() >= COMMAND_MAX {
                self.discarding = true;
            } else {
                self.pending.push(b);
            }
        }
        out
    }
}

/// Answers one line in `session`: a pasted signature or password line, or a command run
/// against `machine`.
pub fn handle_line(
    session: &mut session::Session,
    machine: &Machine,
    line: &str,
    now: Instant,
) -> Vec<String> {
    if let Some(out) = session.take_line(line, now) {
        return out;
    }
    let mut out = Vec::new();
    if let Some(notice) = session.check_idle(now) {
        out.push(notice);
    }
    out.extend(table::dispatch(session, machine, line.trim(), now));
    out
}

/// Runs the console over `machine` forever on fds 0/1.
pub fn run_loop(machine: &Machine) -> ! {
    let mut reader = LineReader::new();
    let mut session = session::Session::for_this_boot();
    let mut buf = [0u8; 512];
    console_line(BANNER);
    console_write(PROMPT);
    loop {
        let n = std::io::stdin().lock().read(&mut buf).unwrap_or(0);
        if n == 0 {
            // No console (EOF or error): nothing to read, but PID 1 must stay.
            std::thread::sleep(Duration::from_secs(1));
            continue;
        }
        for line in reader.feed(&buf[..n]) {
            match line {
                None => console_line(&format!("error: line longer than {COMMAND_MAX} bytes")),
                Some(line) => {
                    for l in handle_line(&mut session, machine, &line, Instant::now()) {
                        console_line(&l);
                    }
                }
            }
            if let Some(prompt) = session.prompt() {
                console_write(prompt);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_split_and_bounded() {
        let mut reader = LineReader::new();
        assert_eq!(reader.feed(b"hel"), vec![]);
        assert_eq!(reader.feed(b"p\r\nstat"), vec![Some("help".to_string())]);
        assert_eq!(reader.feed(b"us\n"), vec![Some("status".to_string())]);
        let long = vec![b'x'; COMMAND_MAX + 10];
        assert_eq!(reader.feed(&long), vec![]);
        assert_eq!(reader.feed(b"\nlog\n"), vec![None, Some("log".to_string())]);
        assert_eq!(
            reader.feed(b"\r\n\n"),
            vec![Some(String::new()), Some(String::new())],
            "CRLF is one line end"
        );
    }
}
