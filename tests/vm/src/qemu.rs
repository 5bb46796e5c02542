//! QEMU machine profiles (data in `qemu/profiles/*.toml`) turned into a command line (what
//! `cargo xtask run`, run.rs, and the QEMU tests boot).

use std::io::Read;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::Deserialize;

use crate::image::Image;
use crate::util::root;

/// A machine profile as written in `qemu/profiles/NAME.toml`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    pub description: String,
    pub memory_mib: u32,
    pub sockets: u32,
    pub cores_per_socket: u32,
    /// Extra kernel command line for this machine (isolcpus=, nohz_full=, ...).
    #[serde(default)]
    pub append: String,
    /// NUMA nodes; empty = no NUMA topology.
    #[serde(default)]
    pub nodes: Vec<NumaNode>,
    pub nics: Vec<Nic>,
    /// Data disks in this order: virtio-blk ones are the guest's /dev/vda, /dev/vdb, ...;
    /// those behind a `controller` are SCSI disks, /dev/sda, /dev/sdb, ...
    #[serde(default)]
    pub disks: Vec<Disk>,
}

impl Profile {
    /// The guest's device node for data disk `index`: counted among the disks of its kind
    /// (virtio-blk or SCSI). Several SCSI controllers probe concurrently, so only a profile with
    /// one SCSI disk can rely on its name.
    pub fn guest_disk_path(&self, index: usize) -> String {
        let scsi = |d: &Disk| d.controller.is_some();
        let Some(disk) = self.disks.get(index) else {
            return format!("/dev/{}", guest_disk_name(index));
        };
        let nth = self.disks[..index]
            .iter()
            .filter(|d| scsi(d) == scsi(disk))
            .count();
        let name = guest_disk_name(nth);
        if scsi(disk) {
            format!("/dev/sd{}", &name[2..])
        } else {
            format!("/dev/{name}")
        }
    }
}

/// A data disk: a raw file on the host (created sparse at this size when missing).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Disk {
    pub size_mib: u32,
    /// The QEMU SCSI/SAS controller the disk hangs off as a `scsi-hd` (`megasas-gen2`: the
    /// guest's megaraid_sas; `mptsas1068`: mptsas; `lsi53c895a`: sym53c8xx), one controller
    /// per disk; none = virtio-blk. docs/HARDWARE.md lists what the kernel drives.
    pub controller: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NumaNode {
    pub cpus: String,
    pub memory_mib: u32,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Nic {
    /// The node whose pxb-pcie expander bridge the NIC sits behind; none = the root bus.
    pub node: Option<u32>,
    pub model: String,
    /// The user network's subnet (default QEMU's 10.0.2.0/24).
    pub net: Option<String>,
    /// A host tap interface instead of a user network (QEMU attaches to it; it must exist in
    /// QEMU's network namespace). No `net` and no `forward` then.
    pub tap: Option<String>,
    /// `NAME:GUEST_PORT` TCP ports forwarded from 127.0.0.1.
    #[serde(default)]
    pub forward: Vec<String>,
    /// Queue pairs of a multiqueue virtio-net on a tap (`queues=N`, `mq=on`,
    /// `vectors=2N+2`, guest offloads off so the guest driver attaches native XDP); the tap
    /// must be a `multi_queue` one.
    pub queues: Option<u32>,
}

/// The guest's name for the `index`-th virtio-blk disk (`vda`, `vdb`, ...).
pub fn guest_disk_name(index: usize) -> String {
    format!(
        "vd{}",
        char::from(b'a' + u8::try_from(index % 26).unwrap_or(0))
    )
}

/// Creates `path` as a sparse raw disk of `size_mib` MiB when it does not exist; an existing
/// file is kept as it is (its contents are the point). Returns whether it was created.
pub fn ensure_disk(path: &Path, size_mib: u32) -> Result<bool> {
    if path.exists() {
        return Ok(false);
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .with_context(|| format!("creating disk {}", path.display()))?;
    file.set_len(u64::from(size_mib) << 20)
        .with_context(|| format!("sizing disk {}", path.display()))?;
    Ok(true)
}

/// A forwarded port: host 127.0.0.1:`host_port` → guest `guest_port` through NIC `nic`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forward {
    pub nic: usize,
    pub name: String,
    pub guest_port: u16,
    pub host_port: u16,
}

/// Where the serial console goes.
#[derive(Debug, Clone)]
pub enum Serial {
    /// A unix socket QEMU listens on and waits for before starting the guest.
    Socket(PathBuf),
}

/// Reads `qemu/profiles/<name>.toml`.
pub fn load_profile(name: &str) -> Result<Profile> {
    let path = root().join("qemu/profiles").join(format!("{name}.toml"));
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("no machine profile {name:?} ({})", path.display()))?;
    let profile: Profile =
        toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    if profile.nics.is_empty() {
        bail!("profile {name} has no NIC");
    }
    if let Some(nic) = profile
        .nics
        .iter()
        .find(|n| n.tap.is_some() && (n.net.is_some() || !n.forward.is_empty()))
    {
        bail!(
            "profile {name}: NIC on tap {:?} cannot have a user network's `net` or `forward`",
            nic.tap
        );
    }
    Ok(profile)
}

