//! What PID 1 knows about the machine after setup: plain data, filled in by the boot sequence
//! and read by the console, the trial verdict and shutdown through [`crate::machine::Machine`].
//! It imports only the types it is made of, from modules that know nothing of it.

use ringstore_bootdisk::slots::{Slot, Trial};

use crate::bootdisk::Found;
use crate::layers::Layers;
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
    /// The data device's encryption as PID 1 decided it at boot (ADR 0053).
    pub data_at_rest: Option<crate::data_seal::AtRest>,
    /// The data partition grown to the end of its disk at this boot, said how.
    pub data_grown: Option<String>,
    /// What the RAM tier is kept in across a kexec reboot, or why it is not (`ram_tier.rs`).
    pub ram_tier: Option<String>,
    pub server: Option<Box<dyn Serving>>,
    /// Where each configuration key came from (image, config partition, kernel command line).
    pub layers: Layers,
    /// The A/B slots of disk.img (ADR 0025).
    pub slots: SlotsState,
    /// The config partition's console keys as boot read them (`Err`: why not), until the
    /// console loads its credentials.
    pub partition_keys: Option<Result<String, String>>,
    /// Where boot's host name came from (`hostname::Source::describe`).
    pub hostname_from: Option<String>,
    /// The config partition's ringstore.toml: used, refused (and why) or absent.
    pub partition_file: crate::config_partition::PartitionFile,
    /// The config partition, when boot found one (the console's `certs reload` reads it again).
    pub config_partition: Option<Found>,
    /// The config partition's TLS files as boot found them: `None` absent, `Ok` installed in
    /// `tls_files::RUN_DIR`, `Err` refused (why).
    pub tls_files: Option<Result<(), String>>,
    /// The config partition's `/auth/users` and `/auth/tokens` as boot found them: `None`
    /// absent, `Ok` installed in `auth_files::RUN_DIR`, `Err` refused (why).
    pub auth_files: Option<Result<(), String>>,
    /// Worker CPU isolation and the boot arguments this boot gave the next (`tuning/isolation.rs`).
    pub isolation: Isolation,
}

/// The A/B slots as this boot found them (`update::boot_state`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SlotsState {
    /// Where the ESP is; `None` on a boot without disk.img (QEMU -kernel, PXE).
    pub esp: Option<Found>,
    pub booted: Option<Slot>,
    pub committed: Option<Slot>,
    pub trial: Option<Trial>,
    /// This boot is a trial that has not been decided yet.
    pub trying: bool,
    /// The token the canary expects under `update::CANARY_KEY` (from the trial record).
    pub canary_token: Option<String>,
}

/// What boot did to isolate the worker CPUs at run time.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Runtime {
    /// Nothing to isolate (no placement, or every worker shares the housekeeping CPU).
    #[default]
    NotNeeded,
    /// `isolcpus=` on the command line: isolation is the operator's.
    LeftToIsolcpus,
    /// The isolated partition holds the CPUs.
    Partition,
    /// The partition could not be made: why.
    Failed(String),
}

/// What boot did about the boot arguments the next boot needs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum BootArgs {
    /// The running kernel has them (or none are needed).
    #[default]
    InEffect,
    /// Written to the ESP for the next boot.
    Pending { entry: String, options: String },
    /// Needed but not written: why.
    NotWritten(String),
    /// Needed, but Secure Boot is on: systemd-stub ignores a boot entry's options, so only
    /// the signed image's own command line can carry this token (ADR 0051).
    SignedImageOnly { token: String },
}

/// The isolation as boot left it (kept in PID 1's state for `tuning`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Isolation {
    /// The CPUs to isolate (`tuning::isolation::wanted`).
    pub wanted: Vec<usize>,
    pub runtime: Runtime,
    pub boot_args: BootArgs,
}
