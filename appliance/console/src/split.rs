//! The serial console's byte stream split into its two writers: PID 1 (its lines, the prompt,
//! command output, the server's lines) and the kernel's log records.
//!
//! The kernel writes a log record straight to the UART, between any two bytes of whatever PID 1
//! has queued on the tty: a record can land in the middle of a PID 1 line (seen in CI:
//! `ringstore: ready[    4.418821] ringstore: serving: ready memcache=…` and then
//! ` memcache=0.0.0.0:11211 …` on the next line). A record is always whole and always
//! `[SECONDS.MICROS] text` up to its newline (CONFIG_PRINTK_TIME, six decimals), so it is cut out
//! wherever it starts and PID 1's text is put back together. PID 1 never prints that shape (its
//! `log` ring has three decimals).

/// Where the splitter is in the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// PID 1's text.
    Text,
    /// A `[` that may begin a kernel timestamp, held back until it does or does not.
    Stamp(Stamp),
    /// Inside a kernel record, up to its newline.
    Record,
}

/// How much of `[ *DIGITS.DIGITS{6}]` the held-back text has matched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stamp {
    /// `[` and padding spaces.
    Open,
    /// Digits of the seconds.
    Seconds,
    /// The point and this many decimals.
    Micros(u8),
}

/// Decimals of a printk timestamp.
const MICROS: u8 = 6;

/// Splits the console stream as it arrives; feeding it in any chunks gives the same result.
#[derive(Debug)]
pub struct Splitter {
    state: State,
    held: String,
    /// PID 1's output, kernel records removed.
    pub pid1: String,
    /// The kernel's records, each a whole line.
    pub kernel: String,
}

impl Default for Splitter {
    fn default() -> Self {
        Splitter {
            state: State::Text,
            held: String::new(),
            pid1: String::new(),
            kernel: String::new(),
        }
    }
}

impl Splitter {
    /// Takes the next piece of console text (`\r` is dropped).
    pub fn feed(&mut self, text: &str) {
        for ch in text.chars().filter(|&c| c != '\r') {
            self.push(ch);
        }
    }

    fn push(&mut self, ch: char) {
        match self.state {
            State::Text => {
                if ch == '[' {
                    self.held.push(ch);
                    self.state = State::Stamp(Stamp::Open);
                } else {
                    self.pid1.push(ch);
                }
            }
            State::Record => {
                self.kernel.push(ch);
                if ch == '\n' {
                    self.state = State::Text;
                }
            }
            State::Stamp(stamp) => {
                let next = match (stamp, ch) {
                    (Stamp::Open, ' ') => Some(Stamp::Open),
                    (Stamp::Open | Stamp::Seconds, '0'..='9') => Some(Stamp::Seconds),
                    (Stamp::Seconds, '.') => Some(Stamp::Micros(0)),
                    (Stamp::Micros(n), '0'..='9') if n < MICROS => Some(Stamp::Micros(n + 1)),
                    (Stamp::Micros(MICROS), ']') => {
                        // A kernel record: everything held is its timestamp.
                        self.kernel.push_str(&self.held);
                        self.kernel.push(ch);
                        self.held.clear();
                        self.state = State::Record;
                        return;
                    }
                    _ => None,
                };
                match next {
                    Some(stamp) => {
                        self.held.push(ch);
                        self.state = State::Stamp(stamp);
                    }
                    None => {
                        // Not a timestamp: the held text was PID 1's, and `ch` starts afresh
                        // (it may be another `[`).
                        self.pid1.push_str(&self.held);
                        self.held.clear();
                        self.state = State::Text;
                        self.push(ch);
                    }
                }
            }
        }
    }
}

/// Decodes UTF-8 arriving in pieces: a character cut at the end of one piece is completed by the
/// next; invalid bytes become U+FFFD.
#[derive(Debug, Default)]
pub struct Utf8Pieces {
    carry: Vec<u8>,
}

