//! The hardware watchdog a trial boot holds open (`update/watchdog.rs` feeds it): kept here,
//! apart from `update` and `power`, so that a kexec jump (`power.rs`) can stop it first.

use std::fs::File;
use std::io::Write;
use std::sync::Mutex;

use crate::info;

/// The open watchdog while a trial holds it: a kexec jump carries the running timer into the
/// next kernel, whose PID 1 (the committed slot's) does not feed it, so [`disarm`] stops it
/// first.
static DEVICE: Mutex<Option<File>> = Mutex::new(None);

/// Stops the trial's watchdog with the magic close, if one is armed; before a kexec jump.
pub fn disarm() {
    let dev = DEVICE.lock().unwrap_or_else(|p| p.into_inner()).take();
    if let Some(mut dev) = dev {
        let _ = dev.write_all(b"V");
        info!("update: watchdog stopped before the jump");
    }
}

/// Feeds the armed watchdog once: `V` (the magic close, ending the trial's hold) when
/// `stop`; false when nothing is armed any more.
pub fn feed(stop: bool) -> bool {
    let mut held = DEVICE.lock().unwrap_or_else(|p| p.into_inner());
    let Some(dev) = held.as_mut() else {
        return false;
    };
    if stop {
        let _ = dev.write_all(b"V");
        *held = None;
        return false;
    }
    let _ = dev.write_all(b"\0");
    true
}

/// Holds `dev` (the opened `/dev/watchdog`) for [`feed`] and [`disarm`].
pub fn hold(dev: File) {
    *DEVICE.lock().unwrap_or_else(|p| p.into_inner()) = Some(dev);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The only test touching [`DEVICE`]: fed, then disarmed before a jump (the magic close),
    /// after which nothing is held and feeding stops.
    #[test]
    fn disarm_closes_the_held_watchdog_with_the_magic_byte() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("watchdog");
        hold(File::create(&path).unwrap());
        assert!(feed(false));
        disarm();
        assert!(!feed(false), "still held after disarm");
        disarm();
        assert_eq!(std::fs::read(&path).unwrap(), b"\0V");
    }
}
