//! [`Ctx`], what every console command runs with. A module of its own so that the command
//! modules (`commands.rs`, `certs.rs`, `auth.rs`, `watch.rs`) and the table all import it
//! from below, and none imports another for it (issue 37: `certs` <-> `commands`).

use std::time::Instant;

use super::session::Session;
use crate::machine::Machine;

/// What a command runs with.
pub struct Ctx<'a> {
    pub session: &'a mut Session,
    /// What PID 1 set up: placement, addresses, the running server, the slots.
    pub machine: &'a Machine,
    pub now: Instant,
    /// `--json` was given (the login phases remember it).
    pub json: bool,
}
