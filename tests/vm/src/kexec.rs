//! The RAM tier across a kexec reboot (issue 34, ADR 0054): disk.img under OVMF with a
//! `memmap=` reservation, 20,000 keys set from the host, `reboot` (a kexec jump, no firmware)
//! and `update` to slot B (a kexec jump, the trial committing it) while a host probe measures
//! how long the memcache port goes unanswered, every key compared after each, and a Zipf read
//! load's hit ratio in the 60 s before the update against the 60 s after it; then a seal
//! corrupted in guest memory between the jump and the new
//! PID 1 (through QEMU's gdbstub, physical-memory mode): a cold start whose reason `status`
//! shows, and no wrong value. The same boot goes on (each jump costs seconds, a fresh boot
//! minutes under TCG): refilled, an `update` to an image that never becomes ready fails its
//! trial and jumps back to the committed slot B, every key still there; last an `update` to an
//! image with another store layout commits with a cold start whose reason `status` shows.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};

use super::client::tcp;
use super::uefi::{on_slot_b, serve_files, test_images, Removed, UefiMachine, READY};
use super::vm::{scratch_dir, Vm};
use super::zipf::{values, Keys, Window, ZipfLoad};
use super::{BOOT_LIMIT, PROMPT};
use crate::image::Image;

/// A RAM-only box (no data device: its recovery would be authoritative) with 128 MiB of
/// items in a 256 MiB reservation at 1 GiB; `nokaslr` keeps the firmware boot's EFI stub from
/// placing the kernel inside the reservation (ADR 0054).
const APPEND: &str = "ringstore.data=off ringstore.memory=128M memmap=256M!1G nokaslr";
/// The reservation's physical start (the `!1G` above).
const RESERVED_AT: u64 = 1 << 30;
const KEYS: usize = 20_000;
/// Keys per pipelined batch (sets) and per multi-get.
const BATCH: usize = 500;
const GET_BATCH: usize = 100;
/// The hit-ratio windows before and after the update (issue 34: 60 s each).
const ZIPF_WINDOW: Duration = Duration::from_secs(60);
/// How far the hit ratio after the update may fall below (or rise above) the one before it,
/// in points.
const ZIPF_POINTS: f64 = 1.0;

/// What the test saw.
pub struct KexecReport {
    /// How long the memcache port went unanswered: the `reboot`, then the `update`.
    pub outages: Vec<Duration>,
    /// Where each of those went ([`steps_line`]).
    pub steps: Vec<String>,
    /// Keys that answered their exact value after each reboot.
    pub kept: Vec<usize>,
    /// `status`'s RAM tier line after the corrupted seal.
    pub cold_line: String,
    /// `status`'s RAM tier line after the update to another store layout.
    pub layout_line: String,
    /// The Zipf read load in the 60 s before the update and the 60 s after it.
    pub zipf: (Window, Window),
}

fn key(i: usize) -> String {
    format!("kx{i:05}")
}

/// Item `i`'s value and flags: its own number first, a length that varies with it.
fn item(i: usize) -> (String, u32) {
    let v = format!("v{i:05}-{}", "abcdefghij".repeat(i % 7 + 1));
    (v, u32::try_from(i % 1000).unwrap_or(0))
}

/// Whether `key` answered its item's exact value and flags.
fn is_exact(key: &str, flags: &str, value: &str) -> bool {
    key.strip_prefix("kx")
        .and_then(|n| n.parse::<usize>().ok())
        .is_some_and(|i| {
            let (v, fl) = item(i);
            value == v && flags == fl.to_string()
        })
}

