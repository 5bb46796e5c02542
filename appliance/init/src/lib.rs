//! PID 1 of the appliance: mounts, configuration from the kernel command line, network, NUMA, console, shutdown.
//!
//! [`run`] is the whole of PID 1. Boot order: mounts → console and /dev/kmsg → capabilities
//! narrowed to the boot set → signals → kernel command line → host name → network → the log sink
//! (ADR 0045) → NUMA placement
//! (the serving node chosen as `ringstore serve` chooses it, docs/ARCHITECTURE.md "NUMA
//! placement") → huge pages on the serving node → IRQ affinity → the data device's node (never
//! mounted: the server owns it) → the data plane on a privilege-less thread → capabilities
//! narrowed to CAP_SYS_BOOT → the serial console, forever (ADR-0015 for the capability sets).
//! Nothing here exits or panics out: every stage runs under `catch_unwind`, and a fatal error
//! reboots after a delay (or stays at the console with `ringstore.on_fatal=halt`). A data device
//! that is configured but missing, refused or unrecoverable is fatal: the box was told to be
//! durable and must not serve from RAM alone.
//!
//! What the stages set up is recorded in one [`machine::Machine`] that [`run`] creates and hands,
//! as an argument, to the stages, the signal and watchdog threads, the trial verdict, the console
//! and shutdown: there is no global state.
//!
//! No `unsafe` here: every syscall goes through `ringstore_sys` (ADR-0017).
#![forbid(unsafe_code)]

pub mod auth_files;
pub mod bootdisk;
pub mod cmdline;
pub mod config_partition;
pub mod console;
pub mod data_device;
pub mod data_seal;
pub mod fetch;
pub mod hostname;
pub mod hugepages;
pub mod hw_watchdog;
pub mod irq;
pub mod kexec;
pub mod layers;
pub mod log;
pub mod log_sink;
pub mod machine;
pub mod metrics_handoff;
pub mod mounts;
pub mod net;
pub mod netstat;
pub mod plane;
pub mod power;
pub mod privs;
pub mod ram_tier;
pub mod secure_boot;
pub mod signal_thread;
pub mod sizing;
pub mod slots_report;
pub mod state;
pub mod sysinfo;
pub mod threads;
pub mod tls_files;
pub mod tuning;
pub mod update;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use cmdline::OnFatal;
use machine::Machine;

/// A boot failure PID 1 cannot work around.
struct Fatal(String);

/// Runs PID 1. Never returns.
pub fn run() -> ! {
    std::panic::set_hook(Box::new(|info| {
        let thread = std::thread::current().name().unwrap_or("?").to_string();
        log::log(
            log::Level::Error,
            &format!("panic in thread {thread}: {info}"),
        );
    }));
    signal_thread::block();
    let machine = Arc::new(Machine::default());
    let mut on_fatal = OnFatal::Reboot;
    let booted = catch_unwind(AssertUnwindSafe(|| boot(&machine, &mut on_fatal)));
    // A trial boot of a new slot is decided here, ready or not (ADR 0025).
    let _ = catch_unwind(|| update::decide_trial(&machine));
    // Then the boot arguments the next boot needs (the trial's verdict may have rebooted).
    let _ = catch_unwind(|| tuning::isolation::after_trial(&machine));
    match booted {
        Ok(Ok(())) => {}
        Ok(Err(Fatal(what))) => power::fatal(&machine, on_fatal, &what),
        Err(_) => power::fatal(&machine, on_fatal, "panic during boot"),
    }
    // From here on PID 1's main thread only runs the console: reboot(2) is all it needs. Before
    // the first prompt, so whoever sees the prompt sees the narrowed sets in `threads`.
    privs::restrict_thread_or_log(privs::Role::Console);
    let partition_keys = machine.state().partition_keys.take();
    console::session::load_credentials(partition_keys);
    loop {
        // run_loop never returns; a panic escaping it restarts it.
        let _ = catch_unwind(|| console::run_loop(&machine));
    }
}

