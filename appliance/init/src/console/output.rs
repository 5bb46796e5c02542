//! One command's answer, in both forms: text lines for people, one JSON object for tools
//! (`--json`: `@json {"v":1,"cmd":...,"ok":...,FIELDS}` then `@end`; ringstore_console::frame).

use serde_json::{Map, Value};

/// What a command answers.
#[derive(Debug, Default)]
pub struct Output {
    pub ok: bool,
    pub text: Vec<String>,
    pub fields: Map<String, Value>,
}

impl Output {
    pub fn new() -> Output {
        Output {
            ok: true,
            ..Output::default()
        }
    }

    /// A refusal or failure: `error: WHY` as text, `"ok":false,"error":WHY` as JSON.
    pub fn error(why: impl Into<String>) -> Output {
        let why = why.into();
        let mut out = Output {
            ok: false,
            text: vec![format!("error: {why}")],
            fields: Map::new(),
        };
        out.set("error", why);
        out
    }

    pub fn line(&mut self, line: impl Into<String>) {
        self.text.push(line.into());
    }

    pub fn set(&mut self, key: &str, value: impl Into<Value>) {
        self.fields.insert(key.to_string(), value.into());
    }

    /// The lines to print for `cmd`.
    pub fn render(&self, cmd: &str, json: bool) -> Vec<String> {
        if !json {
            return self.text.clone();
        }
        let mut object = ringstore_console::frame::object(cmd, self.ok);
        for (k, v) in &self.fields {
            object.insert(k.clone(), v.clone());
        }
        vec![
            ringstore_console::frame::json_line(&object),
            ringstore_console::frame::END_LINE.to_string(),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_answers_are_framed_with_the_schema_version() {
        let mut out = Output::new();
        out.line("uptime 1.0 s");
        out.set("uptime_s", 1.0);
        assert_eq!(out.render("status", false), ["uptime 1.0 s"]);
        let lines = out.render("status", true);
        let text = format!("{}\n", lines.join("\n"));
        let parsed = ringstore_console::frame::parse_answer(&text)
            .unwrap()
            .unwrap();
        assert_eq!(parsed[0]["v"], 1);
        assert_eq!(parsed[0]["cmd"], "status");
        assert_eq!(parsed[0]["ok"], true);
        assert_eq!(parsed[0]["uptime_s"], 1.0);
        let err = Output::error("no").render("x", true);
        assert!(err[0].contains("\"ok\":false") && err[0].contains("\"error\":\"no\""));
    }
}