/// Sets every key, pipelined in batches, each acknowledged STORED.
fn fill(port: u16) -> Result<()> {
    let mut s = tcp(port)?;
    for start in (0..KEYS).step_by(BATCH) {
        let mut req = String::new();
        for i in start..(start + BATCH).min(KEYS) {
            let (v, flags) = item(i);
            req.push_str(&format!("set {} {flags} 0 {}\r\n{v}\r\n", key(i), v.len()));
        }
        s.write_all(req.as_bytes())?;
        let want = (start + BATCH).min(KEYS) - start;
        let got = read_until(&mut s, |t| t.matches("\r\n").count() >= want)?;
        ensure!(
            got.matches("STORED\r\n").count() == want,
            "fill at {start}: {:?}",
            &got[..got.len().min(200)]
        );
    }
    Ok(())
}

fn read_until(s: &mut TcpStream, done: impl Fn(&str) -> bool) -> Result<String> {
    let mut got = Vec::new();
    let mut buf = [0u8; 65536];
    while !done(&String::from_utf8_lossy(&got)) {
        let n = s.read(&mut buf)?;
        ensure!(n > 0, "connection closed");
        got.extend_from_slice(&buf[..n]);
    }
    Ok(String::from_utf8_lossy(&got).into_owned())
}

/// Every key read back: (exact value and flags, wrong ones as `key: what`).
fn compare(port: u16) -> Result<(usize, Vec<String>)> {
    let mut s = tcp(port)?;
    let (mut exact, mut wrong) = (0, Vec::new());
    for start in (0..KEYS).step_by(GET_BATCH) {
        let end = (start + GET_BATCH).min(KEYS);
        let keys: Vec<String> = (start..end).map(key).collect();
        s.write_all(format!("get {}\r\n", keys.join(" ")).as_bytes())?;
        let got = read_until(&mut s, |t| t.ends_with("END\r\n"))?;
        for (k, flags, value) in values(&got) {
            if is_exact(k, flags, value) {
                exact += 1;
            } else {
                wrong.push(format!("{k}: flags {flags} value {value:?}"));
            }
        }
    }
    Ok((exact, wrong))
}

/// A host-side probe of the memcache port: `version` every 50 ms, each try bounded.
struct Probe {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Vec<(Instant, bool)>>,
}

impl Probe {
    fn start(port: u16) -> Probe {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut seen = Vec::new();
            while !flag.load(Ordering::Relaxed) {
                seen.push((Instant::now(), answers(port)));
                std::thread::sleep(Duration::from_millis(50));
            }
            seen
        });
        Probe { stop, thread }
    }

    /// The longest stretch between two answered probes around unanswered ones: its length
    /// and its ends (the last answer before it, the first after).
    fn outage(self) -> Result<(Duration, Option<(Instant, Instant)>)> {
        self.stop.store(true, Ordering::Relaxed);
        let seen = self
            .thread
            .join()
            .map_err(|_| anyhow::anyhow!("probe panicked"))?;
        let mut last_ok = None;
        let mut worst = (Duration::ZERO, None);
        let mut failed = false;
        for (at, ok) in seen {
            if ok {
                if let (Some(before), true) = (last_ok, failed) {
                    if at - before > worst.0 {
                        worst = (at - before, Some((before, at)));
                    }
                }
                last_ok = Some(at);
                failed = false;
            } else {
                failed = true;
            }
        }
        Ok(worst)
    }
}

/// The steps of a jump as the serial console shows them: a needle, and whether it is a
/// kernel record (else PID 1's output). The host notes when each first arrives.
const STEPS: [(&str, &str, bool); 10] = [
    ("stop", "stopping the server", false),
    ("sealed", "memory-file: sealed", false),
    ("jump", "jumping into the loaded kernel", false),
    ("kexec", "Starting new kernel", true),
    ("kernel", "Linux version", true),
    ("/init", "Run /init", true),
    ("pid1", "ringstore-init", false),
    ("ram tier", "ram tier:", false),
    ("resumed", "memory-file /dev/dax", false),
    ("ready", "ringstore: ready memcache=", false),
];