fn boot(machine: &Arc<Machine>, on_fatal: &mut OnFatal) -> Result<(), Fatal> {
    let skipped = mounts::mount_all().map_err(|e| Fatal(e.to_string()))?;
    // The kernel opens /dev/console as fds 0-2 when the initramfs has that node; if it did not,
    // open it now that devtmpfs is mounted.
    ringstore_sys::ensure_console_fds();
    let no_kmsg = log::attach_kmsg();
    info!(
        "ringstore-init {} starting (kernel {})",
        env!("CARGO_PKG_VERSION"),
        sysinfo::kernel_release()
    );
    if let Some(why) = no_kmsg {
        info!("{why}");
    }
    for skip in skipped {
        warn!("{skip} (optional)");
    }
    // Before any thread starts: every thread PID 1 spawns inherits at most the boot set.
    privs::restrict_thread_or_log(privs::Role::Boot);
    signal_thread::spawn_waiter(Arc::clone(machine));
    power::disable_ctrl_alt_del();
    raise_limits();

    let running = cmdline::running().map_err(Fatal)?;
    let line = effective_cmdline(machine, running);
    // Which A/B slot booted and whether it is on trial (mounts efivarfs: boot capabilities).
    let slots = update::boot_state();
    let trying = slots.trying;
    machine.state().slots = slots;
    if trying {
        update::arm_watchdog(Arc::clone(machine));
    }
    let options = match cmdline::split(&line) {
        Ok((options, _)) => options,
        Err(err) => {
            error!("{err}; using ip=dhcp");
            cmdline::InitOptions {
                ip: cmdline::IpSetting::Dhcp { device: None },
                on_fatal: OnFatal::Reboot,
            }
        }
    };
    *on_fatal = options.on_fatal;
    let layers = machine.state().layers.config_layers();
    let config = match ringstore_config::origin::resolve(&layers) {
        Ok(resolved) => {
            let config = resolved.config.clone();
            machine.state().settings = resolved.settings;
            Some(config)
        }
        Err(err) => {
            error!("configuration: {err}");
            not_serving(machine, format!("configuration: {err}"));
            None
        }
    };

    // Before the network (a lease keeper may log it) and the server (its `stats` reads it).
    let named = hostname::apply(config.as_ref(), &options.ip);
    machine.state().hostname_from = Some(named.describe());
    let configured = net::bring_up(&options.ip);
    machine.state().configured = configured;
    // From here the log leaves the box too (ADR 0045), the boot's lines so far first.
    if let Some(config) = &config {
        log_sink::start(config);
    }

    if let Some(mut config) = config {
        if config.data.as_deref() == Some(std::path::Path::new("auto")) {
            match data_partition(machine) {
                Ok(node) => config.data = Some(node),
                Err(why) => return Err(data_device_fatal(machine, &why)),
            }
        }
        machine.state().config = Some(config.clone());
        serve(machine, &config)?;
    }
    Ok(())
}

/// `ringstore.data=auto`: the data partition found by type, grown to the end of a bigger
/// disk first when it is still blank (`bootdisk::grow_data_partition`); its device node.
fn data_partition(machine: &Machine) -> Result<std::path::PathBuf, String> {
    let found = bootdisk::find_data_partition(&ringstore_bootdisk::Layout::builtin())?;
    match bootdisk::grow_data_partition(&ringstore_bootdisk::Layout::builtin(), &found) {
        Ok(Some(grown)) => {
            info!("data {grown}");
            machine.state().data_grown = Some(grown);
        }
        Ok(None) => {}
        Err(why) => warn!("data partition not grown: {why}"),
    }
    found.node(data_device::NODE_WAIT)
}

/// Whether no configuration layer set `memory` (its resolved setting is the built-in
/// default): the appliance then sizes it to the machine.
fn memory_from_default(machine: &Machine) -> bool {
    let state = machine.state();
    let memory = state.settings.iter().find(|s| s.key == "memory");
    memory.is_some_and(|s| s.origin == ringstore_config::Origin::Default)
}

/// `memory` from the serving node's RAM (no layer set it): logged, recorded as the
/// configuration in use and as the key's setting (origin `machine`).
fn size_memory(
    machine: &Machine,
    config: &ringstore_config::Config,
    placement: &plane::Placement,
    node_total: u64,
) -> ringstore_config::Config {
    let (memory, reserve) = sizing::memory_for(node_total, placement.workers.len(), config);
    info!(
        "memory {} MiB, sized to node {}: {} MiB, less {} MiB kept for the kernel, PID 1 and connections (set memory to choose)",
        memory >> 20,
        placement.node,
        node_total >> 20,
        reserve >> 20
    );
    let sized = ringstore_config::Config {
        memory,
        ..config.clone()
    };
    sized_by_machine(machine, &sized, "memory", memory);
    sized
}

/// Records `sized` as the configuration in use and `key`'s setting as `bytes`, origin
/// `machine` (what `config` and `status` show).
fn sized_by_machine(machine: &Machine, sized: &ringstore_config::Config, key: &str, bytes: u64) {
    let mut state = machine.state();
    state.config = Some(sized.clone());
    if let Some(s) = state.settings.iter_mut().find(|s| s.key == key) {
        s.value = format!("{}MiB", bytes >> 20);
        s.origin = ringstore_config::Origin::Machine;
    }
}

