//! What the default disk.img gives an operator without a hand-written command line, checked on
//! the boots of the UEFI disk test: the default host name from the NIC's MAC (`status`,
//! memcache `stats`, the login challenge's `host=`), `slots --json`'s fields, the tuning state
//! of a first boot (run-time isolated, boot arguments pending) and a second (fully tuned), and
//! a config partition with a bad key reported in `status` and `tuning`.

use anyhow::{ensure, Result};
use serde_json::Value;

use super::client::{exchange, tcp};
use super::vm::Vm;

/// The name a box with the test NIC (`mac=52:54:00:12:34:56`, `uefi_args`) gives itself.
pub const DEFAULT_HOSTNAME: &str = "ringstore-525400123456";

fn first(answers: Vec<Value>, command: &str) -> Result<Value> {
    answers
        .into_iter()
        .next()
        .ok_or_else(|| anyhow::anyhow!("`{command} --json` gave no answer"))
}

/// `status`, `stats` (console and memcache port) and the login challenge carry the default
/// host name; the JSON says it came from the MAC.
pub fn default_hostname(vm: &mut Vm) -> Result<()> {
    let status = first(vm.json("status")?, "status")?;
    ensure!(
        status["hostname"] == DEFAULT_HOSTNAME
            && status["hostname_from"]
                .as_str()
                .is_some_and(|s| s.starts_with("MAC of ")),
        "`status` hostname: {status}"
    );
    let text = vm.command("status")?;
    ensure!(
        text.lines()
            .any(|l| l.trim() == format!("hostname {DEFAULT_HOSTNAME}")),
        "`status` text:\n{text}"
    );
    let stats = vm.command("stats")?;
    ensure!(
        super::console::stat(&stats, "hostname") == Some(DEFAULT_HOSTNAME),
        "console `stats` hostname:\n{stats}"
    );
    let mut s = tcp(vm.port("memcache", 0)?)?;
    let got = exchange(&mut s, b"stats\r\n", |t| t.ends_with("END\r\n"))?;
    ensure!(
        got.contains(&format!("STAT hostname {DEFAULT_HOSTNAME}\r\n")),
        "memcache `stats` has no hostname line:\n{got}"
    );
    let out = vm.output();
    ensure!(
        out.contains(&format!(
            "ringstore-console v1 host={DEFAULT_HOSTNAME} boot="
        )),
        "the login challenge does not name the host:\n{}",
        vm.tail()
    );
    Ok(())
}

/// `slots --json` on a fresh disk: booted and committed A, each slot's file and size, no
/// trial yet; the text form keeps its lines.
pub fn slots_fields(vm: &mut Vm) -> Result<()> {
    let slots = first(vm.json("slots")?, "slots")?;
    ensure!(
        slots["booted"] == "A"
            && slots["committed"] == "A"
            && slots["slots"][0]["file"] == "EFI/Linux/ringstore-a.efi"
            && slots["slots"][0]["bytes"]
                .as_u64()
                .is_some_and(|b| b > 1 << 20)
            && slots["slots"][1]["slot"] == "B"
            && slots["slots"][1]["empty"] == true
            && slots["last_trial"].is_null(),
        "`slots --json`: {slots}"
    );
    let text = vm.command("slots")?;
    ensure!(
        text.contains("booted A") && text.contains("slot B empty"),
        "`slots`:\n{text}"
    );
    Ok(())
}

/// `tuning --json` is clean and in `state`; `isolated` and `nohz_full` show `isolated` and
/// `nohz` as in effect (`nohz` may carry the pending note).
pub fn tuning_state(vm: &mut Vm, state: &str, nohz: &str) -> Result<Value> {
    let tuning = first(vm.json("tuning")?, "tuning")?;
    let check = |name: &str| {
        tuning["checks"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["check"] == name)
            .cloned()
            .unwrap_or_default()
    };
    let (isolated, nohz_full) = (check("isolated"), check("nohz_full"));
    ensure!(
        tuning["clean"] == true
            && tuning["state"] == state
            && isolated["wanted"] == "1"
            && isolated["actual"] == "1"
            && nohz_full["actual"]
                .as_str()
                .is_some_and(|a| a.starts_with(nohz)),
        "`tuning --json` (wanted {state}, nohz_full {nohz}): {tuning}"
    );
    let text = vm.command("tuning")?;
    ensure!(text.contains(": clean"), "`tuning`:\n{text}");
    Ok(tuning)
}

/// A config partition whose ringstore.toml has a key the box refuses: ignored whole (the
/// image's `max_conns` 500 serves), and `status` and `tuning` name the file and the error.
pub fn bad_config_reported(vm: &mut Vm) -> Result<()> {
    let status = first(vm.json("status")?, "status")?;
    let partition = &status["config_partition"];
    ensure!(
        partition["ok"] == false
            && partition["file"]
                .as_str()
                .is_some_and(|f| f.ends_with("ringstore.toml"))
            && partition["error"]
                .as_str()
                .is_some_and(|e| e.contains("colour")),
        "`status` config_partition: {status}"
    );
    let text = vm.command("status")?;
    ensure!(
        text.lines().any(|l| l.contains("config_partition")
            && l.contains("FAILED")
            && l.contains("colour")),
        "`status` text:\n{text}"
    );
    let stats = vm.command("stats")?;
    ensure!(
        super::console::stat(&stats, "max_connections") == Some("500"),
        "the refused partition's max_conns took effect:\n{stats}"
    );
    let tuning = first(vm.json("tuning")?, "tuning")?;
    ensure!(
        tuning["clean"] == false
            && tuning["checks"].as_array().into_iter().flatten().any(|c| {
                c["check"] == "config"
                    && c["difference"] == true
                    && c["actual"].as_str().is_some_and(|a| a.contains("colour"))
            }),
        "`tuning` does not show the refused config partition: {tuning}"
    );
    Ok(())
}
