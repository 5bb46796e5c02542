//! The serial console: prompt `ringstore> `, one bounded line per command.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::time::Duration;

use crate::log::{console_line, console_write};
use crate::power::{self, Action};

pub const PROMPT: &str = "ringstore> ";
/// Longest command line; the rest of a longer line is discarded.
pub const COMMAND_MAX: usize = 256;
/// Most bytes of memcache `stats` output the console shows.
const STATS_MAX: usize = 64 << 10;

const HELP: &[&str] = &[
    "help      this list",
    "status    version, uptime, NUMA node, CPUs, memory, huge pages, addresses, connections",
    "stats     the memcache `stats` lines",
    "irq       IRQ -> CPU affinity of the NIC queues",
    "net       listening TCP/UDP sockets and interface addresses",
    "threads   every thread with its effective/permitted/bounding capabilities and no_new_privs",
    "log       recent log lines",
    "slots     the A/B slots: booted, committed, their images, the last trial",
    "update URL  fetch a signed ringstore.efi (http://IP[:PORT]/PATH and PATH.sig), write the inactive slot, reboot into it for a trial",
    "reboot    stop serving, sync, reboot",
    "poweroff  stop serving, sync, power off",
];

/// Reads lines from fd 0 with a length bound.
struct LineReader {
    pending: Vec<u8>,
    discarding: bool,
    /// The previous byte was '\r': a following '\n' ends nothing (CRLF is one line end).
    after_cr: bool,
}

impl LineReader {
    /// Feeds bytes; returns completed lines (over-long ones come back as `None` entries).
    fn feed(&mut self, bytes: &[u8]) -> Vec<Option<String>> {
        let mut out = Vec::new();
        for &b in bytes {
            let crlf = b == b'\n' && self.after_cr;
            self.after_cr = b == b'\r';
            if crlf {
                continue;
            }
            if b == b'\n' || b == b'\r' {
                if self.discarding {
                    out.push(None);
                } else {
                    out.push(Some(String::from_utf8_lossy(&self.pending).into_owned()));
                }
                self.pending.clear();
                self.discarding = false;
            } else if self.pending.len() >= COMMAND_MAX {
                self.discarding = true;
            } else {
                self.pending.push(b);
            }
        }
        out
    }
}

/// Runs the console forever on fds 0/1.
pub fn run_loop() -> ! {
    let mut reader = LineReader {
        pending: Vec::new(),
        discarding: false,
        after_cr: false,
    };
    let mut buf = [0u8; 512];
    console_write(PROMPT);
    loop {
        let n = std::io::stdin().lock().read(&mut buf).unwrap_or(0);
        if n == 0 {
            // No console (EOF or error): nothing to read, but PID 1 must stay.
            std::thread::sleep(Duration::from_secs(1));
            continue;
        }
        for line in reader.feed(&buf[..n]) {
            match line {
                None => console_line(&format!("error: command longer than {COMMAND_MAX} bytes")),
                Some(line) => {
                    let outcome = std::panic::catch_unwind(|| execute(line.trim()));
                    match outcome {
                        Ok(lines) => lines.iter().for_each(|l| console_line(l)),
                        Err(_) => console_line("error: the command failed (panic logged)"),
                    }
                }
            }
            console_write(PROMPT);
        }
    }
}

/// Runs one command and returns its output lines (`reboot`/`poweroff` do not return).
pub fn execute(command: &str) -> Vec<String> {
    match command {
        "" => Vec::new(),
        "help" | "?" => HELP.iter().map(|s| s.to_string()).collect(),
        "status" => status(),
        "stats" => stats(),
        "irq" => irq(),
        "net" => net(),
        "threads" => crate::threads::lines(),
        "log" => crate::log::recent(),
        "slots" => crate::update::slots_lines(),
        update if update.starts_with("update ") => {
            crate::update::update(update["update ".len()..].trim())
        }
        "reboot" => power::shutdown(Action::Reboot),
        "poweroff" | "halt" | "shutdown" => power::shutdown(Action::PowerOff),
        other => vec![format!("unknown command {other:?}; try help")],
    }
}

