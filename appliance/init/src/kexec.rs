//! Reboot and update without the firmware (ADR 0054): the next kernel, initrd and command line
//! come from a slot's UKI on the ESP (its `.linux`, `.initrd` and `.cmdline` sections) and are
//! loaded with kexec_file_load while the server still serves; [`crate::power::shutdown`] then
//! quiesces and seals the store and jumps. The command line carries the slot it boots
//! (`ringstore_slot=`, since the firmware's `LoaderEntrySelected` still names the slot it
//! booted) and the `memmap=SIZE!OFFSET` reservation the RAM tier lives in (`dax.rs`).

use ringstore_bootdisk::authenticode::section;
use ringstore_bootdisk::fat;
use ringstore_bootdisk::slots::Slot;

use crate::machine::Machine;

/// The biggest UKI loaded (`update`'s own limit on what it writes).
const UKI_MAX: u64 = 96 << 20;
/// The biggest tuned boot entry read (a title, a path and one command line).
const ENTRY_MAX: u64 = 8 << 10;
/// The command-line token naming the slot a kexec jump booted.
pub const SLOT_TOKEN: &str = "ringstore_slot=";
/// The token a jump adds when it placed the reservation afresh: what the reserved memory
/// holds is from some earlier run (a firmware reboot keeps RAM), never this one's, so the
/// next PID 1 spends any seal in it rather than resume stale items.
pub const FRESH_TOKEN: &str = "ringstore_ram_tier=fresh";
/// The firmware's memory map as the kernel got it (what a kexec'd kernel gets too).
const FIRMWARE_MAP: &str = "/sys/firmware/memmap";
/// A reservation starts on a memory-section boundary (128 MiB on x86-64): the pmem driver
/// maps whole sections.
const SECTION: u64 = 128 << 20;
/// Low memory left to the kernel and its boot allocations.
const LOW_KEEP: u64 = 512 << 20;

/// The kernel's own tokens of a command line: those before a `--` (init's argv follows it).
fn kernel_tokens(line: &str) -> impl Iterator<Item = &str> {
    line.split_whitespace().take_while(|t| *t != "--")
}

/// The slot a kexec jump booted, from the running command line.
pub fn slot_from_cmdline(line: &str) -> Option<Slot> {
    kernel_tokens(line)
        .filter_map(|t| t.strip_prefix(SLOT_TOKEN))
        .last()
        .and_then(Slot::from_entry_id)
}

/// The `memmap=SIZE!OFFSET` token of `line` (legacy pmem), if any.
pub fn memmap_token(line: &str) -> Option<&str> {
    kernel_tokens(line).find(|t| t.starts_with("memmap=") && t.contains('!'))
}

/// Bytes of reserved memory a store of `memory` bytes needs as device-DAX: the arena and its
/// metadata, the device's struct pages (64 B per 4 KiB) and info block, in whole sections.
pub fn reservation_bytes(memory: u64) -> u64 {
    (memory + memory / 16 + (64 << 20)).next_multiple_of(SECTION)
}

/// Whether a device-DAX device of `size` bytes holds the arena of a store of `memory` bytes
/// (the store's own check is exact; this keeps PID 1 from handing it a device it refuses).
pub fn device_fits(size: u64, memory: u64) -> bool {
    size >= memory + memory / 32 + (16 << 20)
}

/// Where `size` bytes are reserved: the lowest section boundary from [`LOW_KEEP`] up where a
/// System RAM range of the firmware map `ram` (start, end exclusive) holds them. Low, because
/// kexec places the next kernel's initrd top-down in what is still RAM for this kernel.
pub fn place_reservation(size: u64, ram: &[(u64, u64)]) -> Option<u64> {
    ram.iter()
        .filter_map(|&(start, end)| {
            let at = start.max(LOW_KEEP).next_multiple_of(SECTION);
            (at.checked_add(size)? <= end).then_some(at)
        })
        .min()
}

/// The firmware map's System RAM ranges (start, end exclusive).
fn firmware_ram() -> Vec<(u64, u64)> {
    let hex = |p: std::path::PathBuf| {
        ringstore_sys::read_trim(p)
            .and_then(|s| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok())
    };
    let Ok(dir) = std::fs::read_dir(FIRMWARE_MAP) else {
        return Vec::new();
    };
    dir.filter_map(|e| {
        let p = e.ok()?.path();
        (ringstore_sys::read_trim(p.join("type"))? == "System RAM")
            .then(|| Some((hex(p.join("start"))?, hex(p.join("end"))? + 1)))?
    })
    .collect()
}

