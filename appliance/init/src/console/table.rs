//! The one command table: name, aliases, usage, one-line help and who may run it. `help` is
//! generated from it (here, beside it) and [`dispatch`] runs from it, so the two cannot drift
//! apart. Every command takes `--json` (anywhere on the line).

use std::time::Instant;

use super::commands as c;
use super::ctx::Ctx;
use super::output::Output;
use super::session::Session;
use crate::machine::Machine;

/// Who may run a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Before login too: only `help` and `login`.
    Open,
    LoggedIn,
}

pub struct Command {
    pub name: &'static str,
    pub aliases: &'static [&'static str],
    /// Arguments after the name, as help shows them.
    pub usage: &'static str,
    pub help: &'static str,
    pub access: Access,
    pub run: fn(&mut Ctx, &[&str]) -> Output,
}

use Access::{LoggedIn, Open};

/// Every console command, in the order `help` lists them.
pub static COMMANDS: &[Command] = &[
    Command { name: "help", aliases: &["?"], usage: "", help: "this list", access: Open, run: help },
    Command { name: "login", aliases: &[], usage: "[password]", help: "log in: sign the challenge with your SSH key (ssh-keygen -Y sign -n ringstore-console), or a password", access: Open, run: c::login },
    Command { name: "logout", aliases: &["exit"], usage: "", help: "end this session", access: LoggedIn, run: c::logout },
    Command { name: "status", aliases: &[], usage: "", help: "version, uptime, NUMA node, CPUs, memory, huge pages, addresses, connections", access: LoggedIn, run: c::status },
    Command { name: "stats", aliases: &[], usage: "", help: "the memcache `stats` counters, read in-process", access: LoggedIn, run: c::stats },
    Command { name: "config", aliases: &[], usage: "", help: "the effective configuration, each value with its origin (default, image, config-partition, kernel-cmdline)", access: LoggedIn, run: c::config },
    Command { name: "keys", aliases: &[], usage: "", help: "the console's authorized keys, each with its source (image, config-partition), the password, what was skipped", access: LoggedIn, run: c::keys },
    Command { name: "certs", aliases: &[], usage: "[reload]", help: "the TLS certificate: subject, expiry, days left (a warning under 14); reload: read the config partition's /tls/ again (new handshakes get it, open sessions keep theirs)", access: LoggedIn, run: super::certs::run },
    Command { name: "auth", aliases: &[], usage: "[reload]", help: "where the users file (auth_file) and tokens file (http_tokens) come from; reload: read the config partition's /auth/ again (removed users' connections are closed, a removed token's next request is 401)", access: LoggedIn, run: super::auth::run },
    Command { name: "data", aliases: &[], usage: "[rekey | reseal [cancel]]", help: "the data device: layout, records, live and used bytes per region, compactions, damaged and refused records, the rekey; `data rekey`: a new TPM-sealed data key, the old records rewritten in the background; `data reseal`: before a deliberate change of the Secure Boot keys or state, lets the next boot open the device and seal the key to its PCR 7 (`cancel` undoes it)", access: LoggedIn, run: c::data },
    Command { name: "drain", aliases: &[], usage: "[--wait SECS]", help: "refuse new connections, wait (default 30 s) for open ones to close, report what is left", access: LoggedIn, run: c::drain },
    Command { name: "undrain", aliases: &[], usage: "", help: "accept new connections again", access: LoggedIn, run: c::undrain },
    Command { name: "flush", aliases: &[], usage: "--yes", help: "memcache flush_all: drop every item (asks for --yes)", access: LoggedIn, run: c::flush },
    Command { name: "tuning", aliases: &[], usage: "", help: "what the topology calls for vs what is in effect (NIC node, huge pages, isolated/nohz_full CPUs, IRQs, queues, XDP, RPS/XPS): every difference", access: LoggedIn, run: c::tuning },
    Command { name: "irq", aliases: &[], usage: "", help: "IRQ -> CPU affinity of the NIC queues", access: LoggedIn, run: c::irq },
    Command { name: "net", aliases: &[], usage: "", help: "listening TCP/UDP sockets and interface addresses", access: LoggedIn, run: c::net },
    Command { name: "threads", aliases: &[], usage: "", help: "every thread with its effective/permitted/bounding capabilities and no_new_privs", access: LoggedIn, run: c::threads },
    Command { name: "watch", aliases: &[], usage: "[KIND ...] [--count N] [--secs S]", help: "memcached's watch log lines (fetchers, mutations, evictions, connevents) until a key, N lines (1000) or S seconds (10, at most 600)", access: LoggedIn, run: super::watch::run },
    Command { name: "hotkeys", aliases: &[], usage: "[N]", help: "the N keys (10, at most 100) read and written most, with estimated requests, from the server's sampled sketches (memcache `stats hotkeys N`)", access: LoggedIn, run: super::hotkeys::run },
    Command { name: "log", aliases: &[], usage: "", help: "recent log lines (logins and every command included)", access: LoggedIn, run: c::log },
    Command { name: "slots", aliases: &[], usage: "", help: "the A/B slots: booted, committed, their images, the last trial (ADR 0025)", access: LoggedIn, run: c::slots },
    Command { name: "update", aliases: &[], usage: "URL", help: "fetch a signed ringstore.efi (http://IP[:PORT]/PATH and PATH.sig), write the inactive slot, reboot into it for a trial", access: LoggedIn, run: c::update },
    Command { name: "reboot", aliases: &[], usage: "[--firmware]", help: "stop serving, seal the RAM tier, sync, kexec into the committed slot (--firmware: a full reboot, the RAM tier lost)", access: LoggedIn, run: c::reboot },
    Command { name: "poweroff", aliases: &["halt", "shutdown"], usage: "", help: "stop serving, sync, power off (the RAM tier is lost)", access: LoggedIn, run: c::poweroff },
];