/// The command line after the configuration layers (`layers.rs`): on a disk boot (the image
/// carries its own command line) the config partition's `/ringstore.toml` sits between the
/// image's keys and the keys added on the running kernel's command line. A config partition
/// file that cannot be read, parsed or resolved is ignored whole: the box still boots, on the
/// image's settings, and says why in the log, `status` and `tuning` (`config_partition.rs`).
/// The layers, the partition's console keys and what became of its file are recorded in
/// `machine`.
fn effective_cmdline(machine: &Machine, running: &str) -> String {
    use config_partition::PartitionFile;
    let image = std::fs::read_to_string(layers::IMAGE_CMDLINE).unwrap_or_default();
    let mut partition = None;
    let mut tls = Vec::new();
    let mut auth = Vec::new();
    let mut file = String::new();
    if !image.trim().is_empty() {
        let layout = ringstore_bootdisk::Layout::builtin();
        match bootdisk::wait_for(
            &layout,
            ringstore_bootdisk::Role::Config,
            bootdisk::DISK_WAIT,
        ) {
            None => info!("no config partition found; using the image's command line"),
            Some(found) => {
                // The console's keys from the partition, for load_credentials after boot.
                machine.state().partition_keys = bootdisk::read_authorized_keys(&found).transpose();
                tls = tls_files::at_boot(machine, &found);
                auth = auth_files::at_boot(machine, &found);
                machine.state().config_partition = Some(found.clone());
                file = format!(
                    "{} partition {}: {}",
                    found.disk.display(),
                    found.number,
                    bootdisk::CONFIG_FILE
                );
                partition = Some(bootdisk::read_config(&found));
            }
        }
    }
    let refuse = |error: String| {
        let error = config_partition::reason(&error);
        error!(
            "config partition {file}: {error}; {}",
            config_partition::IGNORED
        );
        PartitionFile::Refused {
            file: file.clone(),
            error,
        }
    };
    let (text, mut outcome) = match partition {
        None | Some(Ok(None)) => (None, PartitionFile::Absent),
        Some(Err(why)) => (None, refuse(why)),
        Some(Ok(Some(text))) => (Some(text), PartitionFile::Used { file: file.clone() }),
    };
    // The certificates' and the users and tokens files' paths belong to the partition's layer:
    // checked with it. A refused ringstore.toml still leaves the users and tokens files in
    // force: a typo there must not open the data ports to everyone.
    let with_auth = |mut layers: layers::Layers| {
        layers.under_partition(auth.clone());
        layers
    };
    let with_tls = layers::Layers::build(running, &image, text.as_deref()).map(|mut layers| {
        layers.under_partition(tls);
        with_auth(layers)
    });
    let built = match with_tls {
        Ok(layers) => match layers.partition_fault(running) {
            Some(fault) => {
                outcome = refuse(fault);
                Ok(with_auth(layers.without_partition()))
            }
            None => Ok(layers),
        },
        Err(err) => {
            outcome = refuse(err.to_string());
            layers::Layers::build(running, &image, None).map(with_auth)
        }
    };
    if let PartitionFile::Used { file } = &outcome {
        info!("config partition {file} read");
    }
    machine.state().partition_file = outcome;
    match built {
        Ok(layers) => {
            let line = layers.effective(running);
            machine.state().layers = layers;
            line
        }
        Err(_) => running.to_string(),
    }
}

/// `sub_memory = auto`: each other node's region sized as `memory` is (sizing.rs), logged,
/// recorded as the configuration in use and as the key's setting (origin `machine`). With no
/// other node it stays unsized, and the runtime refuses it with its reason.
fn size_sub_memory(
    machine: &Machine,
    config: &ringstore_config::Config,
    placement: &plane::Placement,
    totals: &[(u32, u64)],
) -> ringstore_config::Config {
    let workers = placement.workers.len();
    let Some((size, node)) = sizing::sub_memory_for(totals, placement.node, workers, config) else {
        return config.clone();
    };
    let total = sizing::total_of(totals, node).unwrap_or(0);
    info!(
        "sub_memory {} MiB on each other node, sized to node {node}: {} MiB less the reserve (set sub_memory to choose)",
        size >> 20,
        total >> 20
    );
    let sized = ringstore_config::Config {
        sub_memory: ringstore_config::SubMemory::Bytes(size),
        ..config.clone()
    };
    sized_by_machine(machine, &sized, "sub-memory", size);
    sized
}