/// The next kernel's command line: `base` without slot, reservation or fresh tokens, then the
/// reservation (`memmap`, and [`FRESH_TOKEN`] when it was placed afresh) and the slot.
pub fn next_cmdline(base: &str, memmap: Option<(&str, bool)>, slot: Slot) -> String {
    let mut out: Vec<&str> = base
        .split(['\0'])
        .next()
        .unwrap_or("")
        .split_whitespace()
        .filter(|t| !t.starts_with(SLOT_TOKEN) && memmap_token(t).is_none() && *t != FRESH_TOKEN)
        .collect();
    let slot = format!("{SLOT_TOKEN}{}", slot.entry_id());
    let mut ours = Vec::with_capacity(3);
    if let Some((token, fresh)) = memmap {
        ours.push(token);
        if fresh {
            ours.push(FRESH_TOKEN);
        }
    }
    ours.push(&slot);
    // Before a `--`: what follows it is init's argv, which the kernel does not read.
    let at = out.iter().position(|t| *t == "--").unwrap_or(out.len());
    out.splice(at..at, ours);
    out.join(" ")
}

/// The reservation the next kernel gets: the running one (the arena already lives there),
/// else one placed for `memory`, marked fresh (this boot's arena is not in it: the jump
/// starts cold, and whatever an earlier run left there must not be resumed).
fn reservation(running: &str, memory: Option<u64>) -> Option<(String, bool)> {
    if let Some(t) = memmap_token(running) {
        return Some((t.to_string(), false));
    }
    let size = reservation_bytes(memory?);
    let at = place_reservation(size, &firmware_ram())?;
    Some((format!("memmap={}M!{}M", size >> 20, at >> 20), true))
}

/// The next kernel's line before its tokens: the target slot's tuned entry, else `running`
/// (given when the target is the running slot); `None`: the target image's own `.cmdline`.
/// A failed trial going back to the committed slot thus gets that slot's tuned line, as
/// the firmware would give it.
fn base_line(entry: Option<String>, running: Option<&str>) -> Option<String> {
    entry.or_else(|| running.map(str::to_string))
}

