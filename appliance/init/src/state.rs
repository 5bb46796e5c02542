//! What PID 1 knows about the machine after setup, shared by the console and shutdown.

use std::sync::{Mutex, MutexGuard};

use crate::net::Configured;
use crate::plane::{Placement, Serving};

/// The machine as PID 1 set it up.
#[derive(Default)]
pub struct State {
    pub placement: Option<Placement>,
    /// Huge pages the serving node holds after reservation.
    pub hugepages: u64,
    pub configured: Vec<Configured>,
    /// The NICs whose IRQs were placed, and those IRQs.
    pub nic_irqs: Vec<(String, Vec<u32>)>,
    pub ready_line: Option<String>,
    /// Why nothing serves (configuration error, NUMA choice, start failure).
    pub not_serving: Option<String>,
    pub config: Option<ringstore_config::Config>,
    /// Every key of the effective configuration with its origin (the console's `config`).
    pub settings: Vec<ringstore_config::Setting>,
    /// The data device as found at boot (`/dev/vda: block device, 64 MiB`).
    pub data_device: Option<String>,
    pub server: Option<Box<dyn Serving>>,
    /// Where each configuration key came from (image, config partition, kernel command line).
    pub layers: crate::layers::Layers,
    /// The A/B slots of disk.img (ADR 0025).
    pub slots: crate::update::SlotsState,
    /// The config partition's console keys as boot read them (`Err`: why not), until the
    /// console loads its credentials.
    pub partition_keys: Option<Result<String, String>>,
    /// The config partition's ringstore.toml: used, refused (and why) or absent.
    pub partition_file: crate::config_partition::PartitionFile,
    /// Worker CPU isolation and the boot arguments this boot gave the next (`tuning/isolation.rs`).
    pub isolation: crate::tuning::isolation::Isolation,
}

static STATE: Mutex<Option<State>> = Mutex::new(None);

/// Locks the shared state (created empty on first use; a poisoned lock is still usable).
pub fn lock() -> StateGuard {
    let mut guard = STATE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if guard.is_none() {
        *guard = Some(State::default());
    }
    StateGuard(guard)
}

pub struct StateGuard(MutexGuard<'static, Option<State>>);

impl std::ops::Deref for StateGuard {
    type Target = State;
    fn deref(&self) -> &State {
        self.0.as_ref().expect("state is created in lock()")
    }
}

impl std::ops::DerefMut for StateGuard {
    fn deref_mut(&mut self) -> &mut State {
        self.0.as_mut().expect("state is created in lock()")
    }
}