pub fn find(name: &str) -> Option<&'static Command> {
    COMMANDS
        .iter()
        .find(|c| c.name == name || c.aliases.contains(&name))
}

/// `help`: the table's listing.
fn help(_: &mut Ctx, _: &[&str]) -> Output {
    listing()
}

/// Every command with its usage and help, in table order.
fn listing() -> Output {
    let mut out = Output::new();
    let mut list = Vec::new();
    for c in COMMANDS {
        let head = if c.usage.is_empty() {
            c.name.to_string()
        } else {
            format!("{} {}", c.name, c.usage)
        };
        out.line(format!("{head:<18} {}", c.help));
        list.push(serde_json::json!({
            "name": c.name, "aliases": c.aliases, "usage": c.usage, "help": c.help,
            "login_required": c.access == LoggedIn,
        }));
    }
    out.line("every command takes --json: one `@json {...}` line, then `@end` (docs/CONSOLE.md)");
    out.line("before login only help and login answer");
    out.set("commands", list);
    out
}

/// Runs one command line against `machine`; returns the lines to print.
pub fn dispatch(session: &mut Session, machine: &Machine, line: &str, now: Instant) -> Vec<String> {
    let mut words: Vec<&str> = line.split_whitespace().collect();
    let json = words.contains(&"--json");
    words.retain(|w| *w != "--json");
    let Some((&name, args)) = words.split_first() else {
        return Vec::new();
    };
    let Some(command) = find(name) else {
        let shown: String = name.chars().take(64).collect();
        return Output::error(format!("unknown command {shown:?}; try help")).render(name, json);
    };
    let who = session.who().map(|w| w.to_string());
    if command.access == LoggedIn && who.is_none() {
        return Output::error("log in first (`login`; `help` lists the commands)")
            .render(command.name, json);
    }
    if let Some(who) = &who {
        crate::info!("console: {who}: {}", words.join(" "));
    }
    let mut ctx = Ctx {
        session,
        machine,
        now,
        json,
    };
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        (command.run)(&mut ctx, args)
    }));
    match outcome {
        Ok(out) => out.render(command.name, json),
        Err(_) => Output::error("the command failed (panic logged)").render(command.name, json),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn help_lists_every_command_once_and_names_resolve() {
        let help = listing();
        for c in COMMANDS {
            assert_eq!(
                help.text
                    .iter()
                    .filter(|l| l.starts_with(&format!("{} ", c.name)))
                    .count(),
                1,
                "{}",
                c.name
            );
            assert!(std::ptr::eq(find(c.name).unwrap(), c));
            for a in c.aliases {
                assert_eq!(find(a).unwrap().name, c.name);
            }
        }
        let names: Vec<&str> = COMMANDS
            .iter()
            .flat_map(|c| std::iter::once(c.name).chain(c.aliases.iter().copied()))
            .collect();
        let mut dedup = names.clone();
        dedup.sort();
        dedup.dedup();
        assert_eq!(names.len(), dedup.len(), "a name or alias twice");
        assert_eq!(
            help.fields["commands"].as_array().unwrap().len(),
            COMMANDS.len()
        );
    }

    #[test]
    fn before_login_only_help_and_login_answer() {
        let mut s = Session::new("h", "b");
        let m = Machine::default();
        let now = Instant::now();
        for c in COMMANDS.iter().filter(|c| c.access == LoggedIn) {
            let out = dispatch(&mut s, &m, &format!("{} --json", c.name), now);
            assert!(
                out[0].contains("\"ok\":false") && out[0].contains("log in first"),
                "{}: {out:?}",
                c.name
            );
            assert_eq!(
                dispatch(&mut s, &m, c.name, now),
                ["error: log in first (`login`; `help` lists the commands)"]
            );
        }
        assert!(dispatch(&mut s, &m, "help", now)
            .iter()
            .any(|l| l.starts_with("poweroff")));
        assert!(dispatch(&mut s, &m, "help --json", now)[0].starts_with("@json {"));
        assert_eq!(
            dispatch(&mut s, &m, "bogus", now),
            ["error: unknown command \"bogus\"; try help"]
        );
        assert!(dispatch(&mut s, &m, "", now).is_empty());
        assert!(dispatch(&mut s, &m, "   --json ", now).is_empty());
    }
}
