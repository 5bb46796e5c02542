//! The one handle on what PID 1 set up: [`run`](crate::run) creates it, and it is passed, never
//! reached for, to each boot stage, the signal and watchdog threads, the console's commands, the
//! trial verdict and shutdown. The threads share it, hence the lock; nothing else is global.

use std::sync::{Mutex, MutexGuard};

use crate::plane::Serving;
use crate::state::State;

/// The machine's [`State`] behind one lock.
#[derive(Default)]
pub struct Machine {
    state: Mutex<State>,
}

impl Machine {
    pub fn new(state: State) -> Machine {
        Machine {
            state: Mutex::new(state),
        }
    }

    /// Locks the state. A lock poisoned by a panicking console command is still used: PID 1
    /// must keep answering, and every writer leaves the state whole between its statements.
    pub fn state(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Takes the running server out, for shutdown (`None`: nothing serves, or it is already
    /// being stopped).
    pub fn take_server(&self) -> Option<Box<dyn Serving>> {
        self.state().server.take()
    }

    /// `f` with the running server, under the lock; "not serving" without one.
    pub fn with_server<T>(
        &self,
        f: impl FnOnce(&dyn Serving) -> Result<T, String>,
    ) -> Result<T, String> {
        match &self.state().server {
            Some(server) => f(server.as_ref()),
            None => Err("not serving".into()),
        }
    }
}