/// The configuration with the sizes that follow the machine (sizing.rs): `memory` when no
/// layer set it, `sub_memory` when it is `auto`; `None` when neither applies.
fn size_to_the_machine(
    machine: &Machine,
    config: &ringstore_config::Config,
    placement: &plane::Placement,
) -> Option<ringstore_config::Config> {
    let memory = memory_from_default(machine);
    let auto = config.sub_memory == ringstore_config::SubMemory::Auto;
    if !memory && !auto {
        return None;
    }
    // One walk of /sys/devices/system/node serves both sizes.
    let totals = sizing::node_totals();
    let mut sized = None;
    if memory {
        if let Some(total) = sizing::total_of(&totals, placement.node) {
            sized = Some(size_memory(machine, config, placement, total));
        }
    }
    if auto {
        let base = sized.as_ref().unwrap_or(config);
        sized = Some(size_sub_memory(machine, base, placement, &totals));
    }
    sized
}

fn not_serving(machine: &Machine, why: String) {
    machine.state().not_serving = Some(why);
}

/// Reserves `wanted` huge pages on `node`; how many it got (a shortfall is a warning, not a
/// refusal: the server still starts).
fn reserve_huge_pages(node: u32, wanted: u64) -> u64 {
    let got = match hugepages::reserve(node, wanted) {
        Ok(got) => got,
        Err(err) => {
            warn!("huge pages on node {node}: {err}");
            0
        }
    };
    if got < wanted {
        warn!("node {node} holds {got} of the {wanted} huge pages asked for");
    } else {
        info!("node {node}: {got} huge pages of 2 MiB reserved");
    }
    got
}

/// Placement, huge pages, IRQs, then the server. Failures are logged and leave the console up,
/// except a data device that cannot be used: that is fatal (the `on_fatal` policy).
fn serve(machine: &Machine, config: &ringstore_config::Config) -> Result<(), Fatal> {
    // The partition holds users or tokens that could not be read: serving without them would
    // open the data ports to everyone (auth_files.rs).
    let unread = machine.state().auth_files.clone().and_then(Result::err);
    if let Some(why) = unread {
        let why = format!("auth: {why}: not serving without the config partition's /auth/ files");
        error!("{why}");
        not_serving(machine, why);
        return Ok(());
    }
    let placement = match plane::place(config) {
        Ok(p) => p,
        Err(err) => {
            error!("{err}");
            not_serving(machine, err);
            return Ok(());
        }
    };
    let sized = size_to_the_machine(machine, config, &placement);
    let config = sized.as_ref().unwrap_or(config);
    // The arena in the reserved memory kept across kexec reboots, when this boot has one.
    let kept = ram_tier::attach(machine, config);
    let config = kept.as_ref().unwrap_or(config);
    info!(
        "NUMA node {}: workers on CPUs {}, housekeeping on CPUs {}",
        placement.node,
        ringstore_sys::format_cpus(&placement.workers),
        ringstore_sys::format_cpus(&placement.housekeeping)
    );
    // In the reserved memory the device's own 2 MiB pages hold the arena: none from the pool.
    let wanted = if kept.is_some() {
        0
    } else {
        hugepages::pages_for(config.memory)
    };
    let got = reserve_huge_pages(placement.node, wanted);
    let nic_irqs = place_irqs(&placement);
    {
        let mut state = machine.state();
        state.nic_irqs = nic_irqs;
        state.placement = Some(placement.clone());
        state.hugepages = got;
    }
    if let Some(path) = &config.data {
        // The driver creates the node in devtmpfs; PID 1 never mounts or opens it itself.
        match data_device::wait_for_node(path, data_device::NODE_WAIT) {
            Ok(described) => {
                info!("data device {described}");
                machine.state().data_device = Some(described);
            }
            Err(why) => return Err(data_device_fatal(machine, &why)),
        }
    }
    let sealed = config
        .data
        .as_deref()
        .and_then(|path| data_at_rest(machine, config, path));
    let config = sealed.as_ref().unwrap_or(config);
    let started = plane::start(config);
    data_seal::forget_key_file();
    if !placement.housekeeping.is_empty() {
        // PID 1's own thread keeps off the worker CPUs from here on. Only after the start: the
        // server's threads inherit the starting thread's CPU set.
        set_affinity(&placement.housekeeping);
    }
    if started.is_ok() {
        // The workers are pinned now: their CPUs become an isolated partition.
        tuning::isolation::at_start(machine, &placement);
    }
    match started {
        Ok(server) => {
            let ready = server.ready_line();
            // `ringstore: ready memcache=IP:PORT http=IP:PORT`, once, on the console and in `log`.
            info!("{ready}");
            if let (Some(shipper), Some(counter)) = (log::shipper(), server.log_drop_counter()) {
                shipper.count_drops_in(counter);
            }
            {
                let mut state = machine.state();
                state.ready_line = Some(ready);
                state.server = Some(server);
            }
            metrics_handoff::at_start(machine, config);
        }
        Err(plane::StartError::DataDevice(why)) => return Err(data_device_fatal(machine, &why)),
        Err(plane::StartError::Other(why)) => {
            error!("server: {why}");
            not_serving(machine, why);
        }
    }
    Ok(())
}