/// A free 127.0.0.1 TCP port (the listener is closed again; QEMU binds it right after).
pub fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Chooses host ports for every forward the profile asks for.
pub fn choose_forwards(profile: &Profile) -> Result<Vec<Forward>> {
    let mut out = Vec::new();
    for (nic, spec) in profile.nics.iter().enumerate() {
        for entry in &spec.forward {
            let (name, port) = entry
                .split_once(':')
                .with_context(|| format!("forward {entry:?} is not NAME:PORT"))?;
            let guest_port = port
                .parse()
                .with_context(|| format!("forward {entry:?}: bad port"))?;
            out.push(Forward {
                nic,
                name: name.to_string(),
                guest_port,
                host_port: free_port()?,
            });
        }
    }
    Ok(out)
}

/// `kvm` when /dev/kvm really runs a guest here, else `tcg`. The answer is cached in
/// target/appliance/accel (delete it to probe again).
pub fn accel(bzimage: &Path) -> &'static str {
    let cache = crate::image::appliance_dir().join("accel");
    if let Ok(text) = std::fs::read_to_string(&cache) {
        return if text.trim() == "kvm" { "kvm" } else { "tcg" };
    }
    let usable = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .is_ok()
        && kvm_boots(bzimage);
    let answer = if usable { "kvm" } else { "tcg" };
    let _ = std::fs::write(&cache, answer);
    answer
}

/// Boots the kernel without an initramfs under KVM: it must reach its "no root" panic quickly.
fn kvm_boots(bzimage: &Path) -> bool {
    let child = Command::new("qemu-system-x86_64")
        .args([
            "-machine",
            "q35",
            "-accel",
            "kvm",
            "-cpu",
            "host",
            "-m",
            "256",
            "-nodefaults",
            "-display",
            "none",
            "-no-reboot",
        ])
        .args(["-serial", "stdio", "-kernel"])
        .arg(bzimage)
        .args(["-append", "console=ttyS0 panic=-1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn();
    let Ok(mut child) = child else { return false };
    let deadline = Instant::now() + Duration::from_secs(8);
    let mut out = child.stdout.take();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut text = String::new();
        if let Some(out) = out.as_mut() {
            let _ = out.read_to_string(&mut text);
        }
        let _ = tx.send(text);
    });
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
    rx.recv_timeout(Duration::from_secs(2))
        .map(|text| text.contains("Kernel panic"))
        .unwrap_or(false)
}

/// A QEMU argument list being built.
#[derive(Default)]
struct Args(Vec<String>);

impl Args {
    fn push(&mut self, items: &[&str]) {
        self.0.extend(items.iter().map(|s| s.to_string()));
    }
}

/// The whole QEMU argument list for `profile` booting `image`, with `disks[k]` as the file of
/// the profile's k-th data disk (there must be one per disk; the caller creates them).
pub fn machine_args(
    profile: &Profile,
    image: &Image,
    serial: &Serial,
    extra_append: &str,
    accel: &str,
    forwards: &[Forward],
    disks: &[PathBuf],
) -> Vec<String> {
    let mut a = Args::default();
    cpu_args(&mut a, profile, accel);
    numa_args(&mut a, profile);
    for (k, nic) in profile.nics.iter().enumerate() {
        nic_args(&mut a, k, nic, forwards);
    }
    a.push(&["-device", "virtio-rng-pci,bus=pcie.0"]);
    disk_args(&mut a, &profile.disks, disks);
    kernel_args(&mut a, profile, image, extra_append);
    a.push(&[
        "-no-reboot",
        "-nodefaults",
        "-display",
        "none",
        "-vga",
        "none",
    ]);
    serial_args(&mut a, serial);
    a.0
}

