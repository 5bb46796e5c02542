//! QEMU tests of the data device on the appliance (ADR-0011, `ringstore.data=/dev/vda`):
//! every write acknowledged with STORED survives a power cut (QEMU killed mid-load) and a clean
//! `poweroff` (which writes the checkpoint the next boot starts from); a disk holding another
//! filesystem is refused with one console line, nothing serves, and the disk stays untouched.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

mod eio;
mod large;

pub use eio::failed_disk_write_fails_only_its_requests;
pub use large::large_object_survives_poweroff_and_power_cut;

use super::client::{memcache_closed, memcache_set_get, tcp};
use super::vm::Vm;
use super::{BOOT_LIMIT, COMMAND_LIMIT, PROMPT};
use crate::image::{appliance_dir, Image};
use crate::qemu;

/// numa2 with a 64 MiB virtio-blk data disk and `ringstore.data=/dev/vda`.
const DISK_PROFILE: &str = "numa2-disk";
/// Connections writing at once (2 workers serve; each group-commits its connections' writes).
const WRITERS: usize = 4;
/// Acknowledged sets before the plug is pulled (the writers are still sending then).
const ACKED_BEFORE_CUT: usize = 2000;
/// How long the load may take to reach [`ACKED_BEFORE_CUT`].
const LOAD_LIMIT: Duration = Duration::from_secs(45);
/// The fewest acknowledged sets the cut must find for the test to mean something. Each set
/// waits for a guest fdatasync that becomes a host fdatasync: on a host whose disk is busy
/// (another job writing gigabytes) 45 s gave 858 where a quiet host gives 2000 in 5 s, so the
/// load stops at [`ACKED_BEFORE_CUT`] or [`LOAD_LIMIT`] and the test requires this many.
const ACKED_AT_LEAST: usize = 200;
/// Keys one writer sends at most (bounds the model's memory if the cut never comes).
const PER_WRITER_MAX: usize = 20_000;
/// Largest value written; values of 1..=this bytes cross the device's 4 KiB blocks.
const VALUE_MAX: usize = 6000;
/// Keys per `get` when checking.
const GET_BATCH: usize = 50;
/// Largest `get` answer read back.
const ANSWER_MAX: usize = 8 << 20;

/// One value of a `get` answer: key, flags, data.
type Value = (String, u32, Vec<u8>);

/// A key's expected state: `Some((flags, value))`, or `None` for deleted.
type Model = BTreeMap<String, Option<(u32, Vec<u8>)>>;

/// The data disk files of one test, in a directory removed on every path out. Declare it
/// before the VMs that use it: they are dropped (QEMU killed) first.
pub(super) struct ScratchDisks {
    dir: PathBuf,
    pub(super) files: Vec<PathBuf>,
}

impl ScratchDisks {
    /// Fresh (all-zero, sparse) files for every data disk `profile` declares.
    pub(super) fn create(name: &str, profile: &str) -> Result<ScratchDisks> {
        let profile = qemu::load_profile(profile)?;
        let dir = appliance_dir()
            .join("vm")
            .join(format!("{name}-disks-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut disks = ScratchDisks {
            dir,
            files: Vec::new(),
        };
        for (k, disk) in profile.disks.iter().enumerate() {
            let file = disks.dir.join(format!("disk{k}.raw"));
            qemu::ensure_disk(&file, disk.size_mib)?;
            disks.files.push(file);
        }
        Ok(disks)
    }
}

impl Drop for ScratchDisks {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The flags and value written for `key` in `generation`: 1..=VALUE_MAX bytes that name both,
/// so a value from another key or an older generation never compares equal.
fn value_of(key: &str, generation: u32) -> (u32, Vec<u8>) {
    let h = fnv1a(format!("{key}#{generation}").as_bytes());
    // Below VALUE_MAX, so it fits.
    let len = 1 + usize::try_from(h % VALUE_MAX as u64).unwrap_or(0);
    let pattern = format!("{key}/{generation};");
    let value = pattern.bytes().cycle().take(len).collect();
    ((h >> 32) as u32 & 0xffff, value)
}

fn set_request(key: &str, flags: u32, value: &[u8]) -> Vec<u8> {
    let mut request = format!("set {key} {flags} 0 {}\r\n", value.len()).into_bytes();
    request.extend_from_slice(value);
    request.extend_from_slice(b"\r\n");
    request
}

/// One memcache connection with a line reader on the same socket.
struct Conn {
    writer: TcpStream,
    reader: BufReader<TcpStream>,
}

impl Conn {
    fn open(port: u16) -> Result<Conn> {
        let writer = tcp(port)?;
        let reader = BufReader::new(writer.try_clone()?);
        Ok(Conn { writer, reader })
    }

