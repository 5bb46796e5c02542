//! The console's commands, each answering an [`Output`] (text lines and JSON fields) from
//! the [`Ctx`] they run with (`ctx.rs`). The table that names them, checks access and answers `help` is
//! `table.rs`; it calls into this file, never the other way round.

use std::time::Duration;

use serde_json::{json, Map, Value};

use super::ctx::Ctx;
use super::output::Output;
use crate::machine::Machine;
use crate::power::{self, Action};
use crate::state::State;

/// Most bytes of memcache `stats` output the console shows.
const STATS_MAX: usize = 64 << 10;

/// `status`: version, uptime, host name, placement and huge pages, isolated CPUs, memory,
/// addresses, the data device, whether it serves and its connections.
pub fn status(ctx: &mut Ctx, _: &[&str]) -> Output {
    let state = ctx.machine.state();
    let mut out = Output::new();
    status_system(&mut out, &state);
    status_placement(&mut out, &state);
    status_cpus_and_memory(&mut out);
    status_serving(&mut out, &state);
    let ram_tier = state.ram_tier.clone();
    drop(state);
    status_ram_tier(&mut out, ctx.machine, ram_tier);
    status_tls(&mut out, ctx.machine);
    out
}

/// What the RAM tier is kept in across a kexec reboot and how this start went (resumed, or
/// cold and why: a seal that did not verify, another layout).
fn status_ram_tier(out: &mut Output, machine: &Machine, kept: Option<String>) {
    let Some(kept) = kept else {
        return;
    };
    let reply = admin(machine, b"stats\r\n", STATS_MAX).unwrap_or_default();
    let start = crate::ram_tier::restart_line(&String::from_utf8_lossy(&reply));
    match &start {
        Some(start) => out.line(format!("ram tier {kept}; this start: {start}")),
        None => out.line(format!("ram tier {kept}")),
    }
    out.set("ram_tier", json!({"kept": kept, "start": start}));
}

/// Version, kernel, uptime, host name (and where it came from), the config partition's file,
/// Secure Boot and setup mode (from the firmware's variables).
fn status_system(out: &mut Output, state: &State) {
    let kernel = crate::sysinfo::kernel_release();
    let uptime = crate::sysinfo::uptime_secs();
    out.line(format!(
        "version ringstore {} (kernel {kernel})",
        env!("CARGO_PKG_VERSION")
    ));
    out.line(format!("uptime {uptime:.1} s"));
    out.line(format!("hostname {}", crate::hostname::current()));
    out.set("hostname", crate::hostname::current());
    out.set("version", env!("CARGO_PKG_VERSION"));
    out.set("kernel", kernel);
    out.set("uptime_s", json!((uptime * 10.0).round() / 10.0));
    out.set("hostname_from", json!(state.hostname_from));
    out.line(state.partition_file.status_line());
    out.set("config_partition", state.partition_file.json());
    let secure_boot = crate::secure_boot::SecureBoot::read();
    out.line(format!("secure boot {}", secure_boot.describe()));
    out.set("secure_boot", secure_boot.json());
}

/// The TLS certificate in use: subject, expiry and days left, a warning under 14 days.
fn status_tls(out: &mut Output, machine: &Machine) {
    if let Some((line, fields)) = super::certs::cert_json(machine) {
        out.line(line);
        out.set("tls_cert", fields);
    }
}

/// The serving node, its worker and housekeeping CPUs and its huge pages (`numa_node none`
/// while nothing was placed).
fn status_placement(out: &mut Output, state: &State) {
    let Some(p) = &state.placement else {
        out.line("numa_node none");
        out.set("numa_node", Value::Null);
        return;
    };
    out.line(format!("numa_node {}", p.node));
    out.line(format!(
        "worker_cpus {}",
        ringstore_sys::format_cpus(&p.workers)
    ));
    out.line(format!(
        "housekeeping_cpus {}",
        ringstore_sys::format_cpus(&p.housekeeping)
    ));
    let free = crate::hugepages::count(p.node, "free_hugepages").unwrap_or(0);
    out.set("numa_node", p.node);
    out.set("worker_cpus", json!(p.workers));
    out.set("housekeeping_cpus", json!(p.housekeeping));
    out.set("hugepages", state.hugepages);
    out.set("hugepages_free", free);
    out.line(format!(
        "hugepages node {}: {} x 2 MiB ({} free)",
        p.node, state.hugepages, free
    ));
}

