//! The operator console QEMU test (ADR-0023, docs/CONSOLE.md), one numa2 boot driven through the
//! host-side client (`ringstore_console::client`, what `ringstore console` runs): commands before
//! login are refused, a wrong key is refused and backs off, the test key logs in, and every
//! command's `--json` answer parses and carries its documented fields.

use std::io::Write;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use ringstore_console::client::{ClientError, Signer};
use serde_json::Value;

use super::client::{exchange, tcp};
use super::vm::Vm;
use super::{BOOT_LIMIT, COMMAND_LIMIT, PROMPT};
use crate::image::Image;

/// A value set on the kernel command line, which `config` must show as coming from there.
const CMDLINE_KEY: (&str, &str) = ("max-conns", "777");

/// The fields each command's JSON answer documents (docs/CONSOLE.md), besides v, cmd and ok.
pub(super) const DOCUMENTED: &[(&str, &[&str])] = &[
    ("help", &["commands"]),
    (
        "status",
        &[
            "version",
            "kernel",
            "uptime_s",
            "hostname",
            "hostname_from",
            "config_partition",
            "secure_boot",
            "numa_node",
            "worker_cpus",
            "addresses",
            "serving",
        ],
    ),
    ("stats", &["stats"]),
    ("hotkeys", &["hotkeys"]),
    ("irq", &["nics"]),
    ("net", &["listening", "addresses"]),
    ("threads", &["threads"]),
    ("log", &["lines"]),
    ("config", &["settings"]),
    ("keys", &["keys", "password", "problems"]),
    ("data", &["device", "state"]),
    (
        "tuning",
        &[
            "clean",
            "differences",
            "checks",
            "serving_node",
            "worker_cpus",
            "state",
            "secure_boot",
        ],
    ),
    (
        "slots",
        &["esp", "booted", "committed", "slots", "last_trial"],
    ),
];

/// One answer object of `command`, checked for schema, name, ok and `fields`.
fn answer(vm: &mut Vm, command: &str, fields: &[&str]) -> Result<Value> {
    let objects = vm
        .client()
        .run(command)
        .with_context(|| format!("`{command} --json`"))?;
    ensure!(
        objects.len() == 1,
        "`{command} --json` gave {} objects: {objects:?}",
        objects.len()
    );
    let object = objects.into_iter().next().unwrap_or_default();
    let name = command.split_whitespace().next().unwrap_or_default();
    ensure!(
        object["v"] == 1 && object["cmd"] == name && object["ok"] == true,
        "`{command} --json`: {object}"
    );
    for field in fields {
        ensure!(
            object.get(*field).is_some(),
            "`{command} --json` has no {field:?}: {object}"
        );
    }
    Ok(object)
}