/// Machine type, accelerator, CPU model, memory and the socket/core topology.
fn cpu_args(a: &mut Args, profile: &Profile, accel: &str) {
    let cpus = profile.sockets * profile.cores_per_socket;
    a.push(&[
        "-machine",
        "q35",
        "-accel",
        accel,
        "-cpu",
        if accel == "kvm" { "host" } else { "max" },
    ]);
    a.push(&["-m", &profile.memory_mib.to_string()]);
    a.push(&[
        "-smp",
        &format!(
            "{cpus},sockets={},cores={},threads=1",
            profile.sockets, profile.cores_per_socket
        ),
    ]);
}

/// NUMA nodes with their memory, the distances between them, and one pxb-pcie expander
/// bridge per node that has NICs.
fn numa_args(a: &mut Args, profile: &Profile) {
    for (i, node) in profile.nodes.iter().enumerate() {
        a.push(&[
            "-object",
            &format!("memory-backend-ram,id=m{i},size={}M", node.memory_mib),
        ]);
        a.push(&[
            "-numa",
            &format!("node,nodeid={i},cpus={},memdev=m{i}", node.cpus),
        ]);
    }
    for i in 0..profile.nodes.len() {
        for j in i + 1..profile.nodes.len() {
            a.push(&["-numa", &format!("dist,src={i},dst={j},val=20")]);
        }
    }
    let mut bridged: Vec<u32> = profile.nics.iter().filter_map(|n| n.node).collect();
    bridged.sort_unstable();
    bridged.dedup();
    for node in &bridged {
        // One expander bridge per node with NICs; its bus range starts at 64 * (node + 1).
        a.push(&[
            "-device",
            &format!(
                "pxb-pcie,id=pxb{node},bus_nr={},numa_node={node},bus=pcie.0",
                64 * (node + 1)
            ),
        ]);
    }
}

/// NIC `k`: its network (user net with its port forwards, or a tap), multiqueue, and the
/// device behind its node's bridge or on the root bus.
fn nic_args(a: &mut Args, k: usize, nic: &Nic, forwards: &[Forward]) {
    let mut netdev = match &nic.tap {
        Some(tap) => format!("tap,id=n{k},ifname={tap},script=no,downscript=no"),
        None => format!("user,id=n{k}"),
    };
    if let Some(net) = &nic.net {
        netdev.push_str(&format!(",net={net}"));
    }
    for f in forwards.iter().filter(|f| f.nic == k) {
        netdev.push_str(&format!(
            ",hostfwd=tcp:127.0.0.1:{}-:{}",
            f.host_port, f.guest_port
        ));
    }
    // Multiqueue: QEMU's own datapath (no vhost), and the offloads native XDP refuses.
    let mut model = nic.model.clone();
    if let Some(n) = nic.queues {
        netdev.push_str(&format!(",queues={n},vhost=off"));
        model.push_str(&format!(
            ",mq=on,vectors={},guest_tso4=off,guest_tso6=off,guest_ecn=off,guest_ufo=off",
            2 * n + 2
        ));
    }
    a.push(&["-netdev", &netdev]);
    let mac = format!("52:54:00:12:34:{:02x}", 0x56 + k);
    match nic.node {
        Some(node) => {
            a.push(&[
                "-device",
                &format!("pcie-root-port,id=rp{k},bus=pxb{node},chassis={}", k + 1),
            ]);
            a.push(&[
                "-device",
                &format!("{model},netdev=n{k},bus=rp{k},mac={mac}"),
            ]);
        }
        None => a.push(&[
            "-device",
            &format!("{model},netdev=n{k},bus=pcie.0,mac={mac}"),
        ]),
    }
}

/// The data disks in order: virtio-blk, or a `scsi-hd` on its own controller.
fn disk_args(a: &mut Args, specs: &[Disk], disks: &[PathBuf]) {
    for (k, file) in disks.iter().enumerate() {
        // cache=writeback: the guest sees a volatile write cache and its flushes (fdatasync)
        // become fdatasync on the host file. QEMU's option syntax doubles a literal comma.
        let file = file.display().to_string().replace(',', ",,");
        a.push(&[
            "-drive",
            &format!("file={file},format=raw,if=none,id=d{k},cache=writeback"),
        ]);
        match specs.get(k).and_then(|d| d.controller.as_deref()) {
            Some(controller) => {
                // The controller's SCSI bus is named after its id (`hbaK.0`).
                a.push(&["-device", &format!("{controller},id=hba{k},bus=pcie.0")]);
                a.push(&[
                    "-device",
                    &format!("scsi-hd,drive=d{k},bus=hba{k}.0,serial=ringstore-data{k}"),
                ]);
            }
            None => a.push(&[
                "-device",
                &format!("virtio-blk-pci,drive=d{k},bus=pcie.0,serial=ringstore-data{k}"),
            ]),
        }
    }
}