/// The kernel's isolated CPUs (when there are any) and the memory total and available.
fn status_cpus_and_memory(out: &mut Output) {
    if let Some(isolated) =
        ringstore_sys::read_trim("/sys/devices/system/cpu/isolated").filter(|s| !s.is_empty())
    {
        out.line(format!("isolated_cpus {isolated}"));
        out.set(
            "isolated_cpus",
            json!(ringstore_sys::parse_cpulist(&isolated)),
        );
    }
    let mib = |field| crate::sysinfo::meminfo_bytes(field).unwrap_or(0) >> 20;
    out.line(format!(
        "memory {} MiB total, {} MiB available",
        mib("MemTotal"),
        mib("MemAvailable")
    ));
    out.set("memory_total_mib", mib("MemTotal"));
    out.set("memory_available_mib", mib("MemAvailable"));
}

/// Addresses, the data device, the ready line or why nothing serves, and the connections.
fn status_serving(out: &mut Output, state: &State) {
    let addresses: Vec<Value> = state
        .configured
        .iter()
        .map(|c| {
            json!({"interface": c.interface, "address": c.address.to_string(),
                   "prefix_len": c.prefix_len, "gateway": c.gateway.map(|g| g.to_string())})
        })
        .collect();
    out.set("addresses", addresses);
    out.set("data_device", json!(state.data_device));
    out.set("data_grown", json!(state.data_grown));
    out.set("serving", json!(state.ready_line));
    out.set("not_serving", json!(state.not_serving));
    for c in &state.configured {
        out.line(format!(
            "address {} {}/{}{}",
            c.interface,
            c.address,
            c.prefix_len,
            c.gateway.map(|g| format!(" via {g}")).unwrap_or_default()
        ));
    }
    match &state.data_device {
        Some(described) => out.line(format!("data {described}")),
        None => out.line("data none (RAM only)"),
    }
    if let Some(grown) = &state.data_grown {
        out.line(format!("data {grown}"));
    }
    if let Some(at_rest) = &state.data_at_rest {
        out.line(format!("data at rest {}", at_rest.line()));
    }
    out.set(
        "data_at_rest",
        json!(state.data_at_rest.as_ref().map(|a| a.line())),
    );
    match (&state.ready_line, &state.not_serving) {
        (Some(ready), _) => out.line(format!("serving {ready}")),
        (None, Some(why)) => out.line(format!("not serving: {why}")),
        (None, None) => out.line("not serving yet"),
    }
    if let Some(server) = &state.server {
        memory_regions(out, server.as_ref());
        let conns = server.connections();
        out.line(format!("connections {conns}"));
        out.set("connections", conns);
        out.set("draining", server.draining());
    }
}

/// With `ringstore.sub_memory` (ADR 0035): one line per item memory region with its node
/// and fill, e.g. `memory region node 0 sub: 12 of 32 MiB used`.
fn memory_regions(out: &mut Output, server: &dyn crate::plane::Serving) {
    let regions = server.memory_regions();
    if regions.is_empty() {
        return;
    }
    let mut listed = Vec::new();
    for r in regions {
        out.line(format!(
            "memory region node {} {}: {} of {} MiB used",
            r.node,
            r.kind,
            r.used_bytes >> 20,
            r.bytes >> 20
        ));
        listed.push(json!({"node": r.node, "kind": r.kind, "bytes": r.bytes,
                           "used_bytes": r.used_bytes}));
    }
    out.set("memory_regions", listed);
}

/// PID 1's own view, appended to `stats` for the keys the server does not report.
fn init_stats(state: &State) -> Vec<(String, String)> {
    let mut out = Vec::new();
    if let Some(p) = &state.placement {
        out.push(("numa_node".into(), p.node.to_string()));
        out.push(("worker_cpus".into(), ringstore_sys::format_cpus(&p.workers)));
        out.push((
            "hugepage_bytes".into(),
            (state.hugepages * crate::hugepages::HUGEPAGE_BYTES).to_string(),
        ));
    }
    out
}