/// Polls the console (10 ms) until the last of [`STEPS`] arrives after the offsets `from`
/// (PID 1's output, the kernel's records); when each arrived.
fn watch_steps(vm: &Vm, from: (usize, usize)) -> Result<Vec<Option<Instant>>> {
    let mut seen = vec![None; STEPS.len()];
    let deadline = Instant::now() + BOOT_LIMIT;
    while seen.last().is_some_and(Option::is_none) {
        ensure!(Instant::now() < deadline, "no ready line:\n{}", vm.tail());
        let (out, kernel) = (vm.output(), vm.kernel_log());
        for (i, (_, needle, in_kernel)) in STEPS.iter().enumerate() {
            let text = if *in_kernel {
                kernel.get(from.1.min(kernel.len())..)
            } else {
                out.get(from.0.min(out.len())..)
            };
            if seen[i].is_none() && text.is_some_and(|t| t.contains(needle)) {
                seen[i] = Some(Instant::now());
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(seen)
}

/// The steps as `name +MS` after the last answer before the outage, and the first answer
/// after it.
fn steps_line(seen: &[Option<Instant>], gap: Option<(Instant, Instant)>) -> String {
    let Some((before, after)) = gap else {
        return "no outage seen".into();
    };
    let ms = |at: Instant| match at.checked_duration_since(before) {
        Some(d) => format!("+{}", d.as_millis()),
        None => format!("-{}", before.duration_since(at).as_millis()),
    };
    let mut parts: Vec<String> = STEPS
        .iter()
        .zip(seen)
        .filter_map(|((name, _, _), at)| Some(format!("{name} {}", ms((*at)?))))
        .collect();
    parts.push(format!("answered {}", ms(after)));
    parts.join(", ")
}

fn answers(port: u16) -> bool {
    let Ok(mut s) =
        TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(300))
    else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(300)));
    let mut buf = [0u8; 64];
    s.write_all(b"version\r\n").is_ok()
        && s.read(&mut buf)
            .is_ok_and(|n| buf[..n].starts_with(b"VERSION"))
}

/// What [`measured_jump`] saw: the outage, where it went ([`steps_line`]), and its ends (the
/// last answer before it, the first after).
type Jumped = (Duration, String, Option<(Instant, Instant)>);

/// `command` (`reboot`, `update URL`) with the probe running; the outage once the new system
/// serves again, and where it went (when each step reached the console, [`steps_line`]).
fn measured_jump(vm: &mut Vm, port: u16, command: &str) -> Result<Jumped> {
    let probe = Probe::start(port);
    std::thread::sleep(Duration::from_millis(300));
    let from = (vm.output().len(), vm.kernel_log().len());
    vm.command_no_wait(command)?;
    let seen = watch_steps(vm, from)?;
    let ready = vm.wait_for(READY, from.0, Duration::from_secs(5))?;
    vm.wait_for(PROMPT, ready, Duration::from_secs(20))?;
    // The probe must see the port answer again before it stops.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !answers(port) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(200));
    let (outage, gap) = probe.outage()?;
    // PID 1's own lines from its start to ready, with their uptimes: where its part went.
    let log = vm.command("log")?;
    let start = log.rfind("ringstore-init").unwrap_or(0);
    let start = log[..start].rfind('\n').map_or(0, |i| i + 1);
    let end = log[start..]
        .find("ready memcache")
        .map_or(log.len(), |i| start + i);
    eprintln!("{command}: PID 1's log to ready:\n{}", &log[start..end]);
    Ok((outage, steps_line(&seen, gap), gap))
}

/// `command` at the console: `between` runs once the old system jumped, then the new one is
/// waited for to its prompt.
fn jump(vm: &mut Vm, command: &str, between: impl FnOnce(&mut Vm) -> Result<()>) -> Result<()> {
    let from = vm.output().len();
    vm.command_no_wait(command)?;
    vm.wait_for(
        "jumping into the loaded kernel",
        from,
        Duration::from_secs(60),
    )?;
    between(vm)?;
    let ready = vm.wait_for(READY, from, BOOT_LIMIT)?;
    vm.wait_for(PROMPT, ready, Duration::from_secs(20))?;
    Ok(())
}