/// Loads `target`'s kernel, initrd and command line for the jump; what was loaded.
pub fn load(machine: &Machine, target: Slot) -> Result<String, String> {
    let (esp, booted, memory) = {
        let st = machine.state();
        (
            st.slots.esp.clone(),
            st.slots.booted,
            st.config.as_ref().map(|c| c.memory),
        )
    };
    let esp = esp.ok_or("no ESP (network or -kernel boot): no UKI to load")?;
    // Opened here rather than through `update` (which jumps through here); only read.
    let volume = esp.open(true).map_err(|e| format!("ESP: {e}"))?;
    let fs = fat::open(volume, &fat::DOS_EPOCH).map_err(|e| format!("ESP: {e}"))?;
    let image = fat::read_file(&fs, &target.path(), UKI_MAX)
        .map_err(|e| format!("ESP: {e}"))?
        .ok_or_else(|| format!("slot {target}: no {}", target.path()))?;
    let tuned = fat::read_file(&fs, &target.tuned_entry_path(), ENTRY_MAX)
        .ok()
        .flatten();
    let _ = fs.unmount();
    // Under Secure Boot the jump skips the firmware's check: the same check here, on the
    // bytes loaded (ADR 0051); a refusal sends the reboot through the firmware.
    crate::secure_boot::check_image(&image).map_err(|why| format!("slot {target}: {why}"))?;
    let part = |name: &str| -> Result<&[u8], String> {
        section(&image, name)
            .map_err(|e| format!("slot {target}: {e}"))?
            .ok_or_else(|| format!("slot {target}: the UKI has no {name} section"))
    };
    let running = crate::cmdline::running_or_empty();
    // The line the firmware path would give: the slot's tuned entry (the arguments its tuning
    // wrote for the next boot, e.g. `nohz_full=`; systemd-stub ignores an entry's options
    // under Secure Boot; `update` removes the entry of the slot it writes), else this boot's
    // whole line again for the same slot, else the image's own line.
    let entry_line = tuned
        .as_deref()
        .filter(|_| !crate::secure_boot::SecureBoot::read().on())
        .and_then(|e| std::str::from_utf8(e).ok())
        .and_then(ringstore_bootdisk::slots::entry_options)
        .map(str::to_string);
    let same = Some(target) == booted;
    let base = match base_line(entry_line, same.then_some(running)) {
        Some(line) => line,
        None => String::from_utf8_lossy(part(".cmdline")?).into_owned(),
    };
    let memmap = reservation(running, memory);
    let line = next_cmdline(
        &base,
        memmap.as_ref().map(|(t, fresh)| (t.as_str(), *fresh)),
        target,
    );
    ringstore_sys::kexec_file_load(part(".linux")?, part(".initrd")?, &line)
        .map_err(|e| format!("kexec_file_load: {e}"))?;
    Ok(format!("slot {target}'s kernel loaded ({line})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_line_replaces_slot_and_reservation_tokens() {
        let base = "console=ttyS0 memmap=256M!1G ringstore_slot=ringstore-a.efi quiet\0\0";
        let line = next_cmdline(base, Some(("memmap=384M!1536M", false)), Slot::B);
        assert_eq!(
            line,
            "console=ttyS0 quiet memmap=384M!1536M ringstore_slot=ringstore-b.efi"
        );
        // A reservation placed afresh says so once; the next jump (same reservation) drops it.
        let fresh = next_cmdline("console=ttyS0", Some(("memmap=384M!1536M", true)), Slot::A);
        assert_eq!(
            fresh,
            "console=ttyS0 memmap=384M!1536M ringstore_ram_tier=fresh ringstore_slot=ringstore-a.efi"
        );
        let again = next_cmdline(&fresh, Some(("memmap=384M!1536M", false)), Slot::A);
        assert!(!again.contains(FRESH_TOKEN), "{again}");
        // The kernel reads nothing after `--` (init's argv): the tokens go before it.
        let split = next_cmdline(
            "console=ttyS0 -- single",
            Some(("memmap=1M!1G", false)),
            Slot::A,
        );
        assert_eq!(
            split,
            "console=ttyS0 memmap=1M!1G ringstore_slot=ringstore-a.efi -- single"
        );
        assert_eq!(slot_from_cmdline(&line), Some(Slot::B));
        assert_eq!(memmap_token(&line), Some("memmap=384M!1536M"));
        assert_eq!(slot_from_cmdline("console=ttyS0"), None);
        assert_eq!(memmap_token("memmap=exactmap mem=1G"), None);
        // After `--` a token is init's argument, not the kernel's.
        assert_eq!(memmap_token("quiet -- memmap=1M!1G"), None);
        assert_eq!(
            slot_from_cmdline("quiet -- ringstore_slot=ringstore-b.efi"),
            None
        );
    }

    #[test]
    fn the_base_line_is_the_slots_tuned_entry_first() {
        let tuned = Some("console=ttyS0 nohz_full=1".to_string());
        // Back to the committed slot from a trial: its tuned entry, not the image's line.
        assert_eq!(base_line(tuned.clone(), None), tuned);
        assert_eq!(base_line(tuned.clone(), Some("running")), tuned);
        assert_eq!(base_line(None, Some("running")).as_deref(), Some("running"));
        assert_eq!(base_line(None, None), None);
    }

    #[test]
    fn a_reservation_sits_at_the_lowest_section_that_holds_it() {
        let ram = [(0x10_0000, 0x8000_0000), (0x1_0000_0000, 0x1_8000_0000)];
        let size = reservation_bytes(256 << 20);
        assert_eq!(size % SECTION, 0);
        assert!(size >= (256 << 20) + (256 << 20) / 16);
        let at = place_reservation(size, &ram).unwrap();
        assert_eq!(at, LOW_KEEP);
        // A first range too small (or all below the kept low memory): the next one.
        let at = place_reservation(size, &[(0, 0x3000_0000), (0x1_0000_1000, 0x1_8000_0000)]);
        assert_eq!(at, Some(0x1_0800_0000));
        // Too big for any range above the kept low memory: none.
        assert_eq!(place_reservation(4 << 30, &ram), None);
        assert_eq!(place_reservation(size, &[(0, LOW_KEEP)]), None);
    }

    #[test]
    fn a_device_fits_the_store_it_was_reserved_for() {
        for memory in [64 << 20, 256 << 20, 8 << 30] {
            // The device loses up to ~1.6% to struct pages and 2 MiB to the info block.
            let device = reservation_bytes(memory) - reservation_bytes(memory) / 60 - (2 << 20);
            assert!(device_fits(device, memory), "{memory}");
        }
        assert!(!device_fits(64 << 20, 64 << 20));
    }
}