pub fn stats(ctx: &mut Ctx, _: &[&str]) -> Output {
    // In-process: the same listing a client of the memcache port gets, without a connection.
    let reply = admin(ctx.machine, b"stats\r\n", STATS_MAX).unwrap_or_default();
    let mut lines: Vec<String> = String::from_utf8_lossy(&reply)
        .lines()
        .map(str::to_string)
        .collect();
    let end = lines.iter().position(|l| l == "END").unwrap_or(lines.len());
    let mut extra = Vec::new();
    let own = init_stats(&ctx.machine.state());
    for (key, value) in own {
        let prefix = format!("STAT {key} ");
        if !lines.iter().any(|l| l.starts_with(&prefix)) {
            extra.push(format!("{prefix}{value}"));
        }
    }
    lines.splice(end..end, extra);
    if !lines.iter().any(|l| l == "END") {
        lines.push("END".into());
    }
    let mut map = Map::new();
    for l in &lines {
        if let Some((k, v)) = l.strip_prefix("STAT ").and_then(|kv| kv.split_once(' ')) {
            map.insert(k.to_string(), v.into());
        }
    }
    let mut out = Output::new();
    out.set("stats", map);
    out.text = lines;
    out
}

/// A memcache request answered in-process by the running server (`None`: nothing serves).
fn admin(machine: &Machine, request: &[u8], max: usize) -> Option<Vec<u8>> {
    machine.with_server(|s| Ok(s.admin(request, max))).ok()
}

/// `flush --yes`: memcache `flush_all`, in-process. Without `--yes` it only says what it would do.
pub fn flush(ctx: &mut Ctx, args: &[&str]) -> Output {
    if args != ["--yes"] {
        let mut out = Output::error(
            "flush drops every item (RAM and data device): confirm with `flush --yes`",
        );
        out.set("confirm", "flush --yes");
        return out;
    }
    match admin(ctx.machine, b"flush_all\r\n", 4096) {
        None => Output::error("not serving"),
        Some(reply) if reply == b"OK\r\n" => {
            crate::info!("console: flush_all done");
            let mut out = Output::new();
            out.line("flushed: every item is gone");
            out.set("flushed", true);
            out
        }
        Some(reply) => Output::error(format!(
            "flush_all answered {:?}",
            String::from_utf8_lossy(&reply).trim()
        )),
    }
}

/// Longest `drain --wait`.
pub const DRAIN_WAIT_MAX: u64 = 600;
/// `drain` waits this long for open connections to close unless told otherwise.
pub const DRAIN_WAIT_DEFAULT: u64 = 30;

/// `drain [--wait SECS]`: new connections are refused from now on; waits (bounded) for the open
/// ones to finish and close, and reports how many are left.
pub fn drain(ctx: &mut Ctx, args: &[&str]) -> Output {
    let machine = ctx.machine;
    let wait = match args {
        [] => DRAIN_WAIT_DEFAULT,
        ["--wait", secs] => match secs.parse::<u64>() {
            Ok(s) if s <= DRAIN_WAIT_MAX => s,
            _ => return Output::error(format!("--wait takes 0 to {DRAIN_WAIT_MAX} seconds")),
        },
        _ => return Output::error("usage: drain [--wait SECS]"),
    };
    if let Err(why) = machine.with_server(|s| s.set_draining(true)) {
        return Output::error(why);
    }
    crate::info!("console: draining: new connections are refused");
    let started = std::time::Instant::now();
    let deadline = started + Duration::from_secs(wait);
    let open = || machine.with_server(|s| Ok(s.connections())).unwrap_or(0);
    let mut left = open();
    while left > 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        left = open();
    }
    let mut out = Output::new();
    out.line(format!(
        "draining: new connections refused; {left} connections still open after {:.1} s",
        started.elapsed().as_secs_f64()
    ));
    out.set("draining", true);
    out.set("connections_open", left);
    out.set(
        "waited_s",
        (started.elapsed().as_secs_f64() * 10.0).round() / 10.0,
    );
    out
}