/// Checks the items after a reboot: at least 99.9 % exact, none wrong; how many were exact.
fn all_kept(vm: &mut Vm, port: u16, when: &str) -> Result<usize> {
    let status = vm.command("status")?;
    ensure!(
        status.contains("this start: resumed"),
        "{when}: the RAM tier was not resumed:\n{status}\n{}",
        vm.tail()
    );
    let (exact, wrong) = compare(port)?;
    ensure!(
        wrong.is_empty(),
        "{when}: wrong values: {:?}",
        &wrong[..wrong.len().min(5)]
    );
    ensure!(
        exact * 1000 >= KEYS * 999,
        "{when}: only {exact} of {KEYS} keys kept"
    );
    Ok(exact)
}

/// `update` to slot B through kexec: the trial's canary commits it, the items stay, and a Zipf
/// read load hits as often in the minute after the outage as in the minute before it.
fn update_keeps_hits(vm: &mut Vm, port: u16, update: &str, report: &mut KexecReport) -> Result<()> {
    let load = ZipfLoad::start(
        port,
        Keys {
            n: KEYS,
            key,
            exact: is_exact,
        },
    );
    std::thread::sleep(ZIPF_WINDOW + Duration::from_secs(1));
    let at = vm.output().len();
    let (outage, steps, gap) = measured_jump(vm, port, update)?;
    report.outages.push(outage);
    report.steps.push(steps);
    let committed = vm.wait_for("slot B committed", at, BOOT_LIMIT)?;
    vm.wait_for(PROMPT, committed, Duration::from_secs(20))?;
    on_slot_b(vm, "last trial A -> B: committed", "after the kexec update")?;
    report
        .kept
        .push(all_kept(vm, port, "after the kexec update")?);
    report.zipf = hit_ratios(load, gap)?;
    Ok(())
}

/// The Zipf load's windows: the 60 s to the last answer before the outage `gap`, the 60 s from
/// the first answer after it (waited for); their hit ratios within [`ZIPF_POINTS`].
fn hit_ratios(load: ZipfLoad, gap: Option<(Instant, Instant)>) -> Result<(Window, Window)> {
    let (last, first) = gap.context("the update's outage was not seen")?;
    let answers = load.finish(first + ZIPF_WINDOW)?;
    let before = Window::of(
        &answers,
        last - ZIPF_WINDOW,
        last + Duration::from_millis(1),
    );
    let after = Window::of(&answers, first, first + ZIPF_WINDOW);
    before.check("before the update", ZIPF_WINDOW)?;
    after.check("after the update", ZIPF_WINDOW)?;
    eprintln!(
        "zipf hit ratio: before the update {:.2} % of {}, after {:.2} % of {}",
        before.ratio(),
        before.lookups(),
        after.ratio(),
        after.lookups()
    );
    ensure!(
        (after.ratio() - before.ratio()).abs() <= ZIPF_POINTS,
        "zipf hit ratio {:.2} % before the update, {:.2} % after: more than {ZIPF_POINTS} point apart",
        before.ratio(),
        after.ratio()
    );
    Ok((before, after))
}

/// Flips bytes across the arena through QEMU's gdbstub (the guest paused meanwhile).
fn corrupt_arena(socket: &Path) -> Result<()> {
    let mut gdb = UnixStream::connect(socket).context("gdbstub socket")?;
    gdb.set_read_timeout(Some(Duration::from_secs(10)))?;
    packet(&mut gdb, "Qqemu.PhyMemMode:1")?;
    let junk = "a5".repeat(1024);
    // Every 2 MiB from 2 MiB on: past the device's info block (at 4 KiB), through its struct
    // pages (which the next kernel writes afresh) and across the arena, whose start (the
    // seal's footer) the device's 2 MiB alignment puts on one of these boundaries.
    for mib in (2..200).step_by(2) {
        let at = RESERVED_AT + (mib << 20);
        packet(&mut gdb, &format!("M{at:x},400:{junk}"))?;
    }
    packet(&mut gdb, "Qqemu.PhyMemMode:0")?;
    // Detach: the guest runs on.
    gdb.write_all(frame("D").as_bytes())?;
    Ok(())
}

