//! Finding where a request head ends, incrementally, while enforcing the size limits as the
//! bytes arrive (request line, header bytes, header count).
use super::request_line::check_method_prefix;
use super::syntax::{find_lf, strip_cr};
use super::{HeadError, Limits};

/// Progress of the scanner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scan {
    /// More bytes are needed.
    Partial,
    /// The head is complete and is the first `n` bytes of the buffer.
    Complete(usize),
}

/// Finds the end of a request head incrementally. Feed it the same buffer, grown, on every
/// call; it resumes where it stopped, so a head trickling in byte by byte costs linear time.
#[derive(Debug, Clone, Default)]
pub struct HeadScanner {
    /// Index just past the request line's LF, once seen.
    line_end: Option<usize>,
    /// Start of the header line being scanned.
    line_start: usize,
    /// Next byte to examine.
    pos: usize,
    headers: usize,
}

impl HeadScanner {
    pub fn new() -> HeadScanner {
        HeadScanner::default()
    }

    /// Forgets the progress, for the next request.
    pub fn reset(&mut self) {
        *self = HeadScanner::default();
    }

    /// True once any byte of the current head has been examined.
    pub fn started(&self) -> bool {
        self.pos > 0
    }

    /// Scans `buf`, which starts at the request line (run [`super::skip_empty_lines`] first) and
    /// extends what the previous call saw.
    pub fn scan(&mut self, buf: &[u8], limits: &Limits) -> Result<Scan, HeadError> {
        let line_end = match self.line_end {
            Some(end) => end,
            None => {
                check_method_prefix(buf)?;
                match find_lf(buf, self.pos) {
                    None => {
                        self.pos = buf.len();
                        // The line is at least this long even if the next byte is its LF.
                        if buf.len().saturating_sub(1) > limits.max_request_line {
                            return Err(HeadError::RequestLineTooLong);
                        }
                        return Ok(Scan::Partial);
                    }
                    Some(lf) => {
                        if strip_cr(&buf[..lf]).len() > limits.max_request_line {
                            return Err(HeadError::RequestLineTooLong);
                        }
                        self.line_end = Some(lf + 1);
                        self.line_start = lf + 1;
                        self.pos = lf + 1;
                        lf + 1
                    }
                }
            }
        };
        loop {
            match find_lf(buf, self.pos) {
                None => {
                    self.pos = buf.len();
                    // The blank line can end no earlier than one byte from now.
                    if buf.len() + 1 - line_end > limits.max_header_bytes {
                        return Err(HeadError::HeadersTooLarge);
                    }
                    return Ok(Scan::Partial);
                }
                Some(lf) => {
                    let end = lf + 1;
                    if end - line_end > limits.max_header_bytes {
                        return Err(HeadError::HeadersTooLarge);
                    }
                    self.pos = end;
                    if strip_cr(&buf[self.line_start..lf]).is_empty() {
                        return Ok(Scan::Complete(end));
                    }
                    self.headers += 1;
                    if self.headers > limits.max_headers {
                        return Err(HeadError::TooManyHeaders);
                    }
                    self.line_start = end;
                }
            }
        }
    }
}