pub fn undrain(ctx: &mut Ctx, _: &[&str]) -> Output {
    match ctx.machine.with_server(|s| s.set_draining(false)) {
        Err(why) => Output::error(why),
        Ok(()) => {
            crate::info!("console: undrained: accepting connections");
            let mut out = Output::new();
            out.line("accepting new connections");
            out.set("draining", false);
            out
        }
    }
}

/// The `data` fields shown as `KEY VALUE` text lines.
const DATA_LINES: &[&str] = &[
    "device_bytes",
    "capacity_bytes",
    "segment_bytes",
    "records",
    "live_bytes",
    "used_bytes",
    "corrupt_records",
    "load_refused_records",
    "compactions",
    "compactions_aborted",
    "evicted_records",
    "evicted_segments",
    "uploads_in_progress",
    "upload_reserved_bytes",
];

/// `data rekey` (ADR 0055): a new random key sealed by the TPM, handed to the server, which
/// writes its sealed copy beside the present one, switches (new records under the new key at
/// once) and rewrites the old records in the background; `data` shows when the old key is
/// retired. Only for the TPM-sealed key: a configured `data_key` is the operator's to rotate.
fn data_rekey(ctx: &mut Ctx) -> Output {
    let sealed = matches!(
        ctx.machine.state().data_at_rest,
        Some(crate::data_seal::AtRest::Sealed { .. })
    );
    if !sealed {
        return Output::error(
            "data rekey: the data device's key is not sealed by this box's TPM (see `status`, data at rest)",
        );
    }
    let made = ringstore_tpm::Device::open(std::path::Path::new(ringstore_tpm::DEVICE))
        .map_err(|e| e.to_string())
        .and_then(|mut tpm| crate::data_seal::new_sealed_key(&mut tpm));
    let rekeyed =
        made.and_then(|(key, sealed)| ctx.machine.with_server(|s| s.rekey(&key, &sealed)));
    match rekeyed {
        Err(why) => Output::error(format!("data rekey refused: {why}")),
        Ok(epoch) => {
            crate::info!("console: data rekey: new records sealed with a new TPM-sealed key from epoch {epoch}");
            let mut out = Output::new();
            out.line(format!(
                "rekeyed: new records are sealed with a new key (sealed to PCR 7) from epoch {epoch}; the old key stays until compaction rewrote its records (`data` shows rekey)"
            ));
            out.set("rekeyed", true);
            out.set("epoch", epoch);
            out
        }
    }
}

/// `data reseal` (ADR 0053), before the operator changes the Secure Boot keys or state on
/// purpose: the key in use sealed by this TPM for the next boot with no PCR, beside its PCR 7
/// copy; that boot reseals it to the PCR 7 it measured and erases the copy. `data reseal
/// cancel` erases a pending copy.
fn data_reseal(ctx: &mut Ctx, cancel: bool) -> Output {
    let sealed = matches!(
        ctx.machine.state().data_at_rest,
        Some(crate::data_seal::AtRest::Sealed { .. })
    );
    if !sealed {
        return Output::error(
            "data reseal: the data device's key is not sealed by this box's TPM (see `status`, data at rest)",
        );
    }
    let done = if cancel {
        ctx.machine.with_server(|s| s.reseal(None))
    } else {
        ringstore_tpm::Device::open(std::path::Path::new(ringstore_tpm::DEVICE))
            .map_err(|e| e.to_string())
            .and_then(|mut tpm| {
                let mut seal = |key: &[u8; 32]| crate::data_seal::one_boot_copy(&mut tpm, key);
                ctx.machine.with_server(|s| s.reseal(Some(&mut seal)))
            })
    };
    let mut out = Output::new();
    match (done, cancel) {
        (Err(why), _) => return Output::error(format!("data reseal refused: {why}")),
        (Ok(true), false) => {
            crate::info!("console: data reseal: a one-boot copy of the data key, bound to this TPM only, waits for the next boot");
            out.line(format!(
                "resealing: the next boot opens the data device whatever Secure Boot state or keys it measures, and seals the key to its PCR 7 (within {} TPM restarts, firmware setup included). Until then whoever holds this box (TPM and disk together) can boot another image and unseal the key; the disk alone still reads nothing. `data reseal cancel` undoes it.",
                ringstore_tpm::one_boot::RESETS
            ));
        }
        (Ok(true), true) => {
            crate::info!("console: data reseal cancelled");
            out.line(
                "reseal cancelled: the one-boot copy is erased; the key stays sealed to PCR 7",
            );
        }
        (Ok(false), _) => out.line("no `data reseal` was pending"),
    }
    out.set("reseal_pending", !cancel);
    out
}

