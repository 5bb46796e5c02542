//! The console's `slots`: which slot booted, which is committed, each slot's file and size,
//! the last trial and its verdict — as text lines and as JSON fields (ADR 0025).

use ringstore_bootdisk::slots::{Slot, Trial};
use serde_json::{json, Map, Value};

use crate::state::SlotsState;

/// Text lines and JSON fields (the console's `Output` is built from them).
#[derive(Debug, Default)]
pub struct Report {
    pub text: Vec<String>,
    pub fields: Map<String, Value>,
}

impl Report {
    fn line(&mut self, line: impl Into<String>) {
        self.text.push(line.into());
    }

    fn set(&mut self, key: &str, value: impl Into<Value>) {
        self.fields.insert(key.to_string(), value.into());
    }
}

/// A trial's verdict from its outcome: `pending`, `committed` or `failed`.
pub fn verdict(trial: &Trial) -> &'static str {
    if trial.outcome == "committed" {
        "committed"
    } else if trial.outcome.starts_with("failed") {
        "failed"
    } else {
        "pending"
    }
}

/// The report for `st`; `sizes` are slot A's and B's UKI sizes in bytes (`None` in the array:
/// empty; `None` as a whole: the ESP could not be read).
pub fn report(st: &SlotsState, sizes: Option<[Option<u64>; 2]>) -> Report {
    let mut out = Report::default();
    if st.esp.is_none() {
        out.line("no ESP with slots (not booted from disk.img)");
        out.set("esp", false);
        out.set("booted", Value::Null);
        out.set("committed", Value::Null);
        out.set("slots", Vec::<Value>::new());
        out.set("last_trial", Value::Null);
        return out;
    }
    let name = |s: Option<Slot>| s.map_or("unknown".to_string(), |s| s.to_string());
    out.line(format!(
        "booted {}{}",
        name(st.booted),
        if st.trying {
            " (trial, not committed)"
        } else {
            ""
        }
    ));
    out.line(format!("committed {}", name(st.committed)));
    let mut slots = Vec::new();
    if let Some(sizes) = sizes {
        for (slot, size) in [Slot::A, Slot::B].into_iter().zip(sizes) {
            out.line(match size {
                Some(bytes) => format!("slot {slot} {} ({} KiB)", slot.path(), bytes / 1024),
                None => format!("slot {slot} empty"),
            });
            slots.push(json!({"slot": slot.to_string(), "file": slot.path(),
                              "bytes": size, "empty": size.is_none()}));
        }
    } else {
        out.line("slots unreadable (ESP)");
    }
    let trial = match &st.trial {
        Some(t) => {
            out.line(format!("last trial {} -> {}: {}", t.from, t.to, t.outcome));
            json!({"from": t.from.to_string(), "to": t.to.to_string(),
                   "verdict": verdict(t), "outcome": t.outcome})
        }
        None => {
            out.line("last trial none");
            Value::Null
        }
    };
    out.set("esp", true);
    out.set("booted", json!(st.booted.map(|s| s.to_string())));
    out.set("committed", json!(st.committed.map(|s| s.to_string())));
    out.set("trying", st.trying);
    out.set("slots", slots);
    out.set("last_trial", trial);
    out
}

/// The report for `st` (this boot's), the sizes read from the ESP now.
pub fn slots(st: &SlotsState) -> Report {
    let sizes = st.esp.as_ref().and_then(|esp| {
        use std::io::Seek;
        let fs = crate::update::esp_fs(esp).ok()?;
        let size = |slot: Slot| {
            fs.root_dir()
                .open_file(&slot.path())
                .ok()
                .and_then(|mut f| f.seek(std::io::SeekFrom::End(0)).ok())
        };
        Some([size(Slot::A), size(Slot::B)])
    });
    report(st, sizes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_and_lines_say_the_same() {
        let none = report(&SlotsState::default(), None);
        assert_eq!(none.fields["esp"], false);
        assert!(none.text[0].contains("not booted from disk.img"));
        let st = SlotsState {
            esp: Some(crate::bootdisk::Found {
                disk: "/dev/vda".into(),
                number: 1,
                start: 0,
                len: 1 << 20,
            }),
            booted: Some(Slot::B),
            committed: Some(Slot::B),
            trial: Some(Trial {
                from: Slot::A,
                to: Slot::B,
                outcome: "committed".into(),
            }),
            ..SlotsState::default()
        };
        let out = report(&st, Some([Some(20 << 10), None]));
        assert_eq!(
            out.text,
            [
                "booted B",
                "committed B",
                "slot A EFI/Linux/ringstore-a.efi (20 KiB)",
                "slot B empty",
                "last trial A -> B: committed"
            ]
        );
        let f = &out.fields;
        assert_eq!(
            (f["booted"].as_str(), f["committed"].as_str()),
            (Some("B"), Some("B"))
        );
        assert_eq!(f["slots"][0]["file"], "EFI/Linux/ringstore-a.efi");
        assert_eq!(f["slots"][0]["bytes"], 20 << 10);
        assert_eq!(f["slots"][1]["empty"], true);
        assert_eq!(f["last_trial"]["verdict"], "committed");
        let failed = Trial {
            from: Slot::B,
            to: Slot::A,
            outcome: "failed: never became ready".into(),
        };
        assert_eq!(verdict(&failed), "failed");
        assert_eq!(
            verdict(&Trial {
                outcome: "pending".into(),
                ..failed
            }),
            "pending"
        );
    }
}