fn status() -> Vec<String> {
    let state = crate::state::lock();
    let mut out = vec![
        format!(
            "version ringstore {} (kernel {})",
            env!("CARGO_PKG_VERSION"),
            crate::sysinfo::kernel_release()
        ),
        format!("uptime {:.1} s", crate::sysinfo::uptime_secs()),
    ];
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
            out.push(format!(
                "hugepages node {}: {} x 2 MiB ({} free)",
                p.node, state.hugepages, free
            ));
        }
        None => out.push("numa_node none".into()),
    }
    if let Some(isolated) =
        ringstore_sys::read_trim("/sys/devices/system/cpu/isolated").filter(|s| !s.is_empty())
    {
        out.push(format!("isolated_cpus {isolated}"));
    }
    let mib = |field| crate::sysinfo::meminfo_bytes(field).unwrap_or(0) >> 20;
    out.push(format!(
        "memory {} MiB total, {} MiB available",
        mib("MemTotal"),
        mib("MemAvailable")
    ));
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
    let memcache = state.config.as_ref().and_then(|c| c.memcache);
    let serving = state.ready_line.is_some();
    drop(state);
    if let (true, Some(addr)) = (serving, memcache) {
        if let Ok(lines) = memcache_stats(addr) {
            if let Some(conns) = lines
                .iter()
                .find_map(|l| l.strip_prefix("STAT curr_connections "))
            {
                out.push(format!("connections {conns}"));
            }
        }
    }
    out
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

fn stats() -> Vec<String> {
    let (memcache, serving) = {
        let state = crate::state::lock();
        (
            state.config.as_ref().and_then(|c| c.memcache),
            state.ready_line.is_some(),
        )
    };
    let mut lines = match (serving, memcache) {
        (true, Some(addr)) => memcache_stats(addr)
            .unwrap_or_else(|e| vec![format!("error: memcache stats from {addr}: {e}")]),
        _ => Vec::new(),
    };
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
    lines
}

/// Asks our own memcache endpoint for `stats` (loopback when it listens on the wildcard).
fn memcache_stats(addr: SocketAddr) -> std::io::Result<Vec<String>> {
    let target = if addr.ip().is_unspecified() {
        SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), addr.port())
    } else {
        addr
    };
    let mut stream = TcpStream::connect_timeout(&target, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.write_all(b"stats\r\n")?;
    let mut text = Vec::new();
    let mut buf = [0u8; 4096];
    while text.len() < STATS_MAX && !text.ends_with(b"END\r\n") && !text.ends_with(b"ERROR\r\n") {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            break;
        }
        text.extend_from_slice(&buf[..n]);
    }
    Ok(String::from_utf8_lossy(&text)
        .lines()
        .map(str::to_string)
        .collect())
}

fn irq() -> Vec<String> {
    let nic_irqs = crate::state::lock().nic_irqs.clone();
    if nic_irqs.is_empty() {
        return vec!["no NIC IRQs placed".into()];
    }
    let interrupts = crate::irq::parse_interrupts(
        &std::fs::read_to_string("/proc/interrupts").unwrap_or_default(),
    );
    let mut out = Vec::new();
    for (nic, irqs) in nic_irqs {
        out.push(format!("{nic}:"));
        out.extend(crate::irq::table(&irqs, &interrupts));
    }
    out
}

fn net() -> Vec<String> {
    let mut out = vec!["listening:".to_string()];
    out.extend(
        crate::netstat::listening_lines()
            .into_iter()
            .map(|l| format!("  {l}")),
    );
    out.push("addresses:".into());
    out.extend(
        ringstore_sys::interface_addresses()
            .into_iter()
            .map(|(name, ip)| format!("  {name} {ip}")),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_split_and_bounded() {
        let mut reader = LineReader {
            pending: Vec::new(),
            discarding: false,
            after_cr: false,
        };
        assert_eq!(reader.feed(b"hel"), vec![]);
        assert_eq!(reader.feed(b"p\r\nstat"), vec![Some("help".to_string())]);
        assert_eq!(reader.feed(b"us\n"), vec![Some("status".to_string())]);
        let long = vec![b'x'; COMMAND_MAX + 10];
        assert_eq!(reader.feed(&long), vec![]);
        assert_eq!(reader.feed(b"\nlog\n"), vec![None, Some("log".to_string())]);
        assert_eq!(
            reader.feed(b"\r\n\n"),
            vec![Some(String::new()), Some(String::new())],
            "CRLF is one line end"
        );
    }

    #[test]
    fn commands_answer() {
        assert!(execute("help").iter().any(|l| l.starts_with("poweroff")));
        assert_eq!(
            execute("bogus"),
            vec!["unknown command \"bogus\"; try help".to_string()]
        );
        assert!(execute("").is_empty());
        assert!(execute("threads").len() >= 2 && execute("threads")[0].contains("capeff"));
        assert_eq!(execute("stats").last().map(String::as_str), Some("END"));
    }
}