/// The data device's encryption (ADR 0053): the configuration the server starts with when the
/// TPM gave a key (`data_key` set) or refused it (`data` dropped: RAM only), recorded for
/// `status` and `tuning`.
fn data_at_rest(
    machine: &Machine,
    config: &ringstore_config::Config,
    path: &std::path::Path,
) -> Option<ringstore_config::Config> {
    let tpm = std::path::Path::new(ringstore_tpm::DEVICE);
    let secure_boot = crate::secure_boot::SecureBoot::read().on();
    let at_rest = data_seal::prepare(path, tpm, config.data_key.is_some(), secure_boot);
    if at_rest.warns() {
        warn!("data at rest {}", at_rest.line());
    } else {
        info!("data at rest {}", at_rest.line());
    }
    let changed = match &at_rest {
        data_seal::AtRest::Sealed { key_file, .. } => Some(ringstore_config::Config {
            data_key: Some(key_file.clone()),
            ..config.clone()
        }),
        data_seal::AtRest::Refused(_) => Some(ringstore_config::Config {
            // RAM only: the server never opens the device, so it stays byte for byte.
            data: None,
            data_size: None,
            ..config.clone()
        }),
        data_seal::AtRest::AsConfigured { .. } => None,
    };
    let mut state = machine.state();
    if matches!(at_rest, data_seal::AtRest::Refused(_)) {
        state.data_device = None;
    }
    state.data_at_rest = Some(at_rest);
    changed
}

/// A data device that cannot be used: nothing serves, and the caller follows
/// `ringstore.on_fatal`, which logs the one console line (`ringstore: fatal: data device ...`).
fn data_device_fatal(machine: &Machine, why: &str) -> Fatal {
    let line = data_device::appliance_message(why);
    not_serving(machine, line.clone());
    Fatal(line)
}

/// Steers the NICs' queue IRQs to the worker CPUs and the rest to housekeeping; returns each
/// NIC with its IRQs, for the console's `irq` and the tuning verifier.
fn place_irqs(placement: &plane::Placement) -> Vec<(String, Vec<u32>)> {
    let interrupts =
        irq::parse_interrupts(&std::fs::read_to_string("/proc/interrupts").unwrap_or_default());
    let all: Vec<u32> = interrupts.iter().map(|l| l.irq).collect();
    let mut nic_irqs = Vec::new();
    let mut by_nic = Vec::new();
    for nic in net::link::ethernet_nics() {
        let irqs = irq::nic_irqs(&nic, &interrupts, std::path::Path::new("/sys/class/net"));
        nic_irqs.extend(irqs.iter().copied());
        by_nic.push((nic, irqs));
    }
    let plan = irq::plan(
        &all,
        &nic_irqs,
        |irq| irq::queue_of(irq, &interrupts),
        &placement.workers,
        &placement.housekeeping,
    );
    let (applied, refused) = irq::apply(&plan);
    if !placement.housekeeping.is_empty() {
        let _ = std::fs::write(
            "/proc/irq/default_smp_affinity",
            ringstore_sys::cpumask_hex(&placement.housekeeping),
        );
    }
    info!(
        "IRQ affinity: {} NIC IRQs on worker CPUs, {applied} set, {refused} refused by the kernel",
        nic_irqs.len()
    );
    by_nic
}

fn set_affinity(cpus: &[usize]) {
    if let Err(err) = ringstore_sys::set_affinity(cpus) {
        warn!("cannot move PID 1 to the housekeeping CPUs: {err}");
    }
}

/// The store locks huge pages and io_uring buffers; connections need descriptors.
fn raise_limits() {
    if let Err(err) = ringstore_sys::set_memlock_unlimited() {
        warn!("setrlimit(RLIMIT_MEMLOCK): {err}");
    }
    if let Err(err) = ringstore_sys::set_nofile_limit(1 << 20) {
        warn!("setrlimit(RLIMIT_NOFILE): {err}");
    }
}
