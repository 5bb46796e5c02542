//! QEMU tests of the boot forms under OVMF (UEFI firmware): `disk.img` boots through
//! systemd-boot into slot A's `ringstore.efi`, reads the config partition, finds its data
//! partition by type, serves, and keeps what was written across a reboot (ADR 0024); the same
//! boots check what the default image gives on its own (`first_boot.rs`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use ringstore_bootdisk::{fat, Role};

use super::auth;
use super::client::{exchange, http_put_get, memcache_set_get, tcp};
use super::first_boot;
use super::full_box;
use super::vm::{scratch_dir, Vm};
use super::{BOOT_LIMIT, PROMPT};
use crate::image::{appliance_dir, BootImage, BootRequest, Image};
use crate::qemu::{free_port, Forward};

pub const OVMF_CODE: &str = "/usr/share/OVMF/OVMF_CODE_4M.fd";
pub const OVMF_VARS: &str = "/usr/share/OVMF/OVMF_VARS_4M.fd";
/// The Secure Boot build (it needs q35 with SMM) and a variable store whose PK, KEK and db
/// hold Debian's snakeoil test certificate, Secure Boot on (`secure_boot.rs`, ADR 0051).
pub const OVMF_CODE_SECURE_BOOT: &str = "/usr/share/OVMF/OVMF_CODE_4M.secboot.fd";
pub const OVMF_VARS_SNAKEOIL: &str = "/usr/share/OVMF/OVMF_VARS_4M.snakeoil.fd";
pub(super) const READY: &str = "ringstore: ready memcache=";

/// The images the UEFI tests boot, signed with the repository's test key.
pub fn test_images(image: &Image, name: &str, append: &str) -> Result<BootImage> {
    crate::image::build_boot(image, &test_options(name, append))
}

/// The options [`test_images`] builds with.
pub(super) fn test_options(name: &str, append: &str) -> BootRequest {
    BootRequest {
        signing_key: Some(crate::util::root().join("image/test-signing-key.hex")),
        out: appliance_dir().join("vm").join(format!("images-{name}")),
        append: append.to_string(),
        size_mib: Some(160),
        ..BootRequest::default()
    }
}

/// Test-only console credentials (tests/keys/README.md): a key only the config partition
/// authorizes, and the password whose argon2id hash the disk test's image carries.
const PARTITION_KEY: &str = "tests/keys/partition_ed25519";
const PASSWORD_HASH: &str = "tests/keys/console-password.argon2id";
const TEST_PASSWORD: &str = "ringstore-test-password";

/// A booted disk: its own copy of disk.img and of the firmware's variable store, kept across
/// reboots of the same VM (QEMU runs without -no-reboot: a reset boots the firmware again);
/// removed with it.
pub struct UefiMachine {
    pub disk: PathBuf,
    pub vars: PathBuf,
    dir: PathBuf,
    /// Booted by the Secure Boot firmware with the snakeoil variable store.
    secure_boot: bool,
}

impl Drop for UefiMachine {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl UefiMachine {
    pub fn new(name: &str, images: &BootImage) -> Result<UefiMachine> {
        UefiMachine::with_firmware(name, images, false)
    }

    /// One the Secure Boot firmware boots, its db trusting only the snakeoil certificate.
    pub fn new_secure_boot(name: &str, images: &BootImage) -> Result<UefiMachine> {
        UefiMachine::with_firmware(name, images, true)
    }

    fn with_firmware(name: &str, images: &BootImage, secure_boot: bool) -> Result<UefiMachine> {
        let dir = scratch_dir(&format!("disk-{name}"))?;
        let disk = dir.join("disk.img");
        let vars = dir.join("vars.fd");
        std::fs::copy(&images.disk, &disk)?;
        std::fs::copy(
            if secure_boot {
                OVMF_VARS_SNAKEOIL
            } else {
                OVMF_VARS
            },
            &vars,
        )
        .context("copying OVMF's variable store (apt-get install ovmf)")?;
        Ok(UefiMachine {
            disk,
            vars,
            dir,
            secure_boot,
        })
    }

