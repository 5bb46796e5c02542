//! The hardware watchdog during a trial boot: fed while the trial is undecided, stopped once
//! it is committed or before a kexec jump leaves it, left to fire past [`TRIAL_LIMIT`].

use std::fs::File;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::machine::Machine;
use crate::{error, info, warn};

/// How long a trial boot may take from PID 1's start to its verdict; past it the watchdog is
/// no longer fed and resets the machine.
pub const TRIAL_LIMIT: Duration = Duration::from_secs(240);

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
fn feed(stop: bool) -> bool {
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

/// During a trial: feeds the hardware watchdog until `machine`'s trial is decided or
/// [`TRIAL_LIMIT`] has passed.
pub fn arm_watchdog(machine: Arc<Machine>) {
    let dev = match std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/watchdog")
    {
        Ok(dev) => dev,
        Err(err) => {
            warn!("update: no hardware watchdog (/dev/watchdog: {err}): a hang of this trial will not roll back by itself");
            return;
        }
    };
    info!(
        "update: watchdog armed for the trial ({} s)",
        TRIAL_LIMIT.as_secs()
    );
    *DEVICE.lock().unwrap_or_else(|p| p.into_inner()) = Some(dev);
    let started = Instant::now();
    let _ = std::thread::Builder::new()
        .name("watchdog".into())
        .spawn(move || {
            while started.elapsed() < TRIAL_LIMIT {
                // Decided and committed: the magic close stops the watchdog; disarmed
                // before a jump: nothing left to feed.
                let decided = !machine.state().slots.trying;
                if !feed(decided) {
                    return;
                }
                std::thread::sleep(Duration::from_secs(5));
            }
            error!(
                "update: the trial took longer than {} s; the watchdog will reset the machine",
                TRIAL_LIMIT.as_secs()
            );
            // Stop feeding: held open without writes (in DEVICE), the timer fires.
            loop {
                std::thread::sleep(Duration::from_secs(3600));
            }
        });
}