pub fn console_login_and_json(image: &Image) -> Result<String> {
    let append = format!("ringstore.{}={}", CMDLINE_KEY.0, CMDLINE_KEY.1);
    let mut vm = Vm::boot(image, "console_login", "numa2", &append)?;
    let ready = vm.wait_for("ringstore: ready memcache=", 0, BOOT_LIMIT)?;
    vm.wait_for(PROMPT, ready, COMMAND_LIMIT)?;

    // Before login: only help and login answer; the log ring is closed.
    for command in ["status", "log", "stats", "poweroff"] {
        let objects = vm.client().run(command)?;
        let refused = objects.first().cloned().unwrap_or_default();
        ensure!(
            refused["ok"] == false
                && refused["error"]
                    .as_str()
                    .is_some_and(|e| e.contains("log in first")),
            "`{command}` before login: {refused}"
        );
    }
    answer(&mut vm, "help", &["commands"])?;

    // A wrong key: refused, then the back-off refuses the next attempt at once.
    let wrong = Signer::from_key_file(&crate::image::test_key().with_file_name("wrong_ed25519"))?;
    let refused = vm.client().login(&wrong);
    let refused_at = Instant::now();
    ensure!(
        matches!(&refused, Err(ClientError::Refused(why)) if why.contains("next attempt in 1 s")),
        "the wrong key: {refused:?}"
    );
    let again = vm.client().login(&wrong);
    ensure!(
        matches!(&again, Err(ClientError::Refused(why)) if why.contains("wait")),
        "a second attempt inside the back-off: {again:?}"
    );
    // The right key, once the second failure's... (the refused-by-back-off attempt is not a
    // failure): after 1 s.
    std::thread::sleep(Duration::from_millis(1100).saturating_sub(refused_at.elapsed()));
    let who = vm.login()?;
    ensure!(
        who.comment.contains("test-only") && who.fingerprint.starts_with("SHA256:"),
        "{who:?}"
    );

    let mut fields = 0;
    for (command, documented) in DOCUMENTED {
        let object = answer(&mut vm, command, documented)?;
        fields += documented.len();
        if *command == "log" {
            let lines = object["lines"].as_array().context("log lines")?;
            ensure!(
                lines
                    .iter()
                    .any(|l| l.as_str().is_some_and(|l| l.contains("logged in")))
                    && lines
                        .iter()
                        .any(|l| l.as_str().is_some_and(|l| l.contains("login refused"))),
                "the log shows no login events: {object}"
            );
        }
    }
    let config = answer(&mut vm, "config", &["settings"])?;
    let origin = |key: &str| {
        config["settings"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|s| s["key"] == key)
            .map(|s| (s["value"].to_string(), s["origin"].to_string()))
    };
    ensure!(
        origin(CMDLINE_KEY.0)
            == Some((
                format!("\"{}\"", CMDLINE_KEY.1),
                "\"kernel-cmdline\"".into()
            ))
            && origin("http").is_some_and(|(_, o)| o == "\"default\""),
        "config does not show {CMDLINE_KEY:?} from the kernel command line: {config}"
    );
    let tuning = answer(&mut vm, "tuning", &["clean"])?;
    ensure!(
        tuning["clean"] == true,
        "tuning on numa2 is not clean: {tuning}"
    );
    flush_asks_and_flushes(&mut vm)?;
    watch_shows_a_store(&mut vm)?;
    let drained = drain_refuses_new_and_finishes_in_flight(&mut vm)?;
    let poweroff = vm.poweroff()?;
    Ok(format!(
        "{} commands' JSON checked ({fields} fields), tuning clean, {drained}, poweroff in {:.1} s",
        DOCUMENTED.len(),
        poweroff.as_secs_f64()
    ))
}

/// `watch mutations --count 1`: the line of a set made on the memcache port while it
/// watches, then it stops at its count (a client sets every 300 ms, at most 10 s, so one
/// set lands after the watcher joined).
fn watch_shows_a_store(vm: &mut Vm) -> Result<()> {
    let port = vm.port("memcache", 0)?;
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let setter = {
        let done = std::sync::Arc::clone(&done);
        std::thread::spawn(move || -> Result<()> {
            let mut conn = tcp(port)?;
            let until = Instant::now() + Duration::from_secs(10);
            while !done.load(std::sync::atomic::Ordering::Relaxed) && Instant::now() < until {
                exchange(&mut conn, b"set watchkey 0 0 1\r\nx\r\n", |t| {
                    t.ends_with("\r\n")
                })?;
                std::thread::sleep(Duration::from_millis(300));
            }
            Ok(())
        })
    };
    let watched = answer(
        vm,
        "watch mutations --count 1 --secs 15",
        &["count", "stopped_by", "lines"],
    );
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let set = setter
        .join()
        .map_err(|_| anyhow::anyhow!("the setter panicked"))?;
    let watched = watched?;
    set?;
    ensure!(
        watched["count"] == 1
            && watched["stopped_by"] == "count"
            && watched["lines"][0]
                .as_str()
                .is_some_and(|l| l.contains(" type=item_store key=watchkey status=stored cmd=set ")),
        "watch: {watched}"
    );
    Ok(())
}