    /// Replaces /ringstore.toml on the config partition.
    pub fn write_config(&self, toml: &str) -> Result<()> {
        self.write_config_file(ringstore_init::bootdisk::CONFIG_FILE, toml.as_bytes())
    }

    /// Writes file `name` of the config partition.
    pub fn write_config_file(&self, name: &str, bytes: &[u8]) -> Result<()> {
        self.write_file(Role::Config, name, bytes)
    }

    /// The partition with `role`, as a byte range of the disk file.
    fn volume(&self, role: Role) -> Result<ringstore_bootdisk::Slice<std::fs::File>> {
        let layout = ringstore_bootdisk::Layout::builtin();
        let mut file = std::fs::File::options()
            .read(true)
            .write(true)
            .open(&self.disk)?;
        let (sector, entries) = ringstore_bootdisk::gpt::entries(&mut file)?;
        let want = layout.by_role(role).context("no such role")?.type_guid;
        let e = entries
            .iter()
            .find(|e| e.type_guid == want)
            .context("no such partition")?;
        Ok(ringstore_bootdisk::Slice::new(
            file,
            e.first_lba * sector,
            (e.last_lba + 1 - e.first_lba) * sector,
        ))
    }

    /// Writes file `name` of the FAT partition with `role`.
    pub fn write_file(&self, role: Role, name: &str, bytes: &[u8]) -> Result<()> {
        let fs = fat::open(self.volume(role)?, &fat::DOS_EPOCH)?;
        fat::write_file(&fs, name, bytes)?;
        fs.unmount()?;
        Ok(())
    }

    /// File `name` of the FAT partition with `role` (`None`: there is none).
    pub fn read_file(&self, role: Role, name: &str) -> Result<Option<Vec<u8>>> {
        let fs = fat::open(self.volume(role)?, &fat::DOS_EPOCH)?;
        let bytes = fat::read_file(&fs, name, 256 << 20)?;
        fs.unmount()?;
        Ok(bytes)
    }

    /// Boots it; the console log is target/appliance/vm/NAME.log.
    pub fn boot(&self, name: &str) -> Result<Vm> {
        self.boot_with(name, &[])
    }

    /// Boots it with `mib` MiB of RAM instead of the usual 1 GiB (QEMU takes the last `-m`).
    pub fn boot_with_memory(&self, name: &str, mib: u32) -> Result<Vm> {
        self.boot_with(name, &["-m".to_string(), mib.to_string()])
    }

    /// Boots it with `data` as a second virtio disk (`/dev/vdb`), as a box whose data device
    /// is a disk of its own.
    pub fn boot_with_data_disk(&self, name: &str, data: &Path) -> Result<Vm> {
        let drive = format!(
            "file={},format=raw,if=none,id=d1,cache=writeback",
            data.display().to_string().replace(',', ",,")
        );
        let extra = [
            "-drive",
            &drive,
            "-device",
            "virtio-blk-pci,drive=d1,bus=pcie.0",
        ];
        self.boot_with(name, &extra.map(String::from))
    }

    /// Boots it with a TPM 2.0 (CRB) emulated by the `swtpm` whose control socket is `ctrl`.
    pub fn boot_with_tpm(&self, name: &str, ctrl: &Path) -> Result<Vm> {
        let chardev = format!("socket,id=chrtpm,path={}", ctrl.display());
        let extra = [
            "-chardev",
            &chardev,
            "-tpmdev",
            "emulator,id=tpm0,chardev=chrtpm",
            "-device",
            "tpm-crb,tpmdev=tpm0",
        ];
        self.boot_with(name, &extra.map(String::from))
    }

    /// Switches the firmware: the Secure Boot one with the snakeoil variable store, or plain
    /// OVMF with its empty store (Secure Boot off). The variable store starts afresh.
    pub fn set_secure_boot(&mut self, on: bool) -> Result<()> {
        std::fs::copy(if on { OVMF_VARS_SNAKEOIL } else { OVMF_VARS }, &self.vars)?;
        self.secure_boot = on;
        Ok(())
    }

