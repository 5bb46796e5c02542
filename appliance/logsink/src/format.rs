//! RFC 5424 lines (`<PRI>1 TIMESTAMP HOSTNAME ringstore PROCID MSGID [SD] MSG`) and RFC 6587
//! octet-counting frames. Pure functions: the time and the identity are passed in.

/// Longest line sent, framing excluded: RFC 5426 asks every receiver to take 2048 bytes over
/// UDP, and a longer message is cut to fit.
pub const LINE_MAX: usize = 2048;

/// The structured-data ID: `ringstore` under the example enterprise number of RFC 5612
/// (ringstore has no enterprise number of its own).
pub const SD_ID: &str = "ringstore@32473";

/// RFC 5424 severities ringstore uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    Error = 3,
    Warning = 4,
    Notice = 5,
    Info = 6,
    Debug = 7,
}

impl Severity {
    /// The severity of a kernel record's level (`<0>`..`<7>`; 0-2 are reported as errors).
    pub fn from_kernel_level(level: u8) -> Severity {
        match level {
            0..=3 => Severity::Error,
            4 => Severity::Warning,
            5 => Severity::Notice,
            6 => Severity::Info,
            _ => Severity::Debug,
        }
    }
}

/// RFC 5424 facilities ringstore uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Facility {
    /// The kernel's own records (/dev/kmsg).
    Kern = 0,
    /// ringstore's lines.
    Daemon = 3,
}

/// Who writes: the same for every line of one process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ident {
    pub hostname: String,
    /// /proc/sys/kernel/random/boot_id: tells one boot's lines from the next's.
    pub boot_id: String,
    pub procid: u32,
}

impl Ident {
    /// This machine's host name and boot id and this process's id.
    pub fn of_this_process() -> Ident {
        let read = |path: &str| {
            std::fs::read_to_string(path)
                .map(|s| s.trim().to_string())
                .unwrap_or_default()
        };
        Ident {
            hostname: read("/proc/sys/kernel/hostname"),
            boot_id: read("/proc/sys/kernel/random/boot_id"),
            procid: std::process::id(),
        }
    }
}

/// One line to format.
#[derive(Debug, Clone, Copy)]
pub struct Record<'a> {
    pub facility: Facility,
    pub severity: Severity,
    /// `init` (PID 1), `server`, `kernel`: the MSGID and the SD's `component`.
    pub component: &'a str,
    pub text: &'a str,
    /// Microseconds since the Unix epoch.
    pub unix_micros: u64,
}

/// The RFC 5424 line of `record`, at most [`LINE_MAX`] bytes, without a trailing newline.
pub fn format_line(ident: &Ident, record: &Record<'_>) -> String {
    let mut line = String::with_capacity(256);
    let pri = record.facility as u8 * 8 + record.severity as u8;
    line.push_str(&format!("<{pri}>1 {} ", timestamp(record.unix_micros)));
    line.push_str(&header_field(&ident.hostname, 255));
    line.push_str(" ringstore ");
    line.push_str(&ident.procid.to_string());
    line.push(' ');
    line.push_str(&header_field(record.component, 32));
    line.push_str(&format!(
        " [{SD_ID} boot=\"{}\" component=\"{}\"] ",
        sd_value(&ident.boot_id),
        sd_value(record.component)
    ));
    for ch in record.text.chars() {
        let ch = if ch.is_control() { ' ' } else { ch };
        if line.len() + ch.len_utf8() > LINE_MAX {
            break;
        }
        line.push(ch);
    }
    line
}

/// A header field: printable US-ASCII without spaces, at most `max` bytes, `-` when empty.
fn header_field(text: &str, max: usize) -> String {
    let field: String = text
        .chars()
        .filter(|c| c.is_ascii_graphic())
        .take(max)
        .collect();
    if field.is_empty() {
        "-".into()
    } else {
        field
    }
}