    /// Sends `request` and reads one reply line (at most 512 bytes). `Ok(None)`: the connection
    /// ended (EOF, reset) before a whole line came back.
    fn line_reply(&mut self, request: &[u8]) -> Result<Option<String>> {
        if self.writer.write_all(request).is_err() {
            return Ok(None);
        }
        let mut line = String::new();
        match (&mut self.reader).take(512).read_line(&mut line) {
            Ok(_) if line.ends_with("\r\n") => Ok(Some(line)),
            Ok(_) => Ok(None),
            Err(err)
                if matches!(
                    err.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                bail!("no reply within the read timeout")
            }
            Err(_) => Ok(None),
        }
    }

    fn set(&mut self, key: &str, flags: u32, value: &[u8]) -> Result<()> {
        let reply = self.line_reply(&set_request(key, flags, value))?;
        anyhow::ensure!(
            reply.as_deref() == Some("STORED\r\n"),
            "set {key} answered {reply:?}"
        );
        Ok(())
    }

    fn delete(&mut self, key: &str) -> Result<()> {
        let reply = self.line_reply(format!("delete {key}\r\n").as_bytes())?;
        anyhow::ensure!(
            reply.as_deref() == Some("DELETED\r\n"),
            "delete {key} answered {reply:?}"
        );
        Ok(())
    }