    /// The byte range (offset, length) of the partition with `role` in the disk file.
    pub fn partition(&self, role: Role) -> Result<(u64, u64)> {
        let layout = ringstore_bootdisk::Layout::builtin();
        let mut file = std::fs::File::open(&self.disk)?;
        let (sector, entries) = ringstore_bootdisk::gpt::entries(&mut file)?;
        let want = layout.by_role(role).context("no such role")?.type_guid;
        let e = entries
            .iter()
            .find(|e| e.type_guid == want)
            .context("no such partition")?;
        Ok((
            e.first_lba * sector,
            (e.last_lba + 1 - e.first_lba) * sector,
        ))
    }

    /// Boots it with `extra` QEMU arguments after the usual ones.
    pub(super) fn boot_with(&self, name: &str, extra: &[String]) -> Result<Vm> {
        let dir = scratch_dir(name)?;
        let socket = dir.join("serial.sock");
        let forwards = vec![
            Forward {
                nic: 0,
                name: "memcache".into(),
                guest_port: 11211,
                host_port: free_port()?,
            },
            Forward {
                nic: 0,
                name: "http".into(),
                guest_port: 8080,
                host_port: free_port()?,
            },
        ];
        let mut args = uefi_args(&self.disk, &self.vars, &socket, &forwards);
        if self.secure_boot {
            secure_boot_firmware(&mut args);
        }
        args.extend_from_slice(extra);
        Vm::start(name, dir, &socket, &args, forwards, None)
    }
}

/// q35 with OVMF, disk.img on virtio-blk, user networking with the data ports forwarded, the
/// i6300esb watchdog (a reset when it fires), the serial console on `socket`.
pub fn uefi_args(disk: &Path, vars: &Path, socket: &Path, forwards: &[Forward]) -> Vec<String> {
    let mut net = "user,id=n0".to_string();
    for f in forwards {
        net.push_str(&format!(
            ",hostfwd=tcp:127.0.0.1:{}-:{}",
            f.host_port, f.guest_port
        ));
    }
    let quoted = |p: &Path| p.display().to_string().replace(',', ",,");
    [
        "-machine",
        "q35",
        "-accel",
        "tcg",
        "-cpu",
        "max",
        "-m",
        "1024",
        "-smp",
        "2",
        "-drive",
        &format!("if=pflash,format=raw,unit=0,readonly=on,file={OVMF_CODE}"),
        "-drive",
        &format!("if=pflash,format=raw,unit=1,file={}", quoted(vars)),
        "-drive",
        &format!(
            "file={},format=raw,if=none,id=d0,cache=writeback",
            quoted(disk)
        ),
        "-device",
        "virtio-blk-pci,drive=d0,bus=pcie.0",
        "-netdev",
        &net,
        "-device",
        "virtio-net-pci,netdev=n0,bus=pcie.0,mac=52:54:00:12:34:56",
        "-device",
        "virtio-rng-pci,bus=pcie.0",
        "-device",
        "i6300esb,bus=pcie.0",
        "-action",
        "watchdog=reset",
        "-nodefaults",
        "-display",
        "none",
        "-vga",
        "none",
        "-chardev",
        &format!("socket,id=ser0,path={},server=on,wait=on", socket.display()),
        "-serial",
        "chardev:ser0",
        "-monitor",
        "none",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// `args` of [`uefi_args`] turned to the Secure Boot firmware: q35 with SMM, the secboot
/// code, its flash secure (what OVMF's SMM variable store needs).
fn secure_boot_firmware(args: &mut Vec<String>) {
    for a in args.iter_mut() {
        if a == "q35" {
            *a = "q35,smm=on".into();
        } else if a.contains(OVMF_CODE) {
            *a = a.replace(OVMF_CODE, OVMF_CODE_SECURE_BOOT);
        }
    }
    args.extend(["-global", "driver=cfi.pflash01,property=secure,value=on"].map(String::from));
}

/// The disk [`disk_boots_serves_and_keeps_data`] boots: the image `dd`'d to a bigger disk.
const GROWN_DISK: u64 = 8 << 30;

/// First boot on a disk bigger than the image, no `memory` anywhere: the data partition grew
/// to the disk's end before the server formatted it, and the item memory follows the
/// machine (issue 36's 2 GiB machine with an 8 GiB disk; one node, 999 connections: about
/// 1.4 GiB of items).
fn sized_to_the_machine(vm: &mut Vm) -> Result<()> {
    let out = vm.output();
    ensure!(
        out.contains("data partition 3 of /dev/vda grown from"),
        "the data partition did not grow:\n{}",
        vm.tail()
    );
    let status = vm.command("status")?;
    ensure!(
        status.contains("data partition 3 of /dev/vda grown from")
            && status.contains("data /dev/vda3: block device, 8122 MiB"),
        "status after the growth:\n{status}"
    );
    ensure!(
        out.contains("sized to node 0"),
        "memory not sized to the machine:\n{}",
        vm.tail()
    );
    let stats = vm.command("stats")?;
    let maxbytes: u64 = super::console::stat(&stats, "limit_maxbytes")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    ensure!(
        (1 << 30..=1792 << 20).contains(&maxbytes),
        "limit_maxbytes {maxbytes} on a 2 GiB machine with 999 connections"
    );
    let config = vm.command("config")?;
    ensure!(
        config
            .lines()
            .any(|l| l.contains("memory") && l.contains("machine")),
        "`config` does not say memory was sized to the machine:\n{config}"
    );
    Ok(())
}

/// Firmware start to ready, and what was checked.
#[derive(Debug)]
pub struct DiskReport {
    pub ready_wall: Duration,
    pub second_ready_wall: Duration,
    /// A fresh QEMU on the same disk, its config partition refused, to ready.
    pub third_ready_wall: Duration,
    pub efi_kib: u64,
}

/// disk.img under OVMF: boots to the ready line through systemd-boot (slot A), the config
/// partition's `max_conns` takes effect over the image's command line, the data
/// partition is found (`ringstore.data=auto`) and serves; after `reboot` a key and an object
/// written before are still there. The first boot also has the default host name, `slots
/// --json`'s fields and the first boot's tuning state (run-time isolated, `nohz_full` written
/// for the next boot); the reboot is fully tuned; a third boot, its config partition given a
/// bad key, serves on the image's settings and says so in `status` and `tuning`, and keeps the
/// partition's `/auth/tokens` in force; `auth reload` takes a new one (`auth.rs`).
#[expect(
    clippy::too_many_lines,
    reason = "one machine's three boots in order: the checks of each boot depend on the one before"
)]
pub fn disk_boots_serves_and_keeps_data(image: &Image) -> Result<DiskReport> {
    // The image says 500 connections, the config partition 999: the partition wins. The
    // config partition authorizes a key the image does not; the image carries a password hash.
    let root = crate::util::root();
    let build = |name: &str| {
        let mut opts = test_options(name, "ringstore.max_conns=500");
        opts.config_authorized_keys = Some(root.join(PARTITION_KEY).with_extension("pub"));
        opts.console_password_hash = Some(root.join(PASSWORD_HASH));
        crate::image::build_boot(image, &opts)
    };
    let images = build("good")?;
    // Reproducible: the real artifacts, built again from the same inputs, are the same bytes.
    let again = build("good-again")?;
    for (one, two) in [(&images.efi, &again.efi), (&images.disk, &again.disk)] {
        ensure!(
            std::fs::read(one)? == std::fs::read(two)?,
            "{} and {} differ",
            one.display(),
            two.display()
        );
    }
    let machine = UefiMachine::new("disk", &images)?;
    // `dd` to a bigger disk: the image is 160 MiB, the disk 8 GiB (sparse), the machine 2 GiB
    // (issue 36).
    std::fs::File::options()
        .write(true)
        .open(&machine.disk)?
        .set_len(GROWN_DISK)?;
    machine.write_config("max_conns = 999\n")?;
    // The partition's keys as an operator edited them: a broken line the box must skip.
    let mut keys = std::fs::read(root.join(PARTITION_KEY).with_extension("pub"))?;
    keys.extend_from_slice(b"ssh-ed25519 not-a-key broken-line\n");
    machine.write_config_file(ringstore_init::bootdisk::AUTHORIZED_KEYS_FILE, &keys)?;
    let mut vm = machine.boot_with_memory("uefi_disk", 2048)?;
    let ready = vm.wait_for(READY, 0, BOOT_LIMIT)?;
    let ready_wall = vm.started.elapsed();
    vm.wait_for(PROMPT, ready, Duration::from_secs(20))?;
    console_credentials_from_image_and_partition(&mut vm)?;
    let out = vm.output();
    ensure!(
        out.contains("config partition /dev/vda partition 2: ringstore.toml read"),
        "no config partition line:\n{}",
        vm.tail()
    );
    ensure!(
        out.contains("data device /dev/vda3"),
        "data partition not used:\n{}",
        vm.tail()
    );
    sized_to_the_machine(&mut vm)?;
    let stats = vm.command("stats")?;
    ensure!(
        super::console::stat(&stats, "max_connections") == Some("999"),
        "max_conns from the config partition not applied:\n{stats}"
    );
    memcache_set_get(vm.port("memcache", 0)?)?;
    // `data` on the data partition: the documented counts, nothing damaged or compacted yet.
    let data = vm.json("data")?;
    let state = data.first().map(|d| d["state"].clone()).unwrap_or_default();
    for (field, want) in [
        ("compactions", 0),
        ("compactions_aborted", 0),
        ("corrupt_records", 0),
        ("load_refused_records", 0),
    ] {
        ensure!(state[field] == want, "`data` {field}: {data:?}");
    }
    ensure!(
        state["records"].as_u64() >= Some(1)
            && state["used_bytes"].as_u64() >= state["live_bytes"].as_u64()
            && state["regions"][0]["used_bytes"].is_u64(),
        "`data` after a set: {data:?}"
    );
    http_put_get(vm.port("http", 0)?)?;
    first_boot::default_hostname(&mut vm)?;
    first_boot::slots_fields(&mut vm)?;
    first_boot::tuning_state(&mut vm, "boot-arguments-pending", "none (pending")?;
    let before_reboot = vm.output().len();
    vm.command_no_wait("reboot")?;
    let ready2 = vm.wait_for(READY, before_reboot, BOOT_LIMIT)?;
    let second_ready_wall = vm.started.elapsed();
    vm.wait_for(PROMPT, ready2, Duration::from_secs(20))?;
    vmkey_still_there(&vm, "after the reboot")?;
    let mut s = tcp(vm.port("http", 0)?)?;
    let got = exchange(&mut s, b"GET /vmobject HTTP/1.1\r\nHost: vm\r\n\r\n", |t| {
        t.ends_with("world")
    })?;
    ensure!(
        got.starts_with("HTTP/1.1 200"),
        "after the reboot GET answered {got:?}"
    );
    // The reboot came up through the tuned entry the first boot wrote.
    first_boot::tuning_state(&mut vm, "fully-tuned", "1")?;
    let slots = vm.command("slots")?;
    ensure!(
        slots.contains("booted A") && slots.contains("committed A"),
        "the tuned entry's boot:\n{slots}"
    );
    ensure!(
        vm.command("status")?
            .contains(&format!("hostname {}", first_boot::DEFAULT_HOSTNAME)),
        "the host name changed across the reboot"
    );
    vm.poweroff()?;
    drop(vm);
    machine.write_config("max_conns = 999\ncolour = \"red\"\n")?;
    machine.write_config_file(auth::TOKENS_FILE, auth::first_tokens().as_bytes())?;
    let mut vm = machine.boot("uefi_disk_bad_config")?;
    let ready = vm.wait_for(READY, 0, BOOT_LIMIT)?;
    let third_ready_wall = vm.started.elapsed();
    vm.wait_for(PROMPT, ready, Duration::from_secs(20))?;
    first_boot::bad_config_reported(&mut vm)?;
    auth::tokens_from_the_partition(&mut vm, |bytes| {
        machine.write_config_file(auth::TOKENS_FILE, bytes)
    })?;
    vm.poweroff()?;
    Ok(DiskReport {
        ready_wall,
        second_ready_wall: second_ready_wall - ready_wall,
        third_ready_wall,
        efi_kib: std::fs::metadata(&images.efi)?.len() / 1024,
    })
}

/// The console's credentials on a disk boot: the log says how many keys came from where and
/// names the partition's broken line; a key in neither place is refused (back-off 1 s), the key
/// only the config partition holds logs in and says so, `keys` lists both sources; a wrong
/// password is refused and backs off, the right one logs in. Logged out afterwards.
fn console_credentials_from_image_and_partition(vm: &mut Vm) -> Result<()> {
    use ringstore_console::client::{ClientError, Signer};
    use std::time::Instant;
    let out = vm.output();
    ensure!(
        out.contains(
            "console: 2 authorized keys (1 from image, 1 from config-partition), a password"
        ) && out.contains("console: config partition authorized_keys: authorized key line 2:")
            && out.contains("(skipped)"),
        "the console's credentials at boot:\n{}",
        vm.tail()
    );
    let root = crate::util::root();
    let wrong = Signer::from_key_file(&root.join("tests/keys/wrong_ed25519"))?;
    let refused = vm.client().login(&wrong);
    let refused_at = Instant::now();
    ensure!(
        matches!(&refused, Err(ClientError::Refused(why)) if why.contains("next attempt in 1 s")),
        "a key in neither place: {refused:?}"
    );
    let early = vm.client().login_password(TEST_PASSWORD);
    ensure!(
        matches!(&early, Err(ClientError::Refused(why)) if why.contains("wait")),
        "inside the back-off: {early:?}"
    );
    let wait_out = |since: Instant| {
        std::thread::sleep(Duration::from_millis(1100).saturating_sub(since.elapsed()))
    };
    wait_out(refused_at);
    let partition = Signer::from_key_file(&root.join(PARTITION_KEY))?;
    let who = vm.client().login(&partition)?;
    ensure!(
        who.source == "config-partition" && who.comment == "partition-test-only@ringstore",
        "the partition's key: {who:?}"
    );
    let keys = vm.client().run("keys")?;
    let keys = keys.first().cloned().unwrap_or_default();
    let sources: Vec<(String, String)> = keys["keys"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|k| (k["comment"].to_string(), k["source"].to_string()))
        .collect();
    ensure!(
        sources.len() == 2
            && sources[0].0.contains("ringstore-test-only")
            && sources[0].1 == "\"image\""
            && sources[1].1 == "\"config-partition\""
            && keys["password"] == true
            && keys["problems"].as_array().map(Vec::len) == Some(1),
        "`keys`: {keys}"
    );
    vm.client().run("logout")?;
    // The password fallback: wrong, refused with a back-off (reset by the login above: 1 s).
    let wrong_password = vm.client().login_password("ringstore-test-passwore");
    let refused_at = Instant::now();
    ensure!(
        matches!(&wrong_password, Err(ClientError::Refused(why)) if why.contains("wrong password") && why.contains("next attempt in 1 s")),
        "a wrong password: {wrong_password:?}"
    );
    let early = vm.client().login_password(TEST_PASSWORD);
    ensure!(
        matches!(&early, Err(ClientError::Refused(why)) if why.contains("wait")),
        "the right password inside the back-off: {early:?}"
    );
    wait_out(refused_at);
    let who = vm.client().login_password(TEST_PASSWORD)?;
    ensure!(who.fingerprint == "password", "the password login: {who:?}");
    let log = vm.client().run("log")?;
    ensure!(
        log[0]["lines"]
            .as_array()
            .is_some_and(|lines| lines.iter().any(|l| l
                .as_str()
                .is_some_and(|l| l.contains("logged in (key from config-partition)")))),
        "the log does not say where the key came from: {log:?}"
    );
    vm.client().run("logout")?;
    Ok(())
}

/// Removes its folder when dropped (every path out of a test).
pub(super) struct Removed(pub(super) PathBuf);

impl Drop for Removed {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Serves the files of `dir` over HTTP/1.0 on 127.0.0.1 (the guest reaches it as 10.0.2.2)
/// from a background thread, one request per connection; returns the port.
pub(super) fn serve_files(dir: PathBuf) -> Result<u16> {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let port = listener.local_addr()?.port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let dir = dir.clone();
            std::thread::spawn(move || {
                let mut s = stream;
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 8192 {
                    match s.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&head).into_owned();
                let name = head
                    .split_whitespace()
                    .nth(1)
                    .unwrap_or("/")
                    .trim_start_matches('/')
                    .to_string();
                let answer = match std::fs::read(dir.join(&name)) {
                    Ok(body) if !name.contains('/') && !name.is_empty() => {
                        let mut a =
                            format!("HTTP/1.0 200 OK\r\nContent-Length: {}\r\n\r\n", body.len())
                                .into_bytes();
                        a.extend_from_slice(&body);
                        a
                    }
                    _ => b"HTTP/1.0 404 Not Found\r\nContent-Length: 0\r\n\r\n".to_vec(),
                };
                let _ = s.write_all(&answer);
            });
        }
    });
    Ok(port)
}

