//! sync(2) and reboot(2), through rustix: PID 1's power off, reboot and ctrl-alt-del setting.

use std::io;

pub use rustix::system::RebootCommand;

/// Flushes every filesystem's dirty data (sync(2)).
pub fn sync() {
    rustix::fs::sync();
}

/// reboot(2) with `cmd`; returns only on failure (or for [`RebootCommand::CadOff`]).
pub fn reboot(cmd: RebootCommand) -> io::Result<()> {
    Ok(rustix::system::reboot(cmd)?)
}

/// Makes ctrl-alt-del send SIGINT to PID 1 instead of rebooting at once.
pub fn disable_ctrl_alt_del() -> io::Result<()> {
    reboot(RebootCommand::CadOff)
}
