//! A/B updates with a trial boot gated on the data path (ADR 0025).
//!
//! The ESP holds systemd-boot, `loader.conf` (whose `default` is the committed slot) and the
//! two UKIs `\EFI\Linux\ringstore-{a,b}.efi`. `update URL` fetches a new ringstore.efi and its
//! `.sig`, verifies the ed25519 signature against the key in the running image and, under
//! Secure Boot, that the firmware's db trusts its Authenticode signature (`crate::secure_boot`,
//! ADR 0051) before writing anything, writes the inactive slot, records a pending trial on the ESP, sets systemd-boot's
//! `LoaderEntryOneShot` to the new slot and reboots (`install.rs`). The trial boot arms the
//! hardware watchdog (`watchdog.rs`), and once its server is ready runs the canary through its
//! own listeners (`canary.rs`): memcache set/get/delete, HTTP PUT/GET/DELETE, each within
//! [`CANARY_OP_LIMIT`], and with a data device the key the old system wrote before the reboot,
//! read back after recovery. Only then does it make itself the default (commit, `verdict.rs`).
//! Any failure records why and reboots; a hang is reset by the watchdog; either way the one-shot
//! entry is spent, so the next boot is the old slot, which reports the outcome at boot
//! (`boot.rs`) and in `slots` (`crate::slots_report`). `esp.rs` reads and writes the ESP and the EFI
//! variables for all of them.
//!
//! The slots as found live in the machine's state (`state::SlotsState`); everything here that
//! reads or changes them is handed the [`Machine`](crate::machine::Machine).

mod boot;
mod canary;
mod esp;
mod install;
mod verdict;
mod watchdog;

pub use boot::boot_state;
pub use canary::{canary, CANARY_KEY, CANARY_OP_LIMIT};
pub(crate) use esp::esp_fs;
pub use install::{update, FETCH_LIMIT, IMAGE_MAX, NETWORK_BOOT_UPDATE};
pub use verdict::decide_trial;
pub use watchdog::{arm_watchdog, TRIAL_LIMIT};