/// `flush` without `--yes` asks and keeps the items; `flush --yes` drops them.
fn flush_asks_and_flushes(vm: &mut Vm) -> Result<()> {
    let port = vm.port("memcache", 0)?;
    let mut conn = tcp(port)?;
    let set = |conn: &mut std::net::TcpStream| {
        exchange(conn, b"set fl 0 0 1\r\nx\r\n", |t| t.ends_with("\r\n"))
    };
    let get =
        |conn: &mut std::net::TcpStream| exchange(conn, b"get fl\r\n", |t| t.ends_with("END\r\n"));
    ensure!(set(&mut conn)? == "STORED\r\n");
    let asked = vm.client().run("flush")?;
    ensure!(
        asked[0]["ok"] == false && asked[0]["confirm"] == "flush --yes",
        "{asked:?}"
    );
    ensure!(
        get(&mut conn)?.contains("VALUE fl"),
        "flush without --yes flushed"
    );
    let flushed = answer(vm, "flush --yes", &["flushed"])?;
    ensure!(flushed["flushed"] == true, "{flushed}");
    let after = get(&mut conn)?;
    ensure!(after == "END\r\n", "after flush --yes: {after:?}");
    Ok(())
}

/// `drain`: a request in flight on an open connection completes, a new connection is refused,
/// `drain` reports the open connection and then none once it closed; `undrain` accepts again.
fn drain_refuses_new_and_finishes_in_flight(vm: &mut Vm) -> Result<String> {
    let port = vm.port("memcache", 0)?;
    let mut in_flight = tcp(port)?;
    // Half a set: the server holds the request until its data arrives.
    in_flight.write_all(b"set drainkey 0 0 10\r\n01234")?;
    std::thread::sleep(Duration::from_millis(300));
    let first = answer(
        vm,
        "drain --wait 0",
        &["draining", "connections_open", "waited_s"],
    )?;
    ensure!(
        first["connections_open"].as_u64() >= Some(1),
        "drain sees no open connection: {first}"
    );
    let mut refused = tcp(port)?;
    let answer_new =
        exchange(&mut refused, b"get drainkey\r\n", |t| t.ends_with("\r\n")).unwrap_or_default();
    ensure!(
        answer_new.starts_with("ERROR Too many open connections"),
        "a new connection while draining got {answer_new:?}"
    );
    let stored = exchange(&mut in_flight, b"56789\r\n", |t| t.ends_with("\r\n"))?;
    ensure!(
        stored == "STORED\r\n",
        "the in-flight set while draining answered {stored:?}"
    );
    drop(in_flight);
    drop(refused);
    let second = answer(vm, "drain --wait 20", &["connections_open"])?;
    ensure!(
        second["connections_open"] == 0,
        "connections left after they closed: {second}"
    );
    answer(vm, "undrain", &["draining"])?;
    let mut again = tcp(port)?;
    let got = exchange(&mut again, b"get drainkey\r\n", |t| t.ends_with("END\r\n"))?;
    ensure!(
        got.starts_with("VALUE drainkey 0 10\r\n0123456789"),
        "after undrain: {got:?}"
    );
    Ok(format!(
        "drained with {} open, then 0 in {} s",
        first["connections_open"], second["waited_s"]
    ))
}

/// numa2-mistuned (worker CPU 3 left out of isolcpus and nohz_full): `tuning` names both.
pub fn tuning_names_each_difference(image: &Image) -> Result<String> {
    let mut vm = Vm::boot(image, "tuning_mistuned", "numa2-mistuned", "")?;
    let ready = vm.wait_for("ringstore: ready memcache=", 0, BOOT_LIMIT)?;
    vm.wait_for(PROMPT, ready, COMMAND_LIMIT)?;
    vm.login()?;
    let tuning = answer(&mut vm, "tuning", &["clean", "differences", "checks"])?;
    let named: Vec<String> = tuning["checks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["difference"] == true)
        .map(|c| {
            format!(
                "{} {}",
                c["check"].as_str().unwrap_or("?"),
                c["note"].as_str().unwrap_or("")
            )
        })
        .collect();
    ensure!(
        tuning["clean"] == false,
        "the mis-tuned profile is clean: {tuning}"
    );
    for check in ["isolated", "nohz_full"] {
        ensure!(
            named
                .iter()
                .any(|n| n.starts_with(check) && n.contains("worker CPUs 3 are not")),
            "`tuning` does not name {check} of CPU 3: {named:?}"
        );
    }
    let text = vm.command("tuning")?;
    ensure!(text.contains("DIFF isolated"), "text form: {text}");
    vm.poweroff()?;
    Ok(named.join("; "))
}
