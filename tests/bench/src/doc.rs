//! What goes into results.md besides the tables: sections, commands, notes, and target lines.

/// What goes into results.md besides the tables.
#[derive(Default)]
pub(super) struct Doc {
    pub(super) sections: Vec<String>,
    pub(super) commands: Vec<String>,
    pub(super) notes: Vec<String>,
    pub(super) targets: Vec<String>,
    /// Checks that fail the run once results.md is written (`--icount-check`).
    pub(super) failures: Vec<String>,
}

impl Doc {
    pub(super) fn command(&mut self, line: &str) {
        if !self.commands.iter().any(|c| c == line) {
            self.commands.push(line.to_string());
        }
    }

    pub(super) fn note(&mut self, line: String) {
        eprintln!("bench: {line}");
        self.notes.push(line);
    }
}

/// "met" or "NOT met", for the target lines.
pub(super) fn mark(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "NOT met"
    }
}
