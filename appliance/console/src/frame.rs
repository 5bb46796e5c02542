//! The console's machine-readable framing: with `--json` every answer is lines of
//! `@json {OBJECT}` (one JSON object each, `"v"` the schema version, `"cmd"` the command) and
//! then one `@end` line. Anything else on the console (PID 1's log lines, the echo, kernel records
//! that the reader cuts out by their timestamp, `split.rs`) is not part of an answer.

use serde_json::{Map, Value};

/// The schema version every JSON answer carries in `"v"`.
pub const SCHEMA: u64 = 1;
/// What starts every JSON answer line.
pub const JSON_PREFIX: &str = "@json ";
/// The line after the last JSON line of an answer.
pub const END_LINE: &str = "@end";
/// Longest JSON answer a client takes (the `log` ring and `stats` are well under it).
pub const ANSWER_MAX: usize = 1 << 20;

/// Why an answer could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("a `@json` line is not a JSON object: {0}")]
    NotAnObject(String),
    #[error("an answer without schema version {SCHEMA}: {0}")]
    Schema(String),
    #[error("the answer is over {ANSWER_MAX} bytes")]
    TooLong,
}

/// A JSON answer object: `{"v":1,"cmd":CMD,"ok":OK}` and the caller's fields after them.
pub fn object(cmd: &str, ok: bool) -> Map<String, Value> {
    let mut map = Map::new();
    map.insert("v".into(), SCHEMA.into());
    map.insert("cmd".into(), cmd.into());
    map.insert("ok".into(), ok.into());
    map
}

/// The line for one answer object (serde_json escapes newlines, so it is one line).
pub fn json_line(object: &Map<String, Value>) -> String {
    format!("{JSON_PREFIX}{}", Value::Object(object.clone()))
}

/// The answer in `text` (PID 1's output after the command was sent): the objects of every
/// `@json` line up to the first `@end` line, or `None` while `@end` has not come.
pub fn parse_answer(text: &str) -> Option<Result<Vec<Value>, FrameError>> {
    let mut objects = Vec::new();
    let mut size = 0usize;
    for line in text.split('\n') {
        let line = line.trim_end_matches('\r');
        if line == END_LINE {
            return Some(Ok(objects));
        }
        let Some(at) = line.find(JSON_PREFIX) else {
            continue;
        };
        let json = &line[at + JSON_PREFIX.len()..];
        size += json.len();
        if size > ANSWER_MAX {
            return Some(Err(FrameError::TooLong));
        }
        let value: Value = match serde_json::from_str(json) {
            Ok(v @ Value::Object(_)) => v,
            _ => {
                return Some(Err(FrameError::NotAnObject(
                    json.chars().take(200).collect(),
                )))
            }
        };
        if value.get("v").and_then(Value::as_u64) != Some(SCHEMA) {
            return Some(Err(FrameError::Schema(json.chars().take(200).collect())));
        }
        objects.push(value);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_the_json_lines_up_to_end() {
        let mut first = object("status", true);
        first.insert("text".into(), "two\nlines @end".into());
        let text = format!(
            "ringstore> status --json\nringstore: a log line\n{}\n{}\n@end\nringstore> ",
            json_line(&first),
            json_line(&object("status", false))
        );
        assert_eq!(json_line(&first).matches('\n').count(), 0);
        let got = parse_answer(&text).unwrap().unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0]["text"], "two\nlines @end");
        assert_eq!(got[1]["ok"], false);
        // Not complete before `@end`.
        assert!(parse_answer(&text[..text.find("@end\n").unwrap()]).is_none());
        // A glued prompt before the prefix is skipped; bad JSON and other schemas fail.
        assert!(parse_answer("x @json {\"v\":1}\n@end\n").unwrap().is_ok());
        assert!(parse_answer("@json [1]\n@end\n").unwrap().is_err());
        assert!(parse_answer("@json {\"v\":2}\n@end\n").unwrap().is_err());
        let huge = format!("@json {{\"v\":1,\"x\":\"{}\"}}\n", "a".repeat(ANSWER_MAX));
        assert_eq!(
            parse_answer(&format!("{huge}@end\n")).unwrap(),
            Err(FrameError::TooLong)
        );
    }
}
