//! The console's `slots` lines: which slot booted, which is committed, what each holds, the
//! last trial.

use std::io::Seek;

use ringstore_disk::slots::Slot;

use super::esp::esp_fs;
use crate::state::SlotsState;

/// `slots`: which slot booted, which is committed, what each holds, the last trial.
pub fn slots_lines(st: &SlotsState) -> Vec<String> {
    let Some(esp) = &st.esp else {
        return vec!["no ESP with slots (not booted from disk.img)".into()];
    };
    let name = |s: Option<Slot>| s.map_or("unknown".to_string(), |s| s.to_string());
    let mut out = vec![
        format!(
            "booted {}{}",
            name(st.booted),
            if st.trying {
                " (trial, not committed)"
            } else {
                ""
            }
        ),
        format!("committed {}", name(st.committed)),
    ];
    if let Ok(fs) = esp_fs(esp) {
        for slot in [Slot::A, Slot::B] {
            let size = fs
                .root_dir()
                .open_file(&slot.path())
                .ok()
                .and_then(|mut f| f.seek(std::io::SeekFrom::End(0)).ok());
            out.push(match size {
                Some(bytes) => format!("slot {slot} {} ({} KiB)", slot.path(), bytes / 1024),
                None => format!("slot {slot} empty"),
            });
        }
    }
    match &st.trial {
        Some(t) => out.push(format!("last trial {} -> {}: {}", t.from, t.to, t.outcome)),
        None => out.push("last trial none".into()),
    }
    out
}
