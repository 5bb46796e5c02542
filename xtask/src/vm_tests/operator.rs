//! The operator console QEMU test (ADR-0023, docs/CONSOLE.md), one numa2 boot driven through the
//! host-side client (`ringstore_console::client`, what `ringstore console` runs): commands before
//! login are refused, a wrong key is refused and backs off, the test key logs in, and every
//! command's `--json` answer parses and carries its documented fields.

use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use ringstore_console::client::{ClientError, Signer};
use serde_json::Value;

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
            "numa_node",
            "worker_cpus",
            "addresses",
            "serving",
        ],
    ),
    ("stats", &["stats"]),
    ("irq", &["nics"]),
    ("net", &["listening", "addresses"]),
    ("threads", &["threads"]),
    ("log", &["lines"]),
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
    let poweroff = vm.poweroff()?;
    Ok(format!(
        "{} commands' JSON checked ({fields} fields), poweroff in {:.1} s",
        DOCUMENTED.len(),
        poweroff.as_secs_f64()
    ))
}