/// `data`: the data device's layout, records, live bytes per region, compactions, damaged and
/// refused records; `data rekey`: a new data key ([`data_rekey`]); `data reseal [cancel]`
/// ([`data_reseal`]).
pub fn data(ctx: &mut Ctx, args: &[&str]) -> Output {
    match args {
        [] => {}
        ["rekey"] => return data_rekey(ctx),
        ["reseal"] => return data_reseal(ctx, false),
        ["reseal", "cancel"] => return data_reseal(ctx, true),
        _ => return Output::error("usage: data [rekey | reseal [cancel]]"),
    }
    let (described, state) = {
        let s = ctx.machine.state();
        (
            s.data_device.clone(),
            s.server.as_ref().and_then(|srv| srv.data_json()),
        )
    };
    let mut out = Output::new();
    out.set("device", json!(described));
    let Some(state) = state else {
        out.line(match &described {
            Some(d) => format!("data device {d}: not serving"),
            None => "no data device (RAM only)".to_string(),
        });
        out.set("state", Value::Null);
        return out;
    };
    out.line(format!("device {}", described.unwrap_or_default()));
    for key in DATA_LINES {
        out.line(format!("{key} {}", state[key]));
    }
    if state["reseal_pending"].as_bool() == Some(true) {
        out.line("reseal: a one-boot copy of the key (`data reseal`) waits for the next boot");
    }
    if let Some(rekey) = state.get("rekey").filter(|v| !v.is_null()) {
        out.line(match rekey["old_key_until_epoch"].as_u64() {
            Some(from) => format!(
                "rekey: the old key is kept for epochs below {from}: {} of {} regions rewritten",
                rekey["regions_done"], rekey["regions"]
            ),
            None => format!(
                "rekey: one key ({} rekeys, {} old keys retired since start)",
                rekey["rekeys"], rekey["retired"]
            ),
        });
    }
    for r in state["regions"].as_array().into_iter().flatten() {
        out.line(format!(
            "region {}: {} live bytes in {} of {} segments",
            r["region"], r["live_bytes"], r["segments_with_live_data"], r["segments"]
        ));
    }
    out.set("state", state);
    out
}

/// `tuning`'s line on the data device's encryption (ADR 0053): a WARN when it is in clear or
/// the TPM refused its key.
fn data_at_rest_warning(out: &mut Output, machine: &Machine) {
    let state = machine.state();
    let Some(at_rest) = &state.data_at_rest else {
        return;
    };
    if at_rest.warns() {
        out.line(format!(
            "WARN data at rest {} (docs/OPERATIONS.md, \"Data at rest on the appliance\")",
            at_rest.line()
        ));
    } else {
        out.line(format!("data at rest {}", at_rest.line()));
    }
    out.set("data_at_rest", json!(at_rest.line()));
}

/// `tuning`: what the topology calls for, what is in effect, every difference (`tuning.rs`).
pub fn tuning(ctx: &mut Ctx, _: &[&str]) -> Output {
    let Some(facts) = crate::tuning::gather(ctx.machine) else {
        return Output::error("nothing was placed (see `status`)");
    };
    let checks = crate::tuning::verify(&facts);
    crate::metrics_handoff::tuning(ctx.machine, &checks);
    let differences = checks.iter().filter(|c| c.difference).count();
    let tuned = crate::tuning::isolation::state(&checks, &facts);
    let mut out = Output::new();
    out.line(format!(
        "serving node {}, workers on CPUs {}: {}",
        facts.serving_node,
        ringstore_sys::format_cpus(&facts.workers),
        if differences == 0 {
            "clean".to_string()
        } else {
            format!("{differences} differences")
        }
    ));
    out.line(format!("state {}", tuned.describe()));
    let secure_boot = crate::secure_boot::SecureBoot::read();
    out.line(format!("secure boot {}", secure_boot.describe()));
    if secure_boot.enabled == Some(false) {
        out.line(
            "WARN secure boot is off: anyone with the disk in hand can boot an image of their own (docs/OPERATIONS.md, \"Secure Boot\")",
        );
    }
    out.set("secure_boot", secure_boot.json());
    data_at_rest_warning(&mut out, ctx.machine);
    for c in &checks {
        out.line(format!(
            "{} {:<10} {:<16} wanted {}; in effect {}{}",
            if c.difference { "DIFF" } else { "ok  " },
            c.check,
            c.subject,
            c.wanted,
            c.actual,
            c.note
                .as_ref()
                .map(|n| format!(" ({n})"))
                .unwrap_or_default()
        ));
    }
    out.set("serving_node", facts.serving_node);
    out.set("worker_cpus", json!(facts.workers));
    out.set("clean", differences == 0);
    out.set("state", tuned.name());
    out.set("differences", differences);
    out.set(
        "checks",
        checks.iter().map(|c| c.json()).collect::<Vec<_>>(),
    );
    out
}

