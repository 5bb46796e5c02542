//! The console's commands, each answering an [`Output`] (text lines and JSON fields). The table
//! that names them, checks access and generates `help` is `table.rs`.

use std::time::Duration;

use serde_json::{json, Map, Value};

use super::output::Output;
use super::table::Ctx;
use crate::power::{self, Action};

/// Most bytes of memcache `stats` output the console shows.
const STATS_MAX: usize = 64 << 10;

pub fn status(_: &mut Ctx, _: &[&str]) -> Output {
    let state = crate::state::lock();
    let (mut out, mut fields) = identity();
    out.push(state.partition_file.status_line());
    fields.insert("config_partition".into(), state.partition_file.json());
    match &state.placement {
        Some(p) => {
            out.push(format!("numa_node {}", p.node));
            out.push(format!(
                "worker_cpus {}",
                ringstore_sys::format_cpus(&p.workers)
            ));
            out.push(format!(
                "housekeeping_cpus {}",
                ringstore_sys::format_cpus(&p.housekeeping)
            ));
            let free = crate::hugepages::count(p.node, "free_hugepages").unwrap_or(0);
            fields.insert("numa_node".into(), p.node.into());
            fields.insert("worker_cpus".into(), json!(p.workers));
            fields.insert("housekeeping_cpus".into(), json!(p.housekeeping));
            fields.insert("hugepages".into(), state.hugepages.into());
            fields.insert("hugepages_free".into(), free.into());
            out.push(format!(
                "hugepages node {}: {} x 2 MiB ({} free)",
                p.node, state.hugepages, free
            ));
        }
        None => {
            out.push("numa_node none".into());
            fields.insert("numa_node".into(), Value::Null);
        }
    }
    if let Some(isolated) =
        ringstore_sys::read_trim("/sys/devices/system/cpu/isolated").filter(|s| !s.is_empty())
    {
        out.push(format!("isolated_cpus {isolated}"));
        fields.insert(
            "isolated_cpus".into(),
            json!(ringstore_sys::parse_cpulist(&isolated)),
        );
    }
    let mib = |field| crate::sysinfo::meminfo_bytes(field).unwrap_or(0) >> 20;
    out.push(format!(
        "memory {} MiB total, {} MiB available",
        mib("MemTotal"),
        mib("MemAvailable")
    ));
    fields.insert("memory_total_mib".into(), mib("MemTotal").into());
    fields.insert("memory_available_mib".into(), mib("MemAvailable").into());
    let addresses: Vec<Value> = state
        .configured
        .iter()
        .map(|c| {
            json!({"interface": c.interface, "address": c.address.to_string(),
                   "prefix_len": c.prefix_len, "gateway": c.gateway.map(|g| g.to_string())})
        })
        .collect();
    fields.insert("addresses".into(), addresses.into());
    fields.insert("data_device".into(), json!(state.data_device));
    fields.insert("serving".into(), json!(state.ready_line));
    fields.insert("not_serving".into(), json!(state.not_serving));
    for c in &state.configured {
        out.push(format!(
            "address {} {}/{}{}",
            c.interface,
            c.address,
            c.prefix_len,
            c.gateway.map(|g| format!(" via {g}")).unwrap_or_default()
        ));
    }
    match &state.data_device {
        Some(described) => out.push(format!("data {described}")),
        None => out.push("data none (RAM only)".into()),
    }
    match (&state.ready_line, &state.not_serving) {
        (Some(ready), _) => out.push(format!("serving {ready}")),
        (None, Some(why)) => out.push(format!("not serving: {why}")),
        (None, None) => out.push("not serving yet".into()),
    }
    if let Some(server) = &state.server {
        let conns = server.connections();
        out.push(format!("connections {conns}"));
        fields.insert("connections".into(), conns.into());
        fields.insert("draining".into(), server.draining().into());
    }
    Output {
        ok: true,
        text: out,
        fields,
    }
}

/// `status`'s first lines: version, uptime, host name (and where it came from).
fn identity() -> (Vec<String>, Map<String, Value>) {
    let kernel = crate::sysinfo::kernel_release();
    let uptime = crate::sysinfo::uptime_secs();
    let hostname = crate::hostname::current();
    let out = vec![
        format!(
            "version ringstore {} (kernel {kernel})",
            env!("CARGO_PKG_VERSION")
        ),
        format!("uptime {uptime:.1} s"),
        format!("hostname {hostname}"),
    ];
    let mut fields = Map::new();
    fields.insert("hostname".into(), hostname.into());
    fields.insert("hostname_from".into(), json!(crate::hostname::source()));
    fields.insert("version".into(), env!("CARGO_PKG_VERSION").into());
    fields.insert("kernel".into(), kernel.into());
    fields.insert("uptime_s".into(), json!((uptime * 10.0).round() / 10.0));
    (out, fields)
}