impl Utf8Pieces {
    pub fn decode(&mut self, bytes: &[u8]) -> String {
        self.carry.extend_from_slice(bytes);
        let mut text = String::new();
        loop {
            match std::str::from_utf8(&self.carry) {
                Ok(all) => {
                    text.push_str(all);
                    self.carry.clear();
                    return text;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    text.push_str(std::str::from_utf8(&self.carry[..valid]).unwrap_or_default());
                    match e.error_len() {
                        // A sequence cut at the end: wait for its other bytes.
                        None => {
                            self.carry.drain(..valid);
                            return text;
                        }
                        Some(bad) => {
                            text.push(char::REPLACEMENT_CHARACTER);
                            self.carry.drain(..valid + bad);
                        }
                    }
                }
            }
        }
    }
}

/// `text` fed in pieces of `chunk` characters, as a reader sees it arrive (for tests of what
/// reads the split views; any chunking gives the same result).
pub fn split_in_chunks(text: &str, chunk: usize) -> Splitter {
    let mut s = Splitter::default();
    let chars: Vec<char> = text.chars().collect();
    for piece in chars.chunks(chunk.max(1)) {
        s.feed(&piece.iter().collect::<String>());
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    const READY: &str = "ringstore: ready memcache=0.0.0.0:11211 http=0.0.0.0:8080\n";

    #[test]
    fn a_kernel_record_anywhere_is_cut_out() {
        let pid1 = format!(
            "{READY}ringstore> threads\n   tid name            capeff\n     1 init            capeff 0000000000400000 capprm 0000000000400000 capbnd 0000000000400000 nnp 1\nringstore> log\n[    4.419] info: ready memcache=[::]:11211\nringstore> "
        );
        let records = [
            "[    5.123456] virtio_net virtio0 eth0: link up\n",
            "[12345.000001][    T1] two stamps, caller id\n",
            "[    6.000000] a\n[    6.000001] b, back to back\n",
        ];
        for record in records {
            for at in (0..=pid1.len()).filter(|&i| pid1.is_char_boundary(i)) {
                let console = format!("{}{record}{}", &pid1[..at], &pid1[at..]);
                let s = split_in_chunks(&console, 5);
                assert_eq!(s.pid1, pid1, "record {record:?} at {at}");
                assert_eq!(s.kernel, record, "record {record:?} at {at}");
            }
        }
        // Kernel lines before /init, then PID 1: both views are whole.
        let s = split_in_chunks(
            "[    0.000000] Linux version 6.12\n[    2.3] not a stamp\n[    2.300000] Run /init as init process\nringstore: x\n",
            3,
        );
        assert_eq!(s.pid1, "[    2.3] not a stamp\nringstore: x\n");
        assert_eq!(
            s.kernel,
            "[    0.000000] Linux version 6.12\n[    2.300000] Run /init as init process\n"
        );
    }

    #[test]
    fn brackets_of_pid1_stay() {
        for text in [
            "http=[::]:8080\n",
            "[fe80::1]:80 [1.5] [ 1.1234567] [12.] [.123456] [[    1.000000x\n",
            "log: [    4.419] info: x\n",
        ] {
            let s = split_in_chunks(text, 1);
            assert_eq!(s.pid1, text);
            assert_eq!(s.kernel, "");
        }
        // A `[` at the end is held back until the next byte tells what it is.
        let mut s = Splitter::default();
        s.feed("ringstore> [");
        assert_eq!(s.pid1, "ringstore> ");
        s.feed("x");
        assert_eq!(s.pid1, "ringstore> [x");
        // A `[` that turns out not to start a record, followed by one that does.
        let s = split_in_chunks("a[[    1.000000] k\nb\n", 1);
        assert_eq!(
            (s.pid1.as_str(), s.kernel.as_str()),
            ("a[b\n", "[    1.000000] k\n")
        );
    }

    #[test]
    fn utf8_cut_between_reads_is_completed() {
        let mut d = Utf8Pieces::default();
        let bytes = "é→x".as_bytes();
        let mut out = String::new();
        for b in bytes {
            out.push_str(&d.decode(std::slice::from_ref(b)));
        }
        assert_eq!(out, "é→x");
        assert_eq!(d.decode(b"a\xffb"), "a\u{fffd}b");
        assert_eq!(d.decode(b"\xff\xc3"), "\u{fffd}");
        assert_eq!(d.decode(b"\xa9"), "é");
    }
}