/// Kernel, initramfs and the command line: the base, the profile's, the caller's.
fn kernel_args(a: &mut Args, profile: &Profile, image: &Image, extra_append: &str) {
    a.push(&[
        "-kernel",
        &image.bzimage.display().to_string(),
        "-initrd",
        &image.initramfs.display().to_string(),
    ]);
    let append = [
        "console=ttyS0 panic=-1",
        profile.append.as_str(),
        extra_append,
    ]
    .iter()
    .filter(|s| !s.is_empty())
    .copied()
    .collect::<Vec<_>>()
    .join(" ");
    a.push(&["-append", &append]);
}

/// The serial console on a unix socket QEMU waits for; no monitor.
fn serial_args(a: &mut Args, serial: &Serial) {
    let Serial::Socket(path) = serial;
    a.push(&[
        "-chardev",
        &format!("socket,id=ser0,path={},server=on,wait=on", path.display()),
        "-serial",
        "chardev:ser0",
        "-monitor",
        "none",
    ]);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image() -> Image {
        Image {
            binary: "/b/ringstore".into(),
            bzimage: "/b/bzImage".into(),
            initramfs: "/b/initramfs.img".into(),
            kernel_version: String::new(),
            authorized_keys: None,
        }
    }

    /// `profile`'s command line with no forwards, under TCG, with `disks` as its disk files.
    fn args_with_disks(profile: &Profile, disks: &[PathBuf]) -> String {
        let serial = Serial::Socket("/tmp/s.sock".into());
        machine_args(profile, &image(), &serial, "", "tcg", &[], disks).join(" ")
    }

    #[test]
    fn every_profile_parses() {
        for name in [
            "numa2",
            "numa2-disk",
            "numa2-tap",
            "server-hw",
            "single",
            "twonic",
            "xdp-mq",
        ] {
            load_profile(name).unwrap();
        }
        assert!(load_profile("nope").is_err());
    }

    #[test]
    fn numa2_puts_the_nic_behind_a_node_1_expander_bridge() {
        let profile = load_profile("numa2").unwrap();
        let forwards = vec![Forward {
            nic: 0,
            name: "memcache".into(),
            guest_port: 11211,
            host_port: 40000,
        }];
        let args = machine_args(
            &profile,
            &image(),
            &Serial::Socket("/tmp/s.sock".into()),
            "ringstore.numa=1",
            "tcg",
            &forwards,
            &[],
        )
        .join(" ");
        assert!(
            args.contains("-smp 4,sockets=2,cores=2,threads=1"),
            "{args}"
        );
        assert!(
            args.contains("-numa node,nodeid=1,cpus=2-3,memdev=m1"),
            "{args}"
        );
        assert!(
            args.contains("pxb-pcie,id=pxb1,bus_nr=128,numa_node=1,bus=pcie.0"),
            "{args}"
        );
        assert!(args.contains("pcie-root-port,id=rp0,bus=pxb1"), "{args}");
        assert!(args.contains("virtio-net-pci,netdev=n0,bus=rp0"), "{args}");
        assert!(
            args.contains("hostfwd=tcp:127.0.0.1:40000-:11211"),
            "{args}"
        );
        assert!(
            args.contains("panic=-1") && args.contains("-no-reboot"),
            "{args}"
        );
        assert!(
            args.contains("isolcpus=managed_irq,domain,2-3")
                && args.ends_with("server=on,wait=on -serial chardev:ser0 -monitor none"),
            "{args}"
        );
        assert!(args.contains("ringstore.numa=1"));
        assert!(
            !args.contains("-drive") && !args.contains("virtio-blk"),
            "numa2 has no data disk: {args}"
        );
    }

    #[test]
    fn numa2_disk_attaches_a_virtio_blk_data_disk_and_serves_from_it() {
        let profile = load_profile("numa2-disk").unwrap();
        assert_eq!(profile.disks.len(), 1);
        assert_eq!(profile.disks[0].size_mib, 64);
        assert!(
            profile.append.contains("ringstore.data=/dev/vda"),
            "{}",
            profile.append
        );
        let args = args_with_disks(&profile, &["/t/a,b.raw".into()]);
        assert!(
            args.contains("-drive file=/t/a,,b.raw,format=raw,if=none,id=d0,cache=writeback"),
            "{args}"
        );
        assert!(
            args.contains("-device virtio-blk-pci,drive=d0,bus=pcie.0,serial=ringstore-data0"),
            "{args}"
        );
        assert!(args.contains("ringstore.data=/dev/vda"), "{args}");
        assert_eq!(guest_disk_name(0), "vda");
        assert_eq!(guest_disk_name(1), "vdb");
    }

    #[test]
    fn server_hw_puts_the_data_disk_on_a_sas_controller_and_the_nic_is_igb() {
        let profile = load_profile("server-hw").unwrap();
        assert_eq!(profile.guest_disk_path(0), "/dev/sda");
        assert!(profile.append.contains("ringstore.data=/dev/sda"));
        let args = args_with_disks(&profile, &["/t/d.raw".into()]);
        assert!(
            args.contains("-device megasas-gen2,id=hba0,bus=pcie.0 -device scsi-hd,drive=d0,bus=hba0.0,serial=ringstore-data0"),
            "{args}"
        );
        assert!(
            !args.contains("virtio-blk") && !args.contains("virtio-net"),
            "{args}"
        );
        assert!(args.contains("-device igb,netdev=n0,bus=pcie.0"), "{args}");
        // Kinds are counted apart: a virtio disk after a SCSI one is still vda.
        let mut mixed = profile.clone();
        mixed.disks.push(Disk {
            size_mib: 1,
            controller: None,
        });
        assert_eq!(mixed.guest_disk_path(1), "/dev/vda");
        assert_eq!(
            load_profile("numa2-disk").unwrap().guest_disk_path(0),
            "/dev/vda"
        );
    }

    #[test]
    fn ensure_disk_creates_a_sparse_file_once_and_keeps_it() {
        let dir = std::env::temp_dir().join(format!("xtask-disk-{}", std::process::id()));
        let path = dir.join("d.raw");
        assert!(ensure_disk(&path, 3).unwrap());
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 3 << 20);
        std::fs::write(&path, b"kept").unwrap();
        assert!(
            !ensure_disk(&path, 3).unwrap(),
            "an existing disk is not recreated"
        );
        assert_eq!(std::fs::read(&path).unwrap(), b"kept");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn twonic_has_a_bridge_per_node_and_distinct_subnets() {
        let profile = load_profile("twonic").unwrap();
        let forwards = choose_forwards(&profile).unwrap();
        assert_eq!(forwards.len(), 4);
        let args = machine_args(
            &profile,
            &image(),
            &Serial::Socket("/tmp/s.sock".into()),
            "",
            "tcg",
            &forwards,
            &[],
        )
        .join(" ");
        assert!(
            args.contains("numa_node=0") && args.contains("numa_node=1"),
            "{args}"
        );
        assert!(args.contains("net=10.0.3.0/24"), "{args}");
        let tap = machine_args(
            &load_profile("numa2-tap").unwrap(),
            &image(),
            &Serial::Socket("/tmp/s.sock".into()),
            "",
            "tcg",
            &[],
            &[],
        )
        .join(" ");
        assert!(
            tap.contains("-netdev tap,id=n0,ifname=rstap0,script=no,downscript=no")
                && !tap.contains("user,"),
            "{tap}"
        );
        assert!(
            tap.contains("pxb-pcie,id=pxb1,bus_nr=128,numa_node=1")
                && tap.contains("virtio-net-pci,netdev=n0,bus=rp0"),
            "{tap}"
        );
        assert!(!tap.contains("mq=on"), "no multiqueue unless asked: {tap}");
        let mq = machine_args(
            &load_profile("xdp-mq").unwrap(),
            &image(),
            &Serial::Socket("/tmp/s.sock".into()),
            "",
            "tcg",
            &[],
            &[],
        )
        .join(" ");
        assert!(
            mq.contains("-netdev tap,id=n0,ifname=rsxdp0,script=no,downscript=no,queues=2,vhost=off")
                && mq.contains("virtio-net-pci,mq=on,vectors=6,guest_tso4=off,guest_tso6=off,guest_ecn=off,guest_ufo=off,netdev=n0,bus=pcie.0"),
            "{mq}"
        );
        let single = machine_args(
            &load_profile("single").unwrap(),
            &image(),
            &Serial::Socket("/tmp/s.sock".into()),
            "",
            "tcg",
            &[],
            &[],
        )
        .join(" ");
        assert!(
            !single.contains("-numa") && !single.contains("pxb"),
            "{single}"
        );
    }
}