/// The key `memcache_set_get` wrote is still there.
pub(super) fn vmkey_still_there(vm: &Vm, when: &str) -> Result<()> {
    let mut s = tcp(vm.port("memcache", 0)?)?;
    let got = exchange(&mut s, b"get vmkey\r\n", |t| t.ends_with("END\r\n"))?;
    ensure!(
        got == "VALUE vmkey 0 5\r\nhello\r\nEND\r\n",
        "{when}: get vmkey answered {got:?}"
    );
    Ok(())
}

/// Slot B booted and is committed, `slots` shows `trial`, and B's image (777 connections) runs.
pub(super) fn on_slot_b(vm: &mut Vm, trial: &str, when: &str) -> Result<()> {
    let slots = vm.command("slots")?;
    ensure!(
        slots.contains("booted B") && slots.contains("committed B") && slots.contains(trial),
        "{when}:\n{slots}"
    );
    let stats = vm.command("stats")?;
    ensure!(
        super::console::stat(&stats, "max_connections") == Some("777"),
        "{when}: slot B's image is not running:\n{stats}"
    );
    Ok(())
}

/// What the update test saw.
#[derive(Debug)]
pub struct UpdateReport {
    pub commit_line: String,
    pub rollback_line: String,
    /// The full box: what filled slot A's data partition, and how long it took.
    pub filled: String,
}