/// PID 1's own view, appended to `stats` for the keys the server does not report.
fn init_stats() -> Vec<(String, String)> {
    let state = crate::state::lock();
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

pub fn stats(_: &mut Ctx, _: &[&str]) -> Output {
    // In-process: the same listing a client of the memcache port gets, without a connection.
    let reply = admin(b"stats\r\n", STATS_MAX).unwrap_or_default();
    let mut lines: Vec<String> = String::from_utf8_lossy(&reply)
        .lines()
        .map(str::to_string)
        .collect();
    let end = lines.iter().position(|l| l == "END").unwrap_or(lines.len());
    let mut extra = Vec::new();
    for (key, value) in init_stats() {
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
fn admin(request: &[u8], max: usize) -> Option<Vec<u8>> {
    let state = crate::state::lock();
    state.server.as_ref().map(|s| s.admin(request, max))
}

/// `flush --yes`: memcache `flush_all`, in-process. Without `--yes` it only says what it would do.
pub fn flush(_: &mut Ctx, args: &[&str]) -> Output {
    if args != ["--yes"] {
        let mut out = Output::error(
            "flush drops every item (RAM and data device): confirm with `flush --yes`",
        );
        out.set("confirm", "flush --yes");
        return out;
    }
    match admin(b"flush_all\r\n", 4096) {
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
pub fn drain(_: &mut Ctx, args: &[&str]) -> Output {
    let wait = match args {
        [] => DRAIN_WAIT_DEFAULT,
        ["--wait", secs] => match secs.parse::<u64>() {
            Ok(s) if s <= DRAIN_WAIT_MAX => s,
            _ => return Output::error(format!("--wait takes 0 to {DRAIN_WAIT_MAX} seconds")),
        },
        _ => return Output::error("usage: drain [--wait SECS]"),
    };
    if let Err(why) = with_server(|s| s.set_draining(true)) {
        return Output::error(why);
    }
    crate::info!("console: draining: new connections are refused");
    let started = std::time::Instant::now();
    let deadline = started + Duration::from_secs(wait);
    let mut left = with_server(|s| Ok(s.connections())).unwrap_or(0);
    while left > 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        left = with_server(|s| Ok(s.connections())).unwrap_or(0);
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

pub fn undrain(_: &mut Ctx, _: &[&str]) -> Output {
    match with_server(|s| s.set_draining(false)) {
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

fn with_server<T>(
    f: impl FnOnce(&dyn crate::plane::Serving) -> Result<T, String>,
) -> Result<T, String> {
    let state = crate::state::lock();
    match &state.server {
        Some(server) => f(server.as_ref()),
        None => Err("not serving".into()),
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
    "uploads_in_progress",
    "upload_reserved_bytes",
];

/// `data`: the data device's layout, records, live bytes per region, compactions, damaged and
/// refused records.
pub fn data(_: &mut Ctx, _: &[&str]) -> Output {
    let (described, state) = {
        let s = crate::state::lock();
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
    for r in state["regions"].as_array().into_iter().flatten() {
        out.line(format!(
            "region {}: {} live bytes in {} of {} segments",
            r["region"], r["live_bytes"], r["segments_with_live_data"], r["segments"]
        ));
    }
    out.set("state", state);
    out
}

/// `tuning`: what the topology calls for, what is in effect, every difference (`tuning.rs`).
pub fn tuning(_: &mut Ctx, _: &[&str]) -> Output {
    let Some(facts) = crate::tuning::gather() else {
        return Output::error("nothing was placed (see `status`)");
    };
    let checks = crate::tuning::verify(&facts);
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
pub fn config(_: &mut Ctx, _: &[&str]) -> Output {
    let settings = crate::state::lock().settings.clone();
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

pub fn irq(_: &mut Ctx, _: &[&str]) -> Output {
    let nic_irqs = crate::state::lock().nic_irqs.clone();
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
    with_xdp(&mut result);
    result
}

/// `irq` and `net` end with the AF_XDP block (mode per interface, queue→worker map) when
/// `ringstore.xdp` is on; JSON: `xdp`, its lines (absent without it).
fn with_xdp(out: &mut Output) {
    let lines = crate::plane::xdp_lines();
    if !lines.is_empty() {
        out.set(
            "xdp",
            lines.iter().skip(1).map(|l| l.trim()).collect::<Vec<_>>(),
        );
        out.text.extend(lines);
    }
}

pub fn net(_: &mut Ctx, _: &[&str]) -> Output {
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
    with_xdp(&mut out);
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
pub fn slots(_: &mut Ctx, _: &[&str]) -> Output {
    let report = crate::slots_report::slots();
    Output {
        ok: true,
        text: report.text,
        fields: report.fields,
    }
}

pub fn update(_: &mut Ctx, args: &[&str]) -> Output {
    match args {
        [url] => {
            let lines = crate::update::update(url);
            Output::error(lines.join("; "))
        }
        _ => Output::error("usage: update URL"),
    }
}

pub fn reboot(_: &mut Ctx, _: &[&str]) -> Output {
    power::shutdown(Action::Reboot)
}

pub fn poweroff(_: &mut Ctx, _: &[&str]) -> Output {
    power::shutdown(Action::PowerOff)
}

pub fn help(_: &mut Ctx, _: &[&str]) -> Output {
    super::table::help()
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
        let mut ctx = Ctx {
            session: &mut session,
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