fn frame(body: &str) -> String {
    let sum = body.bytes().fold(0u8, u8::wrapping_add);
    format!("${body}#{sum:02x}")
}

/// Sends one gdb remote packet and reads its acknowledgement and reply (`OK` wanted).
fn packet(gdb: &mut UnixStream, body: &str) -> Result<()> {
    gdb.write_all(frame(body).as_bytes())?;
    let mut got = Vec::new();
    let mut buf = [0u8; 256];
    // `+`, then `$REPLY#XX`: whole once two checksum digits follow the `#`.
    let whole = |got: &[u8]| {
        got.iter()
            .position(|b| *b == b'#')
            .is_some_and(|at| got.len() >= at + 3)
    };
    while !whole(&got) {
        let n = gdb.read(&mut buf)?;
        ensure!(n > 0, "gdbstub closed");
        got.extend_from_slice(&buf[..n]);
    }
    gdb.write_all(b"+")?;
    let text = String::from_utf8_lossy(&got);
    ensure!(
        text.contains("$OK#"),
        "gdbstub answered {text:?} to {}",
        &body[..body.len().min(40)]
    );
    Ok(())
}

/// The whole test: fill, two measured kexec reboots, then the corrupted seal.
pub fn kexec_reboot_keeps_the_ram_tier(image: &Image) -> Result<KexecReport> {
    let images = test_images(image, "kexec", APPEND)?;
    // The update: slot B's image, told apart by its connection limit (`on_slot_b`).
    let new = test_images(
        image,
        "kexec-new",
        &format!("{APPEND} ringstore.max_conns=777"),
    )?;
    // Never ready (a bad configuration key, as in the update test): its trial fails.
    let broken = test_images(
        image,
        "kexec-broken",
        &format!("{APPEND} ringstore.memory=1"),
    )?;
    // Another store layout (the largest item is one of the layout words the seal checks):
    // what a build with another store format meets too, a seal it must not resume.
    let layout = test_images(
        image,
        "kexec-layout",
        &format!("{APPEND} ringstore.item_size_max=2M"),
    )?;
    let site = scratch_dir("kexec-site")?;
    let _site_removed = Removed(site.clone());
    for (name, efi) in [("new", &new), ("broken", &broken), ("layout", &layout)] {
        std::fs::copy(&efi.efi, site.join(format!("{name}.efi")))?;
        let sig = efi.signature.as_deref().context("no signature")?;
        std::fs::copy(sig, site.join(format!("{name}.efi.sig")))?;
    }
    let site_port = serve_files(site)?;
    let machine = UefiMachine::new("kexec", &images)?;
    let gdb_socket = crate::image::appliance_dir()
        .join("vm")
        .join("kexec-gdb.sock");
    let _ = std::fs::remove_file(&gdb_socket);
    let extra = [
        "-m".to_string(),
        "2048".to_string(),
        "-gdb".to_string(),
        format!("unix:{},server=on,wait=off", gdb_socket.display()),
    ];
    let mut vm = machine.boot_with("uefi_kexec", &extra)?;
    let ready = vm.wait_for(READY, 0, BOOT_LIMIT)?;
    vm.wait_for(PROMPT, ready, Duration::from_secs(20))?;
    let status = vm.command("status")?;
    ensure!(
        status.contains("ram tier kept across kexec reboots in /dev/dax"),
        "no device-DAX RAM tier:\n{status}\n{}",
        vm.tail()
    );
    let port = vm.port("memcache", 0)?;
    fill(port)?;
    let mut report = KexecReport {
        outages: Vec::new(),
        steps: Vec::new(),
        kept: Vec::new(),
        cold_line: String::new(),
        layout_line: String::new(),
        zipf: Default::default(),
    };
    let (outage, steps, _) = measured_jump(&mut vm, port, "reboot")?;
    report.outages.push(outage);
    report.steps.push(steps);
    report
        .kept
        .push(all_kept(&mut vm, port, "after the kexec reboot")?);
    let url = |name: &str| format!("update http://10.0.2.2:{site_port}/{name}.efi");
    update_keeps_hits(&mut vm, port, &url("new"), &mut report)?;
    jump(&mut vm, "reboot", |_| corrupt_arena(&gdb_socket))?;
    let status = vm.command("status")?;
    let line = status
        .lines()
        .find(|l| l.starts_with("ram tier"))
        .unwrap_or_default()
        .to_string();
    ensure!(
        line.contains("this start: cold start: "),
        "a corrupted seal did not start cold with a reason:\n{status}"
    );
    let (exact, wrong) = compare(port)?;
    ensure!(
        wrong.is_empty() && exact == 0,
        "after the corrupted seal: {exact} kept, wrong {wrong:?}"
    );
    report.cold_line = line;
    fill(port)?;
    report
        .kept
        .push(failed_trial_jumps_back(&mut vm, port, &url("broken"))?);
    report.layout_line = another_layout_starts_cold(&mut vm, port, &url("layout"))?;
    vm.poweroff()?;
    Ok(report)
}