/// disk.img (slot A) takes updates from a host HTTP server, on a full data device (issue 36):
/// slot A's image says `data_full = refuse`, and big values fill its data partition until a set
/// answers the device-full error. An image whose signature does not match is refused with slot
/// B still empty; a good image (its own `max_conns`, the default `evict`) is written to B, boots
/// once as a trial, passes the canary (the old system's key written before the reboot, the new
/// one's writes on the full device answered, device full being the configured answer) and commits; on B the last
/// value A stored reads back and further sets keep being stored, the oldest segments evicted;
/// then an image that never becomes ready (a bad configuration key)
/// is written to A, fails its trial, and the machine is back on B by itself, saying why; last
/// an image whose kernel panics (no init: the same reset a watchdog gives) is written to A and
/// the machine is back on B, which records that the trial never reported.
pub fn updates_commit_roll_back_and_refuse(image: &Image) -> Result<UpdateReport> {
    let a = test_images(image, "slot-a", "ringstore.data_full=refuse")?;
    let good = test_images(image, "update-good", "ringstore.max_conns=777")?;
    let broken = test_images(image, "update-broken", "ringstore.memory=1")?;
    // The kernel finds no init and panics (panic=-1 resets): the trial never reports.
    let crashing = test_images(image, "update-crashing", "rdinit=/no-such-init")?;
    let site = scratch_dir("site")?;
    let _site_removed = Removed(site.clone());
    // `NAME.efi` and `NAME.efi.sig` on the site: `efi`'s image with `signed`'s signature.
    let publish = |name: &str, efi: &BootImage, signed: &BootImage| -> Result<()> {
        std::fs::copy(&efi.efi, site.join(format!("{name}.efi")))?;
        let sig = signed.signature.as_deref().context("no signature")?;
        std::fs::copy(sig, site.join(format!("{name}.efi.sig")))?;
        Ok(())
    };
    publish("good", &good, &good)?;
    publish("broken", &broken, &broken)?;
    publish("crashing", &crashing, &crashing)?;
    // The good image with the broken image's signature.
    publish("forged", &good, &broken)?;
    let port = serve_files(site.clone())?;
    let url = |name: &str| format!("http://10.0.2.2:{port}/{name}");
    let machine = UefiMachine::new("update", &a)?;
    let mut vm = machine.boot("uefi_update")?;
    let ready = vm.wait_for(READY, 0, BOOT_LIMIT)?;
    vm.wait_for(PROMPT, ready, Duration::from_secs(20))?;
    let slots = vm.command("slots")?;
    ensure!(
        slots.contains("booted A")
            && slots.contains("committed A")
            && slots.contains("slot B empty"),
        "fresh disk:\n{slots}"
    );
    memcache_set_get(vm.port("memcache", 0)?)?;
    let (last_on_a, filled) = full_box::refusing_box_filled(&mut vm)?;

    let refused = vm.command(&format!("update {}", url("forged.efi")))?;
    ensure!(
        refused.contains("update refused: signature does not match")
            && refused.contains("nothing written"),
        "forged image:\n{refused}"
    );
    let slots = vm.command("slots")?;
    ensure!(
        slots.contains("slot B empty"),
        "the forged image reached slot B:\n{slots}"
    );

    let at = vm.output().len();
    vm.command_no_wait(&format!("update {}", url("good.efi")))?;
    let committed = vm.wait_for("slot B committed", at, BOOT_LIMIT * 2)?;
    vm.wait_for(PROMPT, committed, Duration::from_secs(20))?;
    let out = vm.output();
    let commit_line = out[at..committed].lines().last().unwrap_or("").to_string();
    on_slot_b(
        &mut vm,
        "last trial A -> B: committed",
        "after the good update",
    )?;
    full_box::evicting_box_keeps_storing(&mut vm, last_on_a)?;

    let at = vm.output().len();
    vm.command_no_wait(&format!("update {}", url("broken.efi")))?;
    let failed = vm.wait_for(
        "last trial of slot A: failed: never became ready",
        at,
        BOOT_LIMIT * 2,
    )?;
    let ready = vm.wait_for(READY, failed, BOOT_LIMIT)?;
    vm.wait_for(PROMPT, ready, Duration::from_secs(20))?;
    let out = vm.output();
    let rollback_line = out[at..failed].lines().last().unwrap_or("").to_string();
    on_slot_b(
        &mut vm,
        "last trial B -> A: failed: never became ready",
        "after the broken update",
    )?;

    let at = vm.output().len();
    vm.command_no_wait(&format!("update {}", url("crashing.efi")))?;
    let crashed = vm.wait_for(
        "the trial boot of slot A never reported (hang, crash or watchdog reset); back on slot B",
        at,
        BOOT_LIMIT * 2,
    )?;
    let ready = vm.wait_for(READY, crashed, BOOT_LIMIT)?;
    vm.wait_for(PROMPT, ready, Duration::from_secs(20))?;
    on_slot_b(
        &mut vm,
        "last trial B -> A: failed: the trial boot of slot A never reported",
        "after the crashing update",
    )?;
    vm.poweroff()?;
    Ok(UpdateReport {
        commit_line,
        rollback_line,
        filled,
    })
}