/// `config`: every key of the effective configuration and where its value came from.
pub fn config(ctx: &mut Ctx, _: &[&str]) -> Output {
    let settings = ctx.machine.state().settings.clone();
    if settings.is_empty() {
        return Output::error("no configuration was resolved at boot (see `log`)");
    }
    let mut out = Output::new();
    let mut list = Vec::new();
    for s in &settings {
        out.line(format!("{:<20} {:<24} {}", s.key, s.value, s.origin.name()));
        list.push(json!({"key": s.key, "value": s.value, "origin": s.origin.name()}));
    }
    out.set("settings", list);
    out
}

pub fn irq(ctx: &mut Ctx, _: &[&str]) -> Output {
    let nic_irqs = ctx.machine.state().nic_irqs.clone();
    let mut result = Output::new();
    if nic_irqs.is_empty() {
        result.line("no NIC IRQs placed");
        result.set("nics", Vec::<Value>::new());
        return result;
    }
    let interrupts = crate::irq::parse_interrupts(
        &std::fs::read_to_string("/proc/interrupts").unwrap_or_default(),
    );
    let mut nics = Vec::new();
    for (nic, irqs) in nic_irqs {
        result.line(format!("{nic}:"));
        let table = crate::irq::table(&irqs, &interrupts);
        nics.push(json!({"name": nic, "irqs": irqs, "lines": table}));
        result.text.extend(table);
    }
    result.set("nics", nics);
    with_xdp(&mut result, ctx.machine);
    result
}

/// `irq` and `net` end with the AF_XDP block (mode per interface, queue→worker map) when
/// `ringstore.xdp` is on; JSON: `xdp`, its lines (absent without it).
fn with_xdp(out: &mut Output, machine: &Machine) {
    let lines = crate::plane::xdp_lines(machine.state().server.as_deref());
    if !lines.is_empty() {
        out.set(
            "xdp",
            lines.iter().skip(1).map(|l| l.trim()).collect::<Vec<_>>(),
        );
        out.text.extend(lines);
    }
}

pub fn net(ctx: &mut Ctx, _: &[&str]) -> Output {
    let mut out = Output::new();
    out.line("listening:");
    let mut listening = Vec::new();
    for l in crate::netstat::listening_lines() {
        if let Some((proto, addr)) = l.split_once(char::is_whitespace) {
            listening.push(json!({"proto": proto, "addr": addr.trim()}));
        }
        out.line(format!("  {l}"));
    }
    out.line("addresses:");
    let mut addresses = Vec::new();
    for (name, ip) in ringstore_sys::interface_addresses() {
        out.line(format!("  {name} {ip}"));
        addresses.push(json!({"interface": name, "address": ip.to_string()}));
    }
    out.set("listening", listening);
    out.set("addresses", addresses);
    with_xdp(&mut out, ctx.machine);
    out
}

pub fn threads(_: &mut Ctx, _: &[&str]) -> Output {
    let mut out = Output::new();
    out.text = crate::threads::lines();
    let rows: Vec<Value> = crate::threads::all()
        .into_iter()
        .map(|t| {
            json!({"tid": t.tid, "name": t.name, "capeff": t.cap_eff, "capprm": t.cap_prm,
                   "capbnd": t.cap_bnd, "nnp": t.no_new_privs == "1"})
        })
        .collect();
    out.set("threads", rows);
    out
}