/// An SD PARAM-VALUE: `"`, `\` and `]` escaped with a backslash (RFC 5424 6.3.3), control
/// characters made spaces, at most 128 characters.
pub fn sd_value(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for ch in text.chars().take(128) {
        match ch {
            '"' | '\\' | ']' => {
                out.push('\\');
                out.push(ch);
            }
            c if c.is_control() => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

/// RFC 3339 in UTC with microseconds: `2026-12-06T13:34:20.123456Z`.
pub fn timestamp(unix_micros: u64) -> String {
    let secs = unix_micros / 1_000_000;
    let micros = unix_micros % 1_000_000;
    let rem = secs % 86_400;
    // Shared with the FAT times and the OCI image's `created` (days on or after 1970 fit i64).
    let days = i64::try_from(secs / 86_400).unwrap_or(i64::MAX);
    let (year, month, day) = ringstore_sys::civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{micros:06}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// RFC 6587 octet counting: `LEN SP LINE`, as TCP and TLS receivers read it.
pub fn octet_frame(line: &str) -> Vec<u8> {
    let mut frame = format!("{} ", line.len()).into_bytes();
    frame.extend_from_slice(line.as_bytes());
    frame
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ident() -> Ident {
        Ident {
            hostname: "box-7".into(),
            boot_id: "0e1f".into(),
            procid: 42,
        }
    }

    fn record(text: &str) -> Record<'_> {
        Record {
            facility: Facility::Daemon,
            severity: Severity::Info,
            component: "server",
            text,
            unix_micros: 1_796_563_260_123_456,
        }
    }

    #[test]
    fn a_line_has_every_rfc5424_field() {
        assert_eq!(
            format_line(&ident(), &record("ready")),
            "<30>1 2026-12-06T13:21:00.123456Z box-7 ringstore 42 server \
             [ringstore@32473 boot=\"0e1f\" component=\"server\"] ready"
        );
        let kernel = Record {
            facility: Facility::Kern,
            severity: Severity::from_kernel_level(3),
            component: "kernel",
            ..record("x")
        };
        assert!(format_line(&ident(), &kernel).starts_with("<3>1 "));
        let nameless = Ident {
            hostname: String::new(),
            ..ident()
        };
        assert!(format_line(&nameless, &record("x")).contains("Z - ringstore 42 "));
    }

    #[test]
    fn sd_values_escape_quote_backslash_and_bracket() {
        assert_eq!(sd_value(r#"a"b\c]d"#), r#"a\"b\\c\]d"#);
        assert_eq!(sd_value("x\ny"), "x y");
        assert_eq!(sd_value(&"é".repeat(200)).chars().count(), 128);
        let odd = Ident {
            boot_id: "]\"".into(),
            ..ident()
        };
        assert!(format_line(&odd, &record("m")).contains(r#"boot="\]\"""#));
    }

    #[test]
    fn messages_are_cleaned_and_cut() {
        let line = format_line(&ident(), &record("a\nb\u{1b}c"));
        assert!(line.ends_with("] a b c"), "{line}");
        let long = format_line(&ident(), &record(&"é".repeat(3000)));
        assert!(long.len() <= LINE_MAX && long.len() > LINE_MAX - 2);
    }

    #[test]
    fn timestamps_are_utc_with_microseconds() {
        assert_eq!(timestamp(0), "1970-01-01T00:00:00.000000Z");
        assert_eq!(
            timestamp(951_782_400_000_001),
            "2000-02-29T00:00:00.000001Z"
        );
        assert_eq!(
            timestamp(4_107_542_399_999_999),
            "2100-02-28T23:59:59.999999Z"
        );
    }

    #[test]
    fn octet_counting_frames_count_bytes() {
        assert_eq!(octet_frame("abc"), b"3 abc");
        assert_eq!(octet_frame("é"), "2 é".as_bytes());
        assert_eq!(octet_frame(""), b"0 ");
    }
}
