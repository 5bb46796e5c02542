//! The hardware watchdog during a trial boot: fed while the trial is undecided, stopped once
//! it is committed or before a kexec jump leaves it, left to fire past [`TRIAL_LIMIT`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::hw_watchdog::{feed, hold};

use crate::machine::Machine;
use crate::{error, info, warn};

/// How long a trial boot may take from PID 1's start to its verdict; past it the watchdog is
/// no longer fed and resets the machine.
pub const TRIAL_LIMIT: Duration = Duration::from_secs(240);

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
    hold(dev);
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
            // Stop feeding: held open without writes (`hw_watchdog`), the timer fires.
            loop {
                std::thread::sleep(Duration::from_secs(3600));
            }
        });
}