/// `update` (to slot A) with an image whose trial fails: the trial jumps back to the committed
/// slot B (no firmware either way, the trial's watchdog stopped first) and every key is still
/// there; how many were exact.
fn failed_trial_jumps_back(vm: &mut Vm, port: u16, update: &str) -> Result<usize> {
    let at = vm.output().len();
    vm.command_no_wait(update)?;
    let failed = vm.wait_for(
        "last trial of slot A: failed: never became ready",
        at,
        BOOT_LIMIT * 2,
    )?;
    let ready = vm.wait_for(READY, failed, BOOT_LIMIT)?;
    vm.wait_for(PROMPT, ready, Duration::from_secs(20))?;
    let out = vm.output()[at..].to_string();
    let jumps = out.matches("jumping into the loaded kernel").count();
    ensure!(
        jumps == 2
            && out.contains("back to slot B")
            && out.contains("watchdog stopped before the jump")
            && !out.contains("through the firmware"),
        "the failed trial did not go there and back by kexec ({jumps} jumps):\n{}",
        vm.tail()
    );
    on_slot_b(
        vm,
        "last trial B -> A: failed: never became ready",
        "after the failed trial",
    )?;
    all_kept(vm, port, "back from the failed trial")
}

/// `update` (to slot A) with an image of another store layout: its trial starts cold, says
/// why in `status`, commits, and no key answers (none wrong); `status`'s RAM tier line.
fn another_layout_starts_cold(vm: &mut Vm, port: u16, update: &str) -> Result<String> {
    let at = vm.output().len();
    vm.command_no_wait(update)?;
    let committed = vm.wait_for("slot A committed", at, BOOT_LIMIT * 2)?;
    vm.wait_for(PROMPT, committed, Duration::from_secs(20))?;
    let slots = vm.command("slots")?;
    ensure!(
        slots.contains("booted A")
            && slots.contains("committed A")
            && slots.contains("last trial B -> A: committed"),
        "after the update to another layout:\n{slots}"
    );
    let status = vm.command("status")?;
    let line = status
        .lines()
        .find(|l| l.starts_with("ram tier"))
        .unwrap_or_default()
        .to_string();
    ensure!(
        line.contains("this start: cold start: layout changed"),
        "another store layout did not start cold with its reason:\n{status}"
    );
    let (exact, wrong) = compare(port)?;
    ensure!(
        wrong.is_empty() && exact == 0,
        "after another layout: {exact} kept, wrong {wrong:?}"
    );
    Ok(line)
}