    /// `get` of every key at once: the keys found, with flags and value.
    fn get_many(&mut self, keys: &[&str]) -> Result<HashMap<String, (u32, Vec<u8>)>> {
        self.writer
            .write_all(format!("get {}\r\n", keys.join(" ")).as_bytes())?;
        let mut answer = Vec::new();
        loop {
            if let Some(parsed) = parse_values(&answer) {
                return parsed
                    .map(|values| values.into_iter().map(|(k, f, v)| (k, (f, v))).collect());
            }
            anyhow::ensure!(
                answer.len() < ANSWER_MAX,
                "get answer longer than {ANSWER_MAX} bytes"
            );
            let buf = self.reader.fill_buf()?;
            anyhow::ensure!(
                !buf.is_empty(),
                "connection closed in a get answer ({} bytes so far)",
                answer.len()
            );
            let n = buf.len();
            answer.extend_from_slice(buf);
            self.reader.consume(n);
        }
    }
}

/// A whole `get` answer (`VALUE key flags len` + data blocks, then `END`): `None` while
/// incomplete, an error for anything else.
fn parse_values(buf: &[u8]) -> Option<Result<Vec<Value>>> {
    let mut values = Vec::new();
    let mut at = 0;
    loop {
        let line_end = at + buf.get(at..)?.windows(2).position(|w| w == b"\r\n")?;
        let line = String::from_utf8_lossy(&buf[at..line_end]).into_owned();
        if line == "END" {
            return Some(if line_end + 2 == buf.len() {
                Ok(values)
            } else {
                Err(anyhow::anyhow!("bytes after END"))
            });
        }
        let fields: Vec<&str> = line.split(' ').collect();
        let (Some(&"VALUE"), Some(key), Some(flags), Some(len), None) = (
            fields.first(),
            fields.get(1),
            fields.get(2),
            fields.get(3),
            fields.get(4),
        ) else {
            return Some(Err(anyhow::anyhow!(
                "unexpected line {line:?} in a get answer"
            )));
        };
        let (Ok(flags), Ok(len)) = (flags.parse::<u32>(), len.parse::<usize>()) else {
            return Some(Err(anyhow::anyhow!("bad VALUE line {line:?}")));
        };
        let data_start = line_end + 2;
        let data = buf.get(data_start..data_start + len)?;
        match buf.get(data_start + len..data_start + len + 2)? {
            b"\r\n" => {}
            _ => return Some(Err(anyhow::anyhow!("value of {key} not followed by CRLF"))),
        }
        values.push((key.to_string(), flags, data.to_vec()));
        at = data_start + len + 2;
    }
}

/// Every key of `model` reads back exactly as expected (deleted keys are absent). Returns how
/// many live keys were checked.
fn check_model(port: u16, model: &Model) -> Result<usize> {
    let mut conn = Conn::open(port)?;
    let keys: Vec<&str> = model.keys().map(String::as_str).collect();
    let mut live = 0;
    for batch in keys.chunks(GET_BATCH) {
        let found = conn.get_many(batch)?;
        for key in batch {
            match (&model[*key], found.get(*key)) {
                (Some(want), Some(got)) if want == got => live += 1,
                (Some((flags, value)), Some((got_flags, got))) => bail!(
                    "{key}: flags {got_flags} and {} bytes read back, acknowledged flags {flags} and {} bytes (first difference at byte {:?})",
                    got.len(),
                    value.len(),
                    value.iter().zip(got).position(|(a, b)| a != b)
                ),
                (Some(_), None) => bail!("{key} was acknowledged but is missing"),
                (None, Some(_)) => bail!("{key} was deleted (acknowledged) but is back"),
                (None, None) => {}
            }
        }
    }
    Ok(live)
}

/// What one writer saw before the plug was pulled.
struct Written {
    acked: Vec<String>,
    /// A reply other than STORED (the server refused a write): fails the test.
    refused: Option<String>,
}

/// Sets unique keys `cut-wID-N` one after another until the connection ends, `stop` is set or
/// [`PER_WRITER_MAX`] keys were sent; counts every STORED in `acked_total`.
fn write_until_cut(port: u16, id: usize, acked_total: &AtomicUsize, stop: &AtomicBool) -> Written {
    let mut written = Written {
        acked: Vec::new(),
        refused: None,
    };
    let Ok(mut conn) = Conn::open(port) else {
        written.refused = Some(format!("writer {id}: cannot connect"));
        return written;
    };
    for i in 0..PER_WRITER_MAX {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let key = format!("cut-w{id}-{i}");
        let (flags, value) = value_of(&key, 0);
        match conn.line_reply(&set_request(&key, flags, &value)) {
            Ok(Some(reply)) if reply == "STORED\r\n" => {
                written.acked.push(key);
                acked_total.fetch_add(1, Ordering::Relaxed);
            }
            Ok(Some(reply)) => {
                written.refused = Some(format!("set {key} answered {reply:?}"));
                break;
            }
            // The machine went away mid-request: not acknowledged.
            Ok(None) => break,
            Err(err) => {
                if !stop.load(Ordering::Relaxed) {
                    written.refused = Some(format!("set {key}: {err}"));
                }
                break;
            }
        }
    }
    written
}

/// Boots the disk profile and waits for the ready line and the prompt.
fn boot_ready(image: &Image, name: &str, append: &str, disks: &ScratchDisks) -> Result<Vm> {
    let mut vm = Vm::boot_with_disks(image, name, DISK_PROFILE, append, &disks.files)?;
    let ready = vm.wait_for("ringstore: ready memcache=", 0, BOOT_LIMIT)?;
    vm.wait_for(PROMPT, ready, COMMAND_LIMIT)?;
    super::console::check_events_once(&vm)?;
    Ok(vm)
}

/// The console line containing `needle`, waiting up to 3 s for the serial reader to catch up
/// (QEMU may already have exited). A line the server printed while the prompt was waiting comes
/// after it on the same console line: the prompt is left out.
pub(super) fn console_line_with(vm: &Vm, needle: &str) -> Result<String> {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        if let Some(line) = vm.output().lines().find(|l| l.contains(needle)) {
            return Ok(line.trim_start_matches(PROMPT).trim().to_string());
        }
        if Instant::now() > deadline {
            bail!(
                "{}: no console line contains {needle:?}; last lines:\n{}",
                vm.name,
                vm.tail()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// What the durability test measured.
#[derive(Debug, Clone)]
pub struct DurableReport {
    pub acked_before_cut: usize,
    pub load: Duration,
    pub scan_line: String,
    pub checkpoint_line: String,
    pub from_checkpoint_line: String,
    pub live_keys: usize,
}

/// numa2-disk on a blank 64 MiB disk: formatted at the first boot; 4 connections set unique keys
/// until 2000 are acknowledged (or 45 s passed; at least 200 are required), then QEMU is killed while they still send (a power cut: the
/// guest's page cache and in-flight requests are lost). The next boot recovers by scanning the
/// logs and every acknowledged key reads back with its exact flags and value. Then overwrites,
/// deletes and new keys, a clean `poweroff` (the checkpoint is written), and the third boot
/// starts from the checkpoint with everything as acknowledged.
pub fn acknowledged_writes_survive_power_cut_and_poweroff(image: &Image) -> Result<DurableReport> {
    let disks = ScratchDisks::create("durable", DISK_PROFILE)?;
    let mut vm = boot_ready(image, "durable-1", "", &disks)?;
    console_line_with(&vm, "data device /dev/vda: formatted")?;
    let status = vm.command("status")?;
    anyhow::ensure!(
        status.contains("data /dev/vda: block device, 64 MiB"),
        "status does not show the data disk:\n{status}"
    );
    let port = vm.port("memcache", 0)?;

    let acked_total = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let load_started = Instant::now();
    let writers: Vec<_> = (0..WRITERS)
        .map(|id| {
            let (acked_total, stop) = (Arc::clone(&acked_total), Arc::clone(&stop));
            std::thread::spawn(move || write_until_cut(port, id, &acked_total, &stop))
        })
        .collect();
    while acked_total.load(Ordering::Relaxed) < ACKED_BEFORE_CUT
        && load_started.elapsed() < LOAD_LIMIT
        && !writers.iter().all(|w| w.is_finished())
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    let load = load_started.elapsed();
    // Pull the plug while the writers are still sending; they see their connections end.
    let cut = vm.power_cut();
    stop.store(true, Ordering::Relaxed);
    let mut model = Model::new();
    let mut refused = Vec::new();
    for writer in writers {
        let written = writer
            .join()
            .map_err(|_| anyhow::anyhow!("a writer panicked"))?;
        refused.extend(written.refused);
        for key in written.acked {
            let value = value_of(&key, 0);
            model.insert(key, Some(value));
        }
    }
    cut?;
    anyhow::ensure!(
        refused.is_empty(),
        "writes refused before the power cut: {refused:?}"
    );
    let acked_before_cut = model.len();
    anyhow::ensure!(
        acked_before_cut >= ACKED_AT_LEAST,
        "only {acked_before_cut} sets acknowledged in {:.1} s",
        load.as_secs_f64()
    );

    // Boot 2: no checkpoint (the power cut); the logs are scanned.
    let mut vm = boot_ready(image, "durable-2", "", &disks)?;
    let scan_line = console_line_with(&vm, "data device /dev/vda: recovered by scanning the logs")?;
    check_model(port_of(&vm)?, &model).context("after the power cut")?;
    // Overwrite every 20th acknowledged key, delete every 40th (offset), add new keys.
    let mut conn = Conn::open(port_of(&vm)?)?;
    let acked: Vec<String> = model.keys().cloned().collect();
    for key in acked.iter().step_by(20) {
        let (flags, value) = value_of(key, 1);
        conn.set(key, flags, &value)?;
        model.insert(key.clone(), Some((flags, value)));
    }
    for key in acked.iter().skip(7).step_by(40) {
        conn.delete(key)?;
        model.insert(key.clone(), None);
    }
    for i in 0..200 {
        let key = format!("after-cut-{i}");
        let (flags, value) = value_of(&key, 0);
        conn.set(&key, flags, &value)?;
        model.insert(key, Some((flags, value)));
    }
    drop(conn);
    check_model(port_of(&vm)?, &model).context("before the poweroff")?;
    vm.poweroff()?;
    let checkpoint_line = console_line_with(&vm, "data device: checkpoint written")?;
    drop(vm);

    // Boot 3: from the checkpoint the clean shutdown wrote.
    let mut vm = boot_ready(image, "durable-3", "", &disks)?;
    let from_checkpoint_line = console_line_with(
        &vm,
        "data device /dev/vda: recovered from the shutdown checkpoint",
    )?;
    let live_keys = check_model(port_of(&vm)?, &model).context("after the poweroff")?;
    // The console's `data --json` (docs/CONSOLE.md) counts what the device holds.
    let data = vm.json("data")?;
    let state = data.first().map(|d| d["state"].clone()).unwrap_or_default();
    anyhow::ensure!(
        state["records"].as_u64() >= Some(live_keys as u64)
            && state["live_bytes"].as_u64() > Some(0)
            && state["corrupt_records"] == 0
            && state["regions"].as_array().map(Vec::len) == Some(2),
        "`data` after boot 3 ({live_keys} live keys): {data:?}"
    );
    vm.poweroff()?;
    Ok(DurableReport {
        acked_before_cut,
        load,
        scan_line,
        checkpoint_line,
        from_checkpoint_line,
        live_keys,
    })
}

fn port_of(vm: &Vm) -> Result<u16> {
    vm.port("memcache", 0)
}

/// Byte 1080 of an ext2/3/4 filesystem: its superblock's magic 0xEF53 (little-endian).
const EXT4_MAGIC_AT: u64 = 1080;

/// A data disk that carries an ext4 signature: one console line says the device is refused and
/// names the kernel command-line key that would format it; with `ringstore.on_fatal=halt` the
/// console stays, nothing serves, and the disk is untouched. With `ringstore.data_format=force`
/// the same disk is formatted and serves.
pub fn foreign_data_device_is_refused(image: &Image) -> Result<String> {
    use std::os::unix::fs::FileExt;
    let disks = ScratchDisks::create("refused", DISK_PROFILE)?;
    let disk = &disks.files[0];
    std::fs::OpenOptions::new()
        .write(true)
        .open(disk)?
        .write_all_at(&0xEF53u16.to_le_bytes(), EXT4_MAGIC_AT)?;

    let mut vm = Vm::boot_with_disks(
        image,
        "refused",
        DISK_PROFILE,
        "ringstore.on_fatal=halt",
        &disks.files,
    )?;
    // PID 1's one line for it (the console view has the kernel's records cut out).
    let at = vm.wait_for("\nringstore: fatal: data device /dev/vda:", 0, BOOT_LIMIT)?;
    let line_end = vm.wait_for("\n", at, COMMAND_LIMIT)?;
    let out = vm.output();
    let line = out[out[..at].rfind('\n').map_or(0, |i| i + 1)..line_end]
        .trim()
        .to_string();
    anyhow::ensure!(
        line.contains("ext2/3/4") && line.contains("ringstore.data_format=force"),
        "the refusal does not name the signature and the key: {line}"
    );
    anyhow::ensure!(
        vm.output()
            .lines()
            .filter(|l| l.contains("ext2/3/4"))
            .count()
            == 1,
        "the refusal is not on the console exactly once:\n{}",
        vm.output()
    );
    vm.wait_for(PROMPT, line_end, COMMAND_LIMIT)?;
    anyhow::ensure!(
        !vm.output().contains("ringstore: ready"),
        "served although the data device was refused"
    );
    memcache_closed(port_of(&vm)?)?;
    let status = vm.command("status")?;
    anyhow::ensure!(
        status.contains("not serving: data device /dev/vda"),
        "status does not say why nothing serves:\n{status}"
    );
    vm.poweroff()?;
    drop(vm);
    let mut magic = [0u8; 2];
    std::fs::File::open(disk)?.read_exact_at(&mut magic, EXT4_MAGIC_AT)?;
    anyhow::ensure!(
        magic == 0xEF53u16.to_le_bytes(),
        "the refused disk was written to"
    );

    let mut vm = boot_ready(
        image,
        "refused-force",
        "ringstore.data_format=force",
        &disks,
    )?;
    console_line_with(&vm, "data device /dev/vda: formatted")?;
    memcache_set_get(port_of(&vm)?)?;
    vm.poweroff()?;
    Ok(line)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_deterministic_and_differ_by_key_and_generation() {
        let (flags, value) = value_of("cut-w0-1", 0);
        assert_eq!(value_of("cut-w0-1", 0), (flags, value.clone()));
        assert!(!value.is_empty() && value.len() <= VALUE_MAX);
        assert!(value.starts_with(b"cut-w0-1/0;") || value.len() < 11);
        assert_ne!(value_of("cut-w0-1", 1).1, value);
        assert_ne!(value_of("cut-w0-2", 0).1, value);
        assert!(flags <= 0xffff);
        let lens: Vec<usize> = (0..200)
            .map(|i| value_of(&format!("k{i}"), 0).1.len())
            .collect();
        assert!(
            lens.iter().any(|l| *l > 4096) && lens.iter().any(|l| *l < 1024),
            "values cross blocks and stay small: {lens:?}"
        );
    }

    #[test]
    fn get_answers_parse_only_when_whole() {
        let answer = b"VALUE a 3 5\r\nhe\r\no\r\nVALUE b 0 0\r\n\r\nEND\r\n";
        let values = parse_values(answer).unwrap().unwrap();
        assert_eq!(
            values,
            vec![
                ("a".to_string(), 3, b"he\r\no".to_vec()),
                ("b".to_string(), 0, Vec::new())
            ]
        );
        for cut in 0..answer.len() {
            assert!(
                parse_values(&answer[..cut]).is_none(),
                "incomplete at {cut} parsed"
            );
        }
        assert!(parse_values(b"END\r\n").unwrap().unwrap().is_empty());
        assert!(parse_values(b"SERVER_ERROR x\r\n").unwrap().is_err());
        assert!(parse_values(b"VALUE a 0 1\r\nxy\r\nEND\r\n")
            .unwrap()
            .is_err());
    }

    #[test]
    fn scratch_disks_follow_the_profile_and_are_removed() {
        let disks = ScratchDisks::create("unit", DISK_PROFILE).unwrap();
        assert_eq!(disks.files.len(), 1);
        assert_eq!(std::fs::metadata(&disks.files[0]).unwrap().len(), 64 << 20);
        let dir = disks.dir.clone();
        drop(disks);
        assert!(!dir.exists());
    }
}