pub fn log(_: &mut Ctx, _: &[&str]) -> Output {
    let mut out = Output::new();
    out.text = crate::log::recent();
    out.set("lines", out.text.clone());
    out
}

/// `slots`: booted, committed, each slot's file and size, the last trial (`slots_report.rs`).
pub fn slots(ctx: &mut Ctx, _: &[&str]) -> Output {
    // A copy: reading the ESP must not hold the machine's lock.
    let slots = ctx.machine.state().slots.clone();
    let report = crate::slots_report::slots(&slots);
    Output {
        ok: true,
        text: report.text,
        fields: report.fields,
    }
}

pub fn update(ctx: &mut Ctx, args: &[&str]) -> Output {
    match args {
        [url] => {
            let lines = crate::update::update(ctx.machine, url);
            Output::error(lines.join("; "))
        }
        _ => Output::error("usage: update URL"),
    }
}

pub fn reboot(ctx: &mut Ctx, args: &[&str]) -> Output {
    match args {
        [] => power::reboot(ctx.machine, false),
        ["--firmware"] => power::reboot(ctx.machine, true),
        _ => Output::error("usage: reboot [--firmware]"),
    }
}

pub fn poweroff(ctx: &mut Ctx, _: &[&str]) -> Output {
    power::shutdown(ctx.machine, Action::PowerOff)
}

/// `keys`: who may log in and where each key came from; what was skipped.
pub fn keys(_: &mut Ctx, _: &[&str]) -> Output {
    let (keys, password, problems) = super::session::describe();
    let mut out = Output::new();
    for k in &keys {
        out.line(format!(
            "{} {} {} (from {})",
            k.algorithm, k.fingerprint, k.comment, k.source
        ));
    }
    out.line(format!(
        "{} keys; password {}",
        keys.len(),
        if password {
            "configured (image)"
        } else {
            "none"
        }
    ));
    for p in &problems {
        out.line(format!("skipped: {p}"));
    }
    let list: Vec<Value> = keys
        .iter()
        .map(|k| {
            json!({"algorithm": k.algorithm, "comment": k.comment,
                   "fingerprint": k.fingerprint, "source": k.source})
        })
        .collect();
    out.set("keys", list);
    out.set("password", password);
    out.set("problems", problems);
    out
}

pub fn login(ctx: &mut Ctx, args: &[&str]) -> Output {
    ctx.session.start_login(args, ctx.json, ctx.now)
}

pub fn logout(ctx: &mut Ctx, _: &[&str]) -> Output {
    ctx.session.logout()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::console::session::Session;

    fn run(f: fn(&mut Ctx, &[&str]) -> Output, args: &[&str]) -> Output {
        let mut session = Session::new("h", "b");
        let machine = Machine::default();
        let mut ctx = Ctx {
            session: &mut session,
            machine: &machine,
            now: std::time::Instant::now(),
            json: true,
        };
        f(&mut ctx, args)
    }

    #[test]
    fn drain_wait_is_bounded_and_flush_asks_first() {
        let over = (DRAIN_WAIT_MAX + 1).to_string();
        let out = run(drain, &["--wait", &over]);
        assert!(
            !out.ok && out.text[0].contains("0 to 600 seconds"),
            "{:?}",
            out.text
        );
        assert!(!run(drain, &["--wait", "-1"]).ok);
        assert!(!run(drain, &["now"]).ok);
        // In range but nothing serves here: refused, not a wait.
        let started = std::time::Instant::now();
        assert_eq!(
            run(drain, &["--wait", "600"]).fields["error"],
            "not serving"
        );
        assert!(started.elapsed() < Duration::from_secs(1));
        let asked = run(flush, &[]);
        assert!(!asked.ok && asked.fields["confirm"] == "flush --yes");
        assert!(!run(flush, &["--yes", "extra"]).ok);
        assert_eq!(run(flush, &["--yes"]).fields["error"], "not serving");
        assert_eq!(run(undrain, &[]).fields["error"], "not serving");
        assert!(!run(config, &[]).ok, "nothing resolved in a unit test");
    }
}
