//! The config partition's `/ringstore.toml` as boot found it: read and used, or refused and
//! why. A file that cannot be read, does not parse, or holds a key or value the configuration
//! refuses is ignored whole (the box boots on the image's settings and the kernel command
//! line) and reported, naming the file and the parser's error, in `status` and as a
//! difference in `tuning` — not only in the boot log.

use serde_json::{json, Value};

/// What boot did with the config partition's file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum PartitionFile {
    /// No config partition (not a disk boot), or no file on it.
    #[default]
    Absent,
    /// Read and used: `file` names the partition and the file.
    Used { file: String },
    /// Ignored whole: the file and the error.
    Refused { file: String, error: String },
}

/// What a refused file means for the box (the same words in `status`, `tuning` and the log).
pub const IGNORED: &str = "ignored whole: serving on the image's settings";

impl PartitionFile {
    /// The file and the error, when it was refused.
    pub fn refused(&self) -> Option<(&str, &str)> {
        match self {
            PartitionFile::Refused { file, error } => Some((file, error)),
            _ => None,
        }
    }

    /// `status`'s line.
    pub fn status_line(&self) -> String {
        match self {
            PartitionFile::Absent => "config_partition none".into(),
            PartitionFile::Used { file } => format!("config_partition {file}: used"),
            PartitionFile::Refused { file, error } => {
                format!("config_partition {file}: FAILED ({IGNORED}): {error}")
            }
        }
    }

    /// `status`'s JSON field `config_partition`.
    pub fn json(&self) -> Value {
        match self {
            PartitionFile::Absent => Value::Null,
            PartitionFile::Used { file } => json!({"file": file, "ok": true, "error": null}),
            PartitionFile::Refused { file, error } => {
                json!({"file": file, "ok": false, "error": error})
            }
        }
    }
}

/// An error without the `config partition: ` / `config partition (DISK partition N): `
/// prefix its source gives it (the status line names the file already).
pub fn reason(error: &str) -> String {
    let Some(rest) = error.strip_prefix("config partition") else {
        return error.to_string();
    };
    let rest = match rest.strip_prefix(" (") {
        Some(inner) => inner.split_once("): ").map_or(rest, |(_, after)| after),
        None => rest.strip_prefix(": ").unwrap_or(rest),
    };
    rest.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_lose_the_prefix_only() {
        assert_eq!(reason("config partition: bad \"x\""), "bad \"x\"");
        assert_eq!(
            reason("config partition (/dev/vda partition 2): ringstore.toml: not UTF-8 text"),
            "ringstore.toml: not UTF-8 text"
        );
        assert_eq!(reason("unknown key \"colour\""), "unknown key \"colour\"");
    }

    #[test]
    fn a_refused_file_is_named_with_its_error() {
        let refused = PartitionFile::Refused {
            file: "/dev/vda partition 2: ringstore.toml".into(),
            error: "unknown key \"colour\"".into(),
        };
        let line = refused.status_line();
        assert!(
            line.contains("/dev/vda partition 2: ringstore.toml")
                && line.contains("FAILED")
                && line.contains("unknown key \"colour\""),
            "{line}"
        );
        assert_eq!(refused.json()["ok"], false);
        assert!(refused.refused().is_some());
        let used = PartitionFile::Used { file: "f".into() };
        assert_eq!(used.json()["ok"], true);
        assert!(used.refused().is_none() && !used.status_line().contains("FAILED"));
        assert_eq!(PartitionFile::Absent.json(), Value::Null);
    }
}
