//! The A/B slots on the ESP (ADR 0025): systemd-boot as `\EFI\BOOT\BOOTX64.EFI`, the two UKIs
//! in `\EFI\Linux\`, `loader.conf` naming the committed slot as the default, and the trial
//! record PID 1 keeps beside it, and the tuned entry (`loader/entries/ringstore-X.conf`) a
//! slot's own first boot writes to give its next boots the worker CPUs' `nohz_full=`.

use std::fmt;

/// One of the two slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    A,
    B,
}

/// Where the firmware's removable-media path finds the boot manager, and systemd-boot's own path.
pub const BOOT_MANAGER_PATHS: [&str; 2] =
    ["EFI/BOOT/BOOTX64.EFI", "EFI/systemd/systemd-bootx64.efi"];
/// systemd-boot's configuration.
pub const LOADER_CONF: &str = "loader/loader.conf";
/// PID 1's record of the last trial boot (see [`Trial`]).
pub const TRIAL_FILE: &str = "loader/ringstore-trial.txt";

impl Slot {
    /// systemd-boot's entry id: the UKI's file name.
    pub fn entry_id(self) -> &'static str {
        match self {
            Slot::A => "ringstore-a.efi",
            Slot::B => "ringstore-b.efi",
        }
    }

    /// The id of the slot's tuned entry (the same UKI with the boot arguments PID 1 wrote):
    /// systemd-boot names a Type #1 entry by its file name.
    pub fn tuned_entry_id(self) -> &'static str {
        match self {
            Slot::A => "ringstore-a.conf",
            Slot::B => "ringstore-b.conf",
        }
    }

    /// The tuned entry's path on the ESP.
    pub fn tuned_entry_path(self) -> String {
        format!("loader/entries/{}", self.tuned_entry_id())
    }

    /// The UKI's path on the ESP.
    pub fn path(self) -> String {
        format!("EFI/Linux/{}", self.entry_id())
    }

    pub fn other(self) -> Slot {
        match self {
            Slot::A => Slot::B,
            Slot::B => Slot::A,
        }
    }

    /// The slot of a systemd-boot entry id (`LoaderEntrySelected`), any case: the UKI's own
    /// entry or the slot's tuned entry.
    pub fn from_entry_id(id: &str) -> Option<Slot> {
        let id = id.trim();
        [Slot::A, Slot::B].into_iter().find(|s| {
            s.entry_id().eq_ignore_ascii_case(id) || s.tuned_entry_id().eq_ignore_ascii_case(id)
        })
    }
}

impl fmt::Display for Slot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Slot::A => "A",
            Slot::B => "B",
        })
    }
}

/// `loader.conf` booting `default` with no menu, no editor (the kernel command line cannot be
/// changed at the console) and no automatic entries.
pub fn loader_conf(default: Slot) -> String {
    loader_conf_booting(default.entry_id())
}

/// [`loader_conf`] with `default` naming entry `id` (a slot's UKI or its tuned entry).
pub fn loader_conf_booting(id: &str) -> String {
    format!(
        "# Written by ringstore (ADR 0025): the committed slot boots; a trial uses LoaderEntryOneShot.\n\
         timeout 0\ndefault {id}\neditor no\nauto-entries no\nauto-firmware no\n"
    )
}

/// The tuned entry of `slot`: its UKI booted with `options` as the whole kernel command line
/// (systemd-stub uses the loader's options in place of the UKI's `.cmdline` when Secure Boot
/// is off; with Secure Boot on it keeps its own, and the entry changes nothing).
pub fn tuned_entry(slot: Slot, options: &str) -> String {
    format!(
        "# Written by ringstore: slot {slot}'s image command line plus the boot arguments its tuning needs.\n\
         title ringstore slot {slot} (tuned)\nefi /{}\noptions {}\n",
        slot.path(),
        options.trim()
    )
}

/// The `options` line of a tuned entry.
pub fn entry_options(entry: &str) -> Option<&str> {
    entry
        .lines()
        .find_map(|l| l.strip_prefix("options "))
        .map(str::trim)
}

/// The `default` slot a `loader.conf` names.
pub fn default_slot(conf: &str) -> Option<Slot> {
    conf.lines().find_map(|line| {
        let mut words = line.split_whitespace();
        (words.next() == Some("default"))
            .then(|| words.next().and_then(Slot::from_entry_id))
            .flatten()
    })
}

/// The trial record: which slot was tried from which, and how it ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trial {
    pub from: Slot,
    pub to: Slot,
    /// `pending` until the trial system writes `committed` or `failed: WHY`.
    pub outcome: String,
}

impl Trial {
    pub fn render(&self) -> String {
        format!(
            "from {}\nto {}\noutcome {}\n",
            self.from, self.to, self.outcome
        )
    }

    pub fn parse(text: &str) -> Option<Trial> {
        let mut from = None;
        let mut to = None;
        let mut outcome = None;
        let slot = |v: &str| match v.trim() {
            "A" => Some(Slot::A),
            "B" => Some(Slot::B),
            _ => None,
        };
        for line in text.lines() {
            let (key, value) = line.split_once(' ').unwrap_or((line, ""));
            match key {
                "from" => from = slot(value),
                "to" => to = slot(value),
                "outcome" => outcome = Some(value.trim().chars().take(512).collect()),
                _ => {}
            }
        }
        Some(Trial {
            from: from?,
            to: to?,
            outcome: outcome?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loader_conf_names_its_default() {
        for slot in [Slot::A, Slot::B] {
            assert_eq!(default_slot(&loader_conf(slot)), Some(slot));
            assert_eq!(
                Slot::from_entry_id(&slot.entry_id().to_uppercase()),
                Some(slot)
            );
        }
        assert_eq!(default_slot("timeout 0\ndefault other.efi\n"), None);
        // The tuned entry stands for its slot, in loader.conf and in LoaderEntrySelected.
        for slot in [Slot::A, Slot::B] {
            let conf = loader_conf_booting(slot.tuned_entry_id());
            assert_eq!(default_slot(&conf), Some(slot));
            assert!(conf.contains("editor no"), "{conf}");
        }
        assert_eq!(
            Slot::B.tuned_entry_path(),
            "loader/entries/ringstore-b.conf"
        );
        let entry = tuned_entry(Slot::A, " console=ttyS0 nohz_full=1 ");
        assert!(
            entry.contains("\nefi /EFI/Linux/ringstore-a.efi\n"),
            "{entry}"
        );
        assert_eq!(entry_options(&entry), Some("console=ttyS0 nohz_full=1"));
        assert_eq!(entry_options("title x\n"), None);
        assert_eq!(Slot::A.other(), Slot::B);
        assert_eq!(Slot::B.path(), "EFI/Linux/ringstore-b.efi");
    }

    #[test]
    fn trials_round_trip_and_garbage_is_none() {
        let t = Trial {
            from: Slot::A,
            to: Slot::B,
            outcome: "failed: canary: memcache get: timed out".into(),
        };
        assert_eq!(Trial::parse(&t.render()), Some(t));
        assert_eq!(Trial::parse("from A\nto C\noutcome pending\n"), None);
        assert_eq!(Trial::parse(""), None);
    }
}
