//! The stderr tee: fd 2 becomes a socket this module reads, and each line written to it is
//! passed on to where fd 2 went before (the terminal, the console) and to the log sink. So
//! every `eprintln!` of the server is shipped without the server knowing of the sink.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::sync::Mutex;
use std::thread::JoinHandle;

use crate::{Facility, Severity, Shipper, LINE_MAX};

/// A running tee: [`Tee::finish`] puts stderr back and waits for the tee to pass on the rest.
#[derive(Debug)]
pub struct Tee {
    original: File,
    thread: JoinHandle<()>,
}

impl Tee {
    /// Where fd 2 went before (the terminal, the console): PID 1 writes its console there
    /// directly, holding the same lock as the tee.
    pub fn original(&self) -> std::io::Result<File> {
        self.original.try_clone()
    }

    /// Makes the original stderr fd 2 again, which closes the tee's socket: the tee passes on
    /// what is left (so the last lines before an exit reach the terminal) and ends.
    pub fn finish(self) {
        if ringstore_sys::replace_stderr(&OwnedFd::from(self.original)).is_ok() {
            let _ = self.thread.join();
        }
    }
}

/// Redirects the process's stderr through a tee thread that ships each line as `component`.
/// What fd 2 reached before still gets every line, in order, whole: each is written in one
/// write(2), holding `console` when given (the lock PID 1's own console writes hold).
pub fn tee_stderr(
    shipper: Shipper,
    component: &'static str,
    console: Option<&'static Mutex<()>>,
) -> std::io::Result<Tee> {
    let (reader, writer) = UnixStream::pair()?;
    let original = File::from(ringstore_sys::replace_stderr(&OwnedFd::from(writer))?);
    let to = original.try_clone()?;
    let thread = std::thread::Builder::new()
        .name("log-sink-tee".into())
        .spawn(move || tee(reader, to, &shipper, component, console))?;
    Ok(Tee { original, thread })
}

fn tee(
    mut from: UnixStream,
    mut to: File,
    shipper: &Shipper,
    component: &str,
    console: Option<&Mutex<()>>,
) {
    let mut chunk = [0u8; 4096];
    let mut lines = LineSplitter::default();
    loop {
        let n = match from.read(&mut chunk) {
            Ok(0) => return,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return,
        };
        lines.feed(&chunk[..n], |line| {
            let _held = console.map(|m| m.lock().unwrap_or_else(|p| p.into_inner()));
            // A write error has nowhere to be reported; the sink still gets the line.
            let _ = to.write_all(format!("{line}\n").as_bytes());
            shipper.log(Facility::Daemon, Severity::Info, component, line);
        });
    }
}

/// Cuts a byte stream into lines of at most [`LINE_MAX`] bytes (a longer one is cut there and
/// its rest dropped up to the next newline).
#[derive(Debug, Default)]
pub(crate) struct LineSplitter {
    line: Vec<u8>,
}

impl LineSplitter {
    pub(crate) fn feed(&mut self, bytes: &[u8], mut emit: impl FnMut(&str)) {
        for &b in bytes {
            if b == b'\n' {
                if !self.line.is_empty() {
                    emit(&String::from_utf8_lossy(&self.line));
                }
                self.line.clear();
            } else if self.line.len() < LINE_MAX {
                self.line.push(b);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_split_across_chunks_and_bounded() {
        let mut splitter = LineSplitter::default();
        let mut out = Vec::new();
        splitter.feed(b"ab", |l| out.push(l.to_string()));
        splitter.feed(b"c\n\nd\n", |l| out.push(l.to_string()));
        assert_eq!(out, ["abc", "d"]);
        out.clear();
        splitter.feed(&vec![b'x'; LINE_MAX + 100], |l| out.push(l.to_string()));
        splitter.feed(b"\nnext\n", |l| out.push(l.len().to_string()));
        assert_eq!(out, [LINE_MAX.to_string(), "4".to_string()]);
    }
}
